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

use super::context::{Ctx, MIB};
use super::move_attacks::{judge_exact, judge_window, move_away, under_long_mux, Trio, TIMES};
use super::moves::movable_domain;
use super::multiplexing::Window;
use super::redteam::{must, open_with, park, rmid, Many, Named};
use crate::checks::Check;
use crate::guest::perf_abi::FLAG_DISABLED;
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

/// P3. `time_running` never goes down (the contract, "Parks and wraps": a
///     park's interval is left out, not taken back). Two events of one RMID
///     each: A is DISABLEd while parked, B stays enabled; both are read
///     while parked, after a park longer than the wrap budget, before and
///     after A's DISABLE, then after the return; A is ENABLEd and counts
///     exactly at 100 % after it. No read's clocks may be below an earlier
///     read's, and A's stand still from its DISABLE to its ENABLE; A's
///     value at the return is exactly the 3 MiB landed before its DISABLE.
pub fn running_never_back_after_park(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let (ra, rb) = (rmid(ctx, 1), rmid(ctx, 2));
    let a = open_with(ctx, d, ra, TIMES, 0, None)?;
    let b = open_with(ctx, d, rb, TIMES, 0, None)?;
    let hs = [a, b];
    let both = |ctx: &mut Ctx, x: u64| -> Result<()> {
        ctx.inject_and_land(&[
            (d, ra, Event::MbmTotalBytes, x),
            (d, rb, Event::MbmTotalBytes, x),
        ])
    };
    let mut reads = vec![("open", ctx.g.read_many(&hs)?)];
    both(ctx, MIB)?;
    reads.push(("1 MiB", ctx.g.read_many(&hs)?));
    park(ctx, &allowed, false)?;
    both(ctx, 2 * MIB)?;
    std::thread::sleep(std::time::Duration::from_millis(400));
    reads.push(("parked 400 ms, 2 MiB", ctx.g.read_many(&hs)?));
    must(ctx, a, PerfIoctl::Disable { group: false })?;
    let off = ctx.g.read_many(&hs)?;
    reads.push(("A DISABLEd while parked", off.clone()));
    both(ctx, 4 * MIB)?;
    park(ctx, &allowed, true)?;
    reads.push(("the return, 4 MiB", ctx.g.read_many(&hs)?));
    both(ctx, 8 * MIB)?;
    let before_enable = ctx.g.read_many(&hs)?;
    reads.push(("8 MiB", before_enable.clone()));
    must(ctx, a, PerfIoctl::Enable { group: false })?;
    let on = ctx.g.read_many(&hs)?;
    reads.push(("A ENABLEd", on.clone()));
    both(ctx, 16 * MIB)?;
    let end = ctx.g.read_many(&hs)?;
    reads.push(("16 MiB", end.clone()));
    ctx.g.close(a)?;
    ctx.g.close(b)?;
    let mut problems = Vec::new();
    for (i, name) in ["A", "B"].iter().enumerate() {
        for pair in reads.windows(2) {
            let ((w0, r0), (w1, r1)) = (&pair[0], &pair[1]);
            if r1[i][1] < r0[i][1] || r1[i][2] < r0[i][2] || r1[i][2] > r1[i][1] {
                problems.push(format!(
                    "{name}: read after \"{w1}\" {:?} follows {:?} after \"{w0}\" (time_enabled and time_running never go back, running <= enabled)",
                    r1[i], r0[i]
                ));
            }
        }
    }
    // Disabled: its clocks stand still from the DISABLE; its value, read
    // exactly at the return (a read while parked leaves the value's window
    // open), is the 1 + 2 MiB landed while it was enabled: the device froze
    // its slot at the DISABLE (SLOT_CTL_FROZEN).
    let returned = &reads[4].1[0];
    if before_enable[0][1] != off[0][1]
        || before_enable[0][2] != off[0][2]
        || before_enable[0][0] != returned[0]
        || returned[0] != 3 * MIB
    {
        problems.push(format!(
            "A, DISABLEd while parked after 1 + 2 MiB: read {:?} at its DISABLE, {:?} at the return, {:?} after 8 MiB more (want both clocks unchanged from the DISABLE, the value from the return, exactly 3 MiB)",
            off[0], returned, before_enable[0]
        ));
    }
    judge_exact(
        "A, ENABLEd after the return, 16 MiB",
        &on[0],
        &end[0],
        16 * MIB,
        &mut problems,
    );
    judge_window(
        "A from its open (1 MiB, park, 2 MiB, DISABLE, 4 + 8 MiB not counted, ENABLE, 16 MiB)",
        &reads[0].1[0],
        &end[0],
        19 * MIB,
        &mut problems,
    );
    if end[1][0] != 31 * MIB {
        problems.push(format!(
            "B, enabled throughout: counted {} (want {}: a park's count stays exact)",
            end[1][0],
            31 * MIB
        ));
    }
    Ok(Check::from_problems(
        "park-attack: running never back after park",
        problems,
        format!(
            "{}: A DISABLEd while parked and B enabled, read 7 times through a park of 400 ms: clocks never back; A ends at {} ({:?} running of {:?} enabled), B {} ({:?} of {:?})",
            pmu_name(d),
            end[0][0],
            std::time::Duration::from_nanos(end[0][2]),
            std::time::Duration::from_nanos(end[0][1]),
            end[1][0],
            std::time::Duration::from_nanos(end[1][2]),
            std::time::Duration::from_nanos(end[1][1])
        ),
    ))
}

/// P4. DISABLE and ENABLE while parked: 1 MiB, park, 2 MiB, DISABLE,
///     4 MiB, ENABLE, 8 MiB, the return, 16 MiB. The 4 MiB landed while it
///     was disabled never count (at most 1 + 2 + 8 + 16 MiB, at least the
///     1 MiB before the park and the 16 after the return); from the return
///     it counts for sure, exactly at 100 %. (Whether its clocks go back is
///     P3's to judge.)
pub fn disable_enable_while_parked(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let r = rmid(ctx, 5);
    let h = open_with(ctx, d, r, TIMES, 0, None)?;
    let start = ctx.g.read(h)?;
    super::redteam::inject(ctx, d, r, MIB)?;
    park(ctx, &allowed, false)?;
    super::redteam::inject(ctx, d, r, 2 * MIB)?;
    must(ctx, h, PerfIoctl::Disable { group: false })?;
    super::redteam::inject(ctx, d, r, 4 * MIB)?;
    must(ctx, h, PerfIoctl::Enable { group: false })?;
    super::redteam::inject(ctx, d, r, 8 * MIB)?;
    park(ctx, &allowed, true)?;
    let back = ctx.g.read(h)?;
    super::redteam::inject(ctx, d, r, 16 * MIB)?;
    let end = ctx.g.read(h)?;
    ctx.g.close(h)?;
    let mut problems = Vec::new();
    let got = end[0] - start[0];
    if !(17 * MIB..=27 * MIB).contains(&got) || back[0] > 11 * MIB {
        problems.push(format!(
            "1 MiB, park, 2 MiB, DISABLE, 4 MiB, ENABLE, 8 MiB, the return: read {back:?}; 16 MiB: read {end:?}: counted {got} (want between {} and {}, never the 4 MiB landed while disabled; at most {} at the return)",
            17 * MIB,
            27 * MIB,
            11 * MIB
        ));
    }
    judge_exact(
        "after the return, 16 MiB",
        &back,
        &end,
        16 * MIB,
        &mut problems,
    );
    // Enabled all along but for the 4 MiB: 27 MiB landed while enabled, so
    // a count short of them must not claim 100 % running.
    let whole = Window::between(&start, &end);
    if whole.running == whole.enabled && got != 27 * MIB {
        problems.push(format!(
            "from the open: counted {got} of the {} landed while enabled, yet Δrunning {} = Δenabled {} (a short count that claims 100 % running)",
            27 * MIB,
            whole.running,
            whole.enabled
        ));
    }
    Ok(Check::from_problems(
        "park-attack: disable and enable while parked",
        problems,
        format!(
            "{}: DISABLE and ENABLE in one park: counted {got} ({} MiB of the 1 + 2 + 8 landed while enabled until the return, then 16 MiB exact at 100 %)",
            pmu_name(d),
            back[0] / MIB
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

/// P6. A slot frozen while parked stays its event's: as many events as
///     slots, all counting, and one more opened disabled. Park, 1 MiB
///     each, DISABLE the first (its slot frozen, its 1 MiB unread), ENABLE
///     the extra one while parked: no slot is free (the frozen one is kept
///     for the disabled event), so it waits, not counting. 2 MiB, the
///     return, 4 MiB. The disabled event reads exactly its 1 MiB from the
///     return on; the others count 1 + 2 + 4 MiB exactly at 100 %; the
///     extra one counts within the rules until the return, and exactly the
///     4 MiB at 100 % after it (every slot event fits once placed).
pub fn frozen_slot_kept_while_parked(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let slots = ctx.device.slots as usize;
    let many = Many::open(ctx, d, slots, TIMES)?;
    let extra_rmid = rmid(ctx, slots as u32);
    let extra = open_with(ctx, d, extra_rmid, TIMES, FLAG_DISABLED, None)?;
    let mut all = many.handles.clone();
    all.push(extra);
    let mut rmids = many.rmids.clone();
    rmids.push(extra_rmid);
    let burst = |ctx: &mut Ctx, b: u64| {
        let inj: Vec<_> = rmids
            .iter()
            .map(|&r| (d, r, Event::MbmTotalBytes, b))
            .collect();
        ctx.inject_and_land(&inj)
    };
    let s = ctx.g.read_many(&all)?;
    park(ctx, &allowed, false)?;
    burst(ctx, MIB)?;
    must(ctx, all[0], PerfIoctl::Disable { group: false })?;
    must(ctx, extra, PerfIoctl::Enable { group: false })?;
    let on = ctx.g.read_many(&all)?;
    burst(ctx, 2 * MIB)?;
    park(ctx, &allowed, true)?;
    let back = ctx.g.read_many(&all)?;
    burst(ctx, 4 * MIB)?;
    let end = ctx.g.read_many(&all)?;
    for h in all.iter().copied() {
        ctx.g.close(h)?;
    }
    let mut problems = Vec::new();
    if back[0][0] != s[0][0] + MIB || end[0][0] != back[0][0] {
        problems.push(format!(
            "rmid {}, DISABLEd while parked after 1 MiB: read {:?} at the open, {:?} at the return, {:?} after 4 MiB more (want exactly 1 MiB from the return on: its frozen slot is its own)",
            rmids[0], s[0], back[0], end[0]
        ));
    }
    for i in 1..slots {
        judge_exact(
            &format!("rmid {}, enabled throughout", rmids[i]),
            &s[i],
            &end[i],
            7 * MIB,
            &mut problems,
        );
    }
    let x = slots;
    judge_window(
        &format!("rmid {extra_rmid}, ENABLEd while parked with no slot free, 2 MiB, the return"),
        &on[x],
        &back[x],
        2 * MIB,
        &mut problems,
    );
    // Placed, every slot event fits: the placement ends the contention as
    // a DISABLE does, so it counts for sure from there
    // (docs/counting-semantics.md, "Where the checks settled with the
    // model").
    judge_exact(
        &format!("rmid {extra_rmid}, after the return"),
        &back[x],
        &end[x],
        4 * MIB,
        &mut problems,
    );
    Ok(Check::from_problems(
        "park-attack: frozen slot kept while parked",
        problems,
        format!(
            "{}: {slots} events on {slots} slots, one DISABLEd while parked and one more ENABLEd then: the disabled one reads {} of its 1 MiB, the extra one {} of the 4 MiB after the return",
            pmu_name(d),
            end[0][0] - s[0][0],
            end[x][0] - back[x][0]
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
        "park-attack: running never back after park",
        running_never_back_after_park,
    ),
    (
        "park-attack: disable and enable while parked",
        disable_enable_while_parked,
    ),
    (
        "park-attack: leader enabled while parked",
        leader_enabled_while_parked,
    ),
    (
        "park-attack: frozen slot kept while parked",
        frozen_slot_kept_while_parked,
    ),
];
