//! The guest's serial console on our side: copied to `serial.log` with a
//! cap, echoed live with `--verbose`, and read for the lines that mean the
//! kernel went wrong.

use std::fs::File;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Most of the serial console kept in `serial.log`: a guest flooding its
/// console cannot fill the host's disk. The rest is read and dropped, so
/// QEMU never blocks on it.
pub const SERIAL_LOG_LIMIT: u64 = 64 << 20;

/// A reader that reads nothing while its flag is set: a host whose sink
/// stalls, for the tests that stall the guest's console.
pub struct Pausable<R> {
    inner: R,
    paused: Arc<AtomicBool>,
}

impl<R> Pausable<R> {
    pub fn new(inner: R, paused: Arc<AtomicBool>) -> Pausable<R> {
        Pausable { inner, paused }
    }
}

impl<R: Read> Read for Pausable<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.paused.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        self.inner.read(buf)
    }
}

/// With `verbose`, each line also goes to stderr, prefixed `serial| `.
pub fn copy_serial(from: impl Read, to: File, verbose: bool) {
    if verbose {
        copy_capped(
            from,
            SerialEcho {
                to,
                line: Vec::new(),
            },
            SERIAL_LOG_LIMIT,
        );
    } else {
        copy_capped(from, to, SERIAL_LOG_LIMIT);
    }
}

/// The serial log's writer that also echoes every complete line to stderr.
struct SerialEcho {
    to: File,
    line: Vec<u8>,
}

impl Write for SerialEcho {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.to.write(buf)?;
        for &byte in &buf[..n] {
            self.line.push(byte);
            if byte == b'\n' {
                eprint!("serial| {}", String::from_utf8_lossy(&self.line));
                self.line.clear();
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.to.flush()
    }
}

/// Copies `from` to `to` until `from` ends, writing at most `limit` bytes
/// and then one line that says how much was dropped.
fn copy_capped(mut from: impl Read, mut to: impl Write, limit: u64) {
    let mut buf = [0u8; 4096];
    let mut written = 0u64;
    let mut dropped = 0u64;
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 {
            break;
        }
        let keep = (limit - written).min(n as u64) as usize;
        if keep > 0 && to.write_all(&buf[..keep]).is_err() {
            break;
        }
        written += keep as u64;
        dropped += (n - keep) as u64;
        if keep < n && dropped == (n - keep) as u64 {
            let _ = writeln!(to, "\n[perfbed: serial log limit of {limit} bytes reached; the rest of the console is dropped]");
        }
    }
    if dropped > 0 {
        let _ = writeln!(to, "[perfbed: {dropped} bytes of console output dropped]");
    }
}

/// Lines of a kernel log that mean something went wrong in the kernel, even
/// if the run carried on: warnings, bugs, oopses, lockdep and RCU reports.
pub fn kernel_log_problems(log: &str) -> Vec<String> {
    const SIGNS: &[&str] = &[
        "WARNING:",
        "BUG:",
        "Oops:",
        "Kernel panic",
        "general protection fault",
        "possible circular locking dependency",
        "possible recursive locking",
        "inconsistent lock state",
        "suspicious RCU usage",
        "self-detected stall",
        "detected stalls",
        "blocked for more than",
        "UBSAN:",
        "list_add corruption",
        "list_del corruption",
    ];
    log.lines()
        .filter(|l| SIGNS.iter().any(|s| l.contains(s)))
        .map(|l| l.trim().to_string())
        .collect()
}

/// Most lines of a report [`first_report`] keeps.
const REPORT_LINES: usize = 48;

/// The first report of [`kernel_log_problems`] in full, as far as its end
/// (KCSAN's closing `=====` rule, an `---[ end trace` line) or
/// [`REPORT_LINES`]: the line that names a problem often does not name its
/// cause (KCSAN's "race at unknown origin" names a frame, the read's
/// address and the changed value only below it).
pub fn first_report(log: &str) -> Option<String> {
    let lines: Vec<&str> = log.lines().collect();
    let start = lines
        .iter()
        .position(|l| !kernel_log_problems(l).is_empty())?;
    let mut report = Vec::new();
    for line in lines[start..].iter().take(REPORT_LINES) {
        let text = line.trim_end();
        let body = text.rsplit_once("] ").map_or(text, |(_, b)| b);
        if !report.is_empty() && body.starts_with("=====") {
            break;
        }
        report.push(text);
        if body.starts_with("---[ end trace") {
            break;
        }
    }
    Some(report.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_log_problems_are_found_and_quiet_logs_pass() {
        let quiet = "[    0.1] smpboot: CPU 1 is now offline\n[    0.2] perfbed: loaded\n";
        assert!(kernel_log_problems(quiet).is_empty());
        let hung = "[ 61.0] INFO: task xtask-agent:93 blocked for more than 60 seconds.\n                    [ 62.0] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:\n";
        assert_eq!(kernel_log_problems(hung).len(), 2);
        let noisy = "[ 1.0] ok\n[ 1.1] WARNING: CPU: 1 PID: 5 at kernel/events/core.c:123\n\
                     [ 1.2] ======================================================\n\
                     [ 1.3] WARNING: possible circular locking dependency detected\n\
                     [ 1.4] BUG: scheduling while atomic\n";
        assert_eq!(kernel_log_problems(noisy).len(), 3);
    }

    #[test]
    fn the_first_report_is_kept_whole_up_to_its_end() {
        let log = "[ 1.0] ok\n[ 2.0] ==================\n[ 2.0] BUG: KCSAN: data-race in f+0x2f/0x7d\n\
                   [ 2.0] \n[ 2.0] race at unknown origin, with read to 0xffff8880 of 4 bytes by task 1 on cpu 0:\n\
                   [ 2.0]  f+0x2f/0x7d\n[ 2.0] value changed: 0x06a3 -> 0x06a4\n[ 2.0] ==================\n\
                   [ 3.0] WARNING: CPU: 1 PID: 5 at kernel/events/core.c:123\n";
        let report = first_report(log).unwrap();
        assert!(report.starts_with("[ 2.0] BUG: KCSAN"), "{report}");
        assert!(
            report.ends_with("value changed: 0x06a3 -> 0x06a4"),
            "{report}"
        );
        assert!(!report.contains("WARNING"), "{report}");
        let warn = "[ 1.0] WARNING: at x\n[ 1.1] Call Trace:\n[ 1.2] ---[ end trace 0 ]---\n[ 1.3] later\n";
        assert_eq!(
            first_report(warn).unwrap(),
            "[ 1.0] WARNING: at x\n[ 1.1] Call Trace:\n[ 1.2] ---[ end trace 0 ]---"
        );
        let endless: String = std::iter::once("[ 1] BUG: x\n".to_string())
            .chain((0..100).map(|i| format!("[ 1] frame {i}\n")))
            .collect();
        assert_eq!(
            first_report(&endless).unwrap().lines().count(),
            REPORT_LINES
        );
        assert_eq!(first_report("[ 1.0] quiet\n"), None);
    }

    #[test]
    fn a_flooding_console_is_capped() {
        let flood = vec![b'x'; 10_000];
        let mut out = Vec::new();
        copy_capped(&flood[..], &mut out, 4096);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with(&"x".repeat(4096)));
        assert!(
            !text[4096..].contains('x'),
            "nothing past the limit is kept"
        );
        assert!(
            text.contains("serial log limit of 4096 bytes reached"),
            "{}",
            &text[4096..]
        );
        assert!(
            text.contains("[perfbed: 5904 bytes of console output dropped]"),
            "{}",
            &text[4096..]
        );
        let mut out = Vec::new();
        copy_capped(&b"quiet\n"[..], &mut out, 4096);
        assert_eq!(out, b"quiet\n");
    }
}
