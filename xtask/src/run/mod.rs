//! `cargo xtask run` and `cargo xtask up`: one guest booted as the flags
//! say, the scenario's checks run on it (or the guest kept up), and the
//! shape of that guest ([`RunArgs`], [`scenario_for`]) that the VM tests,
//! `bench` and `boot-stress` boot too.

pub mod scenario;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;

use crate::build::image;
use crate::debug::gdb;
use crate::guest;
use crate::host::{self, vmm};
use crate::progress::human;
use crate::trace;

#[derive(Args, Clone)]
pub struct RunArgs {
    /// Guest vCPUs (1 to 64: the guest kernel's NR_CPUS).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=host::config::MAX_CPUS as i64))]
    pub cpus: u8,
    /// Guest memory in MiB (128 to 16384).
    #[arg(long, default_value_t = 512)]
    pub memory: u32,
    /// Rounds of taking every CPU but 0 offline and online again.
    #[arg(long, default_value_t = 10)]
    pub rounds: u32,
    /// Seconds the guest may take to boot, and each scenario step to answer.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// The device's domains: each domain's allowed CPUs, domains separated
    /// by ':' (default: the CPUs split in two halves, "0-1:2-3" for 4).
    #[arg(long)]
    pub domains: Option<String>,
    /// Boot this vmlinux instead of the built one.
    #[arg(long)]
    pub kernel: Option<PathBuf>,
    /// Use this QEMU instead of perfbed's build (it must have `-device perfbed`).
    #[arg(long)]
    pub qemu: Option<PathBuf>,
    /// Boot the debug kernel (lockdep, PROVE_RCU, DEBUG_ATOMIC_SLEEP, DEBUG_LIST,
    /// KFENCE, debugobjects).
    #[arg(long)]
    pub debug: bool,
    /// Boot the sanitizer kernel: the debug kernel with KCSAN, the
    /// data-race detector (images/kernel/sanitize.fragment).
    #[arg(long, conflicts_with_all = ["debug", "gdb"])]
    pub sanitize: bool,
    /// Records the device's trace keeps (older ones are dropped and counted;
    /// 0 records nothing). The device's own default is 4096; a run keeps
    /// more so that its saved trace and plot cover it whole.
    #[arg(long, default_value_t = RUN_TRACE_CAPACITY)]
    pub trace_capacity: usize,
    /// Save the device trace and draw its timeline (trace.txt, trace.svg
    /// beside the logs) even when every check passes; a failed run always
    /// gets them.
    #[arg(long)]
    pub plot: bool,
    /// Boot the kernel with debug information, stopped, with a gdb stub
    /// (QEMU's, or perfbed-vmm's with --host vmm, in the box too); print the
    /// gdb command lines (vmlinux, then perfbed.ko once loaded).
    #[arg(long, conflicts_with = "debug")]
    pub gdb: bool,
    /// The gdbstub's TCP port (on 127.0.0.1).
    #[arg(long, default_value_t = gdb::DEFAULT_PORT)]
    pub gdb_port: u16,
    /// Show the guest's serial log and the agent transcript live (on
    /// stderr, each line prefixed `serial|`, `agent>` or `agent<`).
    #[arg(long)]
    pub verbose: bool,
    /// Which VMM runs the guest: perfbed-vmm (`vmm`; on native KVM, else in
    /// the box, an L1 Linux with KVM under QEMU TCG), perfbed's QEMU (`qemu`),
    /// or `auto`: perfbed-vmm where the CPU has VT-x/SVM, else QEMU.
    #[arg(long, value_enum, default_value_t = host::HostChoice::Auto)]
    pub host: host::HostChoice,
    /// Also run the checks of known, open perfbed bugs (they fail until the
    /// bug is fixed; docs/counting-semantics.md, "Known violations").
    #[arg(long)]
    pub known_bugs: bool,
    /// Run only the checks whose printed names contain PATTERN
    /// (repeatable; `=NAME`: that check only), after the boot and the
    /// driver's load: one check's verdict fast after an edit.
    #[arg(long, value_name = "PATTERN")]
    pub check: Vec<String>,
    /// The guest's architecture: x86_64, or arm64 on perfbed's aarch64
    /// QEMU's `virt` board under TCG (docs/arm64.md; its images are built
    /// only when asked for).
    #[arg(long, value_enum, default_value_t = image::arch::Arch::X86_64)]
    pub arch: image::arch::Arch,
}

/// How long a guest stopped for gdb may take to boot, and a request to
/// answer (someone may sit at a breakpoint).
const GDB_PATIENCE: Duration = Duration::from_secs(3600);

/// The trace a run keeps: about 12 MiB of records, a whole default run.
pub const RUN_TRACE_CAPACITY: usize = 1 << 18;

pub fn variant(debug: bool, sanitize: bool, gdb: bool) -> image::Variant {
    if gdb {
        image::Variant::Gdb
    } else if sanitize {
        image::Variant::Sanitize
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
            sanitize: false,
            trace_capacity: RUN_TRACE_CAPACITY,
            plot: false,
            gdb: false,
            gdb_port: gdb::DEFAULT_PORT,
            verbose: false,
            host: host::HostChoice::Qemu,
            known_bugs: false,
            check: vec![],
            arch: image::arch::Arch::X86_64,
        }
    }

    fn device(&self) -> Result<perfbed_device::DeviceConfig> {
        let domains = match &self.domains {
            Some(spec) => perfbed_device::cpus::parse_domain_list(spec)
                .map_err(|e| anyhow::anyhow!("--domains {spec:?}: {e}"))?,
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
pub fn default_domains(cpus: u8) -> Vec<Vec<u32>> {
    let cpus = u32::from(cpus);
    if cpus < 2 {
        return vec![vec![0]];
    }
    let half = cpus / 2;
    vec![(0..half).collect(), (half..cpus).collect()]
}

pub fn run(ws: &Path, args: &RunArgs) -> Result<bool> {
    let total = Instant::now();
    check_args(args, true)?;
    let images = images_for(ws, args)?;
    let accel = host::choose_accel();
    let scenario = scenario_for(ws, &images, args, "run")?;
    let image_time = total.elapsed();
    match &scenario.vm.host {
        host::Host::Qemu | host::Host::QemuVirt => eprintln!(
            "==> booting {} vCPUs, {} MiB under {} ({})",
            args.cpus,
            args.memory,
            if accel.kvm { "KVM" } else { "QEMU TCG" },
            accel.reason
        ),
        host => eprintln!(
            "==> booting {} vCPUs, {} MiB on perfbed-vmm, {}",
            args.cpus,
            args.memory,
            host.name()
        ),
    }
    // Known before the boot, so that `perfbed ctl` can follow this run live.
    eprintln!(
        "    control socket: {} (once the VM starts)",
        scenario.vm.control_socket().display()
    );
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
    if scenario.vm.host.is_vmm() {
        for line in vmm::host_report(&scenario.vm.run_dir) {
            println!("  {line}");
        }
    }
    Ok(report.passed())
}

/// Boots the guest, runs each of `exec` in it (printing what it wrote),
/// and keeps it up for `hold`.
pub fn up(ws: &Path, args: &RunArgs, hold: Duration, exec: &[String]) -> Result<bool> {
    check_args(args, false)?;
    let images = images_for(ws, args)?;
    let scenario = scenario_for(ws, &images, args, "up")?;
    let mut booted = host::vm::Vm::boot(&scenario.vm, &host::choose_accel())?;
    println!(
        "guest up in {} (kernel {}, CPUs {})",
        human(booted.boot_time),
        booted.hello.kernel_release,
        booted.hello.cpus_online
    );
    if let Some(stub) = &scenario.vm.gdb {
        // Loaded now, so that gdb can have its symbols from the start.
        let mut guest = guest::Guest {
            vm: &mut booted.vm,
            timeout: scenario.request_timeout,
        };
        guest.expect_done(perfbed_agent::HostRequest::LoadModule {
            name: guest::MODULE.into(),
        })?;
        gdb::announce_module(
            &mut guest,
            guest::MODULE,
            &scenario.driver,
            &scenario.vm.vmlinux,
            stub.port,
            &scenario.vm.run_dir,
        )?;
    }
    let mut ran_ok = true;
    for command in exec {
        let argv: Vec<&str> = command.split_whitespace().collect();
        let mut guest = guest::Guest {
            vm: &mut booted.vm,
            timeout: scenario.request_timeout,
        };
        let (status, stdout, stderr) = guest.run(&argv)?;
        println!("$ {command}");
        print!("{stdout}");
        eprint!("{stderr}");
        if status != Some(0) {
            println!("(exit status {status:?})");
            ran_ok = false;
        }
    }
    println!("  control socket: {}", booted.vm.control_socket.display());
    println!(
        "    try: cargo run -q -p perfbed-device --bin perfbed -- ctl --socket {} state",
        booted.vm.control_socket.display()
    );
    println!("  serial log:     {}", booted.vm.serial_log.display());
    println!("powering off in {}", human(hold));
    std::thread::sleep(hold);
    booted.vm.power_off(Duration::from_secs(30))?;
    Ok(ran_ok)
}

/// What `run` and `up` boot: x86's images of the variant asked for, or an
/// arm64 guest's (normal kernel only).
fn images_for(ws: &Path, args: &RunArgs) -> Result<image::Images> {
    match args.arch {
        image::arch::Arch::X86_64 => image::ensure_for(
            ws,
            variant(args.debug, args.sanitize, args.gdb),
            image::Purpose::Run,
        ),
        arch => image::ensure_arch(ws, image::Variant::Normal, arch, None),
    }
}

/// Refuses bad arguments before minutes go into a build. `scenario`: the
/// run's checks follow, which need a domain to take offline; `up` boots any
/// valid layout (1 CPU, one domain, a CPU per domain).
fn check_args(args: &RunArgs, scenario: bool) -> Result<()> {
    host::config::check_size(args.cpus, args.memory)?;
    let refused = refused_on_arch(args);
    if !refused.is_empty() {
        anyhow::bail!(
            "--arch {}: {} (docs/arm64.md)",
            args.arch.kernel_arch(),
            refused.join("; ")
        );
    }
    if let Some(kernel) = &args.kernel {
        host::config::check_elf_kernel(kernel)?;
    }
    if args.timeout == 0 {
        anyhow::bail!("--timeout 0: give the guest at least a second");
    }
    let device = args.device()?;
    device
        .validate()
        .map_err(|e| anyhow::anyhow!("--domains: {e}"))?;
    let names = scenario::check_names(args.known_bugs, args.debug || args.sanitize, args.arch)?;
    if let Some(p) = args
        .check
        .iter()
        .find(|p| !names.iter().any(|n| crate::checks::pattern_matches(p, n)))
    {
        anyhow::bail!(
            "--check {p:?} names no check of the run; its checks are:\n  {}",
            names.join("\n  ")
        );
    }
    // The scenario library's lines, refused now rather than after the boot.
    if scenario {
        use crate::stress::lifecycle::scenario_guest::{layout, library, load};
        let files: Vec<PathBuf> = library()?
            .iter()
            .filter(|s| (args.known_bugs || !s.known) && s.runs_on(args.arch))
            .map(|s| s.file.clone())
            .collect();
        load(&files, &layout(args.cpus, &device, args.arch), &device)?;
    }
    // Migration and parking take a whole domain offline, and CPU 0 cannot go.
    let offlinable = device
        .domains
        .iter()
        .any(|cpus| cpus.len() >= 2 && !cpus.contains(&0));
    if scenario && !offlinable {
        anyhow::bail!(
            "the scenario needs a domain of two or more CPUs other than CPU 0 to take offline (domains {:?}); \
             try --cpus 4 --domains 0-1:2-3",
            device.domains
        );
    }
    Ok(())
}

/// The flags of `args` its `--arch` cannot do, each with why: `run` and
/// `up` boot an arm64 guest's normal kernel on perfbed's aarch64 QEMU only.
fn refused_on_arch(args: &RunArgs) -> Vec<&'static str> {
    if args.arch == image::arch::Arch::X86_64 {
        return vec![];
    }
    [
        (
            args.host == host::HostChoice::Vmm,
            "--host vmm: perfbed-vmm is a KVM VMM for x86 guests on an x86 host; an arm64 guest boots on perfbed's aarch64 QEMU (`virt`, TCG): leave --host out",
        ),
        (
            args.debug,
            "--debug: the arm64 debug kernel boots under `cargo xtask stress --arch arm64` and `scenario --arch arm64`; the run's checks on it (hotplug fail injection among them) have not been tried on arm64",
        ),
        (
            args.sanitize,
            "--sanitize: there is no arm64 sanitizer kernel (KCSAN is configured for x86 only, images/kernel/sanitize.fragment)",
        ),
        (
            args.gdb,
            "--gdb: there is no arm64 gdb kernel (images/kernel/gdb.fragment is x86's) and the gdb attach lines are x86's",
        ),
    ]
    .into_iter()
    .filter_map(|(given, why)| given.then_some(why))
    .collect()
}

/// The scenario `args` ask for, on these images, with its own log folder.
pub fn scenario_for(
    ws: &Path,
    images: &image::Images,
    args: &RunArgs,
    name: &str,
) -> Result<scenario::Scenario> {
    let vmlinux = args
        .kernel
        .clone()
        .unwrap_or_else(|| images.vmlinux.clone());
    let gdb = args.gdb.then(|| host::config::GdbStub {
        port: args.gdb_port,
        stopped: true,
        hint: gdb::attach_command(&vmlinux, args.gdb_port, &[]),
    });
    let patience = if args.gdb {
        GDB_PATIENCE.max(Duration::from_secs(args.timeout))
    } else {
        Duration::from_secs(args.timeout)
    };
    let (placement, why) = host::choose_host(args.host, &host::choose_accel());
    let host = match args.arch {
        image::arch::Arch::X86_64 => host::build_host(ws, placement, &vmlinux, &images.initramfs)?,
        image::arch::Arch::Arm64 => host::Host::QemuVirt,
    };
    if args.host != host::HostChoice::Qemu && args.arch == image::arch::Arch::X86_64 {
        eprintln!("==> host: {} ({why})", host.name());
    }
    if let host::Host::VmmBox(images) = &host {
        eprintln!(
            "    the box: L1 kernel {}, initramfs {}",
            images.kernel_package,
            images.initramfs.display()
        );
    }
    let mut vm = host::config::VmConfig {
        qemu: args
            .qemu
            .clone()
            .unwrap_or_else(|| images.qemu.binary.clone()),
        firmware_dirs: images.qemu.firmware_dirs.clone(),
        device: args.device()?,
        vmlinux,
        initramfs: images.initramfs.clone(),
        cpus: args.cpus,
        memory_mib: args.memory,
        extra_cmdline: vec![],
        run_dir: host::config::new_run_dir(ws, name),
        boot_timeout: patience,
        gdb,
        verbose: args.verbose,
        host,
        serial_ring: None,
        instruction_clock: false,
    };
    if args.gdb && args.qemu.is_none() {
        use_box_qemu_for_gdb(ws, &mut vm)?;
    }
    vm.validate()?;
    Ok(scenario::Scenario {
        vm,
        expected_release: images.kernel_release.clone(),
        hotplug_rounds: args.rounds,
        request_timeout: patience,
        plot: args.plot,
        driver: images.driver.clone(),
        scope_test: images.scope_test.clone(),
        known_bugs: args.known_bugs,
        fail_injection: images.variant.is_debug(),
        select: crate::checks::Select::matching(&args.check),
    })
}

/// In the box, gdb's breakpoints need perfbed's QEMU with the INT3
/// intercept patch (`image::qemu::ensure_for_box_gdb`); elsewhere `vm`
/// keeps its QEMU.
pub fn use_box_qemu_for_gdb(ws: &Path, vm: &mut host::config::VmConfig) -> Result<()> {
    if matches!(vm.host, host::Host::VmmBox(_)) {
        vm.qemu = image::qemu::ensure_for_box_gdb(ws)?.binary;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::default_domains;

    /// `cargo xtask run ARGS` as parsed, refused or not by [`check_args`].
    fn check_run(args: &[&str]) -> anyhow::Result<()> {
        use clap::Parser;
        #[derive(Parser)]
        struct Run {
            #[command(flatten)]
            args: super::RunArgs,
        }
        let run = Run::try_parse_from(std::iter::once("run").chain(args.iter().copied()))?;
        super::check_args(&run.args, true)
    }

    #[test]
    fn arm64_refuses_the_flags_it_cannot_do_before_any_build_and_says_why() {
        for (flags, says) in [
            (
                &["--host", "vmm"][..],
                "perfbed-vmm is a KVM VMM for x86 guests",
            ),
            (&["--sanitize"][..], "no arm64 sanitizer kernel"),
            (&["--gdb"][..], "no arm64 gdb kernel"),
        ] {
            let mut args = vec!["--arch", "arm64", "--check", "=CPU hotplug"];
            args.extend(flags);
            let refused = format!("{:#}", check_run(&args).unwrap_err());
            assert!(refused.starts_with("--arch arm64: "), "{refused}");
            assert!(refused.contains(says), "{flags:?}: {refused}");
            // The same flags on x86 are taken.
            check_run(&args[2..]).unwrap();
        }
        let both = format!(
            "{:#}",
            check_run(&["--arch", "arm64", "--host", "vmm", "--gdb"]).unwrap_err()
        );
        assert!(
            both.contains("--host vmm: ") && both.contains("; --gdb: "),
            "{both}"
        );
        // What an arm64 run can do: its normal kernel, on QEMU.
        for flags in [&[][..], &["--host", "qemu"][..], &["--host", "auto"][..]] {
            let mut args = vec!["--arch", "arm64", "--check", "=CPU hotplug"];
            args.extend(flags);
            check_run(&args).unwrap_or_else(|e| panic!("{args:?}: {e:#}"));
        }
    }

    #[test]
    fn default_domains_split_the_cpus_in_two() {
        assert_eq!(default_domains(4), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(default_domains(3), vec![vec![0], vec![1, 2]]);
        assert_eq!(default_domains(1), vec![vec![0]]);
    }
}
