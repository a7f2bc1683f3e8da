//! The lifecycle stress's journal: every operation it issued, in order, with
//! what came back. The agent journals the perf operations it carries out;
//! this is the host's copy, with the host's own operations (traffic, moves,
//! parks) in their places, which is what the checker replays.

use perfbed_agent::PerfOp;
use serde::{Deserialize, Serialize};

use crate::model::rules::{holds, Rule};
use crate::model::{DeviceShape, Handle, Ioctl, Kind, Model, OpenSpec};

/// The journal file's first line: what the replay needs besides the steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub pmus: u32,
    pub slots: u32,
    pub unit_bytes: u64,
    pub counter_width: u32,
    #[serde(default = "default_max_rate")]
    pub max_rate: u64,
    pub seed: u64,
    /// The command that runs the stress again.
    pub replay: String,
    /// Each domain's CPUs and where its PMU was at the start (empty in a
    /// journal from before they were recorded, a scenario's before
    /// 2026-12-07: the replay then cannot tell which CPU a move or a park
    /// takes offline, nor which PMUs an offline moves).
    #[serde(default, flatten)]
    pub cpus: Cpus,
}

/// The CPUs the host steps take offline and bring back: each domain's
/// allowed CPUs and owner, followed through moves, parks and unparks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cpus {
    #[serde(default)]
    pub domains: Vec<Vec<u32>>,
    #[serde(default)]
    pub owners: Vec<Option<u32>>,
}

impl Cpus {
    /// Each domain of `domains` (its allowed CPUs) on its first CPU, where
    /// a scenario starts it.
    pub fn homed(domains: &[Vec<u32>]) -> Cpus {
        Cpus {
            domains: domains.to_vec(),
            owners: domains.iter().map(|d| d.first().copied()).collect(),
        }
    }

    /// Tells `model` what host step `step` did to CPUs and placements;
    /// `owner` is the PMU's CPU after it (a move's or an unpark's result).
    pub fn step(&mut self, model: &mut Model, step: &Step, owner: Option<u32>) {
        match *step {
            Step::Move { domain } => {
                let old = self.owner(domain);
                // The owner was the domain's last CPU online: its offline
                // parks the PMU, and its online places it there again.
                let parks = old.is_some_and(|o| {
                    owner.map_or_else(|| self.last_online(model, domain, o), |now| now == o)
                }) && holds(Rule::LastCpuFlapParks);
                if let Some(cpu) = old {
                    model.cpu_offline(cpu);
                }
                if parks {
                    model.park(domain);
                } else {
                    model.moved(domain);
                }
                if let Some(cpu) = old {
                    model.cpu_online(cpu);
                }
                if parks {
                    model.unpark(domain);
                }
                self.set_owner(domain, owner.or(old));
            }
            Step::Park { domain } => {
                for &cpu in self.domains.get(domain as usize).into_iter().flatten() {
                    model.cpu_offline(cpu);
                }
                model.park(domain);
                self.set_owner(domain, None);
            }
            Step::Unpark { domain, cpu } => {
                model.cpu_online(cpu);
                model.unpark(domain);
                self.set_owner(domain, owner.or(Some(cpu)));
            }
            Step::Online { cpu } => model.cpu_online(cpu),
            // The moves between are unseen (a read may race one): the PMU
            // is where the thread's last round left it.
            Step::MovesStart { domain, .. } => model.moves_unseen(domain, true),
            Step::MovesStop { domain, .. } => {
                model.moves_unseen(domain, false);
                let old = self.owner(domain);
                self.set_owner(domain, owner.or(old));
            }
            _ => {}
        }
    }

    /// Domain `domain`'s CPU as followed (`None`: parked, or not known).
    pub fn owner(&self, domain: u32) -> Option<u32> {
        self.owners.get(domain as usize).copied().flatten()
    }

    /// Whether `cpu` is the only CPU of `domain` online.
    fn last_online(&self, model: &Model, domain: u32, cpu: u32) -> bool {
        self.domains
            .get(domain as usize)
            .is_some_and(|d| d.iter().all(|&c| c == cpu || model.is_offline(c)))
    }

    fn set_owner(&mut self, domain: u32, owner: Option<u32>) {
        if let Some(o) = self.owners.get_mut(domain as usize) {
            *o = owner;
        }
    }
}

/// `mbm_local_bytes`: the event of a journal's `Rate` that names none.
fn local_bytes() -> u32 {
    perfbed_device::regs::Event::MbmLocalBytes as u32
}

/// The device's event of a journal's event number (an `mbm_*` one).
pub fn mbm_event(id: u32) -> perfbed_device::regs::Event {
    use perfbed_device::regs::Event;
    if id == 3 {
        Event::MbmLocalBytes
    } else {
        Event::MbmTotalBytes
    }
}

fn default_max_rate() -> u64 {
    perfbed_device::DeviceConfig::default().max_rate
}

impl Header {
    pub fn shape(&self) -> DeviceShape {
        DeviceShape {
            pmus: self.pmus,
            slots: self.slots,
            unit_bytes: self.unit_bytes,
            counter_width: self.counter_width,
            max_rate: self.max_rate,
            lined_pmus: crate::host::config::device_gsis(self.pmus as usize).len() as u32,
        }
    }
}

/// The journal as a file: the header, then one entry per line.
pub fn to_text(header: &Header, entries: &[Entry]) -> Result<String, serde_json::Error> {
    let mut text = serde_json::to_string(header)? + "\n";
    for entry in entries {
        text += &serde_json::to_string(entry)?;
        text.push('\n');
    }
    Ok(text)
}

/// Reads a journal file back; the error names the line.
pub fn from_text(text: &str) -> Result<(Header, Vec<Entry>), String> {
    let mut lines = text.lines().enumerate();
    let (_, first) = lines.next().ok_or("an empty journal")?;
    let header = serde_json::from_str(first).map_err(|e| format!("line 1 (the header): {e}"))?;
    let entries = lines
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect::<Result<_, _>>()?;
    Ok((header, entries))
}

/// How an open event is read (its `attr.read_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadFormat {
    pub times: bool,
    pub id: bool,
    pub group: bool,
    /// `PERF_FORMAT_LOST`: a lost-samples count after each value (and id),
    /// 0 for a counting event.
    #[serde(default)]
    pub lost: bool,
}

/// An event as the journal records its open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Opened {
    /// Device events by domain, event id and RMID; `None` for cpu-clock.
    pub pmu: Option<u32>,
    pub event: u32,
    pub rmid: u32,
    pub disabled: bool,
    pub pinned: bool,
    pub exclusive: bool,
    pub group: Option<Handle>,
    pub read_format: ReadFormat,
    /// The CPU passed to perf_event_open (a device event is moved to its
    /// PMU's CPU whatever it is; a software event stays there, so a mixed
    /// group's is the PMU's CPU as its `cpumask` showed it).
    pub cpu: i32,
}

impl Opened {
    /// A cpu-clock event on `cpu`, enabled, in `group` if given.
    pub fn cpu_clock(cpu: i32, group: Option<Handle>, read_format: ReadFormat) -> Opened {
        Opened {
            pmu: None,
            event: 0,
            rmid: 0,
            disabled: false,
            pinned: false,
            exclusive: false,
            group,
            read_format,
            cpu,
        }
    }

    pub fn spec(&self) -> OpenSpec {
        let kind = match self.pmu {
            None => Kind::Software,
            Some(pmu) if self.event == 1 => Kind::Gauge {
                pmu,
                rmid: self.rmid,
            },
            Some(pmu) => Kind::Counter {
                pmu,
                event: self.event,
                rmid: self.rmid,
            },
        };
        OpenSpec {
            kind,
            disabled: self.disabled,
            pinned: self.pinned,
            exclusive: self.exclusive,
            group: self.group,
        }
    }
}

/// The hotplug states an `offline`/`online ... fails at STATE` line may
/// arm, by the name `/sys/devices/system/cpu/hotplug/states` gives them:
/// perf's own, where the perf core moves device-scope PMUs, and its
/// failable neighbours on the 6.12 kernel; each with whether it lies below
/// perf's (an offline that fails there has run perf's teardown).
pub const HOTPLUG_STATES: [(&str, bool); 5] = [
    ("smpboot/threads:online", true),
    ("irq/affinity:online", true),
    (PERF_STATE, false),
    ("lockup_detector:online", false),
    ("workqueue:online", false),
];

/// perf's own hotplug state.
pub const PERF_STATE: &str = "perf:online";

/// Whether an offline armed at `state` runs perf's teardown, moving the
/// PMU off the CPU: it completes, or fails at a state below perf's.
pub fn offline_runs_perfs_teardown(state: &str, completes: bool) -> bool {
    completes || HOTPLUG_STATES.iter().any(|&(n, below)| n == state && below)
}

/// One operation of the stress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// Events the journal does not show may be open on the domain's PMU
    /// from now on (the open-close loop's gauges, opens racing moves).
    OthersOpen {
        domain: u32,
    },
    /// perf_event_open; `expect` is the handle the agent gives if it opens.
    Open {
        event: Opened,
        expect: Handle,
    },
    Ioctl {
        handle: Handle,
        ioctl: IoctlName,
        group: bool,
    },
    /// An ioctl that changes nothing an event counts (a scenario's `ioctl`
    /// line: REFRESH, PERIOD, SET_FILTER, ...), and the answer it must
    /// give: success (`refused` none) or the errno named.
    Request {
        handle: Handle,
        request: Request,
        refused: Option<String>,
    },
    Read {
        handle: Handle,
    },
    Close {
        handle: Handle,
    },
    /// Bytes injected and landed before the next step.
    Burst {
        domain: u32,
        event: u32,
        rmid: u32,
        bytes: u64,
    },
    Occupancy {
        domain: u32,
        rmid: u32,
        bytes: u64,
    },
    /// A steady rate of `event` on `rmid`: on an RMID no event watches
    /// (bandwidth under the bursts), or one that events count, whose
    /// traffic the runner then measures around every step (`Entry::flowed`).
    Rate {
        domain: u32,
        rmid: u32,
        #[serde(default = "local_bytes")]
        event: u32,
        bytes_per_sec: u64,
    },
    /// The domain's owner CPU went offline and came back.
    Move {
        domain: u32,
    },
    /// From now on a thread of the guest moves the domain's PMU: it takes
    /// each of `cpus` (allowed, online, not CPU 0; two or more) offline and
    /// back in turn, round after round, so the PMU moves at moments the
    /// journal does not know and never parks. The result is the thread's
    /// job number.
    MovesStart {
        domain: u32,
        cpus: Vec<u32>,
    },
    /// The domain's moving thread finishes its round (at least one) and
    /// ends; every CPU it took is online. `job` is the start's result (the
    /// runner fills it in). The result is the number of rounds and the
    /// CPU the PMU counts on after them.
    MovesStop {
        domain: u32,
        #[serde(default)]
        job: u32,
    },
    /// All the domain's allowed CPUs went offline / one came back.
    Park {
        domain: u32,
    },
    Unpark {
        domain: u32,
        cpu: u32,
    },
    /// Another allowed CPU of a placed domain came back online.
    Online {
        cpu: u32,
    },
    /// A CPU taken offline (written by a scenario): the result is each
    /// domain's CPU after it, [`PARKED`] for a domain it parked.
    Offline {
        cpu: u32,
    },
    /// A CPU taken offline or brought online with the hotplug state named
    /// `state` armed to fail (a scenario's `offline CPU fails at STATE`,
    /// the agent's `HotplugOp::FailAt`; the debug kernel): it fails there
    /// and rolls back, or, with `completes`, the state has no callback that
    /// way, the operation completes and the agent undoes it. Either way the
    /// CPU ends as it was; the result is each domain's CPU after,
    /// [`PARKED`] for a parked one.
    FailAt {
        cpu: u32,
        online: bool,
        state: String,
        #[serde(default, skip_serializing_if = "is_false")]
        completes: bool,
    },
    /// The device gave the domain a new allowed set (a scenario's
    /// `allowed`), and its `cpumask` followed: the result is the CPU it
    /// counts on, empty when the set parked it. With `nowait` (`allowed
    /// ... nowait`) the change was only issued: the result is empty, and
    /// the domain's placement is in doubt ([`Doubt`]) until a step settles
    /// it.
    Allowed {
        domain: u32,
        cpus: Vec<u32>,
        #[serde(default, skip_serializing_if = "is_false")]
        nowait: bool,
    },
    /// A malformed allowed set sent to the device (a scenario's `allowed
    /// ... refused ERROR`): the device must refuse it with `error` and
    /// leave every domain's set as it was. The result is empty when it
    /// did; what it did otherwise is the error.
    AllowedRefused {
        domain: u32,
        cpus: Vec<u32>,
        error: Malformed,
    },
    /// The host waited (a scenario's `wait`).
    Wait {
        ms: u64,
    },
    /// The host read the event until `condition` held (a scenario's
    /// `until`): the result is the milliseconds it took; `within_ms`
    /// passed first is the step's error. Its reads are not judged.
    Until {
        handle: Handle,
        condition: Condition,
        within_ms: u64,
    },
    /// The PMU's `cpumask` must be `cpus` (a scenario's `cpumask`: one CPU,
    /// or none when parked): the result is the mask read.
    Cpumask {
        domain: u32,
        cpus: Vec<u32>,
    },
    /// The device's placement violations, all domains (a scenario's
    /// `violations`): the result is the count; each after the first must
    /// show the first's (no new violation between them).
    Violations,
    /// One of the PMU's driver counts in sysfs (a scenario's `lost_wraps`,
    /// `irqs_on_owner` or `irqs_off_owner` line): the result is the count
    /// read. With `grown`, it must have grown so since the domain's step
    /// of the same count before; without, the step marks where the next one
    /// counts from.
    DriverCount {
        domain: u32,
        count: DriverCount,
        grown: Option<Growth>,
    },
    /// The domain's PMU given a mux interval (a scenario's `mux`, sysfs
    /// `perf_event_mux_interval_ms`): the result is the interval it had.
    MuxInterval {
        domain: u32,
        ms: u64,
    },
    /// CPUs went offline or online behind the host's back (rcutorture's
    /// onoff, `stress --lifecycle N --rcutorture`): the CPUs `online` and
    /// each domain's CPU (the result, [`PARKED`] for a parked one) as the
    /// host read them after the step before this (after every batch and
    /// host step: the reading's time lies between the steps either side).
    /// The domains in `unsure` may have parked or been placed at any moment
    /// of the `window` steps before this one (since the last reading): its
    /// park or placement was seen, or that reading is so old that a park and
    /// a placement could both have come and gone unseen.
    Seen {
        online: Vec<u32>,
        unsure: Vec<u32>,
        window: u32,
    },
    /// perfbed.ko unloaded and loaded again (a scenario's `reload`), no
    /// event open; with `allowed`, that domain's set changed while it was
    /// gone. Every PMU registers again, placed by the sets the device has
    /// then: the result is each domain's CPU after it, [`PARKED`] for a
    /// domain left with no allowed CPU online.
    Reload {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        allowed: Option<(u32, Vec<u32>)>,
    },
    /// The real `perf stat -a -I 100` starts on the domain's
    /// (mbm_total_bytes, `rmid`) and runs while the steps after it run (a
    /// scenario's `stat DOMAIN rmid=N start`), counting from the step on:
    /// the result is its job number.
    StatStart {
        domain: u32,
        rmid: u32,
    },
    /// That `perf stat` stopped (`stat DOMAIN stop`): the result is the sum
    /// of its intervals, judged as a read of an event open since the
    /// start. `job` is the start's result (the runner fills it in).
    StatStop {
        domain: u32,
        rmid: u32,
        #[serde(default)]
        job: u32,
    },
    /// The real `perf stat` on a (domain, mbm_total_bytes, RMID): its
    /// bursts, and which of them it must count (see `perf_stat.rs`).
    PerfStat {
        domain: u32,
        rmid: u32,
        how: StatHow,
        bursts: Vec<(u64, bool)>,
    },
}

/// A count the driver keeps in its PMU's sysfs folder, which a
/// [`Step::DriverCount`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DriverCount {
    /// The wraps it found lost while nobody could read a counter.
    LostWraps,
    /// The overflow interrupts it handled on the PMU's CPU.
    IrqsOnOwner,
    /// The overflow interrupts that reached another CPU (the line's target
    /// before a move), left to the owner's poll.
    IrqsOffOwner,
}

impl DriverCount {
    pub const ALL: [DriverCount; 3] = [
        DriverCount::LostWraps,
        DriverCount::IrqsOnOwner,
        DriverCount::IrqsOffOwner,
    ];

    /// Its file in the PMU's sysfs folder, which is also its scenario line's word.
    pub fn file(self) -> &'static str {
        match self {
            DriverCount::LostWraps => "lost_wraps",
            DriverCount::IrqsOnOwner => "irqs_on_owner",
            DriverCount::IrqsOffOwner => "irqs_off_owner",
        }
    }

    /// The count whose file (and scenario word) is `word`.
    pub fn named(word: &str) -> Option<DriverCount> {
        DriverCount::ALL.into_iter().find(|c| c.file() == word)
    }
}

/// How much a [`Step::DriverCount`] count must have grown: `by`, or `by`
/// or more, or `by` or fewer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Growth {
    pub by: u64,
    pub bound: Bound,
}

/// Which growths besides exactly [`Growth::by`] a [`Growth`] allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Bound {
    Exactly,
    OrMore,
    OrFewer,
}

impl Growth {
    pub fn allows(self, grown: u64) -> bool {
        match self.bound {
            Bound::Exactly => grown == self.by,
            Bound::OrMore => grown >= self.by,
            Bound::OrFewer => grown <= self.by,
        }
    }

    /// As a scenario writes it: `N`, `N+` or `N-`.
    pub fn written(self) -> String {
        let sign = match self.bound {
            Bound::Exactly => "",
            Bound::OrMore => "+",
            Bound::OrFewer => "-",
        };
        format!("{}{sign}", self.by)
    }
}

/// An [`Step::Offline`] result's word for a parked domain.
pub const PARKED: u64 = u64::MAX;

/// What an [`Step::Until`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Condition {
    /// The event counting: its `time_running` grew between two reads
    /// [`Condition::RUNNING_GAP_MS`] apart (its turn has come).
    Running,
}

impl Condition {
    /// The time between the two reads of a [`Condition::Running`] test.
    pub const RUNNING_GAP_MS: u64 = 20;
}

/// Why the device refuses an allowed set, by the name of its error
/// (`perfbed_device::DeviceError`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Malformed {
    /// A domain the device does not have.
    NoSuchDomain,
    /// A CPU it cannot describe (64 or more).
    NoSuchCpu,
}

impl Malformed {
    pub const ALL: [Malformed; 2] = [Malformed::NoSuchDomain, Malformed::NoSuchCpu];

    /// Its name in a scenario (`no-such-domain`, `no-such-cpu`).
    pub fn name(self) -> &'static str {
        match self {
            Malformed::NoSuchDomain => "no-such-domain",
            Malformed::NoSuchCpu => "no-such-cpu",
        }
    }

    /// What a device of `config` says to the set `cpus` for `domain`:
    /// `None` if it takes it, else its error and the error's name (a
    /// refusal these names do not cover is `Err`). A fresh device of that
    /// shape is asked, so that its rules are stated once.
    pub fn of(
        config: &perfbed_device::DeviceConfig,
        domain: u32,
        cpus: &[u32],
    ) -> Result<Option<(Malformed, perfbed_device::DeviceError)>, String> {
        use perfbed_device::DeviceError;
        let mut device = perfbed_device::Device::new(config.clone()).map_err(|e| e.to_string())?;
        match device.set_allowed(0, domain, cpus) {
            Ok(()) => Ok(None),
            Err(e @ DeviceError::NoSuchDomain { .. }) => Ok(Some((Malformed::NoSuchDomain, e))),
            Err(e @ DeviceError::NoSuchCpu { .. }) => Ok(Some((Malformed::NoSuchCpu, e))),
            Err(e) => Err(e.to_string()),
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What a step does to a domain whose placement is in doubt: an allowed
/// set issued without waiting for the `cpumask` (`allowed ... nowait`)
/// puts it in doubt (the driver acts on it at a moment no step sees, and a
/// set with no CPU online parks it then); a `cpumask` of the domain, which
/// then waits for the mask it asserts, or an `allowed` that waits settles
/// it. The replay, the host's check of a scenario's wants, the runner and
/// the interrupt's watch follow it alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doubt {
    Begins(u32),
    Settles(u32),
}

impl Doubt {
    /// What `step` does to the doubt of its domain, if anything (a
    /// `Settles` of a domain not in doubt is nothing).
    pub fn of(step: &Step) -> Option<Doubt> {
        match *step {
            Step::Allowed {
                domain,
                nowait: true,
                ..
            } => Some(Doubt::Begins(domain)),
            Step::Allowed { domain, .. } | Step::Cpumask { domain, .. } => {
                Some(Doubt::Settles(domain))
            }
            _ => None,
        }
    }
}

/// Which way perf stat ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatHow {
    /// `perf stat -a -I 100`: the intervals must add up to every burst.
    Interval,
    /// `perf stat -a -D -1 --control fifo:…`: enabled and disabled through
    /// the control FIFO between bursts.
    Control,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoctlName {
    Enable,
    Disable,
    Reset,
}

impl IoctlName {
    pub fn model(self) -> Ioctl {
        match self {
            IoctlName::Enable => Ioctl::Enable,
            IoctlName::Disable => Ioctl::Disable,
            IoctlName::Reset => Ioctl::Reset,
        }
    }

    pub fn agent(self, group: bool) -> perfbed_agent::PerfIoctl {
        use perfbed_agent::PerfIoctl;
        match self {
            IoctlName::Enable => PerfIoctl::Enable { group },
            IoctlName::Disable => PerfIoctl::Disable { group },
            IoctlName::Reset => PerfIoctl::Reset { group },
        }
    }
}

/// The ioctls of a [`Step::Request`]: those a counting event has no use
/// for, which must leave its count and its state as they were.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    Refresh {
        count: i32,
    },
    Period {
        period: u64,
    },
    SetFilter {
        filter: String,
    },
    /// Output to another event's buffer (`None`: none, fd -1).
    SetOutput {
        target: Option<Handle>,
    },
    Id,
    PauseOutput {
        pause: bool,
    },
    /// No program (fd -1).
    SetBpf,
    QueryBpf,
    /// The event's own attributes, as it was opened.
    ModifyAttributes {
        event: Opened,
    },
}

impl Request {
    /// The agent's ioctl, with an event's attr filled in by `attr`.
    pub fn agent(
        &self,
        attr: impl Fn(&Opened) -> perfbed_agent::PerfAttr,
    ) -> perfbed_agent::PerfIoctl {
        use perfbed_agent::PerfIoctl;
        match self {
            &Request::Refresh { count } => PerfIoctl::Refresh { count },
            &Request::Period { period } => PerfIoctl::Period { period },
            Request::SetFilter { filter } => PerfIoctl::SetFilter {
                filter: filter.clone(),
            },
            &Request::SetOutput { target } => PerfIoctl::SetOutput { target },
            Request::Id => PerfIoctl::Id,
            &Request::PauseOutput { pause } => PerfIoctl::PauseOutput { pause },
            Request::SetBpf => PerfIoctl::SetBpf { fd: -1 },
            Request::QueryBpf => PerfIoctl::QueryBpf,
            Request::ModifyAttributes { event } => {
                PerfIoctl::ModifyAttributes { attr: attr(event) }
            }
        }
    }
}

/// What a step came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub step: Step,
    /// The words the agent answered, or the errno's name, or what failed
    /// on the host's side.
    pub result: Result<Vec<u64>, String>,
    /// How long the system call (or host action) took, in ns.
    pub took_ns: u64,
    /// When it was done, in ns of the host's clock since the run began (how
    /// long a park lasted).
    #[serde(default)]
    pub at_ns: u64,
    /// When the system call returned, in ns of the guest's
    /// `CLOCK_MONOTONIC` (how far apart reads one after the other lay); 0
    /// where not known (a host action). `returned_ns - took_ns` is when it
    /// began (the agent takes both from the same two readings).
    #[serde(default)]
    pub returned_ns: u64,
    /// The steady traffic on watched counters (`Rate` on an RMID events
    /// count) that landed since the step before and while this one was
    /// carried out, from the device's truth sampled around it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flowed: Vec<Flowed>,
}

/// What one steady flow landed around one journal step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Flowed {
    pub domain: u32,
    pub event: u32,
    pub rmid: u32,
    /// Bytes landed since the step before ended: before this one began.
    pub before: u64,
    /// Bytes landed while this step was carried out (a burst's own bytes
    /// left out: they are the burst's).
    pub during: u64,
}

impl Flowed {
    /// The counter it landed on: (domain, event, RMID).
    pub fn counter(&self) -> (u32, u32, u32) {
        (self.domain, self.event, self.rmid)
    }
}

/// The agent operation a perf step is, with the attr filled in by `attr`.
pub fn perf_op(step: &Step, attr: impl Fn(&Opened) -> perfbed_agent::PerfAttr) -> Option<PerfOp> {
    Some(match *step {
        Step::Open { ref event, .. } => PerfOp::Open {
            attr: attr(event),
            cpu: event.cpu,
            group: event.group,
        },
        Step::Ioctl {
            handle,
            ioctl,
            group,
        } => PerfOp::Ioctl {
            handle,
            ioctl: ioctl.agent(group),
        },
        Step::Request {
            handle,
            ref request,
            ..
        } => PerfOp::Ioctl {
            handle,
            ioctl: request.agent(attr),
        },
        Step::Read { handle } => PerfOp::Read { handle },
        Step::Close { handle } => PerfOp::Close { handle },
        _ => return None,
    })
}

/// What landed on an event's counter from its open, or its last RESET, to
/// a read: `sure` between the two, `unsure` during the open or RESET and
/// during the read (at a moment that may be before or after the count's
/// start or the read's look at it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landed {
    pub sure: u64,
    pub unsure: u64,
}

/// [`Landed`] for `handle` at the read that ends `steps` (each with the
/// steady traffic around it); `None` where `steps` hold no open of it
/// before the read or it counts no device counter.
pub fn landed(steps: &[(&Step, &[Flowed])], handle: Handle) -> Option<Landed> {
    let (read, earlier) = steps.split_last()?;
    let opened = |h: Handle| {
        earlier
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, (s, _))| match s {
                Step::Open { event, expect } if *expect == h => Some((i, event)),
                _ => None,
            })
    };
    let (open_at, event) = opened(handle)?;
    let counter = (event.pmu?, event.event, event.rmid);
    let leader_of = |h: Handle| opened(h).and_then(|(_, e)| e.group).unwrap_or(h);
    let leader = leader_of(handle);
    let restarts = |s: &Step| match *s {
        Step::Ioctl {
            handle: h,
            ioctl: IoctlName::Reset,
            group,
        } => h == handle || (group && leader_of(h) == leader),
        _ => false,
    };
    let start = (open_at..earlier.len())
        .rev()
        .find(|&i| restarts(earlier[i].0))
        .unwrap_or(open_at);
    let on = |flowed: &[Flowed], f: fn(&Flowed) -> u64| -> u64 {
        flowed
            .iter()
            .filter(|x| x.counter() == counter)
            .map(f)
            .sum()
    };
    let mut sure = on(read.1, |f| f.before);
    for &(step, flowed) in &earlier[start + 1..] {
        sure += on(flowed, |f| f.before + f.during);
        if let &Step::Burst {
            domain,
            event,
            rmid,
            bytes,
        } = step
        {
            if (domain, event, rmid) == counter {
                sure += bytes;
            }
        }
    }
    let unsure = on(earlier[start].1, |f| f.during) + on(read.1, |f| f.during);
    Some(Landed { sure, unsure })
}

/// The job of the moving thread last started on `domain` in `journal`.
pub fn started_job(journal: &[Entry], domain: u32) -> Option<u32> {
    journal
        .iter()
        .rev()
        .find_map(|e| match (&e.step, &e.result) {
            (Step::MovesStart { domain: d, .. }, Ok(words)) if *d == domain => {
                words.first().and_then(|&j| u32::try_from(j).ok())
            }
            _ => None,
        })
}

/// The job of the last `perf stat` started in `journal`
/// ([`Step::StatStart`]).
pub fn started_stat(journal: &[Entry]) -> Option<u32> {
    journal
        .iter()
        .rev()
        .find_map(|e| match (&e.step, &e.result) {
            (Step::StatStart { .. }, Ok(words)) => {
                words.first().and_then(|&j| u32::try_from(j).ok())
            }
            _ => None,
        })
}

/// The `perf stat` job `journal` started and did not stop, if any.
pub fn left_stat(journal: &[Entry]) -> Option<u32> {
    let stopped = journal
        .iter()
        .rev()
        .position(|e| matches!(e.step, Step::StatStop { .. }));
    let started = journal
        .iter()
        .rev()
        .position(|e| matches!(e.step, Step::StatStart { .. }))?;
    match stopped {
        Some(s) if s < started => None,
        _ => started_stat(journal),
    }
}

/// The moving threads `journal` started and did not stop: (domain, job).
pub fn left_moving(journal: &[Entry]) -> Vec<(u32, u32)> {
    let mut running = std::collections::BTreeMap::new();
    for e in journal {
        match (&e.step, &e.result) {
            (Step::MovesStart { domain, .. }, Ok(words)) => {
                if let Some(job) = words.first().and_then(|&j| u32::try_from(j).ok()) {
                    running.insert(*domain, job);
                }
            }
            (Step::MovesStop { domain, .. }, _) => {
                running.remove(domain);
            }
            _ => {}
        }
    }
    running.into_iter().collect()
}

#[cfg(test)]
impl Opened {
    /// An `mbm_total_bytes` event of domain `pmu`, enabled, read with its
    /// times (for tests).
    pub(crate) fn counter(pmu: u32, rmid: u32, group: Option<Handle>) -> Opened {
        Opened {
            pmu: Some(pmu),
            event: 2,
            rmid,
            disabled: false,
            pinned: false,
            exclusive: false,
            group,
            read_format: ReadFormat {
                times: true,
                id: false,
                group: false,
                lost: false,
            },
            cpu: 0,
        }
    }
}

#[cfg(test)]
impl Entry {
    /// A step and its result, with no times (for tests).
    pub(crate) fn untimed(step: Step, result: Result<Vec<u64>, String>) -> Entry {
        Entry {
            step,
            result,
            took_ns: 0,
            at_ns: 0,
            returned_ns: 0,
            flowed: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What landed on a counter since its open, or since a RESET of it
    /// or of its group: bursts and steady traffic between, what flowed
    /// during the RESET and the read unsure; other counters and what came
    /// before the RESET left out.
    #[test]
    fn landed_counts_from_the_last_restart_to_the_read() {
        let open = |expect, rmid, group| Step::Open {
            event: Opened::counter(1, rmid, group),
            expect,
        };
        let burst = |rmid, bytes| Step::Burst {
            domain: 1,
            event: 2,
            rmid,
            bytes,
        };
        let reset = |handle, group| Step::Ioctl {
            handle,
            ioctl: IoctlName::Reset,
            group,
        };
        let flow = |before, during| {
            vec![Flowed {
                domain: 1,
                event: 2,
                rmid: 3,
                before,
                during,
            }]
        };
        let none = Vec::new();
        let (a, b) = (flow(100, 10), flow(1000, 20));
        let steps: Vec<(Step, Vec<Flowed>)> = vec![
            (open(1, 3, None), none.clone()),
            (open(2, 4, Some(1)), none.clone()),
            (burst(3, 1 << 20), none.clone()),
            (reset(2, true), a),
            (burst(3, 64), none.clone()),
            (burst(4, 128), none.clone()),
            (Step::Read { handle: 1 }, b),
        ];
        let view: Vec<(&Step, &[Flowed])> = steps.iter().map(|(s, f)| (s, &f[..])).collect();
        assert_eq!(
            landed(&view, 1),
            Some(Landed {
                sure: 64 + 1000,
                unsure: 10 + 20
            }),
            "from the group RESET of its sibling on"
        );
        assert_eq!(landed(&view, 9), None, "never opened");
        let without_reset: Vec<(&Step, &[Flowed])> = view
            .iter()
            .enumerate()
            .map(|(i, &(s, f))| if i == 3 { (&steps[2].0, f) } else { (s, f) })
            .collect();
        assert_eq!(
            landed(&without_reset, 1).map(|l| l.sure),
            Some((1 << 20) * 2 + 100 + 10 + 64 + 1000)
        );
    }

    #[test]
    fn a_thread_started_and_not_stopped_is_left_moving_and_only_that() {
        let start = |domain| Step::MovesStart {
            domain,
            cpus: vec![2, 3],
        };
        let journal = vec![
            Entry::untimed(start(0), Ok(vec![4])),
            Entry::untimed(start(1), Ok(vec![5])),
            Entry::untimed(Step::MovesStop { domain: 0, job: 4 }, Ok(vec![2, 2])),
            Entry::untimed(start(0), Err("starting the moving thread: ...".into())),
        ];
        assert_eq!(left_moving(&journal), vec![(1, 5)]);
        assert_eq!(started_job(&journal, 0), Some(4));
        assert_eq!(left_moving(&journal[..1]), vec![(0, 4)]);
    }

    #[test]
    fn a_journal_file_reads_back_as_written() {
        let header = Header {
            pmus: 2,
            slots: 4,
            unit_bytes: 64,
            counter_width: 24,
            max_rate: 1 << 30,
            seed: 9,
            replay: "cargo xtask stress".into(),
            cpus: Cpus {
                domains: vec![vec![0, 1], vec![2, 3]],
                owners: vec![Some(0), None],
            },
        };
        let entries = vec![
            Entry {
                step: Step::Move { domain: 1 },
                result: Ok(vec![3]),
                took_ns: 5,
                at_ns: 10,
                returned_ns: 0,
                flowed: Vec::new(),
            },
            Entry {
                step: Step::Read { handle: 2 },
                result: Err("EBADF".into()),
                took_ns: 1,
                at_ns: 12,
                returned_ns: 0,
                flowed: Vec::new(),
            },
        ];
        let text = to_text(&header, &entries).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert_eq!(from_text(&text).unwrap(), (header, entries));
        // A header from before the CPUs were recorded still reads.
        let old =
            r#"{"pmus":2,"slots":4,"unit_bytes":64,"counter_width":24,"seed":9,"replay":"x"}"#;
        assert_eq!(from_text(old).unwrap().0.cpus, Cpus::default());
        let e = from_text(&(text + "{\"step\":\"nope\"}\n")).unwrap_err();
        assert!(e.starts_with("line 4"), "{e}");
        // An allowed set waited for is written as before `nowait` was.
        let waited = r#"{"step":"allowed","domain":1,"cpus":[3]}"#;
        let step: Step = serde_json::from_str(waited).unwrap();
        assert_eq!(serde_json::to_string(&step).unwrap(), waited);
        assert_eq!(Doubt::of(&step), Some(Doubt::Settles(1)));
        let issued = Step::Allowed {
            domain: 1,
            cpus: vec![],
            nowait: true,
        };
        let text = serde_json::to_string(&issued).unwrap();
        assert!(text.contains(r#""nowait":true"#), "{text}");
        assert_eq!(Doubt::of(&issued), Some(Doubt::Begins(1)));
    }
}
