//! The device model: a pure, deterministic state machine.
//!
//! Hosts call [`Device::read`] and [`Device::write`] for every guest MMIO
//! access (with the accessing vCPU) and the traffic methods for host-side
//! input. Time is an input (`now_ns`, a monotonic clock chosen by the host);
//! a `now_ns` earlier than one already seen counts as no time passing. No
//! method panics on any input, and none blocks.
//!
//! - [`config`]: the device's shape and its limits;
//! - [`domain`]: one domain's placement rule, slots, truth and statistics;
//! - [`traffic`]: injections and steady rates landing over time;
//! - [`decode`]: offsets and sizes to registers;
//! - [`interrupt`]: a domain's interrupt line, its overflow and
//!   configuration status;
//! - [`trace`]: the trace ring (accesses, owner changes, host actions) and
//!   bad-access counts; [`print`]: the trace as text lines;
//! - [`state`]: the snapshot the control socket reports;
//! - [`assignments`]: slot-level truth, every slot assignment and what it counted;
//! - [`events`], [`errors`]: event names on the wire, refused host requests.

mod assignments;
mod config;
mod decode;
mod domain;
mod errors;
mod events;
mod interrupt;
mod print;
mod state;
mod trace;
mod traffic;

use crate::cpus::{format_cpu_list, CpuSet};
use crate::regs::{self, Event};

use assignments::AssignmentLog;
pub use assignments::{AssignmentRecord, Assignments, ASSIGNMENT_LOG_CAPACITY};
pub use config::{ConfigError, DeviceConfig, MAX_RATE_LIMIT};
use decode::{Part, Reg};
use domain::{Assignment, Domain, Slot};
pub use errors::DeviceError;
use events::CUMULATIVE;
pub use events::{event_name, parse_event};
pub use print::{dropped_line, format_record, trace_file, TraceSnapshot, TRACE_MAGIC};
pub use state::{
    DeviceState, DomainState, IrqState, OccupancyEntry, RateEntry, SlotState, TruthEntry,
};
pub use trace::{
    AccessKind, BadAccessCounts, BadAccessKind, TraceEntry, TraceEvent, TraceRecord, TraceRing,
    MAX_TRACE_CAPACITY, TRACE_CAPACITY,
};
pub use traffic::MAX_QUEUED;

/// What a register write changed.
enum WriteEffect {
    /// The domain's `OWNER`, from and to.
    Owner { domain: u32, from: u64, to: u64 },
    /// A `SLOT_CTL` was written (assigned, reassigned or released); `old`
    /// is the slot as it was.
    SlotCtl {
        domain: usize,
        slot: usize,
        old: Slot,
    },
    /// An interrupt register was written (the line settles after it).
    Irq,
    /// An assigned `SLOT_CTL` was frozen or thawed (`SLOT_CTL_FROZEN`).
    Freeze,
}

/// The virtual monitoring device.
#[derive(Debug, Clone)]
pub struct Device {
    config: DeviceConfig,
    size: u64,
    now_ns: u64,
    domains: Vec<Domain>,
    bad: BadAccessCounts,
    trace: TraceRing,
    assignments: AssignmentLog,
    /// Bit `d`: domain `d`'s line changed level since the host last asked
    /// ([`Device::take_line_changes`]).
    line_changes: u64,
}

impl Device {
    /// A device at time 0 with empty counters and no owners.
    pub fn new(config: DeviceConfig) -> Result<Device, ConfigError> {
        config.validate()?;
        let rmids = config.rmids as usize;
        let domains = config
            .domains
            .iter()
            .map(|cpus| {
                Domain::new(
                    CpuSet::from_cpus(cpus).unwrap_or_default(),
                    config.slots as usize,
                    rmids,
                )
            })
            .collect();
        Ok(Device {
            trace: TraceRing::new(config.trace_capacity),
            size: config.size(),
            config,
            now_ns: 0,
            domains,
            bad: BadAccessCounts::default(),
            assignments: AssignmentLog::default(),
            line_changes: 0,
        })
    }

    /// Size of the register region in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The configuration.
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// The latest time seen.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// Moves time to `now_ns` (never backwards), landing traffic.
    fn advance(&mut self, now_ns: u64) {
        if now_ns <= self.now_ns {
            return;
        }
        let dt = now_ns - self.now_ns;
        self.now_ns = now_ns;
        let max_rate = self.config.max_rate;
        let unit = self.config.unit_bytes;
        let wrap = self.mask().wrapping_add(1);
        for d in &mut self.domains {
            d.advance(dt, max_rate);
            let slots = d
                .slots
                .iter_mut()
                .enumerate()
                .filter(|(_, s)| s.assigned.is_some());
            let slots =
                slots.map(|(i, s)| (i, s.counted / unit.max(1), s.units_at_read, &mut s.irq));
            d.irq.check_slots(slots, wrap);
        }
        self.settle_lines();
    }

    /// Lets time pass to `now_ns` (landing traffic, raising interrupts):
    /// what a host's ticker calls while an interrupt is enabled, since
    /// traffic lands with no guest access to notice it.
    pub fn tick(&mut self, now_ns: u64) {
        self.advance(now_ns);
    }

    /// Brings every line to the level its registers give, recording each
    /// change (and counting rising edges).
    fn settle_lines(&mut self) {
        let mut changes = Vec::new();
        for (i, d) in self.domains.iter_mut().enumerate() {
            let level = d.irq.level();
            if level != d.irq.line {
                d.irq.line = level;
                if level {
                    d.irq.raised = d.irq.raised.wrapping_add(1);
                }
                self.line_changes |= 1 << i;
                changes.push(TraceEvent::Line {
                    domain: i as u32,
                    level,
                    status: d.irq.status,
                    config_status: d.irq.config_status,
                });
            }
        }
        for event in changes {
            self.record(event);
        }
    }

    /// The domains whose line changed level since the last call, as a
    /// bitmask (bit `d` for domain `d`), cleared by the call.
    pub fn take_line_changes(&mut self) -> u64 {
        std::mem::take(&mut self.line_changes)
    }

    /// The level of domain `domain`'s line (false for no such domain).
    pub fn line_level(&self, domain: u32) -> bool {
        self.domains
            .get(domain as usize)
            .is_some_and(|d| d.irq.line)
    }

    /// Whether any domain has an interrupt enabled, so that time passing
    /// can change a line (a host's ticker sleeps otherwise).
    pub fn interrupts_enabled(&self) -> bool {
        self.domains
            .iter()
            .any(|d| d.irq.ctl & regs::IRQ_CTL_OVERFLOW != 0)
    }

    /// The host changes domain `domain`'s allowed CPUs to `cpus` (which may
    /// be empty): `DOM_ALLOWED_CPUS` reads the new set at once, the owner
    /// is left as it is (placing the domain again is the driver's job),
    /// `DOM_ALLOWED_GEN` goes one up and `DOM_CONFIG_STATUS` raises
    /// `CONFIG_STATUS_ALLOWED`. The placement rule takes the new set once
    /// the driver writes its generation to `DOM_ALLOWED_ACK`.
    pub fn set_allowed(
        &mut self,
        now_ns: u64,
        domain: u32,
        cpus: &[u32],
    ) -> Result<(), DeviceError> {
        let domains = self.domains.len();
        let set = CpuSet::from_cpus(cpus).map_err(|cpu| DeviceError::NoSuchCpu {
            cpu,
            max: regs::MAX_CPUS as u32,
        })?;
        self.advance(now_ns);
        let dom = self
            .domains
            .get_mut(domain as usize)
            .ok_or(DeviceError::NoSuchDomain { domain, domains })?;
        let from = dom.allowed;
        dom.change_allowed(set);
        dom.irq.config_status |= regs::CONFIG_STATUS_ALLOWED;
        dom.irq.allowed_changes = dom.irq.allowed_changes.wrapping_add(1);
        self.record(TraceEvent::Allowed {
            domain,
            from: from.0,
            to: set.0,
        });
        self.settle_lines();
        Ok(())
    }

    /// Records `event` at the current time.
    fn record(&mut self, event: TraceEvent) {
        if let TraceEvent::Access {
            bad: Some(kind), ..
        } = event
        {
            self.bad.count(kind);
        }
        self.trace.push(TraceRecord {
            time_ns: self.now_ns,
            event,
        });
    }

    /// The register at 8-byte aligned offset `off`, if any.
    fn lookup(&self, off: u64) -> Option<Reg> {
        decode::lookup(
            off,
            self.domains.len(),
            self.config.slots,
            self.config.rmids,
        )
    }

    fn global_value(&self, off: u64) -> Option<u64> {
        let c = &self.config;
        Some(match off {
            regs::REG_MAGIC => regs::MAGIC_VALUE,
            regs::REG_VERSION => regs::VERSION_VALUE,
            regs::REG_NUM_DOMAINS => c.domains.len() as u64,
            regs::REG_NUM_RMIDS => u64::from(c.rmids),
            regs::REG_NUM_SLOTS => u64::from(c.slots),
            regs::REG_COUNTER_WIDTH => u64::from(c.counter_width),
            regs::REG_COUNTER_UNIT => c.unit_bytes,
            regs::REG_MAX_RATE => c.max_rate,
            regs::REG_DOMAIN_BASE => regs::DOMAIN_BASE,
            regs::REG_DOMAIN_STRIDE => regs::DOMAIN_STRIDE,
            regs::REG_SLOT_BASE => regs::DOM_SLOTS,
            regs::REG_SLOT_STRIDE => regs::SLOT_STRIDE,
            regs::REG_OCCUPANCY_BASE => regs::DOM_OCCUPANCY,
            regs::REG_DEVICE_SIZE => self.size,
            regs::REG_EVENTS => regs::EVENTS_MASK,
            _ => return None,
        })
    }

    fn mask(&self) -> u64 {
        regs::counter_mask(u64::from(self.config.counter_width))
    }

    /// Counter value of a slot as a correctly placed read sees it.
    fn slot_register(&self, slot: &Slot) -> u64 {
        match slot.assigned {
            None => regs::COUNTER_UNAVAILABLE,
            Some(_) => (slot.counted / self.config.unit_bytes.max(1)) & self.mask(),
        }
    }

    /// A correctly placed read of slot `s`'s counter in domain `d`: the
    /// register, with `COUNTER_OVERFLOW` if a whole wrap or more landed
    /// since the previous such read.
    fn read_slot_count(&mut self, d: usize, s: usize) -> u64 {
        let unit = self.config.unit_bytes.max(1);
        let wrap = self.mask().wrapping_add(1);
        let Some(slot) = self.domains.get_mut(d).and_then(|x| x.slots.get_mut(s)) else {
            return regs::COUNTER_UNAVAILABLE;
        };
        if slot.assigned.is_none() {
            return regs::COUNTER_UNAVAILABLE;
        }
        let units = slot.counted / unit;
        let overflowed = units.wrapping_sub(slot.units_at_read) >= wrap;
        slot.units_at_read = units;
        // The read re-arms the threshold interrupt.
        slot.irq.threshold_raised = false;
        let value = units & (wrap - 1);
        if overflowed {
            value | regs::COUNTER_OVERFLOW
        } else {
            value
        }
    }

    /// Occupancy register value: units, saturated to the counter width.
    fn occupancy_register(&self, bytes: u64) -> u64 {
        (bytes / self.config.unit_bytes.max(1)).min(self.mask())
    }

    /// Counts a counter read of domain `d` by `vcpu`; returns whether it broke
    /// the placement rule.
    fn placement_check(&mut self, d: usize, vcpu: u32) -> bool {
        self.domains
            .get_mut(d)
            .is_none_or(|dom| dom.placement_check(vcpu))
    }

    /// A guest read of `size` bytes at `offset` from `vcpu` at `now_ns`.
    /// Bad accesses return 0 and are counted.
    pub fn read(&mut self, now_ns: u64, vcpu: u32, offset: u64, size: u32) -> u64 {
        self.advance(now_ns);
        let mut violation = false;
        let result = decode::split(offset, size).and_then(|(off, part)| {
            let reg = self.lookup(off).ok_or(BadAccessKind::UnknownOffset)?;
            let full = match reg {
                Reg::Global(g) => self.global_value(g).ok_or(BadAccessKind::UnknownOffset)?,
                Reg::AllowedCpus(d) => self.domains.get(d).map_or(0, |x| x.allowed.0),
                Reg::Owner(d) => self.domains.get(d).map_or(0, |x| x.owner),
                Reg::SlotCtl(d, s) => self
                    .domains
                    .get(d)
                    .and_then(|x| x.slots.get(s))
                    .map_or(0, |x| x.ctl),
                Reg::SlotCount(d, s) => {
                    violation = self.placement_check(d, vcpu);
                    if violation {
                        regs::COUNTER_ERROR
                    } else {
                        self.read_slot_count(d, s)
                    }
                }
                Reg::IrqCtl(d) => self.domains.get(d).map_or(0, |x| x.irq.ctl),
                Reg::IrqThreshold(d) => self.domains.get(d).map_or(0, |x| x.irq.threshold),
                Reg::IrqStatus(d) => match self.domains.get_mut(d) {
                    Some(dom) => {
                        if dom.placement_ok(vcpu) {
                            dom.irq.read_status(vcpu)
                        } else {
                            violation = true;
                            regs::COUNTER_ERROR
                        }
                    }
                    None => 0,
                },
                Reg::ConfigStatus(d) => self
                    .domains
                    .get_mut(d)
                    .map_or(0, |x| std::mem::take(&mut x.irq.config_status)),
                Reg::AllowedGen(d) => self.domains.get(d).map_or(0, |x| x.allowed_gen),
                Reg::AllowedAck(d) => self.domains.get(d).map_or(0, |x| x.acked_gen),
                Reg::Occupancy(d, r) => {
                    violation = self.placement_check(d, vcpu);
                    if violation {
                        regs::COUNTER_ERROR
                    } else {
                        let bytes = self
                            .domains
                            .get(d)
                            .and_then(|x| x.occupancy.get(r))
                            .copied()
                            .unwrap_or(0);
                        self.occupancy_register(bytes)
                    }
                }
            };
            Ok(part.of(full))
        });
        let (value, bad) = match result {
            Ok(v) => (v, None),
            Err(kind) => (0, Some(kind)),
        };
        self.record(TraceEvent::Access {
            vcpu,
            offset,
            size,
            kind: AccessKind::Read,
            value,
            bad,
            violation,
        });
        self.settle_lines();
        value
    }

    /// A guest write of `value` (`size` bytes) at `offset` from `vcpu` at
    /// `now_ns`. Bad accesses are ignored and counted.
    pub fn write(&mut self, now_ns: u64, vcpu: u32, offset: u64, size: u32, value: u64) {
        self.advance(now_ns);
        let result = self.do_write(offset, size, value);
        let bad = result.as_ref().err().copied();
        self.record(TraceEvent::Access {
            vcpu,
            offset,
            size,
            kind: AccessKind::Write,
            value,
            bad,
            violation: false,
        });
        match result {
            Ok(WriteEffect::Owner { domain, from, to }) if from != to => {
                self.record(TraceEvent::Owner {
                    domain,
                    from,
                    to,
                    vcpu,
                });
            }
            Ok(WriteEffect::SlotCtl { domain, slot, old }) => self.slot_changed(domain, slot, old),
            _ => {}
        }
        self.settle_lines();
    }

    /// After a `SLOT_CTL` write: ends the slot's previous assignment, if it
    /// had one, and numbers the new one, if any.
    fn slot_changed(&mut self, domain: usize, slot: usize, old: Slot) {
        if let Some(a) = old.assigned {
            self.assignments.end(AssignmentRecord {
                seq: old.seq,
                domain: domain as u32,
                slot: slot as u32,
                event: a.event,
                rmid: a.rmid,
                assigned_ns: old.assigned_ns,
                released_ns: Some(self.now_ns),
                counted_bytes: old.counted,
            });
        }
        let now_ns = self.now_ns;
        let Some(s) = self
            .domains
            .get_mut(domain)
            .and_then(|d| d.slots.get_mut(slot))
        else {
            return;
        };
        if s.assigned.is_some() {
            s.seq = self.assignments.begin();
            s.assigned_ns = now_ns;
        }
    }

    /// Slot-level truth: the assignments numbered `since` and later, ended
    /// and ongoing, each with the bytes its slot counted (see
    /// [`assignments`]).
    pub fn assignments(&mut self, now_ns: u64, since: u64) -> Assignments {
        self.advance(now_ns);
        let ongoing = self.domains.iter().enumerate().flat_map(|(d, dom)| {
            dom.slots.iter().enumerate().filter_map(move |(s, slot)| {
                slot.assigned.map(|a| AssignmentRecord {
                    seq: slot.seq,
                    domain: d as u32,
                    slot: s as u32,
                    event: a.event,
                    rmid: a.rmid,
                    assigned_ns: slot.assigned_ns,
                    released_ns: None,
                    counted_bytes: slot.counted,
                })
            })
        });
        self.assignments.since(since, self.now_ns, ongoing)
    }

    /// Carries out a write and says what it changed.
    fn do_write(
        &mut self,
        offset: u64,
        size: u32,
        value: u64,
    ) -> Result<WriteEffect, BadAccessKind> {
        let (off, part) = decode::split(offset, size)?;
        let reg = self.lookup(off).ok_or(BadAccessKind::UnknownOffset)?;
        if let Reg::Global(g) = reg {
            // Reserved global offsets are unknown, defined ones read-only.
            self.global_value(g).ok_or(BadAccessKind::UnknownOffset)?;
        }
        let (d, slot) = match reg {
            Reg::Owner(d) => (d, None),
            Reg::SlotCtl(d, s) => (d, Some(s)),
            Reg::IrqCtl(_) | Reg::IrqThreshold(_) => return self.write_irq_reg(reg, part, value),
            Reg::AllowedAck(d) => {
                if part != Part::Full {
                    return Err(BadAccessKind::BadValue);
                }
                let dom = self
                    .domains
                    .get_mut(d)
                    .ok_or(BadAccessKind::UnknownOffset)?;
                return if dom.acknowledge_allowed(value) {
                    Ok(WriteEffect::Irq)
                } else {
                    Err(BadAccessKind::BadValue)
                };
            }
            _ => return Err(BadAccessKind::ReadOnly),
        };
        let value = match part {
            Part::Full => value,
            Part::Low => value & 0xffff_ffff,
            Part::High => return Err(BadAccessKind::HighHalfWrite),
        };
        let rmids = self.config.rmids;
        let dom = self
            .domains
            .get_mut(d)
            .ok_or(BadAccessKind::UnknownOffset)?;
        match slot {
            None => {
                if value != regs::NO_OWNER && value >= regs::MAX_CPUS {
                    return Err(BadAccessKind::BadValue);
                }
                let from = std::mem::replace(&mut dom.owner, value);
                Ok(WriteEffect::Owner {
                    domain: d as u32,
                    from,
                    to: value,
                })
            }
            Some(s) => {
                let slot = dom.slots.get_mut(s).ok_or(BadAccessKind::UnknownOffset)?;
                if slot.assigned.is_some() && slot.ctl ^ value == regs::SLOT_CTL_FROZEN {
                    // Frozen or thawed in place: the same assignment, its count kept.
                    slot.ctl = value;
                    return Ok(WriteEffect::Freeze);
                }
                if value == 0 {
                    let old = std::mem::take(slot);
                    return Ok(WriteEffect::SlotCtl {
                        domain: d,
                        slot: s,
                        old,
                    });
                }
                if value & regs::SLOT_CTL_ASSIGNED == 0 || value & regs::SLOT_CTL_RESERVED != 0 {
                    return Err(BadAccessKind::BadValue);
                }
                let event = Event::from_u64(regs::slot_ctl_event(value))
                    .filter(|e| e.is_cumulative())
                    .ok_or(BadAccessKind::BadValue)?;
                let rmid = regs::slot_ctl_rmid(value);
                if rmid >= u64::from(rmids) {
                    return Err(BadAccessKind::BadValue);
                }
                let new = Slot {
                    ctl: value,
                    assigned: Some(Assignment {
                        event,
                        rmid: rmid as u32,
                    }),
                    ..Slot::default()
                };
                let old = std::mem::replace(slot, new);
                Ok(WriteEffect::SlotCtl {
                    domain: d,
                    slot: s,
                    old,
                })
            }
        }
    }

    /// A write of `DOM_IRQ_CTL` or `DOM_IRQ_THRESHOLD`.
    fn write_irq_reg(
        &mut self,
        reg: Reg,
        part: Part,
        value: u64,
    ) -> Result<WriteEffect, BadAccessKind> {
        let value = match part {
            Part::Full => value,
            Part::Low => value & 0xffff_ffff,
            Part::High => return Err(BadAccessKind::HighHalfWrite),
        };
        let mask = self.mask();
        let ok = match reg {
            Reg::IrqCtl(d) => self
                .domains
                .get_mut(d)
                .is_some_and(|x| x.irq.write_ctl(value)),
            Reg::IrqThreshold(d) => self
                .domains
                .get_mut(d)
                .is_some_and(|x| x.irq.write_threshold(value, mask)),
            _ => false,
        };
        if ok {
            Ok(WriteEffect::Irq)
        } else {
            Err(BadAccessKind::BadValue)
        }
    }

    fn check(&self, domain: u32, rmid: u32) -> Result<usize, DeviceError> {
        let d = domain as usize;
        if d >= self.domains.len() {
            return Err(DeviceError::NoSuchDomain {
                domain,
                domains: self.domains.len(),
            });
        }
        if rmid >= self.config.rmids {
            return Err(DeviceError::NoSuchRmid {
                rmid,
                rmids: self.config.rmids,
            });
        }
        Ok(d)
    }

    fn check_cumulative(&self, domain: u32, rmid: u32, event: Event) -> Result<usize, DeviceError> {
        let d = self.check(domain, rmid)?;
        if !event.is_cumulative() {
            return Err(DeviceError::NotCumulative(event));
        }
        Ok(d)
    }

    /// Queues `bytes` of `event` for (`domain`, `rmid`); they land over time
    /// at the domain's max rate minus its steady rates, after the traffic
    /// already queued in that domain.
    pub fn inject(
        &mut self,
        now_ns: u64,
        domain: u32,
        rmid: u32,
        event: Event,
        bytes: u64,
    ) -> Result<(), DeviceError> {
        let d = self.check_cumulative(domain, rmid, event)?;
        self.advance(now_ns);
        if let Some(dom) = self.domains.get_mut(d) {
            if !dom.traffic.inject(rmid, event, bytes) {
                return Err(DeviceError::QueueFull {
                    domain,
                    max: MAX_QUEUED,
                });
            }
        }
        self.record(TraceEvent::Inject {
            domain,
            rmid,
            event,
            bytes,
        });
        Ok(())
    }

    /// Sets the steady rate of (`domain`, `rmid`, `event`), 0 to clear it.
    /// Refused if the domain's total steady rate would exceed its max rate.
    pub fn set_rate(
        &mut self,
        now_ns: u64,
        domain: u32,
        rmid: u32,
        event: Event,
        bytes_per_sec: u64,
    ) -> Result<(), DeviceError> {
        let d = self.check_cumulative(domain, rmid, event)?;
        let max = self.config.max_rate;
        let Some(dom) = self.domains.get(d) else {
            return Ok(());
        };
        let others = dom.traffic.steady_total_except(rmid, event);
        let total = others + u128::from(bytes_per_sec);
        if total > u128::from(max) {
            return Err(DeviceError::RateTooHigh { domain, total, max });
        }
        self.advance(now_ns);
        if let Some(dom) = self.domains.get_mut(d) {
            dom.traffic.set_rate(rmid, event, bytes_per_sec);
        }
        self.record(TraceEvent::Rate {
            domain,
            rmid,
            event,
            bytes_per_sec,
        });
        Ok(())
    }

    /// Sets the LLC occupancy of (`domain`, `rmid`) in bytes.
    pub fn set_occupancy(&mut self, domain: u32, rmid: u32, bytes: u64) -> Result<(), DeviceError> {
        let d = self.check(domain, rmid)?;
        if let Some(o) = self
            .domains
            .get_mut(d)
            .and_then(|x| x.occupancy.get_mut(rmid as usize))
        {
            *o = bytes;
        }
        self.record(TraceEvent::Occupancy {
            domain,
            rmid,
            bytes,
        });
        Ok(())
    }

    /// Injected bytes not landed yet at `now_ns` (0 = all landed).
    pub fn pending_bytes(&mut self, now_ns: u64) -> u64 {
        self.advance(now_ns);
        self.domains
            .iter()
            .fold(0u64, |acc, d| acc.saturating_add(d.traffic.pending()))
    }

    /// Clears violations, read counts, bad-access counts and the trace (not
    /// the truth, not the counters). The trace then starts with a `reset`
    /// record.
    pub fn reset_stats(&mut self) {
        for d in &mut self.domains {
            d.violations = 0;
            d.violations_by_vcpu.clear();
            d.reads_by_vcpu.clear();
            d.irq.raised = 0;
            d.irq.acks_by_vcpu.clear();
        }
        self.bad = BadAccessCounts::default();
        self.trace.clear();
        self.record(TraceEvent::Reset);
    }

    /// The register accesses the trace still holds, oldest first (the
    /// `trace` request's answer; [`Device::trace_since`] has every record).
    pub fn trace(&self) -> Vec<TraceEntry> {
        self.trace_since(0).accesses()
    }

    /// Trace records lost to overflow since the last reset.
    pub fn trace_dropped(&self) -> u64 {
        self.trace.dropped()
    }

    /// A copy of the trace records numbered `since` and later (all kept
    /// ones for 0), to print outside the device's lock.
    pub fn trace_since(&self, since: u64) -> TraceSnapshot {
        TraceSnapshot {
            config: self.config.clone(),
            capacity: self.trace.capacity(),
            first_seq: self.trace.first_seq(),
            next_seq: self.trace.next_seq(),
            dropped: self.trace.dropped(),
            records: self
                .trace
                .iter_since(since)
                .map(|(seq, r)| (seq, *r))
                .collect(),
        }
    }

    /// A snapshot of the device at `now_ns`.
    pub fn state(&mut self, now_ns: u64) -> DeviceState {
        self.advance(now_ns);
        let domains = self
            .domains
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let slots = d
                    .slots
                    .iter()
                    .enumerate()
                    .map(|(s, slot)| SlotState {
                        slot: s as u32,
                        ctl: slot.ctl,
                        event: slot.assigned.map(|a| a.event),
                        rmid: slot.assigned.map(|a| a.rmid),
                        counted_bytes: slot.counted,
                        register: self.slot_register(slot),
                        assignment: slot.assigned.map(|_| slot.seq),
                    })
                    .collect();
                let truth = d
                    .truth
                    .iter()
                    .enumerate()
                    .flat_map(|(rmid, t)| {
                        CUMULATIVE
                            .iter()
                            .zip(t.iter())
                            .filter(|(_, &b)| b != 0)
                            .map(move |(&event, &bytes)| TruthEntry {
                                rmid: rmid as u32,
                                event,
                                bytes,
                            })
                    })
                    .collect();
                let occupancy = d
                    .occupancy
                    .iter()
                    .enumerate()
                    .filter(|(_, &b)| b != 0)
                    .map(|(rmid, &bytes)| OccupancyEntry {
                        rmid: rmid as u32,
                        bytes,
                    })
                    .collect();
                let steady_rates = d
                    .traffic
                    .rates()
                    .map(|(rmid, event, bytes_per_sec)| RateEntry {
                        rmid,
                        event,
                        bytes_per_sec,
                    })
                    .collect();
                let allowed_cpus = d.allowed.cpus();
                DomainState {
                    domain: i as u32,
                    allowed_cpu_list: format_cpu_list(&allowed_cpus),
                    allowed_cpus,
                    allowed_mask: d.allowed.0,
                    owner: u32::try_from(d.owner)
                        .ok()
                        .filter(|&o| u64::from(o) < regs::MAX_CPUS),
                    slots,
                    truth,
                    occupancy,
                    pending_bytes: d.traffic.pending(),
                    steady_rates,
                    violations: d.violations,
                    violations_by_vcpu: d.violations_by_vcpu.clone(),
                    counter_reads_by_vcpu: d.reads_by_vcpu.clone(),
                    irq: IrqState {
                        ctl: d.irq.ctl,
                        threshold: d.irq.threshold,
                        status: d.irq.status,
                        config_status: d.irq.config_status,
                        line: d.irq.line,
                        raised: d.irq.raised,
                        acks_by_vcpu: d.irq.acks_by_vcpu.clone(),
                        allowed_changes: d.irq.allowed_changes,
                    },
                }
            })
            .collect::<Vec<_>>();
        DeviceState {
            now_ns: self.now_ns,
            magic: regs::MAGIC_VALUE,
            version: regs::VERSION_VALUE,
            size: self.size,
            config: self.config.clone(),
            pending_bytes: domains
                .iter()
                .fold(0u64, |acc, d| acc.saturating_add(d.pending_bytes)),
            domains,
            bad_accesses: self.bad.clone(),
            trace_len: self.trace.len(),
            trace_dropped: self.trace.dropped(),
        }
    }
}

#[cfg(test)]
mod tests;
