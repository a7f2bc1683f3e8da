//! The real `perf stat` as a lifecycle step, two ways:
//! - `perf stat -a -I 100`: enabled through its control FIFO before the
//!   first burst, every burst lands while it counts; its interval counts
//!   must add up to all of them;
//! - `perf stat -a -D -1 --control fifo:CTL,ACK`: it starts disabled and is
//!   enabled and disabled through its control FIFO between bursts (each
//!   command waits for perf's `ack`); it must count exactly the bursts that
//!   landed while enabled.
//!
//! The step answers `[the count perf printed]`, in bytes (the raw event
//! terms, so perf prints bytes, not a scaled unit). A scenario's `stat`
//! lines run the first way across other lines: started and enabled at
//! `stat DOMAIN rmid=N start`, stopped and summed at `stat DOMAIN stop`.

use std::time::Duration;

use anyhow::{bail, Result};
use perfbed_agent::{JobResult, JobSpec};
use perfbed_device::regs::Event;
use perfbed_device::ControlClient;

use crate::guest::Guest;

use super::super::jobs::{start_job, stop_job};
use super::journal::StatHow;
// busybox's `sh` runs the FIFOs' commands too (`read -t` and `[` are its
// built-ins): every guest has it, the arm64 one no bash.
use super::moving_thread::SHELL;

const CTL: &str = "/tmp/perfbed-stat-ctl";
const ACK: &str = "/tmp/perfbed-stat-ack";
/// perf stat's interval, and how long the last burst waits before perf is
/// stopped (two intervals: the last one printed holds it).
const INTERVAL_MS: u64 = 100;

/// The raw event terms of (domain `pmu`, mbm_total_bytes, `rmid`), so
/// that perf prints bytes, not a scaled unit.
pub fn spec(pmu: &str, rmid: u32) -> String {
    format!(
        "{pmu}/event={:#04x},rmid={rmid}/",
        Event::MbmTotalBytes as u64
    )
}

#[allow(clippy::too_many_arguments)]
pub fn run(
    g: &mut Guest,
    control: &mut ControlClient,
    pmu: &str,
    domain: u32,
    rmid: u32,
    how: StatHow,
    bursts: &[(u64, bool)],
    wait_ms: u64,
) -> Result<Result<Vec<u64>, String>> {
    let spec = spec(pmu, rmid);
    let job = start(g, &spec, how)?;
    let mut enabled = false;
    for &(bytes, counted) in bursts {
        if counted != enabled {
            let command = if counted { "enable" } else { "disable" };
            if let Err(e) = command_acked(g, command)? {
                let _ = stop_job(g, job, libc::SIGINT);
                return Ok(Err(e));
            }
            enabled = counted;
        }
        inject(control, domain, rmid, bytes, wait_ms)?;
    }
    stop(g, job, &spec, how)
}

/// Starts perf stat on `spec` disabled, with its control FIFO: its job.
/// Both ways start so and are enabled through the FIFO, whose ack says
/// that perf's counters are on: between opening its fd and enabling it
/// perf may take seconds on a loaded guest (seed 3 once counted none of
/// its bursts so).
fn start(g: &mut Guest, spec: &str, how: StatHow) -> Result<u32> {
    // --no-scale: the raw count, which the model knows exactly (perf scales
    // a multiplexed count by default).
    let mut argv: Vec<String> = ["/usr/bin/perf", "stat", "-a", "--no-scale", "-x,"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if how == StatHow::Interval {
        argv.extend(["-I".to_string(), INTERVAL_MS.to_string()]);
    }
    let (status, _, stderr) = g.run(&[
        SHELL[0],
        SHELL[1],
        SHELL[2],
        &format!(
            "/bin/busybox mkdir -p /tmp && /bin/busybox rm -f {CTL} {ACK} && /bin/busybox mkfifo {CTL} {ACK}"
        ),
    ])?;
    if status != Some(0) {
        bail!("making perf stat's control FIFOs: {stderr}");
    }
    argv.extend([
        "-D".to_string(),
        "-1".to_string(),
        "--control".to_string(),
        format!("fifo:{CTL},{ACK}"),
    ]);
    argv.extend(["-e".to_string(), spec.to_string()]);
    start_job(
        g,
        JobSpec::Process {
            argv,
            perf_fds: 1,
            settle_ms: 150,
        },
    )
}

/// Sends `command` (`enable`, `disable`) through perf stat's control FIFO
/// and waits for its `ack`: the error if none came.
fn command_acked(g: &mut Guest, command: &str) -> Result<Result<(), String>> {
    let script =
        format!("echo {command} > {CTL} && read -t 10 reply < {ACK} && [ \"$reply\" = ack ]");
    let (status, _, stderr) = g.run(&[SHELL[0], SHELL[1], SHELL[2], &script])?;
    Ok(if status == Some(0) {
        Ok(())
    } else {
        Err(format!("perf stat --control {command}: no ack ({stderr})"))
    })
}

/// Stops perf stat's `job` (with `-I`, after two more intervals, so that
/// the last burst is printed): the count it printed for `spec`.
fn stop(g: &mut Guest, job: u32, spec: &str, how: StatHow) -> Result<Result<Vec<u64>, String>> {
    if how == StatHow::Interval {
        std::thread::sleep(Duration::from_millis(2 * INTERVAL_MS + 50));
    }
    let result = stop_job(g, job, libc::SIGINT)?;
    let JobResult::Process { stderr, stdout, .. } = &result else {
        bail!("perf stat: not a process result: {result:?}")
    };
    Ok(count(stderr, spec, how)
        .map(|n| vec![n])
        .map_err(|e| format!("{e}; stdout {stdout:?}")))
}

/// A scenario's `stat DOMAIN rmid=N start`: `perf stat -a -I 100` on
/// `spec`, enabled and counting when this returns: its job.
pub fn start_interval(g: &mut Guest, spec: &str) -> Result<Result<Vec<u64>, String>> {
    let job = start(g, spec, StatHow::Interval)?;
    if let Err(e) = command_acked(g, "enable")? {
        let _ = stop_job(g, job, libc::SIGINT);
        return Ok(Err(e));
    }
    Ok(Ok(vec![u64::from(job)]))
}

/// A scenario's `stat DOMAIN stop`: the sum of the intervals `job`
/// printed for `spec`.
pub fn stop_interval(g: &mut Guest, job: u32, spec: &str) -> Result<Result<Vec<u64>, String>> {
    stop(g, job, spec, StatHow::Interval)
}

fn inject(
    control: &mut ControlClient,
    domain: u32,
    rmid: u32,
    bytes: u64,
    wait_ms: u64,
) -> Result<()> {
    control.inject(domain, rmid, Event::MbmTotalBytes, bytes)?;
    control.wait_landed(wait_ms)?;
    Ok(())
}

/// The count perf printed for `spec`: the sum of its interval lines with
/// `-I` (`time,value,unit,event,...`), its one line otherwise
/// (`value,unit,event,...`).
fn count(stderr: &str, spec: &str, how: StatHow) -> Result<u64, String> {
    let needle = format!(",{spec},");
    let mut total = 0u64;
    let mut lines = 0;
    for line in stderr.lines().filter(|l| l.contains(&needle)) {
        let head = line.split(&needle).next().unwrap_or("");
        let value = head.rsplit(',').nth(1).unwrap_or("");
        let value = match how {
            StatHow::Interval => value,
            StatHow::Control => head.split(',').next().unwrap_or(""),
        };
        // Never scheduled in that interval (or at all): nothing counted.
        let n: u64 = if value == "<not counted>" {
            0
        } else {
            value
                .parse()
                .map_err(|_| format!("perf stat printed {value:?} in {line:?}"))?
        };
        total += n;
        lines += 1;
    }
    if lines == 0 {
        return Err(format!(
            "perf stat printed no line for {spec}: {}",
            stderr.trim()
        ));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = "perfbed_l3_1/event=0x02,rmid=6/";

    #[test]
    fn interval_lines_add_up_and_a_final_line_is_read_once() {
        let intervals = "#  time,counts\n     0.100,64,,perfbed_l3_1/event=0x02,rmid=6/,100000,100.00,,\n     0.200,<not counted>,,x,0,0,,\n     0.200,128,,perfbed_l3_1/event=0x02,rmid=6/,100000,100.00,,\n";
        assert_eq!(count(intervals, SPEC, StatHow::Interval), Ok(192));
        let not_counted = "     0.300,<not counted>,,perfbed_l3_1/event=0x02,rmid=6/,0,0.00,,\n";
        assert_eq!(
            count(
                &(intervals.to_string() + not_counted),
                SPEC,
                StatHow::Interval
            ),
            Ok(192)
        );
        let last = "640,,perfbed_l3_1/event=0x02,rmid=6/,2000,100.00,,\n";
        assert_eq!(count(last, SPEC, StatHow::Control), Ok(640));
        assert_eq!(
            count(
                "<not counted>,,perfbed_l3_1/event=0x02,rmid=6/,0,0.00,,\n",
                SPEC,
                StatHow::Control
            ),
            Ok(0)
        );
        assert!(count(
            "<not supported>,,perfbed_l3_1/event=0x02,rmid=6/,0,0.00,,\n",
            SPEC,
            StatHow::Control
        )
        .is_err());
        assert!(count("", SPEC, StatHow::Control).is_err());
    }
}
