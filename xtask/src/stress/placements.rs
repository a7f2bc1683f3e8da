//! Moves, parks and unparks, as seen in the PMUs' `cpumask` files before
//! and after each hotplug operation (an empty mask is a parked PMU).

use perfbed_agent::HotplugBatchResult;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Placements {
    pub moves: u64,
    pub parks: u64,
    pub unparks: u64,
    /// Allowed-set changes the host made, and how many of them moved,
    /// parked or placed the PMU (also in `moves`, `parks`, `unparks`).
    pub allowed_changes: u64,
    pub replaced_by_allowed: u64,
    /// Masks that were neither empty nor one CPU, or unreadable.
    pub odd: Vec<String>,
}

impl Placements {
    /// Counts the transitions between consecutive looks at one PMU.
    fn transition(&mut self, pmu: usize, from: &str, to: &str) {
        let one_cpu = |m: &str| m.is_empty() || m.parse::<u32>().is_ok();
        if !one_cpu(to) && self.odd.len() < 10 {
            self.odd.push(format!("PMU {pmu}: cpumask {to:?}"));
        }
        match (from.is_empty(), to.is_empty()) {
            (false, true) => self.parks += 1,
            (true, false) => self.unparks += 1,
            (false, false) if from != to => self.moves += 1,
            _ => {}
        }
    }

    /// Adds the looks before and after an allowed-set change of PMU `pmu`.
    pub fn allowed_change(&mut self, pmu: usize, from: &str, to: &str) {
        self.allowed_changes += 1;
        if from != to {
            self.replaced_by_allowed += 1;
        }
        self.transition(pmu, from, to);
    }

    /// Adds one batch's looks, in the order they were taken.
    pub fn add(&mut self, batch: &HotplugBatchResult) {
        let mut last = batch.masks_before.clone();
        for op in &batch.ops {
            for looked in [&op.between, &op.masks] {
                if looked.is_empty() {
                    continue;
                }
                for (pmu, (from, to)) in last.iter().zip(looked.iter()).enumerate() {
                    self.transition(pmu, from, to);
                }
                last = looked.clone();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use perfbed_agent::HotplugOpResult;

    fn op(between: &[&str], masks: &[&str]) -> HotplugOpResult {
        HotplugOpResult {
            us: 1,
            writes: 1,
            error: None,
            masks: masks.iter().map(|s| s.to_string()).collect(),
            between: between.iter().map(|s| s.to_string()).collect(),
            online: String::new(),
            reads: vec![],
            injected: None,
        }
    }

    #[test]
    fn moves_parks_and_unparks_are_counted_per_pmu() {
        let batch = HotplugBatchResult {
            masks_before: vec!["1".into(), "2".into()],
            ops: vec![
                op(&[], &["1", "3"]),         // PMU 1 moves
                op(&["0", "3"], &["0", "3"]), // a flap: PMU 0 moves between
                op(&[], &["0", ""]),          // PMU 1 parks
                op(&[], &["0", "2"]),         // and comes back
                op(&[], &["0", "2"]),         // nothing
            ],
        };
        let mut p = Placements::default();
        p.add(&batch);
        assert_eq!((p.moves, p.parks, p.unparks), (2, 1, 1));
        assert!(p.odd.is_empty());
        let mut bad = Placements::default();
        bad.add(&HotplugBatchResult {
            masks_before: vec!["1".into()],
            ops: vec![op(&[], &["1-2"])],
        });
        assert_eq!(bad.odd.len(), 1);
    }
}
