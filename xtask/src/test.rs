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
use crate::{deps, image, scenario_for, scope_test, RunArgs};

#[derive(Args)]
pub struct TestArgs {
    /// Run only the unit tests (no VM boots).
    #[arg(long, conflicts_with = "vm_only")]
    unit_only: bool,
    /// Run only the VM tests.
    #[arg(long)]
    vm_only: bool,
    /// Run only the VM tests whose name contains this.
    #[arg(long)]
    filter: Option<String>,
}

struct VmTest {
    name: &'static str,
    what: &'static str,
    /// The guest kernel it boots.
    variant: Variant,
    run: fn(&Scenario, &Accel) -> Result<()>,
}

const VM_TESTS: &[VmTest] = &[
    VmTest {
        name: "boot_and_hotplug",
        what: "4 vCPUs boot, perfbed.ko loads, the device checks and 5 hotplug rounds pass, the kernel log stays clean",
        variant: Variant::Normal,
        run: boot_and_hotplug,
    },
    VmTest {
        name: "debug_kernel_end_to_end",
        what: "the same run on the debug kernel: perfbed.ko under lockdep, PROVE_RCU, DEBUG_ATOMIC_SLEEP and DEBUG_LIST, with no report",
        variant: Variant::Debug,
        run: boot_and_hotplug,
    },
    VmTest {
        name: "guest_panic_is_reported",
        what: "a guest kernel that panics ends the run at once, with the panic named and the log kept",
        variant: Variant::Normal,
        run: guest_panic_is_reported,
    },
    VmTest {
        name: "unresponsive_guest_times_out",
        what: "a guest that stops answering ends in a timeout error that names the request and the log",
        variant: Variant::Normal,
        run: unresponsive_guest_times_out,
    },
    VmTest {
        name: "device_scope_pmu",
        what: "on the debug kernel, device-scope PMUs are placed, move, park and return with CPU hotplug, opens racing moves land right or get EBUSY, and no lockdep/RCU/WARN report",
        variant: Variant::Debug,
        run: device_scope_pmu,
    },
    VmTest {
        name: "gdb_session",
        what: "on the gdb kernel, Debian's gdb in batch mode breaks in perfbed.ko's read callback under `perf stat`, names it in the backtrace, reads REG_MAGIC through the driver's mapping, detaches, and perf finishes",
        variant: Variant::Gdb,
        run: gdb_session,
    },
];

pub fn run(ws: &Path, args: &TestArgs) -> Result<bool> {
    deps::ensure()?;
    let mut passed = true;
    if !args.vm_only {
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
    if !args.unit_only {
        passed &= run_vm_tests(ws, args)?;
    }
    println!("\ncargo xtask test: {}", if passed { "PASSED" } else { "FAILED" });
    Ok(passed)
}

fn run_vm_tests(ws: &Path, args: &TestArgs) -> Result<bool> {
    let tests: Vec<&VmTest> =
        VM_TESTS.iter().filter(|t| args.filter.as_deref().is_none_or(|f| t.name.contains(f))).collect();
    if tests.is_empty() {
        bail!("no VM test matches --filter {:?}", args.filter);
    }
    let run_args = RunArgs::for_tests();
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
    let booted = Vm::boot(&scenario.vm, accel)?;
    let mut vm = booted.vm;
    let checks = scope_test::run(&mut vm, scenario.request_timeout)?;
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
    if start.elapsed() > Duration::from_secs(60) {
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
