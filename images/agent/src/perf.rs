//! perf_event_open from the agent: events opened on the host's request, kept
//! under handles until closed, and the open-versus-hotplug race.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use perfbed_agent::{PerfAttr, RaceResult};

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
    reserved_3: u32,
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

impl SysError {
    fn last(call: &'static str) -> SysError {
        SysError { errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0), call }
    }
}

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
        _ => return format!("errno {errno}"),
    };
    name.to_string()
}

pub fn open(attr: &PerfAttr, pid: i32, cpu: i32, group_fd: i32) -> Result<OwnedFd, SysError> {
    let raw = RawAttr {
        type_: attr.type_,
        size: std::mem::size_of::<RawAttr>() as u32,
        config: attr.config,
        sample_period: attr.sample_period,
        sample_type: attr.sample_type,
        read_format: attr.read_format,
        flags: attr.flags,
        config1: attr.config1,
        config2: attr.config2,
        ..RawAttr::default()
    };
    // SAFETY: raw is a valid, fully initialised perf_event_attr that outlives
    // the call; the other arguments are plain integers.
    let fd = unsafe {
        libc::syscall(libc::SYS_perf_event_open, &raw as *const RawAttr, pid, cpu, group_fd, PERF_FLAG_FD_CLOEXEC)
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
    let n = file.read(&mut buf).map_err(|e| SysError { errno: e.raw_os_error().unwrap_or(0), call: "read" })?;
    Ok(buf[..n].chunks_exact(8).map(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes"))).collect())
}

/// Open events, by handle.
#[derive(Default)]
pub struct Events {
    open: BTreeMap<u32, OwnedFd>,
    next: u32,
}

impl Events {
    pub fn open(&mut self, attr: &PerfAttr, pid: i32, cpu: i32, group: Option<u32>) -> Result<u32, SysError> {
        let group_fd = match group {
            Some(handle) => self.open.get(&handle).map(|fd| fd.as_raw_fd()).ok_or(SysError { errno: libc::EBADF, call: "group handle" })?,
            None => -1,
        };
        let fd = open(attr, pid, cpu, group_fd)?;
        self.next += 1;
        self.open.insert(self.next, fd);
        Ok(self.next)
    }

    pub fn read(&self, handle: u32) -> Result<Vec<u64>, SysError> {
        read(self.open.get(&handle).ok_or(SysError { errno: libc::EBADF, call: "handle" })?)
    }

    /// The open descriptor behind a handle (borrowed).
    pub fn fd(&self, handle: u32) -> Option<&OwnedFd> {
        self.open.get(&handle)
    }

    pub fn close(&mut self, handle: u32) -> Result<(), SysError> {
        self.open.remove(&handle).map(drop).ok_or(SysError { errno: libc::EBADF, call: "handle" })
    }
}

/// Opens events in a loop while another thread toggles CPUs `hotplug_ops`
/// times; see the protocol.
pub fn open_race(attr: &PerfAttr, cpu: i32, hotplug_ops: u32, toggle_cpus: &[u32], keep: u32) -> Result<RaceResult, String> {
    if toggle_cpus.is_empty() || hotplug_ops == 0 {
        return Err("the race needs CPUs to toggle and a number of hotplug operations".into());
    }
    let done = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU32::new(0));
    let toggler = {
        let (done, ops, cpus) = (done.clone(), ops.clone(), toggle_cpus.to_vec());
        std::thread::spawn(move || -> Result<(), String> {
            let result = (|| {
                // Each CPU offline then online, one at a time, round and round.
                let steps: Vec<(u32, bool)> = cpus.iter().flat_map(|&c| [(c, false), (c, true)]).collect();
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
        match open(attr, -1, cpu, -1) {
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
    toggler.join().map_err(|_| "the hotplug thread panicked".to_string())??;
    for &c in toggle_cpus {
        crate::set_cpu_online(c, true)?;
    }
    let mut final_values = Vec::new();
    for fd in &kept {
        final_values.push(read(fd).map_err(|e| format!("{}: {}", e.call, errno_name(e.errno)))?.first().copied().unwrap_or(0));
    }
    Ok(RaceResult {
        attempts,
        opened,
        busy,
        other_errors: errors.into_iter().map(|(k, v)| format!("{k}: {v}")).collect(),
        hotplug_ops: ops.load(Ordering::Relaxed),
        final_values,
    })
}
