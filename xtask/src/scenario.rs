//! The boot-and-hotplug scenario behind `cargo xtask run` and its VM test:
//! boot, check what the agent reports, hotplug every CPU but 0 for N rounds,
//! power off, and check the kernel log stayed clean.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use perfbed_agent::{format_cpu_list, AgentMessage, HostRequest, HotplugRound};

use crate::cmd::human;
use crate::vm::{self, Accel, Vm, VmConfig};

#[derive(Debug, Clone)]
pub struct Scenario {
    pub vm: VmConfig,
    pub expected_release: String,
    pub hotplug_rounds: u32,
    /// How long one request (a whole hotplug run) may take.
    pub request_timeout: Duration,
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
}

impl Report {
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
    let module = hello.modules.iter().find(|m| m.name == "perfbed");
    checks.push(Check {
        name: "module loaded",
        passed: module.is_some_and(|m| m.error.is_none()),
        detail: match module {
            Some(m) => m.error.clone().map_or("perfbed.ko".to_string(), |e| format!("perfbed.ko: {e}")),
            None => "perfbed.ko is not in the initramfs".into(),
        },
    });

    let rounds = scenario.hotplug_rounds;
    match vm.request(&HostRequest::Hotplug { rounds }, scenario.request_timeout)? {
        AgentMessage::Hotplug { rounds: results } => checks.push(hotplug_check(rounds, &results)),
        other => checks.push(Check { name: "CPU hotplug", passed: false, detail: format!("agent answered {other:?}") }),
    }

    let serial_log = vm.serial_log.clone();
    vm.power_off(Duration::from_secs(30))?;
    let log = std::fs::read_to_string(&serial_log).unwrap_or_default();
    let problems = vm::kernel_log_problems(&log);
    checks.push(Check {
        name: "clean kernel log",
        passed: problems.is_empty(),
        detail: if problems.is_empty() {
            "no WARN, BUG, oops, lockdep or RCU report".into()
        } else {
            problems.join(" | ")
        },
    });

    Ok(Report {
        checks,
        boot_time: booted.boot_time,
        guest_uptime_at_ready: Duration::from_millis(hello.uptime_ms),
        checks_time: checks_start.elapsed(),
        serial_log,
    })
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
