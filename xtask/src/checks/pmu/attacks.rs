//! More adversarial checks of docs/counting-semantics.md, written from the
//! contract alone as a user would attack it (the first seven are in
//! `redteam.rs`): ioctls and reads racing moves made by another thread of
//! the guest, groups whose leader goes away while parked or multiplexed,
//! pinned and exclusive events across a park, more events than slots
//! through a park, and a gauge promoted to a leader of its own.
//!
//! Traffic lands only while the state an expectation depends on is
//! constant (between two batches of operations), so every expected count is
//! exact or a bound the contract states, never a rate estimate. Racing moves
//! come from a bash loop of the guest's own (a background job) toggling one
//! CPU of the domain at a time: the PMU moves, never parks.
//!
//! They stay in Rust because a guest thread's moves race their reads (a
//! journal cannot order them), or because they measure how perf's rotation
//! shares a second (exclusive across a park), which the model leaves to
//! perf; the attacks the model can judge are scenarios (`scenarios/`).
//!
//! What the contract does not promise is not checked: it says nothing of
//! `perf_event_mmap_page` (a counting PMU without `event_idx` gives user
//! space no rdpmc, and the page's time fields are perf core's), so no check
//! reads it.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use perfbed_agent::{
    AgentMessage, HostRequest, JobResult, JobSpec, PerfAttr, PerfIoctl, PerfOp, PerfOpResult,
};
use perfbed_device::regs::Event;

use super::across_moves::turns;
use super::context::{Ctx, MIB, TIMES};
use super::moves::movable_domain;
use super::multiplexing::{set_sysfs, Window, MUX_INTERVAL_MS};
use super::redteam::{inject, must, open_with, owner, park, rmid, Named};
use crate::checks::Check;
use crate::guest::perf_abi::{
    FLAG_DISABLED, FLAG_EXCLUSIVE, FORMAT_GROUP, FORMAT_ID, PERF_COUNT_SW_CPU_CLOCK,
    PERF_TYPE_SOFTWARE,
};
use crate::guest::pmu_name;

/// A bash loop in the guest that takes each of `cpus` offline and back, one
/// at a time, `rounds` times: with two CPUs in the domain every round moves
/// the PMU at least once, and it never parks.
pub(super) fn start_mover(ctx: &mut Ctx, cpus: &[u32], rounds: u32) -> Result<u32> {
    let toggles: Vec<String> = cpus
        .iter()
        .map(|c| format!("echo 0 > /sys/devices/system/cpu/cpu{c}/online; echo 1 > /sys/devices/system/cpu/cpu{c}/online"))
        .collect();
    let script = format!("for i in $(seq {rounds}); do {}; done", toggles.join("; "));
    let argv = vec!["/bin/bash".to_string(), "-c".into(), script];
    match ctx.g.ask(HostRequest::StartJob {
        spec: JobSpec::Process {
            argv,
            perf_fds: 0,
            settle_ms: 0,
        },
    })? {
        AgentMessage::JobStarted { job } => Ok(job),
        other => bail!("starting the mover: {other:?}"),
    }
}

/// Waits for the mover to end by itself and fails unless it exited 0 (a
/// hotplug write refused, or the loop killed).
pub(super) fn finish_mover(ctx: &mut Ctx, job: u32) -> Result<()> {
    match ctx.g.ask(HostRequest::StopJob {
        job,
        signal: 0,
        timeout_ms: 120_000,
    })? {
        AgentMessage::JobDone(JobResult::Process {
            status: Some(0), ..
        }) => Ok(()),
        other => bail!("the mover ended with {other:?}"),
    }
}

/// One batch of perf operations, carried out back to back by the agent.
fn perf_ops(ctx: &mut Ctx, ops: Vec<PerfOp>) -> Result<Vec<PerfOpResult>> {
    let n = ops.len();
    match ctx.g.ask(HostRequest::PerfOps { ops })? {
        AgentMessage::PerfOps { results } if results.len() == n => Ok(results),
        other => bail!("a batch of {n} perf operations: {other:?}"),
    }
}

fn words(r: &PerfOpResult, what: &str) -> Result<Vec<u64>> {
    r.result
        .clone()
        .map_err(|errno| anyhow::anyhow!("{what}: {errno}"))
}

/// H. ENABLE/DISABLE storms on one event while another thread moves its
///    PMU: batches of 40 alternating ioctls (with a read after each), each
///    batch ending enabled or disabled in turn, then a burst that lands
///    before the next batch. Only the bursts landed while it ended enabled
///    count; no read in a storm sees the value move (nothing lands then),
///    time_running run ahead of time_enabled, or either go back.
pub fn enable_disable_storm_during_moves(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let r = rmid(ctx, 15);
    let h = open_with(ctx, d, r, TIMES, 0, None)?;
    let mover = start_mover(ctx, &allowed, 6)?;
    let mut problems = Vec::new();
    let (mut want, mut last, mut batches) = (0u64, vec![0u64, 0, 0], 0);
    let started = Instant::now();
    for batch in 0..12u32 {
        let end_enabled = batch % 2 == 1;
        let mut ops = Vec::new();
        for i in 0..40u32 {
            // Ends with DISABLE on even batches, ENABLE on odd ones.
            let ioctl = if (i % 2 == 0) == end_enabled {
                PerfIoctl::Disable { group: false }
            } else {
                PerfIoctl::Enable { group: false }
            };
            ops.push(PerfOp::Ioctl { handle: h, ioctl });
            ops.push(PerfOp::Read { handle: h });
        }
        for (i, res) in perf_ops(ctx, ops)?.iter().enumerate() {
            if i % 2 == 0 {
                if let Err(errno) = &res.result {
                    problems.push(format!("batch {batch} op {i}: the ioctl failed: {errno}"));
                }
                continue;
            }
            let w = words(res, "a read in the storm")?;
            if w[0] != want || w[2] > w[1] || w[1] < last[1] || w[2] < last[2] {
                problems.push(format!(
                    "batch {batch} read {}: value {} enabled {} running {} after value {} enabled {} running {} (want value {want}: nothing landed in the storm)",
                    i / 2, w[0], w[1], w[2], last[0], last[1], last[2]
                ));
            }
            last = w;
        }
        batches += 1;
        inject(ctx, d, r, MIB)?;
        if end_enabled {
            want += MIB;
        }
        if problems.len() > 4 {
            break;
        }
    }
    let storm = started.elapsed();
    finish_mover(ctx, mover)?;
    // Left disabled (the last batch, 11, ended enabled: disable it now).
    must(ctx, h, PerfIoctl::Disable { group: false })?;
    let off = ctx.g.read(h)?;
    inject(ctx, d, r, 2 * MIB)?;
    std::thread::sleep(Duration::from_millis(100));
    let still = ctx.g.read(h)?;
    must(ctx, h, PerfIoctl::Enable { group: false })?;
    inject(ctx, d, r, 3 * MIB)?;
    let end = ctx.g.read(h)?;
    ctx.g.close(h)?;
    if off[0] != want || still[..] != off[..] {
        problems.push(format!(
            "after the storm, disabled: value {} (want {want}) enabled {} running {}; then 2 MiB landed: value {} enabled {} running {} (want all three unchanged)",
            off[0], off[1], off[2], still[0], still[1], still[2]
        ));
    }
    let after = Window::between(&still, &end);
    if end[0] != want + 3 * MIB || after.running != after.enabled {
        problems.push(format!(
            "ENABLE, 3 MiB: value {} (want {}), Δenabled {} Δrunning {} (want equal: no move, no park)",
            end[0],
            want + 3 * MIB,
            after.enabled,
            after.running
        ));
    }
    Ok(Check::from_problems(
        "attack: enable/disable storm during moves",
        problems,
        format!(
            "{}: {batches} batches of 40 ioctls + reads in {storm:.1?} while CPUs {allowed:?} toggled; counted {} = the {} MiB landed while enabled",
            pmu_name(d),
            end[0],
            end[0] / MIB
        ),
    ))
}

/// I. PERF_FORMAT_GROUP reads (with ids and times) of a two-event group
///    racing moves made by another thread: every read between two bursts
///    gives exactly the traffic landed so far for each member, nr = 2, the
///    same ids, times that never go back and running <= enabled.
pub fn group_reads_racing_moves(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let (r1, r2) = (rmid(ctx, 16), rmid(ctx, 17));
    let rf = TIMES | FORMAT_ID | FORMAT_GROUP;
    let leader = open_with(ctx, d, r1, rf, 0, None)?;
    let sibling = open_with(ctx, d, r2, rf, 0, Some(leader))?;
    let first = ctx.g.read(leader)?;
    let mover = start_mover(ctx, &allowed, 6)?;
    let mut problems = Vec::new();
    let (mut want1, mut want2, mut last, mut reads) = (0u64, 0u64, first.clone(), 0usize);
    for batch in 0..10u32 {
        let ops = (0..60)
            .map(|i| PerfOp::Read {
                handle: if i % 2 == 0 { leader } else { sibling },
            })
            .collect();
        for (i, res) in perf_ops(ctx, ops)?.iter().enumerate() {
            let w = words(res, "a group read racing a move")?;
            reads += 1;
            // nr, enabled, running, {value, id} x 2.
            let ok = w.len() == 7
                && w[0] == 2
                && w[3] == want1
                && w[5] == want2
                && w[4] == first[4]
                && w[6] == first[6]
                && w[2] <= w[1]
                && w[1] >= last[1]
                && w[2] >= last[2];
            if !ok {
                problems.push(format!(
                    "batch {batch} read {i}: {w:?} after {last:?} (want nr 2, values {want1} {want2}, ids {} {}, times monotone, running <= enabled)",
                    first[4], first[6]
                ));
            }
            last = w;
        }
        ctx.inject_and_land(&[
            (d, r1, Event::MbmTotalBytes, MIB),
            (d, r2, Event::MbmTotalBytes, 2 * MIB),
        ])?;
        want1 += MIB;
        want2 += 2 * MIB;
        if problems.len() > 4 {
            break;
        }
    }
    finish_mover(ctx, mover)?;
    let end = ctx.g.read(leader)?;
    ctx.g.close(sibling)?;
    ctx.g.close(leader)?;
    if end.get(3) != Some(&want1) || end.get(5) != Some(&want2) {
        problems.push(format!(
            "after the moves: {end:?}, want values {want1} and {want2}"
        ));
    }
    Ok(Check::from_problems(
        "attack: group reads racing moves",
        problems,
        format!("{}: {reads} PERF_FORMAT_GROUP reads while CPUs {allowed:?} toggled, each exact ({want1} and {want2} at the end)", pmu_name(d)),
    ))
}

/// A cpu-clock event on `cpu`, read with times.
pub(super) fn cpu_clock(ctx: &mut Ctx, cpu: i32, group: Option<u32>) -> Result<u32> {
    let clock = PerfAttr {
        type_: PERF_TYPE_SOFTWARE,
        config: PERF_COUNT_SW_CPU_CLOCK,
        read_format: TIMES,
        ..PerfAttr::default()
    };
    match ctx.g.open_as(clock, -1, cpu, group)? {
        Ok(h) => Ok(h),
        Err(errno) => bail!("opening cpu-clock on CPU {cpu}: {errno}"),
    }
}

/// L. An exclusive event and a plain one on the same PMU take turns (each
///    runs less than the whole window, together no more than it), before a
///    park and after it: a park keeps a group's exclusivity as a move does.
pub fn exclusive_across_park(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let exclusive = open_with(ctx, d, rmid(ctx, 20), TIMES, FLAG_EXCLUSIVE, None)?;
    let plain = open_with(ctx, d, rmid(ctx, 21), TIMES, 0, None)?;
    let before = turns(ctx, exclusive, plain);
    let parked = (|| -> Result<()> {
        park(ctx, &allowed, false)?;
        std::thread::sleep(Duration::from_millis(100));
        park(ctx, &allowed, true)
    })();
    let after = turns(ctx, exclusive, plain);
    ctx.g.close(plain)?;
    ctx.g.close(exclusive)?;
    let (before, (), after) = (before?, parked?, after?);
    let mut problems = Vec::new();
    for (when, (e, p)) in [("before the park", before), ("after the park", after)] {
        if e > 0.95 || p > 0.95 || e + p > 1.05 {
            problems.push(format!(
                "{when}: the exclusive event ran {:.0} % and the other {:.0} % of a second (before the park {:.0} % / {:.0} %)",
                100.0 * e,
                100.0 * p,
                100.0 * before.0,
                100.0 * before.1
            ));
        }
    }
    Ok(Check::from_problems(
        "attack: exclusive across park",
        problems,
        format!(
            "{}: exclusive and plain events ran {:.0} % / {:.0} % before a park, {:.0} % / {:.0} % after",
            pmu_name(d),
            100.0 * before.0,
            100.0 * before.1,
            100.0 * after.0,
            100.0 * after.1
        ),
    ))
}

/// O. An event a move left waiting for its turn, disabled at once. An
///    exclusive mbm event X is opened first, then an mbm event A: enabled,
///    they take turns. A move installs events in the order they were opened
///    and schedules each at its install, so after a move X is on and A
///    waits (the core tells the driver so, patch 0051). Each round makes the
///    move while A is the one counting: both enabled with a short mux
///    interval until a read shows A running, the interval then made longer
///    than a round so that nothing rotates until the round ends. At once
///    both are disabled (A first: X first would end the contention and have
///    A scheduled at once, patch 0035), a burst lands, and each is enabled
///    alone, read and disabled again. Nothing landed while either was
///    enabled after the move: no value may move, and alone each runs all the
///    time it is enabled. A driver that kept A's counter running for it
///    after the move (planted bug `moved-unscheduled-ignored`) counts the
///    burst A was disabled through.
pub fn disabled_while_waiting_after_a_move(ctx: &mut Ctx) -> Result<Check> {
    let (d, _) = movable_domain(ctx)?;
    let interval_file = format!(
        "/sys/bus/event_source/devices/{}/perf_event_mux_interval_ms",
        pmu_name(d)
    );
    let default_interval = ctx.g.read_file(&interval_file)?;
    let result = waiting_after_moves(ctx, d, &interval_file);
    set_sysfs(ctx.g, &interval_file, default_interval.trim())?;
    result
}

/// The mux interval while a round must not rotate: longer than the steps
/// from the move to the last read. A rotation timer armed with it expires,
/// and stops if nothing contends, before the next round (which waits
/// longer), so that the round's short interval takes effect at once (perf
/// applies a new interval only to a timer that is not running).
const NO_ROTATION_MS: u64 = 1500;

/// Short turns until a read shows A counting, at most. Once a turn has
/// armed the rotation timer with the long interval, the short one only
/// applies when it fires: A can take a few long intervals to come on (9
/// turns seen on 16 vCPUs).
const TURNS_TO_WAIT: usize = 60;

fn waiting_after_moves(ctx: &mut Ctx, d: usize, interval_file: &str) -> Result<Check> {
    const ROUNDS: usize = 2;
    let (rx, ra) = (rmid(ctx, 11), rmid(ctx, 12));
    let disabled = FLAG_DISABLED;
    let x = open_with(ctx, d, rx, TIMES, FLAG_EXCLUSIVE | disabled, None)?;
    let a = open_with(ctx, d, ra, TIMES, disabled, None)?;
    let handles = [a, x];
    let names = ["A", "X (exclusive)"];
    let burst: Vec<_> = [rx, ra]
        .iter()
        .map(|&r| (d, r, Event::MbmTotalBytes, MIB))
        .collect();
    let short = MUX_INTERVAL_MS.to_string();
    let long = NO_ROTATION_MS.to_string();
    let mut problems = Vec::new();
    let mut turns = Vec::new();
    for round in 0..ROUNDS {
        // Nothing enabled: the last round's timer runs out and stops.
        std::thread::sleep(Duration::from_millis(NO_ROTATION_MS + 200));
        set_sysfs(ctx.g, interval_file, &short)?;
        must(ctx, x, PerfIoctl::Enable { group: false })?;
        must(ctx, a, PerfIoctl::Enable { group: false })?;
        let mut waited = None;
        for turn in 0..TURNS_TO_WAIT {
            set_sysfs(ctx.g, interval_file, &short)?;
            std::thread::sleep(Duration::from_millis(u64::from(MUX_INTERVAL_MS) * 3 / 2));
            // The timer armed with the short interval rotates once more,
            // then rearms with the long one.
            set_sysfs(ctx.g, interval_file, &long)?;
            std::thread::sleep(Duration::from_millis(u64::from(MUX_INTERVAL_MS) * 3 / 2));
            let first = ctx.g.read(a)?;
            std::thread::sleep(Duration::from_millis(20));
            let second = ctx.g.read(a)?;
            if Window::between(&first, &second).running > 0 {
                waited = Some(turn + 1);
                break;
            }
        }
        let Some(waited) = waited else {
            problems.push(format!(
                "round {round}: A never counted in {TURNS_TO_WAIT} turns beside the exclusive X"
            ));
            break;
        };
        turns.push(waited);
        let was_owner = owner(ctx, d)?;
        ctx.g.set_online(was_owner, false)?;
        let disable: Vec<PerfOp> = handles
            .iter()
            .map(|&h| PerfOp::Ioctl {
                handle: h,
                ioctl: PerfIoctl::Disable { group: false },
            })
            .chain(handles.iter().map(|&h| PerfOp::Read { handle: h }))
            .collect();
        let results = perf_ops(ctx, disable)?;
        ctx.inject_and_land(&burst)?;
        for (i, &h) in handles.iter().enumerate() {
            let was = words(&results[2 + i], "read after the DISABLE")?;
            let alone = perf_ops(
                ctx,
                vec![
                    PerfOp::Ioctl {
                        handle: h,
                        ioctl: PerfIoctl::Enable { group: false },
                    },
                    PerfOp::Read { handle: h },
                    PerfOp::Ioctl {
                        handle: h,
                        ioctl: PerfIoctl::Disable { group: false },
                    },
                    PerfOp::Read { handle: h },
                ],
            )?;
            let on = words(&alone[1], "read enabled alone")?;
            let off = words(&alone[3], "read disabled again")?;
            let w = Window::between(&was, &off);
            if on[0] != was[0] || off[0] != was[0] || w.running != w.enabled {
                problems.push(format!(
                    "round {round}, {}: {} when disabled right after the move, 1 MiB landed while disabled, then enabled alone: read {}, {} when disabled again; Δenabled {} Δrunning {} (want the value unchanged, running = enabled)",
                    names[i], was[0], on[0], off[0], w.enabled, w.running
                ));
            }
        }
        ctx.g.set_online(was_owner, true)?;
    }
    for h in handles {
        ctx.g.close(h)?;
    }
    // The last round's timer, armed with the long interval, runs out and
    // stops: perf leaves a PMU's mux timers armed when it is unregistered,
    // and one firing after perfbed.ko is unloaded takes the guest down.
    std::thread::sleep(Duration::from_millis(NO_ROTATION_MS + 200));
    Ok(Check::from_problems(
        "attack: disabled while waiting after a move",
        problems,
        format!(
            "{}: {} moves made while A counted beside an exclusive X (after {turns:?} short turns), each followed by DISABLE, 1 MiB, then each enabled alone: no value moved, each ran all the time it was enabled",
            pmu_name(d),
            turns.len()
        ),
    ))
}

/// Its checks, in order.
pub(super) const CHECKS: &[Named] = &[
    (
        "attack: enable/disable storm during moves",
        enable_disable_storm_during_moves,
    ),
    ("attack: group reads racing moves", group_reads_racing_moves),
    ("attack: exclusive across park", exclusive_across_park),
    (
        "attack: disabled while waiting after a move",
        disabled_while_waiting_after_a_move,
    ),
];
