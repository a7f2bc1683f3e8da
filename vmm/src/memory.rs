//! The guest's physical address space: where RAM, the boot structures and
//! the devices sit, and the guest memory itself.
//!
//! ```text
//! 0x0000_0500  GDT                      0x0009_fc00  MP table (reserved to 640 KiB)
//! 0x0000_6000  PVH start info + memmap  0x0010_0000  kernel (1 MiB)
//! 0x0000_7000  bzImage zero page        ...          initramfs, at the top of low RAM
//! 0x0000_9000  page tables (bzImage)
//! 0x0002_0000  kernel command line      0xc000_0000  MMIO hole (1 GiB) up to 4 GiB:
//!     0xfe00_0000 perfbed device, 0xfeb0_0000 virtio-mmio, 0xfec0_0000 IOAPIC,
//!     0xfee0_0000 local APIC; RAM that does not fit below the hole goes above 4 GiB
//! ```

use vm_memory::{GuestAddress, GuestMemoryMmap};

pub const GDT_ADDR: u64 = 0x500;
pub const IDT_ADDR: u64 = 0x520;
pub const PVH_START_INFO_ADDR: u64 = 0x6000;
pub const PVH_MODLIST_ADDR: u64 = 0x6040;
pub const PVH_MEMMAP_ADDR: u64 = 0x6080;
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
/// Identity-mapping page tables for a bzImage's 64-bit entry (first 1 GiB).
pub const PML4_ADDR: u64 = 0x9000;
pub const PDPT_ADDR: u64 = 0xa000;
pub const PD_ADDR: u64 = 0xb000;
pub const CMDLINE_ADDR: u64 = 0x2_0000;
/// The x86 kernel's COMMAND_LINE_SIZE.
pub const CMDLINE_MAX: usize = 2048;
/// The MP configuration table (reserved up to [`BASE_MEMORY_END`]): the
/// 4 KiB below the end of base memory, room for 140 CPU entries.
pub const MPTABLE_ADDR: u64 = 0x9_f000;
/// The MP floating pointer: the start of the last KiB of base memory, where
/// the kernel scans (`smp_scan_config(639 * 0x400, ..)`); it points to the
/// table, which may be anywhere.
pub const MP_FLOATING_ADDR: u64 = 0x9_fc00;
/// End of base memory (the legacy VGA hole and BIOS area follow).
pub const BASE_MEMORY_END: u64 = 0xa_0000;
/// Where high memory, and the kernel, start.
pub const HIMEM_START: u64 = 0x10_0000;
/// Start of the MMIO hole below 4 GiB.
pub const MMIO_HOLE_START: u64 = 0xc000_0000;
pub const FOUR_GIB: u64 = 1 << 32;

/// The monitoring device's registers: the same address as the QEMU host's.
pub const PERFBED_DEVICE_BASE: u64 = 0xfe00_0000;
/// The virtio-mmio transports, 0x200 bytes each (as on QEMU's microvm).
pub const VIRTIO_MMIO_BASE: u64 = 0xfeb0_0000;
pub const VIRTIO_MMIO_SIZE: u64 = 0x200;
pub const IOAPIC_ADDR: u64 = 0xfec0_0000;
pub const LAPIC_ADDR: u64 = 0xfee0_0000;

/// KVM's TSS and identity-map pages (needed on Intel), at the top of the hole.
pub const KVM_TSS_ADDR: u64 = 0xfffb_d000;
pub const KVM_IDENTITY_MAP_ADDR: u64 = 0xfffb_c000;

const MIB: u64 = 1 << 20;

/// Why the guest memory could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("mapping {mib} MiB of guest memory: {0}", mib = .1)]
    Map(#[source] vm_memory::mmap::FromRangesError, u32),
}

/// The guest's RAM ranges for `memory_mib` MiB: below the MMIO hole, and the
/// rest above 4 GiB.
pub fn ram_ranges(memory_mib: u32) -> Vec<(GuestAddress, u64)> {
    let bytes = u64::from(memory_mib) * MIB;
    if bytes <= MMIO_HOLE_START {
        vec![(GuestAddress(0), bytes)]
    } else {
        vec![
            (GuestAddress(0), MMIO_HOLE_START),
            (GuestAddress(FOUR_GIB), bytes - MMIO_HOLE_START),
        ]
    }
}

/// End of the RAM below the MMIO hole, where the initramfs goes.
pub fn low_ram_end(memory_mib: u32) -> u64 {
    (u64::from(memory_mib) * MIB).min(MMIO_HOLE_START)
}

/// Maps the guest's RAM (anonymous, private, untouched until used).
pub fn create_guest_memory(memory_mib: u32) -> Result<GuestMemoryMmap, MemoryError> {
    let ranges: Vec<(GuestAddress, usize)> = ram_ranges(memory_mib)
        .into_iter()
        .map(|(start, len)| (start, len as usize))
        .collect();
    GuestMemoryMmap::from_ranges(&ranges).map_err(|e| MemoryError::Map(e, memory_mib))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

    #[test]
    fn small_guests_fit_below_the_hole() {
        assert_eq!(ram_ranges(512), vec![(GuestAddress(0), 512 * MIB)]);
        assert_eq!(low_ram_end(512), 512 * MIB);
    }

    #[test]
    fn big_guests_continue_above_4_gib() {
        let ranges = ram_ranges(4096);
        assert_eq!(ranges[0], (GuestAddress(0), MMIO_HOLE_START));
        assert_eq!(
            ranges[1],
            (GuestAddress(FOUR_GIB), 4096 * MIB - MMIO_HOLE_START)
        );
        assert_eq!(ranges.iter().map(|r| r.1).sum::<u64>(), 4096 * MIB);
        assert_eq!(low_ram_end(4096), MMIO_HOLE_START);
    }

    #[test]
    fn fixed_addresses_do_not_collide() {
        let boot = [
            GDT_ADDR,
            IDT_ADDR,
            PVH_START_INFO_ADDR,
            PVH_MODLIST_ADDR,
            PVH_MEMMAP_ADDR,
            ZERO_PAGE_ADDR,
            PML4_ADDR,
            PDPT_ADDR,
            PD_ADDR,
            CMDLINE_ADDR,
        ];
        assert!(boot.windows(2).all(|w| w[0] < w[1]));
        assert!(CMDLINE_ADDR + CMDLINE_MAX as u64 <= MPTABLE_ADDR);
        let mmio = [
            PERFBED_DEVICE_BASE,
            VIRTIO_MMIO_BASE,
            IOAPIC_ADDR,
            LAPIC_ADDR,
            KVM_IDENTITY_MAP_ADDR,
            KVM_TSS_ADDR,
        ];
        assert!(mmio.windows(2).all(|w| w[0] < w[1]));
        assert!(mmio
            .iter()
            .all(|&a| (MMIO_HOLE_START..FOUR_GIB).contains(&a)));
        // The largest device the register map allows ends before virtio-mmio.
        use perfbed_device::regs;
        let largest = regs::device_size(regs::MAX_DOMAINS, regs::MAX_RMIDS, regs::MAX_SLOTS);
        assert!(
            PERFBED_DEVICE_BASE + largest <= VIRTIO_MMIO_BASE,
            "{largest:#x}"
        );
    }

    #[test]
    fn memory_is_mapped_as_laid_out() {
        let memory = create_guest_memory(64).unwrap();
        assert_eq!(memory.num_regions(), 1);
        let region = memory.iter().next().unwrap();
        assert_eq!(region.len(), 64 * MIB);
    }
}
