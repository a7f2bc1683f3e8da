//! Puts the kernel, the initramfs and the boot structures into guest memory
//! and says how the boot CPU must start.
//!
//! An ELF `vmlinux` boots through its PVH entry (32-bit protected mode,
//! paging off, `%ebx` = the start info); a bzImage through its 64-bit entry
//! (long mode on identity-mapped page tables, `%rsi` = the zero page).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use linux_loader::cmdline::Cmdline;
use linux_loader::loader::bootparam::boot_params;
use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};
use linux_loader::loader::{load_cmdline, BzImage, Elf, KernelLoader, PvhBootCapability};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::e820::{memory_map, E820Entry};
use super::mptable;
use crate::memory::{
    low_ram_end, CMDLINE_ADDR, HIMEM_START, PDPT_ADDR, PD_ADDR, PML4_ADDR, PVH_MEMMAP_ADDR,
    PVH_MODLIST_ADDR, PVH_START_INFO_ADDR, ZERO_PAGE_ADDR,
};

const XEN_HVM_START_MAGIC: u32 = 0x336e_c578;
const PAGE: u64 = 4096;
/// The bzImage's 64-bit entry is this far into the protected-mode kernel.
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;

/// How the boot CPU starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootEntry {
    /// 32-bit protected mode at `entry`, `%ebx` = `start_info`.
    Pvh { entry: u64, start_info: u64 },
    /// 64-bit long mode at `entry`, `%rsi` = `zero_page`, CR3 = `pml4`.
    Linux64 {
        entry: u64,
        zero_page: u64,
        pml4: u64,
    },
}

/// Why the guest could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("opening {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the kernel image: {0}")]
    Read(#[source] std::io::Error),
    #[error("{0} is neither an ELF vmlinux nor a bzImage")]
    UnknownFormat(String),
    #[error("loading the kernel: {0}")]
    Kernel(#[source] linux_loader::loader::Error),
    #[error("the ELF kernel has no PVH entry note (CONFIG_PVH): it cannot be booted directly")]
    NoPvhEntry,
    #[error("the initramfs ({size} bytes) does not fit between the kernel's end {kernel_end:#x} and the end of low RAM {ram_end:#x}")]
    InitramfsTooLarge {
        size: u64,
        kernel_end: u64,
        ram_end: u64,
    },
    #[error("writing boot data to guest memory: {0}")]
    Memory(#[source] vm_memory::GuestMemoryError),
    #[error("writing the command line: {0}")]
    Cmdline(#[source] linux_loader::loader::Error),
    #[error(transparent)]
    MpTable(#[from] mptable::MpTableError),
}

/// The kernel image's format, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFormat {
    Elf,
    BzImage,
}

/// Tells an ELF from a bzImage (`HdrS` at 0x202), or neither.
pub fn detect_format(head: &[u8]) -> Option<KernelFormat> {
    if head.starts_with(b"\x7fELF") {
        Some(KernelFormat::Elf)
    } else if head.get(0x202..0x206) == Some(b"HdrS") {
        Some(KernelFormat::BzImage)
    } else {
        None
    }
}

/// Where an initramfs of `size` bytes goes: page-aligned at the top of low
/// RAM, above the kernel.
pub fn initramfs_address(size: u64, kernel_end: u64, memory_mib: u32) -> Result<u64, LoadError> {
    let ram_end = low_ram_end(memory_mib);
    let too_large = || LoadError::InitramfsTooLarge {
        size,
        kernel_end,
        ram_end,
    };
    let addr = ram_end.checked_sub(size).ok_or_else(too_large)? & !(PAGE - 1);
    if addr < kernel_end {
        return Err(too_large());
    }
    Ok(addr)
}

/// Where the initramfs landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Initramfs {
    addr: u64,
    size: u64,
}

/// Loads everything the guest boots with.
pub fn load(
    memory: &GuestMemoryMmap,
    memory_mib: u32,
    vcpus: u8,
    kernel_path: &Path,
    initramfs_path: Option<&Path>,
    cmdline: &Cmdline,
) -> Result<BootEntry, LoadError> {
    let open = |path: &Path| {
        File::open(path).map_err(|source| LoadError::Open {
            path: path.display().to_string(),
            source,
        })
    };
    let mut kernel = open(kernel_path)?;
    let mut head = vec![0u8; 0x210];
    let n = kernel.read(&mut head).map_err(LoadError::Read)?;
    head.truncate(n);
    kernel.seek(SeekFrom::Start(0)).map_err(LoadError::Read)?;
    let format = detect_format(&head)
        .ok_or_else(|| LoadError::UnknownFormat(kernel_path.display().to_string()))?;
    let himem = Some(GuestAddress(HIMEM_START));
    let loaded = match format {
        KernelFormat::Elf => Elf::load(memory, None, &mut kernel, himem),
        KernelFormat::BzImage => BzImage::load(memory, None, &mut kernel, himem),
    }
    .map_err(LoadError::Kernel)?;
    let kernel_end = loaded.kernel_load.0 + loaded.kernel_end;

    let initramfs = match initramfs_path {
        Some(path) => {
            let mut file = open(path)?;
            let size = file.metadata().map_err(LoadError::Read)?.len();
            let addr = initramfs_address(size, kernel_end, memory_mib)?;
            memory
                .read_exact_volatile_from(GuestAddress(addr), &mut file, size as usize)
                .map_err(LoadError::Memory)?;
            Some(Initramfs { addr, size })
        }
        None => None,
    };
    load_cmdline(memory, GuestAddress(CMDLINE_ADDR), cmdline).map_err(LoadError::Cmdline)?;
    memory
        .write_slice(&mptable::build(vcpus)?, GuestAddress(mptable::address()))
        .map_err(LoadError::Memory)?;
    let map = memory_map(memory_mib);

    match format {
        KernelFormat::Elf => {
            let PvhBootCapability::PvhEntryPresent(entry) = loaded.pvh_boot_cap else {
                return Err(LoadError::NoPvhEntry);
            };
            write_pvh_start_info(memory, &map, initramfs)?;
            Ok(BootEntry::Pvh {
                entry: entry.0,
                start_info: PVH_START_INFO_ADDR,
            })
        }
        KernelFormat::BzImage => {
            let cmdline_len = cmdline
                .as_cstring()
                .map(|c| c.as_bytes().len())
                .unwrap_or(0);
            write_zero_page(memory, &map, initramfs, loaded.setup_header, cmdline_len)?;
            write_page_tables(memory)?;
            Ok(BootEntry::Linux64 {
                entry: loaded.kernel_load.0 + BZIMAGE_64BIT_ENTRY_OFFSET,
                zero_page: ZERO_PAGE_ADDR,
                pml4: PML4_ADDR,
            })
        }
    }
}

fn write_pvh_start_info(
    memory: &GuestMemoryMmap,
    map: &[E820Entry],
    initramfs: Option<Initramfs>,
) -> Result<(), LoadError> {
    let write = |result: Result<(), vm_memory::GuestMemoryError>| result.map_err(LoadError::Memory);
    let mut info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC,
        version: 1,
        cmdline_paddr: CMDLINE_ADDR,
        memmap_paddr: PVH_MEMMAP_ADDR,
        memmap_entries: map.len() as u32,
        ..Default::default()
    };
    if let Some(initramfs) = initramfs {
        let module = hvm_modlist_entry {
            paddr: initramfs.addr,
            size: initramfs.size,
            ..Default::default()
        };
        write(memory.write_obj(module, GuestAddress(PVH_MODLIST_ADDR)))?;
        info.nr_modules = 1;
        info.modlist_paddr = PVH_MODLIST_ADDR;
    }
    for (i, e) in map.iter().enumerate() {
        let entry = hvm_memmap_table_entry {
            addr: e.addr,
            size: e.size,
            type_: e.kind as u32,
            reserved: 0,
        };
        let at = PVH_MEMMAP_ADDR + (i * std::mem::size_of::<hvm_memmap_table_entry>()) as u64;
        write(memory.write_obj(entry, GuestAddress(at)))?;
    }
    write(memory.write_obj(info, GuestAddress(PVH_START_INFO_ADDR)))
}

fn write_zero_page(
    memory: &GuestMemoryMmap,
    map: &[E820Entry],
    initramfs: Option<Initramfs>,
    header: Option<linux_loader::loader::bootparam::setup_header>,
    cmdline_len: usize,
) -> Result<(), LoadError> {
    let mut params = boot_params::default();
    if let Some(header) = header {
        params.hdr = header;
    }
    params.hdr.type_of_loader = 0xff;
    params.hdr.boot_flag = 0xaa55;
    params.hdr.header = u32::from_le_bytes(*b"HdrS");
    params.hdr.cmd_line_ptr = CMDLINE_ADDR as u32;
    params.hdr.cmdline_size = cmdline_len as u32;
    params.hdr.kernel_alignment = 0x0100_0000;
    if let Some(initramfs) = initramfs {
        params.hdr.ramdisk_image = initramfs.addr as u32;
        params.hdr.ramdisk_size = initramfs.size as u32;
    }
    for (slot, e) in params.e820_table.iter_mut().zip(map) {
        slot.addr = e.addr;
        slot.size = e.size;
        slot.r#type = e.kind as u32;
    }
    params.e820_entries = map.len().min(params.e820_table.len()) as u8;
    memory
        .write_obj(params, GuestAddress(ZERO_PAGE_ADDR))
        .map_err(LoadError::Memory)
}

/// Identity-maps the first GiB with 2 MiB pages, enough for the kernel's
/// 64-bit entry to run until it builds its own tables.
fn write_page_tables(memory: &GuestMemoryMmap) -> Result<(), LoadError> {
    const PRESENT_RW: u64 = 0x3;
    const HUGE: u64 = 0x80;
    let write = |value: u64, at: u64| {
        memory
            .write_obj(value, GuestAddress(at))
            .map_err(LoadError::Memory)
    };
    write(PDPT_ADDR | PRESENT_RW, PML4_ADDR)?;
    write(PD_ADDR | PRESENT_RW, PDPT_ADDR)?;
    for i in 0..512u64 {
        write((i << 21) | PRESENT_RW | HUGE, PD_ADDR + i * 8)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_told_apart() {
        assert_eq!(detect_format(b"\x7fELF\x02\x01"), Some(KernelFormat::Elf));
        let mut bz = vec![0u8; 0x210];
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        assert_eq!(detect_format(&bz), Some(KernelFormat::BzImage));
        assert_eq!(detect_format(b"MZ"), None);
        assert_eq!(detect_format(b""), None);
    }

    #[test]
    fn the_initramfs_goes_page_aligned_at_the_top() {
        let addr = initramfs_address(10_000, 0x200_0000, 128).unwrap();
        assert_eq!(addr % PAGE, 0);
        assert!(addr + 10_000 <= 128u64 << 20);
        assert!((128u64 << 20) - addr - 10_000 < PAGE);
        assert!(matches!(
            initramfs_address(200 << 20, 0x200_0000, 128),
            Err(LoadError::InitramfsTooLarge { .. })
        ));
        assert!(matches!(
            initramfs_address(120 << 20, 0x200_0000, 128),
            Err(LoadError::InitramfsTooLarge { .. })
        ));
    }

    #[test]
    fn an_unbootable_file_is_named() {
        let dir = std::env::temp_dir().join(format!("perfbed-vmm-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("not-a-kernel");
        std::fs::write(&path, b"hello").unwrap();
        let memory = crate::memory::create_guest_memory(64).unwrap();
        let cmdline = Cmdline::new(64).unwrap();
        let err = load(&memory, 64, 1, &path, None, &cmdline).unwrap_err();
        assert!(matches!(err, LoadError::UnknownFormat(_)), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn page_tables_map_the_first_gib() {
        let memory = crate::memory::create_guest_memory(64).unwrap();
        write_page_tables(&memory).unwrap();
        let pml4: u64 = memory.read_obj(GuestAddress(PML4_ADDR)).unwrap();
        assert_eq!(pml4 & !0xfff, PDPT_ADDR);
        let last: u64 = memory.read_obj(GuestAddress(PD_ADDR + 511 * 8)).unwrap();
        assert_eq!(last & !0xfff, 511 << 21);
    }
}
