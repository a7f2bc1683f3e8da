//! A host that stops reading the serial console, then the agent channel
//! too, while the guest floods both and hotplugs CPUs: no vCPU may wait on
//! the host, and the agent channel must not wait on the serial console.
//!
//! A shell in the guest writes `/dev/ttyS0` in bursts of `FLOOD_BURST`
//! bytes, each followed by a wait until the UART has sent it and a pause
//! of `FLOOD_GAP` (see there for why not without pause). In the box the
//! harness first stops reading the serial console alone for
//! `SERIAL_ALONE`, long enough to fill every buffer between perfbed-vmm
//! and the harness (natively perfbed-vmm writes the serial log file
//! itself, which does not stall; the check says so), and asks the agent
//! for its uptime every `PROBE_EVERY` meanwhile: perfbed-vmm's event loop
//! serves the agent channel and writes the serial log, so a loop that
//! waited in that write would leave the agent unanswered. Then, the serial
//! console still unread, the guest's agent answers `FLOOD_REQUESTS`
//! requests for a `FLOOD_FILE_BYTES` file while the host reads nothing for
//! `STALL`: far more than every buffer between the agent and the harness
//! holds, so the agent's writes wait in the guest. The UART's bytes pile
//! up in perfbed-vmm's ring (`SERIAL_RING` bytes for this check) until it
//! drops them, which the VMM counts and reports
//! (`serial_output_dropped_bytes`, checked by the VM test after the
//! power-off). Meanwhile a shell in the guest takes
//! every CPU but 0 offline and online again in a loop, stamping each cycle
//! with the guest's uptime (one stamp per CPU cycled); CPU offline needs every online CPU to answer
//! (`stop_machine`), so a vCPU held in the host stops the loop. Passed when
//! the hotplug rate during the stall is at least half the rate before it,
//! every answer arrives whole once the host reads again; the caller's clean
//! kernel log check catches RCU stalls.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use perfbed_agent::{AgentMessage, HostRequest, JobResult, JobSpec};

use super::Check;
use crate::host::vm::Vm;
use crate::progress::human;

const FLOOD_FILE: &str = "/tmp/perfbed-flood";
const FLOOD_FILE_BYTES: usize = 256 << 10;
const FLOOD_REQUESTS: usize = 40;
/// The serial flood's bursts: one write each, less than the guest's 8250
/// transmit buffer (4 KiB) with a carriage return added to each line, so
/// that the UART's interrupt handler, which
/// sends the buffer 16 bytes a pass with the port lock held and interrupts
/// off, returns once a burst is sent. A writer that kept the buffer full
/// (`yes > /dev/ttyS0`) kept the interrupt's CPU in that handler for good:
/// this VMM's transmitter is always empty, so each pass raises the next
/// interrupt at once, and in the box every byte is a nested exit of about
/// 100 us; that CPU never ran its stopper thread again (the hotplug loop
/// stood still from the start, with RCU stall reports), paravirtual
/// spinlocks or not.
const FLOOD_BURST: usize = 3 << 10;
/// The flood's pause after the UART has sent a burst (`stty`, which waits
/// for the transmit buffer to drain, then `usleep`): the interrupt's CPU
/// is its own at least this long between bursts.
const FLOOD_GAP: Duration = Duration::from_millis(50);
/// perfbed-vmm's serial output ring for this check, small beside the
/// buffers after it, so that the paced flood overflows it within the
/// stall.
pub const SERIAL_RING: usize = 4 << 10;
/// How long the host reads the agent channel but not the serial console,
/// long enough for the flood to fill the virtio-serial port, QEMU and the
/// socket between perfbed-vmm and the harness, after which perfbed-vmm's
/// writes of the serial log would block. In the box, 1 KiB bursts came to
/// about 1.8 KB/s, and perfbed-vmm began to drop (a 16 KiB ring then)
/// about 70 s after the harness stopped reading: the ring and the buffers
/// after it held about 125 KB.
const SERIAL_ALONE: Duration = Duration::from_secs(90);
/// How often the agent is asked for its uptime while the serial console
/// alone is stalled.
const PROBE_EVERY: Duration = Duration::from_secs(2);
/// The slowest answer allowed then (one takes well under a second in the
/// box); an event loop waiting in the serial log answers none until the
/// harness reads the console again.
const PROBE_LIMIT: Duration = Duration::from_secs(10);
/// How long the host then reads nothing. The serial console unread for
/// `SERIAL_ALONE` + `STALL`, the ring and the buffers after it overflow,
/// which the VM test requires.
const STALL: Duration = Duration::from_secs(30);
/// The hotplug rate's baseline, just before the stall: in the box one
/// CPU's offline and online take 1.4-9 s beside the flood, so 30 s held
/// 3-20 stamps and the least share seen in 20 runs was 58 %; 60 s halves
/// the noise of that ratio.
const BEFORE: Duration = Duration::from_secs(60);
/// The least share of the baseline rate the stall may keep. A vCPU held
/// by the host stops the loop outright (CPU offline waits for every online
/// CPU), so the rate would fall to near 0; 0.5 leaves room for the
/// machine's load to change between the two windows (other VMs and builds
/// on 2 shared cores, L1 a single TCG thread) without hiding that.
const MIN_RATE_SHARE: f64 = 0.5;
/// What the serial log may still grow by once the harness stops reading:
/// what its copy had in hand (one read of 4 KiB) and some slack.
const SERIAL_GROWTH_WHILE_STALLED: u64 = 64 << 10;

fn sh(script: &str) -> HostRequest {
    HostRequest::Run {
        argv: vec![
            "/bin/busybox".into(),
            "sh".into(),
            "-c".into(),
            script.into(),
        ],
    }
}

fn uptime(vm: &mut Vm, timeout: Duration) -> Result<f64> {
    match vm.request(
        &HostRequest::ReadFile {
            path: "/proc/uptime".into(),
        },
        timeout,
    )? {
        AgentMessage::Text { text } => text
            .split_whitespace()
            .next()
            .and_then(|t| t.parse().ok())
            .context("parsing /proc/uptime"),
        other => bail!("reading /proc/uptime: {other:?}"),
    }
}

/// Cycles per second among `stamps` within `from..to` (guest uptime, s).
fn rate(stamps: &[f64], from: f64, to: f64) -> f64 {
    stamps.iter().filter(|t| (from..to).contains(*t)).count() as f64 / (to - from)
}

/// The check on a booted guest of `cpus` vCPUs (at least 2).
pub fn run(vm: &mut Vm, cpus: u8, timeout: Duration) -> Result<Vec<Check>> {
    let cpus: Vec<String> = (1..cpus).map(|c| c.to_string()).collect();
    if cpus.is_empty() {
        bail!("the slow-reader check needs at least 2 vCPUs");
    }
    let made = vm.request(
        &sh(&format!(
            "/bin/busybox mkdir -p /tmp && /bin/busybox yes perfbed-slow-reader | /bin/busybox head -c {FLOOD_FILE_BYTES} > {FLOOD_FILE}"
        )),
        timeout,
    )?;
    if !matches!(
        made,
        AgentMessage::Ran {
            status: Some(0),
            ..
        }
    ) {
        bail!("writing {FLOOD_FILE}: {made:?}");
    }
    let content = match vm.request(
        &HostRequest::ReadFile {
            path: FLOOD_FILE.into(),
        },
        timeout,
    )? {
        AgentMessage::Text { text } if text.len() == FLOOD_FILE_BYTES => text,
        other => bail!("reading {FLOOD_FILE} back: {other:?}"),
    };

    let seconds = (BEFORE + SERIAL_ALONE + STALL).as_secs() + 120;
    let script = format!(
        "end=$(( $(/bin/busybox date +%s) + {seconds} )); while [ $(/bin/busybox date +%s) -lt $end ]; do \
         for c in {}; do echo 0 > /sys/devices/system/cpu/cpu$c/online; echo 1 > /sys/devices/system/cpu/cpu$c/online; \
         read up idle < /proc/uptime; echo $up; done; done",
        cpus.join(" ")
    );
    let argv = vec!["/bin/busybox".into(), "sh".into(), "-c".into(), script];
    let spec = JobSpec::Process {
        argv,
        perf_fds: 0,
        settle_ms: 0,
    };
    let job = match vm.request(&HostRequest::StartJob { spec }, timeout)? {
        AgentMessage::JobStarted { job } => job,
        other => bail!("starting the hotplug loop: {other:?}"),
    };
    let flood = JobSpec::Process {
        argv: vec![
            "/bin/busybox".into(),
            "sh".into(),
            "-c".into(),
            format!(
                "b=$(/bin/busybox yes perfbed-serial-flood | /bin/busybox head -c {FLOOD_BURST}); exec 3>/dev/ttyS0; \
                 while :; do echo \"$b\" >&3; /bin/busybox stty -F /dev/ttyS0 -echo; /bin/busybox usleep {}; done",
                FLOOD_GAP.as_micros()
            ),
        ],
        perf_fds: 0,
        settle_ms: 0,
    };
    let flood = match vm.request(&HostRequest::StartJob { spec: flood }, timeout)? {
        AgentMessage::JobStarted { job } => job,
        other => bail!("starting the serial flood: {other:?}"),
    };
    std::thread::sleep(BEFORE);

    let stall_start = uptime(vm, timeout)?;
    let serial_stalled = vm.pause_serial(true);
    let serial_log = vm.serial_log.clone();
    let serial_size = || std::fs::metadata(&serial_log).map_or(0, |m| m.len());
    let serial_at_stall = serial_size();
    let mut probes = Vec::new();
    if serial_stalled {
        let started = Instant::now();
        while started.elapsed() < SERIAL_ALONE {
            let asked = Instant::now();
            uptime(vm, PROBE_LIMIT * 3).context(
                "asking the agent while the serial console was not read: perfbed-vmm waits for the serial log (its event loop, or a vCPU)",
            )?;
            probes.push(asked.elapsed());
            std::thread::sleep(PROBE_EVERY.saturating_sub(asked.elapsed()));
        }
    }
    vm.pause_reading(true);
    let request = serde_json::to_string(&HostRequest::ReadFile {
        path: FLOOD_FILE.into(),
    })? + "\n";
    for _ in 0..FLOOD_REQUESTS {
        vm.send_raw(request.as_bytes())?;
    }
    std::thread::sleep(STALL);
    let serial_growth = serial_size().saturating_sub(serial_at_stall);
    vm.pause_serial(false);
    vm.pause_reading(false);
    let resumed = Instant::now();
    let mut arrived = Vec::new();
    for i in 0..FLOOD_REQUESTS {
        match vm.next_message(timeout, "an answer sent while the host did not read")? {
            AgentMessage::Text { text } => arrived.push(text == content),
            other => bail!(
                "answer {} of {FLOOD_REQUESTS} after the stall: {other:?}",
                i + 1
            ),
        }
    }
    let drained = resumed.elapsed();
    match vm.request(
        &HostRequest::StopJob {
            job: flood,
            signal: libc::SIGTERM,
            timeout_ms: 5000,
        },
        timeout,
    )? {
        AgentMessage::JobDone(_) => {}
        other => bail!("stopping the serial flood: {other:?}"),
    }
    let stamps: Vec<f64> = match vm.request(
        &HostRequest::StopJob {
            job,
            signal: libc::SIGTERM,
            timeout_ms: 5000,
        },
        timeout,
    )? {
        AgentMessage::JobDone(JobResult::Process { stdout, .. }) => stdout
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect(),
        other => bail!("stopping the hotplug loop: {other:?}"),
    };
    // The baseline leaves out its first 2 s (the loop starting up).
    let before = rate(
        &stamps,
        stall_start - BEFORE.as_secs_f64() + 2.0,
        stall_start,
    );
    let stalled_for = STALL
        + if serial_stalled {
            SERIAL_ALONE
        } else {
            Duration::ZERO
        };
    let during = rate(
        &stamps,
        stall_start,
        stall_start + stalled_for.as_secs_f64(),
    );

    let whole = arrived.iter().filter(|w| **w).count();
    let bytes = whole * FLOOD_FILE_BYTES;
    let delivery = Check {
        name: "slow reader: every byte",
        passed: whole == FLOOD_REQUESTS,
        detail: format!(
            "{whole} of {FLOOD_REQUESTS} answers of {FLOOD_FILE_BYTES} bytes arrived whole ({bytes} bytes) in {} once the host read again after {}",
            human(drained),
            human(STALL)
        ),
    };
    let slowest = probes.iter().max().copied().unwrap_or_default();
    let agent = Check {
        name: "slow reader: agent answers while the serial log stalls",
        passed: !serial_stalled || (!probes.is_empty() && slowest <= PROBE_LIMIT),
        detail: if serial_stalled {
            format!(
                "{} uptime requests answered in the {} the serial console was not read, the slowest in {} (at most {} wanted)",
                probes.len(),
                human(SERIAL_ALONE),
                human(slowest),
                human(PROBE_LIMIT)
            )
        } else {
            "NOT STALLED: this host writes serial.log itself, so its event loop cannot be made to wait for it".into()
        },
    };
    let stall = Check {
        name: "slow reader: no vCPU stall",
        passed: before > 0.0 && during >= MIN_RATE_SHARE * before,
        detail: format!(
            "CPU hotplug {during:.2} cycles/s in the {} the host did not read, {before:.2} before ({:.0} %, at least {:.0} % wanted; {} stamps)",
            human(stalled_for),
            if before > 0.0 { 100.0 * during / before } else { 0.0 },
            MIN_RATE_SHARE * 100.0,
            stamps.len()
        ),
    };
    let serial = Check {
        name: "slow reader: serial console stalled",
        passed: !serial_stalled || serial_growth <= SERIAL_GROWTH_WHILE_STALLED,
        detail: if serial_stalled {
            format!(
                "serial.log grew {serial_growth} bytes while the host did not read it (at most {SERIAL_GROWTH_WHILE_STALLED}), the guest writing /dev/ttyS0 throughout"
            )
        } else {
            "NOT STALLED: this host writes serial.log itself (only the box's serial console goes through xtask); the guest wrote /dev/ttyS0 throughout".into()
        },
    };
    Ok(vec![delivery, agent, stall, serial])
}
