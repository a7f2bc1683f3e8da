//! Stays in Rust: its rounds wait, in a loop on what the guest shows,
//! until a read shows the event counting before they move the PMU, which a
//! scenario cannot write.
//!
//! An event a move left waiting for its turn, disabled at once: an attack
//! on docs/counting-semantics.md written from the contract alone, which
//! `cargo xtask run` runs as "attack: disabled while waiting after a move"
//! and the lifecycle stress before its random operations.

use std::time::Duration;

use anyhow::Result;
use perfbed_agent::{PerfIoctl, PerfOp, PerfOpResult};
use perfbed_device::regs::Event;

use super::context::{must, open_with, owner, rmid, Ctx, Named, MIB, TIMES};
use super::moves::movable_domain;
use super::multiplexing::{set_sysfs, with_mux_interval, Window, MUX_INTERVAL_MS};
use crate::checks::Check;
use crate::guest::perf_abi::{FLAG_DISABLED, FLAG_EXCLUSIVE};
use crate::guest::pmu_name;

fn words(r: &PerfOpResult, what: &str) -> Result<Vec<u64>> {
    r.result
        .clone()
        .map_err(|errno| anyhow::anyhow!("{what}: {errno}"))
}

/// An event a move left waiting for its turn, disabled at once. An
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
    with_mux_interval(ctx, d, MUX_INTERVAL_MS, |ctx, interval_file| {
        waiting_after_moves(ctx, d, interval_file)
    })
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
        let results = ctx.g.perf_ops(disable)?;
        ctx.inject_and_land(&burst)?;
        for (i, &h) in handles.iter().enumerate() {
            let was = words(&results[2 + i], "read after the DISABLE")?;
            let alone = ctx.g.perf_ops(vec![
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
            ])?;
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
pub(super) const CHECKS: &[Named] = &[(
    "attack: disabled while waiting after a move",
    disabled_while_waiting_after_a_move,
)];
