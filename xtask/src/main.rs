//! `cargo xtask`: perfbed's build and test driver. This file is the command
//! line alone: each subcommand's work lives in the module named after it
//! (ARCHITECTURE.md has the map), and nothing imports this file.

mod bench;
mod build;
mod checks;
mod cmd;
mod debug;
mod fuzz;
mod guest;
mod host;
mod model;
mod progress;
mod run;
mod series;
mod stress;
mod test;
mod trace;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use build::image;
use run::RunArgs;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Build, boot and test perfbed")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what this machine lacks (Debian packages, the pinned bindgen).
    Deps,
    /// Build the guest kernel, perfbed.ko, the initramfs and QEMU (cached).
    Image {
        /// The debug kernel (lockdep, PROVE_RCU, DEBUG_ATOMIC_SLEEP, DEBUG_LIST,
        /// KFENCE, debugobjects).
        #[arg(long)]
        debug: bool,
        /// The sanitizer kernel: the debug kernel with KCSAN.
        #[arg(long, conflicts_with_all = ["debug", "gdb"])]
        sanitize: bool,
        /// The kernel with DWARF debug information for gdb.
        #[arg(long, conflicts_with = "debug")]
        gdb: bool,
        /// The guest's architecture (arm64: docs/arm64.md).
        #[arg(long, value_enum, default_value_t = image::arch::Arch::X86_64, conflicts_with_all = ["sanitize", "gdb"])]
        arch: image::arch::Arch,
    },
    /// The main job: build what is missing, boot, run the scenario, report.
    Run(RunArgs),
    /// Every test: the workspace's unit tests, then the VM tests.
    Test(test::TestArgs),
    /// Hotplug storm under live traffic on a seeded schedule: every count
    /// must equal the device's truth (debug kernel by default).
    Stress(stress::StressArgs),
    /// Carry out scenario files (scenarios/README.md) on the lifecycle
    /// guest, each replayed through the counting model (debug kernel by
    /// default); a bad line is refused before anything boots.
    Scenario(stress::lifecycle::scenario_run::ScenarioArgs),
    /// The kernel's cpu-hotplug selftest (cpu-on-off-test.sh -a), then rounds
    /// that park and unpark a domain, under a steady rate: perf stat -a must
    /// count exactly the device's truth, at 100 % (debug kernel by default)
    HotplugSelftest(stress::selftest::SelftestArgs),
    /// Fuzz the device, the control socket, the agent protocol and the host
    /// configuration (libFuzzer through `libfuzzer-sys`; stable toolchain).
    Fuzz(fuzz::FuzzArgs),
    /// Measure perfbed against its baselines: a table of value, baseline,
    /// ratio and goal, saved under target/perfbed/bench/.
    Bench(bench::BenchArgs),
    /// The kernel series as a reviewer receives it: every prefix applies
    /// exactly, every patch is numbered, named in the cover letter and
    /// checkpatch --strict clean (--build: every prefix builds), and what
    /// each patch turns green by the kernel mutants that undo it (--prove:
    /// run them); writes the series and its cover letter into the run
    /// folder.
    Series(series::SeriesArgs),
    /// Boot again and again, idle and under load: hangs, failures, boot times.
    BootStress(stress::boot::BootStressArgs),
    /// What a device MMIO exit costs perfbed-vmm against a bare exit (on this
    /// machine's /dev/kvm if it opens, and in the box).
    VmmBench(bench::vmm_exit::VmmBenchArgs),
    /// Print a saved device trace decoded (register names, one column per
    /// domain), or draw its timeline with --plot.
    Trace(trace::TraceArgs),
    /// Boot the guest and keep it up (for `perfbed ctl` and the logs) for
    /// --seconds, then power it off.
    Up {
        #[command(flatten)]
        run: RunArgs,
        /// How long to keep the VM up.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Once the guest is up, run this program of the initramfs in it and
        /// print its output (repeatable, in order; the words split on
        /// spaces, e.g. --exec '/usr/bin/lscpu -C').
        #[arg(long, value_name = "COMMAND")]
        exec: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = build::workspace().and_then(|ws| match cli.command {
        Command::Deps => build::deps::ensure().map(|()| true),
        Command::Image { arch, debug, .. } if arch != image::arch::Arch::X86_64 => {
            image::ensure_arch(&ws, run::variant(debug, false, false), arch, None).map(|images| {
                println!(
                    "kernel:    {}\ninitramfs: {}\nqemu:      {}",
                    images.vmlinux.display(),
                    images.initramfs.display(),
                    images.qemu.binary.display()
                );
                true
            })
        }
        Command::Image {
            debug,
            sanitize,
            gdb,
            ..
        } => image::ensure(&ws, run::variant(debug, sanitize, gdb)).map(|images| {
            println!(
                "vmlinux:   {}\ninitramfs: {}",
                images.vmlinux.display(),
                images.initramfs.display()
            );
            true
        }),
        Command::Run(args) => run::run(&ws, &args),
        Command::Test(args) => test::run(&ws, &args),
        Command::Fuzz(args) => fuzz::run(&ws, &args),
        Command::Bench(args) => bench::run(&ws, &args),
        Command::Series(args) => series::run(&ws, &args),
        Command::BootStress(args) => stress::boot::run(&ws, &args),
        Command::Trace(args) => trace::command(&args),
        Command::Stress(args) if args.is_lifecycle() => stress::lifecycle::cli::run(&ws, &args),
        Command::Stress(args) => stress::run(&ws, &args),
        Command::Scenario(args) => stress::lifecycle::scenario_run::run(&ws, &args),
        Command::HotplugSelftest(args) => stress::selftest::run(&ws, &args),
        Command::VmmBench(args) => bench::vmm_exit::run(&ws, &args),
        Command::Up { run, seconds, exec } => {
            run::up(&ws, &run, Duration::from_secs(seconds), &exec)
        }
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
