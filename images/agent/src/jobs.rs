//! Background jobs: a program (such as `perf stat -a`) or an open-close
//! loop running while the agent goes on serving requests, stopped and
//! collected on the host's request.

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use perfbed_agent::{JobResult, JobSpec, PerfAttr};

use crate::perf;

enum Job {
    Process(Child),
    Loop {
        stop: Arc<AtomicBool>,
        thread: JoinHandle<JobResult>,
    },
}

/// Running jobs, by id.
#[derive(Default)]
pub struct Jobs {
    running: BTreeMap<u32, Job>,
    next: u32,
}

/// How long a started process may take to open its perf events.
const PERF_FDS_PATIENCE: Duration = Duration::from_secs(30);

impl Jobs {
    pub fn start(&mut self, spec: &JobSpec) -> Result<u32, String> {
        let job = match spec {
            JobSpec::Process {
                argv,
                perf_fds,
                settle_ms,
            } => {
                let (program, args) = argv.split_first().ok_or("start: empty argv")?;
                let mut child = Command::new(program)
                    .args(args)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .map_err(|e| format!("starting {program}: {e}"))?;
                if let Err(e) = wait_perf_fds(&mut child, *perf_fds) {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("{program}: {e}"));
                }
                std::thread::sleep(Duration::from_millis(*settle_ms));
                Job::Process(child)
            }
            JobSpec::OpenCloseLoop { attrs, pause_us } => {
                if attrs.is_empty() {
                    return Err("an open-close loop needs at least one attr".into());
                }
                let stop = Arc::new(AtomicBool::new(false));
                let (attrs, pause, flag) = (
                    attrs.clone(),
                    Duration::from_micros(*pause_us),
                    stop.clone(),
                );
                let thread = std::thread::spawn(move || open_close_loop(&attrs, pause, &flag));
                Job::Loop { stop, thread }
            }
        };
        self.next += 1;
        self.running.insert(self.next, job);
        Ok(self.next)
    }

    pub fn stop(&mut self, id: u32, signal: i32, timeout: Duration) -> Result<JobResult, String> {
        match self.running.remove(&id).ok_or(format!("no job {id}"))? {
            Job::Process(child) => stop_process(child, signal, timeout),
            Job::Loop { stop, thread } => {
                stop.store(true, Ordering::Release);
                thread
                    .join()
                    .map_err(|_| "the open-close loop panicked".to_string())
            }
        }
    }
}

/// Perf event descriptors the process holds (`anon_inode:[perf_event]`).
fn perf_fd_count(pid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|target| target.to_string_lossy().contains("perf_event"))
        .count()
}

fn wait_perf_fds(child: &mut Child, wanted: u32) -> Result<(), String> {
    let start = Instant::now();
    while perf_fd_count(child.id()) < wanted as usize {
        if let Ok(Some(status)) = child.try_wait() {
            let mut stderr = String::new();
            if let Some(mut err) = child.stderr.take() {
                let _ = err.read_to_string(&mut stderr);
            }
            return Err(format!(
                "exited ({status}) before opening {wanted} perf events: {}",
                stderr.trim()
            ));
        }
        if start.elapsed() > PERF_FDS_PATIENCE {
            return Err(format!(
                "did not open {wanted} perf events within {PERF_FDS_PATIENCE:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn stop_process(mut child: Child, signal: i32, timeout: Duration) -> Result<JobResult, String> {
    // CAST: a child's pid fits pid_t.
    // SAFETY: kill takes plain integers; the child has not been reaped, so
    // its pid is still ours.
    unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    let start = Instant::now();
    let status = loop {
        match child
            .try_wait()
            .map_err(|e| format!("waiting for the job: {e}"))?
        {
            Some(status) => break status,
            None if start.elapsed() > timeout => {
                let _ = child.kill();
                break child
                    .wait()
                    .map_err(|e| format!("waiting for the job: {e}"))?;
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut stdout);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    Ok(JobResult::Process {
        status: status.code(),
        stdout,
        stderr,
    })
}

fn open_close_loop(attrs: &[PerfAttr], pause: Duration, stop: &AtomicBool) -> JobResult {
    let (mut attempts, mut opened) = (0u64, 0u64);
    let mut errors = BTreeMap::<String, u64>::new();
    let mut read_errors = BTreeMap::<String, u64>::new();
    for attr in attrs.iter().cycle() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        attempts += 1;
        match perf::open(attr, -1, 0, -1) {
            Ok(fd) => {
                opened += 1;
                if let Err(e) = perf::read(&fd) {
                    *read_errors.entry(perf::errno_name(e.errno)).or_default() += 1;
                }
            }
            Err(e) => *errors.entry(perf::errno_name(e.errno)).or_default() += 1,
        }
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
    JobResult::OpenCloseLoop {
        attempts,
        opened,
        errors,
        read_errors,
    }
}
