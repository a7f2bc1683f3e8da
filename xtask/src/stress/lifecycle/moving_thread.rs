//! A thread of the guest that moves a PMU while perf operations go on: a
//! scenario's `moves DOMAIN start` … `moves DOMAIN stop`
//! ([`Step::MovesStart`](super::journal::Step::MovesStart)). It is a
//! POSIX sh loop, run by busybox's `sh` (every guest has busybox; the
//! arm64 initramfs has no bash), taking each of the domain's CPUs offline
//! and back in turn, round after round, until a stop file appears; it
//! looks for the file only between rounds, so it ends after a whole round
//! (at least one), with every CPU it took online again and the PMU where
//! the placement rule puts it after such a round: on the first CPU of the
//! round. (A file, not a signal: a signal that came before the shell had
//! set its trap, as a stop right after a start on a slow guest does, would
//! kill it mid-round.)
//!
//! The moves race the reads and ioctls the host sends meanwhile, so the
//! journal cannot say which reads a move fell between; the counting model
//! needs no more (a move changes nothing it judges), and the scenario
//! parser refuses what a move would change unseen (see `scenario.rs`).

use anyhow::{bail, Result};
use perfbed_agent::{AgentMessage, HostRequest, JobResult, JobSpec};

use crate::guest::Guest;

/// Where the guest's CPUs are switched.
const CPUS_DIR: &str = "/sys/devices/system/cpu";

/// The file that stops domain `domain`'s thread (one thread a domain).
fn stop_file(domain: u32) -> String {
    format!("/tmp/perfbed-moves-{domain}.stop")
}

/// The shell that runs [`script`], in every guest's initramfs and on the
/// host (Debian's busybox-static), so that the tests below run the loop as
/// the guest does.
pub(super) const SHELL: [&str; 3] = ["/bin/busybox", "sh", "-c"];

/// The sh loop that switches `cpus` (each by `cpus_dir/cpuN/online`)
/// until `stop` exists, and prints its rounds. Only the shell's builtins
/// (busybox's ash has `[` and `echo` built in): the next start removes the
/// stop file.
fn script(cpus_dir: &str, cpus: &[u32], stop: &str) -> String {
    let list: Vec<String> = cpus.iter().map(u32::to_string).collect();
    format!(
        "set -e; rounds=0; \
         while [ ! -e {stop} ] || [ \"$rounds\" -eq 0 ]; do \
         for c in {}; do \
         echo 0 > {cpus_dir}/cpu$c/online; \
         echo 1 > {cpus_dir}/cpu$c/online; \
         done; rounds=$((rounds + 1)); done; echo \"$rounds\"",
        list.join(" ")
    )
}

/// Starts domain `domain`'s thread over `cpus`: its job number.
pub fn start(g: &mut Guest, domain: u32, cpus: &[u32]) -> Result<Result<Vec<u64>, String>> {
    let stop = stop_file(domain);
    // One a thread killed left behind would stop this one at once.
    let (status, _, err) = g.run(&["/bin/busybox", "rm", "-f", &stop])?;
    if status != Some(0) {
        bail!("removing {stop} in the guest: {status:?} {}", err.trim());
    }
    let argv = SHELL
        .iter()
        .map(|word| word.to_string())
        .chain([script(CPUS_DIR, cpus, &stop)])
        .collect();
    Ok(
        match g.ask(HostRequest::StartJob {
            spec: JobSpec::Process {
                argv,
                perf_fds: 0,
                settle_ms: 0,
            },
        })? {
            AgentMessage::JobStarted { job } => Ok(vec![u64::from(job)]),
            other => Err(format!("starting the moving thread: {other:?}")),
        },
    )
}

/// Stops domain `domain`'s thread, job `job`, after its round and waits
/// for it (at most `timeout_ms`, then it is killed): the rounds it made
/// and `pmu`'s CPU after them. A hotplug write the kernel refused ends it
/// early, with the shell's error: that is the result's error.
pub fn stop(
    g: &mut Guest,
    domain: u32,
    pmu: &str,
    job: u32,
    timeout_ms: u64,
) -> Result<Result<Vec<u64>, String>> {
    let stop = stop_file(domain);
    let (status, _, err) = g.run(&["/bin/busybox", "touch", &stop])?;
    if status != Some(0) {
        bail!("creating {stop} in the guest: {status:?} {}", err.trim());
    }
    let done = g.ask(HostRequest::StopJob {
        job,
        signal: 0,
        timeout_ms,
    })?;
    let rounds = match done {
        AgentMessage::JobDone(JobResult::Process {
            status: Some(0),
            stdout,
            ..
        }) => match stdout.trim().parse::<u64>() {
            Ok(rounds) => rounds,
            Err(_) => bail!("the moving thread printed {stdout:?}, not its rounds"),
        },
        AgentMessage::JobDone(JobResult::Process { status, stderr, .. }) => {
            return Ok(Err(format!(
                "the moving thread ended with status {status:?} (None: killed after {timeout_ms} ms): {}",
                stderr.trim()
            )))
        }
        other => bail!("stopping the moving thread: {other:?}"),
    };
    let owner = g.cpumask(pmu)?;
    Ok(match owner[..] {
        [cpu] => Ok(vec![rounds, u64::from(cpu)]),
        _ => Err(format!(
            "{pmu}: cpumask {owner:?} after the moving thread's {rounds} rounds, want one CPU"
        )),
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    use super::*;

    /// Runs the loop on the host over a fake `dir` of CPUs 2 and 3 (those
    /// of `present`), creates its stop file after `after`: its status and
    /// what it printed.
    fn run_until_stopped(dir: &Path, present: &[u32], after: Duration) -> (Option<i32>, String) {
        for c in present {
            std::fs::create_dir_all(dir.join(format!("cpu{c}"))).unwrap();
        }
        let stop = dir.join("stop");
        let child = Command::new(SHELL[0])
            .args(&SHELL[1..])
            .arg(script(
                &dir.display().to_string(),
                &[2, 3],
                &stop.display().to_string(),
            ))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("busybox sh");
        std::thread::sleep(after);
        std::fs::write(&stop, "").unwrap();
        let out = child.wait_with_output().expect("waiting for busybox sh");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("perfbed-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn the_loop_ends_after_a_whole_round_with_every_cpu_back() {
        let dir = scratch("moving-thread");
        let (status, out) = run_until_stopped(&dir, &[2, 3], Duration::from_millis(200));
        assert_eq!(status, Some(0), "printed {out:?}");
        let rounds: u64 = out.trim().parse().expect("the rounds it made");
        assert!(rounds >= 1, "{out:?}");
        for c in [2, 3] {
            let online = std::fs::read_to_string(dir.join(format!("cpu{c}/online"))).unwrap();
            assert_eq!(online, "1\n", "cpu{c} left offline");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_stop_before_the_first_round_still_waits_for_a_round() {
        let dir = scratch("moving-thread-early");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("stop"), "").unwrap();
        let (status, out) = run_until_stopped(&dir, &[2, 3], Duration::ZERO);
        assert_eq!((status, out.as_str()), (Some(0), "1\n"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_switch_whose_write_fails_ends_the_loop_with_an_error() {
        let dir = scratch("moving-thread-write-fails");
        std::fs::create_dir_all(dir.join("cpu2")).unwrap();
        std::fs::create_dir_all(dir.join("cpu3")).unwrap();
        // The redirection opens, the write fails (ENOSPC), as a write the
        // kernel refuses (EBUSY) does: `echo` fails, and `set -e` ends it.
        std::os::unix::fs::symlink("/dev/full", dir.join("cpu3/online")).unwrap();
        let (status, out) = run_until_stopped(&dir, &[], Duration::from_millis(200));
        assert_ne!(status, Some(0), "printed {out:?}");
        assert_eq!(out, "");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_refused_switch_ends_the_loop_with_an_error() {
        let dir = scratch("moving-thread-refused");
        // No cpu3: its switch cannot be written.
        let (status, out) = run_until_stopped(&dir, &[2], Duration::from_millis(200));
        assert_ne!(status, Some(0), "printed {out:?}");
        assert_eq!(out, "");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
