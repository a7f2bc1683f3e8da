//! Where the vCPU threads meet the stub: on a debug exit a vCPU thread asks
//! the hub whether the exit is the debugger's (an `int3` at one of its
//! breakpoints, the trap of a step it asked of this vCPU); if so the stop is
//! queued, the stub's eventfd is written, and the vCPU parks. Any other
//! `int3` is the guest's own and goes back to it.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Mutex, MutexGuard};

use vmm_sys_util::eventfd::EventFd;

use crate::vcpu::{DebugExit, DebugExits, BREAKPOINT_VECTOR, DEBUG_VECTOR};

/// Why a vCPU stopped for the debugger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopKind {
    Breakpoint,
    Step,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stop {
    pub vcpu: u8,
    pub kind: StopKind,
}

#[derive(Debug, Default)]
struct State {
    breakpoints: BTreeSet<u64>,
    stepping: BTreeSet<u8>,
    stops: VecDeque<Stop>,
}

pub struct Hub {
    state: Mutex<State>,
    /// Written on each stop queued: the stub polls it beside gdb's socket.
    pub wake: EventFd,
}

impl Hub {
    pub fn new() -> std::io::Result<Hub> {
        Ok(Hub {
            state: Mutex::new(State::default()),
            wake: EventFd::new(libc::EFD_NONBLOCK)?,
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the next resume arms: the breakpoints' addresses and the vCPUs
    /// that step. Stops queued before it are dropped: those vCPUs were
    /// paused with the rest, and an `int3` they stopped on is still there to
    /// be hit again (KVM leaves RIP on it).
    pub fn arm(&self, breakpoints: Vec<u64>, stepping: BTreeSet<u8>) {
        let mut state = self.state();
        state.breakpoints = breakpoints.into_iter().collect();
        state.stepping = stepping;
        state.stops.clear();
        let _ = self.wake.read();
    }

    /// The first stop queued, if any.
    pub fn take_stop(&self) -> Option<Stop> {
        let _ = self.wake.read();
        self.state().stops.pop_front()
    }
}

impl DebugExits for Hub {
    fn claim(&self, vcpu: u8, exit: &DebugExit) -> bool {
        let mut state = self.state();
        let kind = match exit.exception {
            BREAKPOINT_VECTOR if state.breakpoints.contains(&exit.pc) => StopKind::Breakpoint,
            DEBUG_VECTOR if state.stepping.contains(&vcpu) => StopKind::Step,
            _ => return false,
        };
        state.stops.push_back(Stop { vcpu, kind });
        let _ = self.wake.write(1);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_debuggers_exits_are_claimed() {
        let hub = Hub::new().unwrap();
        hub.arm(vec![0xffff_ffff_8100_0000], [2].into_iter().collect());
        let bp = |pc| DebugExit {
            exception: BREAKPOINT_VECTOR,
            pc,
        };
        // The guest's own int3 (text patching) is not the debugger's.
        assert!(!hub.claim(0, &bp(0xffff_ffff_8100_0010)));
        assert!(hub.claim(1, &bp(0xffff_ffff_8100_0000)));
        // A step's trap only on the vCPU that was asked to step.
        let step = DebugExit {
            exception: DEBUG_VECTOR,
            pc: 0x1234,
        };
        assert!(!hub.claim(0, &step));
        assert!(hub.claim(2, &step));
        assert_eq!(
            hub.take_stop(),
            Some(Stop {
                vcpu: 1,
                kind: StopKind::Breakpoint
            })
        );
        assert_eq!(
            hub.take_stop(),
            Some(Stop {
                vcpu: 2,
                kind: StopKind::Step
            })
        );
        assert_eq!(hub.take_stop(), None);
    }

    #[test]
    fn arming_drops_stale_stops_and_wakes() {
        let hub = Hub::new().unwrap();
        hub.arm(vec![0x1000], BTreeSet::new());
        assert!(hub.claim(
            3,
            &DebugExit {
                exception: BREAKPOINT_VECTOR,
                pc: 0x1000
            }
        ));
        assert_eq!(hub.wake.read().unwrap(), 1, "the stub was not woken");
        hub.arm(vec![], BTreeSet::new());
        assert_eq!(hub.take_stop(), None);
        // With the breakpoint gone, the same int3 is the guest's.
        assert!(!hub.claim(
            3,
            &DebugExit {
                exception: BREAKPOINT_VECTOR,
                pc: 0x1000
            }
        ));
    }
}
