//! The scenario file: a lifecycle journal written by hand, one operation a
//! line, in the order the guest and the host carry them out (syzkaller's
//! reproducers are the model). It parses into the journal's own [`Step`]s,
//! so that a scenario's run is replayed through the same model as a
//! lifecycle run; every step keeps its file's line, so that a finding
//! names it. scenarios/README.md is the user's guide; in short:
//!
//! ```text
//! # check: disabled across a move          (the printed name, optional)
//! a = open movable mbm_total_bytes rmid=1 read=times
//! c = open cpu-clock cpu=owner(movable) group=a
//! enable a group | disable a | reset a group
//! ioctl a refresh 1 EINVAL                   (an ioctl that changes no count, and its answer)
//! burst movable mbm_total_bytes rmid=1 4MiB
//! occupancy movable rmid=2 1MiB | rate movable 64MiB/s
//! read a
//! want a 4MiB                                (the read's value of a)
//! move movable | park movable | unpark movable [CPU]
//! offline 3 | offline owner(movable) | online 3
//! allowed movable 0 | allowed movable none | allowed movable default
//! allowed movable 3 nowait                   (issued only: in doubt until a cpumask or a waited allowed)
//! allowed 9 2-3 refused no-such-domain       (a malformed set the device must refuse, changing nothing)
//! reload | reload movable 3                 (perfbed.ko unloaded and loaded, the set changed meanwhile)
//! stat movable rmid=6 start | stat movable stop  (perf stat -a -I across the lines between)
//! wait 300ms
//! mux movable 2s                             (the mux interval, put back after)
//! cpumask movable 3 | cpumask movable none   (where the PMU counts: asserted)
//! violations                                 (no new placement violation since the first)
//! lost_wraps movable | lost_wraps movable 1+  (the PMU's lost wraps: marked, then grown by)
//! irqs_on_owner movable | irqs_off_owner movable 3-  (its interrupts, likewise; N- is N or fewer)
//! close a
//! ```
//!
//! Everything that can be refused without a guest is refused here, before
//! a VM boots: the error names the file, the line and what was expected.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use perfbed_device::cpus::parse_cpu_list;
use perfbed_device::DeviceConfig;

use crate::build::image::arch::Arch;
use crate::checks::pmu::context::EVENT_FILES;
use crate::checks::pmu::moves::movable_in;
use crate::model::{DeviceShape, Handle, Observed, ValueRule};

use super::journal::{
    landed, Bound, Condition, Cpus, DriverCount, Flowed, Growth, IoctlName, Malformed, Opened,
    ReadFormat, Request, Step, HOTPLUG_STATES,
};
use super::replay;
use super::scenario_write::bytes_text;

/// A scenario refused: where, and what was expected there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}: {message}", file.display())]
pub struct ScenarioError {
    pub file: PathBuf,
    pub line: usize,
    pub message: String,
}

/// The guest a scenario runs on, as far as the parser must know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub cpus: u32,
    /// Each domain's allowed CPUs at boot.
    pub domains: Vec<Vec<u32>>,
    pub rmids: u32,
    /// The device's counter unit in bytes: a burst is whole units.
    pub unit_bytes: u64,
    /// The guest's architecture: on arm64 CPU 0 goes offline too
    /// (`offline 0`), and with it the CPU that holds the parked PMUs'
    /// events; a file with an `# arch:` header runs on that one only.
    pub arch: Arch,
}

/// A parsed scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    pub file: PathBuf,
    /// The `# check:` header: the name of the `cargo xtask run` check it
    /// stands for.
    pub check: Option<String>,
    pub ops: Vec<Op>,
    /// Each opened event's name, by the handle it got.
    pub names: BTreeMap<Handle, String>,
    /// The layout's domains it was parsed for (their allowed CPUs at boot).
    pub domains: Vec<Vec<u32>>,
}

/// One operation: its line, the journal step, and what the line pins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    pub line: usize,
    pub step: Step,
    /// An open on `cpu=owner(d)` or an `offline owner(d)`: the runner puts
    /// domain `d`'s CPU, as its `cpumask` shows it then, into the step (the
    /// parser's CPU there is the one it predicts, see [`Parser::owners`]).
    pub on_owner: Option<u32>,
    /// For a read: the events it shows, in the order it shows them.
    pub shows: Vec<Handle>,
    /// For a placement step: the domains it parks (`true`) or places
    /// again (`false`), as the parser predicts from the online CPUs and
    /// the allowed sets.
    pub parks: Vec<(u32, bool)>,
    pub wants: Vec<Want>,
}

/// A `want` line: what the model must predict and the run must show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// The read before it shows `handle` with this value.
    Value {
        line: usize,
        handle: Handle,
        name: String,
        bytes: u64,
    },
    /// The open before it is refused with this errno.
    Refused { line: usize, errno: String },
    /// The read before it shows `handle` with all that landed on its
    /// counter since its open or last RESET (`want NAME landed`): for a
    /// count fed by a steady rate, which no value can pin before the run.
    Landed {
        line: usize,
        handle: Handle,
        name: String,
    },
    /// The read before it shows `handle` with a count whose scaled
    /// estimate, `value * time_enabled / time_running` since its open or
    /// last RESET, is within `percent` % of all that landed on its counter
    /// then (`want NAME scaled N%`): perf's estimate where a count is short
    /// and shows it, under traffic steady enough for scaling to hold.
    Scaled {
        line: usize,
        handle: Handle,
        name: String,
        percent: u64,
    },
}

/// The operations a line can start with.
const OPERATIONS: &str = "open (as NAME = open ...), enable, disable, reset, ioctl, read, want, close, burst, occupancy, rate, move, moves, park, unpark, offline, online, allowed, reload, stat, wait, until, mux, cpumask, violations, lost_wraps, irqs_on_owner, irqs_off_owner";

/// Whether `text` has a line that fails a hotplug operation (`fails at`,
/// `completes past`): it needs a kernel that can (the debug one).
pub fn fails_hotplug(text: &str) -> bool {
    text.lines().any(|l| {
        let words: Vec<&str> = l
            .split('#')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect();
        matches!(
            words[..],
            ["offline" | "online", _, "fails", "at", _]
                | ["offline" | "online", _, "completes", "past", _]
        )
    })
}

/// How long an `until` waits without a `within`.
const UNTIL_WITHIN_MS: u64 = 10_000;

/// The requests of an `ioctl` line.
const REQUESTS: &str = "refresh COUNT, period PERIOD, set-filter FILTER, set-output none|NAME, id, pause-output on|off, set-bpf none, query-bpf, modify-attributes";

/// The errnos the model expects an open to be refused with.
const ERRNOS: [&str; 3] = ["ENODEV", "EINVAL", "EBADF"];

/// The header of a scenario that runs on one architecture only (one whose
/// lines another refuses, such as arm64's `offline 0`).
const ARCH_HEADER: &str = "# arch:";

fn arch_named(name: &str) -> Option<Arch> {
    clap::ValueEnum::from_str(name.trim(), false).ok()
}

/// The architecture `text`'s `# arch:` header names, if it has one (the
/// parser refuses a header that names none).
pub fn arch_of(text: &str) -> Option<Arch> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(ARCH_HEADER))
        .and_then(arch_named)
}

/// Parses `text`, read from `file`, for a guest of `layout`; the agent's
/// next handle is `first_handle` (the parser numbers the opens from it).
pub fn parse(
    file: &Path,
    text: &str,
    layout: &Layout,
    first_handle: Handle,
) -> Result<Scenario, ScenarioError> {
    let mut p = Parser {
        layout,
        names: BTreeMap::new(),
        handles: BTreeMap::new(),
        opened: BTreeMap::new(),
        software_cpus: BTreeMap::new(),
        next_handle: first_handle,
        online: (0..layout.cpus).collect(),
        allowed: layout.domains.clone(),
        owners: layout.domains.iter().map(|d| d.first().copied()).collect(),
        moving: BTreeMap::new(),
        doubt: BTreeMap::new(),
        racing: BTreeSet::new(),
        ops: Vec::new(),
        counts_marked: BTreeSet::new(),
        stat: None,
        flowing: BTreeSet::new(),
    };
    let mut check = None;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let err = |message: String| ScenarioError {
            file: file.to_path_buf(),
            line,
            message,
        };
        if let Some(name) = raw.trim().strip_prefix("# check:") {
            if check.is_some() {
                return Err(err("a second `# check:` header".into()));
            }
            check = Some(name.trim().to_string());
            continue;
        }
        if let Some(name) = raw.trim().strip_prefix(ARCH_HEADER) {
            match arch_named(name) {
                Some(arch) if arch == layout.arch => {}
                Some(arch) => {
                    return Err(err(format!(
                        "a scenario for {} guests only (`--arch {}`), and this guest is {}",
                        arch.kernel_arch(),
                        name.trim(),
                        layout.arch.kernel_arch()
                    )))
                }
                None => return Err(err(format!("`{}`: expected x86_64 or arm64", name.trim()))),
            }
            continue;
        }
        let body = raw.split('#').next().unwrap_or("").trim();
        if body.is_empty() {
            continue;
        }
        p.line(line, body).map_err(err)?;
    }
    if let Some((&domain, &(_, line))) = p.moving.iter().next() {
        return Err(ScenarioError {
            file: file.to_path_buf(),
            line,
            message: format!(
                "`moves {domain} start` is never stopped: end it with `moves {domain} stop` (the thread ends after its round, every CPU back online)"
            ),
        });
    }
    if let Some(((domain, _), line)) = p.stat {
        return Err(ScenarioError {
            file: file.to_path_buf(),
            line,
            message: format!(
                "this perf stat is never stopped: end it with `stat {domain} stop` (its intervals are judged there)"
            ),
        });
    }
    if let Some((&domain, &line)) = p.doubt.iter().next() {
        return Err(ScenarioError {
            file: file.to_path_buf(),
            line,
            message: format!(
                "domain {domain}'s allowed set is not waited for here and never settled: end the doubt with `cpumask {domain} CPU|none` (waits for that mask) or an `allowed {domain} ...` that waits"
            ),
        });
    }
    Ok(Scenario {
        file: file.to_path_buf(),
        check,
        ops: p.ops,
        names: p.handles,
        domains: layout.domains.clone(),
    })
}

struct Parser<'a> {
    layout: &'a Layout,
    /// Open events by name.
    names: BTreeMap<String, Handle>,
    /// Open events by handle, as opened.
    opened: BTreeMap<Handle, Opened>,
    /// Each cpu-clock event's CPU, as the parser predicts it (its `cpu=`,
    /// or the domain's CPU then for `cpu=owner(DOMAIN)`): what an offline
    /// takes apart ([`Parser::offline_detaches`]).
    software_cpus: BTreeMap<Handle, u32>,
    next_handle: Handle,
    online: BTreeSet<u32>,
    allowed: Vec<Vec<u32>>,
    /// Each domain's CPU as the parser predicts it (`None`: parked), by the
    /// rule the kernel places by and the model replays
    /// ([`replay::Predictor`]): on its first CPU at the start, where a move
    /// takes it, and, once its CPU goes offline or leaves its allowed set,
    /// on the first allowed CPU online. Only an `owner(d)` line's
    /// bookkeeping uses it: the runner takes the CPU from `cpumask`.
    owners: Vec<Option<u32>>,
    /// The domains a thread of the guest moves now (`moves D start`): the
    /// CPUs it takes offline and back, and the line that started it.
    moving: BTreeMap<u32, (Vec<u32>, usize)>,
    /// The domains in doubt ([`super::journal::Doubt`]): each since the line of the
    /// `allowed ... nowait` that put it there.
    doubt: BTreeMap<u32, usize>,
    /// The events opened on a domain in doubt: each may have been refused
    /// (`ENODEV`), so no want can pin it or its reads.
    racing: BTreeSet<Handle>,
    ops: Vec<Op>,
    /// Every name an open gave, by handle.
    handles: BTreeMap<Handle, String>,
    /// The driver counts of each domain with a line so far (`lost_wraps`,
    /// `irqs_on_owner`, ...): a count grows from it.
    counts_marked: BTreeSet<(u32, DriverCount)>,
    /// The perf stat running (`stat D rmid=N start`): its (domain, RMID)
    /// and line.
    stat: Option<((u32, u32), usize)>,
    /// The counters a `rate` flows into now: (domain, event, RMID).
    flowing: BTreeSet<(u32, u32, u32)>,
}

impl Parser<'_> {
    fn line(&mut self, line: usize, body: &str) -> Result<(), String> {
        let words: Vec<&str> = body.split_whitespace().collect();
        if words.len() >= 2 && words[1] == "=" {
            return match words.get(2) {
                Some(&"open") => self.open(line, words[0], &words[3..]),
                _ => Err(format!(
                    "`{} = ...`: expected `{} = open ...`",
                    words[0], words[0]
                )),
            };
        }
        let (op, args) = (words[0], &words[1..]);
        self.still_for(op, args)?;
        let was = self.parked_all();
        let step = match op {
            "open" => return Err("an open needs a name: `NAME = open ...`".into()),
            "want" => return self.want(line, args),
            "enable" | "disable" | "reset" => {
                let (name, group) = match args {
                    [name] => (name, false),
                    [name, "group"] => (name, true),
                    _ => return Err(format!("expected `{op} NAME` or `{op} NAME group`")),
                };
                let ioctl = match op {
                    "enable" => IoctlName::Enable,
                    "disable" => IoctlName::Disable,
                    _ => IoctlName::Reset,
                };
                Step::Ioctl {
                    handle: self.handle(name)?,
                    ioctl,
                    group,
                }
            }
            "ioctl" => self.request(args)?,
            "read" => {
                let [name] = args else {
                    return Err("expected `read NAME`".into());
                };
                let handle = self.handle(name)?;
                let shows = if self.opened[&handle].read_format.group {
                    let leader = self.opened[&handle].group.unwrap_or(handle);
                    std::iter::once(leader)
                        .chain(
                            self.opened
                                .iter()
                                .filter(|(_, o)| o.group == Some(leader))
                                .map(|(&h, _)| h),
                        )
                        .collect()
                } else {
                    vec![handle]
                };
                return self.push(line, Step::Read { handle }, shows, was);
            }
            "close" => {
                let [name] = args else {
                    return Err("expected `close NAME`".into());
                };
                let handle = self.handle(name)?;
                self.names.remove(*name);
                self.opened.remove(&handle);
                // A closed leader's siblings stay open, each a group of
                // its own (perf promotes them).
                for o in self.opened.values_mut() {
                    if o.group == Some(handle) {
                        o.group = None;
                    }
                }
                Step::Close { handle }
            }
            "burst" => {
                let [domain, event, rmid, bytes] = args else {
                    return Err("expected `burst DOMAIN EVENT rmid=N BYTES`".into());
                };
                let domain = self.domain(domain)?;
                let event = device_event(event)?;
                if event == 1 {
                    return Err(
                        "llc_occupancy is a gauge: set it with `occupancy DOMAIN rmid=N BYTES`"
                            .into(),
                    );
                }
                let bytes = bytes_of(bytes)?;
                let unit = self.layout.unit_bytes.max(1);
                if bytes % unit != 0 {
                    return Err(format!(
                        "{bytes} bytes: a burst is whole units of the device's counter ({unit} bytes), or its count could not be exact"
                    ));
                }
                Step::Burst {
                    domain,
                    event,
                    rmid: self.rmid(rmid)?,
                    bytes,
                }
            }
            "occupancy" => {
                let [domain, rmid, bytes] = args else {
                    return Err("expected `occupancy DOMAIN rmid=N BYTES`".into());
                };
                Step::Occupancy {
                    domain: self.domain(domain)?,
                    rmid: self.rmid(rmid)?,
                    bytes: bytes_of(bytes)?,
                }
            }
            "rate" => {
                let (domain, counter, rate) = match args {
                    [domain, rate] => (domain, None, rate),
                    [domain, event, rmid, rate] => (domain, Some((event, rmid)), rate),
                    _ => {
                        return Err(
                            "expected `rate DOMAIN [EVENT rmid=N] BYTES/s` (0/s stops it)".into(),
                        )
                    }
                };
                let Some(per_sec) = rate.strip_suffix("/s") else {
                    return Err(format!("`{rate}`: expected a rate such as 64MiB/s"));
                };
                let (event, rmid) = match counter {
                    None => (
                        perfbed_device::regs::Event::MbmLocalBytes as u32,
                        super::generate::RMID_RATE,
                    ),
                    Some((event, rmid)) => {
                        let event = device_event(event)?;
                        if event == 1 {
                            return Err(
                                "llc_occupancy is a gauge: set it with `occupancy DOMAIN rmid=N BYTES`"
                                    .into(),
                            );
                        }
                        let rmid = self.rmid(rmid)?;
                        if rmid == super::generate::RMID_RATE {
                            return Err(format!(
                                "rmid={rmid} carries the background rate: a watched rate needs another RMID"
                            ));
                        }
                        (event, rmid)
                    }
                };
                let (domain, bytes_per_sec) = (self.domain(domain)?, bytes_of(per_sec)?);
                if bytes_per_sec == 0 {
                    self.flowing.remove(&(domain, event, rmid));
                } else {
                    self.flowing.insert((domain, event, rmid));
                }
                Step::Rate {
                    domain,
                    rmid,
                    event,
                    bytes_per_sec,
                }
            }
            "move" | "park" => {
                let [domain] = args else {
                    return Err(format!("expected `{op} DOMAIN`"));
                };
                let domain = self.domain(domain)?;
                if self.layout.domains[domain as usize].contains(&0)
                    || self.allowed[domain as usize].contains(&0)
                {
                    return Err(format!(
                        "domain {domain} allows CPU 0, which never goes offline: `{op}` needs a domain without it (`movable`)"
                    ));
                }
                if op == "move" {
                    let online = self.allowed[domain as usize]
                        .iter()
                        .filter(|c| self.online.contains(c))
                        .count();
                    if online < 2 {
                        return Err(format!(
                            "domain {domain} has {online} allowed CPU online here: a move needs two (the owner goes, another takes over)"
                        ));
                    }
                    let owner = self.owners[domain as usize];
                    if let Some(cpu) = owner {
                        self.offline_detaches(cpu);
                    }
                    self.owners[domain as usize] = self.allowed_online(domain, owner);
                    Step::Move { domain }
                } else {
                    for &cpu in &self.layout.domains[domain as usize] {
                        if self.online.remove(&cpu) {
                            self.offline_detaches(cpu);
                        }
                    }
                    self.owners[domain as usize] = None;
                    Step::Park { domain }
                }
            }
            "moves" => self.moves(line, args)?,
            "unpark" => {
                let (domain, cpu) = match args {
                    [domain] => (self.domain(domain)?, None),
                    [domain, cpu] => (self.domain(domain)?, Some(self.cpu(cpu)?)),
                    _ => return Err("expected `unpark DOMAIN [CPU]`".into()),
                };
                if !self.parked(domain) {
                    return Err(format!("domain {domain} is not parked here"));
                }
                let cpus = &self.layout.domains[domain as usize];
                let cpu = cpu.unwrap_or(cpus[0]);
                if !cpus.contains(&cpu) {
                    return Err(format!(
                        "CPU {cpu} is not domain {domain}'s (CPUs {cpus:?})"
                    ));
                }
                self.online.insert(cpu);
                self.owners[domain as usize] = Some(cpu);
                Step::Unpark { domain, cpu }
            }
            "offline" | "online" if args.len() > 1 => return self.fail_at(line, op, args, was),
            "offline" | "online" => {
                let [cpu] = args else {
                    return Err(format!("expected `{op} CPU`"));
                };
                if op == "offline" && cpu.starts_with("owner(") {
                    return self.offline_owner(line, cpu, was);
                }
                let cpu = self.cpu(cpu)?;
                if op == "offline" {
                    if cpu == 0 && !self.layout.arch.cpu0_goes_offline() {
                        return Err("CPU 0 never goes offline (on x86: arm64's can)".into());
                    }
                    if !self.online.remove(&cpu) {
                        return Err(format!("CPU {cpu} is offline here already"));
                    }
                    self.offline_detaches(cpu);
                    self.place_all();
                    Step::Offline { cpu }
                } else {
                    // Back on a parked domain's CPU: the domain is placed
                    // again, which the journal calls an unpark.
                    // One in doubt is placed when a line settles it.
                    let unparks = (0..self.allowed.len() as u32).find(|&d| {
                        self.parked(d)
                            && self.allowed[d as usize].contains(&cpu)
                            && !self.doubt.contains_key(&d)
                    });
                    if !self.online.insert(cpu) {
                        return Err(format!("CPU {cpu} is online here already"));
                    }
                    match unparks {
                        Some(domain) => {
                            self.owners[domain as usize] = Some(cpu);
                            Step::Unpark { domain, cpu }
                        }
                        None => Step::Online { cpu },
                    }
                }
            }
            "allowed" if args.get(2) == Some(&"refused") => self.refused_set(args)?,
            "allowed" => {
                let (domain, set, nowait) = match args {
                    [domain, set] => (domain, set, false),
                    [domain, set, "nowait"] => (domain, set, true),
                    _ => return Err(
                        "expected `allowed DOMAIN CPUS [nowait]` (a list such as 2-3, `none` or `default`)"
                            .into(),
                    ),
                };
                let domain = self.domain(domain)?;
                let cpus = self.cpu_set(domain, set)?;
                self.allowed[domain as usize] = cpus.clone();
                self.place_all();
                if nowait {
                    self.doubt.entry(domain).or_insert(line);
                } else {
                    self.doubt.remove(&domain);
                }
                Step::Allowed {
                    domain,
                    cpus,
                    nowait,
                }
            }
            "reload" => self.reload(args)?,
            "stat" => self.stat(line, args)?,
            "wait" => {
                let [time] = args else {
                    return Err("expected `wait TIME` (such as 300ms or 2s)".into());
                };
                Step::Wait {
                    ms: millis_of(time)?,
                }
            }
            "until" => self.until(args)?,
            "cpumask" => {
                let [domain, cpu] = args else {
                    return Err(
                        "expected `cpumask DOMAIN CPU` or `cpumask DOMAIN none` (parked)".into(),
                    );
                };
                let domain = self.domain(domain)?;
                let cpus = match *cpu {
                    "none" => vec![],
                    cpu => vec![self.cpu(cpu)?],
                };
                let parked = self.parked(domain);
                match cpus.first() {
                    None if !parked => {
                        return Err(format!("domain {domain} is not parked here (an allowed CPU is online)"))
                    }
                    Some(_) if parked => {
                        return Err(format!("domain {domain} is parked here: expected `cpumask {domain} none`"))
                    }
                    Some(c) if !self.allowed[domain as usize].contains(c) || !self.online.contains(c) => {
                        return Err(format!(
                            "CPU {c} is not an online allowed CPU of domain {domain} here (allowed {:?})",
                            self.allowed[domain as usize]
                        ))
                    }
                    _ => {}
                }
                if self.doubt.remove(&domain).is_some() {
                    let online = self.online_allowed(domain);
                    if online.len() > 1 {
                        return Err(format!(
                            "this `cpumask` settles domain {domain}'s allowed set, which was not waited for, and the set has CPUs {online:?} online here: the PMU may be on any of them; settle it with an `allowed {domain} ...` that waits, or a set of one CPU"
                        ));
                    }
                }
                Step::Cpumask { domain, cpus }
            }
            word if DriverCount::named(word).is_some() => {
                let count = DriverCount::named(word).unwrap_or(DriverCount::LostWraps);
                let (domain, growth) = match args {
                    [domain] => (self.domain(domain)?, None),
                    [domain, growth] => (self.domain(domain)?, Some(growth)),
                    _ => return Err(format!("expected `{op} DOMAIN` (marks the count), then `{op} DOMAIN N`, `{op} DOMAIN N+` or `{op} DOMAIN N-` (grown by N, by N or more, or by N or fewer since the line before)")),
                };
                let grown = match growth {
                    None => None,
                    Some(growth) => {
                        let (number, bound) =
                            match (growth.strip_suffix('+'), growth.strip_suffix('-')) {
                                (Some(n), _) => (n, Bound::OrMore),
                                (_, Some(n)) => (n, Bound::OrFewer),
                                _ => (*growth, Bound::Exactly),
                            };
                        let by = number.parse().map_err(|_| {
                            format!("`{growth}`: expected a growth such as 0, 1, 1+ or 3-")
                        })?;
                        if !self.counts_marked.contains(&(domain, count)) {
                            return Err(format!(
                                "`{op} {} {growth}` counts from an earlier `{op} {}` line: mark the count with one before",
                                args[0], args[0]
                            ));
                        }
                        Some(Growth { by, bound })
                    }
                };
                self.counts_marked.insert((domain, count));
                Step::DriverCount {
                    domain,
                    count,
                    grown,
                }
            }
            "violations" => {
                if !args.is_empty() {
                    return Err("expected `violations` alone (no new placement violation since the first `violations` line)".into());
                }
                Step::Violations
            }
            "mux" => {
                let [domain, time] = args else {
                    return Err(
                        "expected `mux DOMAIN TIME` (such as 2s: the PMU's mux interval)".into(),
                    );
                };
                let domain = self.domain(domain)?;
                let ms = millis_of(time)?;
                if ms == 0 {
                    return Err(format!("`{time}`: a mux interval is 1ms or more"));
                }
                Step::MuxInterval { domain, ms }
            }
            other => {
                return Err(format!(
                    "unknown operation `{other}`; expected one of: {OPERATIONS}"
                ))
            }
        };
        self.push(line, step, vec![], was)
    }

    /// `until NAME running [within TIME]`: the host reads the event until
    /// its `time_running` grows, for at most TIME ([`UNTIL_WITHIN_MS`]
    /// if not written).
    fn until(&self, args: &[&str]) -> Result<Step, String> {
        let usage =
            "expected `until NAME running [within TIME]` (TIME such as 5s: how long at most)";
        let (name, condition, within) = match args {
            [name, condition] => (name, condition, None),
            [name, condition, "within", time] => (name, condition, Some(time)),
            _ => return Err(usage.into()),
        };
        let condition = match *condition {
            "running" => Condition::Running,
            other => return Err(format!("`{other}`: unknown condition; {usage}")),
        };
        let handle = self.handle(name)?;
        if !self.opened[&handle].read_format.times {
            return Err(format!(
                "`{name}` is read without its clocks: `until {name} running` needs it opened with `read=times`"
            ));
        }
        let within_ms = match within {
            None => UNTIL_WITHIN_MS,
            Some(time) => match millis_of(time)? {
                0 => return Err(format!("`{time}`: an `until` waits 1ms or more")),
                ms => ms,
            },
        };
        Ok(Step::Until {
            handle,
            condition,
            within_ms,
        })
    }

    /// `ioctl NAME REQUEST [ARG] ANSWER`: an ioctl that changes no count,
    /// and the answer it must give (`ok` or an errno).
    fn request(&self, args: &[&str]) -> Result<Step, String> {
        let usage = format!("expected `ioctl NAME REQUEST [ARG] ANSWER`: REQUEST one of {REQUESTS}, ANSWER `ok` or an errno such as EINVAL");
        let [name, request, arg @ .., answer] = args else {
            return Err(usage);
        };
        let handle = self.handle(name)?;
        let refused = match *answer {
            "ok" => None,
            e if e.len() > 1
                && e.starts_with('E')
                && e.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit()) =>
            {
                Some(e.to_string())
            }
            other => return Err(format!("`{other}`: {usage}")),
        };
        let number = |what: &str| -> Result<&str, String> {
            match arg {
                [n] => Ok(n),
                _ => Err(format!("expected `ioctl {name} {request} {what} ANSWER`")),
            }
        };
        let none = || -> Result<(), String> {
            match arg {
                [] => Ok(()),
                _ => Err(format!(
                    "expected `ioctl {name} {request} ANSWER`: {request} takes no argument"
                )),
            }
        };
        let request = match *request {
            "refresh" => Request::Refresh {
                count: number("COUNT")?
                    .parse()
                    .map_err(|_| format!("`{}`: expected a count such as 1", arg[0]))?,
            },
            "period" => Request::Period {
                period: number("PERIOD")?
                    .parse()
                    .map_err(|_| format!("`{}`: expected a period such as 1000", arg[0]))?,
            },
            "set-filter" if !arg.is_empty() => Request::SetFilter {
                filter: arg.join(" "),
            },
            "set-filter" => return Err(format!("expected `ioctl {name} set-filter FILTER ANSWER` (the filter's words up to the answer)")),
            "set-output" => match number("none|NAME")? {
                "none" => Request::SetOutput { target: None },
                target => Request::SetOutput {
                    target: Some(self.handle(target)?),
                },
            },
            "id" => {
                none()?;
                Request::Id
            }
            "pause-output" => match number("on|off")? {
                "on" => Request::PauseOutput { pause: true },
                "off" => Request::PauseOutput { pause: false },
                other => return Err(format!("`{other}`: expected on or off")),
            },
            "set-bpf" => match number("none")? {
                "none" => Request::SetBpf,
                other => {
                    return Err(format!(
                        "`{other}`: a scenario has no BPF program to give: `set-bpf none` (fd -1)"
                    ))
                }
            },
            "query-bpf" => {
                none()?;
                Request::QueryBpf
            }
            "modify-attributes" => {
                none()?;
                Request::ModifyAttributes {
                    event: self.opened[&handle],
                }
            }
            other => return Err(format!("`{other}`: {usage}")),
        };
        Ok(Step::Request {
            handle,
            request,
            refused,
        })
    }

    /// `offline owner(DOMAIN)`: the CPU the domain's PMU counts on when the
    /// line runs, which the runner reads from `cpumask`. Refused here only
    /// where no run can carry it out: a parked domain (no owner), or one
    /// whose only allowed CPU online is CPU 0.
    fn offline_owner(&mut self, line: usize, word: &str, was: Vec<bool>) -> Result<(), String> {
        let role = word
            .strip_prefix("owner(")
            .and_then(|r| r.strip_suffix(')'))
            .ok_or_else(|| format!("`{word}`: expected owner(DOMAIN)"))?;
        let domain = self.domain(role)?;
        let candidates = self.online_allowed(domain);
        match candidates[..] {
            [] => {
                return Err(format!(
                    "domain {domain} is parked here: it has no owner to take offline"
                ))
            }
            [0] if !self.layout.arch.cpu0_goes_offline() => {
                return Err(format!(
                    "owner({role}) is CPU 0 here (the domain's only allowed CPU online), which never goes offline (on x86: arm64's can)"
                ))
            }
            _ => {}
        }
        let cpu = self.owners[domain as usize]
            .filter(|c| candidates.contains(c))
            .unwrap_or(candidates[0]);
        self.not_moved(cpu)?;
        self.online.remove(&cpu);
        self.offline_detaches(cpu);
        self.place_all();
        self.push(line, Step::Offline { cpu }, vec![], was)?;
        self.ops.last_mut().expect("just pushed").on_owner = Some(domain);
        Ok(())
    }

    /// `offline CPU fails at STATE`, `online CPU completes past STATE` and
    /// the like: the operation with the hotplug state armed to fail
    /// ([`HOTPLUG_STATES`]), which leaves the CPU as it was. An offline of
    /// a PMU's CPU that ran perf's teardown (it completed, or failed below
    /// perf's state) moved the PMU to another allowed CPU online, where
    /// the rollback leaves it; anything else leaves every PMU where it is.
    fn fail_at(
        &mut self,
        line: usize,
        op: &str,
        args: &[&str],
        was: Vec<bool>,
    ) -> Result<(), String> {
        let usage =
            || format!("expected `{op} CPU fails at STATE` or `{op} CPU completes past STATE`");
        let (word, completes, state) = match args {
            [cpu, "fails", "at", state] => (*cpu, false, *state),
            [cpu, "completes", "past", state] => (*cpu, true, *state),
            _ => return Err(usage()),
        };
        let Some(&(_, below_perf)) = HOTPLUG_STATES.iter().find(|(n, _)| *n == state) else {
            let names: Vec<&str> = HOTPLUG_STATES.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "`{state}`: not a hotplug state a line can arm; these are: {}",
                names.join(", ")
            ));
        };
        let online = op == "online";
        let (cpu, on_owner) = match word.strip_prefix("owner(") {
            Some(_) if online => {
                return Err(format!(
                    "`{word}`: an online names the offline CPU it brings back by number"
                ))
            }
            Some(role) => {
                let role = role
                    .strip_suffix(')')
                    .ok_or_else(|| format!("`{word}`: expected owner(DOMAIN)"))?;
                let domain = self.domain(role)?;
                let candidates = self.online_allowed(domain);
                let owner = self.owners[domain as usize].filter(|c| candidates.contains(c));
                match owner.or(candidates.first().copied()) {
                    Some(cpu) => (cpu, Some(domain)),
                    None => {
                        return Err(format!(
                            "domain {domain} is parked here: it has no owner to take offline"
                        ))
                    }
                }
            }
            None => (self.cpu(word)?, None),
        };
        if !online && cpu == 0 && !self.layout.arch.cpu0_goes_offline() {
            return Err("CPU 0 never goes offline (on x86: arm64's can)".into());
        }
        if self.online.contains(&cpu) == online {
            return Err(format!(
                "CPU {cpu} is {} here already",
                if online { "online" } else { "offline" }
            ));
        }
        self.not_moved(cpu)?;
        if !online && (completes || below_perf) {
            for d in 0..self.owners.len() {
                if self.owners[d] == Some(cpu) {
                    let next = self.allowed_online(d as u32, Some(cpu));
                    self.owners[d] = next.or(Some(cpu));
                }
            }
        }
        let step = Step::FailAt {
            cpu,
            online,
            state: state.to_string(),
            completes,
        };
        self.push(line, step, vec![], was)?;
        self.ops.last_mut().expect("just pushed").on_owner = on_owner;
        Ok(())
    }

    /// `allowed DOMAIN CPUS refused ERROR`: a set the device must refuse
    /// with ERROR, as a device of the layout's shape does (any domain
    /// number and CPU list: one it does not have is the point).
    fn refused_set(&self, args: &[&str]) -> Result<Step, String> {
        let names: Vec<&str> = Malformed::ALL.iter().map(|m| m.name()).collect();
        let usage = format!(
            "expected `allowed DOMAIN CPUS refused ERROR`, ERROR one of {}",
            names.join(", ")
        );
        let [domain, set, _, error] = args else {
            return Err(usage);
        };
        let error = Malformed::ALL
            .into_iter()
            .find(|m| m.name() == *error)
            .ok_or_else(|| format!("`{error}`: {usage}"))?;
        let domain = match self.domain(domain) {
            Ok(d) => d,
            Err(e) => domain.parse::<u32>().map_err(|_| e)?,
        };
        let cpus = match *set {
            "none" => vec![],
            list => parse_cpu_list(list)
                .map_err(|e| format!("`{list}`: {e}; expected a CPU list such as 2-3 or `none`"))?,
        };
        let config = DeviceConfig {
            domains: self.layout.domains.clone(),
            rmids: self.layout.rmids,
            unit_bytes: self.layout.unit_bytes,
            ..DeviceConfig::default()
        };
        match Malformed::of(&config, domain, &cpus)? {
            None => Err(format!(
                "the device takes the set `{set}` for domain {domain}: `refused` is for a set it must refuse ({})",
                names.join(", ")
            )),
            Some((m, e)) if m != error => Err(format!(
                "the device refuses it with {} ({e}), not {}",
                m.name(),
                error.name()
            )),
            Some(_) => Ok(Step::AllowedRefused {
                domain,
                cpus,
                error,
            }),
        }
    }

    /// `moves DOMAIN start` / `moves DOMAIN stop`.
    fn moves(&mut self, line: usize, args: &[&str]) -> Result<Step, String> {
        let [domain, what] = args else {
            return Err("expected `moves DOMAIN start` or `moves DOMAIN stop`".into());
        };
        let domain = self.domain(domain)?;
        match *what {
            "start" => {
                if let Some((_, at)) = self.moving.get(&domain) {
                    return Err(format!(
                        "a thread moves domain {domain} already (line {at})"
                    ));
                }
                if self.allowed[domain as usize].contains(&0) {
                    return Err(format!(
                        "domain {domain} allows CPU 0, which never goes offline: `moves` needs a domain without it (`movable`)"
                    ));
                }
                let cpus = self.online_allowed(domain);
                if cpus.len() < 2 {
                    return Err(format!(
                        "domain {domain} has {} allowed CPU online here: the thread needs two, so that the PMU moves and never parks",
                        cpus.len()
                    ));
                }
                for (d, set) in self.allowed.iter().enumerate() {
                    if d as u32 != domain && set.iter().any(|c| cpus.contains(c)) {
                        return Err(format!(
                            "domain {d}'s allowed set {set:?} shares CPUs with domain {domain}'s {cpus:?}: the thread would place it unseen"
                        ));
                    }
                }
                for (h, o) in &self.opened {
                    let bound = u32::try_from(o.cpu).ok().filter(|c| cpus.contains(c));
                    if let (None, Some(cpu)) = (o.pmu, bound) {
                        if !self.in_a_device_group(o.group.unwrap_or(*h)) {
                            return Err(format!(
                                "`{}` is a cpu-clock event on CPU {cpu}, which the thread takes offline: perf takes it apart at a moment the journal cannot know; open it on another CPU",
                                self.handles[h]
                            ));
                        }
                    }
                }
                self.moving.insert(domain, (cpus.clone(), line));
                Ok(Step::MovesStart { domain, cpus })
            }
            "stop" => {
                if self.moving.remove(&domain).is_none() {
                    return Err(format!(
                        "no thread moves domain {domain} here: `moves {domain} start` first"
                    ));
                }
                // After a whole round: on the first CPU of the round.
                self.owners[domain as usize] = self.allowed_online(domain, None);
                Ok(Step::MovesStop { domain, job: 0 })
            }
            other => Err(format!(
                "`moves {domain} {other}`: expected `moves DOMAIN start` or `moves DOMAIN stop`"
            )),
        }
    }

    /// A domain's allowed set as a line writes it: a CPU list (`2-3`),
    /// `none` or `default`, each CPU one the guest has.
    fn cpu_set(&self, domain: u32, word: &str) -> Result<Vec<u32>, String> {
        let cpus = match word {
            "none" => vec![],
            "default" => self.layout.domains[domain as usize].clone(),
            list => parse_cpu_list(list).map_err(|e| {
                format!("`{list}`: {e}; expected a CPU list such as 2-3, `none` or `default`")
            })?,
        };
        for &cpu in &cpus {
            self.check_cpu(cpu)?;
        }
        Ok(cpus)
    }

    /// `reload` or `reload DOMAIN CPUS`: perfbed.ko unloaded (which it
    /// refuses with an event open) and loaded again, the domain's set
    /// changed meanwhile; every PMU registers afresh, placed by the sets
    /// then, and its driver counts start from zero.
    fn reload(&mut self, args: &[&str]) -> Result<Step, String> {
        let allowed = match args {
            [] => None,
            [domain, set] => {
                let domain = self.domain(domain)?;
                Some((domain, self.cpu_set(domain, set)?))
            }
            _ => {
                return Err(
                    "expected `reload` or `reload DOMAIN CPUS` (the set given while perfbed.ko is unloaded: a list such as 3, `none` or `default`)"
                        .into(),
                )
            }
        };
        if let Some(name) = self.names.keys().next() {
            return Err(format!(
                "`reload` unloads perfbed.ko, which an open event keeps loaded: close {name} first"
            ));
        }
        if let Some((_, line)) = &self.stat {
            return Err(format!(
                "`reload` unloads perfbed.ko, which the perf stat of line {line} keeps loaded: `stat ... stop` first"
            ));
        }
        if let Some((d, (_, at))) = self.moving.iter().next() {
            return Err(format!(
                "`reload` places every PMU afresh, and the thread of line {at} moves domain {d}'s: `moves {d} stop` first"
            ));
        }
        if let Some((&d, &at)) = self.doubt.iter().next() {
            return Err(self.in_doubt(d, at, "reload"));
        }
        if let Some((domain, cpus)) = &allowed {
            self.allowed[*domain as usize].clone_from(cpus);
        }
        // Placed at registration: here on the first allowed CPU online
        // (the kernel spreads PMUs over their sets).
        self.owners.iter_mut().for_each(|o| *o = None);
        self.place_all();
        self.counts_marked.clear();
        Ok(Step::Reload { allowed })
    }

    /// `stat DOMAIN rmid=N start` and `stat DOMAIN stop`: the real `perf
    /// stat -a -I` on that counter, counting across the lines between;
    /// its intervals, added up at the stop, are judged as a read.
    fn stat(&mut self, line: usize, args: &[&str]) -> Result<Step, String> {
        let usage = "expected `stat DOMAIN rmid=N start` or `stat DOMAIN stop` (perf stat -a -I on mbm_total_bytes, across the lines between)";
        // perf stat starts and stops counting at a moment within its line,
        // which the model cannot place in a rate's traffic.
        let total = perfbed_device::regs::Event::MbmTotalBytes as u32;
        let still = |domain: u32, rmid: u32| {
            if self.flowing.contains(&(domain, total, rmid)) {
                Err(format!(
                    "a rate flows into domain {domain}'s mbm_total_bytes rmid={rmid} here, and perf stat starts or stops counting at a moment of this line no step measures: stop it first (`rate {domain} mbm_total_bytes rmid={rmid} 0/s`)"
                ))
            } else {
                Ok(())
            }
        };
        match args {
            [domain, rmid, "start"] => {
                let domain = self.domain(domain)?;
                let rmid = self.rmid(rmid)?;
                still(domain, rmid)?;
                if let Some((_, at)) = &self.stat {
                    return Err(format!(
                        "a perf stat runs already (line {at}): one at a time, `stat ... stop` first"
                    ));
                }
                if let Some(&at) = self.doubt.get(&domain) {
                    return Err(self.in_doubt(domain, at, "stat"));
                }
                if self.parked(domain) {
                    return Err(format!(
                        "domain {domain} is parked here: perf stat's open would be refused (ENODEV)"
                    ));
                }
                self.stat = Some(((domain, rmid), line));
                Ok(Step::StatStart { domain, rmid })
            }
            [domain, "stop"] => {
                let domain = self.domain(domain)?;
                match self.stat.take() {
                    Some(((d, rmid), _)) if d == domain => {
                        still(domain, rmid)?;
                        Ok(Step::StatStop {
                            domain,
                            rmid,
                            job: 0,
                        })
                    }
                    Some(((d, _), at)) => Err(format!(
                        "the perf stat of line {at} runs on domain {d}, not {domain}"
                    )),
                    None => Err(format!(
                        "no perf stat runs here: start one with `stat {domain} rmid=N start`"
                    )),
                }
            }
            _ => Err(usage.into()),
        }
    }

    /// Refuses a line that needs a domain's PMU still (or names its CPU)
    /// while a thread moves it: where it counts is not known then, and a
    /// CPU the thread switches may be offline at any moment.
    fn still_for(&self, op: &str, args: &[&str]) -> Result<(), String> {
        let first = args.first().copied().unwrap_or("");
        let named = match op {
            "move" | "park" | "unpark" | "moves" => self.domain(first).ok(),
            "offline" | "online" => first
                .strip_prefix("owner(")
                .and_then(|r| r.strip_suffix(')'))
                .and_then(|r| self.domain(r).ok()),
            _ => None,
        };
        if let Some(at) = named.and_then(|d| self.doubt.get(&d)) {
            return Err(self.in_doubt(named.unwrap_or(0), *at, op));
        }
        match op {
            "move" | "park" | "unpark" | "allowed" | "cpumask" => {
                if let Ok(d) = self.domain(first) {
                    if let Some((_, at)) = self.moving.get(&d) {
                        return Err(format!(
                            "`{op}` needs domain {d}'s PMU still, and the thread of line {at} moves it: `moves {d} stop` first"
                        ));
                    }
                }
                if op == "allowed" {
                    let set = args.get(1).and_then(|l| parse_cpu_list(l).ok());
                    for cpu in set.into_iter().flatten() {
                        self.not_moved(cpu)?;
                    }
                }
            }
            "offline" | "online" => {
                let role = first
                    .strip_prefix("owner(")
                    .and_then(|r| r.strip_suffix(')'));
                match role.map(|r| self.domain(r)) {
                    Some(Ok(d)) if self.moving.contains_key(&d) => {
                        return Err(format!(
                            "owner({d}): a thread moves domain {d}'s PMU here, so it has no CPU to name; `moves {d} stop` first"
                        ))
                    }
                    Some(_) => {}
                    None => {
                        if let Ok(cpu) = first.parse::<u32>() {
                            self.not_moved(cpu)?;
                        }
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Why `what` must wait for domain `domain`'s doubt, begun at line `at`,
    /// to be settled.
    fn in_doubt(&self, domain: u32, at: usize, what: &str) -> String {
        format!(
            "`{what}` needs to know where domain {domain}'s PMU is, and its allowed set of line {at} was not waited for: settle it first (`cpumask {domain} CPU|none`, or an `allowed {domain} ...` that waits)"
        )
    }

    /// Refuses `cpu` if a moving thread switches it.
    fn not_moved(&self, cpu: u32) -> Result<(), String> {
        match self.moving.iter().find(|(_, (cpus, _))| cpus.contains(&cpu)) {
            Some((d, (_, at))) => Err(format!(
                "CPU {cpu} is switched by the thread that moves domain {d} (line {at}): `moves {d} stop` first"
            )),
            None => Ok(()),
        }
    }

    /// Whether the group led by `leader` has a device event: its software
    /// members are in the device PMU's context and move with it.
    fn in_a_device_group(&self, leader: Handle) -> bool {
        self.opened
            .iter()
            .any(|(&h, o)| (h == leader || o.group == Some(leader)) && o.pmu.is_some())
    }

    /// `domain`'s allowed CPUs online here.
    fn online_allowed(&self, domain: u32) -> Vec<u32> {
        self.allowed[domain as usize]
            .iter()
            .copied()
            .filter(|c| self.online.contains(c))
            .collect()
    }

    /// The first of `domain`'s allowed CPUs online here, other than `not`.
    fn allowed_online(&self, domain: u32, not: Option<u32>) -> Option<u32> {
        self.allowed[domain as usize]
            .iter()
            .copied()
            .find(|&c| Some(c) != not && self.online.contains(&c))
    }

    /// After an offline or an allowed set: each domain stays on its CPU if
    /// that is still allowed and online, else goes to the first allowed CPU
    /// online, or parks.
    fn place_all(&mut self) {
        for d in 0..self.owners.len() as u32 {
            let kept = self.owners[d as usize]
                .filter(|c| self.online.contains(c) && self.allowed[d as usize].contains(c));
            self.owners[d as usize] = kept.or_else(|| self.allowed_online(d, None));
        }
    }

    /// Adds a step with the parks it makes or ends (`was`: which domains
    /// were parked before it).
    fn push(
        &mut self,
        line: usize,
        step: Step,
        shows: Vec<Handle>,
        was: Vec<bool>,
    ) -> Result<(), String> {
        let parks = self
            .parked_all()
            .into_iter()
            .zip(was)
            .enumerate()
            .filter(|(_, (now, before))| now != before)
            .map(|(d, (now, _))| (d as u32, now))
            .collect();
        self.ops.push(Op {
            line,
            step,
            on_owner: None,
            shows,
            parks,
            wants: vec![],
        });
        Ok(())
    }

    /// `NAME = open DOMAIN EVENT rmid=N ATTRS...` or
    /// `NAME = open cpu-clock cpu=CPU ATTRS...`.
    fn open(&mut self, line: usize, name: &str, args: &[&str]) -> Result<(), String> {
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("`{name}`: a name is letters, digits and `_`"));
        }
        if self.names.contains_key(name) {
            return Err(format!(
                "`{name}` is open already (close it first, or pick another name)"
            ));
        }
        let usage = "expected `NAME = open DOMAIN EVENT rmid=N [ATTRS]` or `NAME = open cpu-clock cpu=CPU [ATTRS]`";
        let no_format = ReadFormat {
            times: false,
            id: false,
            group: false,
            lost: false,
        };
        let mut event = Opened::cpu_clock(0, None, no_format);
        let mut on_owner = None;
        let attrs = match args {
            ["cpu-clock", attrs @ ..] => {
                event.cpu = -1;
                attrs
            }
            [domain, ev, rmid, attrs @ ..] => {
                event.pmu = Some(self.domain(domain)?);
                event.event = device_event(ev)?;
                event.rmid = self.rmid(rmid)?;
                attrs
            }
            _ => return Err(usage.into()),
        };
        for attr in attrs {
            let (key, value) = attr.split_once('=').unwrap_or((attr, ""));
            match (key, value) {
                ("disabled", "") => event.disabled = true,
                ("pinned", "") => event.pinned = true,
                ("exclusive", "") => event.exclusive = true,
                ("group", leader) => {
                    let h = self.handle(leader)?;
                    if self.opened[&h].group.is_some() {
                        return Err(format!("`{leader}` is a sibling: group= names a leader"));
                    }
                    event.group = Some(h);
                }
                ("read", formats) => {
                    for f in formats.split(',') {
                        match f {
                            "times" => event.read_format.times = true,
                            "id" => event.read_format.id = true,
                            "group" => event.read_format.group = true,
                            "lost" => event.read_format.lost = true,
                            other => {
                                return Err(format!(
                                    "read format `{other}`: expected times, id, group or lost (comma-separated)"
                                ))
                            }
                        }
                    }
                }
                ("cpu", cpu) => {
                    if let Some(role) = cpu.strip_prefix("owner(").and_then(|r| r.strip_suffix(')')) {
                        if event.pmu.is_some() {
                            return Err("cpu=owner(...) is for cpu-clock; a device event counts on its PMU's CPU".into());
                        }
                        on_owner = Some(self.domain(role)?);
                    } else {
                        let cpu = self.cpu(cpu)?;
                        event.cpu = cpu as i32;
                    }
                }
                _ => {
                    return Err(format!(
                        "`{attr}`: expected disabled, pinned, exclusive, group=NAME, read=times,id,group or cpu=CPU|owner(DOMAIN)"
                    ))
                }
            }
        }
        if event.pmu.is_none() && event.cpu < 0 && on_owner.is_none() {
            return Err("a cpu-clock event needs cpu=CPU or cpu=owner(DOMAIN)".into());
        }
        if let Some(d) = on_owner.filter(|d| self.moving.contains_key(d)) {
            return Err(format!(
                "cpu=owner({d}): a thread moves domain {d}'s PMU here, so it has no CPU to name; `moves {d} stop` first"
            ));
        }
        if let Some(d) = on_owner.filter(|d| self.doubt.contains_key(d)) {
            return Err(self.in_doubt(d, self.doubt[&d], "cpu=owner(...)"));
        }
        if let Some(leader) = event.group.filter(|l| self.racing.contains(l)) {
            return Err(format!(
                "`{}` was opened while its domain's allowed set was not waited for, so it may have been refused: no group can name it",
                self.handles[&leader]
            ));
        }
        // A software member follows its device group's PMU.
        let pmu = event.pmu.or_else(|| {
            let leader = event.group?;
            self.opened
                .iter()
                .filter(|(&h, o)| h == leader || o.group == Some(leader))
                .find_map(|(_, o)| o.pmu)
        });
        let racing = pmu.filter(|d| self.doubt.contains_key(d));
        if let (Some(d), None) = (racing, event.pmu) {
            return Err(self.in_doubt(d, self.doubt[&d], "a cpu-clock member of its group"));
        }
        let follows_a_device = event
            .group
            .is_some_and(|leader| self.in_a_device_group(leader));
        if event.pmu.is_none() && !follows_a_device {
            if let Ok(cpu) = u32::try_from(event.cpu) {
                self.not_moved(cpu)?;
            }
        }
        let expect = self.next_handle;
        let step = Step::Open { event, expect };
        let parks = vec![];
        self.ops.push(Op {
            line,
            step,
            on_owner,
            shows: vec![],
            parks,
            wants: vec![],
        });
        self.next_handle += 1;
        if racing.is_some() {
            self.racing.insert(expect);
        }
        let software_cpu = u32::try_from(event.cpu)
            .ok()
            .or_else(|| self.owners[on_owner? as usize]);
        if let Some(cpu) = software_cpu.filter(|_| event.pmu.is_none()) {
            self.software_cpus.insert(expect, cpu);
        }
        self.names.insert(name.to_string(), expect);
        self.handles.insert(expect, name.to_string());
        self.opened.insert(expect, event);
        Ok(())
    }

    /// `cpu` goes offline: perf takes each group of cpu-clock events only
    /// on it apart (`__perf_event_exit_context()` with `DETACH_GROUP`), so
    /// that every member is a group of its own from then on: a group read
    /// of one shows it alone, and a later open may name it as a leader
    /// (counting-semantics.md, "Software events and offline CPUs"). A
    /// group with a device member is in its PMU's context and moves.
    fn offline_detaches(&mut self, cpu: u32) {
        let leaders: Vec<Handle> = self
            .opened
            .iter()
            .filter(|(h, o)| o.group.is_none() && self.software_cpus.get(h) == Some(&cpu))
            .map(|(&h, _)| h)
            .filter(|&h| !self.in_a_device_group(h))
            .collect();
        for o in self.opened.values_mut() {
            if o.group.is_some_and(|l| leaders.contains(&l)) {
                o.group = None;
            }
        }
    }

    /// `want NAME scaled N%` after a read that shows NAME, opened with
    /// `read=times`.
    fn want_scaled(&mut self, line: usize, name: &str, within: &str) -> Result<(), String> {
        let handle = self.handle(name)?;
        if !self.opened[&handle].read_format.times {
            return Err(format!(
                "`{name}` is read without its clocks: `want {name} scaled` needs it opened with `read=times`"
            ));
        }
        let percent = within
            .strip_suffix('%')
            .and_then(|n| n.parse::<u64>().ok())
            .filter(|n| (1..=100).contains(n))
            .ok_or_else(|| format!("`{within}`: expected a bound such as 10% (1% to 100%)"))?;
        if self.racing.contains(&handle) {
            return Err(racing_want(name));
        }
        match self.ops.last_mut() {
            Some(last) if matches!(last.step, Step::Read { .. }) && last.shows.contains(&handle) => {
                last.wants.push(Want::Scaled {
                    line,
                    handle,
                    name: name.to_string(),
                    percent,
                });
                Ok(())
            }
            _ => Err(format!(
                "`want {name} scaled` must follow a read that shows {name} (`read {name}`, or a group read of its group)"
            )),
        }
    }

    /// `want NAME BYTES` after a read that shows NAME, or `want NAME
    /// ERRNO` after NAME's open.
    fn want(&mut self, line: usize, args: &[&str]) -> Result<(), String> {
        if let [name, "scaled", within] = args {
            return self.want_scaled(line, name, within);
        }
        let [name, what] = args else {
            return Err(
                "expected `want NAME BYTES` or `want NAME scaled N%` after a read, or `want NAME ERRNO` after NAME's open"
                    .into(),
            );
        };
        let Some(last) = self.ops.last_mut() else {
            return Err("a want follows the read or the open it is about".into());
        };
        let errno_like = what.starts_with('E') && what.chars().all(|c| c.is_ascii_uppercase());
        if errno_like && !ERRNOS.contains(what) {
            return Err(format!(
                "`{what}`: the model refuses opens with {} only",
                ERRNOS.join(", ")
            ));
        }
        if ERRNOS.contains(what) {
            let handle = self.names.get(*name).copied();
            let Step::Open { expect, .. } = last.step else {
                return Err(format!("`want {name} {what}` must follow {name}'s open"));
            };
            if handle != Some(expect) {
                return Err(format!("`want {name} {what}` must follow {name}'s open"));
            }
            if self.racing.contains(&expect) {
                return Err(racing_want(name));
            }
            // Refused: it takes no handle, and its name stays unbound.
            last.wants.push(Want::Refused {
                line,
                errno: what.to_string(),
            });
            self.names.remove(*name);
            self.opened.remove(&expect);
            self.handles.remove(&expect);
            self.next_handle -= 1;
            return Ok(());
        }
        let Some(&handle) = self.names.get(*name) else {
            return Err(self.not_open(name));
        };
        if self.racing.contains(&handle) {
            return Err(racing_want(name));
        }
        let last = self.ops.last().expect("checked above");
        if !matches!(last.step, Step::Read { .. }) || !last.shows.contains(&handle) {
            return Err(format!(
                "`want {name} ...` must follow a read that shows {name} (`read {name}`, or a group read of its group)"
            ));
        }
        let last = self.ops.last_mut().expect("checked above");
        if *what == "landed" {
            last.wants.push(Want::Landed {
                line,
                handle,
                name: name.to_string(),
            });
            return Ok(());
        }
        let bytes = bytes_of(what)
            .map_err(|e| format!("{e}, `landed`, or an errno ({})", ERRNOS.join(", ")))?;
        last.wants.push(Want::Value {
            line,
            handle,
            name: name.to_string(),
            bytes,
        });
        Ok(())
    }

    fn handle(&self, name: &str) -> Result<Handle, String> {
        self.names
            .get(name)
            .copied()
            .ok_or_else(|| self.not_open(name))
    }

    fn not_open(&self, name: &str) -> String {
        let open: Vec<&str> = self.names.keys().map(String::as_str).collect();
        format!(
            "`{name}` is not open here (open: {})",
            if open.is_empty() {
                "none".to_string()
            } else {
                open.join(", ")
            }
        )
    }

    /// A domain: its number, `movable` (two CPUs or more, none of them
    /// CPU 0: it can move and park) or `holding` (CPU 0's: parked events
    /// wait on CPU 0).
    fn domain(&self, word: &str) -> Result<u32, String> {
        let domains = &self.layout.domains;
        let found = match word {
            "movable" => movable_in(domains),
            "holding" => domains.iter().position(|cpus| cpus.contains(&0)),
            n => match n.parse::<usize>() {
                Ok(d) if d < domains.len() => Some(d),
                Ok(d) => {
                    return Err(format!(
                        "domain {d}: the device has domains 0-{}",
                        domains.len() - 1
                    ))
                }
                Err(_) => {
                    return Err(format!(
                        "`{word}`: expected a domain (a number, `movable` or `holding`)"
                    ))
                }
            },
        };
        found
            .map(|d| d as u32)
            .ok_or_else(|| format!("no `{word}` domain in the layout {domains:?}"))
    }

    fn rmid(&self, word: &str) -> Result<u32, String> {
        let rmid = word
            .strip_prefix("rmid=")
            .and_then(|n| n.parse::<u32>().ok())
            .ok_or_else(|| format!("`{word}`: expected rmid=NUMBER"))?;
        if rmid >= self.layout.rmids {
            return Err(format!(
                "rmid={rmid}: the device has RMIDs 0-{}",
                self.layout.rmids - 1
            ));
        }
        Ok(rmid)
    }

    fn cpu(&self, word: &str) -> Result<u32, String> {
        if word.starts_with("owner(") {
            return Err(format!(
                "`{word}`: a PMU's CPU is known at run time for `offline owner(DOMAIN)` and `cpu=owner(DOMAIN)` only; name this CPU by its number"
            ));
        }
        let cpu = word
            .parse::<u32>()
            .map_err(|_| format!("`{word}`: expected a CPU number"))?;
        self.check_cpu(cpu)?;
        Ok(cpu)
    }

    fn check_cpu(&self, cpu: u32) -> Result<(), String> {
        if cpu >= self.layout.cpus {
            return Err(format!(
                "CPU {cpu}: the guest has CPUs 0-{}",
                self.layout.cpus - 1
            ));
        }
        Ok(())
    }

    fn parked(&self, domain: u32) -> bool {
        !self.allowed[domain as usize]
            .iter()
            .any(|c| self.online.contains(c))
    }

    fn parked_all(&self) -> Vec<bool> {
        (0..self.allowed.len() as u32)
            .map(|d| self.parked(d))
            .collect()
    }
}

/// Why no want can pin `name`, opened on a domain in doubt.
fn racing_want(name: &str) -> String {
    format!(
        "`{name}` was opened while its domain's allowed set was not waited for: it may have opened or been refused (ENODEV), so no want can pin it or its reads; the model judges them"
    )
}

/// The scenario files `paths` name: each file as it is, each folder's
/// `.scn` files at any depth, sorted.
pub fn files_under(paths: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for path in paths {
        if !path.is_dir() {
            out.push(path.clone());
            continue;
        }
        let mut found = Vec::new();
        for entry in std::fs::read_dir(path)? {
            let entry = entry?.path();
            let known = entry.file_name().is_some_and(|n| n == KNOWN_VIOLATIONS);
            if (entry.is_dir() && !known) || entry.extension().is_some_and(|e| e == "scn") {
                found.push(entry);
            }
        }
        found.sort();
        out.extend(files_under(&found)?);
    }
    Ok(out)
}

/// The folder of scenarios that show a known violation of the contract
/// (docs/counting-semantics.md, "Known violations"): they fail until it is
/// fixed, so a walk of a folder leaves it out. Named, it runs;
/// `cargo xtask run --known-bugs` runs its files as checks.
pub const KNOWN_VIOLATIONS: &str = "known-violations";

/// A device event by its sysfs name (`mbm_total_bytes`, ...): its id.
fn device_event(word: &str) -> Result<u32, String> {
    EVENT_FILES
        .iter()
        .find(|(name, _)| *name == word)
        .map(|&(_, e)| e as u32)
        .ok_or_else(|| {
            let names: Vec<&str> = EVENT_FILES.iter().map(|(n, _)| *n).collect();
            format!(
                "`{word}`: expected an event ({}) or cpu-clock",
                names.join(", ")
            )
        })
}

/// Bytes: a number with an optional unit (`640`, `64KiB`, `4MiB`, `1GiB`).
fn bytes_of(word: &str) -> Result<u64, String> {
    let (number, unit) = split_unit(word);
    let scale = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => {
            return Err(format!(
                "`{word}`: expected bytes such as 640, 64KiB or 4MiB"
            ))
        }
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("`{word}`: expected bytes such as 640, 64KiB or 4MiB"))
}

/// Milliseconds: `300ms` or `2s`.
fn millis_of(word: &str) -> Result<u64, String> {
    let (number, unit) = split_unit(word);
    let scale = match unit {
        "ms" => 1,
        "s" => 1000,
        _ => return Err(format!("`{word}`: expected a time such as 300ms or 2s")),
    };
    number
        .parse::<u64>()
        .map(|n| n * scale)
        .map_err(|_| format!("`{word}`: expected a time such as 300ms or 2s"))
}

fn split_unit(word: &str) -> (&str, &str) {
    let at = word
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(word.len());
    word.split_at(at)
}

impl fmt::Display for Want {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Want::Value { name, bytes, .. } => write!(f, "want {name} {bytes}"),
            Want::Refused { errno, .. } => write!(f, "want {errno}"),
            Want::Landed { name, .. } => write!(f, "want {name} landed"),
            Want::Scaled { name, percent, .. } => write!(f, "want {name} scaled {percent}%"),
        }
    }
}

/// The wants the model contradicts, on the host, without a guest: the
/// steps fed to the model as [`replay::predict`] feeds them (one
/// dispatch, [`replay::Predictor`]), each wanted value taken as the read's
/// and each domain placed on its first CPU at the start. (A scenario whose
/// wants the model rejects can only fail.)
pub fn wants_against_model(scenario: &Scenario, shape: DeviceShape) -> Vec<ScenarioError> {
    let mut p = replay::Predictor::new(shape, &Cpus::homed(&scenario.domains));
    let mut out = Vec::new();
    for (index, op) in scenario.ops.iter().enumerate() {
        let mut find = |line: usize, message: String| {
            out.push(ScenarioError {
                file: scenario.file.clone(),
                line,
                message,
            })
        };
        let mut step = op.step.clone();
        match &mut step {
            Step::Offline { cpu } => {
                if let Some(owner) = op.on_owner.and_then(|d| p.owner(d)) {
                    *cpu = owner;
                }
            }
            Step::Open { event, .. } => {
                if let Some(cpu) = op.on_owner.and_then(|d| p.owner(d)) {
                    event.cpu = cpu as i32;
                }
                let pmu_cpu = event.pmu.and_then(|d| p.owner(d));
                let predicted = p.model.predict_open_on(&event.spec(), pmu_cpu);
                // On a domain in doubt it may open or be refused: no want.
                let racing = event.pmu.is_some_and(|d| p.model.placement_is_unknown(d));
                match (op.wants.first(), predicted) {
                    (_, Err(_)) if racing => {}
                    (Some(Want::Refused { line, errno }), p) => {
                        if p.map_err(|r| r.errno()) != Err(errno.as_str()) {
                            find(*line, format!("the model predicts {p:?} for this open, not {errno}"));
                        }
                    }
                    (_, Ok(())) => {}
                    (_, Err(r)) => find(
                        op.line,
                        format!("the model refuses this open with {} ({r:?}): add `want NAME {}` or change it", r.errno(), r.errno()),
                    ),
                }
            }
            &mut Step::Cpumask { domain, ref cpus } => {
                let owner = p.owner(domain);
                if owner != cpus.first().copied() {
                    find(
                        op.line,
                        format!(
                            "the model places domain {domain} on {}, not {}",
                            owner.map_or("none (parked)".into(), |c| format!("CPU {c}")),
                            cpus.first().map_or("none".into(), |c| format!("CPU {c}"))
                        ),
                    );
                }
            }
            Step::Read { .. } => {
                for want in &op.wants {
                    if let Want::Landed { line, handle, name } = want {
                        let steps: Vec<(&Step, &[Flowed])> = scenario.ops[..=index]
                            .iter()
                            .map(|o| (&o.step, &[][..]))
                            .collect();
                        let all = landed(&steps, *handle).map_or(0, |l| l.sure);
                        match p.model.expect(*handle).map(|e| e.value) {
                            Some(ValueRule::Bytes { base, lo, hi, .. })
                                if lo == hi && base.wrapping_add(lo) == all => {}
                            other => find(
                                *line,
                                format!(
                                    "the model does not promise {name} all that landed since its open or RESET ({}): {}",
                                    bytes_text(all),
                                    other.as_ref().and_then(model_values).map_or_else(
                                        || "no value".to_string(),
                                        |(lo, hi)| format!("{}..={}", bytes_text(lo), bytes_text(hi))
                                    )
                                ),
                            ),
                        }
                    }
                    if let Want::Value {
                        line,
                        handle,
                        name,
                        bytes,
                    } = want
                    {
                        let seen = Observed {
                            value: *bytes,
                            enabled: None,
                            running: None,
                        };
                        let expected = p.model.expect(*handle);
                        let mut tried = p.model.clone();
                        let found = tried.read(*handle, seen);
                        if found.is_empty() {
                            p.model = tried;
                            continue;
                        }
                        let model = expected.and_then(|e| model_values(&e.value));
                        find(
                            *line,
                            match model {
                                Some(range) => format!(
                                    "the model does not allow it: {}",
                                    difference(name, *bytes, range, "the model's")
                                ),
                                None => {
                                    format!("the model does not allow {name} {bytes}: {}", found[0])
                                }
                            },
                        );
                        // Go on from what the model predicts, not from the
                        // refused value: a later want is judged on its own.
                        let _ = p.model.predict(*handle);
                    }
                }
            }
            _ => {}
        }
        p.step(&step);
    }
    out
}

/// The totals (since the open or the last RESET) the model allows the
/// next read of an event to show, least and most; `None` where it does
/// not predict one (a cpu-clock, a gauge never read).
fn model_values(rule: &ValueRule) -> Option<(u64, u64)> {
    match *rule {
        ValueRule::Bytes { base, lo, hi, .. } => {
            Some((base.wrapping_add(lo), base.wrapping_add(hi)))
        }
        ValueRule::Parked { base, hi } => Some((base, base.wrapping_add(hi))),
        ValueRule::Gauge(bytes) => Some((bytes, bytes)),
        // Either, not the range between: a want of either is met.
        ValueRule::GaugeEither { shown, now } => Some((shown.min(now), shown.max(now))),
        // A cpu-clock's time is the guest's, not the scenario's to want.
        ValueRule::Clock { .. } | ValueRule::Any => None,
    }
}

/// A want against what was found, field by field (a want pins the value):
/// `a: value wanted 3MiB (3145728), got 7MiB (7340032), delta +4MiB`.
/// `got` is a range where the model only bounds the value; the delta is
/// then to its nearer end. `whose` names the other side ("got", "the
/// model's").
pub fn difference(name: &str, wanted: u64, got: (u64, u64), whose: &str) -> String {
    let (lo, hi) = got;
    let shown = |b: u64| format!("{} ({b})", bytes_text(b));
    let got_text = if lo == hi {
        shown(lo)
    } else {
        format!("{} to {}", shown(lo), shown(hi))
    };
    let nearer = if wanted > hi { hi } else { lo };
    let delta = if nearer >= wanted {
        format!("+{}", bytes_text(nearer - wanted))
    } else {
        format!("-{}", bytes_text(wanted - nearer))
    };
    format!(
        "{name}: value wanted {}, {whose} {got_text}, delta {delta}",
        shown(wanted)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            cpus: 4,
            domains: vec![vec![0, 1], vec![2, 3]],
            rmids: 8,
            unit_bytes: 64,
            arch: Arch::X86_64,
        }
    }

    fn parsed(text: &str) -> Result<Scenario, ScenarioError> {
        parse(Path::new("t.scn"), text, &layout(), 1)
    }

    /// `s` written as the shrinker writes a scenario, parsed again; and
    /// the text written.
    fn written_back(s: &Scenario) -> (Scenario, String) {
        use super::super::scenario_write::{write, Line};
        let lines: Vec<Line> = s.ops.iter().map(|o| Line::new(o.step.clone())).collect();
        let text = write(None, &[], &lines);
        let again = parse(Path::new("w.scn"), &text, &layout(), 1).unwrap();
        (again, text)
    }

    /// `text` after the line `first` is refused at its own line, 2, with a
    /// message that says `want`.
    fn refused_after(first: &str, text: &str, want: &str) {
        let (line, message) = refused(&format!("{first}{text}"));
        assert_eq!(line, 2, "{text:?}: {message}");
        assert!(
            message.contains(want),
            "{text:?}: {message:?} lacks {want:?}"
        );
    }

    /// The refusal of `text`: its line and message.
    fn refused(text: &str) -> (usize, String) {
        let e = parsed(text).expect_err("must be refused");
        assert_eq!(e.file, Path::new("t.scn"));
        (e.line, e.message)
    }

    #[test]
    fn a_moving_thread_takes_the_domains_cpus_and_refuses_what_it_would_change_unseen() {
        let s = parsed(
            "a = open movable mbm_total_bytes rmid=1 read=times\n\
             c = open cpu-clock cpu=1\n\
             moves movable start\n\
             read a\n\
             s = open cpu-clock cpu=2 group=a\n\
             offline 1\n\
             online 1\n\
             moves movable stop\n\
             cpumask movable 2\n\
             offline owner(movable)\n",
        )
        .unwrap();
        assert_eq!(
            s.ops[2].step,
            Step::MovesStart {
                domain: 1,
                cpus: vec![2, 3]
            }
        );
        assert_eq!(s.ops[7].step, Step::MovesStop { domain: 1, job: 0 });
        // After a whole round the PMU is on the round's first CPU.
        assert_eq!(s.ops[9].step, Step::Offline { cpu: 2 });
        let moving = "a = open movable mbm_total_bytes rmid=1\nmoves movable start\n";
        for (line, why) in [
            ("move movable", "needs domain 1's PMU still"),
            ("park 1", "needs domain 1's PMU still"),
            ("cpumask movable 2", "needs domain 1's PMU still"),
            ("allowed movable 3", "needs domain 1's PMU still"),
            ("allowed 0 0-2", "CPU 2 is switched by the thread"),
            ("offline 3", "CPU 3 is switched by the thread"),
            ("offline owner(movable)", "has no CPU to name"),
            (
                "c = open cpu-clock cpu=owner(movable)",
                "has no CPU to name",
            ),
            (
                "c = open cpu-clock cpu=2",
                "CPU 2 is switched by the thread",
            ),
            ("moves movable start", "already (line 2)"),
        ] {
            let (at, message) = refused(&format!("{moving}{line}\nmoves movable stop\n"));
            assert_eq!(at, 3, "{line}: {message}");
            assert!(message.contains(why), "{line}: {message}");
        }
        for (text, at, why) in [
            ("moves movable start\n", 1, "never stopped"),
            ("moves movable stop\n", 1, "no thread moves domain 1"),
            (
                "moves holding start\nmoves holding stop\n",
                1,
                "allows CPU 0",
            ),
            ("offline 3\nmoves movable start\n", 2, "needs two"),
            ("moves movable go\n", 1, "expected `moves DOMAIN start`"),
            (
                "c = open cpu-clock cpu=3\nmoves movable start\n",
                2,
                "`c` is a cpu-clock event on CPU 3",
            ),
        ] {
            let (line, message) = refused(text);
            assert_eq!(line, at, "{text}: {message}");
            assert!(message.contains(why), "{text}: {message}");
        }
    }

    #[test]
    fn an_offline_takes_a_cpus_software_groups_apart() {
        // The red team's file: a group read after the park shows the
        // leader and its new device member, not the former sibling, which
        // a later open may name as a leader. A mixed group and a group on
        // another CPU stay whole.
        let s = parsed(
            "# check: detached\n\
             lead = open cpu-clock cpu=2 read=times,group\n\
             s1 = open cpu-clock cpu=2 group=lead read=times,group\n\
             other = open cpu-clock cpu=1 read=times,group\n\
             o1 = open cpu-clock cpu=1 group=other read=times\n\
             m = open movable mbm_total_bytes rmid=1 read=times,group\n\
             m1 = open cpu-clock cpu=owner(movable) group=m read=times\n\
             park movable\n\
             unpark movable 2\n\
             d = open movable mbm_total_bytes rmid=2 group=lead read=times\n\
             read lead\n\
             read other\n\
             read m\n\
             e = open movable mbm_total_bytes rmid=3 group=s1 read=times\n\
             read s1\n\
             want e 0\n",
        )
        .unwrap();
        let shows: Vec<Vec<Handle>> = s
            .ops
            .iter()
            .filter(|o| matches!(o.step, Step::Read { .. }))
            .map(|o| o.shows.clone())
            .collect();
        assert_eq!(shows, vec![vec![1, 7], vec![3, 4], vec![5, 6], vec![2, 8]]);
        let moved = parsed(
            "# check: moved\n\
             lead = open cpu-clock cpu=owner(movable) read=times,group\n\
             s1 = open cpu-clock cpu=owner(movable) group=lead read=times\n\
             move movable\n\
             read lead\n\
             want lead 0\n",
        );
        assert!(moved.is_ok_and(|s| s.ops[3].shows == vec![1]));
    }

    #[test]
    fn a_scenario_becomes_the_journals_steps() {
        let s = parsed(
            "# check: disabled across a move\n\
             a = open movable mbm_total_bytes rmid=1 disabled read=times,group\n\
             c = open cpu-clock cpu=owner(movable) group=a  # a mixed group\n\
             \n\
             enable a group\n\
             burst movable mbm_total_bytes rmid=1 4MiB\n\
             read a\n\
             want a 4MiB\n\
             park movable\n\
             unpark movable 3\n\
             close a\n",
        )
        .unwrap();
        assert_eq!(s.check.as_deref(), Some("disabled across a move"));
        let lines: Vec<usize> = s.ops.iter().map(|o| o.line).collect();
        assert_eq!(lines, vec![2, 3, 5, 6, 7, 9, 10, 11]);
        let Step::Open { event, expect } = &s.ops[0].step else {
            panic!("{:?}", s.ops[0]);
        };
        assert_eq!(
            (event.pmu, event.event, event.rmid, event.disabled, *expect),
            (Some(1), 2, 1, true, 1)
        );
        assert_eq!(s.ops[1].on_owner, Some(1));
        assert!(matches!(
            s.ops[1].step,
            Step::Open {
                event: Opened { group: Some(1), .. },
                expect: 2
            }
        ));
        assert_eq!(s.ops[4].shows, vec![1, 2]);
        assert_eq!(
            s.ops[4].wants,
            vec![Want::Value {
                line: 8,
                handle: 1,
                name: "a".into(),
                bytes: 4 << 20
            }]
        );
        assert_eq!(s.ops[5].parks, vec![(1, true)]);
        assert_eq!(s.ops[6].step, Step::Unpark { domain: 1, cpu: 3 });
        assert_eq!(s.ops[6].parks, vec![(1, false)]);
    }

    #[test]
    fn handles_follow_the_opens_that_open() {
        let s = parsed(
            "park movable\n\
             a = open movable mbm_total_bytes rmid=1\n\
             want a ENODEV\n\
             unpark movable\n\
             a = open movable mbm_total_bytes rmid=1\n\
             b = open holding llc_occupancy rmid=2\n",
        )
        .unwrap();
        let expects: Vec<Handle> = s
            .ops
            .iter()
            .filter_map(|o| match o.step {
                Step::Open { expect, .. } => Some(expect),
                _ => None,
            })
            .collect();
        assert_eq!(expects, vec![1, 1, 2], "the refused open takes no handle");
    }

    #[test]
    fn an_unknown_operation_is_refused_with_the_operations() {
        let (line, message) = refused("a = open 0 mbm_total_bytes rmid=1\n\nflap movable\n");
        assert_eq!(line, 3);
        assert!(message.contains("unknown operation `flap`"), "{message}");
        assert!(message.contains("move, moves, park, unpark"), "{message}");
    }

    #[test]
    fn a_handle_used_before_its_open_or_after_its_close_is_refused() {
        let (line, message) = refused("read a\n");
        assert_eq!(
            (line, message.as_str()),
            (1, "`a` is not open here (open: none)")
        );
        let (line, message) =
            refused("a = open 0 mbm_total_bytes rmid=1\nb = open 0 mbm_local_bytes rmid=1\nclose a\nenable a\n");
        assert_eq!(
            (line, message.as_str()),
            (4, "`a` is not open here (open: b)")
        );
        let (line, message) = refused("b = open 0 mbm_total_bytes rmid=1 group=a\n");
        assert_eq!(line, 1);
        assert!(message.contains("`a` is not open"), "{message}");
    }

    #[test]
    fn a_cpu_the_guest_does_not_have_is_refused() {
        for text in [
            "offline 4\n",
            "c = open cpu-clock cpu=9\n",
            "allowed movable 2-5\n",
            "park movable\nunpark movable 7\n",
        ] {
            let (_, message) = refused(text);
            assert!(
                message.contains("the guest has CPUs 0-3"),
                "{text:?}: {message}"
            );
        }
        assert_eq!(
            refused("offline 0\n").1,
            "CPU 0 never goes offline (on x86: arm64's can)"
        );
        assert!(refused("park holding\n").1.contains("CPU 0"));
        assert!(refused("offline 3\nmove movable\n")
            .1
            .contains("a move needs two"));
    }

    /// On arm64 CPU 0 goes offline like any other: the holding domain
    /// moves off it, parks when CPU 1 is gone too, and is placed again
    /// when CPU 0 returns.
    #[test]
    fn cpu0_goes_offline_where_the_layout_says_it_can() {
        let arm64 = Layout {
            arch: Arch::Arm64,
            ..layout()
        };
        let text =
            "# arch: arm64\noffline 0\noffline 1\nonline 0\noffline owner(holding)\nonline 1\n";
        let s = parse(Path::new("a.scn"), text, &arm64, 1).unwrap();
        let steps: Vec<(&Step, &[(u32, bool)])> =
            s.ops.iter().map(|o| (&o.step, &o.parks[..])).collect();
        assert_eq!(
            steps,
            [
                (&Step::Offline { cpu: 0 }, &[][..]),
                (&Step::Offline { cpu: 1 }, &[(0, true)][..]),
                (&Step::Unpark { domain: 0, cpu: 0 }, &[(0, false)][..]),
                (&Step::Offline { cpu: 0 }, &[(0, true)][..]),
                (&Step::Unpark { domain: 0, cpu: 1 }, &[(0, false)][..]),
            ]
        );
        assert_eq!(arch_of(text), Some(Arch::Arm64));
        let on_x86 = parsed(text).unwrap_err();
        assert_eq!(on_x86.line, 1);
        assert!(on_x86.message.contains("arm64 guests only"), "{on_x86}");
        assert!(parsed("# arch: sparc\n")
            .unwrap_err()
            .message
            .contains("sparc"));
    }

    #[test]
    fn until_waits_for_an_event_read_with_its_clocks_and_refuses_what_is_not_one() {
        let s = parsed(
            "a = open movable mbm_total_bytes rmid=1 read=times,group\n\
             until a running\n\
             until a running within 5s\n",
        )
        .unwrap();
        let steps: Vec<&Step> = s.ops.iter().map(|o| &o.step).skip(1).collect();
        let until = |within_ms| Step::Until {
            handle: 1,
            condition: Condition::Running,
            within_ms,
        };
        assert_eq!(steps, [&until(UNTIL_WITHIN_MS), &until(5000)]);
        assert_eq!(written_back(&s).0.ops[2].step, until(5000));
        let open = "a = open movable mbm_total_bytes rmid=1 read=times\n";
        for (text, want) in [
            ("until a\n", "expected `until NAME running [within TIME]`"),
            (
                "until a running 5s\n",
                "expected `until NAME running [within TIME]`",
            ),
            ("until a counting\n", "`counting`: unknown condition"),
            ("until b running\n", "`b` is not open here"),
            (
                "until a running within 5\n",
                "expected a time such as 300ms",
            ),
            ("until a running within 0s\n", "1ms or more"),
        ] {
            refused_after(open, text, want);
        }
        refused_after(
            "a = open movable mbm_total_bytes rmid=1\n",
            "until a running\n",
            "needs it opened with `read=times`",
        );
    }

    #[test]
    fn mux_sets_a_domains_interval_and_refuses_what_is_not_one() {
        let s = parsed("mux movable 2s\nmux 0 4ms\n").unwrap();
        let steps: Vec<&Step> = s.ops.iter().map(|o| &o.step).collect();
        assert_eq!(
            steps,
            [
                &Step::MuxInterval {
                    domain: 1,
                    ms: 2000
                },
                &Step::MuxInterval { domain: 0, ms: 4 }
            ]
        );
        for (text, want) in [
            ("mux movable\n", "expected `mux DOMAIN TIME`"),
            ("mux movable 2 s\n", "expected `mux DOMAIN TIME`"),
            ("mux movable 2000\n", "expected a time such as 300ms"),
            ("mux movable 0ms\n", "1ms or more"),
            ("mux 7 2s\n", "domain 7: the device has domains 0-1"),
        ] {
            refused_after("wait 1ms\n", text, want);
        }
    }

    #[test]
    fn cpumask_asserts_where_the_pmu_counts_and_the_model_checks_it() {
        let s = parsed(
            "cpumask movable 2\noffline 2\ncpumask movable 3\npark movable\ncpumask movable none\n",
        )
        .unwrap();
        let steps: Vec<&Step> = s.ops.iter().map(|o| &o.step).collect();
        assert_eq!(
            steps[0],
            &Step::Cpumask {
                domain: 1,
                cpus: vec![2]
            }
        );
        assert_eq!(
            steps[4],
            &Step::Cpumask {
                domain: 1,
                cpus: vec![]
            }
        );
        for (text, want) in [
            ("cpumask movable\n", "expected `cpumask DOMAIN CPU`"),
            ("cpumask movable 2-3\n", "expected a CPU number"),
            ("cpumask movable 9\n", "the guest has CPUs 0-3"),
            ("cpumask movable none\n", "is not parked here"),
            ("cpumask 1 0\n", "not an online allowed CPU of domain 1"),
            ("cpumask 5 2\n", "domain 5: the device has domains 0-1"),
        ] {
            refused_after("wait 1ms\n", text, want);
        }
        let (line, message) = refused("park movable\ncpumask movable 3\n");
        assert_eq!(line, 2);
        assert!(message.contains("is parked here"), "{message}");
        // The parser allows any online allowed CPU; the model knows which.
        let shape = DeviceShape {
            pmus: 2,
            slots: 4,
            unit_bytes: 64,
            counter_width: 24,
            max_rate: 1 << 30,
            lined_pmus: 2,
        };
        let wrong = parsed("cpumask movable 3\n").unwrap();
        let found = wants_against_model(&wrong, shape);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].message.contains("places domain 1 on CPU 2"),
            "{found:?}"
        );
        let right = parsed("offline 2\ncpumask movable 3\nonline 2\ncpumask movable 3\n").unwrap();
        assert_eq!(wants_against_model(&right, shape), vec![]);
    }

    /// `allowed DOMAIN CPUS nowait`: the change only issued, the domain in
    /// doubt until a `cpumask` (which then waits for the mask it asserts)
    /// or an `allowed` that waits; meanwhile what needs to know where the
    /// PMU is, and wants on an open that may have been refused, are
    /// refused at their lines.
    #[test]
    fn an_allowed_set_not_waited_for_is_in_doubt_until_a_line_settles_it() {
        let s = parsed(
            "a = open movable mbm_total_bytes rmid=1 read=times\n\
             allowed movable 3 nowait\n\
             offline 3\n\
             b = open movable mbm_total_bytes rmid=2\n\
             read b\n\
             online 3\n\
             offline 3\n\
             cpumask movable none\n\
             online 3\n\
             allowed movable none nowait\n\
             allowed movable default\n",
        )
        .unwrap();
        let steps: Vec<&Step> = s.ops.iter().map(|o| &o.step).collect();
        assert_eq!(
            steps[1],
            &Step::Allowed {
                domain: 1,
                cpus: vec![3],
                nowait: true
            }
        );
        // In doubt, CPU 3 back is an online, not the unpark of a domain
        // the parser thinks parked; settled parked, it is the unpark.
        assert_eq!(steps[5], &Step::Online { cpu: 3 });
        assert_eq!(steps[8], &Step::Unpark { domain: 1, cpu: 3 });
        assert_eq!(
            steps[10],
            &Step::Allowed {
                domain: 1,
                cpus: vec![2, 3],
                nowait: false
            }
        );
        let issued = "a = open movable mbm_total_bytes rmid=1\nallowed movable 3 nowait\n";
        let unsettled = [
            "move movable",
            "park movable",
            "moves movable start",
            "offline owner(movable)",
            "c = open cpu-clock cpu=owner(movable)",
            "c = open cpu-clock cpu=1 group=a",
        ]
        .map(|line| (format!("{line}\ncpumask movable 3\n"), 3, "settle it first"));
        let cases = [
            (
                "b = open movable mbm_total_bytes rmid=2\nwant b ENODEV\n",
                4,
                "may have opened or been refused",
            ),
            (
                "b = open movable mbm_total_bytes rmid=2\nread b\nwant b 0\n",
                5,
                "may have opened or been refused",
            ),
            (
                "b = open movable mbm_total_bytes rmid=2\ncpumask movable 3\nc = open movable mbm_local_bytes rmid=2 group=b\n",
                5,
                "no group can name it",
            ),
            ("allowed movable 2-3 nowait\ncpumask movable 2\n", 4, "may be on any of them"),
            ("", 2, "never settled"),
            ("allowed movable 2 nowait\n", 2, "never settled"),
            ("allowed movable 2 wait\n", 3, "expected `allowed DOMAIN CPUS [nowait]`"),
        ]
        .map(|(text, at, why)| (text.to_string(), at, why));
        for (text, at, why) in unsettled.into_iter().chain(cases) {
            let (line, message) = refused(&format!("{issued}{text}"));
            assert_eq!(line, at, "{text}: {message}");
            assert!(message.contains(why), "{text}: {message}");
        }
        // Settled, the open's outcome is known again: its wants stand.
        assert!(parsed(&format!(
            "{issued}cpumask movable 3\nb = open movable mbm_total_bytes rmid=2\nread b\nwant b 0\n"
        ))
        .is_ok());
    }

    /// The host's check of the wants takes a domain in doubt as the model
    /// does: in the doubt it only bounds a count (from what the last read
    /// showed to all that landed), once a line settles it the count is
    /// exact again.
    #[test]
    fn the_model_checks_wants_across_a_set_not_waited_for() {
        let text = |inside: &str| {
            format!(
                "a = open movable mbm_total_bytes rmid=1 read=times\n\
                 burst movable mbm_total_bytes rmid=1 1MiB\n\
                 allowed movable 3 nowait\n\
                 offline 3\n\
                 burst movable mbm_total_bytes rmid=1 2MiB\n\
                 {inside}\
                 cpumask movable none\n\
                 burst movable mbm_total_bytes rmid=1 4MiB\n\
                 online 3\n\
                 read a\n\
                 want a 7MiB\n"
            )
        };
        let shape = DeviceShape::DEFAULT_RUN;
        let judged = |inside: &str| wants_against_model(&parsed(&text(inside)).unwrap(), shape);
        assert_eq!(judged(""), vec![]);
        let found: Vec<(usize, bool)> = judged("read a\nwant a 5MiB\n")
            .iter()
            .map(|e| (e.line, e.message.contains("the model's 0 (0) to 3MiB")))
            .collect();
        assert_eq!(found, [(7, true)]);
        // An open in the doubt needs no want, though the model may take
        // the PMU for parked.
        let racing = parsed(
            "allowed movable none\n\
             allowed movable 2 nowait\n\
             b = open movable mbm_total_bytes rmid=2\n\
             allowed movable default\n",
        )
        .unwrap();
        assert_eq!(wants_against_model(&racing, shape), vec![]);
    }

    /// `allowed DOMAIN CPUS refused ERROR`: any domain number and CPU list,
    /// refused at its line unless a device of the layout refuses the set
    /// with ERROR; it changes nothing the later lines see.
    #[test]
    fn a_malformed_set_must_be_one_the_device_refuses_with_the_error_named() {
        let s = parsed(
            "allowed 9 2-3 refused no-such-domain\n\
             allowed movable 200 refused no-such-cpu\n\
             allowed movable 2-3,4096 refused no-such-cpu\n\
             cpumask movable 2\n",
        )
        .unwrap();
        let steps: Vec<&Step> = s.ops.iter().map(|o| &o.step).collect();
        assert_eq!(
            steps[..2],
            [
                &Step::AllowedRefused {
                    domain: 9,
                    cpus: vec![2, 3],
                    error: Malformed::NoSuchDomain
                },
                &Step::AllowedRefused {
                    domain: 1,
                    cpus: vec![200],
                    error: Malformed::NoSuchCpu
                }
            ]
        );
        for (text, why) in [
            (
                "allowed movable 2-3 refused no-such-cpu",
                "the device takes the set `2-3`",
            ),
            (
                "allowed 9 200 refused no-such-domain",
                "refuses it with no-such-cpu (vCPU 200 is out of range",
            ),
            (
                "allowed 9 2-3 refused nope",
                "ERROR one of no-such-domain, no-such-cpu",
            ),
            (
                "allowed 9 2-3 refused",
                "expected `allowed DOMAIN CPUS refused ERROR`",
            ),
            (
                "allowed nowhere 2 refused no-such-domain",
                "`nowhere`: expected a domain",
            ),
            (
                "allowed 9 2-x refused no-such-domain",
                "expected a CPU list",
            ),
        ] {
            refused_after("wait 1ms\n", text, why);
        }
        assert_eq!(wants_against_model(&s, DeviceShape::DEFAULT_RUN), vec![]);
    }

    #[test]
    fn an_ioctl_line_names_its_request_and_the_answer_it_must_give() {
        let s = parsed(
            "a = open movable mbm_total_bytes rmid=1\n\
             b = open movable mbm_total_bytes rmid=2\n\
             ioctl a refresh -1 EINVAL\n\
             ioctl a period 1000 EINVAL\n\
             ioctl a set-filter filter 0x0/0x1000 EINVAL\n\
             ioctl a set-output none ok\n\
             ioctl a set-output b EINVAL\n\
             ioctl a id ok\n\
             ioctl a pause-output on EINVAL\n\
             ioctl a set-bpf none EBADF\n\
             ioctl a query-bpf EINVAL\n\
             ioctl a modify-attributes EOPNOTSUPP\n",
        )
        .unwrap();
        let Step::Open { event, .. } = s.ops[0].step else {
            panic!("{:?}", s.ops[0]);
        };
        let requests: Vec<(Request, Option<&str>)> = s.ops[2..]
            .iter()
            .map(|o| match &o.step {
                Step::Request {
                    handle: 1,
                    request,
                    refused,
                } => (request.clone(), refused.as_deref()),
                other => panic!("line {}: {other:?}", o.line),
            })
            .collect();
        assert_eq!(
            requests,
            vec![
                (Request::Refresh { count: -1 }, Some("EINVAL")),
                (Request::Period { period: 1000 }, Some("EINVAL")),
                (
                    Request::SetFilter {
                        filter: "filter 0x0/0x1000".into()
                    },
                    Some("EINVAL")
                ),
                (Request::SetOutput { target: None }, None),
                (Request::SetOutput { target: Some(2) }, Some("EINVAL")),
                (Request::Id, None),
                (Request::PauseOutput { pause: true }, Some("EINVAL")),
                (Request::SetBpf, Some("EBADF")),
                (Request::QueryBpf, Some("EINVAL")),
                (Request::ModifyAttributes { event }, Some("EOPNOTSUPP")),
            ]
        );
        // Written back as the shrinker writes it, it parses to the same.
        let (again, text) = written_back(&s);
        let steps = |s: &Scenario| s.ops.iter().map(|o| o.step.clone()).collect::<Vec<_>>();
        assert_eq!(steps(&again), steps(&s), "{text}");
        let open = "a = open movable mbm_total_bytes rmid=1\n";
        for (line, want) in [
            (
                "ioctl a refresh 1",
                "expected `ioctl NAME REQUEST [ARG] ANSWER`",
            ),
            (
                "ioctl a refresh 1 refused",
                "`refused`: expected `ioctl NAME",
            ),
            ("ioctl a refresh once EINVAL", "`once`: expected a count"),
            (
                "ioctl a period EINVAL",
                "expected `ioctl a period PERIOD ANSWER`",
            ),
            (
                "ioctl a set-filter EINVAL",
                "the filter's words up to the answer",
            ),
            ("ioctl a set-output c ok", "`c` is not open here (open: a)"),
            ("ioctl a id 3 ok", "id takes no argument"),
            ("ioctl a pause-output yes ok", "`yes`: expected on or off"),
            ("ioctl a set-bpf 3 EBADF", "no BPF program to give"),
            ("ioctl a flush ok", "`flush`: expected `ioctl NAME REQUEST"),
            ("ioctl z id ok", "`z` is not open here"),
        ] {
            refused_after(open, &format!("{line}\n"), want);
        }
    }

    #[test]
    fn a_driver_count_is_marked_then_its_growth_asserted() {
        let s = parsed(
            "lost_wraps movable\nlost_wraps movable 1+\nlost_wraps holding\nlost_wraps 1 0\nirqs_on_owner movable\nirqs_off_owner 1\nirqs_on_owner 1 4+\nirqs_off_owner movable 3-\n",
        )
        .unwrap();
        let steps: Vec<&Step> = s.ops.iter().map(|o| &o.step).collect();
        let step = |domain, count, grown: Option<(u64, Bound)>| Step::DriverCount {
            domain,
            count,
            grown: grown.map(|(by, bound)| Growth { by, bound }),
        };
        let (wraps, on, off) = (
            DriverCount::LostWraps,
            DriverCount::IrqsOnOwner,
            DriverCount::IrqsOffOwner,
        );
        assert_eq!(
            steps,
            [
                &step(1, wraps, None),
                &step(1, wraps, Some((1, Bound::OrMore))),
                &step(0, wraps, None),
                &step(1, wraps, Some((0, Bound::Exactly))),
                &step(1, on, None),
                &step(1, off, None),
                &step(1, on, Some((4, Bound::OrMore))),
                &step(1, off, Some((3, Bound::OrFewer))),
            ]
        );
        let (again, text) = written_back(&s);
        assert_eq!(again.ops, s.ops, "{text}");
        for (text, want) in [
            ("lost_wraps\n", "expected `lost_wraps DOMAIN`"),
            ("lost_wraps movable 1 2\n", "expected `lost_wraps DOMAIN`"),
            (
                "lost_wraps movable many\n",
                "`many`: expected a growth such as 0, 1, 1+ or 3-",
            ),
            ("lost_wraps movable -1\n", "`-1`: expected a growth"),
            ("lost_wraps movable 1+-\n", "`1+-`: expected a growth"),
            ("lost_wraps 4\n", "domain 4: the device has domains 0-1"),
            (
                "lost_wraps holding 1\n",
                "counts from an earlier `lost_wraps holding` line",
            ),
            (
                "irqs_on_owner movable 1+\n",
                "counts from an earlier `irqs_on_owner movable` line",
            ),
            ("irqs_off_owner\n", "expected `irqs_off_owner DOMAIN`"),
        ] {
            refused_after("lost_wraps movable\n", text, want);
        }
    }

    #[test]
    fn reload_unloads_with_no_event_open_and_places_every_pmu_afresh() {
        let s = parsed(
            "allowed movable 3\n\
             lost_wraps movable\n\
             reload movable 2\n\
             cpumask movable 2\n\
             reload movable none\n\
             cpumask movable none\n\
             a = open movable mbm_total_bytes rmid=1\n\
             want a ENODEV\n\
             reload\n\
             cpumask movable none\n",
        )
        .unwrap();
        assert_eq!(
            s.ops[2].step,
            Step::Reload {
                allowed: Some((1, vec![2]))
            }
        );
        assert_eq!(
            s.ops[4].step,
            Step::Reload {
                allowed: Some((1, vec![]))
            }
        );
        assert_eq!(s.ops[7].step, Step::Reload { allowed: None });
        assert_eq!(wants_against_model(&s, DeviceShape::DEFAULT_RUN), vec![]);
        let placed = parsed("reload movable 3\ncpumask movable 3\nreload\n").unwrap();
        let (again, text) = written_back(&placed);
        assert_eq!(again.ops, placed.ops, "{text}");
        for (text, want) in [
            (
                "reload movable\n",
                "expected `reload` or `reload DOMAIN CPUS`",
            ),
            (
                "reload movable 2 3\n",
                "expected `reload` or `reload DOMAIN CPUS`",
            ),
            ("reload movable 9\n", "CPU 9"),
            ("reload 5 2\n", "domain 5"),
            (
                "close a\nreload\nlost_wraps movable 0\n",
                "counts from an earlier `lost_wraps movable` line",
            ),
        ] {
            let first = "a = open movable mbm_total_bytes rmid=1\nlost_wraps movable\n";
            let (line, message) = refused(&format!("{first}{text}"));
            if text.starts_with("close") {
                assert_eq!(line, 5, "{text:?}: {message}");
            } else {
                assert_eq!(line, 3, "{text:?}: {message}");
            }
            assert!(
                message.contains(want),
                "{text:?}: {message:?} lacks {want:?}"
            );
        }
        for (first, why) in [
            ("a = open movable mbm_total_bytes rmid=1\n", "close a first"),
            ("stat movable rmid=1 start\n", "the perf stat of line 1"),
            ("moves movable start\n", "`moves 1 stop` first"),
            ("allowed movable 3 nowait\n", "was not waited for"),
        ] {
            refused_after(first, "reload\n", why);
        }
    }

    #[test]
    fn a_perf_stat_runs_from_its_start_to_its_stop_and_is_judged_there() {
        let s = parsed(
            "stat movable rmid=6 start\n\
             burst movable mbm_total_bytes rmid=6 1MiB\n\
             allowed movable none\n\
             burst movable mbm_total_bytes rmid=6 4MiB\n\
             allowed movable default\n\
             stat movable stop\n",
        )
        .unwrap();
        assert_eq!(s.ops[0].step, Step::StatStart { domain: 1, rmid: 6 });
        assert_eq!(
            s.ops[5].step,
            Step::StatStop {
                domain: 1,
                rmid: 6,
                job: 0
            }
        );
        let (again, text) = written_back(&s);
        assert_eq!(again.ops, s.ops, "{text}");
        // A rate between its start and its stop is counted, or one into
        // another counter whenever.
        parsed(
            "rate movable mbm_total_bytes rmid=2 8MiB/s\n\
             stat movable rmid=1 start\n\
             rate movable mbm_total_bytes rmid=1 8MiB/s\n\
             wait 300ms\n\
             rate movable mbm_total_bytes rmid=1 0/s\n\
             stat movable stop\n",
        )
        .unwrap();
        for (text, at, why) in [
            ("stat movable rmid=6 start\n", 1, "never stopped"),
            ("stat movable stop\n", 1, "no perf stat runs here"),
            ("stat movable\n", 1, "expected `stat DOMAIN rmid=N start`"),
            ("stat movable rmid=9 start\n", 1, "rmid"),
            ("park movable\nstat movable rmid=1 start\n", 2, "ENODEV"),
            (
                "stat movable rmid=1 start\nstat holding rmid=1 start\n",
                2,
                "runs already (line 1)",
            ),
            (
                "stat movable rmid=1 start\nstat holding stop\n",
                2,
                "runs on domain 1, not 0",
            ),
            (
                "rate movable mbm_total_bytes rmid=1 8MiB/s\nstat movable rmid=1 start\n",
                2,
                "stop it first",
            ),
            (
                "stat movable rmid=1 start\nrate movable mbm_total_bytes rmid=1 8MiB/s\nstat movable stop\n",
                3,
                "stop it first",
            ),
        ] {
            let (line, message) = refused(text);
            assert_eq!(line, at, "{text:?}: {message}");
            assert!(message.contains(why), "{text:?}: {message:?} lacks {why:?}");
        }
    }

    #[test]
    fn violations_takes_no_argument() {
        let s = parsed("violations\nmove movable\nviolations\n").unwrap();
        assert_eq!(s.ops[2].step, Step::Violations);
        let (line, message) = refused("violations\nviolations 0\n");
        assert_eq!(line, 2);
        assert!(message.contains("expected `violations` alone"), "{message}");
    }

    #[test]
    fn a_malformed_attr_is_refused_with_what_is_expected() {
        let cases = [
            (
                "a = open 0 mbm_total_bytes rmid=x\n",
                "expected rmid=NUMBER",
            ),
            ("a = open 0 mbm_total_bytes rmid=9\n", "RMIDs 0-7"),
            (
                "a = open 0 mbm_bytes rmid=1\n",
                "expected an event (llc_occupancy, mbm_total_bytes, mbm_local_bytes) or cpu-clock",
            ),
            (
                "a = open 0 mbm_total_bytes rmid=1 pinnned\n",
                "`pinnned`: expected disabled, pinned",
            ),
            (
                "a = open 0 mbm_total_bytes rmid=1 read=times,ids\n",
                "read format `ids`",
            ),
            (
                "a = open 0 mbm_total_bytes rmid=1 read=times,loss\n",
                "expected times, id, group or lost",
            ),
            (
                "a = open 5 mbm_total_bytes rmid=1\n",
                "domain 5: the device has domains 0-1",
            ),
            ("a = open 0\n", "expected `NAME = open DOMAIN EVENT"),
            ("c = open cpu-clock\n", "needs cpu=CPU or cpu=owner(DOMAIN)"),
            (
                "a = open 0 mbm_total_bytes rmid=1 cpu=owner(0)\n",
                "cpu=owner(...) is for cpu-clock",
            ),
            ("open 0 mbm_total_bytes rmid=1\n", "an open needs a name"),
            (
                "burst 0 mbm_total_bytes rmid=1 4MB\n",
                "expected bytes such as",
            ),
            (
                "burst 0 mbm_total_bytes rmid=1 100\n",
                "a burst is whole units of the device's counter (64 bytes)",
            ),
            ("rate 0 64MiB\n", "expected a rate such as 64MiB/s"),
            ("wait 3 minutes\n", "expected `wait TIME`"),
        ];
        for (text, want) in cases {
            let (line, message) = refused(text);
            assert_eq!(line, 1, "{text:?}");
            assert!(
                message.contains(want),
                "{text:?}: {message:?} lacks {want:?}"
            );
        }
    }

    #[test]
    fn a_want_must_follow_what_it_is_about() {
        let (line, message) = refused("a = open 0 mbm_total_bytes rmid=1\nwant a 4MiB\n");
        assert_eq!(line, 2);
        assert!(
            message.contains("must follow a read that shows a"),
            "{message}"
        );
        let (_, message) = refused(
            "a = open 0 mbm_total_bytes rmid=1\nb = open 0 mbm_total_bytes rmid=2\nread b\nwant a 0\n",
        );
        assert!(
            message.contains("must follow a read that shows a"),
            "{message}"
        );
        let (_, message) = refused("a = open 0 mbm_total_bytes rmid=1\nread a\nwant a ENODEV\n");
        assert!(message.contains("must follow a's open"), "{message}");
        let (_, message) = refused("a = open 0 mbm_total_bytes rmid=1\nwant a EBUSY\n");
        assert!(
            message.contains("with ENODEV, EINVAL, EBADF only"),
            "{message}"
        );
        let (_, message) = refused("a = open 0 mbm_total_bytes rmid=1\nread a\nwant a ENODEV\n");
        assert!(message.contains("must follow a's open"), "{message}");
    }

    #[test]
    fn the_model_judges_the_wants_without_a_guest() {
        let shape = DeviceShape {
            pmus: 2,
            slots: 4,
            unit_bytes: 64,
            counter_width: 24,
            max_rate: 1 << 30,
            lined_pmus: 2,
        };
        let text = |want: &str| {
            format!(
                "a = open movable mbm_total_bytes rmid=1 read=times\n\
                 burst movable mbm_total_bytes rmid=1 1MiB\n\
                 disable a\n\
                 burst movable mbm_total_bytes rmid=1 2MiB\n\
                 move movable\n\
                 enable a\n\
                 read a\n\
                 want a {want}\n"
            )
        };
        let right = parsed(&text("1MiB")).unwrap();
        assert_eq!(wants_against_model(&right, shape), vec![]);
        let wrong = parsed(&text("3MiB")).unwrap();
        let found = wants_against_model(&wrong, shape);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].line, 8);
        let refused =
            parsed("park movable\na = open movable mbm_total_bytes rmid=1\nwant a EINVAL\n")
                .unwrap();
        assert_eq!(wants_against_model(&refused, shape)[0].line, 3);
    }

    /// `want NAME scaled N%`: after a read that shows NAME, opened with
    /// its clocks, with a bound of 1 to 100 %.
    #[test]
    fn a_scaled_want_follows_a_read_of_an_event_with_its_clocks() {
        let s = parsed(
            "a = open movable mbm_total_bytes rmid=1 read=times\n\
             read a\n\
             want a scaled 10%\n",
        )
        .unwrap();
        let [want @ Want::Scaled {
            line: 3,
            handle: 1,
            percent: 10,
            ..
        }] = &s.ops[1].wants[..]
        else {
            panic!("{:?}", s.ops[1].wants)
        };
        assert_eq!(want.to_string(), "want a scaled 10%");
        let open = "a = open movable mbm_total_bytes rmid=1 read=times\n";
        for (text, want) in [
            ("read a\nwant a scaled 10\n", "expected a bound such as 10%"),
            ("read a\nwant a scaled 0%\n", "expected a bound such as 10%"),
            (
                "read a\nwant a scaled 101%\n",
                "expected a bound such as 10%",
            ),
            ("want a scaled 10%\n", "must follow a read that shows a"),
            ("read a\nwant b scaled 10%\n", "`b` is not open here"),
        ] {
            let (line, message) = refused(&format!("{open}{text}"));
            assert_eq!(line, 1 + text.lines().count(), "{text:?}: {message}");
            assert!(
                message.contains(want),
                "{text:?}: {message:?} lacks {want:?}"
            );
        }
        refused_after(
            "a = open movable mbm_total_bytes rmid=1\n",
            "want a scaled 10%\n",
            "needs it opened with `read=times`",
        );
    }

    /// `want NAME landed`: the model must promise the count all that
    /// landed since its open or RESET; a window with the event disabled
    /// is refused before any guest, and so is one multiplexed.
    #[test]
    fn a_want_of_all_that_landed_needs_the_model_to_promise_it() {
        let shape = DeviceShape {
            pmus: 2,
            slots: 1,
            unit_bytes: 64,
            counter_width: 24,
            max_rate: 1 << 30,
            lined_pmus: 2,
        };
        let text = |middle: &str| {
            format!(
                "a = open movable mbm_total_bytes rmid=1
                 burst movable mbm_total_bytes rmid=1 1MiB
                 {middle}
                 burst movable mbm_total_bytes rmid=1 2MiB
                 move movable
                 read a
                 want a landed
"
            )
        };
        let right = parsed(&text("reset a")).unwrap();
        assert_eq!(wants_against_model(&right, shape), vec![]);
        for middle in [
            "disable a
burst movable mbm_total_bytes rmid=1 4MiB
enable a",
            "b = open movable mbm_total_bytes rmid=2",
        ] {
            let wrong = parsed(&text(middle)).unwrap();
            let found = wants_against_model(&wrong, shape);
            assert_eq!(found.len(), 1, "{middle}: {found:?}");
            assert!(
                found[0]
                    .message
                    .contains("does not promise a all that landed"),
                "{}",
                found[0].message
            );
        }
    }

    /// `offline owner(DOMAIN)`: the parser predicts the CPU for its own
    /// bookkeeping (the parks it makes) and leaves it to the runner; it
    /// refuses only a domain with no owner, or one whose only allowed CPU
    /// online is CPU 0. (The old parser took `owner(movable)` for a bad
    /// CPU number.)
    /// A hotplug operation armed to fail at a kernel state: a state the
    /// parser knows, a CPU that can take the operation; an offline below
    /// perf's state (or one that completes) moves the owner's PMU, one at
    /// or above it leaves it; the line is written back as it was read.
    #[test]
    fn a_failing_hotplug_line_names_a_known_state_and_a_cpu_that_can_take_it() {
        let s = parsed(
            "offline owner(movable) fails at perf:online\ncpumask movable 2\n\
             offline owner(movable) fails at smpboot/threads:online\ncpumask movable 3\n\
             offline owner(movable) completes past irq/affinity:online\ncpumask movable 2\n\
             offline 3 fails at workqueue:online\ncpumask movable 2\n\
             park movable\nonline 3 fails at perf:online\ncpumask movable none\n",
        )
        .unwrap();
        assert_eq!(
            s.ops[0].step,
            Step::FailAt {
                cpu: 2,
                online: false,
                state: "perf:online".into(),
                completes: false
            }
        );
        assert_eq!(s.ops[0].on_owner, Some(1));
        assert_eq!(s.ops[2].on_owner, Some(1));
        assert_eq!(
            s.ops[9].step,
            Step::FailAt {
                cpu: 3,
                online: true,
                state: "perf:online".into(),
                completes: false
            }
        );
        let (again, text) = written_back(&s);
        assert_eq!(again.ops.len(), s.ops.len());
        assert!(
            text.contains("offline 3 completes past irq/affinity:online"),
            "{text}"
        );
        assert!(fails_hotplug(&text));
        assert!(!fails_hotplug(
            "offline 3\n# offline 2 fails at perf:online\n"
        ));
        // The model follows the parser: the PMU perf's teardown moved is
        // on 3, the one it never reached on 2.
        let shape = DeviceShape::DEFAULT_RUN;
        assert_eq!(wants_against_model(&s, shape), vec![]);
        let stayed = parsed("offline 2 fails at smpboot/threads:online\ncpumask movable 2\n");
        let found = wants_against_model(&stayed.unwrap(), shape);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].message.contains("places domain 1 on CPU 3"),
            "{found:?}"
        );
        for (text, line, want) in [
            ("offline 2 fails at perf:offline\n", 1, "`perf:offline`: not a hotplug state a line can arm; these are: smpboot/threads:online"),
            ("offline 9 fails at perf:online\n", 1, "CPU 9"),
            ("offline x fails at perf:online\n", 1, "expected a CPU number"),
            ("offline 2 fails perf:online\n", 1, "expected `offline CPU fails at STATE` or `offline CPU completes past STATE`"),
            ("offline 2 fails at\n", 1, "expected `offline CPU fails at STATE`"),
            ("offline 0 fails at perf:online\n", 1, "CPU 0 never goes offline"),
            ("online 2 fails at perf:online\n", 1, "CPU 2 is online here already"),
            ("offline 3\noffline 3 fails at perf:online\n", 2, "CPU 3 is offline here already"),
            ("park movable\nonline owner(movable) fails at perf:online\n", 2, "by number"),
            ("park movable\noffline owner(movable) fails at perf:online\n", 2, "no owner to take offline"),
            ("moves movable start\noffline 3 fails at perf:online\nmoves movable stop\n", 2, "switched by the thread"),
        ] {
            let (at, message) = refused(text);
            assert_eq!(at, line, "{text}: {message}");
            assert!(message.contains(want), "{text}: {message}");
        }
    }

    #[test]
    fn an_offline_of_an_owner_is_named_by_role_and_resolved_at_run_time() {
        let s = parsed(
            "a = open movable mbm_total_bytes rmid=1\n\
             offline owner(movable)\n\
             online 2\n\
             move movable\n\
             offline owner(movable)\n\
             offline owner(movable)\n",
        )
        .unwrap();
        type Parked = Vec<(u32, bool)>;
        let steps: Vec<(Step, Option<u32>, Parked)> = s
            .ops
            .iter()
            .map(|o| (o.step.clone(), o.on_owner, o.parks.clone()))
            .collect();
        assert_eq!(
            steps[1..],
            [
                (Step::Offline { cpu: 2 }, Some(1), vec![]),
                (Step::Online { cpu: 2 }, None, vec![]),
                (Step::Move { domain: 1 }, None, vec![]),
                // The move took the PMU from 3 (its CPU since 2 went) to 2.
                (Step::Offline { cpu: 2 }, Some(1), vec![]),
                (Step::Offline { cpu: 3 }, Some(1), vec![(1, true)]),
            ]
        );
        assert!(refused("park movable\noffline owner(movable)\n")
            .1
            .contains("domain 1 is parked here"));
        assert!(refused("allowed holding 0\noffline owner(holding)\n")
            .1
            .contains("CPU 0 here"));
        assert!(refused("offline owner(nowhere)\n").1.contains("`nowhere`"));
        for text in [
            "online owner(movable)\n",
            "allowed movable owner(movable)\n",
        ] {
            let (line, message) = refused(text);
            assert_eq!(line, 1);
            assert!(
                message.contains("known at run time") || message.contains("expected a CPU list"),
                "{text:?}: {message}"
            );
        }
        // The host check of the wants resolves it as the runner does.
        let shape = DeviceShape::DEFAULT_RUN;
        let judged = parsed(
            "a = open movable mbm_total_bytes rmid=1 read=times\n\
             burst movable mbm_total_bytes rmid=1 1MiB\n\
             offline owner(movable)\n\
             burst movable mbm_total_bytes rmid=1 2MiB\n\
             offline owner(movable)\n\
             burst movable mbm_total_bytes rmid=1 4MiB\n\
             online 3\n\
             read a\n\
             want a 7MiB\n",
        )
        .unwrap();
        assert_eq!(judged.ops[4].parks, vec![(1, true)]);
        assert_eq!(judged.ops[6].step, Step::Unpark { domain: 1, cpu: 3 });
        assert_eq!(wants_against_model(&judged, shape), vec![]);
    }

    /// A want the model refuses says, field by field, what was wanted,
    /// what the model has and the difference; the check goes on from the
    /// model's value, so a later right want is not refused for it (the old
    /// check printed the model's rule on the delta since the last read,
    /// and refused the second want too).
    #[test]
    fn a_refused_want_gives_the_difference_and_no_cascade() {
        let text = "e = open movable mbm_total_bytes rmid=0 read=times\n\
                    burst movable mbm_total_bytes rmid=0 1MiB\n\
                    read e\n\
                    want e 2MiB\n\
                    burst movable mbm_total_bytes rmid=0 1MiB\n\
                    read e\n\
                    want e 2MiB\n";
        let found = wants_against_model(&parsed(text).unwrap(), DeviceShape::DEFAULT_RUN);
        assert_eq!(
            found
                .iter()
                .map(|e| (e.line, e.message.as_str()))
                .collect::<Vec<_>>(),
            vec![(
                4,
                "the model does not allow it: e: value wanted 2MiB (2097152), the model's 1MiB (1048576), delta -1MiB"
            )]
        );
        assert_eq!(
            difference("a", 3 << 20, (7 << 20, 7 << 20), "got"),
            "a: value wanted 3MiB (3145728), got 7MiB (7340032), delta +4MiB"
        );
        assert_eq!(
            difference("a", 0, (1 << 20, 3 << 20), "the model's"),
            "a: value wanted 0 (0), the model's 1MiB (1048576) to 3MiB (3145728), delta +1MiB"
        );
        assert_eq!(
            difference("a", 5 << 20, (1 << 20, 3 << 20), "the model's"),
            "a: value wanted 5MiB (5242880), the model's 1MiB (1048576) to 3MiB (3145728), delta -2MiB"
        );
    }

    /// A walk of a folder leaves its known violations out (they fail until
    /// fixed); named, they are there.
    #[test]
    fn a_walk_of_a_folder_leaves_the_known_violations_out() {
        let root = std::env::temp_dir().join(format!("perfbed-walk-{}", std::process::id()));
        let known = root.join("parks").join(KNOWN_VIOLATIONS);
        std::fs::create_dir_all(&known).unwrap();
        for file in [
            root.join("parks/a.scn"),
            known.join("b.scn"),
            root.join("c.scn"),
        ] {
            std::fs::write(file, "").unwrap();
        }
        let walked = files_under(std::slice::from_ref(&root)).unwrap();
        let named = files_under(std::slice::from_ref(&known)).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(walked, [root.join("c.scn"), root.join("parks/a.scn")]);
        assert_eq!(named, [known.join("b.scn")]);
    }

    #[test]
    fn the_library_parses_and_the_model_allows_its_wants() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let known = root.join(KNOWN_VIOLATIONS);
        let mut files = files_under(std::slice::from_ref(&root)).unwrap();
        if known.is_dir() {
            files.extend(files_under(&[known]).unwrap());
        }
        assert!(files.len() >= 5, "{files:?}");
        let device = crate::stress::device(4, None).unwrap();
        let shape = DeviceShape {
            slots: super::super::SLOTS,
            ..crate::stress::lifecycle::run::shape(&device)
        };
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            // Each on the guest its `# arch:` header names (x86's if none).
            let arch = arch_of(&text).unwrap_or(Arch::X86_64);
            let layout = Layout { arch, ..layout() };
            let s = parse(&file, &text, &layout, 1).unwrap_or_else(|e| panic!("{e}"));
            let names = crate::run::scenario::check_names(true, true, arch).unwrap();
            let check = s
                .check
                .as_deref()
                .unwrap_or_else(|| panic!("{}: no `# check:` header", file.display()));
            assert!(
                names.contains(&check),
                "{}: `# check: {check}` is no check of cargo xtask run",
                file.display()
            );
            assert!(
                s.ops.iter().any(|o| !o.wants.is_empty()),
                "{}: no want",
                file.display()
            );
            let refused = wants_against_model(&s, shape);
            assert_eq!(refused, vec![], "{}", file.display());
        }
    }
}
