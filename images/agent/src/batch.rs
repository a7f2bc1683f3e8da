//! A batch of CPU hotplug operations, each timed and followed by a look at
//! where the watched PMUs sit and by a read of the watched events: the
//! guest side of `cargo xtask stress`.

use std::time::Instant;

use perfbed_agent::{HotplugBatchResult, HotplugOp, HotplugOpResult};

use crate::perf::{errno_name, Events};
use crate::{read_trimmed, set_cpu_online, CPU_SYSFS};

fn cpumask_path(pmu: &str) -> String {
    format!("/sys/bus/event_source/devices/{pmu}/cpumask")
}

/// The `cpumask` files of `pmus`, in order; a missing file reads as "?".
fn masks(pmus: &[String]) -> Vec<String> {
    pmus.iter()
        .map(|pmu| read_trimmed(&cpumask_path(pmu)).unwrap_or_else(|_| "?".into()))
        .collect()
}

pub fn run(
    ops: &[HotplugOp],
    watch_pmus: &[String],
    read_handles: &[u32],
    events: &Events,
) -> HotplugBatchResult {
    let masks_before = masks(watch_pmus);
    let ops = ops
        .iter()
        .map(|op| run_op(op, watch_pmus, read_handles, events))
        .collect();
    HotplugBatchResult { masks_before, ops }
}

/// A CPU's fail injection disarmed (`CPUHP_INVALID`).
const DISARMED: i64 = -1;

fn fail_file(cpu: u32) -> String {
    format!("{CPU_SYSFS}/cpu{cpu}/hotplug/fail")
}

fn arm(cpu: u32, state: i64) -> Result<(), String> {
    std::fs::write(fail_file(cpu), state.to_string())
        .map_err(|e| format!("arming state {state} of CPU {cpu}: {e}"))
}

/// [`HotplugOp::FailAt`]: (sysfs writes, error, injected).
fn fail_at(cpu: u32, online: bool, state: i64) -> (u32, Option<String>, Option<bool>) {
    if let Err(e) = arm(cpu, state) {
        return (1, Some(e), None);
    }
    let result = set_cpu_online(cpu, online);
    let armed = read_trimmed(&fail_file(cpu)).map(|text| text.parse::<i64>());
    match (result, armed) {
        (Err(e), Ok(Ok(DISARMED))) if e.contains("temporarily unavailable") => {
            (2, None, Some(true))
        }
        (Ok(()), Ok(Ok(a))) if a == state => {
            let undone = arm(cpu, DISARMED).and_then(|()| set_cpu_online(cpu, !online));
            (
                4,
                undone
                    .err()
                    .map(|e| format!("undoing an operation that did not reach state {state}: {e}")),
                Some(false),
            )
        }
        (result, armed) => {
            let _ = arm(cpu, DISARMED);
            (3, Some(format!("state {state} of CPU {cpu}: the operation gave {result:?}, the fail file {armed:?}")), None)
        }
    }
}

fn run_op(
    op: &HotplugOp,
    watch_pmus: &[String],
    read_handles: &[u32],
    events: &Events,
) -> HotplugOpResult {
    let start = Instant::now();
    let mut between = Vec::new();
    let mut injected = None;
    let (writes, error) = match op {
        HotplugOp::FailAt { cpu, online, state } => {
            let (writes, error, outcome) = fail_at(*cpu, *online, *state);
            injected = outcome;
            (writes, error)
        }
        HotplugOp::Set { cpu, online } => (1, set_cpu_online(*cpu, *online).err()),
        HotplugOp::FlapOwner { pmu } => match read_trimmed(&cpumask_path(pmu)) {
            // Parked, or on CPU 0 where it cannot go (x86: no `online`
            // file; on arm64 it has one and goes): nothing to flap.
            Ok(mask)
                if mask.is_empty()
                    || (mask == "0"
                        && !std::path::Path::new(&format!("{CPU_SYSFS}/cpu0/online")).exists()) =>
            {
                (0, None)
            }
            Ok(mask) => match mask.parse::<u32>() {
                Ok(owner) => match set_cpu_online(owner, false) {
                    Ok(()) => {
                        // Timing covers the writes only, not the looks between.
                        let paused = Instant::now();
                        between = masks(watch_pmus);
                        let looked = paused.elapsed();
                        let result = set_cpu_online(owner, true).err();
                        return finish(
                            start.elapsed().saturating_sub(looked),
                            2,
                            result,
                            between,
                            watch_pmus,
                            read_handles,
                            events,
                        );
                    }
                    Err(e) => (1, Some(e)),
                },
                Err(_) => (0, Some(format!("{pmu}/cpumask {mask:?} is not one CPU"))),
            },
            Err(e) => (0, Some(e)),
        },
    };
    HotplugOpResult {
        injected,
        ..finish(
            start.elapsed(),
            writes,
            error,
            between,
            watch_pmus,
            read_handles,
            events,
        )
    }
}

fn finish(
    took: std::time::Duration,
    writes: u32,
    error: Option<String>,
    between: Vec<String>,
    watch_pmus: &[String],
    read_handles: &[u32],
    events: &Events,
) -> HotplugOpResult {
    HotplugOpResult {
        us: took.as_micros() as u64,
        writes,
        error,
        masks: masks(watch_pmus),
        between,
        online: read_trimmed(&format!("{CPU_SYSFS}/online")).unwrap_or_else(|e| e),
        reads: read_handles
            .iter()
            .map(|&h| events.read(h).map_err(|e| errno_name(e.errno)))
            .collect(),
        injected: None,
    }
}
