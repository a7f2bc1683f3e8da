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

mod placements;
mod rng;
pub mod schedule;
pub mod selftest;
mod traffic;

pub use rng::Rng;
pub use traffic::{Injector, Key};

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use perfbed_agent::{AgentMessage, HostRequest, HotplugBatchResult, HotplugOp, JobResult, JobSpec, PerfAttr, PerfIoctl};
use perfbed_device::regs::{self, Event};
use perfbed_device::{ControlClient, DeviceConfig, DeviceState};

use crate::cmd::human;
use crate::perf_abi::{FORMAT_GROUP, FORMAT_TOTAL_TIME_ENABLED, FORMAT_TOTAL_TIME_RUNNING};
use crate::guest::Guest;
use crate::image::{self, Variant};
use crate::l1box;
use crate::pmu_checks::{self, pmu_name};
use crate::scenario::{clean_log_check, Check};
use crate::vm::{self, Accel, Vm, VmConfig};
use placements::Placements;
use schedule::{Op, Step, Topology};
use traffic::TrafficStats;

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
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(2..=vm::MAX_CPUS as i64))]
    cpus: u8,
    /// The device's domains, e.g. 0-1:2-3 (default: the CPUs in two halves).
    #[arg(long)]
    domains: Option<String>,
    /// Boot the debug kernel (the default).
    #[arg(long, conflicts_with = "normal")]
    debug: bool,
    /// Boot the normal kernel instead of the debug one.
    #[arg(long)]
    normal: bool,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 512)]
    memory: u32,
    /// Seconds the boot, and each request to the guest, may take.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Which VMM runs the guest: perfbed's QEMU (the default), perfbed-vmm
    /// (`vmm`: on native KVM, else in the box), or `auto` (perfbed-vmm
    /// where the CPU has VT-x/SVM, else QEMU).
    #[arg(long, value_enum, default_value_t = vm::HostChoice::Qemu)]
    host: vm::HostChoice,
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
    pub timeout: Duration,
    pub replay: String,
}

pub fn run(ws: &Path, args: &StressArgs) -> Result<bool> {
    let seed = args.seed.unwrap_or_else(clock_seed);
    let variant = if args.normal { Variant::Normal } else { Variant::Debug };
    vm::check_size(args.cpus, args.memory)?;
    let device = device(args.cpus, args.domains.as_deref())?;
    let mut replay = format!("cargo xtask stress --cycles {} --seed {seed} --cpus {}", args.cycles, args.cpus);
    if let Some(domains) = &args.domains {
        let _ = write!(replay, " --domains {domains}");
    }
    if args.normal {
        replay += " --normal";
    }
    if args.host != vm::HostChoice::Qemu {
        let _ = write!(replay, " --host {}", args.host.name());
    }
    // Refuse a topology the schedule cannot use before minutes go into a build.
    schedule::generate(&topology(args.cpus, &device), seed, 1).map_err(|e| anyhow::anyhow!("{}", e.0))?;
    let images = image::ensure(ws, variant)?;
    let accel = vm::choose_accel();
    let (placement, why) = vm::choose_host(args.host, &accel);
    let host = l1box::build_host(ws, placement, &images.vmlinux, &images.initramfs)?;
    let config = StressConfig {
        vm: VmConfig { host, ..guest_vm(ws, &images, device, args.cpus, args.memory, "stress", Duration::from_secs(args.timeout)) },
        cycles: args.cycles,
        seed,
        timeout: Duration::from_secs(args.timeout),
        replay,
    };
    let under = match &config.vm.host {
        vm::Host::Qemu if accel.kvm => "QEMU on KVM".to_string(),
        vm::Host::Qemu => "QEMU TCG".to_string(),
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
fn guest_vm(ws: &Path, images: &image::Images, device: DeviceConfig, cpus: u8, memory_mib: u32, name: &str, boot_timeout: Duration) -> VmConfig {
    VmConfig {
        qemu: images.qemu.binary.clone(),
        firmware_dirs: images.qemu.firmware_dirs.clone(),
        device,
        vmlinux: images.vmlinux.clone(),
        initramfs: images.initramfs.clone(),
        cpus,
        memory_mib,
        extra_cmdline: vec![],
        host: vm::Host::Qemu,
        run_dir: vm::new_run_dir(ws, name),
        boot_timeout,
        gdb: None,
        verbose: false,
    }
}

fn clock_seed() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    now.as_secs() ^ u64::from(now.subsec_nanos())
}

/// The stress device: the given domains (default two halves), more slots
/// than the stress ever needs at once.
pub fn device(cpus: u8, domains: Option<&str>) -> Result<DeviceConfig> {
    let domains = match domains {
        Some(spec) => spec
            .split(':')
            .map(|d| perfbed_device::cpus::parse_cpu_list(d).map_err(|e| anyhow::anyhow!("--domains {spec:?}: {e}")))
            .collect::<Result<_>>()?,
        None => crate::default_domains(cpus),
    };
    let device = DeviceConfig { domains, rmids: RMIDS, slots: SLOTS, ..DeviceConfig::default() };
    device.validate().map_err(|e| anyhow::anyhow!("--domains: {e}"))?;
    if let Some(cpu) = device.domains.iter().flatten().find(|&&c| c >= u32::from(cpus)) {
        bail!("--domains allows CPU {cpu}, but the guest has CPUs 0-{}", cpus - 1);
    }
    if parking_domain(&device).is_none() {
        bail!("the stress needs a domain without CPU 0, to park (domains {})", domains_text(&device));
    }
    Ok(device)
}

fn domains_text(device: &DeviceConfig) -> String {
    device.domains.iter().map(|d| perfbed_agent::format_cpu_list(d)).collect::<Vec<_>>().join(":")
}

fn topology(cpus: u8, device: &DeviceConfig) -> Topology {
    Topology { cpus: u32::from(cpus), domains: device.domains.clone() }
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

/// An event the stress keeps open, and how its final read is checked.
struct Watched {
    name: String,
    handle: u32,
    kind: WatchedKind,
}

enum WatchedKind {
    /// One event, read as [value, enabled, running].
    Single(Key),
    /// A group read as [nr, enabled, running, total, local, occupancy].
    Group { domain: u32, rmid: u32 },
}

impl Watched {
    /// The words of a read that must never go down.
    fn cumulative_words(&self) -> &'static [usize] {
        match self.kind {
            WatchedKind::Single(_) => &[0],
            WatchedKind::Group { .. } => &[3, 4],
        }
    }
}

/// Everything the run saw.
pub struct StressReport {
    pub checks: Vec<Check>,
    cycles: usize,
    hotplug_writes: u64,
    schedule_time: Duration,
    op_time: Duration,
    placements: Placements,
    traffic: TrafficStats,
    loop_result: Option<JobResult>,
    reads: u64,
    counts_compared: usize,
    counts_lost: usize,
    open_retries: OpenRetries,
    seed: u64,
    replay: String,
    run_dir: PathBuf,
}

impl StressReport {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }

    pub fn text(&self) -> String {
        let mut out = format!("\nperfbed stress: {}\n", if self.passed() { "PASSED" } else { "FAILED" });
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        for check in &self.checks {
            let _ = writeln!(out, "  {}  {:width$}  {}", if check.passed { "PASS" } else { "FAIL" }, check.name, check.detail);
        }
        let secs = self.schedule_time.as_secs_f64().max(1e-9);
        let _ = writeln!(
            out,
            "  cycles {} in {} ({:.1}/s); hotplug operations {} ({:.1}/s, {:.1} ms each on average)",
            self.cycles,
            human(self.schedule_time),
            self.cycles as f64 / secs,
            self.hotplug_writes,
            self.hotplug_writes as f64 / secs,
            self.op_time.as_secs_f64() * 1000.0 / self.hotplug_writes.max(1) as f64,
        );
        let p = &self.placements;
        let _ = writeln!(out, "  PMUs: {} moves, {} parks, {} unparks seen in cpumask", p.moves, p.parks, p.unparks);
        if let Some(JobResult::OpenCloseLoop { attempts, opened, errors, read_errors }) = &self.loop_result {
            let _ = writeln!(out, "  open-close loop: {attempts} opens, {opened} opened, refused {}, read errors {}", histogram(errors), histogram(read_errors));
        }
        let r = &self.open_retries;
        let _ = writeln!(out, "  opens in the kernel (all PMUs, the whole run): {} waited for a move, {} tried again after one", r.waits, r.retries);
        let t = &self.traffic;
        let _ = writeln!(
            out,
            "  traffic: {} bursts ({:.1} MiB), {} rate changes, {} occupancy changes; {} reads of open events during hotplug",
            t.bursts,
            t.burst_bytes as f64 / (1u64 << 20) as f64,
            t.rate_changes,
            t.occupancy_changes,
            self.reads
        );
        let _ = writeln!(out, "  counts compared {}, lost {}", self.counts_compared, self.counts_lost);
        let _ = writeln!(out, "  run folder: {}", self.run_dir.display());
        if !self.passed() {
            let _ = writeln!(out, "  seed {}; replay with:\n    {}", self.seed, self.replay);
        }
        out
    }
}

fn histogram(map: &BTreeMap<String, u64>) -> String {
    if map.is_empty() {
        return "none".into();
    }
    map.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
}

/// Boots, runs the stress, powers off. An `Err` means the run could not
/// complete; it still names the seed, the replay and the kept logs.
pub fn execute(config: &StressConfig, accel: &Accel) -> Result<StressReport> {
    let steps = schedule::generate(&topology(config.vm.cpus, &config.vm.device), config.seed, config.cycles)
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
    if !report.passed() || !vm::kernel_log_problems(&log).is_empty() {
        keep_trace(&socket, &trace_file);
    }
    vm.power_off(Duration::from_secs(60)).map_err(failed)?;
    report.checks.push(clean_log_check(&config.vm.run_dir.join("serial.log")));
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
    let device = &config.vm.device;
    let run_dir = &config.vm.run_dir;
    let mut g = Guest { vm, timeout: config.timeout };
    g.expect_done(HostRequest::LoadModule { name: pmu_checks::MODULE.into() })?;
    let domains = device.domains.len();
    let pmus: Vec<String> = (0..domains).map(pmu_name).collect();
    let mut types = Vec::new();
    for pmu in &pmus {
        types.push(g.pmu_type(pmu)?);
    }
    let mut control = ControlClient::connect(&vm_control(run_dir)).context("connecting to the device's control socket")?;
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
            let key = Key { domain: d32, rmid: RMID_SINGLE, event };
            let handle = open(&mut g, attr(d, event, RMID_SINGLE, timed), None)?;
            watched.push(Watched { name: format!("{}/{event:?},rmid={RMID_SINGLE}/", pmu), handle, kind: WatchedKind::Single(key) });
            keys.push(key);
        }
        let leader = open(&mut g, attr(d, Event::MbmTotalBytes, RMID_GROUP, timed | FORMAT_GROUP), None)?;
        open(&mut g, attr(d, Event::MbmLocalBytes, RMID_GROUP, 0), Some(leader))?;
        open(&mut g, attr(d, Event::LlcOccupancy, RMID_GROUP, 0), Some(leader))?;
        watched.push(Watched { name: format!("{} group rmid={RMID_GROUP}", pmu), handle: leader, kind: WatchedKind::Group { domain: d32, rmid: RMID_GROUP } });
        keys.push(Key { domain: d32, rmid: RMID_GROUP, event: Event::MbmTotalBytes });
        keys.push(Key { domain: d32, rmid: RMID_GROUP, event: Event::MbmLocalBytes });
        occupancy.push((d32, RMID_GROUP));
    }

    // The open-close loop: a gauge (no slot) and a slot event on each domain.
    let loop_attrs: Vec<PerfAttr> = (0..domains)
        .flat_map(|d| [attr(d, Event::LlcOccupancy, RMID_LOOP_OCCUPANCY, 0), attr(d, Event::MbmTotalBytes, RMID_LOOP_TOTAL, 0)])
        .collect();
    let loop_job = start_job(&mut g, JobSpec::OpenCloseLoop { attrs: loop_attrs, pause_us: 200 })?;

    // The real perf stat, on the domain that parks, by name (scaled to MB)
    // and by raw terms (bytes, exact).
    let stat_domain = parking_domain(device).expect("checked by device()");
    let (stat_job, named, raw) = start_perf_stat(&mut g, &pmus[stat_domain], RMID_PERF_STAT)?;
    let stat_key = Key { domain: stat_domain as u32, rmid: RMID_PERF_STAT, event: Event::MbmTotalBytes };
    keys.push(stat_key);

    // Everything is open and counting: the truth from here on is theirs.
    let before = control.state()?;
    let injector = Injector::start(ControlClient::connect(&vm_control(run_dir))?, keys.clone(), occupancy, device.unit_bytes, traffic_rng);

    let mut checks = Vec::new();
    let mut placements = Placements::default();
    let mut op_errors = Vec::new();
    // Each event's first bad read, and how many more.
    let mut read_problems: BTreeMap<u32, (String, u64)> = BTreeMap::new();
    let mut bad_read = |handle: u32, problem: String| read_problems.entry(handle).or_insert((problem, 0)).1 += 1;
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
        let ops: Vec<HotplugOp> = batch
            .iter()
            .flat_map(|s| &s.ops)
            .map(|op| match *op {
                Op::Set { cpu, online } => HotplugOp::Set { cpu, online },
                Op::FlapOwner { domain } => HotplugOp::FlapOwner { pmu: pmus[domain].clone() },
            })
            .collect();
        let op_count = ops.len();
        let request = HostRequest::HotplugBatch { ops, watch_pmus: pmus.clone(), read_handles: read_handles.clone() };
        let result: HotplugBatchResult = match g.ask(request)? {
            AgentMessage::HotplugBatch(result) => result,
            other => bail!("hotplug batch {batch_no}: {other:?}"),
        };
        check_batch_shape(&result, op_count, read_handles.len()).with_context(|| format!("hotplug batch {batch_no}"))?;
        placements.add(&result);
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
                        if matches!(w.kind, WatchedKind::Group { .. }) && values.first() != Some(&3) {
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
                    Err(errno) => bad_read(w.handle, format!("{} read failed after batch {batch_no} op {i}: {errno}", w.name)),
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
            WatchedKind::Group { domain, rmid } => vec![(domain, rmid, Event::MbmTotalBytes), (domain, rmid, Event::MbmLocalBytes)],
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
    let stat_result = stop_job(&mut g, stat_job, libc::SIGINT)?;

    // The events were open before the schedule started and are read after it
    // ended; the guest's clock runs with the host's (90 %: clock slack).
    let min_enabled_ns = (schedule_time.as_nanos() * 9 / 10) as u64;
    let mut tally = check_finals(&watched, &finals, &before, &after, device.unit_bytes, min_enabled_ns);
    let delta = |key: Key| after.truth(key.domain, key.rmid, key.event).wrapping_sub(before.truth(key.domain, key.rmid, key.event));
    let stat_truth = delta(stat_key);
    let stat_detail = match perf_stat_counts(&stat_result, &named, &raw) {
        Ok(stat) => {
            tally.compare(format!("perf stat {raw}"), stat.raw_bytes, stat_truth);
            let truth_mb = stat_truth as f64 / (1u64 << 20) as f64;
            // perf prints MB with two decimals: equal to the truth rounded so.
            if (stat.named_mb - truth_mb).abs() > 0.0051 {
                tally.count_problems.push(format!("perf stat {named}: {:.2} MB, the device's truth {truth_mb:.4} MB", stat.named_mb));
            }
            if stat.run_ns.iter().any(|&ns| ns < min_enabled_ns as f64) {
                tally.time_problems.push(format!("perf stat counted for {:?} ns of a run of at least {min_enabled_ns} ns", stat.run_ns));
            }
            if stat.running_pct.iter().any(|&p| p < 100.0) {
                tally.time_problems.push(format!("perf stat ran {:?} % of the time", stat.running_pct));
            }
            format!("perf stat -a: {:.2} MB and {} bytes, truth {} bytes, running {:?} %", stat.named_mb, stat.raw_bytes, stat_truth, stat.running_pct)
        }
        Err(e) => {
            tally.count_problems.push(format!("perf stat: {e:#}"));
            String::new()
        }
    };

    checks.push(Check::from_problems("hotplug operations", op_errors, format!("{} sysfs writes, all succeeded", writes)));
    let read_problems = read_problems.into_values().map(|(first, n)| if n > 1 { format!("{first} (and {} more bad reads)", n - 1) } else { first }).collect();
    checks.push(Check::from_problems("reads during hotplug", read_problems, format!("{reads} reads, none failed or went down")));
    checks.push(Check::from_problems(
        "exact counts",
        cap(tally.count_problems),
        format!("{} counts equal the device's truth; {stat_detail}", tally.compared),
    ));
    checks.push(Check::from_problems("time running", tally.time_problems, "time_running == time_enabled for every event".into()));
    let mut placement_problems = placements.odd.clone();
    if placements.parks == 0 || placements.unparks == 0 || placements.moves == 0 {
        placement_problems.push(format!("the run saw {} moves, {} parks, {} unparks: some kind never happened", placements.moves, placements.parks, placements.unparks));
    }
    checks.push(Check::from_problems("moves and parks", placement_problems, format!("{} moves, {} parks, {} unparks", placements.moves, placements.parks, placements.unparks)));
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

/// Final counts against the device's truth.
#[derive(Default)]
struct Tally {
    /// The device's counter unit in bytes.
    unit: u64,
    compared: usize,
    lost: usize,
    count_problems: Vec<String>,
    time_problems: Vec<String>,
}

impl Tally {
    /// `got` against the `truth` in bytes. The device counts whole units
    /// from a slot's assignment (before the traffic started), so an exact
    /// count is the truth rounded down to a whole unit: the rest of the last
    /// unit is traffic no counter shows.
    fn compare(&mut self, name: String, got: u64, truth: u64) {
        self.compared += 1;
        let want = regs::whole_units(truth, self.unit);
        if got != want {
            self.lost += 1;
            let how = if got < want { format!("lost {}", want - got) } else { format!("{} too many", got - want) };
            self.count_problems.push(format!("{name}: counted {got}, the device's truth {truth} ({want} in whole units; {how} bytes)"));
        }
    }

    /// Not multiplexed: running == enabled; and enabled all along: at
    /// least `min_enabled_ns` (an event whose clock stopped at a park would
    /// otherwise still claim 100 % running).
    fn times(&mut self, name: &str, enabled: Option<&u64>, running: Option<&u64>, min_enabled_ns: u64) {
        if enabled.is_none() || enabled != running {
            self.time_problems.push(format!("{name}: enabled {enabled:?}, running {running:?}"));
        } else if enabled < Some(&min_enabled_ns) {
            self.time_problems.push(format!("{name}: enabled for {:?} ns of a run of at least {min_enabled_ns} ns", enabled.copied().unwrap_or(0)));
        }
    }
}

/// Each watched event's final read against the truth that landed between
/// `before` (all open, no traffic yet) and `after` (all landed).
/// Every event was open for at least `min_enabled_ns`.
fn check_finals(watched: &[Watched], finals: &[Vec<u64>], before: &DeviceState, after: &DeviceState, unit: u64, min_enabled_ns: u64) -> Tally {
    let mut tally = Tally { unit, ..Tally::default() };
    let delta = |domain, rmid, event| after.truth(domain, rmid, event).wrapping_sub(before.truth(domain, rmid, event));
    if finals.len() != watched.len() {
        tally.count_problems.push(format!("{} final reads for {} events", finals.len(), watched.len()));
    }
    for (w, v) in watched.iter().zip(finals) {
        match w.kind {
            WatchedKind::Single(key) => {
                tally.compare(w.name.clone(), v.first().copied().unwrap_or(0), delta(key.domain, key.rmid, key.event));
                tally.times(&w.name, v.get(1), v.get(2), min_enabled_ns);
            }
            WatchedKind::Group { domain, rmid } => {
                // nr, enabled, running, then the three values in open order.
                let [3, enabled, running, total, local, occupancy] = v[..] else {
                    tally.count_problems.push(format!("{}: read {v:?}, not a group of 3", w.name));
                    continue;
                };
                tally.compare(format!("{} mbm_total_bytes", w.name), total, delta(domain, rmid, Event::MbmTotalBytes));
                tally.compare(format!("{} mbm_local_bytes", w.name), local, delta(domain, rmid, Event::MbmLocalBytes));
                let held = after.domains.get(domain as usize).and_then(|d| d.occupancy.iter().find(|o| o.rmid == rmid)).map_or(0, |o| o.bytes);
                let gauge = regs::whole_units(held, unit);
                if occupancy != gauge {
                    tally.count_problems.push(format!("{} llc_occupancy: read {occupancy}, the device holds {gauge}", w.name));
                }
                tally.times(&w.name, Some(&enabled), Some(&running), min_enabled_ns);
            }
        }
    }
    tally
}

/// The first problems of a long list, and how many more.
fn cap(mut problems: Vec<String>) -> Vec<String> {
    const SHOWN: usize = 8;
    if problems.len() > SHOWN {
        let more = problems.len() - SHOWN;
        problems.truncate(SHOWN);
        problems.push(format!("and {more} more"));
    }
    problems
}

fn open(g: &mut Guest, attr: PerfAttr, group: Option<u32>) -> Result<u32> {
    match g.open(attr.clone(), group)? {
        Ok(handle) => Ok(handle),
        Err(errno) => bail!("opening {attr:?}: {errno}"),
    }
}

/// Starts the real `perf stat -a` on `mbm_total_bytes` of `rmid` on `pmu`,
/// by name (scaled to MB) and by raw terms (bytes, exact), once it is
/// counting. Returns the job and the two event specs, for
/// [`perf_stat_counts`].
fn start_perf_stat(g: &mut Guest, pmu: &str, rmid: u32) -> Result<(u32, String, String)> {
    let named = format!("{pmu}/mbm_total_bytes,rmid={rmid}/");
    let raw = format!("{pmu}/event={:#04x},rmid={rmid}/", Event::MbmTotalBytes as u64);
    let argv = ["/usr/bin/perf", "stat", "-a", "-x,", "-e", &named, "-e", &raw].iter().map(|s| s.to_string()).collect();
    let job = start_job(g, JobSpec::Process { argv, perf_fds: 2, settle_ms: 200 })?;
    Ok((job, named, raw))
}

fn start_job(g: &mut Guest, spec: JobSpec) -> Result<u32> {
    match g.ask(HostRequest::StartJob { spec: spec.clone() })? {
        AgentMessage::JobStarted { job } => Ok(job),
        other => bail!("starting {spec:?}: {other:?}"),
    }
}

/// An answer with as many op results as ops, each with one read per
/// handle. Anything else means bytes were lost between the agent and us
/// (the lost bytes of a 130 KB answer once spliced into valid JSON that
/// handed one event's reads to another), and no value in it can be trusted.
fn check_batch_shape(result: &HotplugBatchResult, ops: usize, handles: usize) -> Result<()> {
    if result.ops.len() != ops {
        bail!("the agent's answer has {} op results for {ops} ops: the channel lost or mangled data", result.ops.len());
    }
    if let Some((i, op)) = result.ops.iter().enumerate().find(|(_, op)| op.reads.len() != handles) {
        bail!("the agent's answer for op {i} has {} reads for {handles} events: the channel lost or mangled data", op.reads.len());
    }
    Ok(())
}

/// What CPU hotplug cost the opens inside the kernel, which user space does
/// not see: the device-scope PMUs' sysfs `open_waits` and `open_retries`
/// (patch 0007), summed over the PMUs.
#[derive(Debug, Default)]
struct OpenRetries {
    waits: u64,
    retries: u64,
}

fn kernel_open_retries(g: &mut Guest, pmus: &[String]) -> Result<OpenRetries> {
    let mut total = OpenRetries::default();
    for pmu in pmus {
        let (waits, retries) = g.open_waits_and_retries(pmu)?;
        total.waits += waits;
        total.retries += retries;
    }
    Ok(total)
}

fn stop_job(g: &mut Guest, job: u32, signal: i32) -> Result<JobResult> {
    match g.ask(HostRequest::StopJob { job, signal, timeout_ms: 20_000 })? {
        AgentMessage::JobDone(result) => Ok(result),
        other => bail!("stopping job {job}: {other:?}"),
    }
}

/// Opens may be refused with ENODEV while their domain is parked; EBUSY,
/// or anything else, is a failure of the kernel's retry.
fn open_loop_check(result: &JobResult) -> Check {
    let JobResult::OpenCloseLoop { attempts, opened, errors, read_errors } = result else {
        return Check::from_problems("open-close loop", vec![format!("not a loop result: {result:?}")], String::new());
    };
    let mut problems = Vec::new();
    let unexpected: BTreeMap<String, u64> = errors.iter().filter(|(k, _)| k.as_str() != "ENODEV").map(|(k, v)| (k.clone(), *v)).collect();
    if !unexpected.is_empty() {
        problems.push(format!("{attempts} opens: refused {}", histogram(&unexpected)));
    }
    if !read_errors.is_empty() {
        problems.push(format!("reads failed: {}", histogram(read_errors)));
    }
    if *opened == 0 {
        problems.push(format!("none of {attempts} opens succeeded"));
    }
    Check::from_problems("open-close loop", problems, format!("{attempts} opens, {opened} opened, refused {} (ENODEV only while parked)", histogram(errors)))
}

fn violations_check(state: &DeviceState) -> Check {
    let problems: Vec<String> = state
        .domains
        .iter()
        .filter(|d| d.violations != 0)
        .map(|d| format!("domain {}: {} placement violations by vCPU {:?}", d.domain, d.violations, d.violations_by_vcpu))
        .collect();
    let reads: u64 = state.domains.iter().flat_map(|d| d.counter_reads_by_vcpu.values()).sum();
    Check::from_problems("placement violations", problems, format!("0 in {reads} counter reads"))
}

struct StatCounts {
    named_mb: f64,
    raw_bytes: u64,
    running_pct: Vec<f64>,
    /// The events' counted time in ns.
    run_ns: Vec<f64>,
}

/// perf stat's CSV (`-x,`): value,unit,event,run time,percentage running,...
/// where the event is printed as given on the command line.
fn perf_stat_counts(result: &JobResult, named: &str, raw: &str) -> Result<StatCounts> {
    let JobResult::Process { status, stderr, .. } = result else { bail!("not a process result: {result:?}") };
    let field = |spec: &str| -> Result<(f64, f64, f64)> {
        let line = stderr.lines().find(|l| l.contains(&format!(",{spec},"))).with_context(|| format!("no line for {spec} (exit {status:?}): {}", stderr.trim()))?;
        let (head, tail) = line.split_once(&format!(",{spec},")).expect("found above");
        let value = head.split(',').next().unwrap_or("");
        let run_ns = tail.split(',').next().unwrap_or("");
        let pct = tail.split(',').nth(1).unwrap_or("");
        let value: f64 = value.parse().with_context(|| format!("{spec}: value {value:?} in {line:?}"))?;
        let pct: f64 = pct.parse().with_context(|| format!("{spec}: percentage {pct:?} in {line:?}"))?;
        let run_ns: f64 = run_ns.parse().with_context(|| format!("{spec}: run time {run_ns:?} in {line:?}"))?;
        Ok((value, pct, run_ns))
    };
    let (named_mb, named_pct, named_ns) = field(named)?;
    let (raw_bytes, raw_pct, raw_ns) = field(raw)?;
    Ok(StatCounts { named_mb, raw_bytes: raw_bytes as u64, running_pct: vec![named_pct, raw_pct], run_ns: vec![named_ns, raw_ns] })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_that_lost_data_is_refused() {
        use perfbed_agent::HotplugOpResult;
        let op = |reads: usize| HotplugOpResult {
            us: 1,
            writes: 1,
            error: None,
            masks: vec![],
            between: vec![],
            online: "0-3".into(),
            reads: vec![Ok(vec![1, 2, 3]); reads],
        };
        let batch = |ops: Vec<HotplugOpResult>| HotplugBatchResult { masks_before: vec![], ops };
        assert!(check_batch_shape(&batch(vec![op(2), op(2)]), 2, 2).is_ok());
        // Ops lost; one op's reads spliced with another's.
        assert!(check_batch_shape(&batch(vec![op(2)]), 2, 2).is_err());
        assert!(check_batch_shape(&batch(vec![op(2), op(5)]), 2, 2).is_err());
    }

    #[test]
    fn perf_stat_csv_is_parsed_and_garbage_refused() {
        let named = "perfbed_l3_1/mbm_total_bytes,rmid=3/";
        let raw = "perfbed_l3_1/event=0x02,rmid=3/";
        let stderr = format!("12.50,MB,{named},4000000000,100.00,,\n13107200,,{raw},4000000000,100.00,,\n");
        let result = JobResult::Process { status: Some(0), stdout: String::new(), stderr };
        let c = perf_stat_counts(&result, named, raw).unwrap();
        assert_eq!((c.named_mb, c.raw_bytes, c.running_pct.clone()), (12.5, 13_107_200, vec![100.0, 100.0]));
        let bad = JobResult::Process { status: Some(1), stdout: String::new(), stderr: format!("<not counted>,,{raw},0,0.00,,\n") };
        assert!(perf_stat_counts(&bad, named, raw).is_err());
    }

    #[test]
    fn final_counts_must_equal_the_truth_exactly() {
        use perfbed_device::Device;
        let config = DeviceConfig { slots: SLOTS, rmids: RMIDS, ..DeviceConfig::default() };
        let mut dev = Device::new(config).unwrap();
        let before = dev.state(0);
        dev.inject(0, 1, 1, Event::MbmTotalBytes, 64 * 1000).unwrap();
        dev.inject(0, 1, 2, Event::MbmTotalBytes, 64 * 7).unwrap();
        dev.inject(0, 1, 2, Event::MbmLocalBytes, 64 * 3).unwrap();
        dev.set_occupancy(1, 2, 64 * 5).unwrap();
        let after = dev.state(1_000_000_000);
        let watched = vec![
            Watched { name: "single".into(), handle: 1, kind: WatchedKind::Single(Key { domain: 1, rmid: 1, event: Event::MbmTotalBytes }) },
            Watched { name: "group".into(), handle: 2, kind: WatchedKind::Group { domain: 1, rmid: 2 } },
        ];
        let good = vec![vec![64_000, 10, 10], vec![3, 10, 10, 448, 192, 320]];
        let t = check_finals(&watched, &good, &before, &after, 64, 10);
        assert_eq!((t.compared, t.lost), (3, 0));
        assert!(t.count_problems.is_empty() && t.time_problems.is_empty(), "{:?} {:?}", t.count_problems, t.time_problems);

        // One unit short, a stopped clock, a wrong gauge, a short read.
        let bad = vec![vec![63_936, 10, 9], vec![3, 10, 10, 448, 192, 256]];
        let t = check_finals(&watched, &bad, &before, &after, 64, 10);
        assert_eq!((t.compared, t.lost), (3, 1));
        assert_eq!(t.count_problems.len(), 2, "{:?}", t.count_problems);
        assert!(t.count_problems[0].contains("lost 64"));
        assert_eq!(t.time_problems.len(), 1);
        let short = vec![vec![64_000, 10, 10], vec![3, 10, 10]];
        let t = check_finals(&watched, &short, &before, &after, 64, 10);
        assert!(t.count_problems[0].contains("not a group of 3"));
        // A clock that stopped: exact so far, but enabled for too short.
        let t = check_finals(&watched, &good, &before, &after, 64, 11);
        assert_eq!(t.time_problems.len(), 2, "{:?}", t.time_problems);
    }

    #[test]
    fn the_open_loop_fails_on_ebusy_and_passes_enodev() {
        let result = |errors: &[(&str, u64)]| JobResult::OpenCloseLoop {
            attempts: 100,
            opened: 90,
            errors: errors.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            read_errors: BTreeMap::new(),
        };
        assert!(open_loop_check(&result(&[("ENODEV", 10)])).passed);
        assert!(!open_loop_check(&result(&[("ENODEV", 5), ("EBUSY", 5)])).passed);
    }

    #[test]
    fn the_stress_device_refuses_domains_that_cannot_park() {
        assert!(device(4, None).is_ok());
        assert!(device(16, Some("0-3:4-7:8-11:12-15")).is_ok());
        assert!(device(2, Some("0-1")).unwrap_err().to_string().contains("without CPU 0"));
        assert!(device(4, Some("0-1:2-5")).is_err());
    }
}
