//! eBPF without a toolchain: the instructions a program is made of, encoded
//! by hand, and the bpf(2) commands that create maps, load a program and
//! attach it to a raw tracepoint.
//!
//! Only what the agent's programs use is here. The layouts and numbers are
//! those of include/uapi/linux/bpf.h in the guest's 6.12 tree, and the
//! instruction set is the kernel's Documentation/bpf/standardization/
//! instruction-set.rst; the kernel's verifier is the judge of every program
//! (a load that it refuses answers with its log). The way programs are
//! built here, as arrays of encoded instructions passed to BPF_PROG_LOAD,
//! is the one of the kernel's own tools/testing/selftests/bpf/test_verifier.c
//! and samples/bpf's early sock_example.c, which build theirs with the
//! macros of include/linux/filter.h.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::perf::SysError;

/// `enum bpf_cmd`.
const BPF_MAP_CREATE: i32 = 0;
const BPF_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_MAP_UPDATE_ELEM: i32 = 2;
const BPF_PROG_LOAD: i32 = 5;
const BPF_RAW_TRACEPOINT_OPEN: i32 = 17;
const BPF_MAP_LOOKUP_AND_DELETE_ELEM: i32 = 21;

/// `enum bpf_map_type`, the ones used here.
#[derive(Debug, Clone, Copy)]
#[repr(u32)]
pub enum MapType {
    Array = 2,
    PerfEventArray = 4,
    Queue = 22,
}

/// `enum bpf_prog_type`: a program run by a raw tracepoint (its context is
/// the tracepoint's arguments, which the agent's programs do not touch).
pub const PROG_TYPE_RAW_TRACEPOINT: u32 = 17;

/// `enum bpf_func_id`, the helpers the agent's programs call.
#[derive(Debug, Clone, Copy)]
#[repr(i32)]
pub enum Helper {
    MapLookupElem = 1,
    KtimeGetNs = 5,
    GetSmpProcessorId = 8,
    PerfEventReadValue = 55,
    MapPushElem = 87,
}

/// `BPF_F_CURRENT_CPU`: a map index meaning "this CPU's entry".
pub const F_CURRENT_CPU: u32 = 0xffff_ffff;

/// A register: r0 the return value, r1-r5 a call's arguments (clobbered by
/// it), r6-r9 kept across calls, r10 the read-only frame pointer.
/// All eleven, whether the agent's programs use them or not.
#[allow(dead_code)]
#[derive(Debug, Clone, Copy)]
#[repr(u8)]
pub enum Reg {
    R0 = 0,
    R1,
    R2,
    R3,
    R4,
    R5,
    R6,
    R7,
    R8,
    R9,
    R10,
}

/// A memory access's width.
#[derive(Debug, Clone, Copy)]
#[repr(u8)]
pub enum Size {
    /// 4 bytes (`BPF_W`).
    W = 0x00,
    /// 8 bytes (`BPF_DW`).
    DW = 0x18,
}

// Instruction classes and fields (the low 3 bits are the class).
const CLASS_LD: u8 = 0x00;
const CLASS_ST: u8 = 0x02;
const CLASS_STX: u8 = 0x03;
const CLASS_ALU: u8 = 0x04;
const CLASS_JMP: u8 = 0x05;
const CLASS_ALU64: u8 = 0x07;
/// Source operand: the immediate (`BPF_K`) or a register (`BPF_X`).
const SRC_K: u8 = 0x00;
const SRC_X: u8 = 0x08;
const ALU_ADD: u8 = 0x00;
const ALU_MOV: u8 = 0xb0;
const JMP_JEQ: u8 = 0x10;
const JMP_CALL: u8 = 0x80;
const JMP_EXIT: u8 = 0x90;
const MODE_IMM: u8 = 0x00;
const MODE_MEM: u8 = 0x60;
const MODE_ATOMIC: u8 = 0xc0;
/// `BPF_PSEUDO_MAP_FD`: the 64-bit immediate is a map's descriptor, which
/// the verifier replaces with the map's address.
const PSEUDO_MAP_FD: u8 = 1;

/// One instruction, `struct bpf_insn`: opcode, destination and source
/// registers in one byte (destination in the low nibble, on a little-endian
/// machine), a signed offset and a signed immediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const _: () = assert!(std::mem::size_of::<Insn>() == 8);

impl Insn {
    const fn new(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            regs: (dst as u8) | (src as u8) << 4,
            off,
            imm,
        }
    }

    /// `dst = src` (64 bits).
    pub const fn mov64(dst: Reg, src: Reg) -> Insn {
        Insn::new(CLASS_ALU64 | ALU_MOV | SRC_X, dst, src, 0, 0)
    }

    /// `dst = imm` (64 bits, `imm` sign-extended).
    pub const fn mov64_imm(dst: Reg, imm: i32) -> Insn {
        Insn::new(CLASS_ALU64 | ALU_MOV | SRC_K, dst, Reg::R0, 0, imm)
    }

    /// `dst = (u32) imm`: a 32-bit move zeroes the upper half, so this loads
    /// 0xffffffff without sign extension.
    pub const fn mov32_imm(dst: Reg, imm: u32) -> Insn {
        Insn::new(CLASS_ALU | ALU_MOV | SRC_K, dst, Reg::R0, 0, imm as i32)
    }

    /// `dst += imm` (64 bits).
    pub const fn add64_imm(dst: Reg, imm: i32) -> Insn {
        Insn::new(CLASS_ALU64 | ALU_ADD | SRC_K, dst, Reg::R0, 0, imm)
    }

    /// `*(size *)(dst + off) = src`.
    pub const fn store(size: Size, dst: Reg, off: i16, src: Reg) -> Insn {
        Insn::new(CLASS_STX | MODE_MEM | size as u8, dst, src, off, 0)
    }

    /// `*(size *)(dst + off) = imm`.
    pub const fn store_imm(size: Size, dst: Reg, off: i16, imm: i32) -> Insn {
        Insn::new(CLASS_ST | MODE_MEM | size as u8, dst, Reg::R0, off, imm)
    }

    /// `lock *(u64 *)(dst + off) += src`.
    pub const fn atomic_add64(dst: Reg, off: i16, src: Reg) -> Insn {
        // The atomic operation is the immediate: BPF_ADD, without BPF_FETCH.
        Insn::new(
            CLASS_STX | MODE_ATOMIC | Size::DW as u8,
            dst,
            src,
            off,
            ALU_ADD as i32,
        )
    }

    /// `if dst == imm goto pc + 1 + off`.
    pub const fn jeq_imm(dst: Reg, imm: i32, off: i16) -> Insn {
        Insn::new(CLASS_JMP | JMP_JEQ | SRC_K, dst, Reg::R0, off, imm)
    }

    /// `r0 = helper(r1, ..., r5)`.
    pub const fn call(helper: Helper) -> Insn {
        Insn::new(CLASS_JMP | JMP_CALL, Reg::R0, Reg::R0, 0, helper as i32)
    }

    /// Return r0.
    pub const fn exit() -> Insn {
        Insn::new(CLASS_JMP | JMP_EXIT, Reg::R0, Reg::R0, 0, 0)
    }

    /// `dst = map` (`BPF_LD | BPF_IMM | BPF_DW` with `BPF_PSEUDO_MAP_FD`):
    /// the one instruction that takes two slots, the second holding the
    /// immediate's upper half (zero for a descriptor).
    pub fn load_map(dst: Reg, map: &Map) -> [Insn; 2] {
        let code = CLASS_LD | MODE_IMM | Size::DW as u8;
        [
            Insn {
                code,
                regs: dst as u8 | PSEUDO_MAP_FD << 4,
                off: 0,
                imm: map.fd.as_raw_fd(),
            },
            Insn {
                code: 0,
                regs: 0,
                off: 0,
                imm: 0,
            },
        ]
    }
}

/// bpf(cmd, attr, size) with `attr` one of the command's `union bpf_attr`
/// structs below; a non-negative answer.
fn bpf<T>(cmd: i32, attr: &mut T, call: &'static str) -> Result<i64, SysError> {
    // SAFETY: attr is a #[repr(C)] struct of plain integers laid out as the
    // start of `union bpf_attr` for `cmd`, and the size given is its own: the
    // kernel reads (and for some commands writes) no more. Pointers in it
    // point at buffers that outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T,
            std::mem::size_of::<T>() as u32,
        )
    };
    if ret < 0 {
        return Err(SysError::last(call));
    }
    Ok(ret)
}

fn owned(fd: i64) -> OwnedFd {
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// `union bpf_attr` for BPF_MAP_CREATE, up to `map_flags`.
#[repr(C)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

/// A map: its descriptor and the sizes of its keys and values, which every
/// access here is held to, since the kernel copies exactly that many bytes
/// from and to the buffers it is given.
pub struct Map {
    fd: OwnedFd,
    key_size: usize,
    value_size: usize,
}

/// `union bpf_attr` for the BPF_MAP_*_ELEM commands.
#[repr(C)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

impl Map {
    pub fn create(
        map_type: MapType,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
    ) -> Result<Map, SysError> {
        let mut attr = MapCreate {
            map_type: map_type as u32,
            key_size,
            value_size,
            max_entries,
            map_flags: 0,
        };
        let fd = bpf(BPF_MAP_CREATE, &mut attr, "bpf(BPF_MAP_CREATE)").map(owned)?;
        Ok(Map {
            fd,
            key_size: key_size as usize,
            value_size: value_size as usize,
        })
    }

    /// The attr of a `cmd` on `key` (none for a queue) and `value`, after
    /// checking both have the map's sizes.
    fn elem(
        &self,
        call: &'static str,
        key: Option<&[u8]>,
        value: *const u8,
        value_len: usize,
    ) -> Result<MapElem, SysError> {
        if key.map_or(0, <[u8]>::len) != self.key_size || value_len != self.value_size {
            return Err(SysError {
                errno: libc::EINVAL,
                call,
            });
        }
        Ok(MapElem {
            map_fd: self.fd.as_raw_fd() as u32,
            _pad: 0,
            key: key.map_or(0, |k| k.as_ptr() as u64),
            value: value as u64,
            flags: 0,
        })
    }

    /// Sets `map[key] = value` (`BPF_ANY`).
    pub fn update(&self, key: &[u8], value: &[u8]) -> Result<(), SysError> {
        let call = "bpf(BPF_MAP_UPDATE_ELEM)";
        let mut attr = self.elem(call, Some(key), value.as_ptr(), value.len())?;
        bpf(BPF_MAP_UPDATE_ELEM, &mut attr, call).map(drop)
    }

    /// Reads `map[key]` into `value`.
    pub fn lookup(&self, key: &[u8], value: &mut [u8]) -> Result<(), SysError> {
        let call = "bpf(BPF_MAP_LOOKUP_ELEM)";
        let mut attr = self.elem(call, Some(key), value.as_mut_ptr(), value.len())?;
        bpf(BPF_MAP_LOOKUP_ELEM, &mut attr, call).map(drop)
    }

    /// Takes the oldest element of a queue map into `value`: false when the
    /// queue is empty.
    pub fn pop(&self, value: &mut [u8]) -> Result<bool, SysError> {
        let call = "bpf(BPF_MAP_LOOKUP_AND_DELETE_ELEM)";
        let mut attr = self.elem(call, None, value.as_mut_ptr(), value.len())?;
        match bpf(BPF_MAP_LOOKUP_AND_DELETE_ELEM, &mut attr, call) {
            Ok(_) => Ok(true),
            Err(e) if e.errno == libc::ENOENT => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// `union bpf_attr` for BPF_PROG_LOAD, up to `prog_name`.
#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

/// How much of the verifier's log a refused load answers with.
const LOG_SIZE: usize = 64 << 10;

/// Loads a program; a refusal says why in the verifier's own words.
pub fn prog_load(
    prog_type: u32,
    name: &str,
    insns: &[Insn],
    license: &str,
) -> Result<OwnedFd, String> {
    let license = CString::new(license).map_err(|e| e.to_string())?;
    let mut log = vec![0u8; LOG_SIZE];
    let mut prog_name = [0u8; 16];
    // The kernel wants a NUL within the 16 bytes: at most 15 of the name.
    for (d, s) in prog_name.iter_mut().zip(name.bytes().take(15)) {
        *d = s;
    }
    let mut attr = ProgLoad {
        prog_type,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: LOG_SIZE as u32,
        log_buf: log.as_mut_ptr() as u64,
        kern_version: 0,
        prog_flags: 0,
        prog_name,
    };
    bpf(BPF_PROG_LOAD, &mut attr, "bpf(BPF_PROG_LOAD)")
        .map(owned)
        .map_err(|e| {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            format!(
                "{e}; the verifier said:\n{}",
                String::from_utf8_lossy(&log[..end]).trim_end()
            )
        })
}

/// `union bpf_attr` for BPF_RAW_TRACEPOINT_OPEN.
#[repr(C)]
struct RawTracepointOpen {
    name: u64,
    prog_fd: u32,
    _pad: u32,
    cookie: u64,
}

/// Attaches `prog` to the raw tracepoint `name` (e.g. "local_timer_entry"),
/// on every CPU, until the answered descriptor is closed.
pub fn raw_tracepoint_open(name: &str, prog: &OwnedFd) -> Result<OwnedFd, SysError> {
    let name = CString::new(name).map_err(|_| SysError {
        errno: libc::EINVAL,
        call: "bpf(BPF_RAW_TRACEPOINT_OPEN)",
    })?;
    let mut attr = RawTracepointOpen {
        name: name.as_ptr() as u64,
        prog_fd: prog.as_raw_fd() as u32,
        _pad: 0,
        cookie: 0,
    };
    bpf(
        BPF_RAW_TRACEPOINT_OPEN,
        &mut attr,
        "bpf(BPF_RAW_TRACEPOINT_OPEN)",
    )
    .map(owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodings checked against the kernel's include/linux/filter.h macros
    /// by hand (opcode byte, registers byte, offset, immediate).
    #[test]
    fn instructions_encode_as_the_kernel_decodes_them() {
        let bytes = |i: Insn| (i.code, i.regs, i.off, i.imm);
        // BPF_MOV64_REG(BPF_REG_6, BPF_REG_1) = 0xbf, dst 6, src 1.
        assert_eq!(bytes(Insn::mov64(Reg::R6, Reg::R1)), (0xbf, 0x16, 0, 0));
        // BPF_MOV32_IMM(BPF_REG_2, -1) = 0xb4.
        assert_eq!(
            bytes(Insn::mov32_imm(Reg::R2, F_CURRENT_CPU)),
            (0xb4, 0x02, 0, -1)
        );
        assert_eq!(bytes(Insn::mov64_imm(Reg::R4, 24)), (0xb7, 0x04, 0, 24));
        assert_eq!(bytes(Insn::add64_imm(Reg::R3, -40)), (0x07, 0x03, 0, -40));
        // BPF_STX_MEM(BPF_DW, BPF_REG_10, BPF_REG_0, -16) = 0x7b.
        assert_eq!(
            bytes(Insn::store(Size::DW, Reg::R10, -16, Reg::R0)),
            (0x7b, 0x0a, -16, 0)
        );
        assert_eq!(
            bytes(Insn::store(Size::W, Reg::R10, -4, Reg::R0)),
            (0x63, 0x0a, -4, 0)
        );
        assert_eq!(
            bytes(Insn::store_imm(Size::W, Reg::R10, -44, 0)),
            (0x62, 0x0a, -44, 0)
        );
        // BPF_ATOMIC_OP(BPF_DW, BPF_ADD, BPF_REG_0, BPF_REG_1, 0) = 0xdb.
        assert_eq!(
            bytes(Insn::atomic_add64(Reg::R0, 0, Reg::R1)),
            (0xdb, 0x10, 0, 0)
        );
        assert_eq!(bytes(Insn::jeq_imm(Reg::R0, 0, 3)), (0x15, 0x00, 3, 0));
        assert_eq!(
            bytes(Insn::call(Helper::PerfEventReadValue)),
            (0x85, 0x00, 0, 55)
        );
        assert_eq!(bytes(Insn::exit()), (0x95, 0x00, 0, 0));
    }
}
