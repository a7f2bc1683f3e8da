//! The guest events the agent records for the host's trace: CPU hotplug,
//! perf opens and closes, PMU cpumasks read, each stamped with the guest's
//! `CLOCK_MONOTONIC`. The host collects them with an `events` request.

use perfbed_agent::{GuestEvent, GuestEventKind};

/// Most events kept between two collections; older ones are dropped (the
/// host's trace then starts later on the guest side).
const MAX_EVENTS: usize = 1 << 16;

#[derive(Default)]
pub struct Journal {
    events: Vec<GuestEvent>,
}

impl Journal {
    pub fn record(&mut self, time_ns: u64, kind: GuestEventKind) {
        if self.events.len() >= MAX_EVENTS {
            self.events.remove(0);
        }
        self.events.push(GuestEvent { time_ns, kind });
    }

    /// Everything recorded so far, which is then forgotten.
    pub fn take(&mut self) -> Vec<GuestEvent> {
        std::mem::take(&mut self.events)
    }
}

/// The guest's `CLOCK_MONOTONIC` in ns.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}
