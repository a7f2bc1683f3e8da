//! `cargo xtask test`: the workspace's unit tests, then the VM tests, each a
//! real boot that passes or fails on what the guest and the logs show.

mod vm_tests;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::build::image::arch::Arch;
use crate::build::image::Variant;
use crate::build::{deps, image};
use crate::fuzz;
use crate::host;
use crate::host::Accel;
use crate::progress::human;
use crate::run::scenario::Scenario;
use crate::run::{scenario_for, use_box_qemu_for_gdb, RunArgs};
use crate::series;
use vm_tests::{
    agent_dies_mid_run, bench_quick, boot_and_hotplug, device_scope_pmu, driver_mutants,
    gdb_session, guest_floods_console_and_channel, guest_panic_is_reported, hang_is_captured,
    hotplug_selftest_replay, hotplug_stress, lifecycle_stress, module_lifecycle, perf_test_suite,
    qemu_killed_mid_run, rcutorture_onoff, sanitizer_kernel, scenario_library, shrink_mutant,
    slow_agent_reader, terminated_while_waiting_for_the_agent, traced_boot_and_hotplug,
    unexpected_reset_is_reported, unresponsive_guest_times_out,
};
/// The lifecycle VM test's length and seed (the generator's tests count
/// what that run meets).
#[cfg(test)]
pub(crate) use vm_tests::{LIFECYCLE_OPS, LIFECYCLE_SEED};

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
    /// Run only the VM tests whose name contains this (on-demand ones
    /// included).
    #[arg(long)]
    filter: Option<String>,
    /// Also run the on-demand VM tests: the sanitizer, gdb and arm64
    /// kernels' (each its own kernel build), which CI leaves out to stay
    /// within its hour on a fresh machine.
    #[arg(long)]
    heavy: bool,
}

struct VmTest {
    name: &'static str,
    what: &'static str,
    /// The guest kernel it boots.
    variant: Variant,
    /// The VMM it boots on.
    host: host::HostChoice,
    /// The guest's architecture: an arm64 test's images are built when it
    /// comes, after every x86 test before it has had its verdict.
    arch: Arch,
    /// Run by `cargo xtask test` (and CI), or only on demand.
    when: When,
    run: fn(&Scenario, &Accel) -> Result<()>,
}

/// When a VM test runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum When {
    /// In every `cargo xtask test`, CI's included.
    Always,
    /// With `--heavy`, or named by `--filter`: a kernel variant of its own
    /// to build (about 4-5 min on 2 cores each, cold) and a long run, more
    /// than CI's hour on a fresh machine holds beside the rest. Its figures
    /// go in the notes of the change that needs it.
    OnDemand,
}

/// The VM tests that run their box scenario again when the box itself
/// hung: the harness's snapshots of L1's vCPU showed its own expired local
/// APIC timer pending and not taken (`host::cpu_state`), L1's console said
/// its timer did not fire, or the box's QEMU monitor answered nothing for
/// 30 s (its main loop blocked): faults of the box (QEMU 7.2 under TCG
/// emulating nested SVM, L1), not of perfbed (docs/box-verification.md). A
/// workaround, said loudly and counted; any other failure, and a third hang
/// in a row, fail the test.
const RERUN_ON_BOX_HANG: &[&str] = &[
    "vmm_end_to_end",
    "vmm_guest_panic_is_reported",
    "vmm_unexpected_reset",
    "vmm_sigterm_before_agent",
    "vmm_slow_agent_reader",
];

const VM_TESTS: &[VmTest] = &[
    VmTest {
        name: "boot_and_hotplug",
        what: "4 vCPUs boot, perfbed.ko loads, the device checks and 5 hotplug rounds pass, the kernel log stays clean",
        variant: Variant::Normal,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: boot_and_hotplug,
    },
    VmTest {
        name: "debug_kernel_end_to_end",
        what: "the same run on the debug kernel (lockdep, PROVE_RCU, DEBUG_ATOMIC_SLEEP, DEBUG_LIST, KFENCE, debugobjects; with it the run's debug-only checks such as hotplug fail injection), with no report; its saved trace holds the guest kernel's cpuhp states and PMU placements",
        variant: Variant::Debug,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: traced_boot_and_hotplug,
    },
    VmTest {
        name: "sanitizer_kernel",
        what: "the run's checks (hotplug fail injection included) and a short lifecycle stress on the sanitizer kernel (the debug kernel with KCSAN), with no KCSAN, KFENCE or other report in the kernel log",
        variant: Variant::Sanitize,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::OnDemand,
        run: sanitizer_kernel,
    },
    VmTest {
        name: "unresponsive_guest_times_out",
        what: "a guest that stops answering ends in a timeout error that names the request and the log",
        variant: Variant::Normal,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: unresponsive_guest_times_out,
    },
    VmTest {
        name: "qemu_killed_mid_run",
        what: "QEMU killed mid-run ends the run with QEMU's exit named and the log kept; no process or socket is left behind",
        variant: Variant::Normal,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: qemu_killed_mid_run,
    },
    VmTest {
        name: "agent_dies_mid_run",
        what: "the agent dying mid-run (here: killed by a line that is not UTF-8) ends the run at once with QEMU's exit and the agent's last words named, the log kept, nothing left behind",
        variant: Variant::Normal,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: agent_dies_mid_run,
    },
    VmTest {
        name: "guest_floods_console_and_channel",
        what: "a guest flooding its serial console keeps being served (the log is capped); flooding the agent channel without newlines ends the run at once with that named",
        variant: Variant::Normal,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: guest_floods_console_and_channel,
    },
    VmTest {
        name: "module_lifecycle",
        what: "perfbed.ko loaded and unloaded 2x100 times (with an event open: unload refused) without leaking; wrong device= parameters fail with EINVAL/ENODEV and a kernel log line, no oops",
        variant: Variant::Normal,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: module_lifecycle,
    },
    VmTest {
        name: "perf_test_suite",
        what: "perf's own tests that apply to a device-scope PMU (event parsing from sysfs, sysfs PMU, perf list, perf stat and its output linters on a perfbed event, every PMU event), with the perf built from the guest's tree: each gives what checks::perf_tool::PERF_TESTS says, skips with their reasons",
        variant: Variant::Normal,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: perf_test_suite,
    },
    VmTest {
        name: "bench_quick",
        what: "cargo xtask bench --quick measures every row (criterion, boots on both QEMUs, counter reads, hotplug, memory, a warm run); no timing thresholds",
        variant: Variant::Normal,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: bench_quick,
    },
    VmTest {
        name: "device_scope_pmu",
        what: "on the debug kernel, device-scope PMUs are placed, move, park and return with CPU hotplug, parked events come back, opens racing moves land right and never get EBUSY, and no lockdep/RCU/WARN report",
        variant: Variant::Debug,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: device_scope_pmu,
    },
    VmTest {
        name: "hang_capture",
        what: "a guest hung on purpose (the scope test module's spin event opened on CPU 1: its add, run with interrupts off, never returns) goes silent; the harness's timeout saves its vCPUs from QEMU's monitor and reads CPU 1 as running with interrupts disabled in spin_with_interrupts_off, named from the module's symbols",
        variant: Variant::Normal,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: hang_is_captured,
    },
    VmTest {
        name: "vmm_hang_capture",
        what: "the same hang on perfbed-vmm (natively, or in the box): its vCPUs' state, asked of its control socket, saved as vcpu-state.txt and decoded by the same reader, CPU 1 running with interrupts disabled in spin_with_interrupts_off",
        variant: Variant::Normal,
        host: host::HostChoice::Vmm,
        arch: Arch::X86_64,
        when: When::Always,
        run: hang_is_captured,
    },
    VmTest {
        name: "gdb_session",
        what: "on the gdb kernel, Debian's gdb in batch mode breaks in perfbed.ko's read callback under `perf stat`, names it in the backtrace, reads REG_MAGIC through the driver's mapping, detaches, and perf finishes",
        variant: Variant::Gdb,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::OnDemand,
        run: gdb_session,
    },
    VmTest {
        name: "hotplug_stress",
        what: "on the debug kernel, a short seeded hotplug storm under live traffic, hotplug fail injection among it: every count exact, every rollback's placement as the rule says, no EBUSY, 0 violations, clean log",
        variant: Variant::Debug,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: hotplug_stress,
    },
    VmTest {
        name: "lifecycle_stress",
        what: "on the debug kernel, the lifecycle stress at seed 17 (2,500 perf operations among moves, parks and bursts): every read as the counting model says, 0 EBUSY, 0 violations, clean log",
        variant: Variant::Debug,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: lifecycle_stress,
    },
    VmTest {
        name: "rcutorture_onoff",
        what: "on the debug kernel, the lifecycle stress (3,000 operations, readings of the CPUs among them, seed 17, about 10 s) with rcutorture's CPU on/off taking CPUs offline and back behind its back: every read as the counting model says across the placements seen afterwards, rcutorture's End of test: SUCCESS, clean log through a power-off with events open",
        variant: Variant::Debug,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: rcutorture_onoff,
    },
    VmTest {
        name: "scenario_library",
        what: "on the debug kernel, every scenario of scenarios/ (cargo xtask scenario scenarios): each read as the counting model and the file's want lines say, 0 violations, clean log",
        variant: Variant::Debug,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: scenario_library,
    },
    VmTest {
        name: "driver_mutants",
        what: "on the debug kernel, each planted driver bug (guest-driver/mutants/) in its own perfbed.ko, run through the lifecycle stress at seed 17 or its own `# Lifecycle seed:` (at most 600 operations, stopping at the first failure): every one caught, by a mismatch against the model or by a named check",
        variant: Variant::Debug,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: driver_mutants,
    },
    VmTest {
        name: "shrink_mutant",
        what: "on the debug kernel, a planted driver bug's failing lifecycle run (counter-stopped-in-move, seed 17) shrunk in its guest to a scenario of at most 12 operations that still fails the same way",
        variant: Variant::Debug,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: shrink_mutant,
    },
    VmTest {
        name: "hotplug_selftest_replay",
        what: "on the debug kernel, the kernel's cpu-on-off-test.sh -a then 200 park rounds with owner flaps under a steady rate: perf stat -a equals the device's truth, at 100 %",
        variant: Variant::Debug,
        host: host::HostChoice::Qemu,
        arch: Arch::X86_64,
        when: When::Always,
        run: hotplug_selftest_replay,
    },
    VmTest {
        name: "vmm_end_to_end",
        what: "the whole run on perfbed-vmm (on native KVM, else in the box: an L1 Linux with KVM under QEMU TCG), every check judged as under QEMU",
        variant: Variant::Normal,
        host: host::HostChoice::Vmm,
        arch: Arch::X86_64,
        when: When::Always,
        run: boot_and_hotplug,
    },
    VmTest {
        name: "vmm_guest_panic_is_reported",
        what: "on perfbed-vmm, a panicking guest ends the VMM with its panic status and the harness names the panic",
        variant: Variant::Normal,
        host: host::HostChoice::Vmm,
        arch: Arch::X86_64,
        when: When::Always,
        run: guest_panic_is_reported,
    },
    VmTest {
        name: "vmm_unexpected_reset",
        what: "on perfbed-vmm, every vCPU's state on request (the control socket's cpu_state), then a guest that reboots without the agent's power-off (`reboot -f`, a triple fault with reboot=t) ends the VMM with its unexpected-reset status (5), named by the harness, and the vCPUs' state it captured saved in the run folder and decoded",
        variant: Variant::Normal,
        host: host::HostChoice::Vmm,
        arch: Arch::X86_64,
        when: When::Always,
        run: unexpected_reset_is_reported,
    },
    VmTest {
        name: "vmm_sigterm_before_agent",
        what: "in the box, SIGTERM to perfbed-vmm while it waits for the agent's client ends it with its terminated status (4) and its report",
        variant: Variant::Normal,
        host: host::HostChoice::Vmm,
        arch: Arch::X86_64,
        when: When::Always,
        run: terminated_while_waiting_for_the_agent,
    },
    VmTest {
        name: "vmm_gdb_session",
        what: "gdb_session on perfbed-vmm's gdb stub (on native KVM, else in the box, its port relayed through L1): the breakpoint in perfbed.ko's read callback, the backtrace, REG_MAGIC read through the driver's mapping, the detach",
        variant: Variant::Gdb,
        host: host::HostChoice::Vmm,
        arch: Arch::X86_64,
        when: When::OnDemand,
        run: gdb_session,
    },
    VmTest {
        name: "vmm_slow_agent_reader",
        what: "on perfbed-vmm with a 4 KiB serial ring, while a shell floods ttyS0 in paced bursts and another hotplugs CPUs, the host stops reading (in the box) the serial console for 90 s, the agent answering throughout (its event loop does not wait for the serial log), then the agent channel too for 30 s while the agent answers 10 MiB: the hotplug rate holds (no vCPU waits on the host), every answer arrives, the serial overflow is counted, the kernel log stays clean",
        variant: Variant::Normal,
        host: host::HostChoice::Vmm,
        arch: Arch::X86_64,
        when: When::Always,
        run: slow_agent_reader,
    },
    VmTest {
        name: "arm64_end_to_end",
        what: "cargo xtask run --arch arm64: the arm64 guest (its normal kernel, cross-built) on perfbed's aarch64 QEMU (`virt`, GICv3, TCG), the device found in the device tree, every check of the run, the kernel log clean",
        variant: Variant::Normal,
        host: host::HostChoice::Qemu,
        arch: Arch::Arm64,
        when: When::OnDemand,
        run: boot_and_hotplug,
    },
];

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
        passed &= lint(ws);
        passed &= series_check(ws);
    }
    if !args.vm_only && !args.unit_only {
        passed &= run_fuzz_tests(ws, args.fuzz_seconds);
    }
    if !args.unit_only && !args.fuzz_only {
        passed &= run_vm_tests(ws, args)?;
    }
    println!(
        "\ncargo xtask test: {}",
        if passed { "PASSED" } else { "FAILED" }
    );
    Ok(passed)
}

/// The lints of the unit stage: clippy with every warning an error, and
/// rustfmt's check, over the workspace (the fuzz crate is its own
/// workspace, built by the fuzz stage).
const LINTS: &[(&str, &[&str], &str)] = &[
    (
        "clippy",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--quiet",
            "--",
            "-D",
            "warnings",
        ],
        "fix the warnings above; a clippy false positive gets a targeted #[allow] with the reason",
    ),
    (
        "rustfmt",
        &["fmt", "--all", "--check"],
        "the files above are not formatted as rustfmt would: run `cargo fmt --all`",
    ),
];

fn lint(ws: &Path) -> bool {
    if let Err(e) = deps::ensure_lint_tools() {
        println!("test lint ... FAILED: {e:#}");
        return false;
    }
    let mut passed = true;
    for (name, args, fix) in LINTS {
        eprintln!("==> {name}: cargo {}", args.join(" "));
        let ok = Command::new(deps::cargo())
            .current_dir(ws)
            .args(*args)
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            println!("test {name} ... ok");
        } else {
            println!("test {name} ... FAILED: {fix}");
        }
        passed &= ok;
    }
    passed
}

/// The kernel series as a reviewer receives it (`cargo xtask series`
/// without its builds, which take longer than CI's budget allows).
fn series_check(ws: &Path) -> bool {
    eprintln!("==> the kernel series: cargo xtask series");
    match series::run(ws, &series::SeriesArgs::default()) {
        Ok(true) => {
            println!("test series ... ok");
            true
        }
        Ok(false) => {
            println!("test series ... FAILED: the patches named above");
            false
        }
        Err(e) => {
            println!("test series ... FAILED: {e:#}");
            false
        }
    }
}

/// Each fuzz target for a short while: a crash, or a target that cannot be
/// built or run, fails the group (and says why).
fn run_fuzz_tests(ws: &Path, seconds: u64) -> bool {
    eprintln!("==> fuzz tests: each target for {seconds} s");
    let targets = match fuzz::build_targets(ws) {
        Ok(path) => path,
        Err(e) => {
            println!("test fuzz ... FAILED: the fuzz targets cannot run:\n{e:#}");
            return false;
        }
    };
    let mut failures = 0;
    for &(target, what, _) in fuzz::TARGETS {
        match fuzz::run_target(ws, &targets, target, seconds) {
            Ok(outcome) if outcome.crash.is_none() => {
                println!("test fuzz_{target} ... ok: {}", outcome.summary())
            }
            Ok(outcome) => {
                failures += 1;
                println!(
                    "test fuzz_{target} ... FAILED ({what}):\n{}\n{}",
                    outcome.summary(),
                    outcome.crash.map(|c| c.1).unwrap_or_default()
                );
            }
            Err(e) => {
                failures += 1;
                println!("test fuzz_{target} ... FAILED: {e:#}");
            }
        }
    }
    println!(
        "fuzz tests: {} passed, {failures} failed",
        fuzz::TARGETS.len() - failures
    );
    failures == 0
}

fn run_vm_tests(ws: &Path, args: &TestArgs) -> Result<bool> {
    let (tests, left_out) = chosen_vm_tests(args.filter.as_deref(), args.heavy);
    if tests.is_empty() {
        bail!("no VM test matches --filter {:?}", args.filter);
    }
    if !left_out.is_empty() {
        eprintln!(
            "==> on demand, not run here (`cargo xtask test --heavy` or `--filter NAME` runs them): {}",
            left_out.join(", ")
        );
    }
    // QEMU's targets this run boots: one tree of both when both are
    // wanted (qemu::ensure_among).
    let mut archs: Vec<Arch> = tests.iter().map(|t| t.arch).collect();
    archs.dedup();
    let mut images: Vec<(Variant, Arch, image::Images)> = Vec::new();
    for variant in [
        Variant::Normal,
        Variant::Debug,
        Variant::Sanitize,
        Variant::Gdb,
    ] {
        if tests
            .iter()
            .any(|t| t.variant == variant && t.arch == Arch::X86_64)
        {
            images.push((
                variant,
                Arch::X86_64,
                image::ensure_beside(ws, variant, &archs)?,
            ));
        }
    }
    let accel = host::choose_accel();
    eprintln!(
        "==> VM tests under {} ({})",
        if accel.kvm { "KVM" } else { "QEMU TCG" },
        accel.reason
    );
    let mut failures = 0;
    let mut failed: Vec<(&str, String)> = Vec::new();
    let mut box_hang_reruns = 0;
    for test in &tests {
        let start = Instant::now();
        if !images
            .iter()
            .any(|(v, a, _)| *v == test.variant && *a == test.arch)
        {
            match image::ensure_arch(ws, test.variant, test.arch, None) {
                Ok(built) => images.push((test.variant, test.arch, built)),
                Err(e) => {
                    failures += 1;
                    println!(
                        "test {} ... FAILED ({}): {}\nits {} images could not be built:\n{e:#}\n",
                        test.name,
                        human(start.elapsed()),
                        test.what,
                        test.arch.kernel_arch()
                    );
                    continue;
                }
            }
        }
        let (_, _, images) = images
            .iter()
            .find(|(v, a, _)| *v == test.variant && *a == test.arch)
            .expect("built above");
        let run_args = RunArgs {
            host: test.host,
            arch: test.arch,
            check: vec![],
            ..RunArgs::for_tests()
        };
        let mut scenario = scenario_for(ws, images, &run_args, test.name)?;
        if test.variant == Variant::Gdb {
            use_box_qemu_for_gdb(ws, &mut scenario.vm)?;
        }
        let run_dir = scenario.vm.run_dir.clone();
        let _ = fs::remove_file(run_dir.join(host::vm::BOX_STUCK_FILE));
        let mut result = (test.run)(&scenario, &accel);
        for attempt in 1..=host::vm::BOX_HANG_RERUNS {
            let Some(why) = box_hang_rerun(test.name, &result, &run_dir) else {
                break;
            };
            if let Err(e) = &result {
                box_hang_reruns += 1;
                let kept = host::vm::keep_run_dir(&run_dir, &format!("box-hang-{attempt}"))?;
                println!(
                    "test {} ... THE BOX ITSELF HUNG (its QEMU under TCG or L1, not perfbed; docs/box-verification.md), rerun {attempt} of at most {} (box-hang reruns in this run: {box_hang_reruns}):\n  {}\n  the hung attempt ({e}) is kept in {}",
                    test.name,
                    host::vm::BOX_HANG_RERUNS,
                    why.trim().replace('\n', "\n  "),
                    kept.display()
                );
                let _ = fs::remove_file(run_dir.join(host::vm::BOX_STUCK_FILE));
                result = (test.run)(&scenario, &accel);
            }
        }
        let took = human(start.elapsed());
        match result {
            Ok(()) => println!("test {} ... ok ({took}): {}", test.name, test.what),
            Err(e) => {
                failures += 1;
                println!(
                    "test {} ... FAILED ({took}): {}\n{e:#}\n",
                    test.name, test.what
                );
                failed.push((test.name, format!("{e:#}")));
            }
        }
    }
    for (name, error) in &failed {
        println!("failed: {name}\n{}", failure_summary(error));
    }
    println!(
        "VM tests: {} passed, {failures} failed{}",
        tests.len() - failures,
        if box_hang_reruns > 0 {
            format!(", {box_hang_reruns} rerun after the box itself hung (QEMU TCG nested-SVM workaround)")
        } else {
            String::new()
        }
    );
    Ok(failures == 0)
}

/// Most lines of a failed VM test's error repeated at the end of the run.
const SUMMARY_LINES: usize = 24;

/// A failed VM test's error as the end of the run repeats it: its failed
/// checks (`FAIL` lines and what follows them, such as a kernel report)
/// when it names some, else its first lines; at most [`SUMMARY_LINES`], so
/// that a log cut to its head and tail still says why each test failed.
fn failure_summary(error: &str) -> String {
    let lines: Vec<&str> = error.lines().collect();
    let from = lines
        .iter()
        .position(|l| l.trim_start().starts_with("FAIL "))
        .unwrap_or(0);
    let wanted: Vec<&&str> = lines[from..]
        .iter()
        .filter(|l| !l.trim_start().starts_with("PASS "))
        .collect();
    let mut summary: Vec<String> = wanted
        .iter()
        .take(SUMMARY_LINES)
        .map(|l| format!("  {l}"))
        .collect();
    if wanted.len() > SUMMARY_LINES {
        summary.push("  ...".into());
    }
    summary.join("\n")
}

/// The VM tests a run carries out, in order, and the names of the
/// on-demand ones it leaves out: a filter picks among all of them, without
/// one `heavy` adds the on-demand ones.
fn chosen_vm_tests(filter: Option<&str>, heavy: bool) -> (Vec<&'static VmTest>, Vec<&'static str>) {
    let (tests, left_out): (Vec<&VmTest>, Vec<&VmTest>) = VM_TESTS
        .iter()
        .filter(|t| filter.is_none_or(|f| t.name.contains(f)))
        .partition(|t| t.when == When::Always || heavy || filter.is_some());
    (tests, left_out.iter().map(|t| t.name).collect())
}

/// Why `test`'s failed `result` gets its one rerun: only a test in
/// [`RERUN_ON_BOX_HANG`] whose run the harness diagnosed as the box itself
/// being stuck; `None` for a pass and for any other failure.
fn box_hang_rerun(test: &str, result: &Result<()>, run_dir: &Path) -> Option<String> {
    if result.is_ok() || !RERUN_ON_BOX_HANG.contains(&test) {
        return None;
    }
    host::vm::box_hung(run_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_summary_keeps_the_failed_checks() {
        let error = "checks failed:\n  PASS  a  fine\n  FAIL  clean kernel log  [ 1] BUG: KCSAN: x\n    the first report:\n      value changed\n  PASS  b  fine";
        assert_eq!(
            failure_summary(error),
            "    FAIL  clean kernel log  [ 1] BUG: KCSAN: x\n      the first report:\n        value changed"
        );
        assert_eq!(failure_summary("QEMU exited"), "  QEMU exited");
        let long: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let summary = failure_summary(&long);
        assert_eq!(summary.lines().count(), SUMMARY_LINES + 1);
        assert!(summary.ends_with("..."));
    }

    #[test]
    fn on_demand_tests_run_when_asked_for_or_named() {
        let names = |tests: Vec<&VmTest>| tests.iter().map(|t| t.name).collect::<Vec<_>>();
        let (ci, left_out) = chosen_vm_tests(None, false);
        assert!(names(ci.clone()).contains(&"boot_and_hotplug"));
        assert!(!names(ci).contains(&"sanitizer_kernel"));
        assert!(left_out.contains(&"sanitizer_kernel") && left_out.contains(&"arm64_end_to_end"));
        let (all, left_out) = chosen_vm_tests(None, true);
        assert_eq!(all.len(), VM_TESTS.len());
        assert!(left_out.is_empty());
        let (named, left_out) = chosen_vm_tests(Some("gdb_session"), false);
        assert_eq!(names(named), ["gdb_session", "vmm_gdb_session"]);
        assert!(left_out.is_empty());
    }

    #[test]
    fn only_a_diagnosed_box_hang_of_a_listed_test_is_rerun() {
        for name in RERUN_ON_BOX_HANG {
            assert!(
                VM_TESTS
                    .iter()
                    .any(|t| t.name == *name && t.host == host::HostChoice::Vmm),
                "{name} is no VM test on perfbed-vmm"
            );
        }
        let dir = std::env::temp_dir().join(format!("perfbed-rerun-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let run_dir = dir.join("vmm_end_to_end");
        fs::create_dir_all(&run_dir).unwrap();
        fs::write(run_dir.join("serial.log"), "guest log").unwrap();
        let failed: Result<()> = Err(anyhow::anyhow!("no answer within 120s"));
        // A failure without the diagnosis (a perfbed bug, a check) is final.
        assert_eq!(box_hang_rerun("vmm_end_to_end", &failed, &run_dir), None);
        fs::write(run_dir.join(host::vm::BOX_STUCK_FILE), "").unwrap();
        assert_eq!(box_hang_rerun("vmm_end_to_end", &failed, &run_dir), None);
        fs::write(
            run_dir.join(host::vm::BOX_STUCK_FILE),
            "vCPU 0 (first snapshot): its local APIC timer expired\n",
        )
        .unwrap();
        assert!(box_hang_rerun("vmm_end_to_end", &failed, &run_dir)
            .is_some_and(|why| why.contains("timer expired")));
        assert_eq!(box_hang_rerun("vmm_end_to_end", &Ok(()), &run_dir), None);
        // A test that boots no box is never rerun, whatever its folder says.
        assert_eq!(box_hang_rerun("boot_and_hotplug", &failed, &run_dir), None);
        assert!(box_hang_rerun("vmm_guest_panic_is_reported", &failed, &run_dir).is_some());
        let kept = host::vm::keep_run_dir(&run_dir, "box-hang").unwrap();
        assert_eq!(kept, dir.join("vmm_end_to_end-box-hang"));
        assert_eq!(
            fs::read_to_string(kept.join("serial.log")).unwrap(),
            "guest log"
        );
        let _ = fs::remove_dir_all(&dir);
    }
}
