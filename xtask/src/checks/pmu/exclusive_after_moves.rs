//! Stays in Rust: the scenario of the same setup
//! (`scenarios/groups/exclusive-and-mixed-group-after-moves.scn`) does not
//! catch the kernel mutant `move-resets-group-caps`, which the model leaves
//! unjudged; this catches it by the shares of time each side ran.
//!
//! A group's capabilities survive moves: an exclusive event and a group
//! {cpu-clock leader, device sibling} on the same PMU still take turns
//! after two moves (kernel patch 0001).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use perfbed_agent::PerfAttr;
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
fn turns(ctx: &mut Ctx, exclusive: u32, sibling: u32) -> Result<(f64, f64)> {
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

/// An exclusive device event and a group {cpu-clock leader, device
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
