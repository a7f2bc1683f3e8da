//! A record of the first accesses a bus dispatched, for seeding the fuzz
//! targets with what a real guest does (`--record-accesses N`, printed at
//! the end of the run as `perfbed-vmm: access` lines that
//! `fuzz/src/recorded.rs` turns into the targets' inputs).
//!
//! Filled on the vCPU threads with atomics only: a slot is claimed with one
//! `fetch_add` and written with three stores; accesses past the capacity
//! are counted, not kept. Read once the vCPUs are joined.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// One kept access: the address, `vcpu << 32 | size << 8 | write`, and the
/// value (the bytes written, or read back, little-endian, at most 8).
type Slot = [AtomicU64; 3];

pub struct AccessRecord {
    slots: Box<[Slot]>,
    next: AtomicUsize,
}

impl AccessRecord {
    /// Keeps the first `capacity` accesses.
    pub fn new(capacity: usize) -> AccessRecord {
        let slots = (0..capacity).map(|_| Default::default()).collect();
        AccessRecord {
            slots,
            next: AtomicUsize::new(0),
        }
    }

    /// Notes one access (on a vCPU's thread).
    pub fn note(&self, vcpu: u32, addr: u64, data: &[u8], write: bool) {
        let at = self.next.fetch_add(1, Ordering::Relaxed);
        let Some(slot) = self.slots.get(at) else {
            return;
        };
        let mut value = [0u8; 8];
        let n = data.len().min(8);
        value[..n].copy_from_slice(&data[..n]);
        let meta =
            (u64::from(vcpu) << 32) | ((data.len() as u64 & 0xff_ffff) << 8) | u64::from(write);
        slot[0].store(addr, Ordering::Relaxed);
        slot[1].store(meta, Ordering::Relaxed);
        slot[2].store(u64::from_le_bytes(value), Ordering::Relaxed);
    }

    /// How many accesses were noted, kept or not.
    pub fn noted(&self) -> usize {
        self.next.load(Ordering::Relaxed)
    }

    /// The kept accesses as lines `<bus> <r|w> <vcpu> <addr> <size> <value>`
    /// (hex address and value), in the order their slots were claimed.
    pub fn lines(&self, bus: &str) -> Vec<String> {
        let kept = self.noted().min(self.slots.len());
        self.slots[..kept]
            .iter()
            .map(|slot| {
                let (addr, meta, value) = (
                    slot[0].load(Ordering::Relaxed),
                    slot[1].load(Ordering::Relaxed),
                    slot[2].load(Ordering::Relaxed),
                );
                let mut line = String::new();
                let dir = if meta & 1 == 1 { 'w' } else { 'r' };
                let _ = write!(
                    line,
                    "{bus} {dir} {} {addr:#x} {} {value:#x}",
                    meta >> 32,
                    (meta >> 8) & 0xff_ffff
                );
                line
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_accesses_are_kept_in_order_and_the_rest_counted() {
        let record = AccessRecord::new(2);
        record.note(1, 0xfeb0_0070, &[0xf, 0, 0, 0], true);
        record.note(0, 0x3f8, &[0x41], false);
        record.note(0, 0x3f8, &[0x42], true);
        assert_eq!(record.noted(), 3);
        assert_eq!(
            record.lines("mmio"),
            ["mmio w 1 0xfeb00070 4 0xf", "mmio r 0 0x3f8 1 0x41"]
        );
        let wide = AccessRecord::new(1);
        wide.note(2, 0x10, &[1; 16], true);
        assert_eq!(
            wide.lines("mmio"),
            ["mmio w 2 0x10 16 0x101010101010101"],
            "the size whole, the value its first 8 bytes"
        );
    }
}
