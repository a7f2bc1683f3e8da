//! `cargo xtask hotplug-selftest`: the scenario that first showed perfbed's
//! PMUs losing counts across CPU hotplug, replayed as a user ran it.
//!
//! A steady rate flows to one RMID of the domain that parks (the last domain
//! without CPU 0). The real `perf stat -a` counts it, by name (MB) and by raw
//! terms (bytes), while the kernel's own cpu-hotplug selftest
//! (`tools/testing/selftests/cpu-hotplug/cpu-on-off-test.sh -a`, from the
//! kernel tree the guest was built from) runs, then `--rounds` rounds that
//! take every CPU of the domain offline (a park) and bring them back (an
//! unpark), each followed by a flap of the domain's owner (a move).
//!
//! The rate starts after perf stat is counting and has stopped, and landed,
//! before perf stat is stopped, so perf's count must equal the device's truth
//! for the window, in whole counter units, and perf must report 100 %
//! running. Before perfbed's patches perf printed 13.81 MB against about
//! 340 MiB here, at 100 %.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use perfbed_agent::{AgentMessage, HostRequest, HotplugBatchResult, HotplugOp, JobResult, JobSpec};
use perfbed_device::regs::{whole_units, Event};
use perfbed_device::{ControlClient, DeviceConfig};

use super::jobs::{
    check_batch_shape, kernel_open_retries, perf_stat_counts, start_job, start_perf_stat, stop_job,
    OpenRetries,
};
use super::placements::Placements;
use super::{guest_vm, parking_domain, vm_control};
use crate::build::image::initramfs::SELFTEST_IN_GUEST;
use crate::build::image::{self, Variant};
use crate::checks::{Check, Report};
use crate::guest::Guest;
use crate::guest::{pmu_name, MODULE};
use crate::host;
use crate::host::config::VmConfig;
use crate::host::vm::Vm;
use crate::host::Accel;
use crate::run::default_domains;

/// The RMID the rate flows to, as in the scenario first reported.
const RMID: u32 = 2;
/// The steady rate: 8 MiB/s, as first reported.
const RATE: u64 = 8 << 20;
/// Park-and-unpark rounds sent to the agent at once.
const ROUNDS_PER_BATCH: u32 = 20;

#[derive(Args, Clone)]
pub struct SelftestArgs {
    /// Rounds that take the parking domain's CPUs offline and online, after
    /// the selftest.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    rounds: u32,
    /// Guest vCPUs (the device's domains are the CPUs in two halves).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(2..=host::config::MAX_CPUS as i64))]
    cpus: u8,
    /// Boot the normal kernel instead of the debug one.
    #[arg(long)]
    normal: bool,
    /// Seconds any one step may take.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

pub struct SelftestConfig {
    pub vm: VmConfig,
    pub rounds: u32,
    pub timeout: Duration,
}

pub fn run(ws: &Path, args: &SelftestArgs) -> Result<bool> {
    let variant = if args.normal {
        Variant::Normal
    } else {
        Variant::Debug
    };
    host::config::check_size(args.cpus, 1024)?;
    let images = image::ensure(ws, variant)?;
    let timeout = Duration::from_secs(args.timeout);
    let config = SelftestConfig {
        vm: guest_vm(
            ws,
            &images,
            DeviceConfig {
                domains: default_domains(args.cpus),
                ..Default::default()
            },
            args.cpus,
            1024,
            "hotplug-selftest",
            timeout,
        ),
        rounds: args.rounds,
        timeout,
    };
    eprintln!(
        "==> hotplug selftest: {} vCPUs, {} kernel, cpu-on-off-test.sh -a then {} park rounds",
        args.cpus,
        variant.name(),
        args.rounds
    );
    let report = execute(&config, &host::choose_accel())?;
    print!("{}", report.table());
    Ok(report.passed())
}

/// Boots, replays the scenario, powers off.
pub fn execute(config: &SelftestConfig, accel: &Accel) -> Result<Report> {
    let booted = Vm::boot(&config.vm, accel)?;
    let mut vm = booted.vm;
    let checks = replay(&mut vm, config)?;
    vm.power_off(Duration::from_secs(60))?;
    Ok(Report::from_checks(
        checks,
        &config.vm.run_dir.join("serial.log"),
    ))
}

fn replay(vm: &mut Vm, config: &SelftestConfig) -> Result<Vec<Check>> {
    let device = &config.vm.device;
    let Some(d) = parking_domain(device) else {
        bail!(
            "the replay needs a domain without CPU 0 (domains {:?})",
            device.domains
        )
    };
    let domain_cpus = device.domains[d].clone();
    let pmus: Vec<String> = (0..device.domains.len()).map(pmu_name).collect();
    let mut g = Guest {
        vm,
        timeout: config.timeout,
    };
    let mut control = ControlClient::connect(&vm_control(&config.vm.run_dir))?;
    g.expect_done(HostRequest::LoadModule {
        name: MODULE.into(),
    })?;

    let (stat_job, named, raw) = start_perf_stat(&mut g, &pmus[d], RMID)?;
    let before = control.state()?;
    control.set_rate(d as u32, RMID, Event::MbmTotalBytes, RATE)?;

    // The kernel's selftest under bash, which it needs, with busybox's
    // applets (taskset, mount, awk, grep) on the PATH. Signal 0 stops
    // nothing: the agent waits for the script to end.
    let script = format!("/bin/busybox --install -s /bin 2>/dev/null; PATH=/bin exec /bin/bash /{SELFTEST_IN_GUEST} -a");
    let argv = vec!["/bin/busybox".into(), "sh".into(), "-c".into(), script];
    let selftest_job = start_job(
        &mut g,
        JobSpec::Process {
            argv,
            perf_fds: 0,
            settle_ms: 0,
        },
    )?;
    let wait = HostRequest::StopJob {
        job: selftest_job,
        signal: 0,
        timeout_ms: config.timeout.as_millis() as u64,
    };
    let selftest = match g.ask(wait)? {
        AgentMessage::JobDone(result) => result,
        other => bail!("waiting for the selftest: {other:?}"),
    };
    let mut checks = vec![selftest_check(&selftest)];

    // Then park and unpark the domain, flapping its owner in between.
    let rounds_start = Instant::now();
    let mut placements = Placements::default();
    let mut op_errors = Vec::new();
    let mut writes = 0u64;
    let mut done = 0;
    while done < config.rounds {
        let rounds = ROUNDS_PER_BATCH.min(config.rounds - done);
        let mut ops = Vec::new();
        for _ in 0..rounds {
            ops.extend(
                domain_cpus
                    .iter()
                    .map(|&cpu| HotplugOp::Set { cpu, online: false }),
            );
            ops.extend(
                domain_cpus
                    .iter()
                    .rev()
                    .map(|&cpu| HotplugOp::Set { cpu, online: true }),
            );
            ops.push(HotplugOp::FlapOwner {
                pmu: pmus[d].clone(),
            });
        }
        let op_count = ops.len();
        let result: HotplugBatchResult = match g.ask(HostRequest::HotplugBatch {
            ops,
            watch_pmus: vec![pmus[d].clone()],
            read_handles: vec![],
        })? {
            AgentMessage::HotplugBatch(result) => result,
            other => bail!("park rounds {done}..: {other:?}"),
        };
        check_batch_shape(&result, op_count, 0).with_context(|| format!("park rounds {done}.."))?;
        placements.add(&result);
        for op in &result.ops {
            writes += u64::from(op.writes);
            if let Some(e) = &op.error {
                op_errors.push(e.clone());
            }
        }
        done += rounds;
    }
    let hotplug_time = rounds_start.elapsed();
    op_errors.truncate(5);
    checks.push(Check::from_problems(
        "hotplug",
        op_errors,
        format!(
            "{} park rounds after the selftest: {writes} sysfs writes in {:.1} s, all succeeded",
            config.rounds,
            hotplug_time.as_secs_f64()
        ),
    ));
    let mut problems = placements.odd.clone();
    if placements.parks < u64::from(config.rounds)
        || placements.unparks < u64::from(config.rounds)
        || placements.moves == 0
    {
        problems.push(format!(
            "{} rounds made {} parks, {} unparks, {} moves",
            config.rounds, placements.parks, placements.unparks, placements.moves
        ));
    }
    checks.push(Check::from_problems(
        "moves and parks",
        problems,
        format!(
            "{} moves, {} parks, {} unparks of {}",
            placements.moves, placements.parks, placements.unparks, pmus[d]
        ),
    ));

    control.set_rate(d as u32, RMID, Event::MbmTotalBytes, 0)?;
    control.wait_landed(config.timeout.as_millis() as u64)?;
    let after = control.state()?;
    let stat = stop_job(&mut g, stat_job, libc::SIGINT)?;
    let truth = after.truth(d as u32, RMID, Event::MbmTotalBytes)
        - before.truth(d as u32, RMID, Event::MbmTotalBytes);
    checks.push(count_check(&stat, &named, &raw, truth, device.unit_bytes));
    let OpenRetries { waits, retries } = kernel_open_retries(&mut g, &pmus)?;
    eprintln!(
        "    opens in the kernel: {waits} waited for a move, {retries} tried again after one"
    );
    Ok(checks)
}

/// The selftest must have run in full and passed.
fn selftest_check(result: &JobResult) -> Check {
    let JobResult::Process {
        status,
        stdout,
        stderr,
    } = result
    else {
        return Check::from_problems(
            "cpu-on-off-test.sh -a",
            vec![format!("not a process result: {result:?}")],
            String::new(),
        );
    };
    let mut problems = Vec::new();
    if *status != Some(0) {
        problems.push(format!(
            "exit status {status:?}; stdout {:?}; stderr {:?}",
            stdout.trim(),
            stderr.trim()
        ));
    } else if !stdout.contains("Full scope test") {
        problems.push(format!(
            "it did not run the full scope test: {:?}",
            stdout.trim()
        ));
    }
    Check::from_problems(
        "cpu-on-off-test.sh -a",
        problems,
        "the kernel's cpu-hotplug selftest passed (full scope)".into(),
    )
}

/// perf stat's counts against the device's truth for the window.
fn count_check(stat: &JobResult, named: &str, raw: &str, truth: u64, unit: u64) -> Check {
    let counts = match perf_stat_counts(stat, named, raw) {
        Ok(counts) => counts,
        Err(e) => {
            return Check::from_problems("perf stat count", vec![format!("{e:#}")], String::new())
        }
    };
    let mut problems = Vec::new();
    let want = whole_units(truth, unit);
    if counts.raw_bytes != want {
        problems.push(format!(
            "perf stat {raw}: {} bytes, the device's truth {truth} bytes ({want} in whole units)",
            counts.raw_bytes
        ));
    }
    let truth_mb = truth as f64 / (1u64 << 20) as f64;
    if (counts.named_mb - truth_mb).abs() > 0.0051 {
        problems.push(format!(
            "perf stat {named}: {:.2} MB, the device's truth {truth_mb:.4} MB",
            counts.named_mb
        ));
    }
    if counts.running_pct.iter().any(|&p| p < 100.0) {
        problems.push(format!(
            "perf stat ran {:?} % of the time",
            counts.running_pct
        ));
    }
    Check::from_problems(
        "perf stat count",
        problems,
        format!("perf stat -a: {:.2} MB and {} bytes; the device's truth {truth} bytes ({truth_mb:.2} MiB); running {:?} %", counts.named_mb, counts.raw_bytes, counts.running_pct),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(status: Option<i32>, stdout: &str, stderr: &str) -> JobResult {
        JobResult::Process {
            status,
            stdout: stdout.into(),
            stderr: stderr.into(),
        }
    }

    #[test]
    fn the_selftest_must_pass_in_full() {
        assert!(
            selftest_check(&process(Some(0), "Full scope test: all hotplug cpus\n", "")).passed
        );
        // Failed, skipped (ksft_skip is 4), killed, or only the limited test.
        assert!(
            !selftest_check(&process(
                Some(1),
                "Full scope test\n",
                "offline_cpu_expect_success 2: unexpected fail"
            ))
            .passed
        );
        assert!(
            !selftest_check(&process(Some(4), "skip all tests: must be run as root", "")).passed
        );
        assert!(!selftest_check(&process(None, "", "")).passed);
        assert!(
            !selftest_check(&process(
                Some(0),
                "Limited scope test: one hotplug cpu\n",
                ""
            ))
            .passed
        );
    }

    #[test]
    fn perf_stat_must_equal_the_truth_at_100_percent() {
        let named = "perfbed_l3_1/mbm_total_bytes,rmid=2/";
        let raw = "perfbed_l3_1/event=0x02,rmid=2/";
        let stat = |mb: &str, bytes: u64, pct: &str| {
            process(
                Some(0),
                "",
                &format!(
                    "{mb},MB,{named},42000000000,{pct},,\n{bytes},,{raw},42000000000,{pct},,\n"
                ),
            )
        };
        // 340 MiB and 25 bytes: the counter counts whole 64-byte units.
        let truth = 340 * (1 << 20) + 25;
        assert!(count_check(&stat("340.00", 340 << 20, "100.00"), named, raw, truth, 64).passed);
        // The first report: 13.81 MB counted, at 100 %.
        assert!(!count_check(&stat("13.81", 14_480_834, "100.00"), named, raw, truth, 64).passed);
        // One unit short; or exact but not running all the time.
        assert!(
            !count_check(
                &stat("340.00", (340 << 20) - 64, "100.00"),
                named,
                raw,
                truth,
                64
            )
            .passed
        );
        assert!(!count_check(&stat("340.00", 340 << 20, "97.50"), named, raw, truth, 64).passed);
        assert!(
            !count_check(
                &process(Some(0), "", "<not counted>,,x,0,0.00,,\n"),
                named,
                raw,
                truth,
                64
            )
            .passed
        );
    }
}
