//! What a stress run saw: the events it kept open, their final counts
//! compared with the device's truth, and the report it prints.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use perfbed_agent::JobResult;
use perfbed_device::regs::{self, Event};
use perfbed_device::DeviceState;

use super::jobs::{histogram, OpenRetries};
use super::placements::Placements;
use crate::checks::Check;
use crate::progress::human;
use crate::stress::traffic::{Key, TrafficStats};

/// An event the stress keeps open, and how its final read is checked.
pub struct Watched {
    pub name: String,
    pub handle: u32,
    pub kind: WatchedKind,
}

pub enum WatchedKind {
    /// One event, read as [value, enabled, running].
    Single(Key),
    /// A group read as [nr, enabled, running, total, local, occupancy].
    Group { domain: u32, rmid: u32 },
}

impl Watched {
    /// The words of a read that must never go down.
    pub fn cumulative_words(&self) -> &'static [usize] {
        match self.kind {
            WatchedKind::Single(_) => &[0],
            WatchedKind::Group { .. } => &[3, 4],
        }
    }
}

/// Everything the run saw.
pub struct StressReport {
    pub checks: Vec<Check>,
    pub cycles: usize,
    pub hotplug_writes: u64,
    pub schedule_time: Duration,
    pub op_time: Duration,
    pub placements: Placements,
    pub traffic: TrafficStats,
    pub loop_result: Option<JobResult>,
    pub reads: u64,
    pub counts_compared: usize,
    pub counts_lost: usize,
    pub open_retries: OpenRetries,
    pub seed: u64,
    pub replay: String,
    pub run_dir: PathBuf,
}

impl StressReport {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }

    pub fn text(&self) -> String {
        let mut out = format!(
            "\nperfbed stress: {}\n",
            if self.passed() { "PASSED" } else { "FAILED" }
        );
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        for check in &self.checks {
            let _ = writeln!(
                out,
                "  {}  {:width$}  {}",
                if check.passed { "PASS" } else { "FAIL" },
                check.name,
                check.detail
            );
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
        let _ = writeln!(
            out,
            "  PMUs: {} moves, {} parks, {} unparks seen in cpumask",
            p.moves, p.parks, p.unparks
        );
        let _ = writeln!(
            out,
            "  allowed-set changes: {}, {} of them moved, parked or placed a PMU",
            p.allowed_changes, p.replaced_by_allowed
        );
        if let Some(JobResult::OpenCloseLoop {
            attempts,
            opened,
            errors,
            read_errors,
        }) = &self.loop_result
        {
            let _ = writeln!(
                out,
                "  open-close loop: {attempts} opens, {opened} opened, refused {}, read errors {}",
                histogram(errors),
                histogram(read_errors)
            );
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
        let _ = writeln!(
            out,
            "  counts compared {}, lost {}",
            self.counts_compared, self.counts_lost
        );
        let _ = writeln!(out, "  run folder: {}", self.run_dir.display());
        if !self.passed() {
            let _ = writeln!(
                out,
                "  seed {}; replay with:\n    {}",
                self.seed, self.replay
            );
        }
        out
    }
}

/// Final counts against the device's truth.
#[derive(Default)]
pub struct Tally {
    /// The device's counter unit in bytes.
    pub unit: u64,
    pub compared: usize,
    pub lost: usize,
    pub count_problems: Vec<String>,
    pub time_problems: Vec<String>,
}

impl Tally {
    /// `got` against the `truth` in bytes. The device counts whole units
    /// from a slot's assignment (before the traffic started), so an exact
    /// count is the truth rounded down to a whole unit: the rest of the last
    /// unit is traffic no counter shows.
    pub fn compare(&mut self, name: String, got: u64, truth: u64) {
        self.compared += 1;
        let want = regs::whole_units(truth, self.unit);
        if got != want {
            self.lost += 1;
            let how = if got < want {
                format!("lost {}", want - got)
            } else {
                format!("{} too many", got - want)
            };
            self.count_problems.push(format!("{name}: counted {got}, the device's truth {truth} ({want} in whole units; {how} bytes)"));
        }
    }

    /// Not multiplexed: running == enabled; and enabled all along: at
    /// least `min_enabled_ns` (an event whose clock stopped at a park would
    /// otherwise still claim 100 % running).
    pub fn times(
        &mut self,
        name: &str,
        enabled: Option<&u64>,
        running: Option<&u64>,
        min_enabled_ns: u64,
    ) {
        if enabled.is_none() || enabled != running {
            self.time_problems
                .push(format!("{name}: enabled {enabled:?}, running {running:?}"));
        } else if enabled < Some(&min_enabled_ns) {
            self.time_problems.push(format!(
                "{name}: enabled for {:?} ns of a run of at least {min_enabled_ns} ns",
                enabled.copied().unwrap_or(0)
            ));
        }
    }
}

/// Each watched event's final read against the truth that landed between
/// `before` (all open, no traffic yet) and `after` (all landed).
/// Every event was open for at least `min_enabled_ns`.
pub fn check_finals(
    watched: &[Watched],
    finals: &[Vec<u64>],
    before: &DeviceState,
    after: &DeviceState,
    unit: u64,
    min_enabled_ns: u64,
) -> Tally {
    let mut tally = Tally {
        unit,
        ..Tally::default()
    };
    let delta = |domain, rmid, event| {
        after
            .truth(domain, rmid, event)
            .wrapping_sub(before.truth(domain, rmid, event))
    };
    if finals.len() != watched.len() {
        tally.count_problems.push(format!(
            "{} final reads for {} events",
            finals.len(),
            watched.len()
        ));
    }
    for (w, v) in watched.iter().zip(finals) {
        match w.kind {
            WatchedKind::Single(key) => {
                tally.compare(
                    w.name.clone(),
                    v.first().copied().unwrap_or(0),
                    delta(key.domain, key.rmid, key.event),
                );
                tally.times(&w.name, v.get(1), v.get(2), min_enabled_ns);
            }
            WatchedKind::Group { domain, rmid } => {
                // nr, enabled, running, then the three values in open order.
                let [3, enabled, running, total, local, occupancy] = v[..] else {
                    tally
                        .count_problems
                        .push(format!("{}: read {v:?}, not a group of 3", w.name));
                    continue;
                };
                tally.compare(
                    format!("{} mbm_total_bytes", w.name),
                    total,
                    delta(domain, rmid, Event::MbmTotalBytes),
                );
                tally.compare(
                    format!("{} mbm_local_bytes", w.name),
                    local,
                    delta(domain, rmid, Event::MbmLocalBytes),
                );
                let held = after
                    .domains
                    .get(domain as usize)
                    .and_then(|d| d.occupancy.iter().find(|o| o.rmid == rmid))
                    .map_or(0, |o| o.bytes);
                let gauge = regs::whole_units(held, unit);
                if occupancy != gauge {
                    tally.count_problems.push(format!(
                        "{} llc_occupancy: read {occupancy}, the device holds {gauge}",
                        w.name
                    ));
                }
                tally.times(&w.name, Some(&enabled), Some(&running), min_enabled_ns);
            }
        }
    }
    tally
}

/// The first problems of a long list, and how many more.
pub fn cap(mut problems: Vec<String>) -> Vec<String> {
    const SHOWN: usize = 8;
    if problems.len() > SHOWN {
        let more = problems.len() - SHOWN;
        problems.truncate(SHOWN);
        problems.push(format!("and {more} more"));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stress::{RMIDS, SLOTS};
    use perfbed_device::DeviceConfig;

    #[test]
    fn final_counts_must_equal_the_truth_exactly() {
        use perfbed_device::Device;
        let config = DeviceConfig {
            slots: SLOTS,
            rmids: RMIDS,
            ..DeviceConfig::default()
        };
        let mut dev = Device::new(config).unwrap();
        let before = dev.state(0);
        dev.inject(0, 1, 1, Event::MbmTotalBytes, 64 * 1000)
            .unwrap();
        dev.inject(0, 1, 2, Event::MbmTotalBytes, 64 * 7).unwrap();
        dev.inject(0, 1, 2, Event::MbmLocalBytes, 64 * 3).unwrap();
        dev.set_occupancy(1, 2, 64 * 5).unwrap();
        let after = dev.state(1_000_000_000);
        let watched = vec![
            Watched {
                name: "single".into(),
                handle: 1,
                kind: WatchedKind::Single(Key {
                    domain: 1,
                    rmid: 1,
                    event: Event::MbmTotalBytes,
                }),
            },
            Watched {
                name: "group".into(),
                handle: 2,
                kind: WatchedKind::Group { domain: 1, rmid: 2 },
            },
        ];
        let good = vec![vec![64_000, 10, 10], vec![3, 10, 10, 448, 192, 320]];
        let t = check_finals(&watched, &good, &before, &after, 64, 10);
        assert_eq!((t.compared, t.lost), (3, 0));
        assert!(
            t.count_problems.is_empty() && t.time_problems.is_empty(),
            "{:?} {:?}",
            t.count_problems,
            t.time_problems
        );

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
}
