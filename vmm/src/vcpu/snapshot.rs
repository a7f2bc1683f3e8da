//! A vCPU's state as the guest left it (general, segment and control
//! registers, local APIC, pending events), and its text in the format of
//! QEMU's `info registers -a` and `info lapic N`, so that xtask's one
//! reader (`xtask/src/host/cpu_state.rs`) decodes either host's capture.
//!
//! A snapshot is taken on the vCPU's own thread between two entries
//! (`Vcpu::snapshot`, asked through `handle::VcpuControl::snapshot`): KVM's
//! `GET` ioctls on a vCPU that is not in `KVM_RUN`, no host I/O. The text is
//! made and written elsewhere (`handle::capture`).

use std::fmt::Write as _;

use kvm_bindings::{
    kvm_lapic_state, kvm_mp_state, kvm_regs, kvm_segment, kvm_sregs, kvm_vcpu_events,
};

/// What a capture of every vCPU starts with (the text QEMU's monitor
/// answers to the same command starts its section with `### `).
pub const REGISTERS_HEADING: &str = "### info registers -a";
/// The lines that frame a capture in perfbed-vmm's stderr, for a harness
/// that reads it out of the log.
pub const BEGIN_MARKER: &str = "perfbed-vmm: vcpu state begin";
pub const END_MARKER: &str = "perfbed-vmm: vcpu state end";

/// One vCPU's state.
#[derive(Debug, Clone, Default)]
pub struct VcpuSnapshot {
    pub index: u8,
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    pub events: kvm_vcpu_events,
    pub lapic: kvm_lapic_state,
    pub mp_state: kvm_mp_state,
}

/// Local APIC register offsets (Intel SDM vol. 3, table 11-1).
mod apic {
    pub const TPR: usize = 0x80;
    pub const APR: usize = 0x90;
    pub const PPR: usize = 0xa0;
    pub const LDR: usize = 0xd0;
    pub const DFR: usize = 0xe0;
    pub const SPIV: usize = 0xf0;
    pub const ISR: usize = 0x100;
    pub const TMR: usize = 0x180;
    pub const IRR: usize = 0x200;
    pub const ESR: usize = 0x280;
    pub const ICR: usize = 0x300;
    pub const ICR2: usize = 0x310;
    pub const LVTT: usize = 0x320;
    pub const LVTTHMR: usize = 0x330;
    pub const LVTPC: usize = 0x340;
    pub const LVT0: usize = 0x350;
    pub const LVT1: usize = 0x360;
    pub const LVTERR: usize = 0x370;
    pub const TMICT: usize = 0x380;
    pub const TMCCT: usize = 0x390;
    pub const TDCR: usize = 0x3e0;
}

/// A 32-bit local APIC register.
fn reg(lapic: &kvm_lapic_state, offset: usize) -> u32 {
    let b = |i: usize| lapic.regs[offset + i] as u8;
    u32::from_le_bytes([b(0), b(1), b(2), b(3)])
}

/// The vectors set in a 256-bit register (ISR, IRR, TMR: eight words 16
/// bytes apart).
fn vectors(lapic: &kvm_lapic_state, base: usize) -> Vec<u8> {
    (0..=255u8)
        .filter(|&v| reg(lapic, base + usize::from(v / 32) * 0x10) & (1 << (v % 32)) != 0)
        .collect()
}

fn vector_list(vectors: &[u8]) -> String {
    if vectors.is_empty() {
        return "(none)".into();
    }
    vectors.iter().map(|v| format!("{v} ")).collect()
}

/// An LVT entry as QEMU prints it.
fn lvt(out: &mut String, name: &str, value: u32, timer: bool) {
    let mode = match (value >> 8) & 7 {
        0 => "Fixed ",
        2 => "SMI   ",
        4 => "NMI   ",
        5 => "INIT  ",
        7 => "ExtINT",
        _ => "(rsvd)",
    };
    let timer_mode = match (value >> 17) & 3 {
        0 => "one-shot    ",
        1 => "periodic    ",
        2 => "tsc-deadline",
        _ => "(rsvd)      ",
    };
    let _ = writeln!(
        out,
        "{name}\t 0x{value:08x} {} {} {} {} {mode} (vec {})",
        if value & (1 << 13) != 0 {
            "active-lo"
        } else {
            "active-hi"
        },
        if value & (1 << 15) != 0 {
            "level"
        } else {
            "edge "
        },
        if value & (1 << 16) != 0 {
            "masked"
        } else {
            "      "
        },
        if timer { timer_mode } else { "            " },
        value & 0xff
    );
}

/// A segment as QEMU prints it: selector, base, limit, the descriptor's
/// flags word (type, S, DPL, P, AVL, L, D/B, G in their descriptor bits).
fn segment(out: &mut String, name: &str, s: &kvm_segment) {
    let flags = (u32::from(s.type_) << 8)
        | (u32::from(s.s) << 12)
        | (u32::from(s.dpl) << 13)
        | (u32::from(s.present) << 15)
        | (u32::from(s.avl) << 20)
        | (u32::from(s.l) << 21)
        | (u32::from(s.db) << 22)
        | (u32::from(s.g) << 23);
    let _ = writeln!(
        out,
        "{name}={:04x} {:016x} {:08x} {flags:08x}",
        s.selector, s.base, s.limit
    );
}

/// RFLAGS' arithmetic flags as QEMU shows them (`[D O S Z A P C]`).
fn eflags_letters(rflags: u64) -> String {
    [
        (10, 'D'),
        (11, 'O'),
        (7, 'S'),
        (6, 'Z'),
        (4, 'A'),
        (2, 'P'),
        (0, 'C'),
    ]
    .iter()
    .map(|&(bit, c)| if rflags & (1 << bit) != 0 { c } else { '-' })
    .collect()
}

/// One vCPU's `info registers` block: `CPU#N` and its lines.
fn registers(out: &mut String, s: &VcpuSnapshot) {
    let r = &s.regs;
    let sr = &s.sregs;
    let _ = writeln!(out, "CPU#{}", s.index);
    let _ = writeln!(
        out,
        "RAX={:016x} RBX={:016x} RCX={:016x} RDX={:016x}",
        r.rax, r.rbx, r.rcx, r.rdx
    );
    let _ = writeln!(
        out,
        "RSI={:016x} RDI={:016x} RBP={:016x} RSP={:016x}",
        r.rsi, r.rdi, r.rbp, r.rsp
    );
    let _ = writeln!(
        out,
        "R8 ={:016x} R9 ={:016x} R10={:016x} R11={:016x}",
        r.r8, r.r9, r.r10, r.r11
    );
    let _ = writeln!(
        out,
        "R12={:016x} R13={:016x} R14={:016x} R15={:016x}",
        r.r12, r.r13, r.r14, r.r15
    );
    let halted = s.mp_state.mp_state == kvm_bindings::KVM_MP_STATE_HALTED;
    let _ = writeln!(
        out,
        "RIP={:016x} RFL={:08x} [{}] CPL={} II={} A20=1 SMM={} HLT={}",
        r.rip,
        r.rflags,
        eflags_letters(r.rflags),
        sr.cs.dpl,
        s.events.interrupt.shadow & 1,
        s.events.smi.smm,
        u8::from(halted)
    );
    for (name, seg) in [
        ("ES ", &sr.es),
        ("CS ", &sr.cs),
        ("SS ", &sr.ss),
        ("DS ", &sr.ds),
        ("FS ", &sr.fs),
        ("GS ", &sr.gs),
        ("LDT", &sr.ldt),
        ("TR ", &sr.tr),
    ] {
        segment(out, name, seg);
    }
    let _ = writeln!(out, "GDT=     {:016x} {:08x}", sr.gdt.base, sr.gdt.limit);
    let _ = writeln!(out, "IDT=     {:016x} {:08x}", sr.idt.base, sr.idt.limit);
    let _ = writeln!(
        out,
        "CR0={:08x} CR2={:016x} CR3={:016x} CR4={:08x}",
        sr.cr0, sr.cr2, sr.cr3, sr.cr4
    );
    let _ = writeln!(
        out,
        "EFER={:016x} APIC_BASE={:016x} CR8={:x}",
        sr.efer, sr.apic_base, sr.cr8
    );
    let e = &s.events;
    // perfbed-vmm's own line, as perfbed's QEMU adds its INTREQ line: what
    // KVM holds to deliver at the next entry (KVM_GET_VCPU_EVENTS).
    let _ = writeln!(
        out,
        "EVENTS= MP_STATE={} EXC_INJ={} EXC_PEND={} EXC_NR={} EXC_ERR={:x} INT_INJ={} INT_NR={} INT_SOFT={} SHADOW={} NMI_INJ={} NMI_PEND={} NMI_MASKED={} SMI_PEND={}",
        s.mp_state.mp_state,
        e.exception.injected,
        e.exception.pending,
        e.exception.nr,
        e.exception.error_code,
        e.interrupt.injected,
        e.interrupt.nr,
        e.interrupt.soft,
        e.interrupt.shadow,
        e.nmi.injected,
        e.nmi.pending,
        e.nmi.masked,
        e.smi.pending
    );
}

/// One vCPU's `info lapic N` answer.
fn local_apic(out: &mut String, s: &VcpuSnapshot) {
    let l = &s.lapic;
    let _ = writeln!(out, "dumping local APIC state for CPU {}\n", s.index);
    for (name, offset, timer) in [
        ("LVT0", apic::LVT0, false),
        ("LVT1", apic::LVT1, false),
        ("LVTPC", apic::LVTPC, false),
        ("LVTERR", apic::LVTERR, false),
        ("LVTTHMR", apic::LVTTHMR, false),
        ("LVTT", apic::LVTT, true),
    ] {
        lvt(out, name, reg(l, offset), timer);
    }
    let dcr = reg(l, apic::TDCR);
    // DCR bits 0, 1 and 3 give the divisor's power of two, 0b111 meaning 1.
    let shift = ((dcr & 3) | ((dcr >> 1) & 4)) + 1;
    let _ = writeln!(
        out,
        "Timer\t DCR=0x{dcr:x} (divide by {}) initial_count = {} current_count = {}",
        if shift == 8 { 1 } else { 1u32 << shift },
        reg(l, apic::TMICT),
        reg(l, apic::TMCCT)
    );
    let spiv = reg(l, apic::SPIV);
    let _ = writeln!(
        out,
        "SPIV\t 0x{spiv:08x} APIC {}, focus={}, spurious vec {}",
        if spiv & (1 << 8) != 0 {
            "enabled"
        } else {
            "disabled"
        },
        if spiv & (1 << 9) != 0 { "off" } else { "on" },
        spiv & 0xff
    );
    let _ = writeln!(out, "ICR\t 0x{:08x}", reg(l, apic::ICR));
    let _ = writeln!(out, "ICR2\t 0x{:08x}\n", reg(l, apic::ICR2));
    let _ = writeln!(out, "ESR\t 0x{:08x}", reg(l, apic::ESR));
    let _ = writeln!(out, "ISR\t {}", vector_list(&vectors(l, apic::ISR)));
    let _ = writeln!(out, "IRR\t {}", vector_list(&vectors(l, apic::IRR)));
    let _ = writeln!(out, "TMR\t {}\n", vector_list(&vectors(l, apic::TMR)));
    let _ = writeln!(
        out,
        "APR 0x{:02x} TPR 0x{:02x} DFR 0x{:02x} LDR 0x{:02x} PPR 0x{:02x}",
        reg(l, apic::APR) & 0xff,
        reg(l, apic::TPR) & 0xff,
        reg(l, apic::DFR) >> 28,
        reg(l, apic::LDR) >> 24,
        reg(l, apic::PPR) & 0xff
    );
}

/// The capture's text: every vCPU's registers under [`REGISTERS_HEADING`],
/// then each one's local APIC under `### info lapic N`; a vCPU whose state
/// could not be read is named with why.
pub fn render(vcpus: &[Result<VcpuSnapshot, String>]) -> String {
    let mut out = format!("{REGISTERS_HEADING}\n");
    for vcpu in vcpus {
        match vcpu {
            Ok(s) => registers(&mut out, s),
            Err(why) => {
                let _ = writeln!(out, "# not read: {why}");
            }
        }
    }
    for s in vcpus.iter().flatten() {
        let _ = writeln!(out, "### info lapic {}", s.index);
        local_apic(&mut out, s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(lapic: &mut kvm_lapic_state, offset: usize, value: u32) {
        for (i, b) in value.to_le_bytes().iter().enumerate() {
            lapic.regs[offset + i] = *b as _;
        }
    }

    /// A vCPU spinning with interrupts off, its timer expired and pending.
    pub fn spinning() -> VcpuSnapshot {
        let mut s = VcpuSnapshot {
            index: 1,
            ..Default::default()
        };
        s.regs.rip = 0xffff_ffff_8100_1234;
        s.regs.rflags = 0x46;
        s.sregs.cs = kvm_segment {
            selector: 0x10,
            type_: 11,
            s: 1,
            present: 1,
            l: 1,
            ..Default::default()
        };
        s.sregs.cr0 = 0x8005_0033;
        s.events.nmi.pending = 1;
        set(&mut s.lapic, apic::LVTT, 0xec);
        set(&mut s.lapic, apic::TMICT, 107_006);
        set(&mut s.lapic, apic::IRR + 7 * 0x10, 1 << (236 - 224));
        set(&mut s.lapic, apic::ISR + 0x10, 1 << 2);
        set(&mut s.lapic, apic::PPR, 0x10);
        set(&mut s.lapic, apic::SPIV, 0x1ff);
        set(&mut s.lapic, apic::LVT0, 0x10700);
        s
    }

    #[test]
    fn a_snapshot_reads_as_qemus_monitor_would_print_it() {
        let text = render(&[Ok(spinning()), Err("vCPU 2 has already ended".into())]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], REGISTERS_HEADING);
        assert_eq!(lines[1], "CPU#1");
        assert!(
            text.contains(
                "RIP=ffffffff81001234 RFL=00000046 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=0\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("CS =0010 0000000000000000 00000000 00209b00\n"),
            "{text}"
        );
        assert!(text.contains("CR0=80050033 "), "{text}");
        assert!(text.contains(" NMI_PEND=1 "), "{text}");
        assert!(
            text.contains("# not read: vCPU 2 has already ended\n"),
            "{text}"
        );
        assert!(text.contains("### info lapic 1\n"), "{text}");
        assert!(
            text.contains(
                "LVTT\t 0x000000ec active-hi edge         one-shot     Fixed  (vec 236)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("LVT0\t 0x00010700 active-hi edge  masked              ExtINT (vec 0)\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "Timer\t DCR=0x0 (divide by 2) initial_count = 107006 current_count = 0\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("IRR\t 236 \n") && text.contains("ISR\t 34 \n"),
            "{text}"
        );
        assert!(text.contains("PPR 0x10\n"), "{text}");
        assert!(text.contains("SPIV\t 0x000001ff APIC enabled"), "{text}");
        // The failed vCPU has no APIC section.
        assert_eq!(text.matches("### info lapic").count(), 1);
    }

    #[test]
    fn the_timer_divisor_follows_the_sdms_table() {
        for (dcr, divisor) in [
            (0b0000, 2),
            (0b0011, 16),
            (0b1000, 32),
            (0b1010, 128),
            (0b1011, 1),
        ] {
            let mut s = spinning();
            set(&mut s.lapic, apic::TDCR, dcr);
            let text = render(&[Ok(s)]);
            assert!(
                text.contains(&format!("(divide by {divisor})")),
                "DCR {dcr:#b}: {text}"
            );
        }
    }
}
