//! The boot CPU's initial state for each boot protocol, and what every vCPU
//! gets: MSRs and the local APIC's LINT pins.
//!
//! The values are pure data built here (and unit-tested); `vcpu::mod`
//! hands them to KVM.

use kvm_bindings::{kvm_fpu, kvm_lapic_state, kvm_msr_entry, kvm_regs, kvm_segment, kvm_sregs};

use crate::boot::BootEntry;

const CR0_PE: u64 = 1;
const CR0_ET: u64 = 1 << 4;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// GDT slots.
const CODE_SLOT: u16 = 1;
const DATA_SLOT: u16 = 2;
const TSS_SLOT: u16 = 3;

/// Stack for the bzImage entry (below the zero page).
const BOOT_STACK: u64 = 0x8ff0;

/// A GDT descriptor from access/flags bits (`0xF0FF` mask: flags in the
/// high nibble, access byte low), base and 20-bit limit.
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    let (flags, base, limit) = (flags as u64, base as u64, limit as u64);
    ((base & 0xff00_0000) << 32)
        | ((flags & 0xf0ff) << 40)
        | ((limit & 0x000f_0000) << 32)
        | ((base & 0x00ff_ffff) << 16)
        | (limit & 0xffff)
}

/// The GDT the boot CPU starts with: null, code (32- or 64-bit), data, TSS.
pub fn gdt(long_mode: bool) -> [u64; 4] {
    let code = if long_mode { 0xa09b } else { 0xc09b };
    [
        0,
        gdt_entry(code, 0, 0xfffff),
        gdt_entry(0xc093, 0, 0xfffff),
        gdt_entry(0x808b, 0, 0xfffff),
    ]
}

/// The segment register KVM needs for GDT slot `slot` holding `entry`.
pub fn segment(slot: u16, entry: u64) -> kvm_segment {
    let granular = (entry >> 55) & 1 == 1;
    let raw_limit = ((entry & 0xffff) | (((entry >> 48) & 0xf) << 16)) as u32;
    kvm_segment {
        base: ((entry >> 16) & 0xff_ffff) | (((entry >> 56) & 0xff) << 24),
        limit: if granular {
            (raw_limit << 12) | 0xfff
        } else {
            raw_limit
        },
        selector: slot * 8,
        type_: ((entry >> 40) & 0xf) as u8,
        s: ((entry >> 44) & 1) as u8,
        dpl: ((entry >> 45) & 3) as u8,
        present: ((entry >> 47) & 1) as u8,
        avl: ((entry >> 52) & 1) as u8,
        l: ((entry >> 53) & 1) as u8,
        db: ((entry >> 54) & 1) as u8,
        g: granular as u8,
        unusable: 0,
        padding: 0,
    }
}

/// Fills the special registers for `entry` into `sregs` (as read from KVM,
/// so the rest keeps KVM's reset values). The GDT must be at `gdt_addr`.
pub fn boot_sregs(sregs: &mut kvm_sregs, entry: &BootEntry, gdt_addr: u64, idt_addr: u64) {
    let long_mode = matches!(entry, BootEntry::Linux64 { .. });
    let table = gdt(long_mode);
    let code = segment(CODE_SLOT, table[CODE_SLOT as usize]);
    let data = segment(DATA_SLOT, table[DATA_SLOT as usize]);
    sregs.gdt.base = gdt_addr;
    sregs.gdt.limit = (std::mem::size_of_val(&table) - 1) as u16;
    sregs.idt.base = idt_addr;
    sregs.idt.limit = 7;
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = segment(TSS_SLOT, table[TSS_SLOT as usize]);
    match *entry {
        BootEntry::Pvh { .. } => {
            sregs.cr0 = CR0_PE | CR0_ET;
            sregs.cr4 = 0;
            sregs.efer = 0;
        }
        BootEntry::Linux64 { pml4, .. } => {
            sregs.cr3 = pml4;
            sregs.cr4 |= CR4_PAE;
            sregs.cr0 = CR0_PE | CR0_ET | CR0_PG;
            sregs.efer |= EFER_LME | EFER_LMA;
        }
    }
}

/// The general registers at the first instruction.
pub fn boot_regs(entry: &BootEntry) -> kvm_regs {
    let mut regs = kvm_regs {
        rflags: 0x2,
        ..Default::default()
    };
    match *entry {
        BootEntry::Pvh { entry, start_info } => {
            regs.rip = entry;
            regs.rbx = start_info;
        }
        BootEntry::Linux64 {
            entry, zero_page, ..
        } => {
            regs.rip = entry;
            regs.rsi = zero_page;
            regs.rsp = BOOT_STACK;
            regs.rbp = BOOT_STACK;
        }
    }
    regs
}

/// x87 and SSE control words as after a reset.
pub fn boot_fpu() -> kvm_fpu {
    kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    }
}

const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
const MISC_ENABLE_FAST_STRING: u64 = 1;

/// MSRs every vCPU starts with: the syscall MSRs cleared and fast strings on.
pub fn boot_msrs() -> Vec<kvm_msr_entry> {
    let entry = |index, data| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    };
    vec![
        entry(MSR_IA32_SYSENTER_CS, 0),
        entry(MSR_IA32_SYSENTER_ESP, 0),
        entry(MSR_IA32_SYSENTER_EIP, 0),
        entry(MSR_STAR, 0),
        entry(MSR_LSTAR, 0),
        entry(MSR_CSTAR, 0),
        entry(MSR_SYSCALL_MASK, 0),
        entry(MSR_KERNEL_GS_BASE, 0),
        entry(MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
    ]
}

const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const DELIVERY_MODE_NMI: u32 = 0x4;
const DELIVERY_MODE_EXTINT: u32 = 0x7;

fn lapic_reg(lapic: &kvm_lapic_state, at: usize) -> u32 {
    let b = |i: usize| lapic.regs[at + i] as u8;
    u32::from_le_bytes([b(0), b(1), b(2), b(3)])
}

fn set_lapic_reg(lapic: &mut kvm_lapic_state, at: usize, value: u32) {
    for (i, byte) in value.to_le_bytes().iter().enumerate() {
        lapic.regs[at + i] = *byte as _;
    }
}

/// LINT0 as ExtINT (the 8259) and LINT1 as NMI, as the MP table says.
pub fn set_lint(lapic: &mut kvm_lapic_state) {
    let with_mode = |value: u32, mode: u32| (value & !0x700) | (mode << 8);
    let lvt0 = lapic_reg(lapic, APIC_LVT0);
    set_lapic_reg(lapic, APIC_LVT0, with_mode(lvt0, DELIVERY_MODE_EXTINT));
    let lvt1 = lapic_reg(lapic, APIC_LVT1);
    set_lapic_reg(lapic, APIC_LVT1, with_mode(lvt1, DELIVERY_MODE_NMI));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdt_entries_decode_to_flat_segments() {
        for long_mode in [false, true] {
            let table = gdt(long_mode);
            let code = segment(1, table[1]);
            assert_eq!((code.base, code.limit, code.selector), (0, 0xffff_ffff, 8));
            assert_eq!((code.type_, code.s, code.present, code.g), (0xb, 1, 1, 1));
            assert_eq!((code.l, code.db), if long_mode { (1, 0) } else { (0, 1) });
            let data = segment(2, table[2]);
            assert_eq!((data.type_, data.db, data.selector), (0x3, 1, 16));
            let tss = segment(3, table[3]);
            assert_eq!((tss.type_, tss.s), (0xb, 0));
        }
        assert_eq!(gdt_entry(0xc09b, 0x1234_5678, 0xabcde) >> 56, 0x12);
        assert_eq!(
            segment(1, gdt_entry(0x409b, 0x1234_5678, 0xabcde)).base,
            0x1234_5678
        );
        assert_eq!(segment(1, gdt_entry(0x409b, 0, 0xabcde)).limit, 0xabcde);
    }

    #[test]
    fn pvh_starts_in_protected_mode_with_the_start_info() {
        let entry = BootEntry::Pvh {
            entry: 0x100_0000,
            start_info: 0x6000,
        };
        let mut sregs = kvm_sregs::default();
        boot_sregs(&mut sregs, &entry, 0x500, 0x520);
        assert_eq!(sregs.cr0 & (CR0_PE | CR0_PG), CR0_PE);
        assert_eq!(sregs.efer & EFER_LME, 0);
        assert_eq!((sregs.gdt.base, sregs.gdt.limit), (0x500, 31));
        assert_eq!(sregs.cs.db, 1);
        let regs = boot_regs(&entry);
        assert_eq!((regs.rip, regs.rbx, regs.rflags), (0x100_0000, 0x6000, 2));
    }

    #[test]
    fn bzimage_starts_in_long_mode_with_the_zero_page() {
        let entry = BootEntry::Linux64 {
            entry: 0x100_0200,
            zero_page: 0x7000,
            pml4: 0x9000,
        };
        let mut sregs = kvm_sregs::default();
        boot_sregs(&mut sregs, &entry, 0x500, 0x520);
        assert_eq!(sregs.cr3, 0x9000);
        assert_ne!(sregs.cr0 & CR0_PG, 0);
        assert_ne!(sregs.cr4 & CR4_PAE, 0);
        assert_eq!(sregs.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_eq!(sregs.cs.l, 1);
        let regs = boot_regs(&entry);
        assert_eq!((regs.rip, regs.rsi), (0x100_0200, 0x7000));
    }

    #[test]
    fn lint_pins_get_extint_and_nmi() {
        let mut lapic = kvm_lapic_state { regs: [0; 1024] };
        set_lapic_reg(&mut lapic, APIC_LVT0, 0x0001_0700 | 0x30);
        set_lint(&mut lapic);
        assert_eq!(lapic_reg(&lapic, APIC_LVT0), 0x0001_0730);
        assert_eq!(lapic_reg(&lapic, APIC_LVT1), 0x400);
    }

    #[test]
    fn msrs_enable_fast_strings() {
        let msrs = boot_msrs();
        assert!(msrs
            .iter()
            .any(|m| m.index == MSR_IA32_MISC_ENABLE && m.data == 1));
        assert!(msrs
            .iter()
            .filter(|m| m.index != MSR_IA32_MISC_ENABLE)
            .all(|m| m.data == 0));
    }
}
