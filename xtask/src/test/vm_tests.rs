//! The VM tests themselves: each boots a guest (the scenario `cargo xtask
//! test` made for it) and fails with the reason.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::checks::{self, scope};
use crate::host;
use crate::host::vm::Vm;
use crate::host::Accel;
use crate::progress::human;
use crate::run::scenario::{self, Scenario};
use crate::stress;

/// The short stress's length and seed: a few hundred cycles.
const STRESS_CYCLES: u32 = 200;
const STRESS_SEED: u64 = 8;
/// The park rounds after the kernel's selftest, as first reported.
const SELFTEST_ROUNDS: u32 = 200;
/// The short lifecycle stress: operations and seed. Seed 17's first 2,500
/// operations cover every kind of operation and, with patches 0009-0010,
/// match the model (about 2 min of stress on a loaded 2-core TCG host).
pub(crate) const LIFECYCLE_OPS: u32 = 2500;
pub(crate) const LIFECYCLE_SEED: u64 = 17;

pub fn boot_and_hotplug(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let report = scenario::run(scenario, accel)?;
    if !report.passed() {
        let trace = report.trace.as_ref().map_or(String::new(), |t| {
            format!(
                "\ndevice trace: {}{}",
                t.trace.display(),
                t.plot.as_ref().map_or(String::new(), |p| format!(
                    "\ntimeline plot: {}",
                    p.display()
                ))
            )
        });
        return Err(failed(&report, &trace));
    }
    print!("{}", report.table());
    if scenario.plot {
        guest_kernel_in_trace(report.trace.as_ref())?;
    }
    if scenario.vm.host.is_vmm() {
        // perfbed-vmm stops every vCPU out of KVM and joins it before its
        // report: a process that exits with vCPUs inside KVM_RUN fails here.
        let lines = host::vmm::host_report(&scenario.vm.run_dir);
        let powered_off = perfbed_vmm::ExitStatus::PoweredOff.report_line();
        if !lines.iter().any(|l| l.contains(&powered_off)) {
            bail!(
                "perfbed-vmm's report does not end with {powered_off:?}:\n{}",
                lines.join("\n")
            );
        }
        match host::vmm::vcpus_joined(&lines) {
            Some((joined, total)) if joined == total && total == u32::from(scenario.vm.cpus) => {
                println!("  perfbed-vmm joined all {total} vCPU threads before its report");
            }
            Some((joined, total)) => bail!(
                "perfbed-vmm joined {joined} of {total} vCPU threads (the guest had {})",
                scenario.vm.cpus
            ),
            None => bail!(
                "perfbed-vmm's report has no vcpus_joined/vcpus figures:\n{}",
                lines.join("\n")
            ),
        }
    }
    Ok(())
}

/// [`boot_and_hotplug`] with its trace saved and drawn (`run --plot`); the
/// trace must also hold the guest kernel's own records
/// (`trace::guest_kernel`): the hotplug rounds' perf states and the PMUs'
/// placements, on the device's clock.
pub fn traced_boot_and_hotplug(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let traced = Scenario {
        plot: true,
        ..scenario.clone()
    };
    boot_and_hotplug(&traced, accel)
}

/// The saved trace has `guest_kernel` lines of each kind the guest records
/// (cpuhp states entered and left, placements that moved a PMU).
fn guest_kernel_in_trace(saved: Option<&crate::trace::SavedTrace>) -> Result<()> {
    let Some(saved) = saved else {
        bail!("the run saved no trace");
    };
    if let Some(why) = &saved.guest_missing {
        bail!("the trace has no guest events: {why}");
    }
    let text = std::fs::read_to_string(&saved.trace)
        .with_context(|| format!("reading {}", saved.trace.display()))?;
    let trace = crate::trace::Trace::parse(&text)?;
    let mut missing = Vec::new();
    let mut counts = Vec::new();
    for event in ["cpuhp_enter", "cpuhp_exit", "device_set_cpu"] {
        let n = trace
            .lines
            .iter()
            .filter(|l| l.kind == "guest_kernel" && l.field("event") == Some(event))
            .count();
        if n == 0 {
            missing.push(event);
        }
        counts.push(format!("{n} {event}"));
    }
    if !missing.is_empty() {
        bail!(
            "the saved trace {} has no guest_kernel {} line ({})",
            saved.trace.display(),
            missing.join(", "),
            counts.join(", ")
        );
    }
    println!(
        "  the saved trace holds the guest kernel's records: {}",
        counts.join(", ")
    );
    Ok(())
}

/// The device-scope test (`checks::scope`) on a booted guest, then a clean
/// power-off and a kernel log without any report.
pub fn device_scope_pmu(scenario: &Scenario, accel: &Accel) -> Result<()> {
    checks_on_a_guest(scenario, accel, |vm| {
        scope::run(vm, scenario.request_timeout)
    })
}

/// `checks::slow_reader` on a booted guest, then a clean power-off and a
/// kernel log without any report (an RCU stall would be one).
/// In the box, where the serial console was stalled too, perfbed-vmm's
/// report must count the serial bytes its ring dropped and its log say so:
/// the vCPUs dropped what the host could not take instead of waiting.
pub fn slow_agent_reader(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let mut small_ring = scenario.clone();
    small_ring.vm.serial_ring = Some(checks::slow_reader::SERIAL_RING);
    let scenario = &small_ring;
    checks_on_a_guest(scenario, accel, |vm| {
        checks::slow_reader::run(vm, scenario.vm.cpus, scenario.request_timeout)
    })?;
    if let host::Host::VmmBox(_) = scenario.vm.host {
        let lines = host::vmm::host_report(&scenario.vm.run_dir);
        let dropped = host::vmm::stat(&lines, "serial_output_dropped_bytes");
        let box_log =
            std::fs::read_to_string(scenario.vm.run_dir.join("box.log")).unwrap_or_default();
        let warned = box_log.contains("the serial log lost");
        match dropped {
            Some(n) if n > 0 && warned => println!(
                "  perfbed-vmm dropped {n} of {} bytes of serial output while the host did not read, counted and logged",
                host::vmm::stat(&lines, "serial_output_bytes").unwrap_or(0)
            ),
            _ => bail!(
                "the stalled serial console's overflow was not counted and logged (serial_output_dropped_bytes {dropped:?} of serial_output_bytes {:?}, warning in box.log: {warned}): either the vCPUs waited for the host or the guest's flood did not fill perfbed-vmm's ring and the buffers after it\n{}",
                host::vmm::stat(&lines, "serial_output_bytes"),
                lines.join("\n")
            ),
        }
    }
    Ok(())
}

/// A failed report's error: the whole table goes to the test's output, and
/// the error repeats the failed checks alone, where a log cut to its head
/// and tail still shows them.
fn failed(report: &checks::Report, trailer: &str) -> anyhow::Error {
    print!("{}", report.table());
    anyhow::anyhow!(
        "failed checks:\n{}serial log: {}{trailer}",
        report.failures(),
        report.serial_log.display()
    )
}

/// Boots, runs `checks` on the guest, powers it off, and fails on any failed
/// check or kernel log report.
fn checks_on_a_guest(
    scenario: &Scenario,
    accel: &Accel,
    checks: impl FnOnce(&mut Vm) -> Result<Vec<checks::Check>>,
) -> Result<()> {
    let booted = Vm::boot(&scenario.vm, accel)?;
    let mut vm = booted.vm;
    let checks = checks(&mut vm)?;
    let serial_log = vm.serial_log.clone();
    vm.power_off(Duration::from_secs(30))?;
    let report = checks::Report::from_checks(checks, &serial_log);
    if !report.passed() {
        return Err(failed(&report, ""));
    }
    print!("{}", report.table());
    Ok(())
}

/// The scripted gdb session (`gdb::scripted_session`) on a guest served by
/// its host's gdb stub (QEMU's gdbstub, or perfbed-vmm's, natively or in the
/// box), then a clean power-off and a kernel log without reports.
pub fn gdb_session(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let mut config = scenario.vm.clone();
    let port = free_port()?;
    config.gdb = Some(host::config::GdbStub {
        port,
        stopped: false,
        hint: String::new(),
    });
    let booted = Vm::boot(&config, accel)?;
    println!(
        "  the gdb kernel booted to the agent in {} on {}",
        human(booted.boot_time),
        config.host.name()
    );
    let mut vm = booted.vm;
    let mut guest = crate::guest::Guest {
        vm: &mut vm,
        timeout: scenario.request_timeout,
    };
    let session = crate::debug::gdb::scripted_session(
        &mut guest,
        &config.vmlinux,
        &scenario.driver,
        port,
        &config.run_dir,
    )?;
    let serial_log = vm.serial_log.clone();
    vm.power_off(Duration::from_secs(30))?;
    let report = checks::Report::from_checks(vec![], &serial_log);
    if !report.passed() {
        return Err(failed(&report, ""));
    }
    let backtrace: Vec<&str> = session
        .output
        .lines()
        .filter(|l| l.starts_with('#'))
        .take(3)
        .collect();
    println!(
        "  gdb stopped in: {}",
        backtrace.join("\n                  ")
    );
    if let Some(took) = session.to_breakpoint {
        println!(
            "  from gdb's continue to the breakpoint's backtrace: {}",
            human(took)
        );
    }
    Ok(())
}

/// A TCP port on 127.0.0.1 that nothing listens on now.
fn free_port() -> Result<u16> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port for gdb")?;
    Ok(listener.local_addr()?.port())
}

/// `cargo xtask stress` in small: the run's VM with the stress's device.
pub fn hotplug_stress(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let mut vm = scenario.vm.clone();
    vm.device = stress::device(vm.cpus, None)?;
    let config = stress::StressConfig {
        replay: format!(
            "cargo xtask stress --cycles {STRESS_CYCLES} --seed {STRESS_SEED} --cpus {} --fail-injection",
            vm.cpus
        ),
        vm,
        cycles: STRESS_CYCLES,
        seed: STRESS_SEED,
        fail_injection: true,
        timeout: scenario.request_timeout,
    };
    let report = stress::execute(&config, accel)?;
    if !report.passed() {
        bail!("{}", report.text());
    }
    print!("{}", report.text());
    Ok(())
}

/// The lifecycle stress (`cargo xtask stress --lifecycle`) at a fixed seed:
/// every operation's result as the counting model says, no EBUSY, no
/// placement violation, a clean kernel log.
pub fn lifecycle_stress(scenario: &Scenario, accel: &Accel) -> Result<()> {
    lifecycle_run(scenario, accel, LIFECYCLE_OPS, "", false)
}

/// Operations of the lifecycle stress in the `sanitizer_kernel` VM test: KCSAN
/// slows the guest down (about 21 operations a second under TCG).
const SANITIZER_LIFECYCLE_OPS: u32 = 500;

/// The run's checks and then a short lifecycle stress on the sanitizer kernel
/// (KCSAN on top of the debug kernel): each boot reaches the agent, every
/// check and every read is as without the sanitizer, and neither kernel log
/// has a report (`BUG: KCSAN:` and `BUG: KFENCE:` are reports).
pub fn sanitizer_kernel(scenario: &Scenario, accel: &Accel) -> Result<()> {
    boot_and_hotplug(scenario, accel)?;
    lifecycle_run(
        scenario,
        accel,
        SANITIZER_LIFECYCLE_OPS,
        " --sanitize",
        false,
    )
}

/// Operations of the `rcutorture_onoff` VM test.
const RCUTORTURE_OPS: u32 = 3000;

/// The lifecycle stress with rcutorture's CPU on/off behind its back
/// (`stress --lifecycle N --rcutorture`): every read as the model says
/// across the placements the host only sees afterwards, rcutorture's "End
/// of test: SUCCESS" with CPUs taken on and off, a clean log through the
/// power-off with events open.
pub fn rcutorture_onoff(scenario: &Scenario, accel: &Accel) -> Result<()> {
    lifecycle_run(scenario, accel, RCUTORTURE_OPS, " --rcutorture", true)
}

/// `ops` seeded operations; `flags` choose the kernel and rcutorture in
/// the replay command.
fn lifecycle_run(
    scenario: &Scenario,
    accel: &Accel,
    ops: u32,
    flags: &str,
    rcutorture: bool,
) -> Result<()> {
    let mut vm = scenario.vm.clone();
    vm.device = stress::device(vm.cpus, None)?;
    vm.device.slots = stress::lifecycle::SLOTS;
    let config = stress::lifecycle::run::LifecycleConfig {
        ops,
        seed: LIFECYCLE_SEED,
        timeout: scenario.request_timeout,
        replay: format!(
            "cargo xtask stress --lifecycle {ops} --seed {LIFECYCLE_SEED} --cpus {}{flags}",
            vm.cpus
        ),
        stop_at_first: false,
        parked_ioctls: true,
        run_check: None,
        shrink: None,
        rcutorture,
        moving_thread: false,
        watched_rates: false,
    };
    let report = stress::lifecycle::execute(&vm, accel, &config)?;
    let failed: Vec<String> = report
        .checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| format!("{}: {}", c.name, c.detail))
        .collect();
    if !failed.is_empty() {
        bail!("{}\n{}", failed.join("\n"), report.text(&config));
    }
    print!("{}", report.text(&config));
    Ok(())
}

/// The scenario library (`cargo xtask scenario scenarios`): every file of
/// `scenarios/` on one lifecycle guest, each read as the counting model
/// and the file's `want` lines say, no violation, a clean kernel log.
pub fn scenario_library(scenario: &Scenario, accel: &Accel) -> Result<()> {
    use stress::lifecycle::scenario::files_under;
    use stress::lifecycle::scenario_guest::{layout, load};
    use stress::lifecycle::scenario_run::{execute, of_guest};
    let ws = crate::build::workspace()?;
    let mut vm = scenario.vm.clone();
    vm.device = stress::device(vm.cpus, None)?;
    vm.device.slots = stress::lifecycle::SLOTS;
    let root = [ws.join("scenarios")];
    let (files, _) = of_guest(
        files_under(&root)?,
        &root,
        vm.host.arch(),
        scenario.fail_injection,
    )?;
    let texts = load(
        &files,
        &layout(vm.cpus, &vm.device, vm.host.arch()),
        &vm.device,
    )?;
    let (checks, _) = execute(&vm, accel, &texts, scenario.request_timeout, None)?;
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| format!("{}: {}", c.name, c.detail))
        .collect();
    if !failed.is_empty() {
        bail!("{}", failed.join("\n"));
    }
    println!(
        "  {} scenarios as the model and their wants say",
        texts.len()
    );
    Ok(())
}

/// Every driver mutant (`guest-driver/mutants/`) built into its own
/// perfbed.ko and run through the short lifecycle stress of
/// `cargo xtask stress --mutants` (seed 17 or the mutant's own
/// `# Lifecycle seed:`, at most 600 operations, stopping at the first
/// failure): each must be caught, by a mismatch against the
/// model or by the lifecycle's named checks (the interrupt's affinity after
/// every move, park and unpark). Prints the table: caught after how many
/// operations, and the replay command.
pub fn driver_mutants(scenario: &Scenario, accel: &Accel) -> Result<()> {
    use stress::lifecycle::cli::{self as lc, MUTANT_OPS, MUTANT_SEED};
    let ws = crate::build::workspace()?;
    let mut rows = Vec::new();
    for mutant in stress::mutants::all(&ws)? {
        if mutant.kind != stress::mutants::MutantKind::Driver {
            continue;
        }
        let start = Instant::now();
        let seed = mutant.seed()?.unwrap_or(MUTANT_SEED);
        let replay = format!(
            "cargo xtask stress --lifecycle {MUTANT_OPS} --seed {seed} --cpus {}{} --mutant {}",
            scenario.vm.cpus,
            if mutant.moving_thread()? {
                " --moving-thread"
            } else {
                ""
            },
            mutant.name
        );
        let result = mutant_run(scenario, accel, &mutant, seed, &replay, None);
        rows.push(lc::mutant_row(&mutant, replay, start, result));
    }
    let table = lc::table_text(&rows);
    if rows.is_empty() {
        bail!("no driver mutants in guest-driver/mutants/");
    }
    if rows.iter().any(|r| r.caught_at.is_none()) {
        bail!("a driver mutant was not caught:{table}");
    }
    print!("{table}");
    Ok(())
}

/// A driver mutant's short lifecycle run (at most `MUTANT_OPS` operations
/// at `seed`, stopping at the first failure) on its own perfbed.ko,
/// shrunk with `shrink` if it fails.
fn mutant_run(
    scenario: &Scenario,
    accel: &Accel,
    mutant: &stress::mutants::Mutant,
    seed: u64,
    replay: &str,
    shrink: Option<stress::lifecycle::shrink::Shrinking>,
) -> Result<stress::lifecycle::run::LifecycleReport> {
    use stress::lifecycle::cli::{self as lc, MUTANT_OPS};
    let ws = crate::build::workspace()?;
    let images = lc::mutant_images(
        &ws,
        crate::build::image::Variant::Debug,
        crate::build::image::arch::Arch::X86_64,
        Some(mutant),
    )?;
    let mut device = stress::device(scenario.vm.cpus, None)?;
    device.slots = stress::lifecycle::SLOTS;
    let vm = crate::host::config::VmConfig {
        vmlinux: images.vmlinux.clone(),
        initramfs: images.initramfs.clone(),
        device,
        run_dir: crate::host::config::new_run_dir(&ws, &lc::run_name(mutant)),
        ..scenario.vm.clone()
    };
    let config = stress::lifecycle::run::LifecycleConfig {
        ops: MUTANT_OPS,
        seed,
        timeout: scenario.request_timeout,
        replay: replay.to_string(),
        stop_at_first: true,
        parked_ioctls: true,
        // Shrinking needs the model's finding in the random operations, so
        // the check that the mutant names (a scenario that catches it
        // before them) is not run first.
        run_check: if shrink.is_some() {
            None
        } else {
            mutant.run_check()?
        },
        shrink,
        rcutorture: false,
        moving_thread: mutant.moving_thread()?,
        watched_rates: false,
    };
    stress::lifecycle::execute(&vm, accel, &config)
}

/// The driver mutant whose failing run `shrink_mutant` shrinks: the model
/// catches it at a read (seed 17, operation 96).
const SHRINK_MUTANT: &str = "counter-stopped-in-move";

/// Shrinking (docs/stress.md): `SHRINK_MUTANT`'s failing lifecycle run is
/// shrunk in its guest to a scenario in the run folder that still fails
/// the same way (each candidate run twice), of at most 12 operations, far
/// fewer than the run's, with a read among them.
pub fn shrink_mutant(scenario: &Scenario, accel: &Accel) -> Result<()> {
    use stress::lifecycle::cli::MUTANT_SEED;
    let ws = crate::build::workspace()?;
    let mutant = stress::mutants::find(&ws, SHRINK_MUTANT)?;
    let seed = mutant.seed()?.unwrap_or(MUTANT_SEED);
    let command = format!(
        "cargo xtask scenario --cpus {} --mutant {SHRINK_MUTANT}",
        scenario.vm.cpus
    );
    let shrinking = stress::lifecycle::shrink::Shrinking::new(Duration::from_secs(150), command);
    let replay =
        format!("cargo xtask stress --lifecycle 600 --seed {seed} --mutant {SHRINK_MUTANT}");
    let report = mutant_run(scenario, accel, &mutant, seed, &replay, Some(shrinking))?;
    let Some((first, _)) = &report.first else {
        bail!(
            "{SHRINK_MUTANT} was not caught by the model in {} operations at seed {seed}",
            report.steps
        );
    };
    let said = report.shrunk.clone().unwrap_or_default();
    if !said.starts_with("shrunk:") {
        bail!(
            "{SHRINK_MUTANT}'s run at seed {seed}, caught at operation {}, was not shrunk: {said}",
            first.index
        );
    }
    let file = report.journal.with_file_name("shrunk.scn");
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let device = {
        let mut d = stress::device(scenario.vm.cpus, None)?;
        d.slots = stress::lifecycle::SLOTS;
        d
    };
    let layout = stress::lifecycle::scenario_guest::layout(
        scenario.vm.cpus,
        &device,
        scenario.vm.host.arch(),
    );
    let shrunk = stress::lifecycle::scenario::parse(&file, &text, &layout, 1)?;
    let reads = shrunk
        .ops
        .iter()
        .filter(|o| matches!(o.step, stress::lifecycle::journal::Step::Read { .. }))
        .count();
    if shrunk.ops.len() > 12 || shrunk.ops.len() >= first.index || reads == 0 {
        bail!(
            "{} operations ({reads} reads) from the {} before the finding:\n{text}",
            shrunk.ops.len(),
            first.index
        );
    }
    println!("  {said}\n{text}");
    Ok(())
}

/// `cargo xtask hotplug-selftest` on the run's VM.
pub fn hotplug_selftest_replay(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let config = stress::selftest::SelftestConfig {
        vm: scenario.vm.clone(),
        rounds: SELFTEST_ROUNDS,
        timeout: scenario.request_timeout,
    };
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
pub fn bench_quick(_scenario: &Scenario, _accel: &Accel) -> Result<()> {
    let ws = crate::build::workspace()?;
    let rows = crate::bench::measure(&ws, true)?;
    let missing = crate::bench::missing_rows(&rows);
    if !missing.is_empty() {
        bail!("rows missing from the benchmark: {missing:?}");
    }
    let broken: Vec<String> = rows
        .iter()
        .filter(|r| {
            !r.value.is_finite()
                || (r.baseline.is_some() && r.ratio().is_none_or(|x| !x.is_finite()))
        })
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
pub fn guest_panic_is_reported(scenario: &Scenario, accel: &Accel) -> Result<()> {
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
    if !matches!(config.host, host::Host::Qemu) && !error.contains("status 3 (guest-panic)") {
        bail!("the error does not name perfbed-vmm's panic status:\n{error}");
    }
    if !error.contains("serial log saved") || !config.run_dir.join("serial.log").is_file() {
        bail!("the error does not point to a saved serial log:\n{error}");
    }
    // The box boots an L1 Linux under TCG before the guest: more time.
    let limit = Duration::from_secs(if matches!(config.host, host::Host::VmmBox(_)) {
        180
    } else {
        60
    });
    if start.elapsed() > limit {
        bail!("the panic took {} to be noticed", human(start.elapsed()));
    }
    Ok(())
}

/// A guest that resets without the agent's power-off (`reboot -f` from a
/// shell: with `reboot=t`, a triple fault): perfbed-vmm must end with its
/// unexpected-reset status, not the power-off's 0, and the harness say so.
pub fn unexpected_reset_is_reported(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let booted = Vm::boot(&scenario.vm, accel)?;
    let mut vm = booted.vm;
    // On request, while the guest runs: every vCPU, each one read.
    let asked = scenario.vm.run_dir.join("vcpu-state-asked.txt");
    host::vmm::request_vcpu_state(&vm.control_socket, &asked)?;
    let cpus = read_vcpu_capture(&asked, scenario.vm.cpus)?;
    println!(
        "    on request: {}",
        host::cpu_state::describe(&cpus).join("; ")
    );
    let start = Instant::now();
    let reboot = perfbed_agent::HostRequest::Run {
        argv: vec!["/bin/busybox".into(), "reboot".into(), "-f".into()],
    };
    let error = match vm.request(&reboot, Duration::from_secs(60)) {
        Ok(answer) => bail!("the guest answered its own reboot: {answer:?}"),
        Err(e) => format!("{e:#}"),
    };
    let wanted = "status 5 (unexpected-reset)";
    if !error.contains(wanted) {
        bail!("the error does not say {wanted:?}:\n{error}");
    }
    println!(
        "    after {}: {}",
        human(start.elapsed()),
        error.lines().next().unwrap_or("")
    );
    // perfbed-vmm's own capture of the reset, saved and decoded.
    let saved = scenario.vm.run_dir.join(host::vmm::VCPU_STATE_FILE);
    let said = "perfbed-vmm's vCPUs (the guest reset with neither the agent's power-off nor a panic) saved";
    if !error.contains(said) {
        bail!("the error does not say {said:?}:\n{error}");
    }
    let cpus = read_vcpu_capture(&saved, scenario.vm.cpus)?;
    println!(
        "    at the reset: {}",
        host::cpu_state::describe(&cpus).join("; ")
    );
    Ok(())
}

/// How long the hang test waits for the agent's answer that never comes.
const HANG_TIMEOUT: Duration = Duration::from_secs(15);

/// The CPU the hang tests stop.
const SPIN_CPU: usize = 1;
/// The scope test module, and its function that spins with interrupts off.
const SPIN_MODULE: &str = "perfbed_scope_test";
const SPIN_FUNCTION: &str = "perfbed_scope_test::spin_with_interrupts_off+";

/// A hang on purpose: an event of the scope test module's unlisted spin
/// config (`perfbed_scope_core/config=0x2/`, images/kernel/scope-test)
/// opened on CPU 1, whose `add` the perf core runs there with interrupts
/// disabled and which never returns. CPU 1 spins with interrupts off, the
/// agent (waiting in the open) never answers, and the harness's timeout
/// records the vCPUs (QEMU's monitor, or perfbed-vmm's control socket).
/// The capture must be saved, name every vCPU, and show CPU 1 running (not
/// halted) with interrupts disabled at a RIP that the module's symbols, at
/// the address the guest loaded it, name `spin_with_interrupts_off`; the
/// harness's story must name it so too.
pub fn hang_is_captured(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let ko = scenario
        .scope_test
        .clone()
        .context("the hang test needs a test's images (the scope test module)")?;
    let booted = Vm::boot(&scenario.vm, accel)?;
    let mut vm = booted.vm;
    let mut guest = crate::guest::Guest {
        vm: &mut vm,
        timeout: scenario.request_timeout,
    };
    guest.expect_done(perfbed_agent::HostRequest::LoadModule {
        name: SPIN_MODULE.into(),
    })?;
    let modules = guest.read_file("/proc/modules")?;
    let base = modules
        .lines()
        .find(|l| l.split_whitespace().next() == Some(SPIN_MODULE))
        .and_then(|l| l.split_whitespace().find(|t| t.starts_with("0x")))
        .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
        .filter(|&a| a != 0)
        .with_context(|| format!("where {SPIN_MODULE} was loaded, in /proc/modules:\n{modules}"))?;
    let pmu = guest.pmu_type("perfbed_scope_core")?;
    vm.add_module_symbols(&ko, base);
    let start = Instant::now();
    let spin = perfbed_agent::HostRequest::PerfOpen {
        attr: perfbed_agent::PerfAttr {
            type_: pmu,
            config: 0x2,
            ..Default::default()
        },
        pid: -1,
        cpu: SPIN_CPU as i32,
        group: None,
    };
    let error = match vm.request(&spin, HANG_TIMEOUT) {
        Ok(answer) => bail!("the guest answered the open of the spinning event: {answer:?}"),
        Err(e) => format!("{e:#}"),
    };
    let (file, said) = match scenario.vm.host {
        host::Host::Qemu => (
            host::vm::CPU_STATE_FILE,
            "state of the guest's vCPUs (registers, local APIC) saved",
        ),
        _ => (
            host::vmm::VCPU_STATE_FILE,
            "perfbed-vmm's vCPUs (asked when the run failed) saved",
        ),
    };
    if !error.contains("no answer within") || !error.contains(said) {
        bail!("the error does not say the agent went silent and {said:?}:\n{error}");
    }
    let cpus = read_vcpu_capture(&scenario.vm.run_dir.join(file), scenario.vm.cpus)?;
    let decoded = host::cpu_state::describe(&cpus);
    let spinning = cpus
        .iter()
        .position(|c| c.cpu == SPIN_CPU)
        .with_context(|| format!("no vCPU {SPIN_CPU} in the capture"))?;
    let c = &cpus[spinning];
    let rip = c.rip.unwrap_or(0);
    let named = host::symbols::SystemMap::of_module(&ko, base)?.resolve(rip);
    let in_spin = named
        .as_deref()
        .is_some_and(|f| f.starts_with(SPIN_FUNCTION));
    if c.halted || c.interrupts_enabled || !in_spin {
        bail!(
            "CPU {SPIN_CPU} should spin with interrupts off in {SPIN_FUNCTION}..: {} ({} with {SPIN_MODULE} at {base:#x})",
            decoded[spinning],
            named.as_deref().unwrap_or("no function of the module")
        );
    }
    let story = format!(
        "is {} in {SPIN_MODULE}.ko",
        named.as_deref().unwrap_or_default()
    );
    if !error.contains(&story) {
        bail!("the harness's story does not name the spinning function ({story:?}):\n{error}");
    }
    println!(
        "    after {} ({} of it the agent's silence):",
        human(start.elapsed()),
        human(HANG_TIMEOUT)
    );
    for line in decoded {
        println!("      {line}");
    }
    println!("      vCPU {SPIN_CPU}'s RIP {rip:#x} {story}",);
    Ok(())
}

/// The vCPUs of a capture at `path` (either host's): all `cpus` of them, each
/// with its registers and local APIC read.
fn read_vcpu_capture(path: &Path, cpus: u8) -> Result<Vec<host::cpu_state::VcpuState>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let read = host::cpu_state::parse(&text);
    let complete =
        |c: &host::cpu_state::VcpuState| c.rip.is_some() && c.cr3.is_some() && c.ppr.is_some();
    if read.len() != usize::from(cpus) || !read.iter().all(complete) {
        bail!(
            "{} has {} of {cpus} vCPUs complete ({read:?}):\n{text}",
            path.display(),
            read.iter().filter(|c| complete(c)).count()
        );
    }
    Ok(read)
}

/// SIGTERM to perfbed-vmm while it waits for the agent's client (sent by
/// the box's `/init`, told by `perfbed_box.terminate_before_agent`): it
/// must end at once with its terminated status and its report, which std's
/// `accept` (retrying on EINTR) never let it do.
pub fn terminated_while_waiting_for_the_agent(scenario: &Scenario, accel: &Accel) -> Result<()> {
    if !matches!(scenario.vm.host, host::Host::VmmBox(_)) {
        bail!("the SIGTERM of this test is sent by the box's /init; natively perfbed-vmm runs no /init to send it (not written yet)");
    }
    let mut config = scenario.vm.clone();
    config
        .extra_cmdline
        .push(perfbed_box_init::TERMINATE_BEFORE_AGENT.into());
    config.boot_timeout = Duration::from_secs(240);
    let start = Instant::now();
    let error = match Vm::boot(&config, accel) {
        Ok(_) => bail!("the guest booted although perfbed-vmm was sent SIGTERM"),
        Err(e) => format!("{e:#}"),
    };
    let took = start.elapsed();
    let wanted = "status 4 (terminated)";
    if !error.contains(wanted) {
        bail!(
            "the error does not say {wanted:?} (after {}):\n{error}",
            human(took)
        );
    }
    let lines = host::vmm::host_report(&config.run_dir);
    let terminated = perfbed_vmm::ExitStatus::Terminated.report_line();
    if !lines.iter().any(|l| l.contains(&terminated)) || host::vmm::vcpus_joined(&lines).is_none() {
        bail!(
            "perfbed-vmm's report lacks its figures or {terminated:?}:\n{}",
            lines.join("\n")
        );
    }
    println!(
        "    after {}: {}",
        human(took),
        error.lines().next().unwrap_or("")
    );
    Ok(())
}

/// Ask for far more hotplug rounds than fit in the timeout: the guest is busy,
/// not answering, and the harness must give up with a clear error.
pub fn unresponsive_guest_times_out(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let booted = Vm::boot(&scenario.vm, accel)?;
    let mut vm = booted.vm;
    let timeout = Duration::from_secs(3);
    let start = Instant::now();
    let error = match vm.request(
        &perfbed_agent::HostRequest::Hotplug { rounds: 1_000_000 },
        timeout,
    ) {
        Ok(answer) => {
            bail!("the agent answered a million hotplug rounds within {timeout:?}: {answer:?}")
        }
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
pub fn qemu_killed_mid_run(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let booted = Vm::boot(&scenario.vm, accel)?;
    let vm = booted.vm;
    let pid = vm.qemu_pid();
    let control = vm.control_socket.clone();
    let agent = scenario.vm.run_dir.join("agent.sock");
    if !control.exists() || !agent.exists() {
        bail!(
            "the running VM has no control socket or agent socket in {}",
            scenario.vm.run_dir.display()
        );
    }
    // SAFETY: kill(2) on the pid of a child this process started and has not reaped.
    if unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) } != 0 {
        bail!(
            "cannot kill QEMU (pid {pid}): {}",
            std::io::Error::last_os_error()
        );
    }
    let (error, took) = next_request_fails(vm, "a killed QEMU")?;
    let mut problems = Vec::new();
    if !error.contains("QEMU exited (signal: 9") {
        problems.push(format!("the error does not say QEMU was killed:\n{error}"));
    }
    if !error.contains("serial log saved") || !scenario.vm.run_dir.join("serial.log").is_file() {
        problems.push(format!(
            "the error does not point to a kept serial log:\n{error}"
        ));
    }
    if took > Duration::from_secs(10) {
        problems.push(format!("noticing the dead QEMU took {}", human(took)));
    }
    problems.extend(left_behind(pid, &scenario.vm.run_dir));
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    println!(
        "    what the user sees: {}",
        error.lines().next().unwrap_or("")
    );
    Ok(())
}

/// A guest that floods: first its serial console (in the background, from
/// a shell), which the harness must keep draining into a capped log while
/// the agent still answers; then the agent channel itself, with an endless
/// line, which must end the run at once with the reason, not fill memory.
pub fn guest_floods_console_and_channel(scenario: &Scenario, accel: &Accel) -> Result<()> {
    use perfbed_agent::{AgentMessage, HostRequest};
    let booted = Vm::boot(&scenario.vm, accel)?;
    let mut vm = booted.vm;
    let timeout = Duration::from_secs(30);
    let sh = |script: &str| HostRequest::Run {
        argv: vec![
            "/bin/busybox".into(),
            "sh".into(),
            "-c".into(),
            script.into(),
        ],
    };
    let started = vm.request(
        &sh("/bin/busybox yes 'perfbed console flood' > /dev/console 2>&1 < /dev/null &"),
        timeout,
    )?;
    if !matches!(
        started,
        AgentMessage::Ran {
            status: Some(0),
            ..
        }
    ) {
        bail!("starting the console flood: {started:?}");
    }
    std::thread::sleep(Duration::from_secs(3));
    let answer = vm.request(
        &HostRequest::ReadFile {
            path: "/proc/uptime".into(),
        },
        timeout,
    )?;
    if !matches!(answer, AgentMessage::Text { .. }) {
        bail!("during the console flood the agent answered {answer:?}");
    }
    let serial_log = vm.serial_log.clone();
    let flooded = std::fs::read(&serial_log).unwrap_or_default();
    let lines = flooded
        .windows(21)
        .filter(|w| w == b"perfbed console flood")
        .count();
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
        problems.push(format!(
            "the channel flood's error does not say so:\n{error}"
        ));
    }
    if took >= timeout {
        problems.push(format!(
            "the channel flood was noticed only after {}",
            human(took)
        ));
    }
    if size > host::console::SERIAL_LOG_LIMIT + 4096 {
        problems.push(format!(
            "the serial log grew to {size} bytes, over the {} limit",
            host::console::SERIAL_LOG_LIMIT
        ));
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
pub fn module_lifecycle(scenario: &Scenario, accel: &Accel) -> Result<()> {
    checks_on_a_guest(scenario, accel, |vm| {
        let serial_log = vm.serial_log.clone();
        let mut control = perfbed_device::ControlClient::connect(&vm.control_socket)?;
        let mut g = crate::guest::Guest {
            vm,
            timeout: scenario.request_timeout,
        };
        Ok(vec![
            crate::checks::module_lifecycle::bad_device_params(
                &mut g,
                &serial_log,
                scenario.vm.device.size(),
            )?,
            crate::checks::module_lifecycle::load_unload(&mut g, &mut control)?,
        ])
    })
}

/// perf's own test suite (`checks::perf_tool::PERF_TESTS`) in the guest,
/// with perfbed.ko loaded: one verdict per test, then a clean power-off and
/// a clean log.
pub fn perf_test_suite(scenario: &Scenario, accel: &Accel) -> Result<()> {
    checks_on_a_guest(scenario, accel, |vm| {
        let mut g = crate::guest::Guest {
            vm,
            // perf's "all PMU test" runs perf stat on every PMU event, each a
            // few hundred ms under TCG.
            timeout: scenario.request_timeout.max(Duration::from_secs(600)),
        };
        g.expect_done(perfbed_agent::HostRequest::LoadModule {
            name: crate::guest::MODULE.into(),
        })?;
        let event = format!("{}/mbm_total_bytes,rmid=1/", crate::guest::pmu_name(0));
        let started = Instant::now();
        let checks = checks::perf_tool::perf_tests(&mut g, &event)?;
        println!("  perf's tests took {}", human(started.elapsed()));
        Ok(checks)
    })
}

/// The agent dies mid-run. Being PID 1 it cannot just exit: on a fatal
/// error it says why on the console and powers the guest off. A line that
/// is not UTF-8 is such an error today (the agent reads text lines).
pub fn agent_dies_mid_run(scenario: &Scenario, accel: &Accel) -> Result<()> {
    let booted = Vm::boot(&scenario.vm, accel)?;
    let mut vm = booted.vm;
    let pid = vm.qemu_pid();
    let serial_log = vm.serial_log.clone();
    vm.send_raw(b"\xff\xfe not text\n")?;
    let (error, took) = next_request_fails(vm, "the agent after its fatal error")?;
    let log = std::fs::read_to_string(&serial_log).unwrap_or_default();
    let mut problems = Vec::new();
    if !error.contains("QEMU exited") || !error.contains("serial log saved") {
        problems.push(format!(
            "the error does not say the VM ended and where its log is:\n{error}"
        ));
    }
    if !log.contains("perfbed-agent: fatal") {
        problems.push(format!(
            "the serial log {} lacks the agent's fatal error",
            serial_log.display()
        ));
    }
    if took > Duration::from_secs(30) {
        problems.push(format!(
            "the agent's death was noticed after {}",
            human(took)
        ));
    }
    problems.extend(left_behind(pid, &scenario.vm.run_dir));
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    let last_words = log
        .lines()
        .find(|l| l.contains("perfbed-agent: fatal"))
        .unwrap_or("")
        .trim();
    println!(
        "    after {}: {}; the serial log says: {last_words}",
        human(took),
        error.lines().next().unwrap_or("")
    );
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
    let request = perfbed_agent::HostRequest::ReadFile {
        path: "/proc/uptime".into(),
    };
    let error = match vm.request(&request, Duration::from_secs(60)) {
        Ok(answer) => bail!("{who} answered: {answer:?}"),
        Err(e) => format!("{e:#}"),
    };
    Ok((error, start.elapsed()))
}
