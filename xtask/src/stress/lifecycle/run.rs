//! The lifecycle stress on a booted guest: draws steps from the generator,
//! carries them out (perf operations through the agent, in batches; traffic
//! through the control socket, landed before the next step; hotplug through
//! the agent), journals every result, and replays the journal through the
//! model at the end.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use perfbed_agent::{AgentMessage, HostRequest, HotplugOp, JobResult, JobSpec, PerfAttr, PerfOp};
use perfbed_device::cpus::parse_cpu_list;
use perfbed_device::{ClientError, ControlClient, DeviceConfig};

use crate::build::image::arch::Arch;
use crate::checks::pmu::multiplexing;
use crate::checks::Check;
use crate::guest::perf_abi::{
    FLAG_DISABLED, FLAG_EXCLUSIVE, FLAG_PINNED, FORMAT_GROUP, FORMAT_ID, FORMAT_LOST,
    FORMAT_TOTAL_TIME_ENABLED, FORMAT_TOTAL_TIME_RUNNING, PERF_COUNT_SW_CPU_CLOCK,
    PERF_TYPE_SOFTWARE,
};
use crate::guest::Guest;
use crate::model::{DeviceShape, Handle};
use crate::progress::human;

use super::super::jobs::{start_job, stop_job};
use super::flows::Flows;
use super::generate::{Generator, RMID_LOOP, RMID_RATE};
use super::irq_affinity::{placement_step, IrqLines};
use super::journal::{
    self, mbm_event, perf_op, Condition, Cpus, Entry, Header, Malformed, Opened, Step, PARKED,
};
use super::replay::{replay_on, Finding};

/// Perf steps sent to the agent in one request, at most.
const BATCH: usize = 32;

/// What a lifecycle run is.
#[derive(Clone)]
pub struct LifecycleConfig {
    pub ops: u32,
    pub seed: u64,
    pub timeout: Duration,
    /// The command that runs it again.
    pub replay: String,
    /// Stop at the first mismatch (a planted bug's run: how soon it is caught).
    pub stop_at_first: bool,
    /// Also ioctls on events of parked PMUs (unless `--no-parked-ioctls`).
    pub parked_ioctls: bool,
    /// A `cargo xtask run` check to run before the random operations: the
    /// one a kernel mutant names as the check that must catch it.
    pub run_check: Option<String>,
    /// Shrink a failing run to a scenario within this budget (`None`:
    /// `--no-shrink`).
    pub shrink: Option<super::shrink::Shrinking>,
    /// rcutorture's onoff takes CPUs offline and back behind the host's
    /// back (`--rcutorture`): the host reads the CPUs and placements after
    /// every step and journals what changed (see [`Step::Seen`]).
    pub rcutorture: bool,
    /// Stretches in which a thread of the guest moves a PMU while the
    /// operations go on (`--moving-thread`, see
    /// [`Generator::with_moving_thread`]).
    pub moving_thread: bool,
    /// Steady rates on counters that open events count, the device's truth
    /// measured around every step while they flow (`--watched-rates`, see
    /// [`Generator::with_watched_rates`]).
    pub watched_rates: bool,
}

/// With `stop_at_first`, how many operations between two replays.
const REPLAY_EVERY: usize = 40;

/// What a lifecycle run saw.
pub struct LifecycleReport {
    pub checks: Vec<Check>,
    /// How many of `checks` ran before the random operations (the first ones).
    pub prologue: usize,
    pub steps: usize,
    pub time: Duration,
    /// The first finding, with the step it is about.
    pub first: Option<(Finding, Step)>,
    pub findings: usize,
    pub ebusy: u64,
    pub longest_open_ns: u64,
    pub journal: PathBuf,
    /// The first move, park or unpark after which the interrupt's affinity
    /// did not follow the PMU.
    pub first_affinity: Option<usize>,
    /// Per PMU, the kernel's own figures at the end (patch
    /// 0006): opens that waited for a move, the longest such sleep and the
    /// longest move. Reported, not judged: a timing on a shared machine.
    pub waits: Vec<OpenWaits>,
    /// The failing run shrunk to a scenario, or why not.
    pub shrunk: Option<String>,
    /// With rcutorture: what the host saw of it (see [`behind_its_back`]).
    pub behind: Option<String>,
    /// The moving thread's stretches, if it ran (see [`Stretches`]).
    pub stretches: Option<Stretches>,
    /// The watched rates, if any flowed (see [`Flowing`]).
    pub flowing: Option<Flowing>,
}

/// What a run's watched rates did: the rates started on watched counters,
/// the steps measured while one flowed, the reads among them, and the
/// bytes the journal has as landed on those counters.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Flowing {
    pub rates: usize,
    pub steps: usize,
    pub reads: usize,
    pub bytes: u64,
}

impl Flowing {
    /// The watched rates of `journal`, or `None` where none started.
    pub fn of(journal: &[Entry]) -> Option<Flowing> {
        let mut out = Flowing::default();
        for e in journal {
            if let Step::Rate {
                rmid,
                bytes_per_sec,
                ..
            } = e.step
            {
                out.rates += usize::from(rmid != RMID_RATE && bytes_per_sec > 0);
            }
            if !e.flowed.is_empty() {
                out.steps += 1;
                out.reads += usize::from(matches!(e.step, Step::Read { .. }));
                out.bytes += e.flowed.iter().map(|f| f.before + f.during).sum::<u64>();
            }
        }
        (out.rates > 0).then_some(out)
    }
}

/// What a run's moving thread did: its stretches (a start to its stop),
/// the rounds it made in them (each of its CPUs offline and back), the
/// operations between each start and stop and the reads among them (reads
/// that may race a move).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Stretches {
    pub stretches: usize,
    pub rounds: u64,
    pub ops: usize,
    pub reads: usize,
}

impl Stretches {
    /// The stretches of `journal`, or `None` where no thread started.
    pub fn of(journal: &[Entry]) -> Option<Stretches> {
        let mut out = Stretches::default();
        let mut within = false;
        for e in journal {
            match (&e.step, &e.result) {
                (Step::MovesStart { .. }, _) => {
                    out.stretches += 1;
                    within = true;
                }
                (Step::MovesStop { .. }, result) => {
                    out.rounds += result
                        .as_ref()
                        .ok()
                        .and_then(|w| w.first())
                        .copied()
                        .unwrap_or(0);
                    within = false;
                }
                (step, _) if within => {
                    out.ops += 1;
                    out.reads += usize::from(matches!(step, Step::Read { .. }));
                }
                _ => {}
            }
        }
        (out.stretches > 0).then_some(out)
    }
}

/// One PMU's open-wait figures from sysfs.
pub struct OpenWaits {
    pub pmu: String,
    pub waits: u64,
    pub longest_sleep_ns: u64,
    pub longest_move_ns: u64,
}

impl LifecycleReport {
    /// Lines for the stress report.
    pub fn text(&self, config: &LifecycleConfig) -> String {
        let secs = self.time.as_secs_f64().max(1e-9);
        let mut out = format!(
            "  lifecycle: {} operations in {} ({:.1}/s), {} mismatches against the model, {} EBUSY, longest open {:.1} ms\n",
            self.steps,
            human(self.time),
            self.steps as f64 / secs,
            self.findings,
            self.ebusy,
            self.longest_open_ns as f64 / 1e6,
        );
        if let Some((finding, step)) = &self.first {
            let _ = writeln!(
                out,
                "  first mismatch at operation {} ({step:?}):\n    {}",
                finding.index, finding.text
            );
            let _ = writeln!(
                out,
                "  seed {}; replay with:\n    {}",
                config.seed, config.replay
            );
        }
        for w in &self.waits {
            let _ = writeln!(
                out,
                "  {}: {} opens waited for a move, the longest sleep {:.1} ms, the longest move {:.1} ms{}",
                w.pmu,
                w.waits,
                w.longest_sleep_ns as f64 / 1e6,
                w.longest_move_ns as f64 / 1e6,
                if w.longest_sleep_ns > w.longest_move_ns {
                    " (a sleep longer than any move: the wake-up ran late, or one open waited for two moves)"
                } else {
                    ""
                }
            );
        }
        if let Some(behind) = &self.behind {
            let _ = writeln!(out, "  {behind}");
        }
        if let Some(s) = &self.stretches {
            let _ = writeln!(
                out,
                "  moving thread: {} stretches, {} rounds; {} operations within them, {} of them reads",
                s.stretches, s.rounds, s.ops, s.reads
            );
        }
        if let Some(f) = &self.flowing {
            let _ = writeln!(
                out,
                "  watched rates: {} started; {} operations measured while they flowed, {} of them reads; {:.1} MiB landed on watched counters",
                f.rates,
                f.steps,
                f.reads,
                f.bytes as f64 / f64::from(1 << 20)
            );
        }
        if let Some(shrunk) = &self.shrunk {
            let _ = writeln!(out, "  {shrunk}");
        }
        let _ = writeln!(out, "  journal: {}", self.journal.display());
        out
    }

    /// The index of the first operation that failed, if any: a mismatch
    /// against the model, or an interrupt affinity left behind.
    pub fn caught_at(&self) -> Option<usize> {
        let mismatch = self.first.as_ref().map(|(f, _)| f.index);
        match (mismatch, self.first_affinity) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The device shape of the model, from the device's configuration.
pub fn shape(device: &DeviceConfig) -> DeviceShape {
    DeviceShape {
        pmus: device.domains.len() as u32,
        slots: device.slots,
        unit_bytes: device.unit_bytes,
        counter_width: device.counter_width,
        max_rate: device.max_rate,
        lined_pmus: crate::host::config::device_gsis(device.domains.len()).len() as u32,
    }
}

/// Nanoseconds since `start`.
fn since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Runs the lifecycle stress on a guest of `cpus` vCPUs; `pmus[d]` is
/// domain `d`'s PMU, `types[d]` its type.
#[allow(clippy::too_many_arguments)]
pub fn run(
    g: &mut Guest,
    cpus: u32,
    control: &mut ControlClient,
    device: &DeviceConfig,
    pmus: &[String],
    types: &[u32],
    config: &LifecycleConfig,
    run_dir: &Path,
) -> Result<LifecycleReport> {
    let shape = shape(device);
    let mut owners = Vec::new();
    for pmu in pmus {
        owners.push(g.cpumask(pmu)?.first().copied());
    }
    let first_handle = probe_next_handle(g)?;
    // Each PMU's interrupt line follows it (`irq_affinity.rs`).
    let (irqs, mut affinity_problems) = IrqLines::read(g, pmus)?;
    let lines = crate::host::config::device_gsis(pmus.len()).len();
    let mut affinity_checked = 0u64;
    let mut first_affinity: Option<usize> = None;
    let start_cpus = Cpus {
        domains: device.domains.clone(),
        owners: owners.clone(),
    };
    let mut generator = Generator::new(
        config.seed,
        shape,
        device.domains.clone(),
        cpus,
        owners,
        first_handle,
    )
    .with_parked_ioctls(config.parked_ioctls)
    .with_cpus_behind_its_back(config.rcutorture)
    .with_moving_thread(config.moving_thread)
    .with_watched_rates(config.watched_rates)
    .with_cpu0_offline(g.vm.arch == Arch::Arm64)
    .with_perf_stat(g.vm.arch == Arch::X86_64);
    let attr = |o: &Opened| attr_of(o, types);
    let mut watch = config
        .rcutorture
        .then(|| Watch::new(device, owners_words(&start_cpus.owners), cpus));

    // Opens racing moves: a loop of gauge opens on every PMU, all run long.
    let loop_attrs: Vec<PerfAttr> = (0..pmus.len())
        .map(|d| PerfAttr {
            type_: types[d],
            config: 1 | u64::from(RMID_LOOP) << 8,
            ..PerfAttr::default()
        })
        .collect();
    let loop_job = start_job(
        g,
        JobSpec::OpenCloseLoop {
            attrs: loop_attrs,
            pause_us: 500,
        },
    )?;
    let mut journal: Vec<Entry> = (0..pmus.len() as u32)
        .map(|domain| Entry {
            step: Step::OthersOpen { domain },
            result: Ok(vec![]),
            took_ns: 0,
            at_ns: 0,
            returned_ns: 0,
            flowed: Vec::new(),
        })
        .collect();

    let start = Instant::now();
    let mut last_progress = start;
    // Perf steps not sent yet, each open with whether the generator took it
    // in (expects it to open).
    let mut pending: Vec<(Step, bool)> = Vec::new();
    let mut desync = false;
    let mut replayed_at = 0;
    // The watched counters steady traffic flows into (`--watched-rates`).
    let mut flows = Flows::default();
    // Sends the pending batch, then tells the generator of refused opens
    // and what was read behind the host's back.
    macro_rules! flush {
        () => {
            flush_watched(
                g,
                &mut pending,
                &attr,
                &mut journal,
                start,
                &mut watch,
                pmus,
                &mut generator,
            )?
        };
    }
    // Carries out a host step at once and journals it, with the steady
    // traffic that flowed around it if `before` is the truth sampled just
    // before it.
    macro_rules! host {
        ($step:expr, $before:expr) => {{
            let step = with_started_job($step, &journal)?;
            let mut entry = host_step(g, control, device, pmus, step, config.timeout, start)?;
            if let Some(before) = $before {
                flows.after(control, before, &mut entry)?;
            }
            // Placements by the generator's moves, parks and unparks, of
            // a domain on its default set (an allowed set's is the
            // `allowed sets` checks').
            if let Some(d) =
                placement_step(&entry.step).filter(|_| !matches!(entry.step, Step::Allowed { .. }))
            {
                let at = format!("operation {}", journal.len());
                let allowed = &device.domains[d as usize];
                if let Some(problem) = irqs.after(g, &entry, Some(d), allowed, &at)? {
                    first_affinity.get_or_insert(journal.len());
                    affinity_problems.push(problem);
                }
                affinity_checked += 1;
            }
            generator.observe(&entry);
            journal.push(entry);
            if let Some(w) = &mut watch {
                w.read(g, pmus, &mut journal, start, &mut generator)?;
            }
        }};
    }
    // Carries out a step: a perf step into the pending batch, a host step
    // at once; while steady traffic flows on a watched counter, each step
    // alone, the flowing counters' truth measured around it.
    macro_rules! carry {
        ($step:expr) => {{
            let step: Step = $step;
            let opens =
                matches!(step, Step::Open { expect, .. } if generator.format(expect).is_some());
            if flows.around(&step) {
                desync |= flush!();
                let before = flows.before(control, &step)?;
                if perf_op(&step, attr).is_some() {
                    let at = journal.len();
                    pending.push((step, opens));
                    desync |= flush!();
                    flows.after(control, &before, &mut journal[at])?;
                } else {
                    host!(step, Some(&before));
                }
            } else if perf_op(&step, attr).is_some() {
                pending.push((step, opens));
                if pending.len() >= BATCH {
                    desync |= flush!();
                }
            } else {
                desync |= flush!();
                host!(step, None);
            }
        }};
    }
    while journal.len() < config.ops as usize
        && !desync
        && !(config.stop_at_first && first_affinity.is_some())
    {
        if config.stop_at_first && journal.len() >= replayed_at + REPLAY_EVERY {
            replayed_at = journal.len();
            if !replay_on(shape, &start_cpus, &journal).findings.is_empty() {
                break;
            }
        }
        if last_progress.elapsed() >= Duration::from_secs(60) {
            last_progress = Instant::now();
            crate::progress::say(&format!(
                "    lifecycle: {} of {} operations after {}",
                journal.len(),
                config.ops,
                human(start.elapsed())
            ));
        }
        let steps = generator.next();
        // Behind the host's back a PMU may park: an open may be refused,
        // and the generator must hear of it before it names the next handle.
        let opens_now = watch.is_some() && steps.iter().any(|s| matches!(s, Step::Open { .. }));
        for step in steps {
            carry!(step);
        }
        if opens_now {
            desync |= flush!();
        }
    }
    // A stretch or a watched rate still going on ends with the run.
    for step in generator.finish() {
        carry!(step);
    }
    desync |= flush!();
    let time = start.elapsed();
    let loop_result = stop_job(g, loop_job, 0)?;

    let journal_path = run_dir.join("lifecycle-journal.jsonl");
    let header = Header {
        pmus: shape.pmus,
        slots: shape.slots,
        unit_bytes: shape.unit_bytes,
        counter_width: shape.counter_width,
        max_rate: shape.max_rate,
        seed: config.seed,
        replay: config.replay.clone(),
        cpus: start_cpus.clone(),
    };
    std::fs::write(&journal_path, journal::to_text(&header, &journal)?)
        .with_context(|| format!("writing {}", journal_path.display()))?;

    let replayed = replay_on(shape, &start_cpus, &journal);
    if !replayed.findings.is_empty() {
        keep_assignments(control, run_dir, since(start))?;
    }
    let first = replayed
        .findings
        .first()
        .map(|f| (f.clone(), journal[f.index].step.clone()));
    let mut checks = Vec::new();
    let shown: Vec<String> = replayed
        .findings
        .iter()
        .take(8)
        .map(|f| format!("operation {}: {}", f.index, f.text))
        .collect();
    let mut problems = shown;
    if replayed.findings.len() > 8 {
        problems.push(format!("and {} more", replayed.findings.len() - 8));
    }
    if desync {
        problems.push(
            "an open's handle was not the one the generator expected: the run stopped there".into(),
        );
    }
    checks.push(Check::from_problems(
        "lifecycle against the model",
        problems,
        format!(
            "{} operations, {} reads, {} values, all as the model says",
            journal.len(),
            replayed.reads,
            replayed.values
        ),
    ));
    let affinity_count = affinity_problems.len();
    affinity_problems.truncate(8);
    if affinity_count > 8 {
        affinity_problems.push(format!("and {} more", affinity_count - 8));
    }
    checks.push(Check::from_problems(
        "interrupt follows the PMU",
        affinity_problems,
        format!(
            "after {affinity_checked} moves, parks and unparks: smp_affinity_list the owner, or outside a parked domain{}",
            if lines < pmus.len() {
                format!(" ({} of {} PMUs have a line; the rest are polled)", lines, pmus.len())
            } else {
                String::new()
            }
        ),
    ));
    let mut ebusy = replayed.ebusy;
    if let JobResult::OpenCloseLoop {
        attempts, errors, ..
    } = &loop_result
    {
        ebusy += errors.get("EBUSY").copied().unwrap_or(0);
        let bad: BTreeMap<&String, &u64> = errors
            .iter()
            .filter(|(k, _)| k.as_str() != "ENODEV")
            .collect();
        let problems = if bad.is_empty() {
            vec![]
        } else {
            vec![format!("{attempts} opens racing moves: refused {bad:?}")]
        };
        checks.push(Check::from_problems(
            "opens racing moves",
            problems,
            format!("{attempts} opens, refused {errors:?} (ENODEV only while parked)"),
        ));
    }
    Ok(LifecycleReport {
        checks,
        prologue: 0,
        waits: Vec::new(),
        shrunk: None,
        behind: config.rcutorture.then(|| behind_its_back(&journal)),
        stretches: Stretches::of(&journal),
        flowing: Flowing::of(&journal),
        steps: journal.len(),
        time,
        first,
        findings: replayed.findings.len(),
        ebusy,
        longest_open_ns: replayed.longest_open_ns,
        journal: journal_path,
        first_affinity,
    })
}

/// A moving thread's stop with the job of its start in `journal` (the
/// generator knows no job numbers); any other step as it is.
pub(super) fn with_started_job(step: Step, journal: &[Entry]) -> Result<Step> {
    match step {
        Step::MovesStop { domain, .. } => match journal::started_job(journal, domain) {
            Some(job) => Ok(Step::MovesStop { domain, job }),
            None => bail!("a stop of domain {domain}'s moving thread, which did not start"),
        },
        Step::StatStop { domain, rmid, .. } => match journal::started_stat(journal) {
            Some(job) => Ok(Step::StatStop { domain, rmid, job }),
            None => bail!("a stop of domain {domain}'s perf stat, which did not start"),
        },
        step => Ok(step),
    }
}

/// Saves the device's slot-level truth beside the journal for a run that
/// differed from the model (`lifecycle-assignments.json`): every slot
/// assignment with its device times, and `host_at_ns`, the journal's clock
/// (`at_ns`) at the device's `now_ns`, so that a journal entry's device time
/// is `now_ns - (host_at_ns - at_ns)`, to within the control socket's
/// round trip.
fn keep_assignments(control: &mut ControlClient, run_dir: &Path, host_at_ns: u64) -> Result<()> {
    let assignments = control.assignments(0)?;
    let text = serde_json::to_string(&serde_json::json!({
        "host_at_ns": host_at_ns,
        "assignments": assignments,
    }))?;
    let path = run_dir.join("lifecycle-assignments.json");
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// What a run with rcutorture saw of it: perf operations, the CPU changes
/// seen, and the unsure stretches (the steps judged only by what holds
/// across an unknown placement).
fn behind_its_back(journal: &[Entry]) -> String {
    let perf = journal
        .iter()
        .filter(|e| perf_op(&e.step, |_| PerfAttr::default()).is_some())
        .count();
    let (mut seen, mut stretches, mut steps) = (0, 0, 0);
    // The last reading: the CPUs online, each domain's CPU.
    let mut last: Option<(&[u32], &[u64])> = None;
    for e in journal {
        if let Step::Seen {
            online,
            unsure,
            window,
            ..
        } = &e.step
        {
            let now = (online.as_slice(), e.result.as_deref().unwrap_or_default());
            seen += usize::from(last.is_some_and(|l| l != now));
            last = Some(now);
            if !unsure.is_empty() {
                stretches += 1;
                steps += *window as usize;
            }
        }
    }
    format!(
        "rcutorture: {perf} perf operations; {seen} changes of CPUs or placements seen; {stretches} unsure stretches of {steps} steps in all"
    )
}

/// Each domain's CPU as a journal's words ([`PARKED`] for none).
fn owners_words(owners: &[Option<u32>]) -> Vec<u64> {
    owners.iter().map(|o| o.map_or(PARKED, u64::from)).collect()
}

/// What the host last read of the CPUs and placements that rcutorture's
/// onoff changes behind its back.
struct Watch {
    online: Vec<u32>,
    owners: Vec<u64>,
    /// When the last reading began, and the journal's length then.
    at: Instant,
    len: usize,
    /// The domains that can park (CPU 0, which cannot go offline, is in
    /// none of their CPUs).
    can_park: Vec<u32>,
}

impl Watch {
    fn new(device: &DeviceConfig, owners: Vec<u64>, cpus: u32) -> Watch {
        Watch {
            online: (0..cpus).collect(),
            owners,
            at: Instant::now(),
            len: 0,
            can_park: (0u32..)
                .zip(&device.domains)
                .filter(|(_, c)| !c.contains(&0))
                .map(|(d, _)| d)
                .collect(),
        }
    }

    /// Reads the CPUs online and each PMU's CPU, and journals a
    /// [`Step::Seen`]: `unsure` the domains whose park or placement it saw,
    /// or every domain that can park where the last reading began so long ago (half onoff's interval: two of its
    /// changes come at least the interval apart) that a park and a
    /// placement could both have come and gone unseen.
    fn read(
        &mut self,
        g: &mut Guest,
        pmus: &[String],
        journal: &mut Vec<Entry>,
        run_start: Instant,
        generator: &mut Generator,
    ) -> Result<()> {
        let began = Instant::now();
        let text = g.read_file("/sys/devices/system/cpu/online")?;
        let online = parse_cpu_list(text.trim())
            .map_err(|e| anyhow::anyhow!("/sys/devices/system/cpu/online {text:?}: {e}"))?;
        let mut owners = Vec::new();
        for pmu in pmus {
            owners.push(g.cpumask(pmu)?.first().copied());
        }
        let owners = owners_words(&owners);
        let long = self.at.elapsed() >= super::rcutorture::ONOFF_INTERVAL / 2;
        let unsure: Vec<u32> = (0u32..)
            .zip(owners.iter().zip(&self.owners))
            .filter(|&(d, (now, was))| {
                (now == &PARKED) != (was == &PARKED) || (long && self.can_park.contains(&d))
            })
            .map(|(d, _)| d)
            .collect();
        // Journaled every time: the reading's own time lies between the
        // operations either side (reads there are not at one moment).
        {
            let entry = Entry {
                step: Step::Seen {
                    online: online.clone(),
                    unsure,
                    window: u32::try_from(journal.len() - self.len).unwrap_or(u32::MAX),
                },
                result: Ok(owners.clone()),
                took_ns: since(began),
                at_ns: since(run_start),
                returned_ns: 0,
                flowed: Vec::new(),
            };
            generator.observe(&entry);
            journal.push(entry);
        }
        (self.online, self.owners, self.at, self.len) = (online, owners, began, journal.len());
        Ok(())
    }
}

/// [`flush`], then the generator told of refused opens and, behind the
/// host's back, the CPUs read; says whether an open gave a handle other
/// than expected (where no PMU can park behind the host's back).
#[allow(clippy::too_many_arguments)]
fn flush_watched(
    g: &mut Guest,
    pending: &mut Vec<(Step, bool)>,
    attr: &impl Fn(&Opened) -> PerfAttr,
    journal: &mut Vec<Entry>,
    run_start: Instant,
    watch: &mut Option<Watch>,
    pmus: &[String],
    generator: &mut Generator,
) -> Result<bool> {
    let Some(w) = watch else {
        return flush(g, pending, attr, journal, run_start);
    };
    if pending.is_empty() {
        return Ok(false);
    }
    let from = journal.len();
    // A refused or unexpected open is the parked PMU's: the generator
    // follows it, and the replay judges it.
    flush(g, pending, attr, journal, run_start)?;
    for entry in &journal[from..] {
        generator.observe(entry);
    }
    w.read(g, pmus, journal, run_start, generator)?;
    Ok(false)
}

/// The handle the agent gives its next event: opens and closes one.
pub(super) fn probe_next_handle(g: &mut Guest) -> Result<u32> {
    let attr = PerfAttr {
        type_: PERF_TYPE_SOFTWARE,
        config: PERF_COUNT_SW_CPU_CLOCK,
        ..PerfAttr::default()
    };
    match g.open_as(attr, -1, 0, None)? {
        Ok(handle) => {
            g.close(handle)?;
            Ok(handle + 1)
        }
        Err(errno) => bail!("a cpu-clock event would not open: {errno}"),
    }
}

/// The attr of a journaled open.
pub(super) fn attr_of(o: &Opened, types: &[u32]) -> PerfAttr {
    let mut flags = 0;
    if o.disabled {
        flags |= FLAG_DISABLED;
    }
    if o.pinned {
        flags |= FLAG_PINNED;
    }
    if o.exclusive {
        flags |= FLAG_EXCLUSIVE;
    }
    let f = o.read_format;
    let mut read_format = 0;
    if f.times {
        read_format |= FORMAT_TOTAL_TIME_ENABLED | FORMAT_TOTAL_TIME_RUNNING;
    }
    if f.id {
        read_format |= FORMAT_ID;
    }
    if f.group {
        read_format |= FORMAT_GROUP;
    }
    if f.lost {
        read_format |= FORMAT_LOST;
    }
    let (type_, config) = match o.pmu {
        Some(d) => (
            types[d as usize],
            u64::from(o.event) | u64::from(o.rmid) << 8,
        ),
        None => (PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK),
    };
    PerfAttr {
        type_,
        config,
        flags,
        read_format,
        ..PerfAttr::default()
    }
}

/// Sends the pending perf steps as one batch; says whether an open gave a
/// handle other than the one the generator expected (its later choices
/// would then name the wrong events).
pub(super) fn flush(
    g: &mut Guest,
    pending: &mut Vec<(Step, bool)>,
    attr: &impl Fn(&Opened) -> PerfAttr,
    journal: &mut Vec<Entry>,
    run_start: Instant,
) -> Result<bool> {
    if pending.is_empty() {
        return Ok(false);
    }
    let ops: Vec<PerfOp> = pending
        .iter()
        .filter_map(|(s, _)| perf_op(s, attr))
        .collect();
    let results = g.perf_ops(ops)?;
    let mut desync = false;
    for ((step, expected), r) in pending.drain(..).zip(results) {
        if let Step::Open { expect, .. } = step {
            let got = r
                .result
                .as_ref()
                .ok()
                .map(|w| w.as_slice() == [u64::from(expect)]);
            desync |= got.is_some() != expected || got == Some(false);
        }
        journal.push(Entry {
            step,
            result: r.result,
            took_ns: r.took_ns,
            at_ns: since(run_start),
            returned_ns: r.time_ns,
            flowed: Vec::new(),
        });
    }
    Ok(desync)
}

/// Carries out a host step (traffic, hotplug, perf stat).
pub(super) fn host_step(
    g: &mut Guest,
    control: &mut ControlClient,
    device: &DeviceConfig,
    pmus: &[String],
    step: Step,
    timeout: Duration,
    run_start: Instant,
) -> Result<Entry> {
    let start = Instant::now();
    let wait_ms = timeout.as_millis() as u64;
    let result: Result<Vec<u64>, String> = match &step {
        &Step::Burst {
            domain,
            event: e,
            rmid,
            bytes,
        } => {
            control.inject(domain, rmid, mbm_event(e), bytes)?;
            control.wait_landed(wait_ms)?;
            Ok(vec![])
        }
        &Step::Occupancy {
            domain,
            rmid,
            bytes,
        } => {
            control.set_occupancy(domain, rmid, bytes)?;
            Ok(vec![])
        }
        &Step::Rate {
            domain,
            rmid,
            event: e,
            bytes_per_sec,
        } => {
            control.set_rate(domain, rmid, mbm_event(e), bytes_per_sec)?;
            Ok(vec![])
        }
        &Step::Move { domain } => hotplug(
            g,
            &pmus[domain as usize],
            vec![HotplugOp::FlapOwner {
                pmu: pmus[domain as usize].clone(),
            }],
        )?,
        Step::MovesStart { domain, cpus } => super::moving_thread::start(g, *domain, cpus)?,
        &Step::MovesStop { domain, job } => {
            super::moving_thread::stop(g, domain, &pmus[domain as usize], job, wait_ms)?
        }
        &Step::Park { domain } => {
            let cpus = &device.domains[domain as usize];
            let ops = cpus
                .iter()
                .map(|&cpu| HotplugOp::Set { cpu, online: false })
                .collect();
            match hotplug(g, &pmus[domain as usize], ops)? {
                Ok(mask) if mask.is_empty() => Ok(vec![]),
                Ok(mask) => Err(format!(
                    "{} still on CPU {mask:?} with all its CPUs offline",
                    pmus[domain as usize]
                )),
                Err(e) => Err(e),
            }
        }
        &Step::Unpark { domain, cpu } => hotplug(
            g,
            &pmus[domain as usize],
            vec![HotplugOp::Set { cpu, online: true }],
        )?,
        &Step::Online { cpu } => {
            g.set_online(cpu, true)?;
            Ok(vec![])
        }
        &Step::Offline { cpu } => offline(g, pmus, cpu)?,
        Step::FailAt {
            cpu,
            online,
            state,
            completes,
        } => fail_at(g, control, pmus, (*cpu, *online), state, *completes)?,
        Step::Allowed {
            domain,
            cpus,
            nowait,
        } => {
            let pmu = &pmus[*domain as usize];
            control
                .set_allowed(*domain, cpus)
                .map_err(|e| anyhow::anyhow!("allowed set {cpus:?} for {pmu}: {e}"))?;
            if *nowait {
                // Issued only: a later step settles it (journal::Doubt).
                return Ok(Entry {
                    step,
                    result: Ok(vec![]),
                    took_ns: u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX),
                    at_ns: since(run_start),
                    returned_ns: 0,
                    flowed: Vec::new(),
                });
            }
            let online = parse_cpu_list(g.read_file("/sys/devices/system/cpu/online")?.trim())
                .map_err(|e| anyhow::anyhow!("/sys/devices/system/cpu/online: {e}"))?;
            let want: Vec<u32> = cpus
                .iter()
                .copied()
                .filter(|c| online.contains(c))
                .collect();
            match g.wait_cpumask(pmu, |m| match m {
                [] => want.is_empty(),
                [cpu] => want.contains(cpu),
                _ => false,
            })? {
                (true, mask) => Ok(mask.into_iter().map(u64::from).collect()),
                (false, mask) => Err(format!(
                    "{pmu}: the allowed set {cpus:?} (online {want:?}): cpumask {mask:?} after 30 s"
                )),
            }
        }
        Step::AllowedRefused {
            domain,
            cpus,
            error,
        } => refused_set(control, device, *domain, cpus, *error)?,
        &Step::Wait { ms } => {
            std::thread::sleep(Duration::from_millis(ms));
            Ok(vec![])
        }
        &Step::Until {
            handle,
            condition: Condition::Running,
            within_ms,
        } => until_running(g, handle, within_ms)?,
        Step::Cpumask { domain, .. } => Ok(g
            .cpumask(&pmus[*domain as usize])?
            .into_iter()
            .map(u64::from)
            .collect()),
        Step::DriverCount { domain, count, .. } => {
            Ok(vec![g.pmu_count(&pmus[*domain as usize], count.file())?])
        }
        Step::Violations => Ok(vec![control
            .state()?
            .domains
            .iter()
            .map(|d| d.violations)
            .sum()]),
        &Step::MuxInterval { domain, ms } => {
            let file = multiplexing::mux_interval_file(&pmus[domain as usize]);
            let was = g.read_file(&file)?;
            let was: u64 = was
                .trim()
                .parse()
                .with_context(|| format!("{file}: {was:?}"))?;
            multiplexing::set_sysfs(g, &file, &ms.to_string())?;
            Ok(vec![was])
        }
        Step::PerfStat {
            domain,
            rmid,
            how,
            bursts,
        } => super::perf_stat::run(
            g,
            control,
            &pmus[*domain as usize],
            *domain,
            *rmid,
            *how,
            bursts,
            wait_ms,
        )?,
        Step::Reload { allowed } => reload(g, control, pmus, allowed.as_ref())?,
        &Step::StatStart { domain, rmid } => super::perf_stat::start_interval(
            g,
            &super::perf_stat::spec(&pmus[domain as usize], rmid),
        )?,
        &Step::StatStop { domain, rmid, job } => super::perf_stat::stop_interval(
            g,
            job,
            &super::perf_stat::spec(&pmus[domain as usize], rmid),
        )?,
        Step::OthersOpen { .. }
        | Step::Seen { .. }
        | Step::Open { .. }
        | Step::Ioctl { .. }
        | Step::Request { .. }
        | Step::Read { .. }
        | Step::Close { .. } => {
            bail!("{step:?} is not a host step")
        }
    };
    let took_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    Ok(Entry {
        step,
        result,
        took_ns,
        at_ns: since(run_start),
        returned_ns: 0,
        flowed: Vec::new(),
    })
}

/// Reads the event until its `time_running` grows between two reads
/// [`Condition::RUNNING_GAP_MS`] apart: the result is the milliseconds that
/// took, or, past `within_ms`, the error. Its words are a read with
/// `read=times` (the parser sees to it), `time_running` the third, alone or
/// in a group.
fn until_running(
    g: &mut Guest,
    handle: Handle,
    within_ms: u64,
) -> Result<Result<Vec<u64>, String>> {
    let start = Instant::now();
    let running = |words: &[u64]| {
        words
            .get(2)
            .copied()
            .with_context(|| format!("reading event {handle}: no time_running in {words:?}"))
    };
    let mut reads = 0;
    while start.elapsed() < Duration::from_millis(within_ms) {
        let first = running(&g.read(handle)?)?;
        std::thread::sleep(Duration::from_millis(Condition::RUNNING_GAP_MS));
        let second = running(&g.read(handle)?)?;
        reads += 2;
        if second > first {
            let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
            return Ok(Ok(vec![ms]));
        }
    }
    Ok(Err(format!(
        "event {handle} did not run within {within_ms} ms: its time_running stood still across each of {} pairs of reads {} ms apart",
        reads / 2,
        Condition::RUNNING_GAP_MS
    )))
}

/// Sends the malformed set `cpus` for `domain`: refused by the device
/// with its `error`, every domain's set as it was, is an empty result;
/// anything else is the result's error.
fn refused_set(
    control: &mut ControlClient,
    device: &DeviceConfig,
    domain: u32,
    cpus: &[u32],
    error: Malformed,
) -> Result<Result<Vec<u64>, String>> {
    let sets = |control: &mut ControlClient| -> Result<Vec<String>> {
        Ok(control
            .state()?
            .domains
            .into_iter()
            .map(|d| d.allowed_cpu_list)
            .collect())
    };
    // The parser asked a device of this shape; a guest of another shape
    // stops here, before the set is sent.
    let want = match Malformed::of(device, domain, cpus) {
        Ok(Some((name, e))) if name == error => e.to_string(),
        other => bail!(
            "the set {cpus:?} for domain {domain}: the device says {other:?}, not {}",
            error.name()
        ),
    };
    let before = sets(control)?;
    let sent = control.set_allowed(domain, cpus);
    let after = sets(control)?;
    Ok(match sent {
        Ok(()) => Err(format!("the device took it (want {want:?})")),
        Err(ClientError::Refused(got)) if got != want => {
            Err(format!("refused with {got:?}, want {want:?}"))
        }
        Err(ClientError::Refused(_)) if before != after => Err(format!(
            "refused, yet the domains' sets went from {before:?} to {after:?}"
        )),
        Err(ClientError::Refused(_)) => Ok(vec![]),
        Err(e) => bail!("the set {cpus:?} for domain {domain}: {e}"),
    })
}

/// Takes `cpu` offline; answers each PMU's CPU after it ([`PARKED`] for
/// one it parked).
fn offline(g: &mut Guest, pmus: &[String], cpu: u32) -> Result<Result<Vec<u64>, String>> {
    let result = match g.ask(HostRequest::HotplugBatch {
        ops: vec![HotplugOp::Set { cpu, online: false }],
        watch_pmus: pmus.to_vec(),
        read_handles: vec![],
    })? {
        AgentMessage::HotplugBatch(r) if r.ops.len() == 1 => r,
        other => bail!("taking CPU {cpu} offline: {other:?}"),
    };
    let op = &result.ops[0];
    if let Some(e) = &op.error {
        return Ok(Err(e.clone()));
    }
    Ok(op
        .masks
        .iter()
        .zip(pmus)
        .map(|(mask, pmu)| match mask.trim() {
            "" => Ok(PARKED),
            m => m
                .parse::<u64>()
                .map_err(|_| format!("{pmu}/cpumask {mask:?} is not one CPU")),
        })
        .collect())
}

/// Takes `cpu` offline (or online) with hotplug state `state` armed to
/// fail there (the agent's `HotplugOp::FailAt`): the operation must fail
/// there and roll back (an offline up to `online`, an online below the
/// state) or, with `completes`, complete without reaching it (the agent
/// undoes it), and every PMU be where the rollback's placement rule puts
/// it. Each domain's CPU after, [`PARKED`] for a parked one; what went
/// otherwise is the step's error. A state the guest's kernel does not list
/// (or cannot fail at: not the debug kernel) stops the run.
fn fail_at(
    g: &mut Guest,
    control: &mut ControlClient,
    pmus: &[String],
    (cpu, online): (u32, bool),
    state: &str,
    completes: bool,
) -> Result<Result<Vec<u64>, String>> {
    use crate::stress::fail_injection::{parse_states, placement_problem, CPU_SYSFS};
    let states = parse_states(&g.read_file(&format!("{CPU_SYSFS}/hotplug/states"))?)?;
    let number = |name: &str| {
        states
            .iter()
            .rfind(|s| s.name == name)
            .map(|s| s.number)
            .with_context(|| {
                let listed: Vec<&str> = states.iter().map(|s| s.name.as_str()).collect();
                format!(
                    "the guest's kernel lists no hotplug state {name:?} (its states: {})",
                    listed.join(", ")
                )
            })
    };
    let (armed, perf, online_state) = (
        number(state)?,
        number(super::journal::PERF_STATE)?,
        number("online")?,
    );
    let result = match g.ask(HostRequest::HotplugBatch {
        ops: vec![HotplugOp::FailAt {
            cpu,
            online,
            state: armed,
        }],
        watch_pmus: pmus.to_vec(),
        read_handles: vec![],
    })? {
        AgentMessage::HotplugBatch(r) if r.ops.len() == 1 => r,
        other => bail!("CPU {cpu} armed to fail at {state}: {other:?}"),
    };
    let done = &result.ops[0];
    let what = format!(
        "{} of CPU {cpu} armed at {armed} {state}",
        if online { "online" } else { "offline" }
    );
    let injected = match (done.injected, &done.error) {
        (Some(injected), None) => injected,
        (None, Some(e)) if e.contains("arming state") => {
            bail!("{what}: {e} (fail injection needs the debug kernel)")
        }
        (_, error) => return Ok(Err(format!("{what}: {error:?}"))),
    };
    if injected == completes {
        return Ok(Err(format!(
            "{what}: {}",
            if injected {
                "failed there and rolled back, and the line says it completes past it"
            } else {
                "completed without reaching it (the agent undid it), and the line says it fails there"
            }
        )));
    }
    let at = g
        .read_file(&format!("{CPU_SYSFS}/cpu{cpu}/hotplug/state"))?
        .parse::<i64>()
        .context("a CPU's hotplug/state")?;
    let rolled_back = match (injected, online) {
        (true, false) => at == online_state,
        (true, true) => at < armed,
        (false, _) => true,
    };
    if !rolled_back {
        return Ok(Err(format!(
            "{what}: failed, and left the CPU at state {at} ({})",
            if online {
                format!("want below {armed}")
            } else {
                format!("want {online_state}, online")
            }
        )));
    }
    let online_now = parse_cpu_list(done.online.trim()).unwrap_or_default();
    let state_now = control.state()?;
    let mut owners = Vec::new();
    let mut problems = Vec::new();
    for (d, (pmu, (was, is))) in pmus
        .iter()
        .zip(result.masks_before.iter().zip(&done.masks))
        .enumerate()
    {
        let allowed = state_now
            .domains
            .get(d)
            .map_or(&[][..], |s| s.allowed_cpus.as_slice());
        let rule = (cpu, online, armed, perf);
        if let Some(p) = placement_problem(allowed, &online_now, rule, injected, (was, is)) {
            problems.push(format!("{pmu} {p}"));
        }
        owners.push(match is.trim() {
            "" => PARKED,
            m => m.parse::<u64>().unwrap_or(PARKED),
        });
    }
    if !problems.is_empty() {
        return Ok(Err(format!("{what}: {}", problems.join("; "))));
    }
    Ok(Ok(owners))
}

/// Unloads perfbed.ko, gives `allowed`'s domain its set if there is one,
/// and loads it again: each domain's CPU after the load, [`PARKED`] for a
/// parked one (each PMU is placed as it registers).
fn reload(
    g: &mut Guest,
    control: &mut ControlClient,
    pmus: &[String],
    allowed: Option<&(u32, Vec<u32>)>,
) -> Result<Result<Vec<u64>, String>> {
    let module = || crate::guest::MODULE.to_string();
    let gone = g.ask(HostRequest::UnloadModule { name: module() })?;
    if gone != AgentMessage::Done {
        return Ok(Err(format!("unloading {}: {gone:?}", crate::guest::MODULE)));
    }
    if let Some((domain, cpus)) = allowed {
        control
            .set_allowed(*domain, cpus)
            .map_err(|e| anyhow::anyhow!("allowed set {cpus:?} for domain {domain}: {e}"))?;
    }
    let back = g.ask(HostRequest::LoadModule { name: module() })?;
    if back != AgentMessage::Done {
        return Ok(Err(format!("loading {}: {back:?}", crate::guest::MODULE)));
    }
    let mut owners = Vec::new();
    for pmu in pmus {
        match g.wait_cpumask(pmu, |m| m.len() <= 1)? {
            (true, mask) => owners.push(mask.first().map_or(PARKED, |&c| u64::from(c))),
            (false, mask) => return Ok(Err(format!("{pmu}: cpumask {mask:?} after the load"))),
        }
    }
    Ok(Ok(owners))
}

/// Runs hotplug `ops`; answers the PMU's CPU after them (`[]` if parked).
fn hotplug(g: &mut Guest, pmu: &str, ops: Vec<HotplugOp>) -> Result<Result<Vec<u64>, String>> {
    let n = ops.len();
    let result = match g.ask(HostRequest::HotplugBatch {
        ops,
        watch_pmus: vec![pmu.to_string()],
        read_handles: vec![],
    })? {
        AgentMessage::HotplugBatch(r) if r.ops.len() == n => r,
        other => bail!("a hotplug batch of {n}: {other:?}"),
    };
    if let Some(e) = result.ops.iter().find_map(|op| op.error.clone()) {
        return Ok(Err(e));
    }
    let mask = result
        .ops
        .last()
        .and_then(|op| op.masks.first())
        .cloned()
        .unwrap_or_default();
    if mask.is_empty() {
        return Ok(Ok(vec![]));
    }
    Ok(mask
        .parse::<u64>()
        .map(|cpu| vec![cpu])
        .map_err(|_| format!("{pmu}/cpumask {mask:?} is not one CPU")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stress::lifecycle::journal::ReadFormat;

    /// A malformed set against a device behind its control socket: the
    /// refusal named is an empty result, every set as it was; a set the
    /// device takes, or a name it does not refuse with, stops the run
    /// before it is sent (the parser refuses both before any guest).
    #[test]
    fn a_malformed_set_is_refused_by_the_device_and_changes_nothing() {
        let config = DeviceConfig::default();
        let device = perfbed_device::SharedDevice::new(config.clone()).unwrap();
        let path =
            std::env::temp_dir().join(format!("perfbed-refused-{}.sock", std::process::id()));
        let _server = device.serve_control(&path).unwrap();
        let mut control = ControlClient::connect(&path).unwrap();
        let mut refused = |domain, cpus: &[u32], error| {
            refused_set(&mut control, &config, domain, cpus, error).map_err(|e| e.to_string())
        };
        assert_eq!(refused(9, &[2, 3], Malformed::NoSuchDomain), Ok(Ok(vec![])));
        assert_eq!(refused(1, &[2, 4096], Malformed::NoSuchCpu), Ok(Ok(vec![])));
        let wrong = refused(9, &[200], Malformed::NoSuchDomain).unwrap_err();
        assert!(wrong.contains("not no-such-domain"), "{wrong}");
        let taken = refused(1, &[3], Malformed::NoSuchCpu).unwrap_err();
        assert!(taken.contains("says Ok(None)"), "{taken}");
        let sets: Vec<String> = control
            .state()
            .unwrap()
            .domains
            .into_iter()
            .map(|d| d.allowed_cpu_list)
            .collect();
        assert_eq!(sets, ["0-1", "2-3"]);
    }

    #[test]
    fn journaled_opens_become_the_attrs_they_say() {
        let o = Opened {
            pmu: Some(1),
            event: 3,
            rmid: 4,
            disabled: true,
            pinned: false,
            exclusive: true,
            group: None,
            read_format: ReadFormat {
                times: true,
                id: true,
                group: false,
                lost: false,
            },
            cpu: 0,
        };
        let a = attr_of(&o, &[10, 11]);
        assert_eq!(
            (a.type_, a.config, a.flags),
            (11, 3 | 4 << 8, FLAG_DISABLED | FLAG_EXCLUSIVE)
        );
        assert_eq!(
            a.read_format,
            FORMAT_TOTAL_TIME_ENABLED | FORMAT_TOTAL_TIME_RUNNING | FORMAT_ID
        );
        let sw = attr_of(&Opened { pmu: None, ..o }, &[10, 11]);
        assert_eq!(
            (sw.type_, sw.config),
            (PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK)
        );
    }

    #[test]
    fn stretches_count_the_threads_rounds_and_what_ran_meanwhile() {
        let entry = Entry::untimed;
        let start = || {
            entry(
                Step::MovesStart {
                    domain: 1,
                    cpus: vec![2, 3],
                },
                Ok(vec![4]),
            )
        };
        let stop = |r| entry(Step::MovesStop { domain: 1, job: 4 }, r);
        let read = || entry(Step::Read { handle: 1 }, Ok(vec![0]));
        let burst = || entry(Step::Wait { ms: 1 }, Ok(vec![]));
        assert_eq!(Stretches::of(&[read(), burst()]), None);
        let journal = [
            read(),
            start(),
            read(),
            burst(),
            stop(Ok(vec![3, 2])),
            read(),
            start(),
            read(),
            stop(Err("sh: write error: Device or resource busy".into())),
        ];
        assert_eq!(
            Stretches::of(&journal),
            Some(Stretches {
                stretches: 2,
                rounds: 3,
                ops: 3,
                reads: 2
            })
        );
        assert_eq!(
            with_started_job(Step::MovesStop { domain: 1, job: 0 }, &journal[..2]).unwrap(),
            Step::MovesStop { domain: 1, job: 4 }
        );
        assert!(with_started_job(Step::MovesStop { domain: 0, job: 0 }, &journal).is_err());
    }

    #[test]
    fn flowing_counts_the_watched_rates_and_the_steps_measured_while_they_flowed() {
        let rate = |rmid, bytes_per_sec| Step::Rate {
            domain: 1,
            rmid,
            event: 2,
            bytes_per_sec,
        };
        let measured = |step, before, during| Entry {
            flowed: vec![journal::Flowed {
                domain: 1,
                event: 2,
                rmid: 3,
                before,
                during,
            }],
            ..Entry::untimed(step, Ok(vec![]))
        };
        let background = Entry::untimed(rate(RMID_RATE, 1 << 20), Ok(vec![]));
        assert_eq!(Flowing::of(std::slice::from_ref(&background)), None);
        let journal = [
            background,
            measured(rate(3, 1 << 20), 0, 64),
            measured(Step::Read { handle: 1 }, 100, 20),
            measured(Step::Move { domain: 1 }, 30, 500),
            measured(rate(3, 0), 6, 0),
            Entry::untimed(Step::Read { handle: 1 }, Ok(vec![0])),
        ];
        assert_eq!(
            Flowing::of(&journal),
            Some(Flowing {
                rates: 1,
                steps: 4,
                reads: 1,
                bytes: 64 + 120 + 530 + 6
            })
        );
    }
}
