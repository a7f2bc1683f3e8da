//! A guest virtual address to a guest physical one, by walking the guest's
//! own page tables in its memory, as the vCPU would: gdb speaks virtual
//! addresses (vmlinux's, perfbed.ko's), guest memory is physical.
//!
//! Modes: paging off (the PVH entry's 32-bit protected mode: identity),
//! 32-bit PAE (3 levels), long mode with 4 or 5 levels (CR4.LA57), with 2 MiB
//! and 1 GiB pages. Legacy 32-bit paging without PAE is not walked (Linux on
//! x86-64 never uses it).
//!
//! Before the kernel turns paging on (gdb stopped at the first instruction),
//! its own addresses have no translation yet: [`Paging::translate_text`]
//! then places them by Linux's kernel image map (`__START_KERNEL_map`), so
//! that `break start_kernel` can be set from the start, as on QEMU's TCG.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_LA57: u64 = 1 << 12;
const EFER_LMA: u64 = 1 << 10;

const PRESENT: u64 = 1;
/// A page-directory (or PDPT) entry that maps a large page.
const PAGE_SIZE_BIT: u64 = 1 << 7;
/// Bits 12-51 of an entry: the next table's or the page's frame.
const FRAME: u64 = 0x000f_ffff_ffff_f000;

/// The registers that say how the vCPU translates (from `kvm_sregs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Paging {
    pub cr0: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub efer: u64,
}

/// Why an address has no translation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PagingError {
    #[error("{gva:#x} is not mapped (no present entry at level {level})")]
    NotMapped { gva: u64, level: u8 },
    #[error("{gva:#x}: the page table at {table:#x} is outside guest RAM")]
    TableOutsideRam { gva: u64, table: u64 },
    #[error("{gva:#x}: 32-bit paging without PAE is not walked")]
    Unsupported { gva: u64 },
}

impl Paging {
    /// Translates `gva` by the tables in `memory`.
    pub fn translate(&self, memory: &GuestMemoryMmap, gva: u64) -> Result<u64, PagingError> {
        if self.cr0 & CR0_PG == 0 {
            return Ok(gva);
        }
        if self.efer & EFER_LMA != 0 {
            let levels = if self.cr4 & CR4_LA57 != 0 { 5 } else { 4 };
            return walk(memory, self.cr3 & FRAME, gva, levels);
        }
        if self.cr4 & CR4_PAE != 0 {
            // The PDPT is 32-byte aligned; its four entries cover 1 GiB each.
            let pdpt = self.cr3 & 0xffff_ffe0;
            let gva32 = gva & 0xffff_ffff;
            let entry = read_entry(memory, pdpt + ((gva32 >> 30) & 3) * 8, gva)?;
            if entry & PRESENT == 0 {
                return Err(PagingError::NotMapped { gva, level: 3 });
            }
            return walk(memory, entry & FRAME, gva32, 2);
        }
        Err(PagingError::Unsupported { gva })
    }
}

/// Linux x86-64's `__START_KERNEL_map`: the kernel image's virtual
/// addresses are this plus its physical ones (a kernel that is not
/// relocated, as perfbed's gdb kernel, has `phys_base` 0).
pub const START_KERNEL_MAP: u64 = 0xffff_ffff_8000_0000;

impl Paging {
    /// [`Paging::translate`], or with paging still off, a kernel image
    /// address placed by [`START_KERNEL_MAP`] (where an `int3` must go to
    /// be hit once the kernel's tables map it).
    pub fn translate_text(&self, memory: &GuestMemoryMmap, gva: u64) -> Result<u64, PagingError> {
        if self.cr0 & CR0_PG == 0 && gva >= START_KERNEL_MAP {
            return Ok(gva - START_KERNEL_MAP);
        }
        self.translate(memory, gva)
    }
}

/// Walks `levels` levels of 512 8-byte entries from `table`.
fn walk(
    memory: &GuestMemoryMmap,
    mut table: u64,
    gva: u64,
    levels: u8,
) -> Result<u64, PagingError> {
    for level in (1..=levels).rev() {
        let shift = 12 + 9 * u32::from(level - 1);
        let entry = read_entry(memory, table + ((gva >> shift) & 0x1ff) * 8, gva)?;
        if entry & PRESENT == 0 {
            return Err(PagingError::NotMapped { gva, level });
        }
        let large = (level == 2 || level == 3) && entry & PAGE_SIZE_BIT != 0;
        if level == 1 || large {
            let offset_mask = (1u64 << shift) - 1;
            return Ok((entry & FRAME & !offset_mask) | (gva & offset_mask));
        }
        table = entry & FRAME;
    }
    unreachable!("level 1 always returns")
}

fn read_entry(memory: &GuestMemoryMmap, at: u64, gva: u64) -> Result<u64, PagingError> {
    memory
        .read_obj::<u64>(GuestAddress(at))
        .map_err(|_| PagingError::TableOutsideRam { gva, table: at })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), (64 * MIB) as usize)]).unwrap()
    }

    fn set(memory: &GuestMemoryMmap, table: u64, index: u64, entry: u64) {
        memory
            .write_obj(entry, GuestAddress(table + index * 8))
            .unwrap();
    }

    fn idx(gva: u64, level: u32) -> u64 {
        (gva >> (12 + 9 * (level - 1))) & 0x1ff
    }

    const LONG_4: Paging = Paging {
        cr0: CR0_PG | 1,
        cr3: 0x10_0000,
        cr4: CR4_PAE,
        efer: EFER_LMA | (1 << 8),
    };

    #[test]
    fn paging_off_is_the_identity() {
        let m = memory();
        let off = Paging {
            cr0: 1,
            ..Paging::default()
        };
        assert_eq!(off.translate(&m, 0x100_0000), Ok(0x100_0000));
    }

    #[test]
    fn kernel_text_is_placed_by_the_image_map_until_paging_is_on() {
        let m = memory();
        let off = Paging {
            cr0: 1,
            ..Paging::default()
        };
        // vmlinux's start_kernel in the gdb kernel, loaded at 16 MiB.
        assert_eq!(
            off.translate_text(&m, 0xffff_ffff_816c_e5a3),
            Ok(0x16c_e5a3)
        );
        assert_eq!(off.translate_text(&m, 0x100_0000), Ok(0x100_0000));
        // Once paging is on, only the tables count.
        assert!(LONG_4.translate_text(&m, 0xffff_ffff_816c_e5a3).is_err());
    }

    #[test]
    fn four_levels_map_a_4k_page_a_2m_page_and_a_1g_page() {
        let m = memory();
        let (pml4, pdpt, pd, pt) = (0x10_0000, 0x10_1000, 0x10_2000, 0x10_3000);
        // The kernel's text mapping: 0xffffffff81000000 and up.
        let text = 0xffff_ffff_8100_0000u64;
        set(&m, pml4, idx(text, 4), pdpt | 3);
        set(&m, pdpt, idx(text, 3), pd | 3);
        // 4 KiB: the page at text + 0x5000 is physical 0x200_0000.
        set(&m, pd, idx(text, 2), pt | 3);
        set(&m, pt, idx(text + 0x5000, 1), 0x200_0000 | 3);
        assert_eq!(LONG_4.translate(&m, text + 0x5123), Ok(0x200_0123));
        // 2 MiB: the next directory entry maps 0x100_0000 as one page.
        set(&m, pd, idx(text, 2) + 1, 0x100_0000 | PAGE_SIZE_BIT | 3);
        assert_eq!(
            LONG_4.translate(&m, text + 2 * MIB + 0x1_2345),
            Ok(0x101_2345)
        );
        // 1 GiB: the direct map's first gigabyte.
        let direct = 0xffff_8880_0000_0000u64;
        set(&m, pml4, idx(direct, 4), 0x10_4000 | 3);
        set(&m, 0x10_4000, idx(direct, 3), PAGE_SIZE_BIT | 3);
        assert_eq!(LONG_4.translate(&m, direct + 0x3fe_dcba), Ok(0x3fe_dcba));
        // Not present at the page table, and at the top.
        assert_eq!(
            LONG_4.translate(&m, text + 0x6000),
            Err(PagingError::NotMapped {
                gva: text + 0x6000,
                level: 1
            })
        );
        assert_eq!(
            LONG_4.translate(&m, 0x4000),
            Err(PagingError::NotMapped {
                gva: 0x4000,
                level: 4
            })
        );
    }

    #[test]
    fn five_levels_add_one_more_table() {
        let m = memory();
        let paging = Paging {
            cr4: CR4_PAE | CR4_LA57,
            ..LONG_4
        };
        let gva = 0xff11_0000_0040_1000u64;
        let tables = [0x10_0000u64, 0x10_1000, 0x10_2000, 0x10_3000, 0x10_4000];
        for level in (1..=5u32).rev() {
            let table = tables[(5 - level) as usize];
            let next = if level == 1 {
                0x30_0000
            } else {
                tables[(6 - level) as usize]
            };
            set(&m, table, idx(gva, level), next | 1);
        }
        assert_eq!(paging.translate(&m, gva + 0x10), Ok(0x30_0010));
        // The same tables walked with 4 levels land elsewhere.
        assert_ne!(LONG_4.translate(&m, gva + 0x10), Ok(0x30_0010));
    }

    #[test]
    fn pae_walks_the_pdpt_then_two_levels() {
        let m = memory();
        let paging = Paging {
            cr0: CR0_PG | 1,
            cr3: 0x10_0020,
            cr4: CR4_PAE,
            efer: 0,
        };
        let gva = 0xc040_2abcu64;
        set(&m, 0x10_0020, 3, 0x10_1000 | 1);
        set(&m, 0x10_1000, (gva >> 21) & 0x1ff, 0x10_2000 | 1);
        set(&m, 0x10_2000, (gva >> 12) & 0x1ff, 0x7000 | 1);
        assert_eq!(paging.translate(&m, gva), Ok(0x7abc));
    }

    #[test]
    fn a_table_outside_ram_and_legacy_paging_are_errors() {
        let m = memory();
        let far = Paging {
            cr3: 0x1_0000_0000,
            ..LONG_4
        };
        assert!(matches!(
            far.translate(&m, 0x1000),
            Err(PagingError::TableOutsideRam { .. })
        ));
        let legacy = Paging {
            cr0: CR0_PG | 1,
            ..Paging::default()
        };
        assert_eq!(
            legacy.translate(&m, 0x1000),
            Err(PagingError::Unsupported { gva: 0x1000 })
        );
    }
}
