//! The guest's memory map (E820), given to the kernel through the PVH start
//! info or a bzImage's zero page.

use crate::memory::{ram_ranges, BASE_MEMORY_END, HIMEM_START, MPTABLE_ADDR};

/// What a range of guest physical memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum E820Kind {
    Ram = 1,
    Reserved = 2,
}

/// One memory map entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct E820Entry {
    pub addr: u64,
    pub size: u64,
    pub kind: E820Kind,
}

/// The memory map of a guest with `memory_mib` MiB: base memory up to the MP
/// table, the MP table reserved, then RAM from 1 MiB (the legacy VGA and BIOS
/// area in between is left out, so the kernel never allocates it), and any
/// RAM above 4 GiB.
pub fn memory_map(memory_mib: u32) -> Vec<E820Entry> {
    let mut map = vec![
        E820Entry {
            addr: 0,
            size: MPTABLE_ADDR,
            kind: E820Kind::Ram,
        },
        E820Entry {
            addr: MPTABLE_ADDR,
            size: BASE_MEMORY_END - MPTABLE_ADDR,
            kind: E820Kind::Reserved,
        },
    ];
    for (start, len) in ram_ranges(memory_mib) {
        let start = start.0;
        let end = start + len;
        let from = start.max(HIMEM_START);
        if end > from {
            map.push(E820Entry {
                addr: from,
                size: end - from,
                kind: E820Kind::Ram,
            });
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{FOUR_GIB, MMIO_HOLE_START};

    const MIB: u64 = 1 << 20;

    fn ram(map: &[E820Entry]) -> u64 {
        map.iter()
            .filter(|e| e.kind == E820Kind::Ram)
            .map(|e| e.size)
            .sum()
    }

    #[test]
    fn entries_are_sorted_and_disjoint() {
        for mib in [64, 512, 3072, 4096, 16384] {
            let map = memory_map(mib);
            for pair in map.windows(2) {
                assert!(
                    pair[0].addr + pair[0].size <= pair[1].addr,
                    "{mib} MiB: {pair:?}"
                );
            }
        }
    }

    #[test]
    fn ram_is_all_memory_but_the_legacy_hole() {
        let legacy = HIMEM_START - MPTABLE_ADDR;
        assert_eq!(ram(&memory_map(512)), 512 * MIB - legacy);
        assert_eq!(ram(&memory_map(4096)), 4096 * MIB - legacy);
    }

    #[test]
    fn the_mmio_hole_is_not_ram() {
        let map = memory_map(8192);
        for e in &map {
            let end = e.addr + e.size;
            assert!(end <= MMIO_HOLE_START || e.addr >= FOUR_GIB, "{e:?}");
        }
        assert_eq!(map.last().unwrap().addr, FOUR_GIB);
        assert!(map
            .iter()
            .any(|e| e.addr == MPTABLE_ADDR && e.kind == E820Kind::Reserved));
    }
}
