//! Register accesses from a chosen CPU, through a `/dev/mem` mapping.
//!
//! The device enforces per-CPU placement rules, so which CPU makes an access
//! matters: the agent pins itself to that CPU first (sched_setaffinity
//! migrates the caller before it returns) and restores its affinity after.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;

use perfbed_agent::MmioAccess;

/// Maps `[base, base + size)` for the duration of one request.
pub struct Mapping {
    ptr: *mut u8,
    size: usize,
}

impl Mapping {
    pub fn new(base: u64, size: u64) -> Result<Mapping, String> {
        let size = usize::try_from(size).map_err(|_| format!("size {size:#x} too large"))?;
        if size == 0 || !base.is_multiple_of(4096) {
            return Err(format!(
                "bad region {size:#x}@{base:#x}: empty or not page aligned"
            ));
        }
        let offset =
            libc::off_t::try_from(base).map_err(|_| format!("base {base:#x} too large"))?;
        let mem = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/mem")
            .map_err(|e| format!("open /dev/mem: {e}"))?;
        // SAFETY: a fresh shared mapping of a device region; the kernel
        // validates the range, and the file may close once it is mapped.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                mem.as_raw_fd(),
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!(
                "mmap {size:#x}@{base:#x}: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            size,
        })
    }

    pub fn register(&self, offset: u64) -> Result<*mut u64, String> {
        match usize::try_from(offset) {
            Ok(o) if o % 8 == 0 && o.checked_add(8).is_some_and(|end| end <= self.size) => {
                // SAFETY: in bounds and 8-byte aligned, checked above.
                Ok(unsafe { self.ptr.add(o) }.cast())
            }
            _ => Err(format!(
                "offset {offset:#x} is not an aligned register inside {:#x} bytes",
                self.size
            )),
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/size are exactly what mmap returned.
        unsafe { libc::munmap(self.ptr.cast(), self.size) };
    }
}

pub fn run(base: u64, size: u64, accesses: &[MmioAccess]) -> Result<Vec<u64>, String> {
    let mapping = Mapping::new(base, size)?;
    let saved = affinity()?;
    let result = accesses.iter().map(|a| access(&mapping, a)).collect();
    set_affinity(&saved)?;
    result
}

/// Reads `REG_MAGIC` (offset 0) from `cpu` between two readings of `clock`:
/// (before, after).
pub fn clock_sync(
    base: u64,
    size: u64,
    cpu: u32,
    clock: fn() -> u64,
) -> Result<(u64, u64), String> {
    let mapping = Mapping::new(base, size)?;
    let saved = affinity()?;
    // Pinned first, so that only the read itself lies between the stamps.
    let pin = MmioAccess {
        cpu,
        offset: 0,
        write: None,
    };
    access(&mapping, &pin)?;
    let before = clock();
    // SAFETY: offset 0 is inside the mapping and 8-byte aligned.
    let _magic = unsafe { std::ptr::read_volatile(mapping.register(0)?) };
    let after = clock();
    set_affinity(&saved)?;
    Ok((before, after))
}

fn access(mapping: &Mapping, a: &MmioAccess) -> Result<u64, String> {
    let register = mapping.register(a.offset)?;
    pin_to(a.cpu)?;
    // SAFETY: register points at a mapped, aligned device register; volatile
    // so that each access reaches the device exactly once, as one 8-byte access.
    Ok(unsafe {
        match a.write {
            Some(value) => {
                std::ptr::write_volatile(register, value);
                0
            }
            None => std::ptr::read_volatile(register),
        }
    })
}

/// Moves the calling thread to `cpu` (and only there).
pub fn pin_to(cpu: u32) -> Result<(), String> {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET only index it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let cpu = usize::try_from(cpu).map_err(|_| "cpu out of range".to_string())?;
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(format!("CPU {cpu} out of range"));
    }
    // SAFETY: cpu < CPU_SETSIZE, checked above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    set_affinity(&set).map_err(|e| format!("pinning to CPU {cpu}: {e}"))
}

pub fn affinity() -> Result<libc::cpu_set_t, String> {
    // SAFETY: cpu_set_t is plain data, filled by the kernel.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer and size for this thread's affinity.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) } != 0 {
        return Err(format!(
            "sched_getaffinity: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(set)
}

pub fn set_affinity(set: &libc::cpu_set_t) -> Result<(), String> {
    // SAFETY: valid pointer and size; the kernel migrates us before returning.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(set), set) } != 0 {
        return Err(format!(
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}
