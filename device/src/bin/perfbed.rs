//! `perfbed`: talk to a perfbed device's control socket, or run a standalone
//! device for experiments. `perfbed --help` and `perfbed ctl <command>
//! --help` describe every command and flag.
//!
//! ```text
//! perfbed ctl --socket PATH state
//! perfbed ctl --socket PATH inject --domain D --rmid R --event E --bytes N
//! perfbed ctl --socket PATH rate --domain D --rmid R --event E --bytes-per-sec N
//! perfbed ctl --socket PATH occupancy --domain D --rmid R --bytes N
//! perfbed ctl --socket PATH wait [--timeout-ms N]
//! perfbed ctl --socket PATH reset
//! perfbed ctl --socket PATH trace [--lines | --follow]
//! perfbed serve --socket PATH
//! ```
//!
//! Exit status: 0 on success, 1 when the device refuses a request or the
//! socket fails, 2 on a usage error (clap's own code).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, Context, Result};
use clap::{Args, Parser, Subcommand};
use perfbed_device::control::DEFAULT_WAIT_MS;
use perfbed_device::{parse_event, ControlClient, DeviceConfig, Event, Request, SharedDevice};

#[derive(Parser)]
#[command(
    name = "perfbed",
    about = "Talk to a perfbed device's control socket, or serve a standalone device",
    after_help = "events: llc_occupancy, mbm_total_bytes, mbm_local_bytes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Send one request to a running device's control socket and print the
    /// JSON response.
    Ctl(Ctl),
    /// Serve a default device (two domains, CPUs 0-1 and 2-3) on a control
    /// socket until killed.
    Serve {
        /// Where to create the control socket (a stale socket file there is
        /// replaced).
        #[arg(long, value_name = "PATH")]
        socket: PathBuf,
    },
}

#[derive(Args)]
struct Ctl {
    /// The control socket (`control.sock` in a run's log folder).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    #[command(subcommand)]
    request: CtlCommand,
}

/// The (domain, RMID) a request is about.
#[derive(Args)]
struct Target {
    /// Device domain.
    #[arg(long, value_name = "D")]
    domain: u32,
    /// Monitoring group (RMID).
    #[arg(long, value_name = "R")]
    rmid: u32,
}

#[derive(Subcommand)]
enum CtlCommand {
    /// A snapshot of the device: configuration, slots, ground truth,
    /// violations.
    State,
    /// Queue traffic of a cumulative event; it lands at the domain's max rate.
    Inject {
        #[command(flatten)]
        target: Target,
        /// mbm_total_bytes or mbm_local_bytes.
        #[arg(long, value_name = "E", value_parser = event_arg)]
        event: Event,
        /// Bytes to inject.
        #[arg(long, value_name = "N")]
        bytes: u64,
    },
    /// Set a steady rate of a cumulative event (0 clears it).
    Rate {
        #[command(flatten)]
        target: Target,
        /// mbm_total_bytes or mbm_local_bytes.
        #[arg(long, value_name = "E", value_parser = event_arg)]
        event: Event,
        /// Bytes per second.
        #[arg(long, value_name = "N")]
        bytes_per_sec: u64,
    },
    /// Set the LLC occupancy of (domain, RMID).
    Occupancy {
        #[command(flatten)]
        target: Target,
        /// Bytes.
        #[arg(long, value_name = "N")]
        bytes: u64,
    },
    /// Change a domain's allowed CPUs while the guest runs (the device
    /// raises its configuration-changed interrupt).
    Allowed {
        /// Domain.
        #[arg(long, value_name = "D")]
        domain: u32,
        /// The new allowed CPUs, a kernel CPU list ("0-1,3"; "" for none).
        #[arg(long, value_name = "LIST")]
        cpus: String,
    },
    /// Wait until all injected traffic has landed.
    Wait {
        /// Give up after this many milliseconds.
        #[arg(long, value_name = "N", default_value_t = DEFAULT_WAIT_MS)]
        timeout_ms: u64,
    },
    /// Clear violations, read counts, bad-access counts and the trace.
    Reset,
    /// Print the recorded register accesses (JSON), or the whole trace as
    /// text lines (device/README.md, Trace).
    Trace {
        /// The text trace, once.
        #[arg(long, conflicts_with = "follow")]
        lines: bool,
        /// The text trace, then new records as they come (polls every
        /// 100 ms) until the device goes away.
        #[arg(long)]
        follow: bool,
    },
    /// Slot-level truth: every slot assignment, ended or ongoing, with the
    /// bytes it counted (JSON).
    Assignments {
        /// First assignment number wanted (0: all kept).
        #[arg(long, value_name = "N", default_value_t = 0)]
        since: u64,
    },
    /// The host's vCPUs: registers, segment and control registers, local
    /// APICs and pending events, as text in the format of QEMU's `info
    /// registers -a` and `info lapic N` (perfbed-vmm only; QEMU's are on
    /// its monitor).
    Vcpus,
}

/// Parses `--event`; clap names the flag in the error.
fn event_arg(name: &str) -> Result<Event, String> {
    parse_event(name).ok_or_else(|| {
        "unknown event (use llc_occupancy, mbm_total_bytes or mbm_local_bytes)".to_string()
    })
}

impl CtlCommand {
    fn request(&self) -> Request {
        match *self {
            CtlCommand::State => Request::State,
            CtlCommand::Reset => Request::ResetStats,
            CtlCommand::Trace { .. } => Request::Trace,
            CtlCommand::Wait { timeout_ms } => Request::WaitLanded { timeout_ms },
            CtlCommand::Assignments { since } => Request::Assignments { since },
            CtlCommand::Vcpus => Request::CpuState,
            CtlCommand::Inject {
                ref target,
                event,
                bytes,
            } => Request::Inject {
                domain: target.domain,
                rmid: target.rmid,
                event,
                bytes,
            },
            CtlCommand::Rate {
                ref target,
                event,
                bytes_per_sec,
            } => Request::SetRate {
                domain: target.domain,
                rmid: target.rmid,
                event,
                bytes_per_sec,
            },
            CtlCommand::Allowed { domain, ref cpus } => Request::SetAllowed {
                domain,
                cpus: cpus.clone(),
            },
            CtlCommand::Occupancy { ref target, bytes } => Request::SetOccupancy {
                domain: target.domain,
                rmid: target.rmid,
                bytes,
            },
        }
    }
}

/// How often `trace --follow` asks for new records.
const FOLLOW_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Prints the text trace; with `follow`, keeps printing new records until
/// the device goes away (a gap means records were dropped between polls).
fn text_trace(socket: &Path, follow: bool) -> Result<bool> {
    let mut client = ControlClient::connect(socket)
        .map_err(|e| anyhow!("cannot connect to {}: {e}", socket.display()))?;
    let mut out = std::io::stdout().lock();
    let first = client.trace_lines(0).map_err(|e| anyhow!("{e}"))?;
    let text = perfbed_device::trace_file(&first.header, first.dropped, &first.lines);
    // A closed stdout ends the stream without an error.
    if out
        .write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
        || !follow
    {
        return Ok(true);
    }
    let mut since = first.next_seq;
    loop {
        std::thread::sleep(FOLLOW_POLL);
        let Ok(t) = client.trace_lines(since) else {
            // The device went away with its VM: the stream is over.
            return Ok(true);
        };
        let mut text = String::new();
        if t.first_seq > since {
            text += &perfbed_device::dropped_line(
                t.lines.first().map(String::as_str),
                t.first_seq - since,
            );
        }
        for line in &t.lines {
            text += line;
            text.push('\n');
        }
        if out
            .write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            return Ok(true);
        }
        since = t.next_seq;
    }
}

/// Sends the request and prints the response; `Ok(false)` when refused.
fn ctl(args: &Ctl) -> Result<bool> {
    if let CtlCommand::Trace { lines, follow } = args.request {
        if lines || follow {
            return text_trace(&args.socket, follow);
        }
    }
    // ClientError's message already includes its source: no chain.
    let mut client = ControlClient::connect(&args.socket)
        .map_err(|e| anyhow!("cannot connect to {}: {e}", args.socket.display()))?;
    let response = client
        .request(&args.request.request())
        .map_err(|e| anyhow!("{e}"))?;
    let text = match (&args.request, &response.cpu_state) {
        // The vCPUs' text as it is, for the eye and for `cpu-state.txt`.
        (CtlCommand::Vcpus, Some(state)) => state.trim_end().to_string(),
        _ => serde_json::to_string_pretty(&response).context("cannot print the response")?,
    };
    // A closed stdout (`perfbed ctl ... state | head`) is not an error.
    let _ = writeln!(std::io::stdout().lock(), "{text}");
    if !response.ok {
        eprintln!(
            "perfbed: refused: {}",
            response.error.as_deref().unwrap_or("no reason given")
        );
    }
    Ok(response.ok)
}

fn serve(socket: &Path) -> Result<bool> {
    let device = SharedDevice::new(DeviceConfig::default())?;
    let _server = device
        .serve_control(socket)
        .with_context(|| format!("cannot serve {}", socket.display()))?;
    eprintln!("perfbed: serving a default device on {}", socket.display());
    loop {
        std::thread::park();
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Ctl(args) => ctl(args),
        Command::Serve { socket } => serve(socket),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("perfbed: {e:#}");
            ExitCode::FAILURE
        }
    }
}
