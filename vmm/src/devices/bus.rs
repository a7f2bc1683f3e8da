//! An address bus (port I/O or MMIO): which device owns an address, and the
//! accounting of accesses that hit no device.
//!
//! Guest accesses to nothing are normal (the kernel probes legacy ports) and
//! must never stop the VMM: each is counted, each distinct address is logged
//! once (up to a bound), reads return all ones like an open bus.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A device on a bus. `offset` is relative to the device's base; `vcpu` is
/// the index of the vCPU that made the access. Implementations lock what
/// they need themselves and never panic on any offset or size.
pub trait BusDevice: Send + Sync {
    fn read(&self, vcpu: u32, offset: u64, data: &mut [u8]);
    fn write(&self, vcpu: u32, offset: u64, data: &[u8]);
}

/// Why a device could not be placed on the bus.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BusError {
    #[error("{name}: range {base:#x}+{len:#x} is empty or wraps")]
    BadRange { name: String, base: u64, len: u64 },
    #[error("{name} at {base:#x}+{len:#x} overlaps {other}")]
    Overlap { name: String, base: u64, len: u64, other: String },
}

struct Entry {
    base: u64,
    len: u64,
    name: String,
    device: Arc<dyn BusDevice>,
}

/// How many distinct unknown addresses get a log line.
pub const MAX_LOGGED_UNKNOWN: usize = 64;

/// One bus: devices sorted by base address, disjoint.
pub struct Bus {
    kind: &'static str,
    entries: Vec<Entry>,
    unknown: AtomicU64,
    /// Accesses per unknown address, for the first [`MAX_LOGGED_UNKNOWN`].
    logged: Mutex<BTreeMap<u64, u64>>,
}

impl Bus {
    /// An empty bus; `kind` names it in log lines ("port", "MMIO").
    pub fn new(kind: &'static str) -> Bus {
        Bus { kind, entries: Vec::new(), unknown: AtomicU64::new(0), logged: Mutex::new(BTreeMap::new()) }
    }

    /// Places `device` at `base..base + len`.
    pub fn insert(&mut self, name: &str, base: u64, len: u64, device: Arc<dyn BusDevice>) -> Result<(), BusError> {
        let end = base.checked_add(len).filter(|_| len > 0).ok_or_else(|| BusError::BadRange {
            name: name.to_string(),
            base,
            len,
        })?;
        if let Some(other) = self.entries.iter().find(|e| base < e.base + e.len && e.base < end) {
            return Err(BusError::Overlap { name: name.to_string(), base, len, other: other.name.clone() });
        }
        let at = self.entries.partition_point(|e| e.base < base);
        self.entries.insert(at, Entry { base, len, name: name.to_string(), device });
        Ok(())
    }

    fn find(&self, addr: u64, size: usize) -> Option<(&Entry, u64)> {
        let at = self.entries.partition_point(|e| e.base <= addr);
        let entry = self.entries.get(at.checked_sub(1)?)?;
        let offset = addr - entry.base;
        // The whole access must lie inside the device.
        (offset.checked_add(size as u64)? <= entry.len).then_some((entry, offset))
    }

    /// Dispatches a read; with no device there, counts it and reads ones.
    pub fn read(&self, vcpu: u32, addr: u64, data: &mut [u8]) {
        match self.find(addr, data.len()) {
            Some((entry, offset)) => entry.device.read(vcpu, offset, data),
            None => {
                data.fill(0xff);
                self.note_unknown(vcpu, addr, data.len(), "read");
            }
        }
    }

    /// Dispatches a write; with no device there, counts and drops it.
    pub fn write(&self, vcpu: u32, addr: u64, data: &[u8]) {
        match self.find(addr, data.len()) {
            Some((entry, offset)) => entry.device.write(vcpu, offset, data),
            None => self.note_unknown(vcpu, addr, data.len(), "write"),
        }
    }

    /// Whether an access of `size` bytes at `addr` reaches a device.
    pub fn is_claimed(&self, addr: u64, size: usize) -> bool {
        self.find(addr, size).is_some()
    }

    /// Accesses that reached no device so far.
    pub fn unknown_accesses(&self) -> u64 {
        self.unknown.load(Ordering::Relaxed)
    }

    /// The unknown addresses accessed most, with their counts, most first.
    pub fn top_unknown(&self, n: usize) -> Vec<(u64, u64)> {
        let logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<(u64, u64)> = logged.iter().map(|(a, c)| (*a, *c)).collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        all.truncate(n);
        all
    }

    fn note_unknown(&self, vcpu: u32, addr: u64, size: usize, what: &str) {
        self.unknown.fetch_add(1, Ordering::Relaxed);
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = logged.get_mut(&addr) {
            *count += 1;
        } else if logged.len() < MAX_LOGGED_UNKNOWN {
            logged.insert(addr, 1);
            log::warn!(
                "vCPU {vcpu}: {size}-byte {what} of unhandled {} {addr:#x} (logged once per address)",
                self.kind
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the last access; reads return the offset.
    #[derive(Default)]
    struct Probe {
        last: Mutex<Option<(u32, u64, Vec<u8>)>>,
    }

    impl BusDevice for Probe {
        fn read(&self, vcpu: u32, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
            *self.last.lock().unwrap() = Some((vcpu, offset, vec![]));
        }
        fn write(&self, vcpu: u32, offset: u64, data: &[u8]) {
            *self.last.lock().unwrap() = Some((vcpu, offset, data.to_vec()));
        }
    }

    #[test]
    fn accesses_reach_the_owner_with_offset_and_vcpu() {
        let mut bus = Bus::new("MMIO");
        let a = Arc::new(Probe::default());
        let b = Arc::new(Probe::default());
        bus.insert("b", 0x2000, 0x100, b.clone()).unwrap();
        bus.insert("a", 0x1000, 0x100, a.clone()).unwrap();
        let mut data = [0u8; 4];
        bus.read(3, 0x1010, &mut data);
        assert_eq!(data, [0x10; 4]);
        assert_eq!(a.last.lock().unwrap().clone(), Some((3, 0x10, vec![])));
        bus.write(1, 0x20ff, &[7]);
        assert_eq!(b.last.lock().unwrap().clone(), Some((1, 0xff, vec![7])));
        assert_eq!(bus.unknown_accesses(), 0);
    }

    #[test]
    fn unknown_and_straddling_accesses_are_counted_not_dispatched() {
        let mut bus = Bus::new("port");
        let a = Arc::new(Probe::default());
        bus.insert("a", 0x1000, 0x10, a.clone()).unwrap();
        let mut data = [0u8; 2];
        bus.read(0, 0x0fff, &mut data);
        assert_eq!(data, [0xff; 2]);
        bus.write(0, 0x100f, &[1, 2]); // starts inside, ends outside
        bus.write(0, u64::MAX, &[1, 2]); // wraps
        bus.read(0, 0x1010, &mut data);
        assert_eq!(bus.unknown_accesses(), 4);
        assert!(a.last.lock().unwrap().is_none());
        assert!(bus.is_claimed(0x100e, 2) && !bus.is_claimed(0x100f, 2));
    }

    #[test]
    fn log_lines_are_bounded() {
        let bus = Bus::new("MMIO");
        for addr in 0..1000u64 {
            bus.write(0, addr * 8, &[0]);
            bus.write(0, addr * 8, &[0]);
        }
        bus.write(0, 8, &[0]);
        assert_eq!(bus.unknown_accesses(), 2001);
        assert_eq!(bus.logged.lock().unwrap().len(), MAX_LOGGED_UNKNOWN);
        assert_eq!(bus.top_unknown(2), vec![(8, 3), (0, 2)]);
    }

    #[test]
    fn overlaps_and_empty_ranges_are_refused() {
        let mut bus = Bus::new("MMIO");
        bus.insert("a", 0x1000, 0x100, Arc::new(Probe::default())).unwrap();
        let err = bus.insert("b", 0x10ff, 1, Arc::new(Probe::default())).unwrap_err();
        assert!(matches!(err, BusError::Overlap { ref other, .. } if other == "a"));
        bus.insert("c", 0x1100, 1, Arc::new(Probe::default())).unwrap();
        assert!(matches!(bus.insert("d", 0, 0, Arc::new(Probe::default())), Err(BusError::BadRange { .. })));
        assert!(matches!(
            bus.insert("e", u64::MAX, 2, Arc::new(Probe::default())),
            Err(BusError::BadRange { .. })
        ));
    }
}
