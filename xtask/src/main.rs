//! `cargo xtask`: perfbed's build and test driver. Each subcommand is small;
//! the work lives in the modules named after it.

mod cache;
mod cmd;
mod deps;
mod image;
mod scenario;
mod test;
mod vm;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

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
    /// Build the guest kernel, perfbed.ko and the initramfs (cached).
    Image,
    /// The main job: build what is missing, boot, run the scenario, report.
    Run(RunArgs),
    /// Every test: the workspace's unit tests, then the VM tests.
    Test(test::TestArgs),
}

#[derive(Args, Clone)]
pub struct RunArgs {
    /// Guest vCPUs (1 to 8: the guest kernel's NR_CPUS).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=vm::MAX_CPUS as i64))]
    cpus: u8,
    /// Guest memory in MiB (128 to 16384).
    #[arg(long, default_value_t = 512)]
    memory: u32,
    /// Rounds of taking every CPU but 0 offline and online again.
    #[arg(long, default_value_t = 10)]
    rounds: u32,
    /// Seconds the guest may take to boot, and each scenario step to answer.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// Boot this vmlinux instead of the built one.
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// The QEMU binary.
    #[arg(long, default_value = "qemu-system-x86_64")]
    qemu: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = workspace().and_then(|ws| match cli.command {
        Command::Deps => deps::ensure().map(|()| true),
        Command::Image => image::ensure(&ws).map(|images| {
            println!("vmlinux:   {}\ninitramfs: {}", images.vmlinux.display(), images.initramfs.display());
            true
        }),
        Command::Run(args) => run(&ws, &args),
        Command::Test(args) => test::run(&ws, &args),
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

/// The workspace root: xtask lives one level below it.
fn workspace() -> Result<PathBuf> {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").context("run this through `cargo xtask`")?;
    Ok(Path::new(&manifest).parent().context("xtask has a parent folder")?.to_path_buf())
}

fn run(ws: &Path, args: &RunArgs) -> Result<bool> {
    let total = Instant::now();
    check_args(args)?;
    let images = image::ensure(ws)?;
    let scenario = scenario_for(ws, &images, args, "run")?;
    let image_time = total.elapsed();
    let accel = vm::choose_accel();
    eprintln!(
        "==> booting {} vCPUs, {} MiB under {} ({})",
        args.cpus,
        args.memory,
        if accel.kvm { "KVM" } else { "QEMU TCG" },
        accel.reason
    );
    let report = scenario::run(&scenario, &accel)?;
    scenario::print_report(&report, image_time, total.elapsed());
    Ok(report.passed())
}

/// Refuses bad arguments before minutes go into a build.
fn check_args(args: &RunArgs) -> Result<()> {
    vm::check_size(args.cpus, args.memory)?;
    if let Some(kernel) = &args.kernel {
        vm::check_elf_kernel(kernel)?;
    }
    if args.timeout == 0 {
        anyhow::bail!("--timeout 0: give the guest at least a second");
    }
    Ok(())
}

/// The scenario `args` ask for, on these images, with its own log folder.
fn scenario_for(ws: &Path, images: &image::Images, args: &RunArgs, name: &str) -> Result<scenario::Scenario> {
    let vm = vm::VmConfig {
        qemu: args.qemu.clone(),
        vmlinux: args.kernel.clone().unwrap_or_else(|| images.vmlinux.clone()),
        initramfs: images.initramfs.clone(),
        cpus: args.cpus,
        memory_mib: args.memory,
        extra_cmdline: vec![],
        run_dir: vm::new_run_dir(ws, name),
        boot_timeout: Duration::from_secs(args.timeout),
    };
    vm.validate()?;
    Ok(scenario::Scenario {
        vm,
        expected_release: images.kernel_release.clone(),
        hotplug_rounds: args.rounds,
        request_timeout: Duration::from_secs(args.timeout),
    })
}
