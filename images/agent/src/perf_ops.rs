//! A batch of perf operations (open, ioctl, read, close), each timed and
//! journaled: the guest side of the lifecycle stress, which replays the
//! journal against its model of perf's counting semantics.

use std::time::Instant;

use perfbed_agent::{GuestEventKind, PerfOp, PerfOpResult};

use crate::journal::{self, Journal};
use crate::perf::{errno_name, Events, SysError};

/// Runs `ops` in order; a failed one is answered with its errno and the
/// batch goes on (the next ops may name a handle it did not give: they
/// fail with `EBADF`, as they would for a user).
pub fn run(ops: Vec<PerfOp>, events: &mut Events, journal: &mut Journal) -> Vec<PerfOpResult> {
    ops.into_iter()
        .map(|op| {
            let start = Instant::now();
            let result = run_op(&op, events).map_err(|e: SysError| errno_name(e.errno));
            let took_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
            let time_ns = journal::now_ns();
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
