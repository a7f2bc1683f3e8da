//! What a move or a park must not change for device-scope PMUs (issue 17,
//! the perf core half): each check replays, as a new user would, a symptom
//! that the kernel patches 0010–0014 fix, and fails without them.
//!
//! The promises checked here (DESIGN.md, "Counting semantics"; a disabled
//! event across a move and a park, 0010, and a software sibling joining a
//! moved device group, 0013, are scenarios: `scenarios/moves`,
//! `scenarios/groups`):
//! - a group's capabilities survive moves: an exclusive event and a group
//!   {cpu-clock leader, device sibling} on the same PMU still take turns
//!   after moves (0011);
//! - an open that races a move waits for it and never fails with EBUSY;
//!   how long it slept, beside how long the moves took, is measured in the
//!   kernel and reported (0012, 0014).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use perfbed_agent::{AgentMessage, HostRequest, PerfAttr};
use perfbed_device::regs::Event;

use super::context::{Ctx, TIMES};
use super::moves::movable_domain;
use super::multiplexing::Window;
use crate::checks::Check;
use crate::guest::perf_abi::{FLAG_EXCLUSIVE, PERF_COUNT_SW_CPU_CLOCK, PERF_TYPE_SOFTWARE};
use crate::guest::pmu_name;

/// Takes the CPU `pmu` counts on offline and brings it back: the PMU moves
/// to another allowed CPU (and stays there). Returns (from, to).
fn move_once(ctx: &mut Ctx, d: usize) -> Result<(u32, u32)> {
    let from = match ctx.g.cpumask(&pmu_name(d))?[..] {
        [cpu] => cpu,
        ref other => bail!("{} cpumask {other:?} before a move", pmu_name(d)),
    };
    ctx.g.set_online(from, false)?;
    ctx.g.set_online(from, true)?;
    let to = match ctx.g.cpumask(&pmu_name(d))?[..] {
        [cpu] if cpu != from => cpu,
        ref other => bail!(
            "{} cpumask {other:?} after CPU {from} went offline: it did not move",
            pmu_name(d)
        ),
    };
    Ok((from, to))
}

/// (share of the window the exclusive event ran, the group's share).
pub(super) fn turns(ctx: &mut Ctx, exclusive: u32, sibling: u32) -> Result<(f64, f64)> {
    let start = ctx.g.read_many(&[exclusive, sibling])?;
    std::thread::sleep(Duration::from_secs(1));
    let end = ctx.g.read_many(&[exclusive, sibling])?;
    let share = |i: usize| {
        let w = Window::between(&start[i], &end[i]);
        if w.enabled == 0 {
            0.0
        } else {
            w.running as f64 / w.enabled as f64
        }
    };
    Ok((share(0), share(1)))
}

/// Patch 0011: An exclusive device event and a group {cpu-clock leader, device
/// sibling} of the same PMU take turns, and still do after two moves.
pub fn exclusive_after_moves(ctx: &mut Ctx) -> Result<Check> {
    let (d, _) = movable_domain(ctx)?;
    let mut attr = ctx.attr(d, Event::MbmTotalBytes, 3);
    attr.read_format = TIMES;
    attr.flags |= FLAG_EXCLUSIVE;
    let exclusive = match ctx.g.open(attr, None)? {
        Ok(h) => h,
        Err(errno) => bail!("opening an exclusive event: {errno}"),
    };
    let cpu = ctx
        .g
        .cpumask(&pmu_name(d))?
        .first()
        .copied()
        .context("the PMU is parked")? as i32;
    let clock = PerfAttr {
        type_: PERF_TYPE_SOFTWARE,
        config: PERF_COUNT_SW_CPU_CLOCK,
        read_format: TIMES,
        ..PerfAttr::default()
    };
    let leader = match ctx.g.open_as(clock, -1, cpu, None)? {
        Ok(h) => h,
        Err(errno) => bail!("opening cpu-clock on CPU {cpu}: {errno}"),
    };
    let mut attr = ctx.attr(d, Event::MbmTotalBytes, 4);
    attr.read_format = TIMES;
    let sibling = match ctx.g.open(attr, Some(leader))? {
        Ok(h) => h,
        Err(errno) => bail!("opening a device sibling of cpu-clock: {errno}"),
    };
    let before = turns(ctx, exclusive, sibling);
    let moves =
        (|| -> Result<Vec<(u32, u32)>> { Ok(vec![move_once(ctx, d)?, move_once(ctx, d)?]) })();
    let after = turns(ctx, exclusive, sibling);
    for h in [sibling, leader, exclusive] {
        ctx.g.close(h)?;
    }
    let (before, moves, after) = (before?, moves?, after?);
    let mut problems = Vec::new();
    // Taking turns: neither runs the whole window, and never both at once.
    let shares = |(e, g): (f64, f64)| {
        format!(
            "the exclusive event ran {:.0} % and the group {:.0} % of a second",
            100.0 * e,
            100.0 * g
        )
    };
    for (when, (e, g)) in [("before the moves", before), ("after two moves", after)] {
        if e > 0.95 || g > 0.95 || e + g > 1.05 {
            problems.push(format!(
                "{when}: {} ({} before the moves)",
                shares((e, g)),
                shares(before)
            ));
        }
    }
    Ok(Check::from_problems(
        "exclusive and groups after moves",
        problems,
        format!(
            "{}: exclusive event and {{cpu-clock, mbm}} ran {:.0} % / {:.0} % before, {:.0} % / {:.0} % after moves {moves:?}",
            pmu_name(d),
            100.0 * before.0,
            100.0 * before.1,
            100.0 * after.0,
            100.0 * after.1
        ),
    ))
}

/// A device PMU's sysfs figure (patches 0007, 0014).
fn figure(ctx: &mut Ctx, d: usize, file: &str) -> Result<u64> {
    ctx.g.pmu_count(&pmu_name(d), file)
}

/// Hotplug operations the open race of [`opens_racing_moves`] makes.
const RACE_HOTPLUG_OPS: u32 = 24;

/// Patches 0012 and 0014: Opens in a loop while the PMU's CPUs go offline and
/// online: no open fails with EBUSY, only ENODEV while the PMU is parked,
/// and opens did meet moves. Reports the longest sleep of an open beside
/// the longest move.
pub fn opens_racing_moves(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let attr = ctx.attr(d, Event::MbmTotalBytes, 7);
    // A kernel without 0007 or 0014 lacks some of these files: a failed
    // check, not an aborted run.
    let mut problems = Vec::new();
    let mut measured = |ctx: &mut Ctx, file: &str| {
        figure(ctx, d, file).unwrap_or_else(|e| {
            problems.push(format!("{e:#}"));
            0
        })
    };
    let waits_before = measured(ctx, "open_waits");
    let race = match ctx.g.ask(HostRequest::PerfOpenRace {
        attr,
        cpu: 0,
        hotplug_ops: RACE_HOTPLUG_OPS,
        toggle_cpus: allowed.clone(),
        keep: 16,
    })? {
        AgentMessage::Race(race) => race,
        other => bail!("the open race: {other:?}"),
    };
    let waits = measured(ctx, "open_waits").saturating_sub(waits_before);
    let retries = measured(ctx, "open_retries");
    let slept = measured(ctx, "open_wait_max_ns");
    let longest_move = measured(ctx, "move_max_ns");
    if race.busy != 0 {
        problems.push(format!(
            "{} of {} opens failed with EBUSY",
            race.busy, race.attempts
        ));
    }
    if let Some(other) = race.other_errors.iter().find(|e| !e.starts_with("ENODEV:")) {
        problems.push(format!(
            "opens failed with {other} (only ENODEV, while parked, may)"
        ));
    }
    if race.hotplug_ops != RACE_HOTPLUG_OPS || race.opened == 0 {
        problems.push(format!(
            "{} of {RACE_HOTPLUG_OPS} hotplug operations, {} opens succeeded",
            race.hotplug_ops, race.opened
        ));
    }
    if waits == 0 {
        problems.push(format!(
            "no open met a move in {} attempts: the race proved nothing",
            race.attempts
        ));
    }
    // How long they slept is reported, not judged (a measurement on a
    // shared machine): each sleep waits for one move and ends when that
    // move wakes it, plus however late the woken task gets to run.
    if waits > 0 && (slept == 0 || longest_move == 0) {
        problems.push(format!("opens waited for moves, but the kernel measured a longest sleep of {slept} ns and a longest move of {longest_move} ns"));
    }
    Ok(Check::from_problems(
        "opens racing moves",
        problems,
        format!(
            "{} opens during {} hotplug operations on CPUs {allowed:?}: {} opened, {} EBUSY, others {:?}; {waits} waited for a move ({retries} retried in all), the longest sleep of an open {} µs, the longest move {} µs",
            race.attempts,
            race.hotplug_ops,
            race.opened,
            race.busy,
            race.other_errors,
            slept / 1000,
            longest_move / 1000
        ),
    ))
}
