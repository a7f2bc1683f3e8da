//! gdb's software breakpoints: an `int3` (0xCC) written over the first byte
//! of the instruction in guest memory, the byte it replaced kept to put back.
//! A read of guest memory through the stub shows the original bytes, so gdb
//! never sees its own breakpoints (as gdbserver does).

use std::collections::BTreeMap;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// The `int3` instruction.
pub const INT3: u8 = 0xcc;

/// Why a breakpoint could not be set or cleared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BreakpointError {
    #[error("breakpoint at {gva:#x}: guest physical {gpa:#x} is not RAM")]
    NotRam { gva: u64, gpa: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Inserted {
    gpa: u64,
    original: u8,
}

/// The breakpoints in guest memory, by guest virtual address.
#[derive(Debug, Default)]
pub struct Breakpoints {
    inserted: BTreeMap<u64, Inserted>,
}

impl Breakpoints {
    /// Writes an `int3` at `gva` (physical `gpa`); setting one twice is one.
    pub fn insert(
        &mut self,
        memory: &GuestMemoryMmap,
        gva: u64,
        gpa: u64,
    ) -> Result<(), BreakpointError> {
        if self.inserted.contains_key(&gva) {
            return Ok(());
        }
        let not_ram = |_| BreakpointError::NotRam { gva, gpa };
        let original: u8 = memory.read_obj(GuestAddress(gpa)).map_err(not_ram)?;
        memory.write_obj(INT3, GuestAddress(gpa)).map_err(not_ram)?;
        self.inserted.insert(gva, Inserted { gpa, original });
        Ok(())
    }

    /// Puts back the byte under the breakpoint at `gva`; `false` if there
    /// was none.
    pub fn remove(&mut self, memory: &GuestMemoryMmap, gva: u64) -> bool {
        let Some(bp) = self.inserted.remove(&gva) else {
            return false;
        };
        // It was RAM when inserted; RAM does not go away.
        let _ = memory.write_obj(bp.original, GuestAddress(bp.gpa));
        true
    }

    /// Removes every breakpoint (gdb went away).
    pub fn clear(&mut self, memory: &GuestMemoryMmap) {
        let all: Vec<u64> = self.inserted.keys().copied().collect();
        for gva in all {
            self.remove(memory, gva);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.inserted.is_empty()
    }

    /// The addresses, for the vCPU threads' claim of their `int3` exits.
    pub fn addresses(&self) -> Vec<u64> {
        self.inserted.keys().copied().collect()
    }

    /// Shows the original bytes in `data`, read from `gva` on.
    pub fn hide(&self, gva: u64, data: &mut [u8]) {
        let end = gva.saturating_add(data.len() as u64);
        for (&at, bp) in self.inserted.range(gva..end) {
            data[(at - gva) as usize] = bp.original;
        }
    }

    /// A write of `data` at `gva` over breakpoints: the new bytes become the
    /// originals to put back, and the `int3`s stay in `data`.
    pub fn absorb(&mut self, gva: u64, data: &mut [u8]) {
        let end = gva.saturating_add(data.len() as u64);
        for (&at, bp) in self.inserted.range_mut(gva..end) {
            let byte = &mut data[(at - gva) as usize];
            bp.original = *byte;
            *byte = INT3;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> GuestMemoryMmap {
        let m = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        m.write_slice(&[0x55, 0x48, 0x89, 0xe5], GuestAddress(0x2000))
            .unwrap();
        m
    }

    fn bytes(m: &GuestMemoryMmap) -> [u8; 4] {
        let mut b = [0; 4];
        m.read_slice(&mut b, GuestAddress(0x2000)).unwrap();
        b
    }

    #[test]
    fn an_int3_goes_in_and_the_byte_comes_back() {
        let m = memory();
        let mut bps = Breakpoints::default();
        let gva = 0xffff_ffff_8100_2000;
        bps.insert(&m, gva, 0x2000).unwrap();
        assert_eq!(bytes(&m), [INT3, 0x48, 0x89, 0xe5]);
        // Twice is once: the original is not taken to be the int3.
        bps.insert(&m, gva, 0x2000).unwrap();
        assert_eq!(bps.addresses(), vec![gva]);
        assert!(bps.remove(&m, gva));
        assert_eq!(bytes(&m), [0x55, 0x48, 0x89, 0xe5]);
        assert!(!bps.remove(&m, gva), "removed twice");
        assert!(bps.is_empty());
    }

    #[test]
    fn reads_show_the_original_bytes_and_writes_keep_the_int3() {
        let m = memory();
        let mut bps = Breakpoints::default();
        bps.insert(&m, 0x1001, 0x2001).unwrap();
        let mut read = [INT3; 4];
        m.read_slice(&mut read, GuestAddress(0x2000)).unwrap();
        assert_eq!(read, [0x55, INT3, 0x89, 0xe5]);
        bps.hide(0x1000, &mut read);
        assert_eq!(read, [0x55, 0x48, 0x89, 0xe5]);
        // A read that starts past it, or ends before it, is left alone.
        let mut after = [INT3; 2];
        bps.hide(0x1002, &mut after);
        assert_eq!(after, [INT3; 2]);
        let mut write = [0x90, 0x90];
        bps.absorb(0x1000, &mut write);
        assert_eq!(write, [0x90, INT3]);
        m.write_slice(&write, GuestAddress(0x2000)).unwrap();
        bps.clear(&m);
        assert_eq!(bytes(&m), [0x90, 0x90, 0x89, 0xe5]);
    }

    #[test]
    fn a_breakpoint_outside_ram_is_refused() {
        let m = memory();
        let mut bps = Breakpoints::default();
        assert_eq!(
            bps.insert(&m, 0x1000, 0xfe00_0000),
            Err(BreakpointError::NotRam {
                gva: 0x1000,
                gpa: 0xfe00_0000
            })
        );
        assert!(bps.is_empty());
    }
}
