//! One monitoring domain: its placement rule (allowed CPUs and owner), its
//! counter slots, the ground truth of everything that landed in it, and its
//! placement statistics.

use std::collections::BTreeMap;

use super::events::cumulative_index;
use super::interrupt::{DomainIrq, SlotIrq};
use super::traffic::Traffic;
use crate::cpus::CpuSet;
use crate::regs::{self, Event};

/// What a counter slot counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Assignment {
    pub(super) event: Event,
    pub(super) rmid: u32,
}

/// A hardware counter slot.
#[derive(Debug, Clone, Default)]
pub(super) struct Slot {
    /// The `SLOT_CTL` value.
    pub(super) ctl: u64,
    pub(super) assigned: Option<Assignment>,
    /// Bytes counted since assignment (mod 2^64); the register shows them
    /// in units, masked to the counter width.
    pub(super) counted: u64,
    /// `counted` in units at the previous correctly placed read of the
    /// slot's counter (0 at assignment): a later read more than one wrap
    /// ahead of it reports `COUNTER_OVERFLOW`.
    pub(super) units_at_read: u64,
    /// The assignment's number and the device time it began (see
    /// `assignments`); meaningless while free.
    pub(super) seq: u64,
    pub(super) assigned_ns: u64,
    /// The slot's part in the overflow interrupt.
    pub(super) irq: SlotIrq,
}

impl Slot {
    /// Whether the slot is frozen (`SLOT_CTL_FROZEN`): nothing lands in it.
    pub(super) fn is_frozen(&self) -> bool {
        self.ctl & regs::SLOT_CTL_FROZEN != 0
    }
}

#[derive(Debug, Clone)]
pub(super) struct Domain {
    /// What `DOM_ALLOWED_CPUS` reads: the set the host gave last.
    pub(super) allowed: CpuSet,
    /// The set the placement rule checks reads against: the set of the
    /// generation the driver acknowledged last (`DOM_ALLOWED_ACK`), so that
    /// a driver is never caught out by a change it has not placed by yet,
    /// however many came meanwhile.
    pub(super) enforced: CpuSet,
    /// `DOM_ALLOWED_GEN`: the generation of `allowed`.
    pub(super) allowed_gen: u64,
    /// `DOM_ALLOWED_ACK`: the generation of `enforced`.
    pub(super) acked_gen: u64,
    /// The sets of the generations before `allowed_gen`, newest last, at
    /// most `ALLOWED_HISTORY` of them.
    pub(super) history: std::collections::VecDeque<CpuSet>,
    /// The `OWNER` register.
    pub(super) owner: u64,
    pub(super) slots: Vec<Slot>,
    /// Per RMID, per cumulative event (total, local).
    pub(super) truth: Vec<[u64; 2]>,
    pub(super) occupancy: Vec<u64>,
    pub(super) traffic: Traffic,
    pub(super) violations: u64,
    pub(super) violations_by_vcpu: BTreeMap<u32, u64>,
    pub(super) reads_by_vcpu: BTreeMap<u32, u64>,
    /// The interrupt line and its status registers.
    pub(super) irq: DomainIrq,
}

impl Domain {
    pub(super) fn new(allowed: CpuSet, slots: usize, rmids: usize) -> Domain {
        Domain {
            allowed,
            enforced: allowed,
            allowed_gen: 0,
            acked_gen: 0,
            history: std::collections::VecDeque::new(),
            owner: regs::NO_OWNER,
            slots: vec![Slot::default(); slots],
            truth: vec![[0; 2]; rmids],
            occupancy: vec![0; rmids],
            traffic: Traffic::default(),
            violations: 0,
            violations_by_vcpu: BTreeMap::new(),
            reads_by_vcpu: BTreeMap::new(),
            irq: DomainIrq::default(),
        }
    }

    /// Lets `dt` ns of traffic land into the truth and the slots.
    pub(super) fn advance(&mut self, dt: u64, max_rate: u64) {
        let Domain {
            traffic,
            truth,
            slots,
            ..
        } = self;
        traffic.advance(dt, max_rate, |rmid, event, bytes| {
            land(truth, slots, rmid, event, bytes)
        });
    }

    /// The host's change of the allowed set to `set`: a new generation.
    pub(super) fn change_allowed(&mut self, set: CpuSet) {
        self.history
            .push_back(std::mem::replace(&mut self.allowed, set));
        if self.history.len() as u64 > regs::ALLOWED_HISTORY {
            self.history.pop_front();
        }
        self.allowed_gen = self.allowed_gen.wrapping_add(1);
    }

    /// A write of `gen` to `DOM_ALLOWED_ACK`: the placement rule takes that
    /// generation's set from now on. Returns false (and changes nothing) for
    /// a generation not current and not in the history.
    pub(super) fn acknowledge_allowed(&mut self, gen: u64) -> bool {
        let Some(back) = self.allowed_gen.checked_sub(gen) else {
            return false;
        };
        let set = if back == 0 {
            self.allowed
        } else {
            let Some(i) = (self.history.len() as u64).checked_sub(back) else {
                return false;
            };
            self.history[i as usize]
        };
        self.enforced = set;
        self.acked_gen = gen;
        true
    }

    /// Counts a counter read by `vcpu`; returns whether it broke the
    /// placement rule (outside the enforced allowed set, or not the owner).
    pub(super) fn placement_check(&mut self, vcpu: u32) -> bool {
        let reads = self.reads_by_vcpu.entry(vcpu).or_insert(0);
        *reads = reads.wrapping_add(1);
        !self.placement_ok(vcpu)
    }

    /// Checks a read of counter data that is not a counter (the interrupt
    /// status) by `vcpu`: counts a violation if it broke the placement rule
    /// and returns whether it did.
    pub(super) fn placement_ok(&mut self, vcpu: u32) -> bool {
        let ok = self.enforced.contains(vcpu) && self.owner == u64::from(vcpu);
        if !ok {
            self.violations = self.violations.wrapping_add(1);
            let v = self.violations_by_vcpu.entry(vcpu).or_insert(0);
            *v = v.wrapping_add(1);
        }
        ok
    }
}

/// Lands `bytes` of (rmid, event): into the truth and every matching slot.
fn land(truth: &mut [[u64; 2]], slots: &mut [Slot], rmid: u32, event: Event, bytes: u64) {
    if bytes == 0 {
        return;
    }
    let Some(idx) = cumulative_index(event) else {
        return;
    };
    if let Some(t) = truth.get_mut(rmid as usize).and_then(|t| t.get_mut(idx)) {
        *t = t.wrapping_add(bytes);
    }
    let want = Assignment { event, rmid };
    for slot in slots
        .iter_mut()
        .filter(|s| s.assigned == Some(want) && !s.is_frozen())
    {
        slot.counted = slot.counted.wrapping_add(bytes);
    }
}
