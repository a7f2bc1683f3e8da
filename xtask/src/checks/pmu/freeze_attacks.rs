//! Red-team attacks on frozen slots (docs/counting-semantics.md, "Parks
//! and wraps": an event DISABLEd while its PMU is parked has its counter
//! frozen in the device, `SLOT_CTL_FROZEN`, and read exactly on the next
//! owner; an ENABLE thaws it, parked or not; its `time_running` stops at
//! the DISABLE and never goes back) and on the batched move of patch 0057
//! (every event of a PMU off and on in one cross call each, the context's
//! time frozen from the first add to the settle). Written from the
//! contract alone: a sibling of a leader DISABLEd and closed while parked,
//! a crowded move right after the DISABLE that ends contention, and
//! several frozen slots at once in a contended park. The other freeze
//! attacks are scenarios (`scenarios/freezes`, `scenarios/holding-cpu`,
//! `scenarios/allowed`).
//!
//! Burst sizes are distinct powers of two, so a count names the bursts it
//! took. Each window is judged by the rules ([`judge_window`]) or exactly
//! where the contract says the event counts for sure ([`judge_exact`]).

use anyhow::{bail, Result};
use perfbed_agent::PerfIoctl;
use perfbed_device::regs::Event;

use super::context::{Ctx, MIB, TIMES};
use super::move_attacks::{judge_exact, judge_window, move_away, under_long_mux};
use super::moves::movable_domain;
use super::redteam::{must, open_with, park, rmid, Many, Named};
use crate::checks::Check;
use crate::guest::perf_abi::{FLAG_DISABLED, FLAG_EXCLUSIVE, FLAG_PINNED};
use crate::guest::pmu_name;

/// Both clocks of `b` equal `a`'s: the event was disabled between them.
pub(super) fn clocks_still(what: &str, a: &[u64], b: &[u64], problems: &mut Vec<String>) {
    if a[1] != b[1] || a[2] != b[2] {
        problems.push(format!(
            "{what}: read {a:?} then {b:?} (want time_enabled and time_running unchanged: disabled between)"
        ));
    }
}

/// Over a series of reads of one event (name, read): neither clock ever
/// goes back, and running never leads enabled.
pub(super) fn clocks_never_back(what: &str, reads: &[(&str, &[u64])], problems: &mut Vec<String>) {
    for pair in reads.windows(2) {
        let ((w0, r0), (w1, r1)) = (pair[0], pair[1]);
        if r1[1] < r0[1] || r1[2] < r0[2] || r1[2] > r1[1] {
            problems.push(format!(
                "{what}: read after \"{w1}\" {r1:?} follows {r0:?} after \"{w0}\" (clocks never go back, running <= enabled)"
            ));
        }
    }
}

/// The bursts (in MiB, powers of two) a count of `bytes` is made of.
pub(super) fn bursts_in(bytes: u64) -> String {
    if !bytes.is_multiple_of(MIB) {
        return format!("{bytes} bytes, not whole MiB");
    }
    let mib = bytes / MIB;
    let parts: Vec<String> = (0..63)
        .filter(|b| mib & (1u64 << b) != 0)
        .map(|b| (1u64 << b).to_string())
        .collect();
    if parts.is_empty() {
        "nothing".into()
    } else {
        format!("{} MiB", parts.join(" + "))
    }
}

/// Lets `x` bytes land into each RMID of `rs` (times its scale) in domain
/// `d`, in one burst.
pub(super) fn burst_each(ctx: &mut Ctx, d: usize, rs: &[(u32, u64)], x: u64) -> Result<()> {
    let inj: Vec<_> = rs
        .iter()
        .map(|&(r, k)| (d, r, Event::MbmTotalBytes, k * x))
        .collect();
    ctx.inject_and_land(&inj)
}

/// Two `mbm_total_bytes` events of domain `d` on RMIDs `rmid(n0)` and
/// `rmid(n1)`, the second in the first's group if `grouped`: their handles
/// and RMIDs.
pub(super) fn open_two(
    ctx: &mut Ctx,
    d: usize,
    n0: u32,
    n1: u32,
    grouped: bool,
) -> Result<([u32; 2], [u32; 2])> {
    let (r0, r1) = (rmid(ctx, n0), rmid(ctx, n1));
    let h0 = open_with(ctx, d, r0, TIMES, 0, None)?;
    let h1 = open_with(ctx, d, r1, TIMES, 0, grouped.then_some(h0))?;
    Ok(([h0, h1], [r0, r1]))
}

/// F4. `{L, S}`: 1 MiB, park, 2 MiB, L alone DISABLEd while parked (S
///     stays enabled, its leader off: not counting), 4 MiB, L closed while
///     parked (S promoted to a leader of its own, enabled: it starts
///     counting — maybe, the PMU being parked), 8 MiB, the return (counts
///     for sure), 16 MiB. The contract: S counts exactly what landed while
///     it was counting: the 1 + 2 MiB before L's DISABLE, never the 4 MiB
///     while its leader was off, the 8 MiB at most (within the rules), the
///     16 MiB exactly at 100 %; its time_running stands still while its
///     leader is off and never goes back. (A read while parked leaves the
///     value's window open, so no window is judged from one.)
pub fn off_leader_closed_while_parked(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let ([l, s], [rl, rs]) = open_two(ctx, d, 5, 6, true)?;
    let burst = |ctx: &mut Ctx, x: u64| burst_each(ctx, d, &[(rl, 1), (rs, 1)], x);
    let first = ctx.g.read_many(&[l, s])?;
    burst(ctx, MIB)?;
    park(ctx, &allowed, false)?;
    burst(ctx, 2 * MIB)?;
    must(ctx, l, PerfIoctl::Disable { group: false })?;
    let off = ctx.g.read_many(&[l, s])?;
    burst(ctx, 4 * MIB)?;
    let before_close = ctx.g.read_many(&[l, s])?;
    ctx.g.close(l)?;
    let closed = ctx.g.read(s)?;
    burst(ctx, 8 * MIB)?;
    park(ctx, &allowed, true)?;
    let u = ctx.g.read(s)?;
    burst(ctx, 16 * MIB)?;
    let end = ctx.g.read(s)?;
    ctx.g.close(s)?;
    let mut problems = Vec::new();
    let sib = &first[1];
    clocks_never_back(
        "S",
        &[
            ("open", sib),
            ("L DISABLEd while parked", &off[1]),
            ("4 MiB", &before_close[1]),
            ("L closed while parked", &closed),
            ("the return", &u),
            ("16 MiB", &end),
        ],
        &mut problems,
    );
    if before_close[1][2] != off[1][2] {
        problems.push(format!(
            "S, its leader DISABLEd while parked, 4 MiB: read {:?} after {:?} (want time_running unchanged: not counting while its leader is off)",
            before_close[1], off[1]
        ));
    }
    clocks_still(
        "L: DISABLEd while parked, 4 MiB, before its close",
        &off[0],
        &before_close[0],
        &mut problems,
    );
    let got = u[0].wrapping_sub(sib[0]);
    if got != 3 * MIB && got != 11 * MIB {
        problems.push(format!(
            "S: 1 MiB, park, 2 MiB, its leader DISABLEd, 4 MiB, the leader closed, 8 MiB, the return: counted {} (want 1 + 2 MiB, or 1 + 2 + 8 MiB if it counted once promoted; never the 4 MiB landed while its leader was off)",
            bursts_in(got)
        ));
    }
    judge_exact(
        "S: after the return, 16 MiB",
        &u,
        &end,
        16 * MIB,
        &mut problems,
    );
    Ok(Check::from_problems(
        "freeze-attack: off leader closed while parked",
        problems,
        format!(
            "{}: a sibling whose leader was DISABLEd then closed while parked counted {} to the return, {} after it",
            pmu_name(d),
            bursts_in(got),
            bursts_in(end[0].wrapping_sub(u[0]))
        ),
    ))
}

/// F5. A crowded PMU moved right after the DISABLE that ends its
///     contention: a pinned event, a two-event group, `slots - 2` lone
///     events (one more slot event than slots), an exclusive event and a
///     plain one both opened disabled, never enabled; a long mux interval.
///     The contract: a move never changes whether an event is enabled, so
///     the two disabled ones read 0, 0, 0 to the end; the pinned group
///     alone fits, so it counts for sure throughout; a group is on for
///     sure from the DISABLE that ends contention, not from the next
///     rotation, and a move is seamless (0057: one context time for all),
///     so after DISABLE of a lone event and a move right after it every
///     enabled event counts exactly at 100 % across the move; the same
///     after DISABLE|GROUP of the group and a move; contended windows obey
///     the rules, and the disabled ones never count.
pub fn crowded_move_after_disable(ctx: &mut Ctx) -> Result<Check> {
    under_long_mux(ctx, crowded_move)
}

fn crowded_move(ctx: &mut Ctx, d: usize) -> Result<Check> {
    let slots = ctx.device.slots as usize;
    let lone_n = slots.saturating_sub(2);
    let needed = 3 + lone_n + 2;
    if needed > ctx.device.rmids as usize || slots < 3 {
        bail!(
            "{needed} events on {slots} slots need {needed} RMIDs and 3 slots or more (the device has {} RMIDs)",
            ctx.device.rmids
        );
    }
    let r: Vec<u32> = (0..needed as u32).map(|i| rmid(ctx, i)).collect();
    let pinned = open_with(ctx, d, r[0], TIMES, FLAG_PINNED, None)?;
    let gl = open_with(ctx, d, r[1], TIMES, 0, None)?;
    let gs = open_with(ctx, d, r[2], TIMES, 0, Some(gl))?;
    let mut hs = vec![pinned, gl, gs];
    for &rm in &r[3..3 + lone_n] {
        hs.push(open_with(ctx, d, rm, TIMES, 0, None)?);
    }
    let x = open_with(
        ctx,
        d,
        r[3 + lone_n],
        TIMES,
        FLAG_DISABLED | FLAG_EXCLUSIVE,
        None,
    )?;
    let y = open_with(ctx, d, r[4 + lone_n], TIMES, FLAG_DISABLED, None)?;
    hs.push(x);
    hs.push(y);
    let (ix, iy) = (hs.len() - 2, hs.len() - 1);
    let lone0 = 3;
    let names: Vec<String> = (0..hs.len())
        .map(|i| match i {
            0 => format!("pinned rmid {}", r[0]),
            1 => format!("group leader rmid {}", r[1]),
            2 => format!("group sibling rmid {}", r[2]),
            _ if i == ix => format!("disabled exclusive rmid {}", r[i]),
            _ if i == iy => format!("disabled plain rmid {}", r[i]),
            _ => format!("lone rmid {}", r[i]),
        })
        .collect();
    let every: Vec<(u32, u64)> = r.iter().map(|&rm| (rm, 1)).collect();
    let burst = |ctx: &mut Ctx, b: u64| burst_each(ctx, d, &every, b);
    let mut problems = Vec::new();
    let mut reads = vec![ctx.g.read_many(&hs)?];
    // Contended: slots + 1 slot events.
    burst(ctx, MIB)?;
    let a = ctx.g.read_many(&hs)?;
    // DISABLE of a lone event ends the contention; a move right after it.
    must(ctx, hs[lone0], PerfIoctl::Disable { group: false })?;
    let b0 = ctx.g.read_many(&hs)?;
    let o = move_away(ctx, d)?;
    let b1 = ctx.g.read_many(&hs)?;
    burst(ctx, 2 * MIB)?;
    let c = ctx.g.read_many(&hs)?;
    ctx.g.set_online(o, true)?;
    // ENABLE again, a move right after it: contended across the move.
    must(ctx, hs[lone0], PerfIoctl::Enable { group: false })?;
    let e0 = ctx.g.read_many(&hs)?;
    let o = move_away(ctx, d)?;
    burst(ctx, 4 * MIB)?;
    let e1 = ctx.g.read_many(&hs)?;
    ctx.g.set_online(o, true)?;
    // DISABLE|GROUP on the sibling ends it again; a move right after it.
    must(ctx, gs, PerfIoctl::Disable { group: true })?;
    let g0 = ctx.g.read_many(&hs)?;
    let o = move_away(ctx, d)?;
    burst(ctx, 8 * MIB)?;
    let g1 = ctx.g.read_many(&hs)?;
    ctx.g.set_online(o, true)?;
    reads.extend([a.clone(), b0.clone(), b1.clone(), c.clone(), e0.clone()]);
    reads.extend([e1.clone(), g0.clone(), g1.clone()]);
    for h in hs.iter().copied() {
        ctx.g.close(h)?;
    }
    let steps = [
        "open",
        "1 MiB",
        "DISABLE lone",
        "move",
        "2 MiB",
        "ENABLE lone",
        "move, 4 MiB",
        "DISABLE|GROUP",
        "move, 8 MiB",
    ];
    for (i, name) in names.iter().enumerate() {
        let series: Vec<(&str, &[u64])> = steps
            .iter()
            .zip(&reads)
            .map(|(w, v)| (*w, &v[i][..]))
            .collect();
        clocks_never_back(name, &series, &mut problems);
    }
    for i in [ix, iy] {
        for (w, v) in steps.iter().zip(&reads) {
            if v[i] != [0, 0, 0] {
                problems.push(format!(
                    "{}: opened disabled, never ENABLEd: read {:?} after \"{w}\" (want 0, 0, 0: a move never enables an event)",
                    names[i], v[i]
                ));
                break;
            }
        }
    }
    let enabled_lone: Vec<usize> = (lone0..lone0 + lone_n).collect();
    for i in (0..3).chain(enabled_lone.iter().copied()) {
        judge_window(
            &format!("{}: contended, 1 MiB", names[i]),
            &reads[0][i],
            &a[i],
            MIB,
            &mut problems,
        );
        judge_window(
            &format!(
                "{}: ENABLE of a lone event, a move, 4 MiB (contended)",
                names[i]
            ),
            &e0[i],
            &e1[i],
            4 * MIB,
            &mut problems,
        );
        if i == lone0 {
            clocks_still(
                &format!("{}: DISABLEd, a move, 2 MiB", names[i]),
                &b0[i],
                &c[i],
                &mut problems,
            );
            if c[i][0] != b0[i][0] {
                problems.push(format!(
                    "{}: DISABLEd, a move, 2 MiB: value {} after {} (want unchanged)",
                    names[i], c[i][0], b0[i][0]
                ));
            }
        } else {
            judge_exact(
                &format!(
                    "{}: a lone event DISABLEd, a move right after it, 2 MiB",
                    names[i]
                ),
                &b0[i],
                &c[i],
                2 * MIB,
                &mut problems,
            );
        }
        if i == 1 || i == 2 {
            if g1[i] != g0[i] {
                problems.push(format!(
                    "{}: DISABLE|GROUP, a move, 8 MiB: read {:?} after {:?} (want unchanged)",
                    names[i], g1[i], g0[i]
                ));
            }
        } else {
            judge_exact(
                &format!(
                    "{}: the group DISABLEd, a move right after it, 8 MiB",
                    names[i]
                ),
                &g0[i],
                &g1[i],
                8 * MIB,
                &mut problems,
            );
        }
    }
    judge_exact(
        "pinned: from the open, through three moves",
        &reads[0][0],
        &g1[0],
        15 * MIB,
        &mut problems,
    );
    Ok(Check::from_problems(
        "freeze-attack: crowded move after disable",
        problems,
        format!(
            "{}: pinned + group + {lone_n} lone on {slots} slots, a disabled exclusive and a disabled plain one: a move right after each DISABLE that ends contention, every enabled event exact at 100 %; the pinned one {}",
            pmu_name(d),
            bursts_in(g1[0][0].wrapping_sub(reads[0][0][0]))
        ),
    ))
}

/// F6. Two more events than slots, parked (contended): 1 MiB, park,
///     2 MiB, the first three DISABLEd while parked (slot holders frozen,
///     the others had no slot), 4 MiB, the return, 8 MiB, the three
///     ENABLEd, 16 MiB, two of them closed, 32 MiB. The contract: each
///     disabled event counts at most the 1 + 2 MiB it was enabled for,
///     within the rules, and stands still from its DISABLE (clocks) and
///     from the return (value); the three left enabled obey the rules to
///     the return and, fitting once placed again, count exactly at 100 %
///     after it; once two are closed the rest fit and count exactly.
pub fn several_frozen_while_contended(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let slots = ctx.device.slots as usize;
    let n = slots + 2;
    let many = Many::open(ctx, d, n, TIMES)?;
    let (rmids, hs) = (many.rmids.clone(), many.handles.clone());
    let off_n = 3.min(n - 1);
    let s = ctx.g.read_many(&hs)?;
    many.burst(ctx, MIB)?;
    park(ctx, &allowed, false)?;
    many.burst(ctx, 2 * MIB)?;
    for &h in &hs[..off_n] {
        must(ctx, h, PerfIoctl::Disable { group: false })?;
    }
    let off = ctx.g.read_many(&hs)?;
    many.burst(ctx, 4 * MIB)?;
    park(ctx, &allowed, true)?;
    let u = ctx.g.read_many(&hs)?;
    many.burst(ctx, 8 * MIB)?;
    let u1 = ctx.g.read_many(&hs)?;
    for &h in &hs[..off_n] {
        must(ctx, h, PerfIoctl::Enable { group: false })?;
    }
    let e = ctx.g.read_many(&hs)?;
    many.burst(ctx, 16 * MIB)?;
    let e1 = ctx.g.read_many(&hs)?;
    for &h in &hs[..2] {
        ctx.g.close(h)?;
    }
    let rest = hs[2..].to_vec();
    let g0 = ctx.g.read_many(&rest)?;
    many.burst(ctx, 32 * MIB)?;
    let g1 = ctx.g.read_many(&rest)?;
    for h in rest {
        ctx.g.close(h)?;
    }
    let mut problems = Vec::new();
    let mut frozen = Vec::new();
    for (i, r) in rmids.iter().enumerate() {
        let name = format!("rmid {r}");
        let mut series: Vec<(&str, &[u64])> = vec![
            ("open", &s[i]),
            ("DISABLEs while parked", &off[i]),
            ("the return", &u[i]),
            ("8 MiB", &u1[i]),
            ("ENABLEs", &e[i]),
            ("16 MiB", &e1[i]),
        ];
        if i >= 2 {
            series.push(("two closed", &g0[i - 2]));
            series.push(("32 MiB", &g1[i - 2]));
        }
        clocks_never_back(&name, &series, &mut problems);
        if i < off_n {
            frozen.push(bursts_in(u[i][0].wrapping_sub(s[i][0])));
            judge_window(
                &format!("{name}: 1 MiB, park, 2 MiB, DISABLEd while parked, 4 MiB, the return"),
                &s[i],
                &u[i],
                3 * MIB,
                &mut problems,
            );
            clocks_still(
                &format!("{name}: DISABLEd while parked to after the return"),
                &off[i],
                &u1[i],
                &mut problems,
            );
            if u1[i][0] != u[i][0] {
                problems.push(format!(
                    "{name}: disabled, the return, 8 MiB: value {} after {} (want unchanged)",
                    u1[i][0], u[i][0]
                ));
            }
        } else {
            judge_window(
                &format!("{name}: enabled, 1 MiB, park, 2 MiB, {off_n} others DISABLEd, 4 MiB, the return"),
                &s[i],
                &u[i],
                7 * MIB,
                &mut problems,
            );
            judge_exact(
                &format!(
                    "{name}: placed again, {} enabled on {slots} slots, 8 MiB",
                    n - off_n
                ),
                &u[i],
                &u1[i],
                8 * MIB,
                &mut problems,
            );
        }
        judge_window(
            &format!("{name}: all {n} enabled again, 16 MiB"),
            &e[i],
            &e1[i],
            16 * MIB,
            &mut problems,
        );
        if i >= 2 {
            judge_exact(
                &format!("{name}: two closed, {} on {slots} slots, 32 MiB", n - 2),
                &g0[i - 2],
                &g1[i - 2],
                32 * MIB,
                &mut problems,
            );
        }
    }
    Ok(Check::from_problems(
        "freeze-attack: several frozen while contended",
        problems,
        format!(
            "{}: {n} events on {slots} slots, {off_n} DISABLEd while parked: they read {} to the return; the rest exact at 100 % once placed, all exact after two closes",
            pmu_name(d),
            frozen.join(", ")
        ),
    ))
}

/// Polls domain `d`'s `cpumask` until `ok` holds of it
/// ([`crate::guest::Guest::wait_cpumask`]).
pub(super) fn wait_mask(
    ctx: &mut Ctx,
    d: usize,
    ok: impl Fn(&[u32]) -> bool,
) -> Result<(bool, Vec<u32>)> {
    ctx.g.wait_cpumask(&pmu_name(d), ok)
}

/// Sets domain `d`'s allowed CPUs from the host.
pub(super) fn set_allowed(ctx: &mut Ctx, d: usize, cpus: &[u32]) -> Result<()> {
    ctx.control
        .set_allowed(d as u32, cpus)
        .map_err(|e| anyhow::anyhow!("allowed set {cpus:?} for domain {d}: {e}"))
}

/// Every attack, in order, each by the name its `Check` carries; each
/// leaves every CPU online, nothing open and the mux interval as it found
/// it.
pub(super) const CHECKS: &[Named] = &[
    (
        "freeze-attack: off leader closed while parked",
        off_leader_closed_while_parked,
    ),
    (
        "freeze-attack: crowded move after disable",
        crowded_move_after_disable,
    ),
    (
        "freeze-attack: several frozen while contended",
        several_frozen_while_contended,
    ),
];
