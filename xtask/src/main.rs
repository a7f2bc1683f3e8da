//! `cargo xtask`: perfbed's build and test driver. Each subcommand is small;
//! the work lives in the modules named after it.

mod bench;
mod boot_stress;
mod cache;
mod cmd;
mod control_proxy;
mod deps;
mod gdb;
mod fuzz;
mod guest;
mod image;
mod moving_traffic;
mod module_lifecycle;
mod perf_abi;
mod perf_matrix;
mod l1box;
mod monitor;
mod pmu_checks;
mod progress;
mod scenario;
mod scope_test;
mod stress;
mod test;
mod trace;
mod vm;
mod vmm_bench;

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
    /// Build the guest kernel, perfbed.ko, the initramfs and QEMU (cached).
    Image {
        /// The debug kernel (lockdep, PROVE_RCU, DEBUG_ATOMIC_SLEEP, DEBUG_LIST).
        #[arg(long)]
        debug: bool,
        /// The kernel with DWARF debug information for gdb.
        #[arg(long, conflicts_with = "debug")]
        gdb: bool,
    },
    /// The main job: build what is missing, boot, run the scenario, report.
    Run(RunArgs),
    /// Every test: the workspace's unit tests, then the VM tests.
    Test(test::TestArgs),
    /// Hotplug storm under live traffic on a seeded schedule: every count
    /// must equal the device's truth (debug kernel by default).
    Stress(stress::StressArgs),
    /// The kernel's cpu-hotplug selftest (cpu-on-off-test.sh -a), then rounds
    /// that park and unpark a domain, under a steady rate: perf stat -a must
    /// count exactly the device's truth, at 100 % (debug kernel by default)
    HotplugSelftest(stress::selftest::SelftestArgs),
    /// Fuzz the device, the control socket, the agent protocol and the host
    /// configuration (installs the pinned cargo-fuzz; stable toolchain).
    Fuzz(fuzz::FuzzArgs),
    /// Measure perfbed against its baselines: a table of value, baseline,
    /// ratio and goal, saved under target/perfbed/bench/.
    Bench(bench::BenchArgs),
    /// Boot again and again, idle and under load: hangs, failures, boot times.
    BootStress(boot_stress::BootStressArgs),
    /// What a device MMIO exit costs perfbed-vmm against a bare exit (on this
    /// machine's /dev/kvm if it opens, and in the box).
    VmmBench(vmm_bench::VmmBenchArgs),
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
    },
}

#[derive(Args, Clone)]
pub struct RunArgs {
    /// Guest vCPUs (1 to 64: the guest kernel's NR_CPUS).
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
    /// The device's domains: each domain's allowed CPUs, domains separated
    /// by ':' (default: the CPUs split in two halves, "0-1:2-3" for 4).
    #[arg(long)]
    domains: Option<String>,
    /// Boot this vmlinux instead of the built one.
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// Use this QEMU instead of perfbed's build (it must have `-device perfbed`).
    #[arg(long)]
    qemu: Option<PathBuf>,
    /// Boot the debug kernel (lockdep, PROVE_RCU, DEBUG_ATOMIC_SLEEP, DEBUG_LIST).
    #[arg(long)]
    debug: bool,
    /// Records the device's trace keeps (older ones are dropped and counted;
    /// 0 records nothing). The device's own default is 4096; a run keeps
    /// more so that its saved trace and plot cover it whole.
    #[arg(long, default_value_t = RUN_TRACE_CAPACITY)]
    trace_capacity: usize,
    /// Save the device trace and draw its timeline (trace.txt, trace.svg
    /// beside the logs) even when every check passes; a failed run always
    /// gets them.
    #[arg(long)]
    plot: bool,
    /// Boot the kernel with debug information, stopped, with QEMU's gdbstub;
    /// print the gdb command lines (vmlinux, then perfbed.ko once loaded).
    #[arg(long, conflicts_with = "debug")]
    gdb: bool,
    /// The gdbstub's TCP port (on 127.0.0.1).
    #[arg(long, default_value_t = gdb::DEFAULT_PORT)]
    gdb_port: u16,
    /// Show the guest's serial log and the agent transcript live (on
    /// stderr, each line prefixed `serial|`, `agent>` or `agent<`).
    #[arg(long)]
    verbose: bool,
    /// Which VMM runs the guest: perfbed-vmm (`vmm`; on native KVM, else in
    /// the box, an L1 Linux with KVM under QEMU TCG), perfbed's QEMU (`qemu`),
    /// or `auto`: perfbed-vmm where the CPU has VT-x/SVM, else QEMU.
    #[arg(long, value_enum, default_value_t = vm::HostChoice::Auto)]
    host: vm::HostChoice,
}

/// How long a guest stopped for gdb may take to boot, and a request to
/// answer (someone may sit at a breakpoint).
const GDB_PATIENCE: Duration = Duration::from_secs(3600);

/// The trace a run keeps: about 12 MiB of records, a whole default run.
pub const RUN_TRACE_CAPACITY: usize = 1 << 18;

fn variant(debug: bool, gdb: bool) -> image::Variant {
    if gdb {
        image::Variant::Gdb
    } else if debug {
        image::Variant::Debug
    } else {
        image::Variant::Normal
    }
}

impl RunArgs {
    /// The VM tests' shape: the default run with fewer hotplug rounds.
    pub fn for_tests() -> RunArgs {
        RunArgs {
            cpus: 4,
            memory: 512,
            rounds: 5,
            timeout: 120,
            domains: None,
            kernel: None,
            qemu: None,
            debug: false,
            trace_capacity: RUN_TRACE_CAPACITY,
            plot: false,
            gdb: false,
            gdb_port: gdb::DEFAULT_PORT,
            verbose: false,
            host: vm::HostChoice::Qemu,
        }
    }

    fn device(&self) -> Result<perfbed_device::DeviceConfig> {
        let domains = match &self.domains {
            Some(spec) => perfbed_device::cpus::parse_domain_list(spec).map_err(|e| anyhow::anyhow!("--domains {spec:?}: {e}"))?,
            None => default_domains(self.cpus),
        };
        Ok(perfbed_device::DeviceConfig {
            domains,
            trace_capacity: self.trace_capacity,
            ..perfbed_device::DeviceConfig::default()
        })
    }
}

/// Two domains of half the CPUs each (one domain for a single CPU), like
/// two L3 caches.
fn default_domains(cpus: u8) -> Vec<Vec<u32>> {
    let cpus = u32::from(cpus);
    if cpus < 2 {
        return vec![vec![0]];
    }
    let half = cpus / 2;
    vec![(0..half).collect(), (half..cpus).collect()]
}

#[cfg(test)]
mod tests {
    use super::default_domains;

    #[test]
    fn default_domains_split_the_cpus_in_two() {
        assert_eq!(default_domains(4), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(default_domains(3), vec![vec![0], vec![1, 2]]);
        assert_eq!(default_domains(1), vec![vec![0]]);
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = workspace().and_then(|ws| match cli.command {
        Command::Deps => deps::ensure().map(|()| true),
        Command::Image { debug, gdb } => image::ensure(&ws, variant(debug, gdb)).map(|images| {
            println!("vmlinux:   {}\ninitramfs: {}", images.vmlinux.display(), images.initramfs.display());
            true
        }),
        Command::Run(args) => run(&ws, &args),
        Command::Test(args) => test::run(&ws, &args),
        Command::Fuzz(args) => fuzz::run(&ws, &args),
        Command::Bench(args) => bench::run(&ws, &args),
        Command::BootStress(args) => boot_stress::run(&ws, &args),
        Command::Trace(args) => trace::command(&args),
        Command::Stress(args) => stress::run(&ws, &args),
        Command::HotplugSelftest(args) => stress::selftest::run(&ws, &args),
        Command::VmmBench(args) => vmm_bench::run(&ws, &args),
        Command::Up { run, seconds } => up(&ws, &run, Duration::from_secs(seconds)),
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
    let images = image::ensure_for(ws, variant(args.debug, args.gdb), image::Purpose::Run)?;
    let accel = vm::choose_accel();
    let scenario = scenario_for(ws, &images, args, "run")?;
    let image_time = total.elapsed();
    match &scenario.vm.host {
        vm::Host::Qemu => eprintln!(
            "==> booting {} vCPUs, {} MiB under {} ({})",
            args.cpus,
            args.memory,
            if accel.kvm { "KVM" } else { "QEMU TCG" },
            accel.reason
        ),
        host => eprintln!("==> booting {} vCPUs, {} MiB on perfbed-vmm, {}", args.cpus, args.memory, host.name()),
    }
    let report = match scenario::run(&scenario, &accel) {
        Ok(report) => report,
        Err(e) => {
            // The VM died: the device trace it saved on the way is drawn here.
            let saved = trace::plot_saved(&scenario.vm.run_dir);
            scenario::print_trace(saved.as_ref());
            return Err(e);
        }
    };
    scenario::print_report(&report, image_time, total.elapsed());
    if !matches!(scenario.vm.host, vm::Host::Qemu) {
        for line in l1box::host_report(&scenario.vm.run_dir) {
            println!("  {line}");
        }
    }
    Ok(report.passed())
}

fn up(ws: &Path, args: &RunArgs, hold: Duration) -> Result<bool> {
    check_args(args)?;
    let images = image::ensure_for(ws, variant(args.debug, args.gdb), image::Purpose::Run)?;
    let scenario = scenario_for(ws, &images, args, "up")?;
    let mut booted = vm::Vm::boot(&scenario.vm, &vm::choose_accel())?;
    println!("guest up in {} (kernel {}, CPUs {})", cmd::human(booted.boot_time), booted.hello.kernel_release, booted.hello.cpus_online);
    if let Some(stub) = &scenario.vm.gdb {
        // Loaded now, so that gdb can have its symbols from the start.
        let mut guest = guest::Guest { vm: &mut booted.vm, timeout: scenario.request_timeout };
        guest.expect_done(perfbed_agent::HostRequest::LoadModule { name: pmu_checks::MODULE.into() })?;
        gdb::announce_module(&mut guest, pmu_checks::MODULE, &scenario.driver, &scenario.vm.vmlinux, stub.port, &scenario.vm.run_dir)?;
    }
    println!("  control socket: {}", booted.vm.control_socket.display());
    println!("    try: cargo run -q -p perfbed-device --bin perfbed -- ctl --socket {} state", booted.vm.control_socket.display());
    println!("  serial log:     {}", booted.vm.serial_log.display());
    println!("powering off in {}", cmd::human(hold));
    std::thread::sleep(hold);
    booted.vm.power_off(Duration::from_secs(30))?;
    Ok(true)
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
    let device = args.device()?;
    device.validate().map_err(|e| anyhow::anyhow!("--domains: {e}"))?;
    // Migration and parking take a whole domain offline, and CPU 0 cannot go.
    if !device.domains.iter().any(|cpus| cpus.len() >= 2 && !cpus.contains(&0)) {
        anyhow::bail!(
            "the scenario needs a domain of two or more CPUs other than CPU 0 to take offline (domains {:?}); \
             try --cpus 4 --domains 0-1:2-3",
            device.domains
        );
    }
    Ok(())
}

/// The scenario `args` ask for, on these images, with its own log folder.
fn scenario_for(ws: &Path, images: &image::Images, args: &RunArgs, name: &str) -> Result<scenario::Scenario> {
    let vmlinux = args.kernel.clone().unwrap_or_else(|| images.vmlinux.clone());
    let gdb = args.gdb.then(|| vm::GdbStub {
        port: args.gdb_port,
        stopped: true,
        hint: gdb::attach_command(&vmlinux, args.gdb_port, &[]),
    });
    let patience = if args.gdb { GDB_PATIENCE.max(Duration::from_secs(args.timeout)) } else { Duration::from_secs(args.timeout) };
    let (placement, why) = vm::choose_host(args.host, &vm::choose_accel());
    if args.gdb && placement != vm::Placement::Qemu {
        anyhow::bail!("--gdb uses QEMU's gdbstub: add --host qemu (perfbed-vmm has no gdb server)");
    }
    let host = l1box::build_host(ws, placement, &vmlinux, &images.initramfs)?;
    if args.host != vm::HostChoice::Qemu {
        eprintln!("==> host: {} ({why})", host.name());
    }
    if let vm::Host::VmmBox(images) = &host {
        eprintln!("    the box: L1 kernel {}, initramfs {}", images.kernel_package, images.initramfs.display());
    }
    let vm = vm::VmConfig {
        qemu: args.qemu.clone().unwrap_or_else(|| images.qemu.binary.clone()),
        firmware_dirs: images.qemu.firmware_dirs.clone(),
        device: args.device()?,
        vmlinux,
        initramfs: images.initramfs.clone(),
        cpus: args.cpus,
        memory_mib: args.memory,
        extra_cmdline: vec![],
        run_dir: vm::new_run_dir(ws, name),
        boot_timeout: patience,
        gdb,
        verbose: args.verbose,
        host,
    };
    vm.validate()?;
    Ok(scenario::Scenario {
        vm,
        expected_release: images.kernel_release.clone(),
        hotplug_rounds: args.rounds,
        request_timeout: patience,
        plot: args.plot,
        driver: images.driver.clone(),
    })
}
