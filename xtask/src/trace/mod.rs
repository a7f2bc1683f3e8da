//! The device's trace, decoded and drawn: `cargo xtask trace FILE [--plot
//! out.svg] [--from S] [--to S]`, and [`save_trace_and_plot`], which `run`
//! calls to keep a run's trace, with the guest's events and the checks'
//! spans on the same time axis, beside its logs.
//!
//! - [`model`]: a trace file read back;
//! - [`guest`]: the agent's events moved onto the device's clock;
//! - [`guest_kernel`]: the guest kernel's hotplug tracepoints and the
//!   placement kprobe, recorded by ftrace, on the same clock;
//! - [`spans`]: which checks ran when, on the device's clock;
//! - [`table`]: the decoded table; [`timeline`]: what the plot shows;
//!   [`plot`]: drawing it.

mod guest;
pub mod guest_kernel;
mod model;
mod plot;
pub mod spans;
mod table;
mod timeline;
mod window;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use perfbed_agent::{AgentMessage, HostRequest};
use perfbed_device::ControlClient;

use crate::host;
use crate::host::vm::Vm;

pub use model::Trace;
use window::parse_seconds;
pub use window::Window;

#[derive(Args)]
pub struct TraceArgs {
    /// A trace file (`trace.txt` of a run, or `perfbed ctl trace --lines`).
    file: PathBuf,
    /// Draw the run's timeline into this SVG file instead of printing.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Start of the window to print or draw, in seconds on the device's
    /// clock (the times the table and the plot show).
    #[arg(long, value_name = "S", value_parser = parse_seconds)]
    from: Option<f64>,
    /// End of the window, in seconds on the device's clock.
    #[arg(long, value_name = "S", value_parser = parse_seconds)]
    to: Option<f64>,
}

pub fn command(args: &TraceArgs) -> Result<bool> {
    let text = fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let trace = Trace::parse(&text).with_context(|| format!("{}", args.file.display()))?;
    let edge = |l: Option<&model::Line>| l.map_or(0.0, |l| timeline::secs(l.time_ns));
    let window = match (args.from, args.to) {
        (None, None) => None,
        (from, to) => Some(Window::new(
            from,
            to,
            edge(trace.lines.first()),
            edge(trace.lines.last()),
        )?),
    };
    match &args.plot {
        Some(out) => {
            let marks = write_plot(&trace, window, out)?;
            let size = fs::metadata(out).map_or(0, |m| m.len());
            println!("plot: {} ({} KiB, {marks:?})", out.display(), size / 1024);
        }
        None => print!("{}", table::render(&trace, window)),
    }
    Ok(true)
}

/// Draws `trace` (or its `window`) into `out`; returns what it drew.
pub fn write_plot(trace: &Trace, window: Option<Window>, out: &Path) -> Result<timeline::Marks> {
    let mut timeline = timeline::build(trace);
    if let Some(w) = window {
        timeline = timeline.window(w.from, w.to);
    }
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
/// events (when the guest still answers) and the checks' `spans` merged in
/// on the device's clock, and, with `plot`, draws it into `trace.svg`. The
/// VM must still run: the trace lives in the device.
pub fn save_trace_and_plot(
    run_dir: &Path,
    vm: &mut Vm,
    plot: bool,
    spans: &[spans::Span],
) -> Result<SavedTrace> {
    let timeout = Duration::from_secs(30);
    // The guest's side first: its clock sync is the last REG_MAGIC read.
    let guest = (|| -> Result<(Vec<perfbed_agent::GuestEvent>, String, (u64, u64))> {
        // One page: REG_MAGIC is at offset 0.
        let sync = match vm.request(
            &HostRequest::ClockSync {
                // The host's address for the device (arm64's `virt` has it
                // elsewhere than x86's; a wrong one is a bus error there).
                base: vm.device_base,
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
        let events = match vm.request(&HostRequest::Events, timeout)? {
            AgentMessage::Events { events } => events,
            other => anyhow::bail!("guest events: {other:?}"),
        };
        // A run whose guest never turned its tracing on has an empty buffer.
        let ftrace = guest_kernel::collect(vm, timeout).unwrap_or_default();
        Ok((events, ftrace, sync))
    })();
    let mut control = ControlClient::connect(&vm.control_socket)
        .context("connecting to the device's control socket")?;
    let device_text = control.trace_text()?;
    // The host's clock against the device's, for the checks' spans.
    let before = Instant::now();
    let device_ns = control.state()?.now_ns;
    let clock = spans::HostClock {
        at: before + before.elapsed() / 2,
        device_ns,
    };
    let device = Trace::parse(&device_text)?;
    let first_ns = device.lines.first().map_or(0, |l| l.time_ns);
    let mut extra = spans::lines(spans, clock, first_ns);
    let guest_missing = match guest {
        Ok((events, ftrace, (before, after))) => {
            match guest::ClockOffset::from_sync(&device.lines, 0, before, after) {
                Some(offset) => {
                    extra.extend(guest::lines(&events, offset));
                    extra.extend(guest_kernel::lines(&ftrace, offset));
                    None
                }
                None => Some("the device trace lost the clock-sync read".to_string()),
            }
        }
        Err(e) => Some(format!("{e:#}")),
    };
    let text = guest::merge(&device_text, &extra);
    let path = run_dir.join(host::vm::TRACE_FILE);
    fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    let plot = if plot {
        let out = run_dir.join("trace.svg");
        write_plot(&Trace::parse(&text)?, None, &out)?;
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
        .and_then(|t| write_plot(&t, None, &out).ok())
        .map(|_| out);
    Some(SavedTrace {
        trace: path,
        plot,
        guest_missing: Some("the guest stopped answering".into()),
    })
}

#[cfg(test)]
mod tests;
