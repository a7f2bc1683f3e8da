//! A watch on perfbed-vmm's vCPU threads from inside the box: a vCPU thread
//! that sleeps in L1's kernel for seconds anywhere but KVM's own halt wait
//! freezes its guest CPU, and nothing on the host can see where it sleeps.
//! Each such stall is printed once on L1's console (the harness keeps it in
//! `box.log`) with the thread's kernel stack, and again when it ends.

use std::collections::HashMap;
use std::fs;
use std::thread;
use std::time::{Duration, Instant};

/// How often the threads are sampled.
const SAMPLE: Duration = Duration::from_millis(500);
/// How long a thread must sleep in one place, without running, to be
/// reported.
const STALL: Duration = Duration::from_secs(5);
/// How long every vCPU thread may go without running before the watch
/// shows where they all sleep and L1's KVM timers: a guest whose vCPUs all
/// wait in KVM's halt wait that long is frozen or idle past its own timer
/// ticks (the box's hangs with L1 alive: the guest stopped at an AP's
/// bring-up, every vCPU thread asleep).
const ALL_IDLE: Duration = Duration::from_secs(15);

/// One sample of a thread.
#[derive(Clone, PartialEq, Eq)]
struct ThreadState {
    wchan: String,
    runs: u64,
}

/// Where a thread was first seen in its current state, and whether that
/// stall was reported.
struct Watched {
    state: ThreadState,
    since: Instant,
    reported: bool,
}

/// Starts the watch on process `pid`; it ends with the process.
pub fn spawn(pid: u32) {
    let _ = thread::Builder::new()
        .name("stall-watch".into())
        .spawn(move || watch(pid));
}

fn watch(pid: u32) {
    let mut watched: HashMap<String, Watched> = HashMap::new();
    // How often the vCPU threads have run, when that last grew, and whether that idle
    // stretch was shown.
    let mut busy = (0u64, Instant::now(), false);
    loop {
        thread::sleep(SAMPLE);
        let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
            return;
        };
        let now = Instant::now();
        let mut vcpu_runs = 0;
        let mut vcpus = Vec::new();
        for task in tasks.flatten() {
            let tid = task.file_name().to_string_lossy().into_owned();
            let dir = task.path();
            let comm = fs::read_to_string(dir.join("comm"))
                .unwrap_or_default()
                .trim()
                .to_string();
            if !comm.starts_with("vcpu") {
                continue;
            }
            let Some(state) = sample(&dir) else { continue };
            vcpu_runs += state.runs;
            vcpus.push((comm.clone(), dir.clone(), state.wchan.clone()));
            let entry = watched.entry(tid.clone()).or_insert(Watched {
                state: state.clone(),
                since: now,
                reported: false,
            });
            if entry.state != state {
                if entry.reported {
                    eprintln!(
                        "perfbed-box: stall-watch: {comm} (tid {tid}) runs again after {:.1} s in {}",
                        now.duration_since(entry.since).as_secs_f64(),
                        entry.state.wchan
                    );
                }
                *entry = Watched {
                    state,
                    since: now,
                    reported: false,
                };
                continue;
            }
            if !entry.reported
                && now.duration_since(entry.since) >= STALL
                && is_stall(&entry.state.wchan)
            {
                entry.reported = true;
                let stack = fs::read_to_string(dir.join("stack"))
                    .unwrap_or_else(|e| format!("(no stack: {e})\n"));
                eprintln!(
                    "perfbed-box: stall-watch: {comm} (tid {tid}) has slept in {} for {:.1} s without running; its L1 kernel stack:\n{}",
                    entry.state.wchan,
                    now.duration_since(entry.since).as_secs_f64(),
                    stack.trim_end()
                );
            }
        }
        if vcpu_runs != busy.0 {
            if busy.2 {
                eprintln!(
                    "perfbed-box: stall-watch: the vCPU threads run again after {:.1} s",
                    now.duration_since(busy.1).as_secs_f64()
                );
            }
            busy = (vcpu_runs, now, false);
        } else if !busy.2 && !vcpus.is_empty() && now.duration_since(busy.1) >= ALL_IDLE {
            busy.2 = true;
            show_all_idle(&vcpus, now.duration_since(busy.1));
        }
    }
}

/// Prints where each vCPU thread sleeps, with its kernel stack, and L1's
/// pending KVM local APIC timers (`/proc/timer_list`): a guest timer whose
/// expiry is long past and still pending means L1 did not run it.
fn show_all_idle(vcpus: &[(String, std::path::PathBuf, String)], idle: Duration) {
    let mut text = format!(
        "perfbed-box: stall-watch: no vCPU thread has run for {:.1} s:\n",
        idle.as_secs_f64()
    );
    for (comm, dir, wchan) in vcpus {
        let stack = fs::read_to_string(dir.join("stack")).unwrap_or_default();
        let top: Vec<&str> = stack.lines().take(6).map(str::trim).collect();
        text.push_str(&format!("  {comm}: in {wchan}: {}\n", top.join(" < ")));
    }
    let timers = fs::read_to_string("/proc/timer_list").unwrap_or_default();
    let mut lines = timers.lines().peekable();
    while let Some(line) = lines.next() {
        if line.starts_with("now at") {
            text.push_str(&format!("  L1 {line}\n"));
        } else if line.contains("apic_timer_fn") {
            let expiry = lines.peek().map_or("", |l| l.trim());
            text.push_str(&format!("  L1 timer {}: {expiry}\n", line.trim()));
        }
    }
    eprint!("{text}");
}

/// A thread's wait channel and how often it has run, if readable: the
/// number of times it was scheduled (`schedstat`'s third field), which a
/// wake-up of microseconds moves, where tick-sampled CPU time may not;
/// without `schedstat`, user + system ticks.
fn sample(dir: &std::path::Path) -> Option<ThreadState> {
    let wchan = fs::read_to_string(dir.join("wchan")).ok()?;
    let runs = fs::read_to_string(dir.join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(2)?.parse::<u64>().ok());
    let runs = match runs {
        Some(runs) => runs,
        None => {
            let stat = fs::read_to_string(dir.join("stat")).ok()?;
            // Fields after the command's closing parenthesis: state is the
            // first, utime and stime the 12th and 13th.
            let rest = &stat[stat.rfind(')')? + 2..];
            let fields: Vec<&str> = rest.split_whitespace().collect();
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?
        }
    };
    Some(ThreadState {
        wchan: wchan.trim().to_string(),
        runs,
    })
}

/// Whether sleeping in `wchan` stalls the guest: KVM's halt wait is the
/// guest's own idle, and a running thread has no wait channel.
fn is_stall(wchan: &str) -> bool {
    !(wchan.is_empty() || wchan == "0" || wchan.starts_with("kvm_vcpu"))
}

#[cfg(test)]
mod tests {
    use super::is_stall;

    #[test]
    fn halt_waits_and_running_threads_are_not_stalls() {
        assert!(!is_stall(""));
        assert!(!is_stall("0"));
        assert!(!is_stall("kvm_vcpu_block"));
        assert!(is_stall("wait_port_writable"));
        assert!(is_stall("futex_wait_queue"));
    }
}
