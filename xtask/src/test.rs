//! `cargo xtask test`: the workspace's unit tests, then the VM tests, each a
//! real boot that passes or fails on what the guest and the logs show.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::cmd::human;
use crate::scenario::{self, Scenario};
use crate::vm::{self, Accel, Vm};
use crate::image::Variant;
use crate::{deps, fuzz, image, scenario_for, scope_test, stress, RunArgs};

#[derive(Args)]
pub struct TestArgs {
    /// Run only the unit tests (no fuzzing, no VM boots).
    #[arg(long, conflicts_with_all = ["vm_only", "fuzz_only"])]
    unit_only: bool,
    /// Run only the short fuzz runs.
    #[arg(long, conflicts_with = "vm_only")]
    fuzz_only: bool,
    /// Run only the VM tests.
    #[arg(long)]
    vm_only: bool,
    /// Seconds each fuzz target runs.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    fuzz_seconds: u64,
    /// Run only the VM tests whose name contains this.
    #[arg(long)]
    filter: Option<String>,
}

struct VmTest {
    name: &'static str,
    what: &'static str,
    /// The guest kernel it boots.
    variant: Variant,
    /// The VMM it boots on.
    host: vm::HostChoice,
    run: fn(&Scenario, &Accel) -> Result<()>,
}

const VM_TESTS: &[VmTest] = &[
    VmTest {
        name: "boot_and_hotplug",
        what: "4 vCPUs boot, perfbed.ko loads, the device checks and 5 hotplug rounds pass, the kernel log stays clean",
        variant: Variant::Normal,
        host: vm::HostChoice::Qemu,
        run: boot_and_hotplug,
    },
    VmTest {
        name: "debug_kernel_end_to_end",
        what: "the same run on the debug kernel: perfbed.ko under lockdep, PROVE_RCU, DEBUG_ATOMIC_SLEEP and DEBUG_LIST, with no report",
        variant: Variant::Debug,
        host: vm::HostChoice::Qemu,
        run: boot_and_hotplug,
    },
    VmTest {
        name: "guest_panic_is_reported",
        what: "a guest kernel that panics ends the run at once, with the panic named and the log kept",
        variant: Variant::Normal,
        host: vm::HostChoice::Qemu,
        run: guest_panic_is_reported,
    },
    VmTest {
        name: "unresponsive_guest_times_out",
        what: "a guest that stops answering ends in a timeout error that names the request and the log",
        variant: Variant::Normal,
        host: vm::HostChoice::Qemu,
        run: unresponsive_guest_times_out,
    },
    VmTest {
        name: "qemu_killed_mid_run",
        what: "QEMU killed mid-run ends the run with QEMU's exit named and the log kept; no process or socket is left behind",
        variant: Variant::Normal,
        host: vm::HostChoice::Qemu,
        run: qemu_killed_mid_run,
    },
    VmTest {
        name: "agent_dies_mid_run",
        what: "the agent dying mid-run (here: killed by a line that is not UTF-8) ends the run at once with QEMU's exit and the agent's last words named, the log kept, nothing left behind",
        variant: Variant::Normal,
        host: vm::HostChoice::Qemu,
        run: agent_dies_mid_run,
    },
    VmTest {
        name: "guest_floods_console_and_channel",
        what: "a guest flooding its serial console keeps being served (the log is capped); flooding the agent channel without newlines ends the run at once with that named",
        variant: Variant::Normal,
        host: vm::HostChoice::Qemu,
        run: guest_floods_console_and_channel,
    },
    VmTest {
        name: "module_lifecycle",
        what: "perfbed.ko loaded and unloaded 2x100 times (with an event open: unload refused) without leaking; wrong device= parameters fail with EINVAL/ENODEV and a kernel log line, no oops",
        variant: Variant::Normal,
        host: vm::HostChoice::Qemu,
        run: module_lifecycle,
    },
    VmTest {
        name: "bench_quick",
        what: "cargo xtask bench --quick measures every row (criterion, boots on both QEMUs, counter reads, hotplug, memory, a warm run); no timing thresholds",
        variant: Variant::Normal,
        host: vm::HostChoice::Qemu,
        run: bench_quick,
    },
    VmTest {
        name: "device_scope_pmu",
        what: "on the debug kernel, device-scope PMUs are placed, move, park and return with CPU hotplug, parked events come back, opens racing moves land right and never get EBUSY, and no lockdep/RCU/WARN report",
        variant: Variant::Debug,
        host: vm::HostChoice::Qemu,
        run: device_scope_pmu,
    },
    VmTest {
        name: "gdb_session",
        what: "on the gdb kernel, Debian's gdb in batch mode breaks in perfbed.ko's read callback under `perf stat`, names it in the backtrace, reads REG_MAGIC through the driver's mapping, detaches, and perf finishes",
        variant: Variant::Gdb,
        host: vm::HostChoice::Qemu,
        run: gdb_session,
    },
    VmTest {
        name: "hotplug_stress",
        what: "on the debug kernel, a short seeded hotplug storm under live traffic: every count exact, no EBUSY, 0 violations, clean log",
        variant: Variant::Debug,
        host: vm::HostChoice::Qemu,
        run: hotplug_stress,
    },
    VmTest {
        name: "hotplug_selftest_replay",
        what: "on the debug kernel, the kernel's cpu-on-off-test.sh -a then 200 park rounds with owner flaps under a steady rate: perf stat -a equals the device's truth, at 100 %",
        variant: Variant::Debug,
        host: vm::HostChoice::Qemu,
        run: hotplug_selftest_replay,
    },
    VmTest {
        name: "vmm_end_to_end",
        what: "the whole run on perfbed-vmm (on native KVM, else in the box: an L1 Linux with KVM under QEMU TCG), every check judged as under QEMU",
        variant: Variant::Normal,
        host: vm::HostChoice::Vmm,
        run: boot_and_hotplug,
    },
    VmTest {
        name: "vmm_guest_panic_is_reported",
        what: "on perfbed-vmm, a panicking guest ends the VMM with its panic status and the harness names the panic",
        variant: Variant::Normal,
        host: vm::HostChoice::Vmm,
        run: guest_panic_is_reported,
    },
];

/// The short stress's length and seed: a few hundred cycles.
const STRESS_CYCLES: u32 = 200;
const STRESS_SEED: u64 = 8;
/// The park rounds after the kernel's selftest, as first reported.
const SELFTEST_ROUNDS: u32 = 200;

pub fn run(ws: &Path, args: &TestArgs) -> Result<bool> {
    deps::ensure_packages()?;
    let mut passed = true;
    if !args.vm_only && !args.fuzz_only {
        eprintln!("==> unit tests: cargo test --workspace");
        let status = Command::new(deps::cargo())
            .current_dir(ws)
            .args(["test", "--workspace", "--quiet"])
            .status()
            .context("running cargo test")?;
        passed &= status.success();
        if !status.success() {
            eprintln!("unit tests FAILED ({status})");
        }
    }
    if !args.vm_only && !args.unit_only {
        passed &= run_fuzz_tests(ws, args.fuzz_seconds);
    }
    if !args.unit_only && !args.fuzz_only {
        passed &= run_vm_tests(ws, args)?;
    }
    println!("\ncargo xtask test: {}", if passed { "PASSED" } else { "FAILED" });
    Ok(passed)
}

/// Each fuzz target for a short while: a crash, or a target that cannot be
/// built or run, fails the group (and says why); so does a missing cargo-fuzz.
fn run_fuzz_tests(ws: &Path, seconds: u64) -> bool {
    eprintln!("==> fuzz tests: each target for {seconds} s");
    let cargo_fuzz = match fuzz::ensure_cargo_fuzz() {
        Ok(path) => path,
        Err(e) => {
            println!("test fuzz ... FAILED: cargo-fuzz {} is not available, so the fuzz targets cannot run:\n{e:#}", fuzz::CARGO_FUZZ_VERSION);
            return false;
        }
    };
    let mut failures = 0;
    for &(target, what, _) in fuzz::TARGETS {
        match fuzz::run_target(ws, &cargo_fuzz, target, seconds) {
            Ok(outcome) if outcome.crash.is_none() => println!("test fuzz_{target} ... ok: {}", outcome.summary()),
            Ok(outcome) => {
                failures += 1;
                println!("test fuzz_{target} ... FAILED ({what}):\n{}\n{}", outcome.summary(), outcome.crash.map(|c| c.1).unwrap_or_default());
            }
            Err(e) => {
                failures += 1;
                println!("test fuzz_{target} ... FAILED: {e:#}");
            }
        }
    }
    println!("fuzz tests: {} passed, {failures} failed", fuzz::TARGETS.len() - failures);
    failures == 0
}

fn run_vm_tests(ws: &Path, args: &TestArgs) -> Result<bool> {
    let tests: Vec<&VmTest> =
        VM_TESTS.iter().filter(|t| args.filter.as_deref().is_none_or(|f| t.name.contains(f))).collect();
    if tests.is_empty() {
        bail!("no VM test matches --filter {:?}", args.filter);
    }
    let mut images = Vec::new();
    for variant in [Variant::Normal, Variant::Debug, Variant::Gdb] {
        if tests.iter().any(|t| t.variant == variant) {
            images.push((variant, image::ensure(ws, variant)?));
        }
    }
    let accel = vm::choose_accel();
    eprintln!("==> VM tests under {} ({})", if accel.kvm { "KVM" } else { "QEMU TCG" }, accel.reason);
    let mut failures = 0;
    for test in &tests {
        let (_, images) = images.iter().find(|(v, _)| *v == test.variant).expect("built above");
        let run_args = RunArgs { host: test.host, ..RunArgs::for_tests() };
        let scenario = scenario_for(ws, images, &run_args, test.name)?;
        let start = Instant::now();
        let result = (test.run)(&scenario, &accel);
        let took = human(start.elapsed());
        match result {
            Ok(()) => println!("test {} ... ok ({took}): {}", test.name, test.what),
            Err(e) => {
                failures += 1;
                println!("test {} ... FAILED ({took}): {}\n{e:#}\n", test.name, test.what);
            }
        }
    }
    println!("VM tests: {} passed, {failures} failed", tests.len() - failures);
    Ok(failures == 0)
}

fn boot_and_hotplug(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let report = scenario::run(scenario, accel)?;
    if !report.passed() {
        let trace = report.trace.as_ref().map_or(String::new(), |t| {
            format!("\ndevice trace: {}{}", t.trace.display(), t.plot.as_ref().map_or(String::new(), |p| format!("\ntimeline plot: {}", p.display())))
        });
        bail!("failed checks:\n{}serial log: {}{trace}", report.table(), report.serial_log.display());
    }
    print!("{}", report.table());
    Ok(())
}

/// The device-scope test (`scope_test`) on a booted guest, then a clean
/// power-off and a kernel log without any report.
fn device_scope_pmu(scenario: &Scenario, accel: &Accel) -> Result<()> {
    checks_on_a_guest(scenario, accel, |vm| scope_test::run(vm, scenario.request_timeout))
}

/// Boots, runs `checks` on the guest, powers it off, and fails on any failed
/// check or kernel log report.
fn checks_on_a_guest(scenario: &Scenario, accel: &Accel, checks: impl FnOnce(&mut Vm) -> Result<Vec<scenario::Check>>) -> Result<()> {
    let booted = Vm::boot(&scenario.vm, accel)?;
    let mut vm = booted.vm;
    let checks = checks(&mut vm)?;
    let serial_log = vm.serial_log.clone();
    vm.power_off(Duration::from_secs(30))?;
    let report = scenario::Report::from_checks(checks, &serial_log);
    if !report.passed() {
        bail!("failed checks:\n{}serial log: {}", report.table(), serial_log.display());
    }
    print!("{}", report.table());
    Ok(())
}

/// The scripted gdb session (`gdb::scripted_session`) on a guest served by
/// QEMU's gdbstub, then a clean power-off and a kernel log without reports.
fn gdb_session(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let mut config = scenario.vm.clone();
    let port = free_port()?;
    config.gdb = Some(vm::GdbStub { port, stopped: false, hint: String::new() });
    let booted = Vm::boot(&config, accel)?;
    println!("  the gdb kernel booted to the agent in {}", human(booted.boot_time));
    let mut vm = booted.vm;
    let mut guest = crate::guest::Guest { vm: &mut vm, timeout: scenario.request_timeout };
    let output = crate::gdb::scripted_session(&mut guest, &config.vmlinux, &scenario.driver, port, &config.run_dir)?;
    let serial_log = vm.serial_log.clone();
    vm.power_off(Duration::from_secs(30))?;
    let report = scenario::Report::from_checks(vec![], &serial_log);
    if !report.passed() {
        bail!("failed checks:\n{}serial log: {}", report.table(), serial_log.display());
    }
    let backtrace: Vec<&str> = output.lines().filter(|l| l.starts_with('#')).take(3).collect();
    println!("  gdb stopped in: {}", backtrace.join("\n                  "));
    Ok(())
}

/// A TCP port on 127.0.0.1 that nothing listens on now.
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port for gdb")?;
    Ok(listener.local_addr()?.port())
}

/// `cargo xtask stress` in small: the run's VM with the stress's device.
fn hotplug_stress(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let mut vm = scenario.vm.clone();
    vm.device = stress::device(vm.cpus, None)?;
    let config = stress::StressConfig {
        replay: format!("cargo xtask stress --cycles {STRESS_CYCLES} --seed {STRESS_SEED} --cpus {}", vm.cpus),
        vm,
        cycles: STRESS_CYCLES,
        seed: STRESS_SEED,
        timeout: scenario.request_timeout,
    };
    let report = stress::execute(&config, accel)?;
    if !report.passed() {
        bail!("{}", report.text());
    }
    print!("{}", report.text());
    Ok(())
}

/// `cargo xtask hotplug-selftest` on the run's VM.
fn hotplug_selftest_replay(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let config = stress::selftest::SelftestConfig { vm: scenario.vm.clone(), rounds: SELFTEST_ROUNDS, timeout: scenario.request_timeout };
    let report = stress::selftest::execute(&config, accel)?;
    if !report.passed() {
        bail!("{}", report.table());
    }
    print!("{}", report.table());
    Ok(())
}

/// The benchmarks still measure what they claim: every row is there with a
/// finite value, and those with a baseline have a ratio. Figures are noise
/// at this effort; nothing here judges them.
fn bench_quick(_scenario: &Scenario, _accel: &Accel) -> Result<()> {
    let ws = crate::workspace()?;
    let rows = crate::bench::measure(&ws, true)?;
    let missing = crate::bench::missing_rows(&rows);
    if !missing.is_empty() {
        bail!("rows missing from the benchmark: {missing:?}");
    }
    let broken: Vec<String> = rows
        .iter()
        .filter(|r| !r.value.is_finite() || (r.baseline.is_some() && r.ratio().is_none_or(|x| !x.is_finite())))
        .map(|r| format!("{}: {} (ratio {:?})", r.name, r.value, r.ratio()))
        .collect();
    if !broken.is_empty() {
        bail!("rows without a usable figure:\n  {}", broken.join("\n  "));
    }
    print!("{}", crate::bench::table(&rows));
    Ok(())
}

/// An initramfs without the named init makes the kernel panic ("No working
/// init found"); the harness must say so rather than wait out its timeout.
fn guest_panic_is_reported(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let mut config = scenario.vm.clone();
    config.extra_cmdline.push("rdinit=/no-such-init".into());
    config.boot_timeout = Duration::from_secs(120);
    let start = Instant::now();
    let error = match Vm::boot(&config, accel) {
        Ok(_) => bail!("the guest booted although its init does not exist"),
        Err(e) => format!("{e:#}"),
    };
    if !error.contains("the guest kernel panicked") {
        bail!("the error does not name the panic:\n{error}");
    }
    if !error.contains("serial log saved") || !config.run_dir.join("serial.log").is_file() {
        bail!("the error does not point to a saved serial log:\n{error}");
    }
    // The box boots an L1 Linux under TCG before the guest: more time.
    let limit = Duration::from_secs(if matches!(config.host, vm::Host::VmmBox(_)) { 180 } else { 60 });
    if start.elapsed() > limit {
        bail!("the panic took {} to be noticed", human(start.elapsed()));
    }
    Ok(())
}

/// Ask for far more hotplug rounds than fit in the timeout: the guest is busy,
/// not answering, and the harness must give up with a clear error.
fn unresponsive_guest_times_out(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let booted = Vm::boot(&scenario.vm, accel)?;
    let mut vm = booted.vm;
    let timeout = Duration::from_secs(3);
    let start = Instant::now();
    let error = match vm.request(&perfbed_agent::HostRequest::Hotplug { rounds: 1_000_000 }, timeout) {
        Ok(answer) => bail!("the agent answered a million hotplug rounds within {timeout:?}: {answer:?}"),
        Err(e) => format!("{e:#}"),
    };
    if !error.contains("no answer within") || !error.contains("serial log saved") {
        bail!("the timeout error is unclear:\n{error}");
    }
    if start.elapsed() > timeout + Duration::from_secs(10) {
        bail!("the timeout fired after {}", human(start.elapsed()));
    }
    Ok(())
}

/// QEMU dies under the harness (SIGKILL, as the OOM killer or a user would):
/// the next request fails at once, naming QEMU's exit and the saved log, and
/// nothing of the VM is left: no QEMU process, no socket file.
fn qemu_killed_mid_run(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let booted = Vm::boot(&scenario.vm, accel)?;
    let vm = booted.vm;
    let pid = vm.qemu_pid();
    let control = vm.control_socket.clone();
    let agent = scenario.vm.run_dir.join("agent.sock");
    if !control.exists() || !agent.exists() {
        bail!("the running VM has no control socket or agent socket in {}", scenario.vm.run_dir.display());
    }
    // SAFETY: kill(2) on the pid of a child this process started and has not reaped.
    if unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) } != 0 {
        bail!("cannot kill QEMU (pid {pid}): {}", std::io::Error::last_os_error());
    }
    let (error, took) = next_request_fails(vm, "a killed QEMU")?;
    let mut problems = Vec::new();
    if !error.contains("QEMU exited (signal: 9") {
        problems.push(format!("the error does not say QEMU was killed:\n{error}"));
    }
    if !error.contains("serial log saved") || !scenario.vm.run_dir.join("serial.log").is_file() {
        problems.push(format!("the error does not point to a kept serial log:\n{error}"));
    }
    if took > Duration::from_secs(10) {
        problems.push(format!("noticing the dead QEMU took {}", human(took)));
    }
    problems.extend(left_behind(pid, &scenario.vm.run_dir));
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    println!("    what the user sees: {}", error.lines().next().unwrap_or(""));
    Ok(())
}

/// A guest that floods: first its serial console (in the background, from
/// a shell), which the harness must keep draining into a capped log while
/// the agent still answers; then the agent channel itself, with an endless
/// line, which must end the run at once with the reason, not fill memory.
fn guest_floods_console_and_channel(scenario: &Scenario, accel: &Accel) -> Result<()> {
    use perfbed_agent::{AgentMessage, HostRequest};
    let booted = Vm::boot(&scenario.vm, accel)?;
    let mut vm = booted.vm;
    let timeout = Duration::from_secs(30);
    let sh = |script: &str| HostRequest::Run { argv: vec!["/bin/busybox".into(), "sh".into(), "-c".into(), script.into()] };
    let started = vm.request(&sh("/bin/busybox yes 'perfbed console flood' > /dev/console 2>&1 < /dev/null &"), timeout)?;
    if !matches!(started, AgentMessage::Ran { status: Some(0), .. }) {
        bail!("starting the console flood: {started:?}");
    }
    std::thread::sleep(Duration::from_secs(3));
    let answer = vm.request(&HostRequest::ReadFile { path: "/proc/uptime".into() }, timeout)?;
    if !matches!(answer, AgentMessage::Text { .. }) {
        bail!("during the console flood the agent answered {answer:?}");
    }
    let serial_log = vm.serial_log.clone();
    let flooded = std::fs::read(&serial_log).unwrap_or_default();
    let lines = flooded.windows(21).filter(|w| w == b"perfbed console flood").count();
    if lines < 100 {
        bail!("the serial log has {lines} flood lines after 3 s: the console was not drained");
    }
    let start = Instant::now();
    let error = match vm.request(&HostRequest::FloodChannel, timeout) {
        Ok(answer) => bail!("the agent channel flood gave an answer: {answer:?}"),
        Err(e) => format!("{e:#}"),
    };
    let took = start.elapsed();
    drop(vm);
    let size = std::fs::metadata(&serial_log).map(|m| m.len()).unwrap_or(0);
    let mut problems = Vec::new();
    if !error.contains("longer than") || !error.contains("flooding the channel") {
        problems.push(format!("the channel flood's error does not say so:\n{error}"));
    }
    if took >= timeout {
        problems.push(format!("the channel flood was noticed only after {}", human(took)));
    }
    if size > vm::SERIAL_LOG_LIMIT + 4096 {
        problems.push(format!("the serial log grew to {size} bytes, over the {} limit", vm::SERIAL_LOG_LIMIT));
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    println!(
        "    console flood: {lines} lines in 3 s, agent still answering; channel flood ended the run in {}: {}",
        human(took),
        error.lines().next().unwrap_or("")
    );
    Ok(())
}

/// `module_lifecycle`'s checks, then a clean power-off and a clean log.
fn module_lifecycle(scenario: &Scenario, accel: &Accel) -> Result<()> {
    checks_on_a_guest(scenario, accel, |vm| {
        let serial_log = vm.serial_log.clone();
        let mut control = perfbed_device::ControlClient::connect(&vm.control_socket)?;
        let mut g = crate::guest::Guest { vm, timeout: scenario.request_timeout };
        Ok(vec![
            crate::module_lifecycle::bad_device_params(&mut g, &serial_log, scenario.vm.device.size())?,
            crate::module_lifecycle::load_unload(&mut g, &mut control)?,
        ])
    })
}

/// The agent dies mid-run. Being PID 1 it cannot just exit: on a fatal
/// error it says why on the console and powers the guest off. A line that
/// is not UTF-8 is such an error today (the agent reads text lines).
fn agent_dies_mid_run(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let booted = Vm::boot(&scenario.vm, accel)?;
    let mut vm = booted.vm;
    let pid = vm.qemu_pid();
    let serial_log = vm.serial_log.clone();
    vm.send_raw(b"\xff\xfe not text\n")?;
    let (error, took) = next_request_fails(vm, "the agent after its fatal error")?;
    let log = std::fs::read_to_string(&serial_log).unwrap_or_default();
    let mut problems = Vec::new();
    if !error.contains("QEMU exited") || !error.contains("serial log saved") {
        problems.push(format!("the error does not say the VM ended and where its log is:\n{error}"));
    }
    if !log.contains("perfbed-agent: fatal") {
        problems.push(format!("the serial log {} lacks the agent's fatal error", serial_log.display()));
    }
    if took > Duration::from_secs(30) {
        problems.push(format!("the agent's death was noticed after {}", human(took)));
    }
    problems.extend(left_behind(pid, &scenario.vm.run_dir));
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    let last_words = log.lines().find(|l| l.contains("perfbed-agent: fatal")).unwrap_or("").trim();
    println!("    after {}: {}; the serial log says: {last_words}", human(took), error.lines().next().unwrap_or(""));
    Ok(())
}

/// What a VM that ended left behind: its QEMU process, its sockets.
fn left_behind(qemu_pid: u32, run_dir: &Path) -> Vec<String> {
    let mut left = Vec::new();
    if Path::new(&format!("/proc/{qemu_pid}")).exists() {
        left.push(format!("QEMU (pid {qemu_pid}) is still there"));
    }
    for socket in ["agent.sock", "control.sock"] {
        if run_dir.join(socket).exists() {
            left.push(format!("{} is left behind", run_dir.join(socket).display()));
        }
    }
    left
}

/// Makes one more request of a VM that should be gone, and ends the VM:
/// the error the harness gave and how long it took to give it.
fn next_request_fails(mut vm: Vm, who: &str) -> Result<(String, Duration)> {
    let start = Instant::now();
    let request = perfbed_agent::HostRequest::ReadFile { path: "/proc/uptime".into() };
    let error = match vm.request(&request, Duration::from_secs(60)) {
        Ok(answer) => bail!("{who} answered: {answer:?}"),
        Err(e) => format!("{e:#}"),
    };
    Ok((error, start.elapsed()))
}
