//! Red-team attacks on parks (docs/counting-semantics.md, "Parks and
//! wraps"), written from the contract alone: what a perf user does to the
//! events of a PMU with none of its allowed CPUs online — contention ended
//! by closes while parked, an exclusive event DISABLEd or closed while
//! parked, DISABLE and ENABLE in one park, a group's leader ENABLEd while
//! parked, an event ENABLEd while parked beside a slot frozen for another.
//! Each burst lands between two operations; each window is judged by the
//! rules ([`judge_window`]) and exactly from the return, when the PMU is
//! placed again and uncontended ([`judge_exact`]). The helpers are
//! `move_attacks.rs`'s.

use anyhow::Result;
use perfbed_agent::PerfIoctl;
use perfbed_device::regs::Event;

use super::context::{Ctx, MIB, TIMES};
use super::move_attacks::{judge_exact, judge_window, move_away, under_long_mux, Trio};
use super::moves::movable_domain;
use super::multiplexing::Window;
use super::redteam::{must, open_with, park, rmid, Many, Named};
use crate::checks::Check;
use crate::guest::pmu_name;

/// P1. Two more events than slots, parked: a burst, two of them closed
///     while parked (the contention ends, but nothing reschedules a parked
///     PMU), a burst, the return. Over the whole check each remaining event
///     obeys the rules; once placed again they fit, so from the return
///     each counts for sure: exactly, at 100 %.
pub fn contention_closed_while_parked(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let slots = ctx.device.slots as usize;
    let n = slots + 2;
    let many = Many::open(ctx, d, n, TIMES)?;
    let (rmids, handles) = (many.rmids.clone(), many.handles.clone());
    let (gone, rest) = handles.split_at(2);
    let (rest, rest_rmids) = (rest.to_vec(), rmids[2..].to_vec());
    let s = ctx.g.read_many(&rest)?;
    many.burst(ctx, MIB)?;
    park(ctx, &allowed, false)?;
    many.burst(ctx, 2 * MIB)?;
    for &h in gone {
        ctx.g.close(h)?;
    }
    many.burst(ctx, 4 * MIB)?;
    park(ctx, &allowed, true)?;
    let u0 = ctx.g.read_many(&rest)?;
    many.burst(ctx, 8 * MIB)?;
    let u1 = ctx.g.read_many(&rest)?;
    let o = move_away(ctx, d)?;
    many.burst(ctx, 16 * MIB)?;
    let u2 = ctx.g.read_many(&rest)?;
    ctx.g.set_online(o, true)?;
    for h in rest {
        ctx.g.close(h)?;
    }
    let mut problems = Vec::new();
    for (i, r) in rest_rmids.iter().enumerate() {
        judge_window(
            &format!("rmid {r}: open to the return"),
            &s[i],
            &u0[i],
            7 * MIB,
            &mut problems,
        );
        judge_exact(
            &format!("rmid {r}: placed again, {slots} events on {slots} slots"),
            &u0[i],
            &u1[i],
            8 * MIB,
            &mut problems,
        );
        judge_exact(
            &format!("rmid {r}: then a move"),
            &u1[i],
            &u2[i],
            16 * MIB,
            &mut problems,
        );
    }
    Ok(Check::from_problems(
        "park-attack: contention closed while parked",
        problems,
        format!(
            "{}: {n} events on {slots} slots, 2 closed while parked: the rest ran {} until the return, exact at 100 % after it",
            pmu_name(d),
            (0..s.len())
                .map(|i| format!("{:.0} %", 100.0 * Window::between(&s[i], &u0[i]).running as f64 / Window::between(&s[i], &u0[i]).enabled.max(1) as f64))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ))
}

/// P2. An exclusive event and two plain ones under a long mux interval;
///     the PMU parks, the exclusive one is DISABLEd while parked (nothing
///     reschedules a parked PMU, so the plain ones may be counting until
///     the return), the PMU is placed again: the plain ones count for sure
///     from the return, exactly at 100 %, the disabled one stands still.
///     ENABLE, park, the exclusive one closed while parked, the return: the
///     plain ones again exactly at 100 %. Every window within the rules.
pub fn exclusive_ended_while_parked(ctx: &mut Ctx) -> Result<Check> {
    under_long_mux(ctx, exclusive_parked)
}

fn exclusive_parked(ctx: &mut Ctx, d: usize) -> Result<Check> {
    let (_, allowed) = movable_domain(ctx)?;
    let allowed = &allowed[..];
    let trio = Trio::open(ctx, d)?;
    let (rs, hs) = (trio.rs, trio.hs);
    let [ex, p1, p2] = hs;
    let burst = |ctx: &mut Ctx, b: u64| trio.burst(ctx, b);
    let mut problems = Vec::new();
    let s = ctx.g.read_many(&hs)?;
    burst(ctx, MIB)?;
    park(ctx, allowed, false)?;
    burst(ctx, 2 * MIB)?;
    must(ctx, ex, PerfIoctl::Disable { group: false })?;
    let off = ctx.g.read_many(&hs)?;
    burst(ctx, 4 * MIB)?;
    park(ctx, allowed, true)?;
    let u0 = ctx.g.read_many(&hs)?;
    burst(ctx, 8 * MIB)?;
    let u1 = ctx.g.read_many(&hs)?;
    must(ctx, ex, PerfIoctl::Enable { group: false })?;
    let e0 = ctx.g.read_many(&hs)?;
    burst(ctx, 16 * MIB)?;
    park(ctx, allowed, false)?;
    burst(ctx, 32 * MIB)?;
    ctx.g.close(ex)?;
    burst(ctx, 64 * MIB)?;
    park(ctx, allowed, true)?;
    let v0 = ctx.g.read_many(&hs[1..])?;
    burst(ctx, 128 * MIB)?;
    let v1 = ctx.g.read_many(&hs[1..])?;
    ctx.g.close(p1)?;
    ctx.g.close(p2)?;
    for (i, r) in rs.iter().enumerate() {
        // The exclusive one is enabled for the first 1 + 2 MiB only.
        let (what, landed) = if i == 0 {
            ("the exclusive DISABLEd", 3 * MIB)
        } else {
            ("the exclusive DISABLEd, 4 MiB", 7 * MIB)
        };
        judge_window(
            &format!("rmid {r}: open, 1 MiB, park, 2 MiB, {what}, the return"),
            &s[i],
            &u0[i],
            landed,
            &mut problems,
        );
    }
    // Disabled: its clocks stand still from the DISABLE, its value from
    // the return (a read while parked leaves the value's window open: what
    // landed while it counted before the DISABLE shows only after the
    // return), and never more than landed while it was enabled (its slot,
    // if it had one, frozen at the DISABLE: SLOT_CTL_FROZEN).
    if u1[0][1] != off[0][1]
        || u1[0][2] != off[0][2]
        || u1[0][0] != u0[0][0]
        || u1[0][0] > s[0][0] + 3 * MIB
    {
        problems.push(format!(
            "the exclusive event, DISABLEd while parked after 1 + 2 MiB: read {:?} at its DISABLE, {:?} at the return, {:?} after 8 MiB more (want both clocks unchanged from the DISABLE, the value from the return, at most 3 MiB)",
            off[0], u0[0], u1[0]
        ));
    }
    for i in 1..3 {
        judge_exact(
            &format!(
                "plain rmid {}, the exclusive one DISABLEd while parked, placed again",
                rs[i]
            ),
            &u0[i],
            &u1[i],
            8 * MIB,
            &mut problems,
        );
        judge_window(&format!("plain rmid {}: ENABLE of the exclusive, 16 MiB, park, 32 MiB, its close, 64 MiB, the return", rs[i]), &e0[i], &v0[i - 1], 112 * MIB, &mut problems);
        judge_exact(
            &format!(
                "plain rmid {}, the exclusive one closed while parked, placed again",
                rs[i]
            ),
            &v0[i - 1],
            &v1[i - 1],
            128 * MIB,
            &mut problems,
        );
    }
    Ok(Check::from_problems(
        "park-attack: exclusive ended while parked",
        problems,
        format!(
            "{}: an exclusive event DISABLEd, then closed, while parked: the plain ones exact at 100 % after each return ({} and {})",
            pmu_name(d),
            v1[0][0],
            v1[1][0]
        ),
    ))
}

/// P5. `{mbm leader, mbm sibling}`, the leader DISABLEd: 1 MiB, park (the
///     park installs the sibling without scheduling it: its leader is off),
///     2 MiB, the leader ENABLEd while parked, 4 MiB (maybe counting), the
///     return, 8 MiB. Neither ever counts the 1 + 2 MiB landed while the
///     leader was off; from the return both count for sure, exactly at
///     100 %; every window within the rules.
pub fn leader_enabled_while_parked(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let (r1, r2) = (rmid(ctx, 6), rmid(ctx, 7));
    let leader = open_with(ctx, d, r1, TIMES, 0, None)?;
    let sibling = open_with(ctx, d, r2, TIMES, 0, Some(leader))?;
    let pair = [leader, sibling];
    let both = |ctx: &mut Ctx, b: u64| -> Result<()> {
        ctx.inject_and_land(&[
            (d, r1, Event::MbmTotalBytes, b),
            (d, r2, Event::MbmTotalBytes, 2 * b),
        ])
    };
    let s = ctx.g.read_many(&pair)?;
    both(ctx, MIB / 2)?;
    must(ctx, leader, PerfIoctl::Disable { group: false })?;
    let off = ctx.g.read_many(&pair)?;
    both(ctx, MIB)?;
    park(ctx, &allowed, false)?;
    both(ctx, 2 * MIB)?;
    must(ctx, leader, PerfIoctl::Enable { group: false })?;
    let on = ctx.g.read_many(&pair)?;
    both(ctx, 4 * MIB)?;
    park(ctx, &allowed, true)?;
    let back = ctx.g.read_many(&pair)?;
    both(ctx, 8 * MIB)?;
    let end = ctx.g.read_many(&pair)?;
    ctx.g.close(sibling)?;
    ctx.g.close(leader)?;
    let mut problems = Vec::new();
    for (i, k) in [(0, 1), (1, 2)] {
        let name = ["leader", "sibling"][i];
        judge_exact(
            &format!("{name}, 0.5 MiB before the DISABLE"),
            &s[i],
            &off[i],
            k * MIB / 2,
            &mut problems,
        );
        if on[i][0] != off[i][0] {
            problems.push(format!(
                "{name}: leader off, 1 MiB, park, 2 MiB, leader ENABLEd while parked: read {:?} after {:?} (want the value unchanged)",
                on[i], off[i]
            ));
        }
        judge_window(
            &format!("{name}: ENABLEd while parked, 4 MiB, the return"),
            &on[i],
            &back[i],
            4 * k * MIB,
            &mut problems,
        );
        judge_exact(
            &format!("{name}: after the return, 8 MiB"),
            &back[i],
            &end[i],
            8 * k * MIB,
            &mut problems,
        );
    }
    Ok(Check::from_problems(
        "park-attack: leader enabled while parked",
        problems,
        format!(
            "{}: a group whose leader was off through a park's start, ENABLEd while parked: counted {} and {} (never the 1 + 2 MiB landed while the leader was off; {} and {} of the 4 MiB landed after the ENABLE while parked)",
            pmu_name(d),
            end[0][0],
            end[1][0],
            back[0][0] - on[0][0],
            back[1][0] - on[1][0]
        ),
    ))
}

/// Every attack, in order, each by the name its `Check` carries; each
/// leaves every CPU online, nothing open and the mux interval as it found
/// it.
pub(super) const CHECKS: &[Named] = &[
    (
        "park-attack: contention closed while parked",
        contention_closed_while_parked,
    ),
    (
        "park-attack: exclusive ended while parked",
        exclusive_ended_while_parked,
    ),
    (
        "park-attack: leader enabled while parked",
        leader_enabled_while_parked,
    ),
];
