//! Running external commands: quietly into a log file, with progress on the
//! terminal and the log's tail when they fail.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::progress::{self, human, Spinner};

/// A long build step: its commands append to one log file, the terminal sees
/// what runs and, while it does, a live spinner with the elapsed and the
/// expected time (on a terminal) or a heartbeat line every 15 s (otherwise).
pub struct Step {
    name: String,
    log: PathBuf,
    start: Instant,
    spinner: Option<Spinner>,
}

impl Step {
    pub fn start(name: &str, log: &Path) -> Result<Step> {
        if let Some(dir) = log.parent() {
            fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        File::create(log).with_context(|| format!("creating {}", log.display()))?;
        progress::say(&format!("==> {name} (log: {})", log.display()));
        Ok(Step {
            name: name.to_string(),
            log: log.to_path_buf(),
            start: Instant::now(),
            spinner: Spinner::start(name),
        })
    }

    /// Runs `cmd` with stdout and stderr appended to the step's log; prints a
    /// line every 15 s while it runs. On failure, the error carries the tail.
    pub fn run(&self, cmd: &mut Command) -> Result<()> {
        let shown = display(cmd);
        progress::say(&format!("    $ {shown}"));
        let mut log = fs::OpenOptions::new().append(true).open(&self.log)?;
        writeln!(log, "\n$ {shown}")?;
        let out = log.try_clone()?;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting `{shown}`"))?;
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let heartbeat = {
            let (name, start, quiet) = (self.name.clone(), self.start, self.spinner.is_some());
            thread::spawn(move || {
                // Ends when the sender is dropped (Disconnected), i.e. the command ended.
                while let Err(mpsc::RecvTimeoutError::Timeout) =
                    done_rx.recv_timeout(Duration::from_secs(15))
                {
                    if !quiet {
                        eprintln!("    ... {name}: {} so far", human(start.elapsed()));
                    }
                }
            })
        };
        let status = child.wait();
        drop(done_tx);
        let _ = heartbeat.join();
        let status = status.with_context(|| format!("waiting for `{shown}`"))?;
        if !status.success() {
            let tail = tail(&self.log, 30);
            bail!(
                "{}: `{shown}` failed ({status})\n--- last lines of {} ---\n{tail}{}",
                self.name,
                self.log.display(),
                disk_full_hint(&self.log, &tail)
            );
        }
        Ok(())
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    pub fn finish(self) {
        let took = self.start.elapsed();
        if let Some(spinner) = self.spinner {
            spinner.finish();
        }
        progress::record(&self.name, took);
        progress::say(&format!("    {} done in {}", self.name, human(took)));
    }
}

/// Bytes free for an unprivileged user on the filesystem holding `path`.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs writes into the struct we pass; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// CPU time (user + system) of every child process this one has waited for,
/// and theirs: the difference across a command is the CPU it cost.
pub fn children_cpu_time() -> Duration {
    // SAFETY: getrusage writes into the struct we pass and keeps no pointer.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_CHILDREN is a valid `who`.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let of = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    of(usage.ru_utime) + of(usage.ru_stime)
}

/// When a failed step ran out of disk, says so plainly (its log may be
/// cut short, since it is on the same full disk).
fn disk_full_hint(log: &Path, tail: &str) -> String {
    let dir = log.parent().unwrap_or(log);
    let free = free_bytes(dir);
    let full = tail.contains("No space left on device") || free.is_some_and(|f| f < 16 << 20);
    if !full {
        return String::new();
    }
    format!(
        "\n\nthe disk holding {} is full ({} free): free some space, or point XDG_CACHE_HOME at a larger disk \
         (a kernel build needs about 3 GiB), and run again; the failed entry is rebuilt from scratch",
        dir.display(),
        free.map_or("unknown".to_string(), |f| format!("{} KiB", f / 1024))
    )
}

/// Runs a short command and returns its stdout; an error names the command
/// and carries its stderr.
pub fn output(cmd: &mut Command) -> Result<String> {
    let shown = display(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting `{shown}`"))?;
    if !out.status.success() {
        bail!(
            "`{shown}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn display(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// The last `lines` lines of a text file (for error messages).
pub fn tail(path: &Path, lines: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}
