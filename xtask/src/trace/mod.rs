//! The device's trace, decoded and drawn: `cargo xtask trace FILE [--plot
//! out.svg]`, and [`save_trace_and_plot`], which `run` (and `stress`) call
//! to keep a run's trace, with the guest's events on the same time axis,
//! beside its logs.
//!
//! - [`model`]: a trace file read back;
//! - [`guest`]: the agent's events moved onto the device's clock;
//! - [`table`]: the decoded table; [`timeline`]: what the plot shows;
//!   [`plot`]: drawing it.

mod guest;
mod model;
mod plot;
mod table;
mod timeline;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use perfbed_agent::{AgentMessage, HostRequest};
use perfbed_device::ControlClient;

use crate::host;
use crate::host::vm::Vm;

pub use model::Trace;

#[derive(Args)]
pub struct TraceArgs {
    /// A trace file (`trace.txt` of a run, or `perfbed ctl trace --lines`).
    file: PathBuf,
    /// Draw the run's timeline into this SVG file instead of printing.
    #[arg(long)]
    plot: Option<PathBuf>,
}

pub fn command(args: &TraceArgs) -> Result<bool> {
    let text = fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let trace = Trace::parse(&text).with_context(|| format!("{}", args.file.display()))?;
    match &args.plot {
        Some(out) => {
            let marks = write_plot(&trace, out)?;
            println!("plot: {} ({marks:?})", out.display());
        }
        None => print!("{}", table::render(&trace)),
    }
    Ok(true)
}

/// Draws `trace` into `out`; returns what it drew.
pub fn write_plot(trace: &Trace, out: &Path) -> Result<timeline::Marks> {
    let timeline = timeline::build(trace);
    fs::write(out, plot::svg(&timeline)?).with_context(|| format!("writing {}", out.display()))?;
    Ok(timeline.marks())
}

/// What [`save_trace_and_plot`] wrote.
#[derive(Debug, Clone)]
pub struct SavedTrace {
    pub trace: PathBuf,
    pub plot: Option<PathBuf>,
    /// Why the guest's events are missing, when they are.
    pub guest_missing: Option<String>,
}

/// Saves the device's trace as `trace.txt` in `run_dir`, with the guest's
/// events (when the guest still answers) merged in on the device's clock,
/// and, with `plot`, draws it into `trace.svg`. The VM must still run: the
/// trace lives in the device.
pub fn save_trace_and_plot(run_dir: &Path, vm: &mut Vm, plot: bool) -> Result<SavedTrace> {
    let timeout = Duration::from_secs(30);
    // The guest's side first: its clock sync is the last REG_MAGIC read.
    let guest = (|| -> Result<(Vec<perfbed_agent::GuestEvent>, (u64, u64))> {
        // One page: REG_MAGIC is at offset 0.
        let sync = match vm.request(
            &HostRequest::ClockSync {
                base: host::config::DEVICE_BASE,
                size: 4096,
                cpu: 0,
            },
            timeout,
        )? {
            AgentMessage::ClockSync {
                before_ns,
                after_ns,
            } => (before_ns, after_ns),
            other => anyhow::bail!("clock sync: {other:?}"),
        };
        match vm.request(&HostRequest::Events, timeout)? {
            AgentMessage::Events { events } => Ok((events, sync)),
            other => anyhow::bail!("guest events: {other:?}"),
        }
    })();
    let mut control = ControlClient::connect(&vm.control_socket)
        .context("connecting to the device's control socket")?;
    let device_text = control.trace_text()?;
    let (text, guest_missing) = match guest {
        Ok((events, (before, after))) => {
            let device = Trace::parse(&device_text)?;
            match guest::ClockOffset::from_sync(&device.lines, 0, before, after) {
                Some(offset) => (
                    guest::merge(&device_text, &guest::lines(&events, offset)),
                    None,
                ),
                None => (
                    device_text,
                    Some("the device trace lost the clock-sync read".to_string()),
                ),
            }
        }
        Err(e) => (device_text, Some(format!("{e:#}"))),
    };
    let path = run_dir.join(host::vm::TRACE_FILE);
    fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    let plot = if plot {
        let out = run_dir.join("trace.svg");
        write_plot(&Trace::parse(&text)?, &out)?;
        Some(out)
    } else {
        None
    };
    Ok(SavedTrace {
        trace: path,
        plot,
        guest_missing,
    })
}

/// Draws `run_dir/trace.txt` (saved by a VM that failed) into
/// `trace.svg`, if there is one.
pub fn plot_saved(run_dir: &Path) -> Option<SavedTrace> {
    let path = run_dir.join(host::vm::TRACE_FILE);
    let text = fs::read_to_string(&path).ok()?;
    let out = run_dir.join("trace.svg");
    let plot = Trace::parse(&text)
        .ok()
        .and_then(|t| write_plot(&t, &out).ok())
        .map(|_| out);
    Some(SavedTrace {
        trace: path,
        plot,
        guest_missing: Some("the guest stopped answering".into()),
    })
}

#[cfg(test)]
mod tests;
