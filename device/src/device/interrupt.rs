//! A domain's interrupt line: the overflow status its slots raise (in
//! threshold or on-wrap mode), the configuration status the host's changes
//! raise, and the line's level, which is a pure function of both and of
//! `DOM_IRQ_CTL`.
//!
//! The device only computes levels. A host learns of a change of level
//! through [`crate::host::InterruptLines`] and delivers it its own way (a
//! GSI of the IOAPIC on both hosts); which vCPU then takes the interrupt is
//! the guest's business. The device sees the handler only when it reads
//! `DOM_IRQ_STATUS`, and that read follows the placement rule: the device
//! records it with the reading vCPU (an *ack*) or counts it as a violation.

use std::collections::BTreeMap;

use crate::regs;

/// A slot's part in the overflow interrupt.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SlotIrq {
    /// Wraps of the counter field seen so far.
    pub(super) wraps_seen: u64,
    /// The threshold was crossed since the slot's last correctly placed
    /// read (cleared by that read, which re-arms it).
    pub(super) threshold_raised: bool,
}

/// The interrupt state of one domain.
#[derive(Debug, Clone, Default)]
pub(super) struct DomainIrq {
    /// `DOM_IRQ_CTL`.
    pub(super) ctl: u64,
    /// `DOM_IRQ_THRESHOLD`, in counter units (0: never).
    pub(super) threshold: u64,
    /// `DOM_IRQ_STATUS`: one bit per slot.
    pub(super) status: u64,
    /// `DOM_CONFIG_STATUS`.
    pub(super) config_status: u64,
    /// The line's level as last settled (see `Device::settle_lines`).
    pub(super) line: bool,
    /// Rising edges of the line.
    pub(super) raised: u64,
    /// Status reads that returned (and cleared) a non-zero status, by
    /// reading vCPU: who handled the interrupts.
    pub(super) acks_by_vcpu: BTreeMap<u32, u64>,
    /// `DOM_ALLOWED_CPUS` changes the host made.
    pub(super) allowed_changes: u64,
}

impl DomainIrq {
    /// The level the line should have now.
    pub(super) fn level(&self) -> bool {
        (self.ctl & regs::IRQ_CTL_OVERFLOW != 0 && self.status != 0)
            || (self.ctl & regs::IRQ_CTL_CONFIG != 0 && self.config_status != 0)
    }

    /// Raises the status bit of every assigned slot whose counter crossed
    /// its mark: a wrap of its counter field (on-wrap mode), or `threshold`
    /// units since its last correctly placed read (threshold mode, once per
    /// read). Both marks are kept up to date in either mode, so switching
    /// modes raises nothing for the past. Each slot comes as (index, units
    /// counted, units at its last correct read, its interrupt state).
    pub(super) fn check_slots<'a>(
        &mut self,
        slots: impl Iterator<Item = (usize, u64, u64, &'a mut SlotIrq)>,
        wrap: u64,
    ) {
        let on_wrap = self.ctl & regs::IRQ_CTL_ON_WRAP != 0;
        for (s, units, units_at_read, slot) in slots {
            let wraps = units / wrap.max(1);
            let wrapped = wraps != slot.wraps_seen;
            slot.wraps_seen = wraps;
            let crossed = self.threshold != 0
                && !slot.threshold_raised
                && units.wrapping_sub(units_at_read) >= self.threshold;
            if crossed {
                slot.threshold_raised = true;
            }
            let raise = if on_wrap { wrapped } else { crossed };
            if raise && s < 64 {
                self.status |= 1 << s;
            }
        }
    }

    /// A correctly placed read of `DOM_IRQ_STATUS` by `vcpu`: returns the
    /// status and clears it.
    pub(super) fn read_status(&mut self, vcpu: u32) -> u64 {
        let status = std::mem::take(&mut self.status);
        if status != 0 {
            let acks = self.acks_by_vcpu.entry(vcpu).or_insert(0);
            *acks = acks.wrapping_add(1);
        }
        status
    }

    /// A write of `DOM_IRQ_CTL`; `false` for a value it refuses.
    pub(super) fn write_ctl(&mut self, value: u64) -> bool {
        if value & !regs::IRQ_CTL_VALID != 0 {
            return false;
        }
        self.ctl = value;
        true
    }

    /// A write of `DOM_IRQ_THRESHOLD` for counters masked by `mask`;
    /// `false` for a value it refuses.
    pub(super) fn write_threshold(&mut self, value: u64, mask: u64) -> bool {
        if value > mask {
            return false;
        }
        self.threshold = value;
        true
    }
}
