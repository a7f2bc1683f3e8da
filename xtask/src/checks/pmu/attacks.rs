//! Two adversarial checks of docs/counting-semantics.md, written from the
//! contract alone as a user would attack it, that stay in Rust: an
//! exclusive event beside a plain one across a park (L), which measures how
//! perf's rotation shares the time between them, which the model leaves to
//! perf; and an event a move left
//! waiting for its turn, disabled at once (O), whose rounds wait until a
//! read shows the event counting, a loop on what the guest shows that a
//! scenario cannot write. The attacks the model can judge are scenarios
//! (`scenarios/`), those that race a thread of the guest moving the PMU
//! too (`moves DOMAIN start`).
//!
//! What the contract does not promise is not checked: it says nothing of
//! `perf_event_mmap_page` (a counting PMU without `event_idx` gives user
//! space no rdpmc, and the page's time fields are perf core's), so no check
//! reads it.

use std::time::Duration;

use anyhow::{bail, Result};
use perfbed_agent::{AgentMessage, HostRequest, PerfIoctl, PerfOp, PerfOpResult};
use perfbed_device::regs::Event;

use super::across_moves::turns;
use super::context::{must, open_with, owner, rmid, Ctx, Named, MIB, TIMES};
use super::moves::movable_domain;
use super::multiplexing::{set_sysfs, Window, MUX_INTERVAL_MS};
use crate::checks::Check;
use crate::guest::perf_abi::{FLAG_DISABLED, FLAG_EXCLUSIVE};
use crate::guest::pmu_name;

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

/// Takes every CPU of `allowed` offline (`online` false) or back.
fn park(ctx: &mut Ctx, allowed: &[u32], online: bool) -> Result<()> {
    for &cpu in allowed {
        ctx.g.set_online(cpu, online)?;
    }
    Ok(())
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
///    waits (the core tells the driver so, patch 0007). Each round makes the
///    move while A is the one counting: both enabled with a short mux
///    interval until a read shows A running, the interval then made longer
///    than a round so that nothing rotates until the round ends. At once
///    both are disabled (A first: X first would end the contention and have
///    A scheduled at once, patch 0009), a burst lands, and each is enabled
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
    ("attack: exclusive across park", exclusive_across_park),
    (
        "attack: disabled while waiting after a move",
        disabled_while_waiting_after_a_move,
    ),
];
