//! The boot-and-hotplug scenario behind `cargo xtask run` and its VM test:
//! boot, check what the agent reports, hotplug every CPU but 0 for N rounds,
//! power off, and check the kernel log stayed clean.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use perfbed_agent::{format_cpu_list, AgentMessage, HostRequest, HotplugRound, MmioAccess};
use perfbed_device::regs::{self, Event};
use perfbed_device::{ControlClient, DeviceConfig};

use crate::cmd::human;
use crate::guest::Guest;
use crate::pmu_checks;
use crate::trace::{save_trace_and_plot, SavedTrace};
use crate::vm::{self, Accel, Vm, VmConfig};

#[derive(Debug, Clone)]
pub struct Scenario {
    pub vm: VmConfig,
    pub expected_release: String,
    pub hotplug_rounds: u32,
    /// How long one request (a whole hotplug run) may take.
    pub request_timeout: Duration,
    /// Draw the trace's timeline even when every check passes (it is
    /// always saved and drawn when one fails).
    pub plot: bool,
    /// perfbed.ko as built, for gdb's symbols.
    pub driver: PathBuf,
}

pub struct Check {
    pub name: &'static str,
    pub passed: bool,
    pub detail: String,
}

pub struct Report {
    pub checks: Vec<Check>,
    pub boot_time: Duration,
    pub guest_uptime_at_ready: Duration,
    pub checks_time: Duration,
    pub serial_log: PathBuf,
    /// The saved device trace and its plot, when a check failed or the plot
    /// was asked for.
    pub trace: Option<SavedTrace>,
}

/// Fails on any WARN, BUG, oops, lockdep or RCU report in the kernel log.
pub fn clean_log_check(serial_log: &std::path::Path) -> Check {
    let log = std::fs::read_to_string(serial_log).unwrap_or_default();
    let problems = vm::kernel_log_problems(&log);
    Check::from_problems("clean kernel log", problems, "no WARN, BUG, oops, lockdep or RCU report".into())
}

impl Check {
    /// Passes when nothing went wrong: the detail is then `ok`, otherwise
    /// every problem.
    pub fn from_problems(name: &'static str, problems: Vec<String>, ok: String) -> Check {
        let passed = problems.is_empty();
        Check { name, passed, detail: if passed { ok } else { problems.join("; ") } }
    }
}

impl Report {
    /// A report of `checks` and the kernel log's cleanliness, without timings.
    pub fn from_checks(mut checks: Vec<Check>, serial_log: &std::path::Path) -> Report {
        checks.push(clean_log_check(serial_log));
        Report {
            checks,
            boot_time: Duration::ZERO,
            guest_uptime_at_ready: Duration::ZERO,
            checks_time: Duration::ZERO,
            serial_log: serial_log.to_path_buf(),
            trace: None,
        }
    }

    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }

    pub fn table(&self) -> String {
        let mut out = String::new();
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        for check in &self.checks {
            let mark = if check.passed { "PASS" } else { "FAIL" };
            let _ = writeln!(out, "  {mark}  {:width$}  {}", check.name, check.detail);
        }
        out
    }
}

/// Boots and runs the scenario. An `Err` means the run could not complete
/// (the guest hung, panicked or never came up); failed checks are in the
/// report.
pub fn run(scenario: &Scenario, accel: &Accel) -> Result<Report> {
    let booted = Vm::boot(&scenario.vm, accel)?;
    let (mut vm, hello) = (booted.vm, booted.hello);
    let checks_start = Instant::now();
    let mut checks = Vec::new();

    checks.push(Check {
        name: "kernel version",
        passed: hello.kernel_release == scenario.expected_release,
        detail: format!("{} (built {})", hello.kernel_release, scenario.expected_release),
    });
    let all_cpus: Vec<u32> = (0..u32::from(scenario.vm.cpus)).collect();
    let want_online = format_cpu_list(&all_cpus);
    checks.push(Check {
        name: "CPUs online",
        passed: hello.cpus_online == want_online,
        detail: format!("{} (expected {want_online})", hello.cpus_online),
    });
    // The device on its own first, driven from the guest without a driver.
    checks.extend(device_checks(&mut vm, scenario.vm.cpus, &scenario.vm.device, scenario.request_timeout)?);
    checks.push(perf_tool_check(&mut vm, scenario.request_timeout)?);

    // Then perfbed.ko on it: load, and every PMU check.
    let loaded = vm.request(&HostRequest::LoadModule { name: pmu_checks::MODULE.into() }, scenario.request_timeout)?;
    let module_ok = loaded == AgentMessage::Done;
    checks.push(Check {
        name: "module loaded",
        passed: module_ok,
        detail: if module_ok { "perfbed.ko (finds the device from perfbed.device=)".into() } else { format!("perfbed.ko: {loaded:?}") },
    });
    if let (true, Some(stub)) = (module_ok, &scenario.vm.gdb) {
        let mut guest = Guest { vm: &mut vm, timeout: scenario.request_timeout };
        crate::gdb::announce_module(&mut guest, pmu_checks::MODULE, &scenario.driver, &scenario.vm.vmlinux, stub.port, &scenario.vm.run_dir)?;
    }
    if module_ok {
        let control = ControlClient::connect(&vm.control_socket).context("connecting to the device's control socket")?;
        let control_socket = vm.control_socket.clone();
        let mut guest = Guest { vm: &mut vm, timeout: scenario.request_timeout };
        checks.extend(pmu_checks::run(&mut guest, control, &control_socket, &scenario.vm.device)?);
    }

    let rounds = scenario.hotplug_rounds;
    match vm.request(&HostRequest::Hotplug { rounds }, scenario.request_timeout)? {
        AgentMessage::Hotplug { rounds: results } => checks.push(hotplug_check(rounds, &results)),
        other => checks.push(Check { name: "CPU hotplug", passed: false, detail: format!("agent answered {other:?}") }),
    }

    let serial_log = vm.serial_log.clone();
    // While the VM still runs: the trace lives in the device.
    let trace = if scenario.plot || !checks.iter().all(|c| c.passed) {
        match save_trace_and_plot(&scenario.vm.run_dir, &mut vm, true) {
            Ok(saved) => Some(saved),
            Err(e) => {
                // The checks' verdict matters more than the picture.
                eprintln!("warning: the device trace could not be saved: {e:#}");
                None
            }
        }
    } else {
        None
    };
    vm.power_off(Duration::from_secs(30))?;
    checks.push(clean_log_check(&serial_log));

    Ok(Report {
        checks,
        boot_time: booted.boot_time,
        guest_uptime_at_ready: Duration::from_millis(hello.uptime_ms),
        checks_time: checks_start.elapsed(),
        serial_log,
        trace,
    })
}

/// The real perf tool, copied into the guest with its libraries, runs.
fn perf_tool_check(vm: &mut Vm, timeout: Duration) -> Result<Check> {
    let mut guest = Guest { vm, timeout };
    let (status, _, stderr) = guest.run(&["/usr/bin/perf", "stat", "-x,", "-e", "task-clock", "/bin/busybox", "true"])?;
    let passed = status == Some(0) && stderr.contains("task-clock");
    let detail = if passed {
        "`perf stat -e task-clock busybox true` runs in the guest".to_string()
    } else {
        format!("perf stat exited {status:?}: {}", stderr.trim())
    };
    Ok(Check { name: "perf tool", passed, detail })
}

/// The RMID the device checks count for.
const CHECK_RMID: u32 = 1;

/// Drives the device from the guest without a driver (the agent's register
/// accesses through /dev/mem): reads the self-description, then reads one
/// counter of every domain from every CPU, and compares what the guest saw
/// with what the device recorded through its control socket.
fn device_checks(vm: &mut Vm, guest_cpus: u8, device: &DeviceConfig, timeout: Duration) -> Result<Vec<Check>> {
    let mut checks = Vec::new();
    let cpus: Vec<u32> = (0..u32::from(guest_cpus)).collect();
    let domains = device.domains.len() as u64;

    // 1. The self-description, read from CPU 0.
    let mut expected: Vec<(String, u64, u64)> = vec![
        ("magic".into(), regs::REG_MAGIC, regs::MAGIC_VALUE),
        ("version".into(), regs::REG_VERSION, regs::VERSION_VALUE),
        ("domains".into(), regs::REG_NUM_DOMAINS, domains),
        ("rmids".into(), regs::REG_NUM_RMIDS, u64::from(device.rmids)),
        ("slots".into(), regs::REG_NUM_SLOTS, u64::from(device.slots)),
        ("width".into(), regs::REG_COUNTER_WIDTH, u64::from(device.counter_width)),
        ("unit".into(), regs::REG_COUNTER_UNIT, device.unit_bytes),
        ("max rate".into(), regs::REG_MAX_RATE, device.max_rate),
    ];
    for (d, allowed) in device.domains.iter().enumerate() {
        let mask = allowed.iter().fold(0u64, |m, &c| m | 1 << c);
        expected.push((format!("domain {d} CPUs"), regs::domain_reg(d as u64, regs::DOM_ALLOWED_CPUS), mask));
    }
    let reads: Vec<MmioAccess> = expected.iter().map(|(_, offset, _)| read_from(0, *offset)).collect();
    let values = mmio(vm, device, reads, timeout)?;
    let wrong: Vec<String> = expected
        .iter()
        .zip(&values)
        .filter(|((_, _, want), got)| want != *got)
        .map(|((name, _, want), got)| format!("{name}: {got:#x}, expected {want:#x}"))
        .collect();
    checks.push(Check::from_problems(
        "device self-description",
        wrong,
        format!("{} registers as configured ({} domains, {} RMIDs, {} slots, {}-bit counters)", expected.len(), domains, device.rmids, device.slots, device.counter_width),
    ));

    // 2. Each domain gets an owner (its last allowed CPU) and a counter slot;
    //    the host injects a known amount, then every CPU reads every counter.
    let mut control = ControlClient::connect(&vm.control_socket).context("connecting to the device's control socket")?;
    control.reset_stats()?;
    let owners: Vec<u32> = device.domains.iter().map(|allowed| *allowed.last().expect("validated: non-empty")).collect();
    let mut setup = Vec::new();
    for (d, owner) in owners.iter().enumerate() {
        let d = d as u64;
        setup.push(MmioAccess { cpu: 0, offset: regs::domain_reg(d, regs::DOM_OWNER), write: Some(u64::from(*owner)) });
        let ctl = regs::slot_ctl_value(Event::MbmTotalBytes, u64::from(CHECK_RMID));
        setup.push(MmioAccess { cpu: 0, offset: regs::slot_ctl(d, 0), write: Some(ctl) });
    }
    mmio(vm, device, setup, timeout)?;
    // Several MiB and an odd number of units, per domain a different amount.
    let injected: Vec<u64> = (0..domains).map(|d| (d + 1) * (3 << 20) + 10 * device.unit_bytes).collect();
    for (d, bytes) in injected.iter().enumerate() {
        control.inject(d as u32, CHECK_RMID, Event::MbmTotalBytes, *bytes)?;
    }
    control.wait_landed(timeout.as_millis() as u64)?;
    let mut reads = Vec::new();
    for &cpu in &cpus {
        for d in 0..domains {
            reads.push(read_from(cpu, regs::slot_count(d, 0)));
        }
    }
    let values = mmio(vm, device, reads.clone(), timeout)?;
    let state = control.state()?;
    // Hand the device over as reset: no owners, no slots assigned, no stats.
    let mut release = Vec::new();
    for d in 0..domains {
        release.push(MmioAccess { cpu: 0, offset: regs::slot_ctl(d, 0), write: Some(0) });
        release.push(MmioAccess { cpu: 0, offset: regs::domain_reg(d, regs::DOM_OWNER), write: Some(regs::NO_OWNER) });
    }
    mmio(vm, device, release, timeout)?;
    control.reset_stats()?;

    let mask = regs::counter_mask(u64::from(device.counter_width));
    let mut problems = Vec::new();
    for (access, value) in reads.iter().zip(&values) {
        let d = ((access.offset - regs::DOMAIN_BASE) / regs::DOMAIN_STRIDE) as usize;
        let want = if access.cpu == owners[d] { (injected[d] / device.unit_bytes) & mask } else { regs::COUNTER_ERROR };
        if *value != want {
            problems.push(format!("CPU {} read domain {d}: {value:#x}, expected {want:#x}", access.cpu));
        }
    }
    checks.push(Check::from_problems(
        "counter reads",
        problems,
        format!("{} reads: the owners read the exact count, the {} others got the error bit", reads.len(), reads.len() - owners.len()),
    ));

    let mut problems = Vec::new();
    for (d, domain) in state.domains.iter().enumerate() {
        let every_cpu_once: BTreeMap<u32, u64> = cpus.iter().map(|&c| (c, 1)).collect();
        if domain.counter_reads_by_vcpu != every_cpu_once {
            problems.push(format!("domain {d} saw reads from {:?}, expected one from each CPU", domain.counter_reads_by_vcpu));
        }
        let expected_violations: BTreeMap<u32, u64> = cpus.iter().filter(|&&c| c != owners[d]).map(|&c| (c, 1)).collect();
        if domain.violations_by_vcpu != expected_violations || domain.violations != expected_violations.len() as u64 {
            problems.push(format!(
                "domain {d} counted {} violations {:?}, expected {:?}",
                domain.violations, domain.violations_by_vcpu, expected_violations
            ));
        }
    }
    checks.push(Check::from_problems(
        "placement enforcement",
        problems,
        "the device saw each read from the vCPU that made it and flagged every non-owner read".into(),
    ));

    let mut problems = Vec::new();
    for (d, domain) in state.domains.iter().enumerate() {
        let truth = domain.truth.iter().find(|t| t.rmid == CHECK_RMID && t.event == Event::MbmTotalBytes).map_or(0, |t| t.bytes);
        let counted = domain.slots.first().map_or(0, |s| s.counted_bytes);
        if truth != injected[d] || counted != injected[d] {
            problems.push(format!("domain {d}: injected {}, truth {truth}, counted {counted}", injected[d]));
        }
    }
    if state.bad_accesses.total != 0 {
        problems.push(format!("{} bad accesses: {:?}", state.bad_accesses.total, state.bad_accesses));
    }
    checks.push(Check::from_problems(
        "ground truth",
        problems,
        format!("truth and slot counts equal the injected {} bytes; no bad accesses", injected.iter().map(u64::to_string).collect::<Vec<_>>().join(" and ")),
    ));
    Ok(checks)
}

fn read_from(cpu: u32, offset: u64) -> MmioAccess {
    MmioAccess { cpu, offset, write: None }
}

/// The agent's register accesses, one answer per access.
fn mmio(vm: &mut Vm, device: &DeviceConfig, accesses: Vec<MmioAccess>, timeout: Duration) -> Result<Vec<u64>> {
    let count = accesses.len();
    let request = HostRequest::Mmio { base: vm::DEVICE_BASE, size: device.size(), accesses };
    match vm.request(&request, timeout)? {
        AgentMessage::Mmio { values } if values.len() == count => Ok(values),
        other => bail!("the agent answered {count} register accesses with {other:?}"),
    }
}

fn hotplug_check(requested: u32, results: &[HotplugRound]) -> Check {
    let failed: Vec<&HotplugRound> = results.iter().filter(|r| !r.problems.is_empty()).collect();
    let passed_rounds = results.len() - failed.len();
    let n = results.len().max(1) as u64;
    let avg = |f: fn(&HotplugRound) -> u64| Duration::from_micros(results.iter().map(f).sum::<u64>() / n);
    let mut detail = format!(
        "{passed_rounds}/{requested} rounds passed (all CPUs but 0 off, then on; offline {} / online {} per round)",
        human_ms(avg(|r| r.offline_us)),
        human_ms(avg(|r| r.online_us)),
    );
    if let Some(first) = failed.first() {
        let _ = write!(detail, "; round {}: {}", first.round, first.problems.join("; "));
    }
    Check {
        name: "CPU hotplug",
        passed: results.len() == requested as usize && failed.is_empty(),
        detail,
    }
}

fn human_ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

pub fn print_report(report: &Report, image_time: Duration, total: Duration) {
    println!("\nperfbed run: {}", if report.passed() { "PASSED" } else { "FAILED" });
    print!("{}", report.table());
    println!(
        "  time: images {}, boot to agent ready {} (guest uptime {}), checks {}, total {}",
        human(image_time),
        human(report.boot_time),
        human(report.guest_uptime_at_ready),
        human(report.checks_time),
        human(total)
    );
    println!("  serial log: {}", report.serial_log.display());
    print_trace(report.trace.as_ref());
}

/// Names the saved trace and plot.
pub fn print_trace(saved: Option<&SavedTrace>) {
    let Some(saved) = saved else { return };
    println!("  device trace: {}", saved.trace.display());
    if let Some(plot) = &saved.plot {
        println!("  timeline plot: {}", plot.display());
    }
    if let Some(why) = &saved.guest_missing {
        println!("  (the trace has no guest events: {why})");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(n: u32, problems: &[&str]) -> HotplugRound {
        HotplugRound { round: n, offline_us: 1000, online_us: 500, problems: problems.iter().map(|s| s.to_string()).collect() }
    }

    #[test]
    fn hotplug_check_fails_on_a_bad_or_missing_round() {
        assert!(hotplug_check(2, &[round(1, &[]), round(2, &[])]).passed);
        let bad = hotplug_check(2, &[round(1, &[]), round(2, &["online is \"0-2\""])]);
        assert!(!bad.passed);
        assert!(bad.detail.contains("1/2 rounds passed") && bad.detail.contains("round 2"));
        assert!(!hotplug_check(3, &[round(1, &[]), round(2, &[])]).passed);
    }
}
