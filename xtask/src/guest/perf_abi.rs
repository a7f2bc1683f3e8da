//! The perf_event_open ABI numbers the checks use
//! (include/uapi/linux/perf_event.h in 6.12).

// perf_event_attr.flags bits.
pub const FLAG_DISABLED: u64 = 1 << 0;
pub const FLAG_INHERIT: u64 = 1 << 1;
pub const FLAG_PINNED: u64 = 1 << 2;
pub const FLAG_EXCLUSIVE: u64 = 1 << 3;
pub const FLAG_EXCLUDE_USER: u64 = 1 << 4;
pub const FLAG_EXCLUDE_KERNEL: u64 = 1 << 5;
pub const FLAG_EXCLUDE_HV: u64 = 1 << 6;
pub const FLAG_EXCLUDE_IDLE: u64 = 1 << 7;
pub const FLAG_MMAP: u64 = 1 << 8;
pub const FLAG_COMM: u64 = 1 << 9;
pub const FLAG_FREQ: u64 = 1 << 10;
pub const FLAG_ENABLE_ON_EXEC: u64 = 1 << 12;
pub const FLAG_TASK: u64 = 1 << 13;
pub const FLAG_INHERIT_STAT: u64 = 1 << 11;
pub const FLAG_WATERMARK: u64 = 1 << 14;
pub const FLAG_PRECISE_IP_1: u64 = 1 << 15;
pub const FLAG_PRECISE_IP_2: u64 = 2 << 15;
pub const FLAG_PRECISE_IP_3: u64 = 3 << 15;
pub const FLAG_MMAP_DATA: u64 = 1 << 17;
pub const FLAG_SAMPLE_ID_ALL: u64 = 1 << 18;
pub const FLAG_EXCLUDE_HOST: u64 = 1 << 19;
pub const FLAG_EXCLUDE_GUEST: u64 = 1 << 20;
pub const FLAG_EXCLUDE_CALLCHAIN_KERNEL: u64 = 1 << 21;
pub const FLAG_EXCLUDE_CALLCHAIN_USER: u64 = 1 << 22;
pub const FLAG_MMAP2: u64 = 1 << 23;
pub const FLAG_COMM_EXEC: u64 = 1 << 24;
pub const FLAG_USE_CLOCKID: u64 = 1 << 25;
pub const FLAG_CONTEXT_SWITCH: u64 = 1 << 26;
pub const FLAG_WRITE_BACKWARD: u64 = 1 << 27;
pub const FLAG_NAMESPACES: u64 = 1 << 28;
pub const FLAG_KSYMBOL: u64 = 1 << 29;
pub const FLAG_BPF_EVENT: u64 = 1 << 30;
pub const FLAG_AUX_OUTPUT: u64 = 1 << 31;
pub const FLAG_CGROUP: u64 = 1 << 32;
pub const FLAG_TEXT_POKE: u64 = 1 << 33;
pub const FLAG_BUILD_ID: u64 = 1 << 34;
pub const FLAG_INHERIT_THREAD: u64 = 1 << 35;
pub const FLAG_REMOVE_ON_EXEC: u64 = 1 << 36;
pub const FLAG_SIGTRAP: u64 = 1 << 37;
pub const FLAG_RESERVED_BIT: u64 = 1 << 63;

// perf_event_attr.aux_action bits.
pub const AUX_START_PAUSED: u32 = 1 << 0;
pub const AUX_PAUSE: u32 = 1 << 1;
pub const AUX_RESUME: u32 = 1 << 2;

// read_format.
pub const FORMAT_TOTAL_TIME_ENABLED: u64 = 1 << 0;
pub const FORMAT_TOTAL_TIME_RUNNING: u64 = 1 << 1;
pub const FORMAT_ID: u64 = 1 << 2;
pub const FORMAT_GROUP: u64 = 1 << 3;
pub const FORMAT_LOST: u64 = 1 << 4;

// sample_type: PERF_SAMPLE_<name> is bit i of SAMPLE_TYPE_BITS[i]; PERF_SAMPLE_MAX is the
// first undefined bit.
pub const SAMPLE_TYPE_BITS: [&str; 25] = [
    "IP",
    "TID",
    "TIME",
    "ADDR",
    "READ",
    "CALLCHAIN",
    "ID",
    "CPU",
    "PERIOD",
    "STREAM_ID",
    "RAW",
    "BRANCH_STACK",
    "REGS_USER",
    "STACK_USER",
    "WEIGHT",
    "DATA_SRC",
    "IDENTIFIER",
    "TRANSACTION",
    "REGS_INTR",
    "PHYS_ADDR",
    "AUX",
    "CGROUP",
    "DATA_PAGE_SIZE",
    "CODE_PAGE_SIZE",
    "WEIGHT_STRUCT",
];
pub const SAMPLE_MAX: u64 = 1 << SAMPLE_TYPE_BITS.len();
pub const SAMPLE_BRANCH_STACK: u64 = 1 << 11;
pub const SAMPLE_REGS_USER: u64 = 1 << 12;
pub const SAMPLE_STACK_USER: u64 = 1 << 13;
pub const SAMPLE_WEIGHT: u64 = 1 << 14;
pub const SAMPLE_REGS_INTR: u64 = 1 << 18;
pub const SAMPLE_AUX: u64 = 1 << 20;
pub const SAMPLE_WEIGHT_STRUCT: u64 = 1 << 24;

// branch_sample_type: PERF_SAMPLE_BRANCH_<name> is bit i of BRANCH_SAMPLE_BITS[i]; the first
// three are privilege levels (PERF_SAMPLE_BRANCH_PLM_ALL), the rest kinds and modifiers.
pub const BRANCH_SAMPLE_BITS: [&str; 20] = [
    "USER",
    "KERNEL",
    "HV",
    "ANY",
    "ANY_CALL",
    "ANY_RETURN",
    "IND_CALL",
    "ABORT_TX",
    "IN_TX",
    "NO_TX",
    "COND",
    "CALL_STACK",
    "IND_JUMP",
    "CALL",
    "NO_FLAGS",
    "NO_CYCLES",
    "TYPE_SAVE",
    "HW_INDEX",
    "PRIV_SAVE",
    "COUNTERS",
];
pub const BRANCH_MAX: u64 = 1 << BRANCH_SAMPLE_BITS.len();
pub const BRANCH_PLM_ALL: u64 = 0b111;
pub const BRANCH_ANY: u64 = 1 << 3;

// Registers for sample_regs_user and sample_regs_intr (x86-64's perf_regs.h).
pub const REG_X86_IP: u64 = 1 << 8;
/// XMM0, an extended register (two bits: 128 bits wide).
pub const REG_X86_XMM0: u64 = 0b11 << 32;

// perf_event_open flags.
pub const OPEN_FLAG_FD_NO_GROUP: u64 = 1 << 0;
pub const OPEN_FLAG_FD_OUTPUT: u64 = 1 << 1;
pub const OPEN_FLAG_PID_CGROUP: u64 = 1 << 2;
pub const OPEN_FLAG_UNKNOWN: u64 = 1 << 4;

pub const PERF_TYPE_SOFTWARE: u32 = 1;
pub const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
pub const CLOCK_MONOTONIC: i32 = 1;
pub const PERF_ATTR_SIZE_VER0: u32 = 64;
