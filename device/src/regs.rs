//! The perfbed register map: the one definition shared by the device model and
//! the guest kernel driver.
//!
//! This file is also compiled inside the Linux kernel module (copied next to it
//! and used as `mod regs;`), so it must stay `no_std`-clean: only `core`, no
//! dependencies, only constants, `const fn`s and the [`Event`] enum.
//!
//! All registers are 64-bit little-endian and 8-byte aligned. 8-byte accesses
//! are the norm; a 4-byte access to either half of a register is accepted
//! (reads return that half; writes are accepted only to the low half of a
//! writable register and are zero-extended). `device/README.md` shows the same
//! map as a table; where they disagree, this file is authoritative.
#![allow(dead_code)]

// ---------------------------------------------------------------------------
// Identification
// ---------------------------------------------------------------------------

/// Value of the `REG_MAGIC` register: the bytes `"PERFBED\0"` read as a
/// little-endian u64.
pub const MAGIC_VALUE: u64 = u64::from_le_bytes(*b"PERFBED\0");
/// Value of the `REG_VERSION` register.
pub const VERSION_VALUE: u64 = 5;

// ---------------------------------------------------------------------------
// Global block (all read-only), at offset 0
// ---------------------------------------------------------------------------

/// [`MAGIC_VALUE`].
pub const REG_MAGIC: u64 = 0x000;
/// [`VERSION_VALUE`].
pub const REG_VERSION: u64 = 0x008;
/// Number of monitoring domains.
pub const REG_NUM_DOMAINS: u64 = 0x010;
/// Number of RMIDs (monitoring groups) per domain; valid RMIDs are `0..n`.
pub const REG_NUM_RMIDS: u64 = 0x018;
/// Number of counter slots per domain.
pub const REG_NUM_SLOTS: u64 = 0x020;
/// Width in bits of the counter field of `SLOT_COUNT`/`OCCUPANCY` values.
pub const REG_COUNTER_WIDTH: u64 = 0x028;
/// Bytes per counter unit (a power of two).
pub const REG_COUNTER_UNIT: u64 = 0x030;
/// Maximum bandwidth of one domain, in bytes per second.
pub const REG_MAX_RATE: u64 = 0x038;
/// Offset of domain 0's block ([`DOMAIN_BASE`]).
pub const REG_DOMAIN_BASE: u64 = 0x040;
/// Bytes between consecutive domain blocks ([`DOMAIN_STRIDE`]).
pub const REG_DOMAIN_STRIDE: u64 = 0x048;
/// Offset of `SLOT_CTL[0]` inside a domain block ([`DOM_SLOTS`]).
pub const REG_SLOT_BASE: u64 = 0x050;
/// Bytes between consecutive slot pairs ([`SLOT_STRIDE`]).
pub const REG_SLOT_STRIDE: u64 = 0x058;
/// Offset of `OCCUPANCY[0]` inside a domain block ([`DOM_OCCUPANCY`]).
pub const REG_OCCUPANCY_BASE: u64 = 0x060;
/// Size in bytes of the whole register region (a multiple of 4 KiB).
pub const REG_DEVICE_SIZE: u64 = 0x068;
/// Bitmask of supported event ids (bit `n` set = event id `n` supported).
pub const REG_EVENTS: u64 = 0x070;
/// End of the defined global registers; `REG_GLOBAL_END..DOMAIN_BASE` is
/// reserved (accesses are bad accesses).
pub const REG_GLOBAL_END: u64 = 0x078;

// ---------------------------------------------------------------------------
// Domain blocks
// ---------------------------------------------------------------------------

/// Offset of domain 0's block.
pub const DOMAIN_BASE: u64 = 0x1000;
/// Bytes between consecutive domain blocks.
pub const DOMAIN_STRIDE: u64 = 0x1000;

/// Domain register (RO): u64 bitmask of the vCPU indices from which this
/// domain's counters may be read.
pub const DOM_ALLOWED_CPUS: u64 = 0x000;
/// Domain register (RW): the vCPU index that now reads this domain, or
/// [`NO_OWNER`]. Writing a value `>= MAX_CPUS` other than `NO_OWNER` is a bad
/// access.
pub const DOM_OWNER: u64 = 0x008;
/// Offset of the first slot pair (`SLOT_CTL[0]`, `SLOT_COUNT[0]`).
pub const DOM_SLOTS: u64 = 0x010;
/// Bytes between slot pairs.
pub const SLOT_STRIDE: u64 = 0x010;
/// Offset of `SLOT_CTL` inside a slot pair (RW).
pub const SLOT_CTL_OFF: u64 = 0x000;
/// Offset of `SLOT_COUNT` inside a slot pair (RO).
pub const SLOT_COUNT_OFF: u64 = 0x008;
/// Offset of `OCCUPANCY[0]` (RO, one u64 per RMID).
pub const DOM_OCCUPANCY: u64 = 0x800;

/// Domain register (RW): the domain's interrupt line, see the `IRQ_CTL_*`
/// bits; other bits are a bad value. Reset 0 (no interrupt).
pub const DOM_IRQ_CTL: u64 = 0x400;
/// Domain register (RW): the threshold of the overflow interrupt's
/// threshold mode, in counter units: a slot raises its `DOM_IRQ_STATUS` bit
/// once this many units landed in it since its last correctly placed
/// counter read (or its assignment), once per such read. 0 (the reset
/// value) never raises; a value above the counter mask is a bad value.
pub const DOM_IRQ_THRESHOLD: u64 = 0x408;
/// Domain register (RO, read-and-clear): bit `s` set = slot `s` raised an
/// overflow since the register was last read. It is counter data: a read
/// off the owner (or outside the allowed set) is a placement violation,
/// returns exactly [`COUNTER_ERROR`] and clears nothing.
pub const DOM_IRQ_STATUS: u64 = 0x410;
/// Domain register (RO, read-and-clear): what changed in the domain's
/// configuration since the register was last read (`CONFIG_STATUS_*`).
/// Readable from any vCPU: a parked domain, or one whose owner just left
/// the allowed set, must still learn of it. Reading it acknowledges
/// nothing: [`DOM_ALLOWED_ACK`] does.
pub const DOM_CONFIG_STATUS: u64 = 0x418;
/// Domain register (RO): the generation of the set `DOM_ALLOWED_CPUS` reads
/// now: 0 at reset, one more at each change the host makes. Readable from
/// any vCPU. A driver reads it before and after `DOM_ALLOWED_CPUS`; equal
/// twice, the set read is that generation's.
pub const DOM_ALLOWED_GEN: u64 = 0x420;
/// Domain register (RW): the generation of the allowed set the driver
/// places the domain by. Writing generation `g` makes the placement rule
/// check reads against generation `g`'s set from then on, also when newer
/// changes came meanwhile (the device remembers the last
/// [`ALLOWED_HISTORY`] sets). A generation newer than `DOM_ALLOWED_GEN` or
/// older than the history, or a write other than full width, is a bad
/// access and changes nothing. Reads the generation acknowledged last
/// (0 at reset: the set the device was created with).
pub const DOM_ALLOWED_ACK: u64 = 0x428;
/// How many allowed-set generations before the current one
/// `DOM_ALLOWED_ACK` still accepts.
pub const ALLOWED_HISTORY: u64 = 64;

/// `DOM_IRQ_CTL` bit 0: raise the line while `DOM_IRQ_STATUS` is not 0.
pub const IRQ_CTL_OVERFLOW: u64 = 1 << 0;
/// `DOM_IRQ_CTL` bit 1: overflow mode "on wrap": a slot raises its status
/// bit each time its counter field wraps (clear: threshold mode, see
/// [`DOM_IRQ_THRESHOLD`]).
pub const IRQ_CTL_ON_WRAP: u64 = 1 << 1;
/// `DOM_IRQ_CTL` bit 2: raise the line while `DOM_CONFIG_STATUS` is not 0.
pub const IRQ_CTL_CONFIG: u64 = 1 << 2;
/// The bits `DOM_IRQ_CTL` accepts.
pub const IRQ_CTL_VALID: u64 = IRQ_CTL_OVERFLOW | IRQ_CTL_ON_WRAP | IRQ_CTL_CONFIG;

/// `DOM_CONFIG_STATUS` bit 0: the host changed `DOM_ALLOWED_CPUS`.
pub const CONFIG_STATUS_ALLOWED: u64 = 1 << 0;

/// Reset value of `OWNER`: nobody reads this domain yet.
pub const NO_OWNER: u64 = u64::MAX;

// ---------------------------------------------------------------------------
// Limits
// ---------------------------------------------------------------------------

/// Most domains a device may have.
pub const MAX_DOMAINS: u64 = 16;
/// Most RMIDs a device may have.
pub const MAX_RMIDS: u64 = 256;
/// Most counter slots per domain.
pub const MAX_SLOTS: u64 = 32;
/// vCPU indices are below this (they fit in a u64 bitmask).
pub const MAX_CPUS: u64 = 64;
/// Narrowest allowed counter width in bits.
pub const MIN_COUNTER_WIDTH: u64 = 8;
/// Widest allowed counter width in bits (bits 61 to 63 are flags).
pub const MAX_COUNTER_WIDTH: u64 = 61;

// ---------------------------------------------------------------------------
// SLOT_CTL fields
// ---------------------------------------------------------------------------

/// `SLOT_CTL` bit 63: the slot is assigned.
pub const SLOT_CTL_ASSIGNED: u64 = 1 << 63;
/// `SLOT_CTL` bit 62: the slot is frozen: it counts nothing and keeps its
/// count. A write to an assigned slot that changes only this bit freezes or
/// thaws it without resetting the count or ending the assignment (as MPAM's
/// `MSMON_CFG_*_CTL.EN` stops a monitor in place): a driver that cannot read
/// the slot where it is (a parked domain) can still stop it exactly when an
/// event goes off, and read it later on the owner.
pub const SLOT_CTL_FROZEN: u64 = 1 << 62;
/// `SLOT_CTL` bits 8..24: the RMID.
pub const SLOT_CTL_RMID_SHIFT: u64 = 8;
/// Mask of the RMID field after shifting.
pub const SLOT_CTL_RMID_MASK: u64 = 0xffff;
/// `SLOT_CTL` bits 0..8: the event id.
pub const SLOT_CTL_EVENT_MASK: u64 = 0xff;
/// Bits that must be zero in a `SLOT_CTL` write.
pub const SLOT_CTL_RESERVED: u64 = !(SLOT_CTL_ASSIGNED
    | SLOT_CTL_FROZEN
    | (SLOT_CTL_RMID_MASK << SLOT_CTL_RMID_SHIFT)
    | SLOT_CTL_EVENT_MASK);

/// The `SLOT_CTL` value that assigns `event` of `rmid` to a slot.
pub const fn slot_ctl_value(event: Event, rmid: u64) -> u64 {
    SLOT_CTL_ASSIGNED | ((rmid & SLOT_CTL_RMID_MASK) << SLOT_CTL_RMID_SHIFT) | event as u64
}

/// The RMID field of a `SLOT_CTL` value.
pub const fn slot_ctl_rmid(ctl: u64) -> u64 {
    (ctl >> SLOT_CTL_RMID_SHIFT) & SLOT_CTL_RMID_MASK
}

/// The event id field of a `SLOT_CTL` value.
pub const fn slot_ctl_event(ctl: u64) -> u64 {
    ctl & SLOT_CTL_EVENT_MASK
}

// ---------------------------------------------------------------------------
// Counter values (SLOT_COUNT, OCCUPANCY)
// ---------------------------------------------------------------------------

/// Bit 63 of a counter value: placement violation (the reading vCPU is not in
/// `ALLOWED_CPUS` or is not the domain's `OWNER`). The value is then exactly
/// this bit.
pub const COUNTER_ERROR: u64 = 1 << 63;
/// Bit 62 of a counter value: the slot is not assigned. The value is then
/// exactly this bit.
pub const COUNTER_UNAVAILABLE: u64 = 1 << 62;
/// Bit 61 of a `SLOT_COUNT` value, beside the counter field: `2^width` units
/// or more landed in the slot since its previous correctly placed read (or
/// its assignment). The counter wrapped with nobody reading it, so a reader
/// that adds up deltas modulo `2^width` has lost counts and must say so.
/// Set on that one read; the read after it is clear again unless it
/// wrapped once more.
pub const COUNTER_OVERFLOW: u64 = 1 << 61;

/// `bytes` as a counter of `unit`-byte units can show them: rounded down to
/// a whole unit. The rest of the last unit is traffic no counter shows, so
/// this is what an exact count of `bytes` of traffic reads.
pub const fn whole_units(bytes: u64, unit: u64) -> u64 {
    let unit = if unit == 0 { 1 } else { unit };
    bytes / unit * unit
}

/// Mask of the counter field for a counter `width` in bits (`width` is
/// clamped to `0..=MAX_COUNTER_WIDTH`).
pub const fn counter_mask(width: u64) -> u64 {
    let w = if width > MAX_COUNTER_WIDTH {
        MAX_COUNTER_WIDTH
    } else {
        width
    };
    (1u64 << w) - 1
}

// ---------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------

/// Monitoring event ids, as used in `SLOT_CTL` and on the control socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u64)]
pub enum Event {
    /// LLC occupancy in bytes: a gauge, read through `OCCUPANCY[rmid]`, not
    /// assignable to slots.
    LlcOccupancy = 1,
    /// Total memory bandwidth in bytes: cumulative, assignable.
    MbmTotalBytes = 2,
    /// Local memory bandwidth in bytes: cumulative, assignable.
    MbmLocalBytes = 3,
}

/// Bitmask of the supported event ids (value of `REG_EVENTS`).
pub const EVENTS_MASK: u64 = (1 << Event::LlcOccupancy as u64)
    | (1 << Event::MbmTotalBytes as u64)
    | (1 << Event::MbmLocalBytes as u64);

impl Event {
    /// The event with id `v`, if any.
    pub const fn from_u64(v: u64) -> Option<Event> {
        match v {
            1 => Some(Event::LlcOccupancy),
            2 => Some(Event::MbmTotalBytes),
            3 => Some(Event::MbmLocalBytes),
            _ => None,
        }
    }

    /// Whether the event counts cumulatively (and so can be assigned to a slot).
    pub const fn is_cumulative(self) -> bool {
        matches!(self, Event::MbmTotalBytes | Event::MbmLocalBytes)
    }
}

// ---------------------------------------------------------------------------
// Offsets
// ---------------------------------------------------------------------------

/// Offset of domain register `reg` (a `DOM_*` offset) of domain `d`.
pub const fn domain_reg(d: u64, reg: u64) -> u64 {
    DOMAIN_BASE
        .wrapping_add(d.wrapping_mul(DOMAIN_STRIDE))
        .wrapping_add(reg)
}

/// Offset of `SLOT_CTL[s]` of domain `d`.
pub const fn slot_ctl(d: u64, s: u64) -> u64 {
    domain_reg(
        d,
        DOM_SLOTS
            .wrapping_add(s.wrapping_mul(SLOT_STRIDE))
            .wrapping_add(SLOT_CTL_OFF),
    )
}

/// Offset of `SLOT_COUNT[s]` of domain `d`.
pub const fn slot_count(d: u64, s: u64) -> u64 {
    domain_reg(
        d,
        DOM_SLOTS
            .wrapping_add(s.wrapping_mul(SLOT_STRIDE))
            .wrapping_add(SLOT_COUNT_OFF),
    )
}

/// Offset of `OCCUPANCY[rmid]` of domain `d`.
pub const fn occupancy(d: u64, rmid: u64) -> u64 {
    domain_reg(d, DOM_OCCUPANCY.wrapping_add(rmid.wrapping_mul(8)))
}

/// Size of the register region of a device with the given shape: the end of
/// the last register, rounded up to a multiple of 4 KiB.
pub const fn device_size(domains: u64, rmids: u64, slots: u64) -> u64 {
    let mut end = REG_GLOBAL_END;
    if domains > 0 {
        let last = domains - 1;
        let slots_end = if slots > 0 {
            slot_count(last, slots - 1).wrapping_add(8)
        } else {
            domain_reg(last, DOM_SLOTS)
        };
        let occ_end = occupancy(last, rmids);
        end = if slots_end > occ_end {
            slots_end
        } else {
            occ_end
        };
    }
    end.wrapping_add(0xfff) & !0xfff
}
