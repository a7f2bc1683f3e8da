//! The device register interface under any sequence of guest accesses,
//! host requests and time steps, with the device's invariants checked after
//! every step against a small independent model:
//!
//! - the ground truth never decreases (injections are small, so nothing
//!   wraps), and without steady rates it plus what is pending is exactly
//!   what was injected;
//! - every counter read from outside the domain's allowed set, or from a
//!   vCPU other than its owner, returns the error bit and is counted (in
//!   total, per vCPU), and no other access changes the counts;
//! - a correct counter read returns the slot's register as the state shows
//!   it, and a slot's state is consistent (its control word, event, RMID,
//!   count and register agree, and while nobody writes it counts exactly
//!   what lands for its event and RMID);
//! - time never goes backwards.
//!
//! Panics are failures (libFuzzer reports them); allocation is bounded by
//! libFuzzer's `-malloc_limit_mb`.

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use perfbed_device::regs::{self, Event};
use perfbed_device::{Device, DeviceConfig, DeviceState};

/// The device's shape, kept small so that accesses hit real registers.
#[derive(Arbitrary, Debug)]
pub struct Shape {
    /// Per domain, its allowed CPUs as a mask over CPUs 0..8.
    domains: Vec<u8>,
    rmids: u8,
    slots: u8,
    width: u8,
    unit_shift: u8,
    max_rate: u32,
}

/// A register access's size: the valid ones most of the time.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Size {
    Eight,
    Four,
    Any(u32),
}

impl Size {
    fn bytes(self) -> u32 {
        match self {
            Size::Eight => 8,
            Size::Four => 4,
            Size::Any(n) => n,
        }
    }
}

/// One step: a guest access, a host request or time passing.
#[derive(Arbitrary, Debug)]
pub enum Op {
    /// A read anywhere near the register block.
    Read { vcpu: u8, offset: u16, size: Size },
    /// A read at any offset at all.
    ReadFar { vcpu: u32, offset: u64, size: Size },
    /// A write anywhere near the register block.
    Write { vcpu: u8, offset: u16, size: Size, value: u64 },
    /// A read of a counter (slot count or occupancy), either half.
    ReadCounter { vcpu: u8, domain: u8, index: u8, occupancy: bool, half: Option<bool> },
    /// A write of a domain's owner.
    SetOwner { vcpu: u8, domain: u8, owner: u8 },
    /// A slot assignment (a valid control word most of the time).
    Assign { vcpu: u8, domain: u8, slot: u8, event: u8, rmid: u8 },
    Inject { domain: u8, rmid: u8, event: u8, bytes: u16 },
    SetRate { domain: u8, rmid: u8, event: u8, bytes_per_sec: u32 },
    SetOccupancy { domain: u8, rmid: u8, bytes: u64 },
    ResetStats,
    WaitLanded,
    Step { ns: u32 },
    /// A host clock that goes backwards: the device must ignore it.
    Rewind { ns: u32 },
}

/// The input: a shape and the steps.
#[derive(Arbitrary, Debug)]
pub struct Input {
    pub shape: Shape,
    pub ops: Vec<Op>,
}

impl Shape {
    fn config(&self) -> DeviceConfig {
        let mut domains: Vec<Vec<u32>> = self
            .domains
            .iter()
            .take(4)
            .map(|&mask| (0..8).filter(|c| mask & (1 << c) != 0).collect())
            .collect();
        if domains.is_empty() {
            domains.push(vec![0, 1]);
        }
        DeviceConfig {
            domains,
            rmids: u32::from(self.rmids % 12),
            slots: u32::from(self.slots % 6),
            counter_width: u32::from(self.width % 64),
            unit_bytes: 1u64 << (self.unit_shift % 8),
            // Up to ~4 GB/s: a step of at most ~4 s lands ~2^34 bytes, so no
            // truth wraps within any input libFuzzer builds.
            max_rate: u64::from(self.max_rate),
            trace_capacity: perfbed_device::TRACE_CAPACITY,
        }
    }
}

fn event(n: u8) -> Event {
    match n % 3 {
        0 => Event::LlcOccupancy,
        1 => Event::MbmTotalBytes,
        _ => Event::MbmLocalBytes,
    }
}

/// What the model remembers between steps.
struct Model {
    config: DeviceConfig,
    now: u64,
    state: DeviceState,
    /// Per (domain, slot): the truth of its (rmid, event) minus its count,
    /// i.e. the truth when it was assigned; `None` after a write.
    slot_base: BTreeMap<(usize, usize), Option<u64>>,
    /// Per domain: bytes injected and accepted, and whether a steady rate
    /// was ever set (then truth + pending need not equal the injections).
    injected: Vec<u64>,
    rates_set: Vec<bool>,
}

/// Runs one input. Panics (with the step) on a broken invariant.
pub fn run(input: &Input) {
    let config = input.shape.config();
    let Ok(mut device) = Device::new(config.clone()) else {
        return;
    };
    let state = device.state(0);
    let domains = config.domains.len();
    let mut model = Model {
        config,
        now: 0,
        state,
        slot_base: BTreeMap::new(),
        injected: vec![0; domains],
        rates_set: vec![false; domains],
    };
    model.rebase();
    for (step, op) in input.ops.iter().enumerate() {
        model.step(&mut device, step, op);
    }
}

impl Model {
    fn size(&self) -> u64 {
        self.config.size()
    }

    fn slots(&self) -> u64 {
        u64::from(self.config.slots)
    }

    fn rmids(&self) -> u64 {
        u64::from(self.config.rmids)
    }

    /// The domain whose counter register sits at 8-byte aligned `off`.
    fn counter_domain(&self, off: u64) -> Option<usize> {
        (0..self.config.domains.len() as u64).find_map(|d| {
            let slot = (0..self.slots()).any(|s| regs::slot_count(d, s) == off);
            let occ = (0..self.rmids()).any(|r| regs::occupancy(d, r) == off);
            (slot || occ).then_some(d as usize)
        })
    }

    /// The 8-byte aligned register and the half an access covers, if it is
    /// a well-formed access (the device decides whether a register is there).
    fn aligned(offset: u64, size: u32) -> Option<(u64, Option<bool>)> {
        match (size, offset & 7) {
            (8, 0) => Some((offset, None)),
            (4, 0) => Some((offset, Some(false))),
            (4, 4) => Some((offset - 4, Some(true))),
            _ => None,
        }
    }

    fn rebase(&mut self) {
        self.slot_base.clear();
        for (d, dom) in self.state.domains.iter().enumerate() {
            for (s, slot) in dom.slots.iter().enumerate() {
                let base = match (slot.event, slot.rmid) {
                    (Some(e), Some(r)) => Some(self.state.truth(d as u32, r, e).wrapping_sub(slot.counted_bytes)),
                    _ => None,
                };
                self.slot_base.insert((d, s), base);
            }
        }
    }

    fn step(&mut self, device: &mut Device, step: usize, op: &Op) {
        let size = self.size();
        let near = |offset: u16| u64::from(offset) % (size + 0x100);
        let domains = self.config.domains.len() as u64;
        let mut read: Option<(u32, u64, u32, u64)> = None;
        let mut wrote = false;
        let mut reset = false;
        match *op {
            Op::Read { vcpu, offset, size } => {
                let offset = near(offset);
                let v = device.read(self.now, u32::from(vcpu), offset, size.bytes());
                read = Some((u32::from(vcpu), offset, size.bytes(), v));
            }
            Op::ReadFar { vcpu, offset, size } => {
                let v = device.read(self.now, vcpu, offset, size.bytes());
                read = Some((vcpu, offset, size.bytes(), v));
            }
            Op::Write { vcpu, offset, size, value } => {
                device.write(self.now, u32::from(vcpu), near(offset), size.bytes(), value);
                wrote = true;
            }
            Op::ReadCounter { vcpu, domain, index, occupancy, half } => {
                let d = u64::from(domain) % domains;
                let base = if occupancy {
                    regs::occupancy(d, u64::from(index) % self.rmids().max(1))
                } else {
                    regs::slot_count(d, u64::from(index) % self.slots().max(1))
                };
                let (offset, size) = match half {
                    None => (base, 8),
                    Some(false) => (base, 4),
                    Some(true) => (base + 4, 4),
                };
                let v = device.read(self.now, u32::from(vcpu), offset, size);
                read = Some((u32::from(vcpu), offset, size, v));
            }
            Op::SetOwner { vcpu, domain, owner } => {
                let d = u64::from(domain) % domains;
                let owner = if owner == u8::MAX { regs::NO_OWNER } else { u64::from(owner % 10) };
                device.write(self.now, u32::from(vcpu), regs::domain_reg(d, regs::DOM_OWNER), 8, owner);
                wrote = true;
            }
            Op::Assign { vcpu, domain, slot, event: e, rmid } => {
                let d = u64::from(domain) % domains;
                let s = u64::from(slot) % self.slots().max(1);
                let value = if e == u8::MAX { 0 } else { regs::slot_ctl_value(event(e), u64::from(rmid % 14)) };
                device.write(self.now, u32::from(vcpu), regs::slot_ctl(d, s), 8, value);
                wrote = true;
            }
            Op::Inject { domain, rmid, event: e, bytes } => {
                let d = u32::from(domain % 5);
                if device.inject(self.now, d, u32::from(rmid % 14), event(e), u64::from(bytes)).is_ok() {
                    let total = &mut self.injected[d as usize];
                    *total = total.checked_add(u64::from(bytes)).expect("small injections cannot overflow");
                }
            }
            Op::SetRate { domain, rmid, event: e, bytes_per_sec } => {
                let d = u32::from(domain % 5);
                if device.set_rate(self.now, d, u32::from(rmid % 14), event(e), u64::from(bytes_per_sec)).is_ok() {
                    self.rates_set[d as usize] = true;
                }
            }
            Op::SetOccupancy { domain, rmid, bytes } => {
                let _ = device.set_occupancy(u32::from(domain % 5), u32::from(rmid % 14), bytes);
            }
            Op::ResetStats => {
                device.reset_stats();
                reset = true;
            }
            Op::WaitLanded => {
                let _ = device.pending_bytes(self.now);
            }
            Op::Step { ns } => self.now += u64::from(ns),
            Op::Rewind { ns } => {
                let _ = device.pending_bytes(self.now.saturating_sub(u64::from(ns)));
            }
        }
        let before = std::mem::replace(&mut self.state, device.state(self.now));
        if wrote {
            // A write may have (re)assigned a slot, restarting its count.
            self.rebase();
        }
        self.check(step, op, &before, read, reset);
    }

    fn check(&self, step: usize, op: &Op, before: &DeviceState, read: Option<(u32, u64, u32, u64)>, reset: bool) {
        let after = &self.state;
        let at = || format!("step {step} ({op:?})");
        assert_eq!(after.now_ns, self.now, "{}: device time is not the latest time given", at());
        for (d, (b, a)) in before.domains.iter().zip(&after.domains).enumerate() {
            // The truth never decreases, and without rates adds up.
            for t in &b.truth {
                let now = after.truth(d as u32, t.rmid, t.event);
                assert!(now >= t.bytes, "{}: truth of domain {d} rmid {} {} fell from {} to {now}", at(), t.rmid, t.event, t.bytes);
            }
            if !self.rates_set[d] {
                let landed = a.truth.iter().fold(0u64, |acc, t| acc + t.bytes);
                assert_eq!(landed + a.pending_bytes, self.injected[d], "{}: domain {d}: truth + pending != injected", at());
            }
            // Slots: control word, assignment, count and register agree.
            for slot in &a.slots {
                let s = slot.slot as usize;
                if slot.ctl == 0 {
                    assert!(slot.event.is_none() && slot.rmid.is_none(), "{}: slot {d}/{s} free but assigned", at());
                    assert_eq!(slot.register, regs::COUNTER_UNAVAILABLE, "{}: free slot {d}/{s} register", at());
                    continue;
                }
                assert!(slot.ctl & regs::SLOT_CTL_ASSIGNED != 0, "{}: slot {d}/{s} ctl {:#x}", at(), slot.ctl);
                let (Some(e), Some(r)) = (slot.event, slot.rmid) else {
                    panic!("{}: slot {d}/{s} has ctl {:#x} but no assignment", at(), slot.ctl);
                };
                assert_eq!(Some(e), Event::from_u64(regs::slot_ctl_event(slot.ctl)), "{}: slot {d}/{s} event", at());
                assert_eq!(u64::from(r), regs::slot_ctl_rmid(slot.ctl), "{}: slot {d}/{s} rmid", at());
                assert!(e.is_cumulative() && u64::from(r) < self.rmids(), "{}: slot {d}/{s} holds {e} rmid {r}", at());
                let mask = regs::counter_mask(u64::from(self.config.counter_width));
                assert_eq!(slot.register, (slot.counted_bytes / self.config.unit_bytes) & mask, "{}: slot {d}/{s} register", at());
                if let Some(Some(base)) = self.slot_base.get(&(d, s)) {
                    let truth = after.truth(d as u32, r, e);
                    assert_eq!(slot.counted_bytes, truth.wrapping_sub(*base), "{}: slot {d}/{s} counted other than the truth", at());
                }
            }
            assert_eq!(a.allowed_cpus, self.config.domains[d], "{}: domain {d}'s allowed set changed", at());
        }
        if reset {
            for a in &after.domains {
                assert!(a.violations == 0 && a.violations_by_vcpu.is_empty() && a.counter_reads_by_vcpu.is_empty());
            }
            // The trace keeps one record: the reset itself.
            assert!(after.trace_len <= 1, "{}: trace of {} records after a reset", at(), after.trace_len);
            return;
        }
        // Placement: only a counter read changes the counts, by one.
        let counter = read.and_then(|(vcpu, offset, size, value)| {
            let (off, half) = Self::aligned(offset, size)?;
            let d = self.counter_domain(off)?;
            Some((vcpu, d, half, value))
        });
        // The interrupt status is counter data too: placement-checked (a
        // violation returns exactly COUNTER_ERROR), but not a counter read.
        let status = read.and_then(|(vcpu, offset, size, value)| {
            let (off, half) = Self::aligned(offset, size)?;
            let d = (0..self.config.domains.len()).find(|&d| regs::domain_reg(d as u64, regs::DOM_IRQ_STATUS) == off)?;
            Some((vcpu, d, half, value))
        });
        if let Some((vcpu, d, half, value)) = status {
            let (b, a) = (&before.domains[d], &after.domains[d]);
            let violation = !(b.allowed_cpus.contains(&vcpu) && b.owner == Some(vcpu));
            let count = |m: &BTreeMap<u32, u64>| m.get(&vcpu).copied().unwrap_or(0);
            assert_eq!(a.violations, b.violations + u64::from(violation), "{}: domain {d} status read violations", at());
            assert_eq!(count(&a.violations_by_vcpu), count(&b.violations_by_vcpu) + u64::from(violation), "{}: status read", at());
            assert_eq!(a.counter_reads_by_vcpu, b.counter_reads_by_vcpu, "{}: a status read is not a counter read", at());
            if violation {
                let want = match half {
                    None => regs::COUNTER_ERROR,
                    Some(false) => 0,
                    Some(true) => regs::COUNTER_ERROR >> 32,
                };
                assert_eq!(value, want, "{}: domain {d} status read off the owner", at());
            }
        }
        for (d, (b, a)) in before.domains.iter().zip(&after.domains).enumerate() {
            if status.is_some_and(|(_, sd, _, _)| sd == d) {
                continue;
            }
            let (vcpu, violation, value, half) = match counter {
                Some((vcpu, cd, half, value)) if cd == d => {
                    let ok = b.allowed_cpus.contains(&vcpu) && b.owner == Some(vcpu);
                    (Some(vcpu), !ok, value, half)
                }
                _ => (None, false, 0, None),
            };
            let count = |m: &BTreeMap<u32, u64>, v: u32| m.get(&v).copied().unwrap_or(0);
            assert_eq!(a.violations, b.violations + u64::from(violation), "{}: domain {d} violations", at());
            match vcpu {
                None => {
                    assert_eq!(a.violations_by_vcpu, b.violations_by_vcpu, "{}: domain {d}", at());
                    assert_eq!(a.counter_reads_by_vcpu, b.counter_reads_by_vcpu, "{}: domain {d}", at());
                }
                Some(v) => {
                    assert_eq!(count(&a.counter_reads_by_vcpu, v), count(&b.counter_reads_by_vcpu, v) + 1, "{}: reads", at());
                    assert_eq!(
                        count(&a.violations_by_vcpu, v),
                        count(&b.violations_by_vcpu, v) + u64::from(violation),
                        "{}: violations of vCPU {v}",
                        at()
                    );
                    let full = if violation {
                        regs::COUNTER_ERROR
                    } else {
                        match read.map(|(_, o, s, _)| Self::aligned(o, s)) {
                            Some(Some((off, _))) => self.correct_value(d, off),
                            _ => unreachable!("a counter read is well formed"),
                        }
                    };
                    let want = match half {
                        None => full,
                        Some(false) => full & 0xffff_ffff,
                        Some(true) => full >> 32,
                    };
                    // A correctly placed slot read may carry COUNTER_OVERFLOW
                    // beside the count, and only once a whole wrap has landed
                    // since the slot's assignment.
                    let flag = match half {
                        None => regs::COUNTER_OVERFLOW,
                        Some(false) => 0,
                        Some(true) => regs::COUNTER_OVERFLOW >> 32,
                    };
                    let flagged = !violation && value & flag != 0;
                    if flagged {
                        let wrapped = read
                            .and_then(|(_, o, s, _)| Self::aligned(o, s))
                            .and_then(|(off, _)| (0..self.slots()).find(|&s| regs::slot_count(d as u64, s) == off))
                            .map(|s| &a.slots[s as usize])
                            .is_some_and(|slot| slot.counted_bytes / self.config.unit_bytes > regs::counter_mask(u64::from(self.config.counter_width)));
                        assert!(wrapped, "{}: domain {d}: COUNTER_OVERFLOW on a slot that never wrapped", at());
                    }
                    assert_eq!(value & !flag, want, "{}: domain {d} counter read (violation: {violation})", at());
                }
            }
        }
    }

    /// What a correctly placed read of the counter at `off` of domain `d`
    /// returns, from the state after the read.
    fn correct_value(&self, d: usize, off: u64) -> u64 {
        let dom = &self.state.domains[d];
        let d64 = d as u64;
        if let Some(s) = (0..self.slots()).find(|&s| regs::slot_count(d64, s) == off) {
            return dom.slots[s as usize].register;
        }
        let r = (0..self.rmids()).find(|&r| regs::occupancy(d64, r) == off).expect("a counter register") as u32;
        let bytes = dom.occupancy.iter().find(|o| o.rmid == r).map_or(0, |o| o.bytes);
        let mask = regs::counter_mask(u64::from(self.config.counter_width));
        (bytes / self.config.unit_bytes).min(mask)
    }
}
