//! What a trace plot shows, worked out from the trace before anything is
//! drawn (so that tests can check the content, not pixels): per domain, the
//! owner over time, moves and parks, placement violations, the guest's CPU
//! offline/online events for the domain's CPUs, and each slot's counter
//! (unwrapped, in bytes) against the truth injected for what it counts.

use std::collections::BTreeMap;

use perfbed_device::regs;

use super::model::{Line, Trace};

/// The driver's PMUs are `perfbed_l3_<domain>`.
const PMU_PREFIX: &str = "perfbed_l3_";

/// Milliseconds from the trace's first record.
pub type Ms = f64;

/// One assignment of a slot, and what it counted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlotSeries {
    pub slot: u32,
    pub label: String,
    /// Correctly placed reads of `SLOT_COUNT`, unwrapped, in bytes.
    pub counter: Vec<(Ms, f64)>,
    /// The traffic injected (and set by rates) for the slot's (event, RMID)
    /// since it was assigned, at the same instants.
    pub truth: Vec<(Ms, f64)>,
    wraps: u64,
    last_raw: Option<u64>,
    truth_base: f64,
    key: (u64, u64),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct DomainTimeline {
    pub allowed: Vec<u32>,
    /// The owner when the trace starts (the first change's `from`).
    pub initial_owner: Option<u32>,
    /// Every owner change: (time, new owner), `None` for no owner.
    pub owner: Vec<(Ms, Option<u32>)>,
    /// Owner changes from one CPU to another: (time, new CPU).
    pub moves: Vec<(Ms, u32)>,
    /// Owner set from none: (time, CPU).
    pub places: Vec<(Ms, u32)>,
    /// Owner cleared.
    pub parks: Vec<Ms>,
    /// Counter reads that broke the placement rule: (time, reading CPU).
    pub violations: Vec<(Ms, u32)>,
    /// Interrupts handled: when and by which vCPU the overflow status was
    /// read and cleared (the device sees the handler only there).
    pub interrupts: Vec<(Ms, u32)>,
    /// When the host changed the domain's allowed CPUs, and to what.
    pub allowed_changes: Vec<(Ms, String)>,
    /// The CPU the kernel placed the domain's PMU on, as the guest read its
    /// `cpumask` (`None`: parked): where the driver should have moved the
    /// owner.
    pub cpumask: Vec<(Ms, Option<u32>)>,
    /// The guest took one of the domain's CPUs offline / online.
    pub offline: Vec<(Ms, u32)>,
    pub online: Vec<(Ms, u32)>,
    pub slots: Vec<SlotSeries>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    pub end: Ms,
    pub domains: Vec<DomainTimeline>,
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
    since: Ms,
}

impl Truth {
    fn at(&self, t: Ms) -> f64 {
        self.bytes + self.rate * (t - self.since).max(0.0) / 1000.0
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
    let start = trace.lines.first().map_or(0, |l| l.time_ns);
    let ms = |l: &Line| l.time_ns.saturating_sub(start) as f64 / 1e6;
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
        let t = ms(line);
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
                    dom.initial_owner = from.map(|c| c as u32);
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
    let end = trace.lines.last().map_or(0.0, ms);
    Timeline {
        end,
        domains,
        dropped: shape.dropped,
    }
}
