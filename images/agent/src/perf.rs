//! perf_event_open from the agent: events opened on the host's request, kept
//! under handles until closed, and the open-versus-hotplug race.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

pub use perfbed_agent::errno_name;
use perfbed_agent::{PerfAttr, PerfIoctl, RaceResult};

/// `struct perf_event_attr` as of PERF_ATTR_SIZE_VER8 (136 bytes), the
/// layout of include/uapi/linux/perf_event.h in 6.12.
#[repr(C)]
#[derive(Default)]
struct RawAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved_2: u16,
    aux_sample_size: u32,
    /// aux_start_paused = bit 0, aux_pause = 1, aux_resume = 2.
    aux_action: u32,
    sig_data: u64,
    config3: u64,
}

const _: () = assert!(std::mem::size_of::<RawAttr>() == 136);

/// perf_event_open's flags argument (uapi PERF_FLAG_FD_CLOEXEC).
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// A failed system call: errno and which call.
#[derive(Debug)]
pub struct SysError {
    pub errno: i32,
    pub call: &'static str,
}

impl std::fmt::Display for SysError {
    /// "call: ERRNO", e.g. "bpf(BPF_PROG_LOAD): EINVAL".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.call, errno_name(self.errno))
    }
}

impl SysError {
    pub(crate) fn last(call: &'static str) -> SysError {
        SysError {
            errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            call,
        }
    }
}

fn raw_attr(attr: &PerfAttr) -> RawAttr {
    RawAttr {
        type_: attr.type_,
        size: if attr.size == 0 {
            std::mem::size_of::<RawAttr>() as u32
        } else {
            attr.size
        },
        config: attr.config,
        sample_period: attr.sample_period,
        sample_type: attr.sample_type,
        read_format: attr.read_format,
        flags: attr.flags,
        wakeup_events: attr.wakeup_events,
        bp_type: attr.bp_type,
        config1: attr.config1,
        config2: attr.config2,
        branch_sample_type: attr.branch_sample_type,
        sample_regs_user: attr.sample_regs_user,
        sample_stack_user: attr.sample_stack_user,
        clockid: attr.clockid,
        sample_regs_intr: attr.sample_regs_intr,
        aux_watermark: attr.aux_watermark,
        sample_max_stack: attr.sample_max_stack,
        aux_sample_size: attr.aux_sample_size,
        aux_action: attr.aux_action,
        sig_data: attr.sig_data,
        config3: attr.config3,
        ..RawAttr::default()
    }
}

pub fn open(attr: &PerfAttr, pid: i32, cpu: i32, group_fd: i32) -> Result<OwnedFd, SysError> {
    open_with(attr, pid, cpu, group_fd, 0)
}

/// perf_event_open with PERF_FLAG_* `flags` besides PERF_FLAG_FD_CLOEXEC.
/// A size above the agent's own is padded with zeroes (the kernel accepts
/// zero tails); the buffer is a page, the most the kernel reads.
pub fn open_with(
    attr: &PerfAttr,
    pid: i32,
    cpu: i32,
    group_fd: i32,
    flags: u64,
) -> Result<OwnedFd, SysError> {
    let raw = raw_attr(attr);
    let mut page = vec![0u8; 4096];
    // SAFETY: RawAttr is plain old data of 136 bytes; the page holds it.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            &raw as *const RawAttr as *const u8,
            std::mem::size_of::<RawAttr>(),
        )
    };
    page[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: page holds a perf_event_attr and as many bytes as the kernel
    // may read (attr.size is at most a page, or the kernel refuses it
    // before reading); it outlives the call. The rest are plain integers.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            page.as_ptr(),
            pid,
            cpu,
            group_fd,
            flags as libc::c_ulong | PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(SysError::last("perf_event_open"));
    }
    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The u64 words one read() of the event gives (its read_format decides how many).
pub fn read(fd: &OwnedFd) -> Result<Vec<u64>, SysError> {
    let mut buf = [0u8; 8 * 64];
    let mut file = File::from(fd.try_clone().map_err(|_| SysError::last("dup"))?);
    let n = file.read(&mut buf).map_err(|e| SysError {
        errno: e.raw_os_error().unwrap_or(0),
        call: "read",
    })?;
    Ok(buf[..n]
        .chunks_exact(8)
        .map(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")))
        .collect())
}

// PERF_EVENT_IOC_* (uapi/linux/perf_event.h): _IO/_IOR/_IOW('$', n, ...).
const IOC_ENABLE: u64 = 0x2400;
const IOC_DISABLE: u64 = 0x2401;
const IOC_REFRESH: u64 = 0x2402;
const IOC_RESET: u64 = 0x2403;
const IOC_PERIOD: u64 = 0x4008_2404;
const IOC_SET_OUTPUT: u64 = 0x2405;
const IOC_SET_FILTER: u64 = 0x4008_2406;
const IOC_ID: u64 = 0x8008_2407;
const IOC_SET_BPF: u64 = 0x4004_2408;
const IOC_PAUSE_OUTPUT: u64 = 0x4004_2409;
const IOC_QUERY_BPF: u64 = 0xc008_240a;
const IOC_MODIFY_ATTRIBUTES: u64 = 0x4008_240b;
const IOC_FLAG_GROUP: u64 = 1;

/// `struct perf_event_query_bpf` with room for no ids.
#[repr(C)]
struct QueryBpf {
    ids_len: u32,
    prog_cnt: u32,
}

fn ioctl_ret(fd: &OwnedFd, request: u64, arg: u64) -> Result<u64, SysError> {
    // SAFETY: `arg` is an integer or points to memory the caller keeps alive
    // and sized as `request` says; the fd is open.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), request as libc::c_ulong, arg) };
    if r < 0 {
        return Err(SysError::last("ioctl"));
    }
    Ok(r as u64)
}

/// Open events, by handle.
#[derive(Default)]
pub struct Events {
    open: BTreeMap<u32, OwnedFd>,
    next: u32,
}

impl Events {
    pub fn open(
        &mut self,
        attr: &PerfAttr,
        pid: i32,
        cpu: i32,
        group: Option<u32>,
    ) -> Result<u32, SysError> {
        self.open_flags(attr, pid, cpu, group, 0)
    }

    /// perf_event_open with PERF_FLAG_* `flags`.
    pub fn open_flags(
        &mut self,
        attr: &PerfAttr,
        pid: i32,
        cpu: i32,
        group: Option<u32>,
        flags: u64,
    ) -> Result<u32, SysError> {
        let group_fd = match group {
            Some(handle) => self.fd(handle)?.as_raw_fd(),
            None => -1,
        };
        let fd = open_with(attr, pid, cpu, group_fd, flags)?;
        self.next += 1;
        self.open.insert(self.next, fd);
        Ok(self.next)
    }

    /// The open descriptor behind a handle (borrowed).
    pub fn fd(&self, handle: u32) -> Result<&OwnedFd, SysError> {
        self.open.get(&handle).ok_or(SysError {
            errno: libc::EBADF,
            call: "handle",
        })
    }

    /// An ioctl on an open event: its return value (the id for `Id`).
    pub fn ioctl(&self, handle: u32, ioctl: &PerfIoctl) -> Result<u64, SysError> {
        let fd = self.fd(handle)?;
        let group = |g: bool| if g { IOC_FLAG_GROUP } else { 0 };
        match ioctl {
            PerfIoctl::Enable { group: g } => ioctl_ret(fd, IOC_ENABLE, group(*g)),
            PerfIoctl::Disable { group: g } => ioctl_ret(fd, IOC_DISABLE, group(*g)),
            PerfIoctl::Reset { group: g } => ioctl_ret(fd, IOC_RESET, group(*g)),
            PerfIoctl::Refresh { count } => ioctl_ret(fd, IOC_REFRESH, *count as i64 as u64),
            PerfIoctl::Period { period } => ioctl_ret(fd, IOC_PERIOD, period as *const u64 as u64),
            PerfIoctl::Id => {
                let mut id = 0u64;
                ioctl_ret(fd, IOC_ID, &mut id as *mut u64 as u64)?;
                Ok(id)
            }
            PerfIoctl::SetOutput { target } => {
                let target = match target {
                    Some(h) => self.fd(*h)?.as_raw_fd(),
                    None => -1,
                };
                ioctl_ret(fd, IOC_SET_OUTPUT, target as i64 as u64)
            }
            PerfIoctl::SetFilter { filter } => {
                let c = std::ffi::CString::new(filter.as_str()).map_err(|_| SysError {
                    errno: libc::EINVAL,
                    call: "filter with NUL",
                })?;
                ioctl_ret(fd, IOC_SET_FILTER, c.as_ptr() as u64)
            }
            PerfIoctl::PauseOutput { pause } => ioctl_ret(fd, IOC_PAUSE_OUTPUT, u64::from(*pause)),
            PerfIoctl::ModifyAttributes { attr } => {
                let raw = raw_attr(attr);
                ioctl_ret(fd, IOC_MODIFY_ATTRIBUTES, &raw as *const RawAttr as u64)
            }
            PerfIoctl::SetBpf { fd: prog } => ioctl_ret(fd, IOC_SET_BPF, *prog as i64 as u64),
            PerfIoctl::QueryBpf => {
                let mut q = QueryBpf {
                    ids_len: 0,
                    prog_cnt: 0,
                };
                ioctl_ret(fd, IOC_QUERY_BPF, &mut q as *mut QueryBpf as u64)
            }
        }
    }

    pub fn read(&self, handle: u32) -> Result<Vec<u64>, SysError> {
        read(self.open.get(&handle).ok_or(SysError {
            errno: libc::EBADF,
            call: "handle",
        })?)
    }

    pub fn close(&mut self, handle: u32) -> Result<(), SysError> {
        self.open.remove(&handle).map(drop).ok_or(SysError {
            errno: libc::EBADF,
            call: "handle",
        })
    }
}

/// Opens events in a loop while another thread toggles CPUs `hotplug_ops`
/// times; see the protocol.
pub fn open_race(
    attr: &PerfAttr,
    cpu: i32,
    hotplug_ops: u32,
    toggle_cpus: &[u32],
    keep: u32,
    software_siblings: bool,
) -> Result<RaceResult, String> {
    if toggle_cpus.is_empty() || hotplug_ops == 0 {
        return Err("the race needs CPUs to toggle and a number of hotplug operations".into());
    }
    // With siblings, the loop opens cpu-clock events into the group of a
    // leader of `attr`, opened before any CPU moves.
    let cpu_clock = PerfAttr {
        type_: 1,  // PERF_TYPE_SOFTWARE
        config: 0, // PERF_COUNT_SW_CPU_CLOCK
        ..PerfAttr::default()
    };
    let leader = if software_siblings {
        Some(open(attr, -1, cpu, -1).map_err(|e| format!("the race's group leader: {e}"))?)
    } else {
        None
    };
    let (loop_attr, group_fd, keep) = match &leader {
        Some(fd) => (&cpu_clock, fd.as_raw_fd(), 0),
        None => (attr, -1, keep),
    };
    let done = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU32::new(0));
    let toggler = {
        let (done, ops, cpus) = (done.clone(), ops.clone(), toggle_cpus.to_vec());
        std::thread::spawn(move || -> Result<(), String> {
            let result = (|| {
                // Each CPU offline then online, one at a time, round and round.
                let steps: Vec<(u32, bool)> =
                    cpus.iter().flat_map(|&c| [(c, false), (c, true)]).collect();
                for &(cpu, online) in steps.iter().cycle().take(hotplug_ops as usize) {
                    crate::set_cpu_online(cpu, online)?;
                    ops.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })();
            done.store(true, Ordering::Release);
            result
        })
    };
    let mut kept = Vec::new();
    let (mut attempts, mut opened, mut busy) = (0, 0, 0);
    let mut errors = BTreeMap::<String, u32>::new();
    while !done.load(Ordering::Acquire) {
        attempts += 1;
        match open(loop_attr, -1, cpu, group_fd) {
            Ok(fd) => {
                opened += 1;
                // Reading makes the PMU's read run where the event counts.
                let _ = read(&fd);
                if kept.len() < keep as usize {
                    kept.push(fd);
                }
            }
            Err(e) if e.errno == libc::EBUSY => busy += 1,
            Err(e) => *errors.entry(errno_name(e.errno)).or_default() += 1,
        }
    }
    toggler
        .join()
        .map_err(|_| "the hotplug thread panicked".to_string())??;
    for &c in toggle_cpus {
        crate::set_cpu_online(c, true)?;
    }
    let mut final_values = Vec::new();
    for fd in leader.iter().chain(&kept) {
        final_values.push(
            read(fd)
                .map_err(|e| e.to_string())?
                .first()
                .copied()
                .unwrap_or(0),
        );
    }
    Ok(RaceResult {
        attempts,
        opened,
        busy,
        other_errors: errors
            .into_iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect(),
        hotplug_ops: ops.load(Ordering::Relaxed),
        final_values,
    })
}
