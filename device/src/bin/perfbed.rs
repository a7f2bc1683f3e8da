//! `perfbed`: talk to a perfbed device's control socket, or run a standalone
//! device for experiments.
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

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use perfbed_device::control::DEFAULT_WAIT_MS;
use perfbed_device::{parse_event, ControlClient, DeviceConfig, Event, Request, SharedDevice};

const USAGE: &str = "\
usage:
  perfbed ctl --socket PATH state
  perfbed ctl --socket PATH inject --domain D --rmid R --event E --bytes N
  perfbed ctl --socket PATH rate --domain D --rmid R --event E --bytes-per-sec N
  perfbed ctl --socket PATH occupancy --domain D --rmid R --bytes N
  perfbed ctl --socket PATH wait [--timeout-ms N]
  perfbed ctl --socket PATH reset
  perfbed ctl --socket PATH trace [--lines | --follow]
                                   (JSON accesses; the text trace; the text trace, live)
  perfbed serve --socket PATH      (a default device, until killed)
events: llc_occupancy, mbm_total_bytes, mbm_local_bytes";

/// A usage error: the message is printed with the usage text.
struct Usage(String);

/// `--flag value` pairs after the command word.
struct Flags(HashMap<String, String>);

impl Flags {
    fn parse(args: &[String]) -> Result<Flags, Usage> {
        let mut map = HashMap::new();
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let Some(name) = flag.strip_prefix("--") else {
                return Err(Usage(format!("unexpected argument {flag:?}")));
            };
            let value = it
                .next()
                .ok_or_else(|| Usage(format!("--{name} needs a value")))?;
            if map.insert(name.to_string(), value.clone()).is_some() {
                return Err(Usage(format!("--{name} given twice")));
            }
        }
        Ok(Flags(map))
    }

    fn take(&mut self, name: &str) -> Option<String> {
        self.0.remove(name)
    }

    fn required(&mut self, name: &str) -> Result<String, Usage> {
        self.take(name)
            .ok_or_else(|| Usage(format!("missing --{name}")))
    }

    fn number<T: std::str::FromStr>(&mut self, name: &str) -> Result<T, Usage> {
        let v = self.required(name)?;
        v.parse()
            .map_err(|_| Usage(format!("--{name}: {v:?} is not a valid number")))
    }

    fn event(&mut self) -> Result<Event, Usage> {
        let v = self.required("event")?;
        parse_event(&v).ok_or_else(|| Usage(format!("--event: unknown event {v:?}")))
    }

    fn done(self) -> Result<(), Usage> {
        match self.0.keys().next() {
            Some(name) => Err(Usage(format!("unknown flag --{name} for this command"))),
            None => Ok(()),
        }
    }
}

/// Parses `ctl` arguments into (socket, request).
fn parse_ctl(args: &[String]) -> Result<(PathBuf, Request), Usage> {
    let (socket, rest) = match args {
        [flag, path, rest @ ..] if flag == "--socket" => (PathBuf::from(path), rest),
        _ => return Err(Usage("ctl needs --socket PATH first".into())),
    };
    let (command, rest) = rest
        .split_first()
        .ok_or_else(|| Usage("ctl needs a command".into()))?;
    let mut flags = Flags::parse(rest)?;
    let request = match command.as_str() {
        "state" => Request::State,
        "reset" => Request::ResetStats,
        "trace" => Request::Trace,
        "wait" => Request::WaitLanded {
            timeout_ms: match flags.take("timeout-ms") {
                Some(v) => v
                    .parse()
                    .map_err(|_| Usage(format!("--timeout-ms: {v:?} is not a valid number")))?,
                None => DEFAULT_WAIT_MS,
            },
        },
        "inject" => Request::Inject {
            domain: flags.number("domain")?,
            rmid: flags.number("rmid")?,
            event: flags.event()?,
            bytes: flags.number("bytes")?,
        },
        "rate" => Request::SetRate {
            domain: flags.number("domain")?,
            rmid: flags.number("rmid")?,
            event: flags.event()?,
            bytes_per_sec: flags.number("bytes-per-sec")?,
        },
        "occupancy" => Request::SetOccupancy {
            domain: flags.number("domain")?,
            rmid: flags.number("rmid")?,
            bytes: flags.number("bytes")?,
        },
        other => return Err(Usage(format!("unknown ctl command {other:?}"))),
    };
    flags.done()?;
    Ok((socket, request))
}

/// `trace --lines` (false) or `trace --follow` (true), which print the text
/// trace rather than a JSON response.
fn text_trace_mode(args: &[String]) -> Option<(PathBuf, bool)> {
    match args {
        [flag, path, command, mode] if flag == "--socket" && command == "trace" => match mode.as_str() {
            "--lines" => Some((PathBuf::from(path), false)),
            "--follow" => Some((PathBuf::from(path), true)),
            _ => None,
        },
        _ => None,
    }
}

/// How often `trace --follow` asks for new records.
const FOLLOW_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Prints the text trace; with `follow`, keeps printing new records until
/// the device goes away (a gap means records were dropped between polls).
fn text_trace(socket: &std::path::Path, follow: bool) -> ExitCode {
    use std::io::Write;
    let mut client = match ControlClient::connect(socket) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("perfbed: cannot connect to {}: {e}", socket.display());
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    let first = match client.trace_lines(0) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("perfbed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let text = perfbed_device::trace_file(&first.header, first.dropped, &first.lines);
    if out.write_all(text.as_bytes()).and_then(|()| out.flush()).is_err() || !follow {
        return ExitCode::SUCCESS;
    }
    let mut since = first.next_seq;
    loop {
        std::thread::sleep(FOLLOW_POLL);
        let Ok(t) = client.trace_lines(since) else {
            // The device went away with its VM: the stream is over.
            return ExitCode::SUCCESS;
        };
        let mut text = String::new();
        if t.first_seq > since {
            text += &perfbed_device::dropped_line(t.lines.first().map(String::as_str), t.first_seq - since);
        }
        for line in &t.lines {
            text += line;
            text.push('\n');
        }
        if out.write_all(text.as_bytes()).and_then(|()| out.flush()).is_err() {
            return ExitCode::SUCCESS;
        }
        since = t.next_seq;
    }
}

fn ctl(args: &[String]) -> Result<ExitCode, Usage> {
    if let Some((socket, follow)) = text_trace_mode(args) {
        return Ok(text_trace(&socket, follow));
    }
    let (socket, request) = parse_ctl(args)?;
    let mut client = match ControlClient::connect(&socket) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("perfbed: cannot connect to {}: {e}", socket.display());
            return Ok(ExitCode::FAILURE);
        }
    };
    let response = match client.request(&request) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("perfbed: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    match serde_json::to_string_pretty(&response) {
        // A closed stdout (`perfbed ctl ... state | head`) is not an error.
        Ok(text) => {
            use std::io::Write;
            let _ = writeln!(std::io::stdout().lock(), "{text}");
        }
        Err(e) => eprintln!("perfbed: cannot print the response: {e}"),
    }
    if response.ok {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "perfbed: refused: {}",
            response.error.as_deref().unwrap_or("no reason given")
        );
        Ok(ExitCode::FAILURE)
    }
}

fn serve(args: &[String]) -> Result<ExitCode, Usage> {
    let mut flags = Flags::parse(args)?;
    let socket = PathBuf::from(flags.required("socket")?);
    flags.done()?;
    let device = match SharedDevice::new(DeviceConfig::default()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("perfbed: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let _server = match device.serve_control(&socket) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("perfbed: cannot serve {}: {e}", socket.display());
            return Ok(ExitCode::FAILURE);
        }
    };
    eprintln!("perfbed: serving a default device on {}", socket.display());
    loop {
        std::thread::park();
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.split_first() {
        Some((cmd, rest)) if cmd == "ctl" => ctl(rest),
        Some((cmd, rest)) if cmd == "serve" => serve(rest),
        Some((cmd, _)) if cmd == "-h" || cmd == "--help" || cmd == "help" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some((cmd, _)) => Err(Usage(format!("unknown command {cmd:?}"))),
        None => Err(Usage("no command".into())),
    };
    match result {
        Ok(code) => code,
        Err(Usage(message)) => {
            eprintln!("perfbed: {message}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
