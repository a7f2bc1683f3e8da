//! `cargo xtask stress`: counts that must survive CPU hotplug, under live
//! traffic, on a schedule generated from a seed.
//!
//! The guest keeps events of every domain open (single events and a
//! `PERF_FORMAT_GROUP` group, each on its own (domain, RMID, event)), a
//! thread in it opens and closes events in a loop, and the real
//! `perf stat -a` counts across the whole run, while the agent runs the
//! schedule's hotplug operations and the host injects bursts and changes
//! steady rates. Traffic for an event starts only after it is open and has
//! landed before its final read, so every final count must equal the
//! device's truth exactly.

mod allowed;
pub mod boot;
pub(crate) mod fail_injection;
mod jobs;
pub mod lifecycle;
pub mod mutants;
mod placements;
mod report;
pub mod rng;
pub mod schedule;
pub mod selftest;
mod traffic;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use perfbed_agent::{
    AgentMessage, HostRequest, HotplugBatchResult, HotplugOp, JobSpec, PerfAttr, PerfIoctl,
};
use perfbed_device::regs::Event;
use perfbed_device::{ControlClient, DeviceConfig};

use crate::build::image::arch::Arch;
use crate::build::image::{self, Variant};
use crate::checks::{clean_log_check, Check};
use crate::guest::perf_abi::{FORMAT_GROUP, FORMAT_TOTAL_TIME_ENABLED, FORMAT_TOTAL_TIME_RUNNING};
use crate::guest::Guest;
use crate::guest::{pmu_name, MODULE};
use crate::host;
use crate::host::config::VmConfig;
use crate::host::vm::Vm;
use crate::host::Accel;
use crate::progress::human;
use crate::run::default_domains;
use crate::stress::rng::Rng;
use crate::stress::traffic::{Injector, Key};
use jobs::{
    check_batch_shape, kernel_open_retries, open, open_loop_check, perf_stat_counts, start_job,
    start_perf_stat, stop_job, violations_check,
};
use placements::Placements;
use report::{cap, check_finals, StressReport, Watched, WatchedKind};
use schedule::{Op, Step, Topology};

#[derive(Args, Clone)]
pub struct StressArgs {
    /// Schedule steps (cycles) to run.
    #[arg(long, default_value_t = 300)]
    cycles: u32,
    /// The schedule's and the traffic's seed (default: from the clock; the
    /// report prints it).
    #[arg(long)]
    seed: Option<u64>,
    /// Guest vCPUs (up to the guest kernel's NR_CPUS).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(2..=host::config::MAX_CPUS as i64))]
    cpus: u8,
    /// The device's domains, e.g. 0-1:2-3 (default: the CPUs in two halves).
    #[arg(long)]
    domains: Option<String>,
    /// The guest's architecture: arm64 boots on perfbed's aarch64 QEMU
    /// (`virt`), where CPU 0 goes offline like any other CPU
    /// (docs/arm64.md); its guest has no perf, so the hotplug schedule
    /// runs no `perf stat` there and the lifecycle stress deals none.
    #[arg(long, value_enum, default_value_t = Arch::X86_64)]
    pub arch: Arch,
    /// Boot the debug kernel (the default).
    #[arg(long, conflicts_with = "normal")]
    debug: bool,
    /// Boot the normal kernel instead of the debug one.
    #[arg(long)]
    normal: bool,
    /// Boot the sanitizer kernel (the debug one with KCSAN) instead.
    #[arg(long, conflicts_with_all = ["normal", "debug"])]
    sanitize: bool,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 512)]
    memory: u32,
    /// Seconds the boot, and each request to the guest, may take.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Which VMM runs the guest: perfbed's QEMU (the default), perfbed-vmm
    /// (`vmm`: on native KVM, else in the box), or `auto` (perfbed-vmm
    /// where the CPU has VT-x/SVM, else QEMU).
    #[arg(long, value_enum, default_value_t = host::HostChoice::Qemu)]
    host: host::HostChoice,
    /// Lifecycle fuzzing instead of the hotplug schedule: this many seeded
    /// perf operations (opens, groups, ioctls, reads, closes, perf stat)
    /// among moves, parks and bursts, each checked against the model of
    /// docs/counting-semantics.md.
    #[arg(long, value_name = "OPS")]
    lifecycle: Option<u32>,
    /// Plant the named bug (guest-driver/mutants/NAME.patch, or a kernel
    /// mutant in images/kernel/mutants/) and run a short lifecycle stress
    /// that must catch it.
    #[arg(long, value_name = "NAME", conflicts_with = "mutants")]
    mutant: Option<String>,
    /// Run every driver mutant in turn and print the table (caught or not,
    /// after how many operations, the replay command).
    #[arg(long)]
    mutants: bool,
    /// With --mutants: the kernel mutants too (a kernel build each).
    #[arg(long, requires = "mutants")]
    kernel_mutants: bool,
    /// With --lifecycle: no ENABLE, DISABLE or RESET of events whose PMU is
    /// parked (the generator issues them by default).
    #[arg(long)]
    no_parked_ioctls: bool,
    /// Also deal steps that fail a CPU offline or online at a hotplug state
    /// (`hotplug/fail`, the debug kernel's `CONFIG_CPU_HOTPLUG_STATE_CONTROL`)
    /// and check the rollback left every PMU where the placement rule says.
    /// The hotplug schedule (`--cycles`) only: the lifecycle stress and the
    /// mutants do not deal them.
    #[arg(long, conflicts_with_all = ["normal", "lifecycle", "mutant", "mutants"])]
    fail_injection: bool,
    /// With --lifecycle or --mutant: rcutorture's CPU on/off
    /// (`onoff_interval`) takes CPUs offline and back at random beside the
    /// perf operations and traffic, instead of the host's moves and parks
    /// (debug kernel only); the host reads the CPUs and placements after
    /// every step, the run ends with `rmmod rcutorture` ("End of test:
    /// SUCCESS") and a power-off with events open. Not shrunk.
    #[arg(long, conflicts_with = "normal")]
    pub rcutorture: bool,
    /// With --lifecycle or --mutant: now and then, for 5 to 60 operations,
    /// a thread of the guest moves a PMU (takes its domain's CPUs offline
    /// and back in turn) while the operations go on; the reads between may
    /// race a move. A seed deals other operations with it.
    #[arg(long, conflicts_with = "rcutorture")]
    pub moving_thread: bool,
    /// With --lifecycle or --mutant: now and then, for 10 to 120
    /// operations, a steady rate of 1 to 32 MiB/s on the counter of an open
    /// event, the device's truth measured around every step while it
    /// flows (each step alone). A seed deals other operations with it.
    #[arg(long, conflicts_with = "rcutorture")]
    pub watched_rates: bool,
    /// With --lifecycle or --mutant: do not shrink a failing run to a
    /// scenario (by default it is, in the same guest, into the run folder).
    #[arg(long)]
    no_shrink: bool,
    /// Seconds shrinking a failing run may take.
    #[arg(long, default_value_t = 600, value_name = "SECS")]
    shrink_time: u64,
    /// Replay a lifecycle journal (lifecycle-journal.jsonl of a run folder)
    /// against the model, without a guest, and print what differs.
    #[arg(long, value_name = "FILE")]
    journal: Option<PathBuf>,
}

/// Counter slots per domain in the stress device: enough for every event
/// the stress keeps open on a domain plus the open-close loop's, so that
/// nothing multiplexes and `time_running == time_enabled` must hold.
const SLOTS: u32 = 8;
const RMIDS: u32 = 8;
/// RMIDs by role: the single events, the group, perf stat, the loop's.
const RMID_SINGLE: u32 = 1;
const RMID_GROUP: u32 = 2;
const RMID_PERF_STAT: u32 = 3;
const RMID_LOOP_OCCUPANCY: u32 = 4;
const RMID_LOOP_TOTAL: u32 = 5;
/// Schedule steps per agent request.
const STEPS_PER_BATCH: usize = 25;

/// What one stress run is: the VM, the schedule's length and seed, and the
/// command that runs it again.
pub struct StressConfig {
    pub vm: VmConfig,
    pub cycles: u32,
    pub seed: u64,
    /// Deal [`schedule::StepKind::FailInjected`] steps too.
    pub fail_injection: bool,
    pub timeout: Duration,
    pub replay: String,
}

impl StressArgs {
    /// How long a failing lifecycle run may be shrunk: not with
    /// `--no-shrink`, nor in the `--mutants` table (each row its own run).
    pub fn shrinking(&self) -> Option<lifecycle::shrink::Shrinking> {
        (!self.no_shrink && !self.mutants && !self.rcutorture).then(|| {
            let mutant = self
                .mutant
                .as_ref()
                .map_or(String::new(), |m| format!(" --mutant {m}"));
            lifecycle::shrink::Shrinking::new(
                std::time::Duration::from_secs(self.shrink_time),
                format!("cargo xtask scenario{}{mutant}", self.guest_flags()),
            )
        })
    }

    /// The flags that choose the guest, as a replay command repeats them
    /// (` --cpus N` first).
    pub fn guest_flags(&self) -> String {
        let mut flags = format!(" --cpus {}", self.cpus);
        if self.arch != Arch::X86_64 {
            let _ = write!(flags, " --arch {}", self.arch.kernel_arch());
        }
        if let Some(domains) = &self.domains {
            let _ = write!(flags, " --domains {domains}");
        }
        if self.normal {
            flags += " --normal";
        }
        if self.sanitize {
            flags += " --sanitize";
        }
        if self.host != host::HostChoice::Qemu {
            let _ = write!(flags, " --host {}", self.host.name());
        }
        flags
    }

    /// Refuses what the arm64 guest cannot carry out, with the reason,
    /// before anything is built.
    pub fn check_arch(&self) -> Result<()> {
        if self.arch == Arch::X86_64 {
            return Ok(());
        }
        let arch = self.arch.kernel_arch();
        let refused = [
            (self.sanitize, "--sanitize: the sanitizer kernel (KCSAN) is not built for arm64"),
            (
                self.host != host::HostChoice::Qemu,
                "--host: arm64 runs on perfbed's aarch64 QEMU only",
            ),
            (
                self.mutants,
                "--mutants: the driver mutants are not built for arm64 (a kernel mutant with --mutant is)",
            ),
        ];
        match refused.iter().find(|(asked, _)| *asked) {
            Some((_, why)) => bail!("--arch {arch}: {why}"),
            None => Ok(()),
        }
    }

    /// Whether these ask for the lifecycle stress (`stress::lifecycle::cli`)
    /// rather than the hotplug schedule.
    pub fn is_lifecycle(&self) -> bool {
        self.lifecycle.is_some() || self.mutant.is_some() || self.mutants || self.journal.is_some()
    }
}

/// The kernel a stress boots: the debug one unless `--normal` or
/// `--sanitize` asks for another.
pub fn kernel_variant(normal: bool, sanitize: bool) -> Variant {
    if normal {
        Variant::Normal
    } else if sanitize {
        Variant::Sanitize
    } else {
        Variant::Debug
    }
}

pub fn run(ws: &Path, args: &StressArgs) -> Result<bool> {
    if args.rcutorture {
        bail!("--rcutorture goes with --lifecycle N or --mutant NAME");
    }
    args.check_arch()?;
    let seed = args.seed.unwrap_or_else(clock_seed);
    let variant = kernel_variant(args.normal, args.sanitize);
    host::config::check_size(args.cpus, args.memory)?;
    let device = device(args.cpus, args.domains.as_deref())?;
    let replay = format!(
        "cargo xtask stress --cycles {} --seed {seed}{}{}",
        args.cycles,
        args.guest_flags(),
        if args.fail_injection {
            " --fail-injection"
        } else {
            ""
        }
    );
    // Refuse a topology the schedule cannot use before minutes go into a build.
    schedule::generate(
        &topology(args.cpus, &device, args.arch),
        seed,
        1,
        &schedule::kinds(args.fail_injection),
    )
    .map_err(|e| anyhow::anyhow!("{}", e.0))?;
    let accel = host::choose_accel();
    let (images, host, why) = match args.arch {
        Arch::X86_64 => {
            let images = image::ensure(ws, variant)?;
            let (placement, why) = host::choose_host(args.host, &accel);
            let host = host::build_host(ws, placement, &images.vmlinux, &images.initramfs)?;
            (images, host, why)
        }
        Arch::Arm64 => (
            image::ensure_arch(ws, variant, args.arch, None)?,
            host::Host::QemuVirt,
            "TCG".to_string(),
        ),
    };
    let config = StressConfig {
        vm: VmConfig {
            host,
            ..guest_vm(
                ws,
                &images,
                device,
                args.cpus,
                args.memory,
                "stress",
                Duration::from_secs(args.timeout),
            )
        },
        cycles: args.cycles,
        seed,
        fail_injection: args.fail_injection,
        timeout: Duration::from_secs(args.timeout),
        replay,
    };
    let under = match &config.vm.host {
        host::Host::Qemu if accel.kvm => "QEMU on KVM".to_string(),
        host::Host::Qemu => "QEMU TCG".to_string(),
        host => format!("{}: {why}", host.name()),
    };
    eprintln!(
        "==> stress: {} cycles, seed {seed}, {} vCPUs, domains {}, {} kernel, under {under}",
        config.cycles,
        config.vm.cpus,
        domains_text(&config.vm.device),
        variant.name(),
    );
    let report = execute(&config, &accel)?;
    print!("{}", report.text());
    Ok(report.passed())
}

/// A guest of the hotplug commands on perfbed's QEMU (the stress may put it
/// on another host).
fn guest_vm(
    ws: &Path,
    images: &image::Images,
    device: DeviceConfig,
    cpus: u8,
    memory_mib: u32,
    name: &str,
    boot_timeout: Duration,
) -> VmConfig {
    VmConfig {
        qemu: images.qemu.binary.clone(),
        firmware_dirs: images.qemu.firmware_dirs.clone(),
        device,
        vmlinux: images.vmlinux.clone(),
        initramfs: images.initramfs.clone(),
        cpus,
        memory_mib,
        extra_cmdline: vec![],
        host: host::Host::Qemu,
        serial_ring: None,
        instruction_clock: false,
        run_dir: host::config::new_run_dir(ws, name),
        boot_timeout,
        gdb: None,
        verbose: false,
    }
}

fn clock_seed() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    now.as_secs() ^ u64::from(now.subsec_nanos())
}

/// The stress device: the given domains (default two halves), more slots
/// than the stress ever needs at once.
pub fn device(cpus: u8, domains: Option<&str>) -> Result<DeviceConfig> {
    let domains = match domains {
        Some(spec) => spec
            .split(':')
            .map(|d| {
                perfbed_device::cpus::parse_cpu_list(d)
                    .map_err(|e| anyhow::anyhow!("--domains {spec:?}: {e}"))
            })
            .collect::<Result<_>>()?,
        None => default_domains(cpus),
    };
    let device = DeviceConfig {
        domains,
        rmids: RMIDS,
        slots: SLOTS,
        ..DeviceConfig::default()
    };
    device
        .validate()
        .map_err(|e| anyhow::anyhow!("--domains: {e}"))?;
    if let Some(cpu) = device
        .domains
        .iter()
        .flatten()
        .find(|&&c| c >= u32::from(cpus))
    {
        bail!(
            "--domains allows CPU {cpu}, but the guest has CPUs 0-{}",
            cpus - 1
        );
    }
    if parking_domain(&device).is_none() {
        bail!(
            "the stress needs a domain without CPU 0, to park (domains {})",
            domains_text(&device)
        );
    }
    Ok(device)
}

fn domains_text(device: &DeviceConfig) -> String {
    device
        .domains
        .iter()
        .map(|d| perfbed_agent::format_cpu_list(d))
        .collect::<Vec<_>>()
        .join(":")
}

fn topology(cpus: u8, device: &DeviceConfig, arch: Arch) -> Topology {
    Topology {
        cpus: u32::from(cpus),
        domains: device.domains.clone(),
        cpu0_offline: arch == Arch::Arm64,
    }
}

/// The last domain without CPU 0: it parks, and perf stat counts on it.
fn parking_domain(device: &DeviceConfig) -> Option<usize> {
    device.domains.iter().rposition(|cpus| !cpus.contains(&0))
}

/// How often a long run says how far it got.
const PROGRESS_EVERY: Duration = Duration::from_secs(60);

/// Bytes injected for each watched counter after the schedule, before the
/// events are disabled (64 KiB: 1024 units, far from a wrap).
const FINAL_BURST: u64 = 64 << 10;

/// Boots, runs the stress, powers off. An `Err` means the run could not
/// complete; it still names the seed, the replay and the kept logs.
pub fn execute(config: &StressConfig, accel: &Accel) -> Result<StressReport> {
    let steps = schedule::generate(
        &topology(config.vm.cpus, &config.vm.device, config.vm.host.arch()),
        config.seed,
        config.cycles,
        &schedule::kinds(config.fail_injection),
    )
    .map_err(|e| anyhow::anyhow!("{}", e.0))?;
    let failed = |e: anyhow::Error| {
        e.context(format!(
            "the stress did not complete; seed {}; replay with: {}\nrun folder (serial log, device trace): {}",
            config.seed,
            config.replay,
            config.vm.run_dir.display()
        ))
    };
    let booted = Vm::boot(&config.vm, accel).map_err(failed)?;
    let mut vm = booted.vm;
    let trace_file = config.vm.run_dir.join("device-trace.json");
    let socket = vm_control(&config.vm.run_dir);
    let (hook_socket, hook_file) = (socket.clone(), trace_file.clone());
    vm.before_kill(Box::new(move || keep_trace(&hook_socket, &hook_file)));
    let mut report = stress(&mut vm, config, &steps).map_err(failed)?;
    // A splat fails the run too: look before the device goes with QEMU.
    let log = std::fs::read_to_string(&vm.serial_log).unwrap_or_default();
    if !report.passed() || !host::console::kernel_log_problems(&log).is_empty() {
        keep_trace(&socket, &trace_file);
    }
    vm.power_off(Duration::from_secs(60)).map_err(failed)?;
    report
        .checks
        .push(clean_log_check(&config.vm.run_dir.join("serial.log")));
    Ok(report)
}

fn keep_trace(socket: &Path, file: &Path) {
    match save_trace(socket, file) {
        Ok(()) => eprintln!("device trace kept: {}", file.display()),
        Err(e) => eprintln!("could not save the device trace: {e:#}"),
    }
}

fn vm_control(run_dir: &Path) -> PathBuf {
    run_dir.join("control.sock")
}

fn save_trace(socket: &Path, file: &Path) -> Result<()> {
    let trace = ControlClient::connect(socket)?.trace()?;
    std::fs::write(file, serde_json::to_string(&trace)?)?;
    Ok(())
}

/// The stress proper, on a booted guest.
fn stress(vm: &mut Vm, config: &StressConfig, steps: &[Step]) -> Result<StressReport> {
    let vm_arch = config.vm.host.arch();
    let device = &config.vm.device;
    let run_dir = &config.vm.run_dir;
    let mut g = Guest {
        vm,
        timeout: config.timeout,
    };
    g.expect_done(HostRequest::LoadModule {
        name: MODULE.into(),
    })?;
    let domains = device.domains.len();
    let pmus: Vec<String> = (0..domains).map(pmu_name).collect();
    let mut types = Vec::new();
    for pmu in &pmus {
        types.push(g.pmu_type(pmu)?);
    }
    let failable = if config.fail_injection {
        Some(fail_injection::Failable::find(&mut g)?)
    } else {
        None
    };
    let mut control = ControlClient::connect(&vm_control(run_dir))
        .context("connecting to the device's control socket")?;
    control.reset_stats()?;
    let mut rng = Rng::new(config.seed);
    let traffic_rng = rng.fork(1);

    // The events that stay open, each on its own (domain, RMID, event).
    let attr = |d: usize, event: Event, rmid: u32, read_format: u64| PerfAttr {
        type_: types[d],
        config: event as u64 | u64::from(rmid) << 8,
        read_format,
        ..PerfAttr::default()
    };
    let timed = FORMAT_TOTAL_TIME_ENABLED | FORMAT_TOTAL_TIME_RUNNING;
    let mut watched = Vec::new();
    let mut keys = Vec::new();
    let mut occupancy = Vec::new();
    for (d, pmu) in pmus.iter().enumerate() {
        let d32 = d as u32;
        for event in [Event::MbmTotalBytes, Event::MbmLocalBytes] {
            let key = Key {
                domain: d32,
                rmid: RMID_SINGLE,
                event,
            };
            let handle = open(&mut g, attr(d, event, RMID_SINGLE, timed), None)?;
            watched.push(Watched {
                name: format!("{}/{event:?},rmid={RMID_SINGLE}/", pmu),
                handle,
                kind: WatchedKind::Single(key),
            });
            keys.push(key);
        }
        let leader = open(
            &mut g,
            attr(d, Event::MbmTotalBytes, RMID_GROUP, timed | FORMAT_GROUP),
            None,
        )?;
        open(
            &mut g,
            attr(d, Event::MbmLocalBytes, RMID_GROUP, 0),
            Some(leader),
        )?;
        open(
            &mut g,
            attr(d, Event::LlcOccupancy, RMID_GROUP, 0),
            Some(leader),
        )?;
        watched.push(Watched {
            name: format!("{} group rmid={RMID_GROUP}", pmu),
            handle: leader,
            kind: WatchedKind::Group {
                domain: d32,
                rmid: RMID_GROUP,
            },
        });
        keys.push(Key {
            domain: d32,
            rmid: RMID_GROUP,
            event: Event::MbmTotalBytes,
        });
        keys.push(Key {
            domain: d32,
            rmid: RMID_GROUP,
            event: Event::MbmLocalBytes,
        });
        occupancy.push((d32, RMID_GROUP));
    }

    // The open-close loop: a gauge (no slot) and a slot event on each domain.
    let loop_attrs: Vec<PerfAttr> = (0..domains)
        .flat_map(|d| {
            [
                attr(d, Event::LlcOccupancy, RMID_LOOP_OCCUPANCY, 0),
                attr(d, Event::MbmTotalBytes, RMID_LOOP_TOTAL, 0),
            ]
        })
        .collect();
    let loop_job = start_job(
        &mut g,
        JobSpec::OpenCloseLoop {
            attrs: loop_attrs,
            pause_us: 200,
        },
    )?;

    // The real perf stat, on the domain that parks, by name (scaled to MB)
    // and by raw terms (bytes, exact); not on arm64, whose guest has no perf.
    let stat_domain = parking_domain(device).expect("checked by device()");
    let stat = match vm_arch {
        Arch::X86_64 => Some(start_perf_stat(&mut g, &pmus[stat_domain], RMID_PERF_STAT)?),
        Arch::Arm64 => None,
    };
    let stat_key = Key {
        domain: stat_domain as u32,
        rmid: RMID_PERF_STAT,
        event: Event::MbmTotalBytes,
    };
    if stat.is_some() {
        keys.push(stat_key);
    }

    // Everything is open and counting: the truth from here on is theirs.
    let before = control.state()?;
    let injector = Injector::start(
        ControlClient::connect(&vm_control(run_dir))?,
        keys.clone(),
        occupancy,
        device.unit_bytes,
        traffic_rng,
    );

    let mut checks = Vec::new();
    let mut placements = Placements::default();
    let mut injections = fail_injection::Tally::default();
    let mut op_errors = Vec::new();
    // Each event's first bad read, and how many more.
    let mut read_problems: BTreeMap<u32, (String, u64)> = BTreeMap::new();
    let mut bad_read =
        |handle: u32, problem: String| read_problems.entry(handle).or_insert((problem, 0)).1 += 1;
    let mut last: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let (mut writes, mut op_time, mut reads) = (0u64, Duration::ZERO, 0u64);
    let read_handles: Vec<u32> = watched.iter().map(|w| w.handle).collect();
    let start = Instant::now();
    let mut last_progress = start;
    for (batch_no, batch) in steps.chunks(STEPS_PER_BATCH).enumerate() {
        if last_progress.elapsed() >= PROGRESS_EVERY {
            last_progress = Instant::now();
            let done = batch_no * STEPS_PER_BATCH;
            let secs = start.elapsed().as_secs_f64();
            crate::progress::say(&format!(
                "    cycle {done} of {} after {} ({:.1}/s); {} moves, {} parks, {} unparks so far",
                steps.len(),
                human(start.elapsed()),
                done as f64 / secs,
                placements.moves,
                placements.parks,
                placements.unparks
            ));
        }
        for segment in segments(batch, &pmus, failable.as_ref())? {
            let ops = match segment {
                Segment::Guest(ops) => ops,
                Segment::Allowed {
                    domain,
                    cpus,
                    parks,
                } => {
                    let change =
                        allowed::change(&mut g, &mut control, &pmus[domain], domain, cpus, parks)?;
                    placements.allowed_change(domain, &change.from, &change.to);
                    op_errors.extend(change.problem.map(|p| format!("batch {batch_no}: {p}")));
                    continue;
                }
            };
            let op_count = ops.len();
            let request = HostRequest::HotplugBatch {
                ops: ops.clone(),
                watch_pmus: pmus.clone(),
                read_handles: read_handles.clone(),
            };
            let result: HotplugBatchResult = match g.ask(request)? {
                AgentMessage::HotplugBatch(result) => result,
                other => bail!("hotplug batch {batch_no}: {other:?}"),
            };
            check_batch_shape(&result, op_count, read_handles.len())
                .with_context(|| format!("hotplug batch {batch_no}"))?;
            placements.add(&result);
            if let Some(failable) = &failable {
                injections.add(&ops, &result, &device.domains, failable, batch_no);
            }
            for (i, op) in result.ops.iter().enumerate() {
                writes += u64::from(op.writes);
                op_time += Duration::from_micros(op.us);
                if let Some(e) = &op.error {
                    op_errors.push(format!("batch {batch_no} op {i}: {e}"));
                }
                for (w, read) in watched.iter().zip(&op.reads) {
                    reads += 1;
                    match read {
                        Ok(values) => {
                            if matches!(w.kind, WatchedKind::Group { .. })
                                && values.first() != Some(&3)
                            {
                                bad_read(w.handle, format!("{} read {values:?} after batch {batch_no} op {i}: not a group of 3 any more", w.name));
                            } else if let Some(prev) = last.get(&w.handle) {
                                for &word in w.cumulative_words() {
                                    if values.get(word) < prev.get(word) {
                                        bad_read(w.handle, format!("{} went down after batch {batch_no} op {i}: {prev:?} → {values:?}", w.name));
                                    }
                                }
                            }
                            last.insert(w.handle, values.clone());
                        }
                        Err(errno) => bad_read(
                            w.handle,
                            format!(
                                "{} read failed after batch {batch_no} op {i}: {errno}",
                                w.name
                            ),
                        ),
                    }
                }
            }
        }
    }
    let schedule_time = start.elapsed();
    let traffic = injector.stop()?;
    control.wait_landed(config.timeout.as_millis() as u64)?;

    // The open-close loop stops first: every open reschedules the context,
    // and the add that follows would fold the counters and hide a del that
    // does not.
    let loop_result = stop_job(&mut g, loop_job, 0)?;
    // A last burst for every watched counter, landed while nothing reads:
    // only the fold in pmu::del() below brings it into the counts.
    for w in &watched {
        let keys = match w.kind {
            WatchedKind::Single(key) => vec![(key.domain, key.rmid, key.event)],
            WatchedKind::Group { domain, rmid } => vec![
                (domain, rmid, Event::MbmTotalBytes),
                (domain, rmid, Event::MbmLocalBytes),
            ],
        };
        for (domain, rmid, event) in keys {
            control.inject(domain, rmid, event, FINAL_BURST)?;
        }
    }
    control.wait_landed(config.timeout.as_millis() as u64)?;
    // Then disabled: a disabled event's count is final (pmu::del() must
    // have folded the last of its counter), and the final reads see what
    // perf saved rather than a fresh read of the device.
    for w in &watched {
        if let Err(errno) = g.ioctl(w.handle, PerfIoctl::Disable { group: true })? {
            bail!("disabling {} before its final read: {errno}", w.name);
        }
    }
    // The final reads, with every CPU back and the traffic landed.
    let handles: Vec<u32> = watched.iter().map(|w| w.handle).collect();
    let finals = match g.ask(HostRequest::PerfReadMany { handles })? {
        AgentMessage::PerfValuesMany { values } => values,
        other => bail!("the final reads: {other:?}"),
    };
    let after = control.state()?;
    let stat_result = match stat {
        Some((job, named, raw)) => Some((stop_job(&mut g, job, libc::SIGINT)?, named, raw)),
        None => None,
    };

    // The events were open before the schedule started and are read after it
    // ended; the guest's clock runs with the host's (90 %: clock slack).
    let min_enabled_ns = (schedule_time.as_nanos() * 9 / 10) as u64;
    let mut tally = check_finals(
        &watched,
        &finals,
        &before,
        &after,
        device.unit_bytes,
        min_enabled_ns,
    );
    let delta = |key: Key| {
        after
            .truth(key.domain, key.rmid, key.event)
            .wrapping_sub(before.truth(key.domain, key.rmid, key.event))
    };
    let stat_truth = delta(stat_key);
    let stat_detail = match stat_result
        .as_ref()
        .map(|(result, named, raw)| (perf_stat_counts(result, named, raw), named, raw))
    {
        None => "no perf stat (the arm64 guest has no perf)".to_string(),
        Some((Ok(stat), named, raw)) => {
            tally.compare(format!("perf stat {raw}"), stat.raw_bytes, stat_truth);
            let truth_mb = stat_truth as f64 / (1u64 << 20) as f64;
            // perf prints MB with two decimals: equal to the truth rounded so.
            if (stat.named_mb - truth_mb).abs() > 0.0051 {
                tally.count_problems.push(format!(
                    "perf stat {named}: {:.2} MB, the device's truth {truth_mb:.4} MB",
                    stat.named_mb
                ));
            }
            if stat.run_ns.iter().any(|&ns| ns < min_enabled_ns as f64) {
                tally.time_problems.push(format!(
                    "perf stat counted for {:?} ns of a run of at least {min_enabled_ns} ns",
                    stat.run_ns
                ));
            }
            if stat.running_pct.iter().any(|&p| p < 100.0) {
                tally.time_problems.push(format!(
                    "perf stat ran {:?} % of the time",
                    stat.running_pct
                ));
            }
            format!(
                "perf stat -a: {:.2} MB and {} bytes, truth {} bytes, running {:?} %",
                stat.named_mb, stat.raw_bytes, stat_truth, stat.running_pct
            )
        }
        Some((Err(e), _, _)) => {
            tally.count_problems.push(format!("perf stat: {e:#}"));
            String::new()
        }
    };

    if failable.is_some() {
        checks.push(injections.check());
    }
    checks.push(Check::from_problems(
        "hotplug operations",
        op_errors,
        format!("{} sysfs writes, all succeeded", writes),
    ));
    let read_problems = read_problems
        .into_values()
        .map(|(first, n)| {
            if n > 1 {
                format!("{first} (and {} more bad reads)", n - 1)
            } else {
                first
            }
        })
        .collect();
    checks.push(Check::from_problems(
        "reads during hotplug",
        read_problems,
        format!("{reads} reads, none failed or went down"),
    ));
    checks.push(Check::from_problems(
        "exact counts",
        cap(tally.count_problems),
        format!(
            "{} counts equal the device's truth; {stat_detail}",
            tally.compared
        ),
    ));
    checks.push(Check::from_problems(
        "time running",
        tally.time_problems,
        "time_running == time_enabled for every event".into(),
    ));
    let mut placement_problems = placements.odd.clone();
    if placements.parks == 0 || placements.unparks == 0 || placements.moves == 0 {
        placement_problems.push(format!(
            "the run saw {} moves, {} parks, {} unparks: some kind never happened",
            placements.moves, placements.parks, placements.unparks
        ));
    }
    checks.push(Check::from_problems(
        "moves and parks",
        placement_problems,
        format!(
            "{} moves, {} parks, {} unparks",
            placements.moves, placements.parks, placements.unparks
        ),
    ));
    checks.push(open_loop_check(&loop_result));
    checks.push(violations_check(&after));

    for w in &watched {
        g.close(w.handle)?;
    }
    let open_retries = kernel_open_retries(&mut g, &pmus)?;
    Ok(StressReport {
        checks,
        cycles: steps.len(),
        hotplug_writes: writes,
        schedule_time,
        op_time,
        placements,
        traffic,
        loop_result: Some(loop_result),
        reads,
        counts_compared: tally.compared,
        counts_lost: tally.lost,
        open_retries,
        seed: config.seed,
        replay: config.replay.clone(),
        run_dir: run_dir.clone(),
    })
}

/// A batch's steps as the stress carries them out: guest hotplug operations
/// in one agent request, up to each allowed-set change, which the host makes.
enum Segment<'a> {
    Guest(Vec<HotplugOp>),
    Allowed {
        domain: usize,
        cpus: &'a [u32],
        parks: bool,
    },
}

fn segments<'a>(
    steps: &'a [Step],
    pmus: &[String],
    failable: Option<&fail_injection::Failable>,
) -> Result<Vec<Segment<'a>>> {
    let mut out = Vec::new();
    let mut guest = Vec::new();
    for op in steps.iter().flat_map(|s| &s.ops) {
        match *op {
            Op::Set { cpu, online } => guest.push(HotplugOp::Set { cpu, online }),
            Op::FlapOwner { domain } => guest.push(HotplugOp::FlapOwner {
                pmu: pmus[domain].clone(),
            }),
            Op::FailAt { cpu, online, pick } => {
                let Some(failable) = failable else {
                    bail!("a fail-injection step in a run that did not look for failable states");
                };
                guest.push(HotplugOp::FailAt {
                    cpu,
                    online,
                    state: failable.pick(pick),
                })
            }
            Op::SetAllowed {
                domain,
                ref cpus,
                parks,
            } => {
                if !guest.is_empty() {
                    out.push(Segment::Guest(std::mem::take(&mut guest)));
                }
                out.push(Segment::Allowed {
                    domain,
                    cpus,
                    parks,
                });
            }
        }
    }
    if !guest.is_empty() {
        out.push(Segment::Guest(guest));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stress_device_refuses_domains_that_cannot_park() {
        assert!(device(4, None).is_ok());
        assert!(device(16, Some("0-3:4-7:8-11:12-15")).is_ok());
        assert!(device(2, Some("0-1"))
            .unwrap_err()
            .to_string()
            .contains("without CPU 0"));
        assert!(device(4, Some("0-1:2-5")).is_err());
    }

    /// `stress`'s arguments, parsed as the command line would be.
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: StressArgs,
    }

    #[test]
    fn fail_injection_is_refused_where_no_step_would_deal_it() {
        use clap::Parser;
        assert!(Cli::try_parse_from(["stress", "--cycles", "20", "--fail-injection"]).is_ok());
        for other in [
            &["--lifecycle", "100"][..],
            &["--mutant", "x"],
            &["--mutants"],
            &["--normal"],
        ] {
            let line = [&["stress", "--fail-injection"][..], other].concat();
            let err = Cli::try_parse_from(line)
                .err()
                .unwrap_or_else(|| panic!("--fail-injection with {other:?} accepted"));
            assert!(err.to_string().contains("cannot be used with"), "{err}");
        }
    }

    #[test]
    fn arm64_refuses_what_its_guest_cannot_carry_out() {
        use clap::Parser;
        let parse = |extra: &[&str]| {
            let line = [&["stress", "--arch", "arm64"][..], extra].concat();
            Cli::try_parse_from(line).unwrap().args
        };
        for ok in [
            &["--cycles", "20"][..],
            &["--cycles", "20", "--fail-injection"],
            &["--lifecycle", "100"],
            &["--lifecycle", "100", "--rcutorture"],
            &["--normal"],
        ] {
            parse(ok).check_arch().unwrap();
        }
        for (refused, why) in [
            (&["--sanitize"][..], "--sanitize"),
            (&["--host", "vmm"], "--host"),
            (&["--mutants"], "--mutants"),
        ] {
            let err = parse(refused).check_arch().unwrap_err().to_string();
            assert!(err.starts_with(&format!("--arch arm64: {why}")), "{err}");
        }
        let x86 = Cli::try_parse_from(["stress", "--rcutorture", "--lifecycle", "9"]).unwrap();
        x86.args.check_arch().unwrap();
        assert_eq!(
            parse(&["--normal"]).guest_flags(),
            " --cpus 4 --arch arm64 --normal"
        );
        assert_eq!(x86.args.guest_flags(), " --cpus 4");
    }
}
