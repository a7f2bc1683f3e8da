//! The boot-and-hotplug scenario behind `cargo xtask run` and its VM test:
//! boot, check what the agent reports, hotplug every CPU but 0 for N rounds,
//! power off, and check the kernel log stayed clean.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use perfbed_agent::{format_cpu_list, AgentMessage, HostRequest};
use perfbed_device::ControlClient;

use crate::build::image::arch::Arch;
use crate::checks::log::CheckLog;
use crate::checks::{self, clean_log_check, Check, Report, Select};
use crate::debug::gdb;
use crate::guest::{pmu_name, Guest, MODULE};
use crate::host::config::VmConfig;
use crate::host::vm::Vm;
use crate::host::Accel;
use crate::progress::human;
use crate::trace::{self, save_trace_and_plot, SavedTrace};

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
    /// The device-scope test module as built, in a test's images (its
    /// symbols name the CPU the hang tests hang on purpose).
    pub scope_test: Option<PathBuf>,
    /// Run the checks of known, open bugs too (`--known-bugs`).
    pub known_bugs: bool,
    /// The kernel can fail a hotplug operation at a chosen state
    /// (`CONFIG_CPU_HOTPLUG_STATE_CONTROL`: the debug kernel).
    pub fail_injection: bool,
    /// Which checks run (`--check`); the boot and the driver's load
    /// happen whatever it says.
    pub select: Select,
}

/// The device's own checks, as [`checks::device::checks`] names them.
const DEVICE_CHECKS: [&str; 4] = [
    "device self-description",
    "counter reads",
    "placement enforcement",
    "ground truth",
];

/// The checks of the hotplug rounds at the end.
const HOTPLUG_CHECKS: [&str; 3] = [
    "CPU hotplug",
    "topology after CPU hotplug",
    "driver's cross-check with a domain offline",
];

/// The printed names of every check of a run, in order. `kernel version`,
/// `CPUs online`, `module loaded` and `clean kernel log` are reported
/// whatever `--check` selects. `fail_injection`: the debug kernel's run;
/// `arch`: the guest's.
pub fn check_names(
    known_bugs: bool,
    fail_injection: bool,
    arch: Arch,
) -> Result<Vec<&'static str>> {
    let mut names = vec!["kernel version", "CPUs online"];
    names.extend(DEVICE_CHECKS);
    names.extend(["perf tool"]);
    names.extend(PERF_TRACING_CHECKS);
    names.extend([
        "topology matches the domains",
        "module loaded",
        "driver's cacheinfo cross-check",
        "perf record refused",
    ]);
    names.extend(checks::pmu::names(known_bugs, fail_injection, arch)?);
    names.extend(HOTPLUG_CHECKS);
    names.push("clean kernel log");
    Ok(names)
}

/// perf on the guest kernel's tracing ([`perf_tool_tracing`]).
const PERF_TRACING_CHECKS: [&str; 2] = ["perf stat cpuhp tracepoints", "perf trace"];

/// Boots and runs the scenario. An `Err` means the run could not complete
/// (the guest hung, panicked or never came up); failed checks are in the
/// report.
pub fn run(scenario: &Scenario, accel: &Accel) -> Result<Report> {
    let booted = Vm::boot(&scenario.vm, accel)?;
    let (mut vm, hello) = (booted.vm, booted.hello);
    // The guest kernel's hotplug states and placements, for the trace a
    // failed check or `--plot` keeps; the run does not depend on them.
    match trace::guest_kernel::start(&mut vm, scenario.request_timeout) {
        Ok(what) => println!("guest kernel tracing: {what}"),
        Err(e) => eprintln!("warning: the guest kernel's tracing is off: {e:#}"),
    }
    let checks_start = Instant::now();
    // Each check's time is kept for the trace's plot.
    let mut checks = CheckLog::new();

    checks.push(Check {
        name: "kernel version",
        passed: hello.kernel_release == scenario.expected_release,
        detail: format!(
            "{} (built {})",
            hello.kernel_release, scenario.expected_release
        ),
    });
    let all_cpus: Vec<u32> = (0..u32::from(scenario.vm.cpus)).collect();
    let want_online = format_cpu_list(&all_cpus);
    checks.push(Check {
        name: "CPUs online",
        passed: hello.cpus_online == want_online,
        detail: format!("{} (expected {want_online})", hello.cpus_online),
    });
    let select = &scenario.select;
    // The device on its own first, driven from the guest without a driver.
    if DEVICE_CHECKS.iter().any(|name| select.wants(name)) {
        checks.extend(checks::device::checks(
            &mut vm,
            scenario.vm.cpus,
            &scenario.vm.device,
            scenario.request_timeout,
        )?);
    }
    if select.wants("perf tool") {
        checks.push(checks::perf_tool::check(
            &mut vm,
            scenario.request_timeout,
            &scenario.expected_release,
        )?);
    }
    checks.extend(perf_tool_tracing(&mut vm, scenario)?);
    // Every host derives the guest's L3s and dies (arm64: packages) from
    // the domains.
    if select.wants("topology matches the domains") {
        checks.push(topology_check(&mut vm, scenario, false)?);
    }

    // Then perfbed.ko on it: load, and every PMU check.
    let loaded = vm.request(
        &HostRequest::LoadModule {
            name: MODULE.into(),
        },
        scenario.request_timeout,
    )?;
    let module_ok = loaded == AgentMessage::Done;
    checks.push(Check {
        name: "module loaded",
        passed: module_ok,
        detail: if module_ok {
            match scenario.vm.host {
                crate::host::Host::QemuVirt => {
                    "perfbed.ko (finds the device in the device tree)".into()
                }
                _ => "perfbed.ko (finds the device from perfbed.device=)".into(),
            }
        } else {
            format!("perfbed.ko: {loaded:?}")
        },
    });
    if module_ok && select.wants("driver's cacheinfo cross-check") {
        checks.push(checks::topology::driver_cross_check(
            &vm.serial_log,
            scenario.vm.cpus,
            &scenario.vm.device.domains,
        ));
    }
    if let (true, Some(stub)) = (module_ok, &scenario.vm.gdb) {
        let mut guest = Guest {
            vm: &mut vm,
            timeout: scenario.request_timeout,
        };
        gdb::announce_module(
            &mut guest,
            MODULE,
            &scenario.driver,
            &scenario.vm.vmlinux,
            stub.port,
            &scenario.vm.run_dir,
        )?;
    }
    if module_ok {
        let control = ControlClient::connect(&vm.control_socket)
            .context("connecting to the device's control socket")?;
        let mut guest = Guest {
            vm: &mut vm,
            timeout: scenario.request_timeout,
        };
        if select.wants("perf record refused") {
            let last_domain = scenario.vm.device.domains.len() - 1;
            checks.push(checks::perf_tool::record_refused(
                &mut guest,
                &format!("{}/mbm_total_bytes,rmid=2/", pmu_name(last_domain)),
            )?);
        }
        checks::pmu::run(
            &mut guest,
            control,
            &scenario.vm.device,
            scenario.known_bugs,
            scenario.fail_injection,
            select,
            &mut checks,
        )?;
    }

    let rounds = scenario.hotplug_rounds;
    if HOTPLUG_CHECKS.iter().any(|name| select.wants(name)) {
        match vm.request(&HostRequest::Hotplug { rounds }, scenario.request_timeout)? {
            AgentMessage::Hotplug { rounds: results } => {
                let kept = match scenario.vm.host {
                    // arm64: every CPU can go, CPU 0 too; the last one stays.
                    crate::host::Host::QemuVirt => {
                        format!("{} (CPU 0 goes too)", scenario.vm.cpus - 1)
                    }
                    _ => "0".to_string(),
                };
                if select.wants(HOTPLUG_CHECKS[0]) {
                    checks.push(checks::hotplug::check(rounds, &results, &kept));
                }
                if select.wants(HOTPLUG_CHECKS[1]) {
                    checks.push(topology_check(&mut vm, scenario, true)?);
                }
                if module_ok && select.wants(HOTPLUG_CHECKS[2]) {
                    let mut guest = Guest {
                        vm: &mut vm,
                        timeout: scenario.request_timeout,
                    };
                    checks.push(checks::topology::driver_cross_check_offline(
                        &mut guest,
                        scenario.vm.cpus,
                        &scenario.vm.device.domains,
                    )?);
                }
            }
            other => checks.push(Check {
                name: "CPU hotplug",
                passed: false,
                detail: format!("agent answered {other:?}"),
            }),
        }
    }

    let serial_log = vm.serial_log.clone();
    // While the VM still runs: the trace lives in the device.
    let trace = if scenario.plot || !checks.iter().all(|c| c.passed) {
        match save_trace_and_plot(&scenario.vm.run_dir, &mut vm, true, checks.spans()) {
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
        checks: checks.into_checks(),
        boot_time: booted.boot_time,
        guest_uptime_at_ready: Duration::from_millis(hello.uptime_ms),
        checks_time: checks_start.elapsed(),
        serial_log,
        trace,
    })
}

/// perf on the guest kernel's tracing: the hotplug tracepoints counted
/// across a CPU's offline and online (the last CPU: CPU 0 cannot go), and
/// `perf trace`.
fn perf_tool_tracing(vm: &mut Vm, scenario: &Scenario) -> Result<Vec<Check>> {
    let mut guest = Guest {
        vm,
        timeout: scenario.request_timeout,
    };
    let [cpuhp, trace] = PERF_TRACING_CHECKS;
    let mut checks = Vec::new();
    if scenario.vm.cpus > 1 && scenario.select.wants(cpuhp) {
        let cpu = u32::from(scenario.vm.cpus) - 1;
        checks.push(checks::perf_tool::cpuhp_tracepoints(&mut guest, cpu, 2)?);
    }
    if scenario.select.wants(trace) {
        checks.push(checks::perf_tool::trace(&mut guest)?);
    }
    Ok(checks)
}

/// The guest's L3s and dies against the domains, at boot or after the
/// hotplug rounds.
fn topology_check(vm: &mut Vm, scenario: &Scenario, after_hotplug: bool) -> Result<Check> {
    let mut guest = Guest {
        vm,
        timeout: scenario.request_timeout,
    };
    let (cpus, domains) = (scenario.vm.cpus, &scenario.vm.device.domains);
    if after_hotplug {
        checks::topology::check_after_hotplug(&mut guest, cpus, domains)
    } else {
        checks::topology::check(&mut guest, cpus, domains)
    }
}

pub fn print_report(report: &Report, image_time: Duration, total: Duration) {
    println!(
        "\nperfbed run: {}",
        if report.passed() { "PASSED" } else { "FAILED" }
    );
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
