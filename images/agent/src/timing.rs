//! Timing loops for `cargo xtask bench`: the same read made many times from
//! one CPU, timed as a whole so the clock's own cost stays out of the figure.

use std::os::fd::AsRawFd;
use std::time::Instant;

use perfbed_agent::{AgentMessage, ReadTarget};

use crate::mmio::{self, Mapping};
use crate::perf::Events;

/// Pinned to `cpu`, reads `target` `iterations` times; the affinity is
/// restored afterwards whatever happened.
pub fn time_reads(
    target: &ReadTarget,
    cpu: u32,
    iterations: u32,
    events: &Events,
) -> Result<AgentMessage, String> {
    if iterations == 0 {
        return Err("time_reads: 0 iterations".into());
    }
    let saved = mmio::affinity()?;
    let result = mmio::pin_to(cpu).and_then(|()| match target {
        ReadTarget::Event { handle } => {
            let fd = events
                .fd(*handle)
                .map_err(|_| format!("no open event {handle}"))?;
            time_event_reads(fd.as_raw_fd(), iterations)
        }
        ReadTarget::Mmio { base, size, offset } => {
            let mapping = Mapping::new(*base, *size)?;
            time_loads(mapping.register(*offset)?, iterations)
        }
    });
    mmio::set_affinity(&saved)?;
    let (total_ns, last) = result?;
    Ok(AgentMessage::Timed {
        iterations,
        total_ns,
        last,
    })
}

fn time_event_reads(fd: i32, iterations: u32) -> Result<(u64, u64), String> {
    let mut buf = [0u64; 64];
    let start = Instant::now();
    for _ in 0..iterations {
        // SAFETY: fd is an open perf event the caller owns; buf is writable
        // for its whole size.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), std::mem::size_of_val(&buf)) };
        if n < 8 {
            return Err(format!(
                "read of a perf event gave {n}: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok((elapsed_ns(start), buf[0]))
}

fn time_loads(register: *mut u64, iterations: u32) -> Result<(u64, u64), String> {
    let mut last = 0;
    let start = Instant::now();
    for _ in 0..iterations {
        // SAFETY: Mapping::register checked that the pointer is inside the
        // mapping and aligned; volatile makes every load reach the device.
        last = unsafe { std::ptr::read_volatile(register) };
    }
    Ok((elapsed_ns(start), last))
}

fn elapsed_ns(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}
