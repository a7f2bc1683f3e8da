//! KVM's registers as gdb's x86-64 core + SSE set (`gdbstub_arch`'s
//! `X86_64CoreRegs`, gdb's `64bit-core.xml` and `64bit-sse.xml`), and back.
//!
//! gdb's order of the general registers is not KVM's: rax, rbx, rcx, rdx,
//! rsi, rdi, rbp, rsp, r8-r15. The segment registers are the selectors
//! (writes to them are ignored: a selector alone cannot reload a
//! descriptor). KVM's FPU tag word is the abridged one (a bit per register,
//! set when valid); gdb's is the full one, two bits per register, where 3 is
//! empty: a valid register is given as 0 (valid).

use gdbstub_arch::x86::reg::{X86SegmentRegs, X86_64CoreRegs, X87FpuInternalRegs};
use kvm_bindings::{kvm_fpu, kvm_regs, kvm_sregs};

/// gdb's registers from the vCPU's.
pub fn to_gdb(regs: &kvm_regs, sregs: &kvm_sregs, fpu: &kvm_fpu) -> X86_64CoreRegs {
    let mut st = [[0u8; 10]; 8];
    for (to, from) in st.iter_mut().zip(fpu.fpr.iter()) {
        to.copy_from_slice(&from[..10]);
    }
    X86_64CoreRegs {
        regs: [
            regs.rax, regs.rbx, regs.rcx, regs.rdx, regs.rsi, regs.rdi, regs.rbp, regs.rsp,
            regs.r8, regs.r9, regs.r10, regs.r11, regs.r12, regs.r13, regs.r14, regs.r15,
        ],
        eflags: regs.rflags as u32,
        rip: regs.rip,
        segments: X86SegmentRegs {
            cs: u32::from(sregs.cs.selector),
            ss: u32::from(sregs.ss.selector),
            ds: u32::from(sregs.ds.selector),
            es: u32::from(sregs.es.selector),
            fs: u32::from(sregs.fs.selector),
            gs: u32::from(sregs.gs.selector),
        },
        st,
        fpu: X87FpuInternalRegs {
            fctrl: u32::from(fpu.fcw),
            fstat: u32::from(fpu.fsw),
            ftag: full_tag_word(fpu.ftwx),
            fiseg: (fpu.last_ip >> 32) as u32,
            fioff: fpu.last_ip as u32,
            foseg: (fpu.last_dp >> 32) as u32,
            fooff: fpu.last_dp as u32,
            fop: u32::from(fpu.last_opcode),
        },
        xmm: fpu.xmm.map(u128::from_le_bytes),
        mxcsr: fpu.mxcsr,
    }
}

/// Writes gdb's registers into the vCPU's (the general registers, RIP,
/// RFLAGS's low half, the x87 and SSE state).
pub fn from_gdb(gdb: &X86_64CoreRegs, regs: &mut kvm_regs, fpu: &mut kvm_fpu) {
    let r = &gdb.regs;
    (regs.rax, regs.rbx, regs.rcx, regs.rdx) = (r[0], r[1], r[2], r[3]);
    (regs.rsi, regs.rdi, regs.rbp, regs.rsp) = (r[4], r[5], r[6], r[7]);
    (regs.r8, regs.r9, regs.r10, regs.r11) = (r[8], r[9], r[10], r[11]);
    (regs.r12, regs.r13, regs.r14, regs.r15) = (r[12], r[13], r[14], r[15]);
    regs.rip = gdb.rip;
    regs.rflags = (regs.rflags & !0xffff_ffff) | u64::from(gdb.eflags);
    for (to, from) in fpu.fpr.iter_mut().zip(gdb.st.iter()) {
        to[..10].copy_from_slice(from);
    }
    fpu.fcw = gdb.fpu.fctrl as u16;
    fpu.fsw = gdb.fpu.fstat as u16;
    fpu.ftwx = abridged_tag_word(gdb.fpu.ftag);
    fpu.last_ip = (u64::from(gdb.fpu.fiseg) << 32) | u64::from(gdb.fpu.fioff);
    fpu.last_dp = (u64::from(gdb.fpu.foseg) << 32) | u64::from(gdb.fpu.fooff);
    fpu.last_opcode = gdb.fpu.fop as u16;
    fpu.xmm = gdb.xmm.map(u128::to_le_bytes);
    fpu.mxcsr = gdb.mxcsr;
}

/// FXSAVE's abridged tag (bit i: register i valid) as the full x87 tag
/// word (two bits each, 3: empty).
fn full_tag_word(abridged: u8) -> u32 {
    (0..8)
        .filter(|i| abridged & (1 << i) == 0)
        .fold(0, |word, i| word | (3 << (2 * i)))
}

/// The full tag word as FXSAVE's abridged one (any tag but 3 is valid).
fn abridged_tag_word(full: u32) -> u8 {
    (0..8)
        .filter(|i| (full >> (2 * i)) & 3 != 3)
        .fold(0, |bits, i| bits | (1 << i))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdbstub::arch::Registers;

    fn sample() -> (kvm_regs, kvm_sregs, kvm_fpu) {
        let regs = kvm_regs {
            rax: 1,
            rbx: 2,
            rcx: 3,
            rdx: 4,
            rsi: 5,
            rdi: 6,
            rsp: 7,
            rbp: 8,
            r8: 9,
            r15: 16,
            rip: 0xffff_ffff_8100_0000,
            rflags: 0x246,
            ..Default::default()
        };
        let mut sregs = kvm_sregs::default();
        sregs.cs.selector = 0x10;
        sregs.ss.selector = 0x18;
        let mut fpu = kvm_fpu {
            fcw: 0x37f,
            ftwx: 0b0000_0001,
            mxcsr: 0x1f80,
            ..Default::default()
        };
        fpu.fpr[0][..10].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        fpu.xmm[15] = [0xab; 16];
        (regs, sregs, fpu)
    }

    #[test]
    fn the_general_registers_come_in_gdbs_order() {
        let (regs, sregs, fpu) = sample();
        let gdb = to_gdb(&regs, &sregs, &fpu);
        // rax, rbx, rcx, rdx, rsi, rdi, rbp, rsp: rbp before rsp.
        assert_eq!(&gdb.regs[..8], &[1, 2, 3, 4, 5, 6, 8, 7]);
        assert_eq!((gdb.regs[8], gdb.regs[15]), (9, 16));
        assert_eq!(gdb.pc(), 0xffff_ffff_8100_0000);
        assert_eq!(
            (gdb.eflags, gdb.segments.cs, gdb.segments.ss),
            (0x246, 0x10, 0x18)
        );
        // On the wire: rip right after r15, little-endian.
        let mut wire = Vec::new();
        gdb.gdb_serialize(|b| wire.push(b.unwrap_or(0)));
        assert_eq!(
            &wire[16 * 8..17 * 8],
            &0xffff_ffff_8100_0000u64.to_le_bytes()
        );
        assert_eq!(
            &wire[6 * 8..7 * 8],
            &8u64.to_le_bytes(),
            "rbp is gdb's 7th register"
        );
    }

    #[test]
    fn the_fpu_state_and_tags_convert_both_ways() {
        let (regs, sregs, fpu) = sample();
        let gdb = to_gdb(&regs, &sregs, &fpu);
        assert_eq!(gdb.st[0], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        // ST0 valid (tag 0), the seven others empty (tag 3).
        assert_eq!(gdb.fpu.ftag, 0xfffc);
        assert_eq!(gdb.xmm[15], u128::from_le_bytes([0xab; 16]));
        let (mut back, mut back_fpu) = (kvm_regs::default(), kvm_fpu::default());
        from_gdb(&gdb, &mut back, &mut back_fpu);
        assert_eq!(back, regs);
        assert_eq!(back_fpu.fpr[0], fpu.fpr[0]);
        assert_eq!(
            (back_fpu.ftwx, back_fpu.fcw, back_fpu.mxcsr),
            (fpu.ftwx, fpu.fcw, fpu.mxcsr)
        );
        assert_eq!(back_fpu.xmm, fpu.xmm);
    }

    #[test]
    fn writing_eflags_keeps_rflags_upper_half() {
        let (regs, sregs, fpu) = sample();
        let mut gdb = to_gdb(&regs, &sregs, &fpu);
        gdb.eflags = 0x202;
        let mut back = kvm_regs {
            rflags: 0x1_0000_0246,
            ..regs
        };
        from_gdb(&gdb, &mut back, &mut kvm_fpu::default());
        assert_eq!(back.rflags, 0x1_0000_0202);
    }
}
