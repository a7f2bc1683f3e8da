//! A batch of perf operations (open, ioctl, read, close), each timed and
//! journaled: the guest side of the lifecycle stress, which replays the
//! journal against its model of perf's counting semantics.

use perfbed_agent::{GuestEventKind, PerfOp, PerfOpResult};

use crate::journal::{self, Journal};
use crate::perf::{errno_name, Events, SysError};

/// Runs `ops` in order; a failed one is answered with its errno and the
/// batch goes on (the next ops may name a handle it did not give: they
/// fail with `EBADF`, as they would for a user).
pub fn run(ops: Vec<PerfOp>, events: &mut Events, journal: &mut Journal) -> Vec<PerfOpResult> {
    ops.into_iter()
        .map(|op| {
            let (result, time_ns, took_ns) = timed(journal::now_ns, || {
                run_op(&op, events).map_err(|e: SysError| errno_name(e.errno))
            });
            journal.record(
                time_ns,
                GuestEventKind::PerfOp {
                    op,
                    took_ns,
                    result: result.clone(),
                },
            );
            PerfOpResult {
                time_ns,
                took_ns,
                result,
            }
        })
        .collect()
}

/// Runs `call` between two readings of `clock`: what it answered, the
/// second reading (when it returned) and the two apart (how long it took).
/// So `returned - took` is the first reading, exactly: the host takes it
/// for when the call began (how far apart reads one after the other lay).
/// A third reading for the return, after the one that measured how long
/// the call took, put that start late by however long the vCPU was not run
/// between those two (5.5 ms once in the box, where a group leader's read
/// then seemed to begin after the device had served it).
fn timed<T>(mut clock: impl FnMut() -> u64, call: impl FnOnce() -> T) -> (T, u64, u64) {
    let start = clock();
    let answer = call();
    let end = clock();
    (answer, end, end.saturating_sub(start))
}

fn run_op(op: &PerfOp, events: &mut Events) -> Result<Vec<u64>, SysError> {
    match op {
        PerfOp::Open { attr, cpu, group } => events
            .open(attr, -1, *cpu, *group)
            .map(|h| vec![u64::from(h)]),
        PerfOp::Ioctl { handle, ioctl } => events.ioctl(*handle, ioctl).map(|v| vec![v]),
        PerfOp::Read { handle } => events.read(*handle),
        PerfOp::Close { handle } => events.close(*handle).map(|()| vec![]),
    }
}

#[cfg(test)]
mod tests {
    use super::timed;

    #[test]
    fn a_call_began_at_the_reading_before_it() {
        // A clock 5 ms further at every reading: a vCPU not run between
        // any two of them.
        let mut now = 0;
        let clock = || {
            now += 5_000_000;
            now
        };
        let (answer, returned, took) = timed(clock, || 7);
        assert_eq!(answer, 7);
        assert_eq!(returned, 10_000_000);
        assert_eq!(returned - took, 5_000_000, "the reading before the call");
    }
}
