//! An address bus (port I/O or MMIO): which device owns an address, and the
//! accounting of accesses that hit no device.
//!
//! Guest accesses to nothing are normal (the kernel probes legacy ports) and
//! must never stop the VMM: reads return all ones like an open bus, and each
//! is counted on the vCPU's thread with atomics only (no lock, no I/O), per
//! address in a fixed table of [`MAX_TRACKED_UNKNOWN`] slots. The event
//! loop logs each new address once ([`Bus::log_new_unknown`]) and the exit
//! report lists the busiest ([`Bus::top_unknown`]).
//!
//! Port string I/O (`rep outs`/`rep ins`) is `count` accesses of one size to
//! one port, as on the ISA bus: [`Bus::write_string`], [`Bus::read_string`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::access_record::AccessRecord;

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
    Overlap {
        name: String,
        base: u64,
        len: u64,
        other: String,
    },
}

struct Entry {
    base: u64,
    len: u64,
    name: String,
    device: Arc<dyn BusDevice>,
}

/// How many distinct unknown addresses are counted apart (the rest only
/// in the total).
pub const MAX_TRACKED_UNKNOWN: usize = 64;

/// One unknown address's count. `key` is the address plus one (0: free;
/// the address `u64::MAX` is counted in the total only).
#[derive(Default)]
struct UnknownSlot {
    key: AtomicU64,
    count: AtomicU64,
    logged: AtomicBool,
}

/// One bus: devices sorted by base address, disjoint.
pub struct Bus {
    kind: &'static str,
    entries: Vec<Entry>,
    unknown: AtomicU64,
    /// Accesses per unknown address, open addressing, filled lock-free.
    tracked: Box<[UnknownSlot]>,
    /// The first accesses, when asked for (fuzz seeds).
    record: Option<Arc<AccessRecord>>,
}

impl Bus {
    /// An empty bus; `kind` names it in log lines ("port", "MMIO").
    pub fn new(kind: &'static str) -> Bus {
        let tracked = (0..MAX_TRACKED_UNKNOWN)
            .map(|_| UnknownSlot::default())
            .collect();
        Bus {
            kind,
            entries: Vec::new(),
            unknown: AtomicU64::new(0),
            tracked,
            record: None,
        }
    }

    /// Keeps the first accesses from now on in `record`.
    pub fn record_into(&mut self, record: Arc<AccessRecord>) {
        self.record = Some(record);
    }

    pub fn record(&self) -> Option<&AccessRecord> {
        self.record.as_deref()
    }

    /// Places `device` at `base..base + len`.
    pub fn insert(
        &mut self,
        name: &str,
        base: u64,
        len: u64,
        device: Arc<dyn BusDevice>,
    ) -> Result<(), BusError> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or_else(|| BusError::BadRange {
                name: name.to_string(),
                base,
                len,
            })?;
        if let Some(other) = self
            .entries
            .iter()
            .find(|e| base < e.base + e.len && e.base < end)
        {
            return Err(BusError::Overlap {
                name: name.to_string(),
                base,
                len,
                other: other.name.clone(),
            });
        }
        let at = self.entries.partition_point(|e| e.base < base);
        self.entries.insert(
            at,
            Entry {
                base,
                len,
                name: name.to_string(),
                device,
            },
        );
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
                self.note_unknown(addr);
            }
        }
        if let Some(record) = &self.record {
            record.note(vcpu, addr, data, false);
        }
    }

    /// Dispatches a write; with no device there, counts and drops it.
    pub fn write(&self, vcpu: u32, addr: u64, data: &[u8]) {
        if let Some(record) = &self.record {
            record.note(vcpu, addr, data, true);
        }
        match self.find(addr, data.len()) {
            Some((entry, offset)) => entry.device.write(vcpu, offset, data),
            None => self.note_unknown(addr),
        }
    }

    /// A string write (`rep outs`): `data` is `data.len() / size` writes of
    /// `size` bytes, each to `addr` (not spread over the addresses after).
    pub fn write_string(&self, vcpu: u32, addr: u64, size: usize, data: &[u8]) {
        for access in data.chunks(size.max(1)) {
            self.write(vcpu, addr, access);
        }
    }

    /// A string read (`rep ins`): `data.len() / size` reads of `size`
    /// bytes, each from `addr`.
    pub fn read_string(&self, vcpu: u32, addr: u64, size: usize, data: &mut [u8]) {
        for access in data.chunks_mut(size.max(1)) {
            self.read(vcpu, addr, access);
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
        let mut all: Vec<(u64, u64)> = self.tracked_unknown().map(|(a, c, _)| (a, c)).collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        all.truncate(n);
        all
    }

    /// Logs each unknown address not logged yet, once (from the event loop
    /// or the exit path, never a vCPU).
    pub fn log_new_unknown(&self) {
        for (addr, count, slot) in self.tracked_unknown() {
            if !slot.logged.swap(true, Ordering::Relaxed) {
                log::warn!("guest accessed the unhandled {} address {addr:#x} ({count} accesses so far; logged once per address)", self.kind);
            }
        }
    }

    fn tracked_unknown(&self) -> impl Iterator<Item = (u64, u64, &UnknownSlot)> {
        self.tracked.iter().filter_map(|slot| {
            let key = slot.key.load(Ordering::Acquire);
            (key != 0).then(|| (key - 1, slot.count.load(Ordering::Relaxed), slot))
        })
    }

    /// Counts an access to nothing: lock-free, on the vCPU's thread.
    fn note_unknown(&self, addr: u64) {
        self.unknown.fetch_add(1, Ordering::Relaxed);
        let Some(key) = addr.checked_add(1) else {
            return;
        };
        let slots = self.tracked.len();
        // Fibonacci hashing spreads nearby ports over the table.
        let start = (addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize % slots;
        for probe in 0..slots {
            let slot = &self.tracked[(start + probe) % slots];
            let found = match slot
                .key
                .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => true,
                Err(other) => other == key,
            };
            if found {
                slot.count.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

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
    fn unknown_addresses_are_counted_in_a_bounded_table() {
        let bus = Bus::new("MMIO");
        for addr in 0..1000u64 {
            bus.write(0, addr * 8, &[0]);
            bus.write(0, addr * 8, &[0]);
        }
        bus.write(0, 8, &[0]);
        bus.write(0, u64::MAX, &[]);
        assert_eq!(bus.unknown_accesses(), 2002);
        assert_eq!(bus.tracked_unknown().count(), MAX_TRACKED_UNKNOWN);
        assert_eq!(bus.top_unknown(2), vec![(8, 3), (0, 2)]);
        // Each address counted apart, each once.
        let mut addrs: Vec<u64> = bus
            .tracked_unknown()
            .map(|(a, c, _)| {
                assert!(c >= 2);
                a
            })
            .collect();
        addrs.sort();
        addrs.dedup();
        assert_eq!(addrs.len(), MAX_TRACKED_UNKNOWN);
    }

    #[test]
    fn unknown_accesses_from_many_threads_are_all_counted() {
        let bus = Arc::new(Bus::new("port"));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let bus = bus.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000u64 {
                        bus.write(t, 0x80 + i % 3, &[0]);
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(
            bus.top_unknown(4),
            vec![(0x80, 13_336), (0x81, 13_332), (0x82, 13_332)]
        );
        bus.log_new_unknown();
        assert!(bus
            .tracked_unknown()
            .all(|(_, _, slot)| slot.logged.load(Ordering::Relaxed)));
    }

    /// Records every access in order.
    #[derive(Default)]
    struct Recorder {
        accesses: Mutex<Vec<(u64, Vec<u8>)>>,
    }

    impl BusDevice for Recorder {
        fn read(&self, _vcpu: u32, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8 + 0x10);
            self.accesses.lock().unwrap().push((offset, vec![]));
        }
        fn write(&self, _vcpu: u32, offset: u64, data: &[u8]) {
            self.accesses.lock().unwrap().push((offset, data.to_vec()));
        }
    }

    #[test]
    fn string_io_repeats_on_one_port() {
        let mut bus = Bus::new("port");
        let uart = Arc::new(Recorder::default());
        bus.insert("uart", 0x3f8, 8, uart.clone()).unwrap();
        // rep outsb of "abc" to 0x3f8: three writes to THR.
        bus.write_string(0, 0x3f8, 1, b"abc");
        // rep outsw of two words to 0x3fa: two 2-byte writes there.
        bus.write_string(0, 0x3fa, 2, &[1, 2, 3, 4]);
        let want: Vec<(u64, Vec<u8>)> = vec![
            (0, b"a".to_vec()),
            (0, b"b".to_vec()),
            (0, b"c".to_vec()),
            (2, vec![1, 2]),
            (2, vec![3, 4]),
        ];
        assert_eq!(*uart.accesses.lock().unwrap(), want);
        uart.accesses.lock().unwrap().clear();
        let mut data = [0u8; 3];
        bus.read_string(0, 0x3fd, 1, &mut data);
        assert_eq!(data, [0x15; 3], "three reads of LSR");
        assert_eq!(uart.accesses.lock().unwrap().len(), 3);
    }

    #[test]
    fn overlaps_and_empty_ranges_are_refused() {
        let mut bus = Bus::new("MMIO");
        bus.insert("a", 0x1000, 0x100, Arc::new(Probe::default()))
            .unwrap();
        let err = bus
            .insert("b", 0x10ff, 1, Arc::new(Probe::default()))
            .unwrap_err();
        assert!(matches!(err, BusError::Overlap { ref other, .. } if other == "a"));
        bus.insert("c", 0x1100, 1, Arc::new(Probe::default()))
            .unwrap();
        assert!(matches!(
            bus.insert("d", 0, 0, Arc::new(Probe::default())),
            Err(BusError::BadRange { .. })
        ));
        assert!(matches!(
            bus.insert("e", u64::MAX, 2, Arc::new(Probe::default())),
            Err(BusError::BadRange { .. })
        ));
    }
}
