//! perfbed-vmm's log: the `log` crate's macros throughout the library, and
//! this logger, installed by the binary, writing one line per record to
//! stderr (which the box's `/init` passes on to the box's console).
//!
//! A line is `perfbed-vmm: <message>` for information, with `warning: `,
//! `error: ` or `debug: ` after the prefix for the other levels. The level
//! is `PERFBED_VMM_LOG` (`error`, `warn`, `info`, `debug`, `trace`; `info`
//! when unset or not one of these). The exit report's `perfbed-vmm: stat`
//! lines are not log records: they are printed whatever the level, since
//! xtask reads them (`vmm::Vmm::report`). The `gdbstub` crate's own records
//! (each packet it does not know, at `info`) show from `debug` on, its
//! warnings and errors always. The `virtio_queue` crate's records never
//! show: each is something a driver got wrong (rings outside memory, an
//! available index too far ahead, a head out of range), made at the
//! guest's pace on a vCPU thread or under the console transport's lock,
//! so showing them would let the guest decide how much the VMM writes to
//! stderr and make a vCPU wait for it.

use std::io::Write as _;

use log::{Level, LevelFilter, Log, Metadata, Record};

/// The environment variable that sets the level.
pub const LEVEL_VAR: &str = "PERFBED_VMM_LOG";

struct StderrLogger;

static LOGGER: StderrLogger = StderrLogger;

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        if metadata.target().starts_with("virtio_queue") {
            return false;
        }
        if metadata.target().starts_with("gdbstub") && metadata.level() > Level::Warn {
            return log::max_level() >= LevelFilter::Debug;
        }
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if self.enabled(record.metadata()) {
            let line = format_line(record.level(), &record.args().to_string());
            // One write per line, so lines from several threads never mix;
            // a closed stderr is nothing to report to.
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

/// One record's line, newline included.
pub fn format_line(level: Level, message: &str) -> String {
    let kind = match level {
        Level::Error => "error: ",
        Level::Warn => "warning: ",
        Level::Info => "",
        Level::Debug | Level::Trace => "debug: ",
    };
    format!("perfbed-vmm: {kind}{message}\n")
}

/// The level a `PERFBED_VMM_LOG` value asks for.
pub fn level_from(value: Option<&str>) -> LevelFilter {
    match value.map(str::trim).map(str::to_ascii_lowercase).as_deref() {
        Some("error") => LevelFilter::Error,
        Some("warn") | Some("warning") => LevelFilter::Warn,
        Some("debug") => LevelFilter::Debug,
        Some("trace") => LevelFilter::Trace,
        _ => LevelFilter::Info,
    }
}

/// Installs the logger at the level `PERFBED_VMM_LOG` asks for (a second
/// call changes nothing).
pub fn init() {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level_from(std::env::var(LEVEL_VAR).ok().as_deref()));
    }
}

/// What the tests of guest-driven code see of the log.
#[cfg(test)]
pub(crate) mod capture {
    use super::*;
    use std::cell::RefCell;
    use std::sync::Once;

    thread_local! {
        static SHOWN: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
    }

    /// Keeps the lines perfbed-vmm's logger would write for the records
    /// made on a thread inside [`shown_during`].
    struct Capture;

    impl Log for Capture {
        fn enabled(&self, metadata: &Metadata) -> bool {
            LOGGER.enabled(metadata)
        }

        fn log(&self, record: &Record) {
            if self.enabled(record.metadata()) {
                let line = format_line(record.level(), &record.args().to_string());
                SHOWN.with(|shown| {
                    if let Some(lines) = shown.borrow_mut().as_mut() {
                        lines.push(line);
                    }
                });
            }
        }

        fn flush(&self) {}
    }

    /// Runs `f` and returns the lines perfbed-vmm's log, at its default
    /// level, would have shown of the records made on this thread meanwhile.
    pub(crate) fn shown_during(f: impl FnOnce()) -> Vec<String> {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(|| {
            log::set_logger(&Capture).expect("the tests install no other logger");
            log::set_max_level(LevelFilter::Info);
        });
        SHOWN.with(|shown| *shown.borrow_mut() = Some(Vec::new()));
        f();
        SHOWN.with(|shown| shown.borrow_mut().take().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_level_reads_as_before_the_log_crate() {
        assert_eq!(
            format_line(
                Level::Info,
                "waiting for a client on the agent socket a.sock"
            ),
            "perfbed-vmm: waiting for a client on the agent socket a.sock\n"
        );
        assert_eq!(format_line(Level::Error, "x"), "perfbed-vmm: error: x\n");
        assert_eq!(format_line(Level::Warn, "x"), "perfbed-vmm: warning: x\n");
        assert_eq!(format_line(Level::Debug, "x"), "perfbed-vmm: debug: x\n");
    }

    #[test]
    fn the_level_comes_from_the_variable_with_info_by_default() {
        assert_eq!(level_from(None), LevelFilter::Info);
        assert_eq!(level_from(Some("bogus")), LevelFilter::Info);
        assert_eq!(level_from(Some(" Warn ")), LevelFilter::Warn);
        assert_eq!(level_from(Some("error")), LevelFilter::Error);
        assert_eq!(level_from(Some("trace")), LevelFilter::Trace);
    }
}
