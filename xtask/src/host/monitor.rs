//! QEMU's human monitor, asked for the vCPUs' state when a VM is declared
//! hung or failed, before it is killed.
//!
//! A hang leaves nothing in the guest's log when the guest's own clock has
//! stopped (the box: L1 stuck in a nested guest, with no timer interrupt to
//! print an RCU stall). The registers and the local APIC of every vCPU say
//! where it sits and whether a timer interrupt is pending: the one record a
//! hang that needs minutes to reproduce leaves behind.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The monitor's prompt, printed after its banner and after every answer.
const PROMPT: &str = "(qemu) ";
/// How long one command may take: a monitor answers between TBs, and a
/// vCPU spinning in TCG still yields to it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Every vCPU's registers; then, for each vCPU it lists, its local APIC
/// (timer mode and count, IRR/ISR: is an interrupt stuck).
const REGISTERS: &str = "info registers -a";

/// A question the monitor answers without touching any vCPU.
const HEARTBEAT_COMMAND: &str = "info status";

/// A thread that asks the box's QEMU monitor a harmless question every
/// `period` and notes when it got no answer: QEMU's main loop, which
/// answers the monitor, was busy or blocked then.
///
/// Why: the box's hangs with L1 alive (docs/box-verification.md, 2026-12-03
/// night) first looked like QEMU's main loop asleep past a due timer of
/// L1's, the guest running again the moment the harness connected to this
/// monitor for its snapshot. A question a second would bound such a sleep;
/// the first hang with it running showed the monitor silent instead, for
/// most of the hang. Its silences go to the run folder (`heartbeats.txt`)
/// and into the diagnosis of a failed box run ([`Heartbeat::silences`]).
/// It never runs during the harness's own snapshot ([`Heartbeat::stop`]
/// first).
pub struct Heartbeat {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    answered: Arc<AtomicU64>,
    silences: Arc<Mutex<Vec<Silence>>>,
}

/// How long the monitor may stay silent before the heartbeat takes a
/// backtrace of every thread of the box's QEMU (once a run).
const SILENCE_BACKTRACE_AFTER: f64 = 20.0;
/// How long that backtrace may take.
const BACKTRACE_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the heartbeat saves the backtrace of a silent QEMU.
pub struct SilenceBacktrace {
    /// The box's QEMU.
    pub pid: u32,
    pub out: PathBuf,
}

/// A stretch in which the monitor answered nothing, after it had answered
/// once: from the first question left unanswered to the next answer (or
/// the heartbeat's end), in seconds since the heartbeat started.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Silence {
    pub from_s: f64,
    pub to_s: f64,
    /// Whether it lasted to the heartbeat's end (the monitor never answered
    /// again).
    pub open: bool,
}

impl Silence {
    pub fn seconds(&self) -> f64 {
        self.to_s - self.from_s
    }
}

impl Heartbeat {
    /// Starts asking the monitor at `socket` every `period`; with
    /// `backtrace`, a silence of 20 s gets every QEMU thread's backtrace
    /// (Debian's gdb in batch mode, attached for a moment) saved there,
    /// once: what holds its main loop.
    pub fn start(
        socket: PathBuf,
        period: Duration,
        backtrace: Option<SilenceBacktrace>,
    ) -> Heartbeat {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU64::new(0));
        let silences = Arc::new(Mutex::new(Vec::new()));
        let (flag, count, found) = (stop.clone(), answered.clone(), silences.clone());
        let thread = thread::Builder::new()
            .name("box-heartbeat".into())
            .spawn(move || {
                let started = Instant::now();
                let mut silent_since: Option<f64> = None;
                let mut backtrace = backtrace;
                while !flag.load(Ordering::SeqCst) {
                    thread::sleep(period);
                    if flag.load(Ordering::SeqCst) {
                        break;
                    }
                    let asked = started.elapsed().as_secs_f64();
                    // Before the first answer the monitor is not there yet
                    // (QEMU waits for the agent's socket first).
                    if ask(&socket, HEARTBEAT_COMMAND).is_ok() {
                        if let Some(from_s) = silent_since.take() {
                            let to_s = started.elapsed().as_secs_f64();
                            found.lock().unwrap().push(Silence {
                                from_s,
                                to_s,
                                open: false,
                            });
                        }
                        count.fetch_add(1, Ordering::Relaxed);
                    } else if count.load(Ordering::Relaxed) > 0 && silent_since.is_none() {
                        silent_since = Some(asked);
                    }
                    if let Some(from_s) = silent_since {
                        if started.elapsed().as_secs_f64() - from_s >= SILENCE_BACKTRACE_AFTER {
                            if let Some(to) = backtrace.take() {
                                save_backtrace(&to, from_s);
                            }
                        }
                    }
                }
                if let Some(from_s) = silent_since {
                    let to_s = started.elapsed().as_secs_f64();
                    found.lock().unwrap().push(Silence {
                        from_s,
                        to_s,
                        open: true,
                    });
                }
            })
            .ok();
        Heartbeat {
            stop,
            thread,
            answered,
            silences,
        }
    }

    /// The monitor's silences so far (complete once stopped).
    pub fn silences(&self) -> Vec<Silence> {
        self.silences.lock().unwrap().clone()
    }

    /// How many questions the monitor answered.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// Stops the thread and waits until it has let go of the monitor.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Saves every thread's backtrace of process `to.pid` (gdb in batch mode),
/// with a header saying when the silence began; gdb is killed if it takes
/// longer than [`BACKTRACE_TIMEOUT`].
fn save_backtrace(to: &SilenceBacktrace, silent_from_s: f64) {
    let header = format!(
        "# the box's QEMU (pid {}): its monitor silent since {silent_from_s:.1} s after the heartbeat started\n",
        to.pid
    );
    let Ok(file) = fs::File::create(&to.out) else {
        return;
    };
    let mut file = file;
    let _ = file.write_all(header.as_bytes());
    let (Ok(stdout), Ok(stderr)) = (file.try_clone(), file.try_clone()) else {
        return;
    };
    let child = Command::new("gdb")
        .args(["-nx", "-batch", "-p", &to.pid.to_string()])
        .args(["-ex", "set pagination off", "-ex", "thread apply all bt 40"])
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn();
    let Ok(mut child) = child else {
        let _ = file.write_all(b"# gdb could not start\n");
        return;
    };
    let deadline = Instant::now() + BACKTRACE_TIMEOUT;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = file.write_all(b"# gdb took too long and was killed\n");
}

/// Connects to the monitor at `socket`, asks `command` and hangs up.
fn ask(socket: &Path, command: &str) -> Result<()> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_millis(200)))?;
    read_to_prompt(&mut stream)?;
    stream.write_all(format!("{command}\n").as_bytes())?;
    read_to_prompt(&mut stream)?;
    Ok(())
}

/// The `-monitor` argument for a monitor on `socket`.
pub fn qemu_arg(socket: &Path) -> String {
    format!("unix:{},server=on,wait=off", socket.display())
}

/// Asks the monitor at `socket` for every vCPU's registers and local APIC
/// and writes the answers to `out`, each under its command.
pub fn record_cpu_state(socket: &Path, out: &Path) -> Result<PathBuf> {
    let mut stream = UnixStream::connect(socket)
        .with_context(|| format!("connecting to QEMU's monitor {}", socket.display()))?;
    stream.set_read_timeout(Some(Duration::from_millis(200)))?;
    read_to_prompt(&mut stream).context("the monitor's banner")?;
    let mut ask = |command: &str, text: &mut String| -> Result<String> {
        stream.write_all(format!("{command}\n").as_bytes())?;
        let answer = clean_answer(
            &read_to_prompt(&mut stream).with_context(|| format!("the answer to `{command}`"))?,
        );
        *text += &format!("### {command}\n{answer}\n");
        Ok(answer)
    };
    let mut text = String::new();
    let registers = ask(REGISTERS, &mut text)?;
    // QEMU numbers APIC ids like CPU indexes on the machines perfbed boots.
    let cpus = registers.lines().filter(|l| l.starts_with("CPU#")).count();
    for cpu in 0..cpus {
        ask(&format!("info lapic {cpu}"), &mut text)?;
    }
    fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
    Ok(out.to_path_buf())
}

fn read_to_prompt(stream: &mut UnixStream) -> Result<String> {
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&bytes).ends_with(PROMPT) {
        if Instant::now() > deadline {
            bail!(
                "no prompt within {ANSWER_TIMEOUT:?} ({} bytes so far)",
                bytes.len()
            );
        }
        match stream.read(&mut buf) {
            Ok(0) => bail!("the monitor closed the connection"),
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The answer without the monitor's echo of the command (its first line,
/// redrawn keystroke by keystroke), carriage returns and the closing prompt.
fn clean_answer(raw: &str) -> String {
    let body = raw.strip_suffix(PROMPT).unwrap_or(raw);
    let answer = body.split_once('\n').map_or("", |(_echo, rest)| rest);
    answer.replace('\r', "").trim_matches('\n').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
    use std::thread;

    #[test]
    fn an_answer_loses_the_echo_the_escapes_and_the_prompt() {
        let raw = "i\u{1b}[K\u{1b}[Dinfo lapic 0\r\ndest=0 timer=armed\r\nIRR: 236\r\n(qemu) ";
        assert_eq!(clean_answer(raw), "dest=0 timer=armed\nIRR: 236");
    }

    /// A monitor that answers every command with `answer`, after a banner.
    fn fake_monitor(socket: &Path, answer: &'static str) -> thread::JoinHandle<Vec<String>> {
        let listener = UnixListener::bind(socket).unwrap();
        thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(b"QEMU 7.2.20 monitor - type 'help'\r\n(qemu) ")
                .unwrap();
            let mut asked = Vec::new();
            let mut line = Vec::new();
            let mut byte = [0u8; 1];
            while s.read(&mut byte).unwrap_or(0) == 1 {
                if byte[0] == b'\n' {
                    let command = String::from_utf8(std::mem::take(&mut line)).unwrap();
                    s.write_all(format!("{command}\r\n{answer}\r\n(qemu) ").as_bytes())
                        .unwrap();
                    asked.push(command);
                } else {
                    line.push(byte[0]);
                }
            }
            asked
        })
    }

    #[test]
    fn every_vcpus_registers_and_local_apic_are_recorded() {
        let dir = std::env::temp_dir().join(format!("perfbed-monitor-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("m.sock");
        let monitor = fake_monitor(&socket, "CPU#0\r\nRIP=ffffffff81000000\r\nCPU#1\r\nRIP=0");
        let out = record_cpu_state(&socket, &dir.join("cpu-state.txt")).unwrap();
        let text = fs::read_to_string(out).unwrap();
        assert!(text.starts_with("### info registers -a\nCPU#0\nRIP=ffffffff81000000\nCPU#1\nRIP=0\n### info lapic 0\n"), "{text}");
        assert!(text.contains("### info lapic 1\n"), "{text}");
        assert_eq!(
            monitor.join().unwrap(),
            ["info registers -a", "info lapic 0", "info lapic 1"]
        );
        assert!(record_cpu_state(&dir.join("none.sock"), &dir.join("x")).is_err());
        let _ = fs::remove_dir_all(&dir);
    }

    /// A monitor that answers `info status` while `answering` is set and
    /// hangs up at once otherwise, for `connections` connections.
    fn flaky_monitor(
        socket: &Path,
        answering: Arc<AtomicBool>,
        connections: usize,
    ) -> JoinHandle<()> {
        let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
        thread::spawn(move || {
            for stream in listener.incoming().take(connections) {
                let mut s = stream.unwrap();
                if !answering.load(Ordering::SeqCst) {
                    continue;
                }
                s.write_all(b"QEMU monitor\r\n(qemu) ").unwrap();
                let mut line = Vec::new();
                let mut byte = [0u8; 1];
                while s.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
                    line.push(byte[0]);
                }
                let _ = s.write_all(b"VM status: running\r\n(qemu) ");
            }
        })
    }

    #[test]
    fn the_heartbeat_counts_answers_and_notes_the_silences_between() {
        let dir = std::env::temp_dir().join(format!("perfbed-heartbeat-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("m.sock");
        let answering = Arc::new(AtomicBool::new(true));
        let _monitor = flaky_monitor(&socket, answering.clone(), 10_000);
        let period = Duration::from_millis(20);
        let mut heartbeat = Heartbeat::start(socket.clone(), period, None);
        let wait_for = |what: &dyn Fn() -> bool| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !what() {
                assert!(Instant::now() < deadline, "the heartbeat did not get there");
                thread::sleep(period);
            }
        };
        wait_for(&|| heartbeat.answered() >= 3);
        answering.store(false, Ordering::SeqCst);
        thread::sleep(period * 10);
        let before = heartbeat.answered();
        answering.store(true, Ordering::SeqCst);
        wait_for(&|| heartbeat.answered() >= before + 3);
        answering.store(false, Ordering::SeqCst);
        thread::sleep(period * 5);
        heartbeat.stop();
        let silences = heartbeat.silences();
        assert_eq!(silences.len(), 2, "{silences:?}");
        assert!(!silences[0].open && silences[1].open, "{silences:?}");
        assert!(silences[0].seconds() >= 0.1, "{silences:?}");
        assert!(silences[0].to_s <= silences[1].from_s, "{silences:?}");
        let _ = fs::remove_dir_all(&dir);
    }
}
