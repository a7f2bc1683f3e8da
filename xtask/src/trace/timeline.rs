//! What a trace plot shows, worked out from the trace before anything is
//! drawn (so that tests can check the content, not pixels): per domain, the
//! owner over time, moves and parks, placement violations, the guest's CPU
//! offline/online events and kernel events for the domain's CPUs, and each
//! slot's counter (unwrapped, in bytes) against the truth injected for what
//! it counts; for the whole run, which checks ran when.

use std::collections::BTreeMap;

use perfbed_device::regs;

use super::model::{Line, Trace};
use super::spans;

/// The driver's PMUs are `perfbed_l3_<domain>`.
const PMU_PREFIX: &str = "perfbed_l3_";

/// Seconds on the device's clock (since the device started).
pub type Secs = f64;

/// The time of a record, in seconds on the device's clock.
pub fn secs(time_ns: u64) -> Secs {
    time_ns as f64 / 1e9
}

/// One assignment of a slot, and what it counted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlotSeries {
    pub slot: u32,
    pub label: String,
    /// Correctly placed reads of `SLOT_COUNT`, unwrapped, in bytes.
    pub counter: Vec<(Secs, f64)>,
    /// The traffic injected (and set by rates) for the slot's (event, RMID)
    /// since it was assigned, at the same instants.
    pub truth: Vec<(Secs, f64)>,
    wraps: u64,
    last_raw: Option<u64>,
    truth_base: f64,
    key: (u64, u64),
}

/// What a counter lane shows: one (slot, event, RMID), however often the
/// driver assigned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CounterKey {
    pub slot: u32,
    pub event: u64,
    pub rmid: u64,
}

impl SlotSeries {
    pub fn key(&self) -> CounterKey {
        CounterKey {
            slot: self.slot,
            event: self.key.0,
            rmid: self.key.1,
        }
    }
}

/// One counter lane: an (event, RMID) of a domain, scaled to its own
/// range, and each slot that counted it (its legend entries).
#[derive(Debug, Clone)]
pub struct CounterLane<'t> {
    pub event: u64,
    pub rmid: u64,
    pub entries: Vec<(CounterKey, Vec<&'t SlotSeries>)>,
}

/// A kernel event the guest traced on one CPU (`guest_kernel` lines:
/// `event=<tracepoint> cpu=N` and the tracepoint's own fields), such as
/// `cpuhp_enter`/`cpuhp_exit`.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelEvent {
    pub time: Secs,
    pub cpu: u32,
    pub event: String,
    /// The other fields, `key=value` in the line's order.
    pub detail: String,
}

/// Checks that ran from `start` to `end` (one band on the time axis).
#[derive(Debug, Clone, PartialEq)]
pub struct CheckBand {
    pub start: Secs,
    pub end: Secs,
    pub names: Vec<String>,
    pub failed: usize,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct DomainTimeline {
    pub allowed: Vec<u32>,
    /// The owner when the trace starts (the first change's `from`; `None`:
    /// unknown, the trace has no change).
    pub initial_owner: Option<Option<u32>>,
    /// Every owner change: (time, new owner), `None` for no owner.
    pub owner: Vec<(Secs, Option<u32>)>,
    /// Owner changes from one CPU to another: (time, new CPU).
    pub moves: Vec<(Secs, u32)>,
    /// Owner set from none: (time, CPU).
    pub places: Vec<(Secs, u32)>,
    /// Owner cleared.
    pub parks: Vec<Secs>,
    /// Counter reads that broke the placement rule: (time, reading CPU).
    pub violations: Vec<(Secs, u32)>,
    /// Interrupts handled: when and by which vCPU the overflow status was
    /// read and cleared (the device sees the handler only there).
    pub interrupts: Vec<(Secs, u32)>,
    /// When the host changed the domain's allowed CPUs, and to what.
    pub allowed_changes: Vec<(Secs, String)>,
    /// The CPU the kernel placed the domain's PMU on, as the guest read its
    /// `cpumask` (`None`: parked): where the driver should have moved the
    /// owner.
    pub cpumask: Vec<(Secs, Option<u32>)>,
    /// The guest took one of the domain's CPUs offline / online.
    pub offline: Vec<(Secs, u32)>,
    pub online: Vec<(Secs, u32)>,
    /// Kernel events traced on the domain's CPUs.
    pub kernel: Vec<KernelEvent>,
    pub slots: Vec<SlotSeries>,
}

impl DomainTimeline {
    /// The owner at `t` (after every change at or before it); `None`:
    /// unknown.
    pub fn owner_at(&self, t: Secs) -> Option<Option<u32>> {
        self.owner
            .iter()
            .take_while(|&&(at, _)| at <= t)
            .last()
            .map_or(self.initial_owner, |&(_, o)| Some(o))
    }

    /// The counter lanes: one per (event, RMID) that counted something,
    /// in the order each first appears, holding one entry per slot that
    /// counted it (with every assignment of that slot).
    pub fn counter_lanes(&self) -> Vec<CounterLane<'_>> {
        let mut lanes: Vec<CounterLane<'_>> = Vec::new();
        for series in self.slots.iter().filter(|s| !s.counter.is_empty()) {
            let key = series.key();
            let lane = match lanes
                .iter()
                .position(|l| (l.event, l.rmid) == (key.event, key.rmid))
            {
                Some(i) => &mut lanes[i],
                None => {
                    lanes.push(CounterLane {
                        event: key.event,
                        rmid: key.rmid,
                        entries: Vec::new(),
                    });
                    lanes.last_mut().expect("just pushed")
                }
            };
            match lane.entries.iter_mut().find(|(k, _)| *k == key) {
                Some((_, all)) => all.push(series),
                None => lane.entries.push((key, vec![series])),
            }
        }
        lanes
    }

    fn window(&self, from: Secs, to: Secs) -> DomainTimeline {
        fn keep<T: Clone>(v: &[(Secs, T)], from: Secs, to: Secs) -> Vec<(Secs, T)> {
            v.iter()
                .filter(|(t, _)| (from..=to).contains(t))
                .cloned()
                .collect()
        }
        let within = |t: &Secs| (from..=to).contains(t);
        DomainTimeline {
            allowed: self.allowed.clone(),
            initial_owner: self.owner_at(from),
            owner: keep(&self.owner, from, to),
            moves: keep(&self.moves, from, to),
            places: keep(&self.places, from, to),
            parks: self.parks.iter().copied().filter(within).collect(),
            violations: keep(&self.violations, from, to),
            interrupts: keep(&self.interrupts, from, to),
            allowed_changes: keep(&self.allowed_changes, from, to),
            cpumask: keep(&self.cpumask, from, to),
            offline: keep(&self.offline, from, to),
            online: keep(&self.online, from, to),
            kernel: self
                .kernel
                .iter()
                .filter(|e| within(&e.time))
                .cloned()
                .collect(),
            slots: self
                .slots
                .iter()
                .map(|s| SlotSeries {
                    counter: keep(&s.counter, from, to),
                    truth: keep(&s.truth, from, to),
                    ..s.clone()
                })
                .filter(|s| !s.counter.is_empty())
                .collect(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    /// The first and last record's time (or the window's).
    pub start: Secs,
    pub end: Secs,
    pub domains: Vec<DomainTimeline>,
    /// The checks that ran, in order.
    pub checks: Vec<CheckBand>,
    /// Records the trace lost before its first line.
    pub dropped: u64,
}

/// How many marks of each kind a plot has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    pub owner_changes: usize,
    pub moves: usize,
    pub parks: usize,
    pub violations: usize,
    pub offline: usize,
    pub online: usize,
    pub counter_points: usize,
}

impl Timeline {
    /// The part of the timeline from `from` to `to` (a checked
    /// `--from`/`--to` window): marks outside it are left out, the owner at
    /// `from` is where the owner line starts, and a check band crossing an
    /// edge is cut there.
    pub fn window(&self, from: Secs, to: Secs) -> Timeline {
        Timeline {
            start: from,
            end: to,
            domains: self.domains.iter().map(|d| d.window(from, to)).collect(),
            checks: self
                .checks
                .iter()
                .filter(|c| c.end >= from && c.start <= to)
                .map(|c| CheckBand {
                    start: c.start.max(from),
                    end: c.end.min(to),
                    ..c.clone()
                })
                .collect(),
            dropped: self.dropped,
        }
    }

    pub fn marks(&self) -> Marks {
        let mut m = Marks::default();
        for d in &self.domains {
            m.owner_changes += d.owner.len();
            m.moves += d.moves.len();
            m.parks += d.parks.len();
            m.violations += d.violations.len();
            m.offline += d.offline.len();
            m.online += d.online.len();
            m.counter_points += d.slots.iter().map(|s| s.counter.len()).sum::<usize>();
        }
        m
    }
}

/// Injected traffic of one (event, RMID) of a domain so far: queued bytes
/// plus the steady rate integrated over time.
#[derive(Debug, Clone, Copy, Default)]
struct Truth {
    bytes: f64,
    rate: f64,
    since: Secs,
}

impl Truth {
    fn at(&self, t: Secs) -> f64 {
        self.bytes + self.rate * (t - self.since).max(0.0)
    }
}

fn event_id(name: Option<&str>) -> u64 {
    match name {
        Some("mbm_total_bytes") => regs::Event::MbmTotalBytes as u64,
        Some("mbm_local_bytes") => regs::Event::MbmLocalBytes as u64,
        _ => 0,
    }
}

/// The slot index of a `SLOT_CTL[s]`/`SLOT_COUNT[s]` register name.
fn slot_of(reg: &str, prefix: &str) -> Option<u32> {
    reg.strip_prefix(prefix)?
        .strip_prefix('[')?
        .strip_suffix(']')?
        .parse()
        .ok()
}

pub fn build(trace: &Trace) -> Timeline {
    let shape = &trace.shape;
    let at = |l: &Line| secs(l.time_ns);
    let mut checks = Vec::new();
    let mut domains: Vec<DomainTimeline> = shape
        .domains
        .iter()
        .map(|cpus| DomainTimeline {
            allowed: cpus.clone(),
            ..Default::default()
        })
        .collect();
    let mut truths: Vec<BTreeMap<(u64, u64), Truth>> = vec![BTreeMap::new(); domains.len()];
    // The current series of each (domain, slot), an index into `slots`.
    let mut current: BTreeMap<(usize, u32), usize> = BTreeMap::new();
    let wrap = 2f64.powi(shape.width as i32);
    for line in &trace.lines {
        let t = at(line);
        if line.kind == "host_check" {
            checks.push(CheckBand {
                start: t,
                end: line.number("until").map_or(t, secs),
                names: line
                    .field("names")
                    .map(spans::parse_names)
                    .unwrap_or_default(),
                failed: line.number("failed").unwrap_or(0) as usize,
            });
            continue;
        }
        if line.kind == "guest_kernel" {
            if let (Some(cpu), Some(event)) = (line.number("cpu"), line.field("event")) {
                let detail = line
                    .fields
                    .iter()
                    .filter(|(k, _)| !["cpu", "event", "guest_ns"].contains(&k.as_str()))
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ");
                for d in domains
                    .iter_mut()
                    .filter(|d| d.allowed.contains(&(cpu as u32)))
                {
                    d.kernel.push(KernelEvent {
                        time: t,
                        cpu: cpu as u32,
                        event: event.to_string(),
                        detail: detail.clone(),
                    });
                }
            }
            continue;
        }
        if let Some(cpu) = line.number("cpu").map(|c| c as u32) {
            if line.kind == "guest_offline" || line.kind == "guest_online" {
                for d in domains.iter_mut().filter(|d| d.allowed.contains(&cpu)) {
                    if line.kind == "guest_offline" {
                        d.offline.push((t, cpu))
                    } else {
                        d.online.push((t, cpu))
                    }
                }
                continue;
            }
        }
        if line.kind == "guest_cpumask" {
            let pmu_domain = line
                .field("pmu")
                .and_then(|p| p.strip_prefix(PMU_PREFIX))
                .and_then(|d| d.parse::<usize>().ok());
            if let Some(dom) = pmu_domain.and_then(|d| domains.get_mut(d)) {
                let cpu = line
                    .field("cpus")
                    .and_then(|c| c.split([',', '-']).next())
                    .and_then(|c| c.parse().ok());
                dom.cpumask.push((t, cpu));
            }
            continue;
        }
        let Some(d) = line.domain().filter(|&d| d < domains.len()) else {
            continue;
        };
        let dom = &mut domains[d];
        let key = (
            event_id(line.field("event")),
            line.number("rmid").unwrap_or(0),
        );
        match line.kind.as_str() {
            "owner" => {
                let to = line.number("to").map(|c| c as u32);
                let from = line.number("from");
                if dom.owner.is_empty() {
                    dom.initial_owner = Some(from.map(|c| c as u32));
                }
                dom.owner.push((t, to));
                match (from, to) {
                    (_, None) => dom.parks.push(t),
                    (None, Some(cpu)) => dom.places.push((t, cpu)),
                    (Some(_), Some(cpu)) => dom.moves.push((t, cpu)),
                }
            }
            "inject" => {
                let truth = truths[d].entry(key).or_default();
                truth.bytes += line.number("bytes").unwrap_or(0) as f64;
            }
            "rate" => {
                let truth = truths[d].entry(key).or_default();
                truth.bytes = truth.at(t);
                truth.since = t;
                truth.rate = line.number("bytes_per_sec").unwrap_or(0) as f64;
            }
            "allowed" => dom
                .allowed_changes
                .push((t, line.field("to").unwrap_or("?").to_string())),
            "read"
                if line.field("reg") == Some("DOM_IRQ_STATUS") && !line.has_flag("violation") =>
            {
                // A read that found nothing pending handled no interrupt.
                if let Some(cpu) = line
                    .number("cpu")
                    .filter(|_| line.number("value").is_some_and(|v| v != 0))
                {
                    dom.interrupts.push((t, cpu as u32));
                }
            }
            "read" if line.has_flag("violation") => {
                dom.violations
                    .push((t, line.number("cpu").unwrap_or(0) as u32));
            }
            "write" if line.field("bad").is_none() => {
                let (Some(slot), Some(value)) = (
                    line.field("reg").and_then(|r| slot_of(r, "SLOT_CTL")),
                    line.number("value"),
                ) else {
                    continue;
                };
                current.remove(&(d, slot));
                if value & regs::SLOT_CTL_ASSIGNED != 0 {
                    let key = (regs::slot_ctl_event(value), regs::slot_ctl_rmid(value));
                    let event =
                        regs::Event::from_u64(key.0).map_or("?".to_string(), |e| e.to_string());
                    let truth_base = truths[d].get(&key).map_or(0.0, |tr| tr.at(t));
                    dom.slots.push(SlotSeries {
                        slot,
                        label: format!("slot {slot}: {event} rmid {}", key.1),
                        truth_base,
                        key,
                        ..Default::default()
                    });
                    current.insert((d, slot), dom.slots.len() - 1);
                }
            }
            "read" if line.field("bad").is_none() => {
                let Some(slot) = line.field("reg").and_then(|r| slot_of(r, "SLOT_COUNT")) else {
                    continue;
                };
                let Some(raw) = line
                    .number("value")
                    .filter(|v| v & (regs::COUNTER_ERROR | regs::COUNTER_UNAVAILABLE) == 0)
                else {
                    continue;
                };
                let Some(&i) = current.get(&(d, slot)) else {
                    continue;
                };
                let series = &mut dom.slots[i];
                if series.last_raw.is_some_and(|last| raw < last) {
                    series.wraps += 1;
                }
                series.last_raw = Some(raw);
                let bytes = (series.wraps as f64 * wrap + raw as f64) * shape.unit as f64;
                let truth =
                    truths[d].get(&series.key).map_or(0.0, |tr| tr.at(t)) - series.truth_base;
                series.counter.push((t, bytes));
                series.truth.push((t, truth));
            }
            _ => {}
        }
    }
    Timeline {
        start: trace.lines.first().map_or(0.0, at),
        end: trace.lines.last().map_or(0.0, at),
        domains,
        checks,
        dropped: shape.dropped,
    }
}
