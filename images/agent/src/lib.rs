//! The agent channel's wire protocol: one JSON object per line over the guest's
//! virtio console (`/dev/hvc0`), host requests in, agent messages out.
//!
//! This is the one definition both sides use: the agent (this crate's binary)
//! and xtask, which drives the guest.
//!
//! The exchange always starts with the agent: once the guest is up it sends
//! [`AgentMessage::Hello`]; after that it answers each [`HostRequest`] with
//! exactly one [`AgentMessage`], in order.

use serde::{Deserialize, Serialize};

// CPU lists in the kernel's sysfs format: one implementation, the device's.
pub use perfbed_device::cpus::{format_cpu_list, parse_cpu_list};

/// Where the agent talks to the host: a virtio-serial port (QEMU's
/// `virtserialport`, the first port of the first device), else the virtio
/// console's tty (perfbed-vmm's virtio-console). QEMU drops what a guest
/// writes to a *console* port whenever the host's socket is full (its
/// `virtconsole` cannot throttle the guest), and a 16-vCPU stress lost 6 KB
/// of a 130 KB answer that way; a plain port is throttled instead.
pub const CHANNEL_DEVICES: [&str; 2] = ["/dev/vport0p1", "/dev/hvc0"];

/// The virtio console: a tty, to be put in raw mode.
pub const CONSOLE_DEVICE: &str = "/dev/hvc0";

/// Kernel command-line prefix for the agent's own settings (the kernel passes
/// dotted parameters to no one, but keeps them in `/proc/cmdline`).
pub const CMDLINE_PREFIX: &str = "perfbed_agent.";

/// Kernel command-line parameter with which perfbed-vmm announces its
/// power-off register (`perfbed_agent.power_off=0xfe003000`, an MMIO page):
/// the agent writes it just before it reboots to end the VM, so that the
/// VMM tells a clean power-off from a triple fault. The QEMU host announces
/// none.
pub const POWER_OFF_PARAM: &str = "perfbed_agent.power_off=";

/// The power-off register's address `cmdline` announces, if any (hex with
/// `0x`, page aligned).
pub fn power_off_address(cmdline: &str) -> Option<u64> {
    let value = cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix(POWER_OFF_PARAM))?;
    u64::from_str_radix(value.strip_prefix("0x")?, 16)
        .ok()
        .filter(|a| a.is_multiple_of(4096))
}

/// An errno's name ("EINVAL"), as the agent reports failed calls and the
/// host prints them; `errno N` for one without a name here.
pub fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::ENOSPC => "ENOSPC",
        libc::E2BIG => "E2BIG",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ESRCH => "ESRCH",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTTY => "ENOTTY",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EMFILE => "EMFILE",
        _ => return format!("errno {errno}"),
    };
    name.to_string()
}

/// Guest-side facts gathered before the agent is ready for requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// `uname -r` of the guest kernel.
    pub kernel_release: String,
    /// `/sys/devices/system/cpu/online`, as the kernel prints it.
    pub cpus_online: String,
    /// `/sys/devices/system/cpu/possible`.
    pub cpus_possible: String,
    /// Guest uptime when the agent became ready, in milliseconds.
    pub uptime_ms: u64,
}

/// One offline-all-then-online-all round of CPU hotplug.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotplugRound {
    pub round: u32,
    /// Time to take every CPU but 0 offline, in microseconds.
    pub offline_us: u64,
    /// Time to bring them back, in microseconds.
    pub online_us: u64,
    /// Every mismatch between the expected and the reported online mask,
    /// and every sysfs write that failed. Empty when the round passed.
    pub problems: Vec<String>,
}

/// One 8-byte register access made from a chosen CPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmioAccess {
    /// The CPU the agent pins itself to for this access.
    pub cpu: u32,
    /// Offset into the register block (8-byte aligned).
    pub offset: u64,
    /// `Some(value)` writes it; `None` reads.
    pub write: Option<u64>,
}

/// The parts of `struct perf_event_attr` a test sets; the agent fills in the
/// rest (zero) and the size. Flags are the attr's bitfield word as is, so a
/// test can set any bit, including ones the kernel must refuse.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerfAttr {
    #[serde(rename = "type")]
    pub type_: u32,
    pub config: u64,
    #[serde(default)]
    pub config1: u64,
    #[serde(default)]
    pub config2: u64,
    #[serde(default)]
    pub sample_period: u64,
    #[serde(default)]
    pub sample_type: u64,
    #[serde(default)]
    pub read_format: u64,
    /// disabled = bit 0, inherit = 1, exclude_user = 4, exclude_kernel = 5, ...
    #[serde(default)]
    pub flags: u64,
    /// `attr.size`; 0 means the agent's full size (PERF_ATTR_SIZE_VER8).
    #[serde(default)]
    pub size: u32,
    #[serde(default)]
    pub wakeup_events: u32,
    /// `attr.bp_type`, for breakpoint events only.
    #[serde(default)]
    pub bp_type: u32,
    #[serde(default)]
    pub branch_sample_type: u64,
    #[serde(default)]
    pub sample_regs_user: u64,
    #[serde(default)]
    pub sample_stack_user: u32,
    #[serde(default)]
    pub clockid: i32,
    #[serde(default)]
    pub sample_regs_intr: u64,
    #[serde(default)]
    pub aux_watermark: u32,
    #[serde(default)]
    pub sample_max_stack: u16,
    #[serde(default)]
    pub aux_sample_size: u32,
    /// `attr.aux_action`: aux_start_paused = bit 0, aux_pause = 1, aux_resume = 2.
    #[serde(default)]
    pub aux_action: u32,
    #[serde(default)]
    pub sig_data: u64,
    #[serde(default)]
    pub config3: u64,
}

/// An ioctl on an open perf event (`PERF_EVENT_IOC_*`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ioctl", rename_all = "snake_case")]
pub enum PerfIoctl {
    /// `group`: PERF_IOC_FLAG_GROUP, the whole group.
    Enable {
        group: bool,
    },
    Disable {
        group: bool,
    },
    Reset {
        group: bool,
    },
    Refresh {
        count: i32,
    },
    Period {
        period: u64,
    },
    /// Answers the event's id.
    Id,
    /// Redirect output to another event's buffer (`None`: -1, none).
    SetOutput {
        target: Option<u32>,
    },
    SetFilter {
        filter: String,
    },
    PauseOutput {
        pause: bool,
    },
    ModifyAttributes {
        attr: PerfAttr,
    },
    /// A bpf program fd (-1: none).
    SetBpf {
        fd: i32,
    },
    QueryBpf,
}

/// One perf operation of a [`HostRequest::PerfOps`] batch: the lifecycle
/// stress issues every operation a user can through these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum PerfOp {
    /// perf_event_open(attr, -1, cpu, group leader's handle or -1, 0):
    /// answers `[handle]`.
    Open {
        attr: PerfAttr,
        cpu: i32,
        group: Option<u32>,
    },
    /// An ioctl: answers `[its return value]`.
    Ioctl { handle: u32, ioctl: PerfIoctl },
    /// read(): answers the u64 words the read format gives.
    Read { handle: u32 },
    /// close(): answers `[]`.
    Close { handle: u32 },
}

/// What one [`PerfOp`] did, stamped with the guest's `CLOCK_MONOTONIC`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerfOpResult {
    /// When the system call returned.
    pub time_ns: u64,
    /// How long it took (an open that waited for a move shows here), from
    /// the same two readings of the clock: `time_ns - took_ns` is when it
    /// began.
    pub took_ns: u64,
    /// The answer's words, or the errno's name.
    pub result: Result<Vec<u64>, String>,
}

/// A concurrent stress of opens against CPU hotplug (see
/// [`HostRequest::PerfOpenRace`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaceResult {
    /// Opens attempted while the hotplug thread ran.
    pub attempts: u32,
    pub opened: u32,
    /// Opens refused with EBUSY (the PMU moved under them).
    pub busy: u32,
    /// Any other refusal, as "errno name: count".
    pub other_errors: Vec<String>,
    /// Hotplug operations the other thread completed during the race.
    pub hotplug_ops: u32,
    /// After the race, with every CPU back online: each kept event's value,
    /// in open order.
    pub final_values: Vec<u64>,
}

/// One CPU hotplug operation of a [`HostRequest::HotplugBatch`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum HotplugOp {
    /// Take `cpu` offline or bring it online.
    Set { cpu: u32, online: bool },
    /// Take the CPU a PMU counts on (its `cpumask`) offline and bring it
    /// straight back: the PMU must move, and the online set is unchanged.
    /// Skipped (no error) when the PMU is parked or sits on CPU 0 where
    /// it cannot go offline (x86; on arm64 it goes like any other).
    FlapOwner { pmu: String },
    /// Take `cpu` offline or online with hotplug state `state` armed in its
    /// `hotplug/fail` (`CONFIG_CPU_HOTPLUG_STATE_CONTROL`): the kernel fails
    /// the operation there with `EAGAIN`, rolls it back and disarms the
    /// state. An operation that completes without reaching the state is
    /// undone (the state disarmed, the CPU back), so the online set is
    /// unchanged either way; [`HotplugOpResult::injected`] says which.
    FailAt { cpu: u32, online: bool, state: i64 },
}

/// What one [`HotplugOp`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotplugOpResult {
    /// Time the sysfs writes took, in microseconds.
    pub us: u64,
    /// sysfs writes made (2 for a flap, 0 for a skipped one).
    pub writes: u32,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// The watched PMUs' `cpumask` files after the op, in request order
    /// (an empty string while a PMU is parked). For a flap, the masks
    /// between its offline and its online come first in `between`.
    pub masks: Vec<String>,
    #[serde(default)]
    pub between: Vec<String>,
    /// `/sys/devices/system/cpu/online` after the op.
    pub online: String,
    /// Each handle of the request's `read_handles` read after the op (its
    /// u64 words), or the errno's name.
    pub reads: Vec<Result<Vec<u64>, String>>,
    /// For [`HotplugOp::FailAt`]: whether the operation failed at the armed
    /// state (`true`) or completed without reaching it and was undone.
    #[serde(default)]
    pub injected: Option<bool>,
}

/// The answer to a [`HostRequest::HotplugBatch`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotplugBatchResult {
    /// The watched PMUs' `cpumask` files before the first op.
    pub masks_before: Vec<String>,
    pub ops: Vec<HotplugOpResult>,
}

/// A background job of the agent (see [`HostRequest::StartJob`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "job", rename_all = "snake_case")]
pub enum JobSpec {
    /// Run a program of the initramfs in the background, its output kept.
    /// The start is answered once the process holds `perf_fds` perf event
    /// descriptors (0: at once) and then `settle_ms` more have passed, so
    /// that a `perf stat` is counting before the host starts traffic.
    Process {
        argv: Vec<String>,
        perf_fds: u32,
        settle_ms: u64,
    },
    /// A thread that opens an event of each attr in turn (system-wide, on
    /// CPU 0), reads it and closes it, pausing `pause_us` between opens.
    OpenCloseLoop { attrs: Vec<PerfAttr>, pause_us: u64 },
}

/// What a background job did, once stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "job", rename_all = "snake_case")]
pub enum JobResult {
    /// The process's exit status (None if killed by a signal) and output.
    Process {
        status: Option<i32>,
        stdout: String,
        stderr: String,
    },
    OpenCloseLoop {
        attempts: u64,
        opened: u64,
        /// Refusals by errno name ("EBUSY", "ENODEV", ...).
        errors: std::collections::BTreeMap<String, u64>,
        /// Reads of opened events that failed, by errno name.
        read_errors: std::collections::BTreeMap<String, u64>,
    },
}

/// What a timing loop reads (see [`HostRequest::TimeReads`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "target", rename_all = "snake_case")]
pub enum ReadTarget {
    /// read() of an open event, by handle.
    Event { handle: u32 },
    /// An 8-byte load at `offset` of `size` bytes of physical memory at
    /// `base`, mapped through `/dev/mem`.
    Mmio { base: u64, size: u64, offset: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum HostRequest {
    /// Read a (sysfs, proc) file's text.
    ReadFile {
        path: String,
    },
    /// Take one CPU offline or bring it online through sysfs.
    SetCpuOnline {
        cpu: u32,
        online: bool,
    },
    /// Load a module of the initramfs (`/lib/modules/<name>.ko`), with its
    /// parameters from the kernel command line (`<name>.<param>=<value>`).
    LoadModule {
        name: String,
    },
    /// Load a module of the initramfs with exactly these parameters (the
    /// kernel command line's are not used).
    LoadModuleWith {
        name: String,
        params: String,
    },
    /// Unload a module (delete_module).
    UnloadModule {
        name: String,
    },
    /// perf_event_open(attr, pid, cpu, group leader's handle or -1, 0);
    /// the event stays open under a handle until closed.
    PerfOpen {
        attr: PerfAttr,
        pid: i32,
        cpu: i32,
        group: Option<u32>,
    },
    /// [`HostRequest::PerfOpen`] with `flags` (PERF_FLAG_*) added to the
    /// agent's own PERF_FLAG_FD_CLOEXEC.
    PerfOpenFlags {
        attr: PerfAttr,
        pid: i32,
        cpu: i32,
        group: Option<u32>,
        flags: u64,
    },
    /// An ioctl on an open event: [`AgentMessage::PerfValues`] with the
    /// ioctl's return value (the id for [`PerfIoctl::Id`]), or the errno.
    PerfIoctl {
        handle: u32,
        ioctl: PerfIoctl,
    },
    /// read() an open event: the u64 words the read format gives.
    PerfRead {
        handle: u32,
    },
    PerfClose {
        handle: u32,
    },
    /// While a second thread takes `toggle_cpus` offline and online again one
    /// at a time, `hotplug_ops` times, open (and read) events of `attr` on
    /// `cpu` in a loop; keep the first `keep` that open, close the others at
    /// once; then bring every toggled CPU back, read each kept event and
    /// close them all.
    PerfOpenRace {
        attr: PerfAttr,
        cpu: i32,
        hotplug_ops: u32,
        toggle_cpus: Vec<u32>,
        keep: u32,
        /// Open one event of `attr` on `cpu` first, as a group's leader
        /// (kept, the one value of `final_values`), and make the loop's
        /// opens cpu-clock siblings of it on `cpu` instead (each read and
        /// closed at once): opens that must follow the group's CPU while
        /// it moves.
        #[serde(default)]
        software_siblings: bool,
    },
    /// Map `size` bytes of physical memory at `base` (through `/dev/mem`) and
    /// make `accesses` in order, each from its CPU. A way to drive a device
    /// from the guest without a driver: for checking the device emulation.
    Mmio {
        base: u64,
        size: u64,
        accesses: Vec<MmioAccess>,
    },
    /// Pinned to `cpu`, read `target` `iterations` times in a tight loop and
    /// say how long that took (for `cargo xtask bench`).
    TimeReads {
        target: ReadTarget,
        cpu: u32,
        iterations: u32,
    },
    /// Take every CPU but 0 offline and back online, `rounds` times, checking
    /// `/sys/devices/system/cpu/online` after each CPU.
    Hotplug {
        rounds: u32,
    },
    /// Run a program of the initramfs (e.g. the real `perf`) and wait for it.
    Run {
        argv: Vec<String>,
    },
    /// The guest events recorded since the last `events` request
    /// (answered with [`AgentMessage::Events`]).
    Events,
    /// Reads `REG_MAGIC` of the device at `base` from `cpu`, between two
    /// readings of the guest's clock (answered with
    /// [`AgentMessage::ClockSync`]): the device records that read with its
    /// own time, which puts both clocks on one axis.
    ClockSync {
        base: u64,
        size: u64,
        cpu: u32,
    },
    /// Carry out `ops` in order, one after the other; after each, read the
    /// `cpumask` of every PMU of `watch_pmus` and every event of
    /// `read_handles`. Answered with [`AgentMessage::HotplugBatch`]; an op
    /// that fails is reported and the batch carries on.
    HotplugBatch {
        ops: Vec<HotplugOp>,
        watch_pmus: Vec<String>,
        read_handles: Vec<u32>,
    },
    /// Carry out perf operations in order, each timed and journaled
    /// ([`GuestEventKind::PerfOp`]); one that fails is answered with its
    /// errno and the batch carries on. Answered with
    /// [`AgentMessage::PerfOps`], one result per operation.
    PerfOps {
        ops: Vec<PerfOp>,
    },
    /// read() several open events: [`AgentMessage::PerfValuesMany`], or the
    /// first failure's errno.
    PerfReadMany {
        handles: Vec<u32>,
    },
    /// Start a background job; answered with [`AgentMessage::JobStarted`]
    /// while the job runs on.
    StartJob {
        spec: JobSpec,
    },
    /// Stop a background job (a process gets `signal`, then SIGKILL after
    /// `timeout_ms`) and collect what it did: [`AgentMessage::JobDone`].
    StopJob {
        job: u32,
        signal: i32,
        timeout_ms: u64,
    },
    /// Load the agent's BPF reader and attach it to each raw tracepoint of
    /// `tracepoints` (e.g. `local_timer_entry`, a CPU's timer interrupt):
    /// each time one fires, on whatever CPU, the program
    /// reads the open event `handle` with `bpf_perf_event_read_value()`
    /// (through a `PERF_EVENT_ARRAY` holding the event at every CPU's index,
    /// read with `BPF_F_CURRENT_CPU`) and records a [`BpfRead`], failures
    /// included. Answered with [`AgentMessage::Done`]; one reader at a time.
    BpfReaderStart {
        handle: u32,
        tracepoints: Vec<String>,
    },
    /// The reads the reader recorded since the last drain, oldest first
    /// ([`AgentMessage::BpfReads`]); `stop` detaches and unloads it after.
    BpfReaderDrain {
        stop: bool,
    },
    /// Sync and power the guest off. The agent answers before it does.
    PowerOff,
    /// Fault injection for the harness's own test: write bytes without a
    /// newline to the channel until the host stops reading. (The channel
    /// port cannot be opened twice, so no other process can flood it.)
    FloodChannel,
}

/// One read the BPF reader made (see [`HostRequest::BpfReaderStart`]): what
/// `bpf_perf_event_read_value()` answered, on which CPU, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BpfRead {
    /// `bpf_ktime_get_ns()` just after the read (`CLOCK_MONOTONIC`).
    pub time_ns: u64,
    pub cpu: u32,
    /// The helper's return: 0, or a negative errno (`-EINVAL` off the CPU
    /// the event counts on), when the values are zero.
    pub ret: i32,
    pub value: u64,
    pub enabled: u64,
    pub running: u64,
}

/// Something the guest did that a trace shows, stamped with the guest's
/// `CLOCK_MONOTONIC` in ns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestEvent {
    pub time_ns: u64,
    #[serde(flatten)]
    pub kind: GuestEventKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum GuestEventKind {
    /// A CPU went offline (the write to its `online` file returned at
    /// `time_ns`, after `took_ns`); `ok` false if the kernel refused.
    CpuOffline {
        cpu: u32,
        took_ns: u64,
        ok: bool,
    },
    /// A CPU came online.
    CpuOnline {
        cpu: u32,
        took_ns: u64,
        ok: bool,
    },
    /// perf_event_open: `result` is the handle or the errno's name.
    PerfOpen {
        pmu_type: u32,
        config: u64,
        cpu: i32,
        result: String,
    },
    PerfClose {
        handle: u32,
    },
    /// An operation of a [`HostRequest::PerfOps`] batch and what it did
    /// (`time_ns` is when it returned).
    PerfOp {
        op: PerfOp,
        took_ns: u64,
        result: Result<Vec<u64>, String>,
    },
    /// A PMU's `cpumask` file was read.
    Cpumask {
        pmu: String,
        cpus: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "message", rename_all = "snake_case")]
pub enum AgentMessage {
    Hello(Hello),
    Hotplug {
        rounds: Vec<HotplugRound>,
    },
    /// One value per access: what a read returned, 0 for a write.
    Mmio {
        values: Vec<u64>,
    },
    /// The request was carried out.
    Done,
    /// A timing loop's result: `iterations` reads in `total_ns`; `last` is
    /// the last value read (so a broken read shows).
    Timed {
        iterations: u32,
        total_ns: u64,
        last: u64,
    },
    Text {
        text: String,
    },
    PerfOpened {
        handle: u32,
    },
    PerfValues {
        values: Vec<u64>,
    },
    PerfValuesMany {
        values: Vec<Vec<u64>>,
    },
    PerfOps {
        results: Vec<PerfOpResult>,
    },
    HotplugBatch(HotplugBatchResult),
    JobStarted {
        job: u32,
    },
    JobDone(JobResult),
    Race(RaceResult),
    /// A program's exit status (None if killed by a signal) and output.
    Ran {
        status: Option<i32>,
        stdout: String,
        stderr: String,
    },
    /// A system call failed: its errno (positive) and name, e.g. 16 "EBUSY".
    Errno {
        errno: i32,
        name: String,
        call: String,
    },
    PoweringOff,
    /// A request the agent could not parse or carry out.
    Error {
        error: String,
    },
    Events {
        events: Vec<GuestEvent>,
    },
    /// The BPF reader's reads since the last drain, and how many it could
    /// not record (its queue was full).
    BpfReads {
        reads: Vec<BpfRead>,
        dropped: u64,
    },
    /// The guest's clock just before and just after the device read.
    ClockSync {
        before_ns: u64,
        after_ns: u64,
    },
}

/// Longest agent message line the host accepts: a guest that floods the
/// channel without newlines costs the host at most this much memory.
pub const MAX_MESSAGE_LINE: usize = 4 << 20;

/// Parses one line (without its newline) of the agent's output, as the host
/// does; the error names the line (shortened) and why.
pub fn parse_agent_message(line: &[u8]) -> Result<AgentMessage, String> {
    serde_json::from_slice(line).map_err(|e| {
        let text = String::from_utf8_lossy(line);
        let shown: String = text.chars().take(200).collect();
        let more = if shown.len() < text.len() { "..." } else { "" };
        format!("unparsable message {shown:?}{more}: {e}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_power_off_register_is_read_from_the_command_line() {
        assert_eq!(
            power_off_address("console=ttyS0 perfbed_agent.power_off=0xfe003000 quiet"),
            Some(0xfe00_3000)
        );
        assert_eq!(
            power_off_address("console=ttyS0 reboot=t"),
            None,
            "the QEMU host announces none"
        );
        assert_eq!(
            power_off_address("perfbed_agent.power_off=0xfe003008"),
            None,
            "not a page"
        );
        assert_eq!(power_off_address("perfbed_agent.power_off=fe003000"), None);
    }

    #[test]
    fn requests_and_messages_are_one_line_of_json() {
        let req = HostRequest::Hotplug { rounds: 3 };
        let line = serde_json::to_string(&req).unwrap();
        assert_eq!(line, r#"{"request":"hotplug","rounds":3}"#);
        assert_eq!(serde_json::from_str::<HostRequest>(&line).unwrap(), req);
        let msg = AgentMessage::Error {
            error: "no\nnewline".into(),
        };
        let line = serde_json::to_string(&msg).unwrap();
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<AgentMessage>(&line).unwrap(), msg);
        let msg = AgentMessage::Events {
            events: vec![GuestEvent {
                time_ns: 5,
                kind: GuestEventKind::CpuOffline {
                    cpu: 2,
                    took_ns: 9,
                    ok: true,
                },
            }],
        };
        let line = serde_json::to_string(&msg).unwrap();
        assert_eq!(
            line,
            r#"{"message":"events","events":[{"time_ns":5,"event":"cpu_offline","cpu":2,"took_ns":9,"ok":true}]}"#
        );
        assert_eq!(serde_json::from_str::<AgentMessage>(&line).unwrap(), msg);
    }

    #[test]
    fn batch_and_job_requests_round_trip() {
        let req = HostRequest::HotplugBatch {
            ops: vec![
                HotplugOp::Set {
                    cpu: 2,
                    online: false,
                },
                HotplugOp::FlapOwner {
                    pmu: "perfbed_l3_1".into(),
                },
                HotplugOp::FailAt {
                    cpu: 3,
                    online: true,
                    state: 155,
                },
            ],
            watch_pmus: vec!["perfbed_l3_1".into()],
            read_handles: vec![1, 2],
        };
        let line = serde_json::to_string(&req).unwrap();
        assert!(line.contains(r#""op":"flap_owner""#), "{line}");
        assert!(
            line.contains(r#""op":"fail_at","cpu":3,"online":true,"state":155"#),
            "{line}"
        );
        assert_eq!(serde_json::from_str::<HostRequest>(&line).unwrap(), req);
        let msg = AgentMessage::HotplugBatch(HotplugBatchResult {
            masks_before: vec!["2".into()],
            ops: vec![HotplugOpResult {
                us: 5,
                writes: 1,
                error: None,
                masks: vec!["".into()],
                between: vec![],
                online: "0-1".into(),
                reads: vec![Ok(vec![1, 2, 3]), Err("EBADF".into())],
                injected: Some(true),
            }],
        });
        let line = serde_json::to_string(&msg).unwrap();
        assert_eq!(serde_json::from_str::<AgentMessage>(&line).unwrap(), msg);
        let req = HostRequest::PerfOps {
            ops: vec![
                PerfOp::Open {
                    attr: PerfAttr {
                        flags: 1,
                        ..PerfAttr::default()
                    },
                    cpu: 2,
                    group: Some(3),
                },
                PerfOp::Ioctl {
                    handle: 4,
                    ioctl: PerfIoctl::Reset { group: true },
                },
                PerfOp::Read { handle: 4 },
                PerfOp::Close { handle: 4 },
            ],
        };
        let line = serde_json::to_string(&req).unwrap();
        assert!(
            line.starts_with(r#"{"request":"perf_ops","ops":[{"op":"open","#),
            "{line}"
        );
        assert_eq!(serde_json::from_str::<HostRequest>(&line).unwrap(), req);
        let msg = AgentMessage::PerfOps {
            results: vec![
                PerfOpResult {
                    time_ns: 9,
                    took_ns: 2,
                    result: Ok(vec![5]),
                },
                PerfOpResult {
                    time_ns: 12,
                    took_ns: 1,
                    result: Err("EBUSY".into()),
                },
            ],
        };
        let line = serde_json::to_string(&msg).unwrap();
        assert!(line.contains(r#"{"Err":"EBUSY"}"#), "{line}");
        assert_eq!(serde_json::from_str::<AgentMessage>(&line).unwrap(), msg);
        let spec = JobSpec::OpenCloseLoop {
            attrs: vec![PerfAttr::default()],
            pause_us: 100,
        };
        let req = HostRequest::StartJob { spec };
        assert_eq!(
            serde_json::from_str::<HostRequest>(&serde_json::to_string(&req).unwrap()).unwrap(),
            req
        );
    }
}
