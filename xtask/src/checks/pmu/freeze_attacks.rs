//! Red-team attacks on frozen slots (docs/counting-semantics.md, "Parks
//! and wraps": an event DISABLEd while its PMU is parked has its counter
//! frozen in the device, `SLOT_CTL_FROZEN`, and read exactly on the next
//! owner; an ENABLE thaws it, parked or not; its `time_running` stops at
//! the DISABLE and never goes back) and on the batched move of patch 0057
//! (every event of a PMU off and on in one cross call each, the context's
//! time frozen from the first add to the settle). Written from the
//! contract alone: RESET of a frozen event while parked, DISABLE and
//! ENABLE toggled in one park, group DISABLEs while parked with a leader
//! closed there too, a sibling of a leader DISABLEd and closed while
//! parked, a crowded move right after the DISABLE that ends contention,
//! and several frozen slots at once in a contended park.
//!
//! Burst sizes are distinct powers of two, so a count names the bursts it
//! took. Each window is judged by the rules ([`judge_window`]) or exactly
//! where the contract says the event counts for sure ([`judge_exact`]).

use anyhow::{bail, Result};
use perfbed_agent::PerfIoctl;
use perfbed_device::regs::Event;

use super::context::{Ctx, MIB};
use super::move_attacks::{judge_exact, judge_window, move_away, under_long_mux, TIMES};
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

/// F2. DISABLE, ENABLE, DISABLE, ENABLE, DISABLE in one park, with a
///     burst after each, and a reference event enabled throughout. The
///     contract: frozen at each DISABLE, thawed at each ENABLE (counting
///     goes on from there, parked or not), the count of a park exact. So
///     from the open the event counts exactly 1 + 2 + 8 + 32 MiB at the
///     return (never the 4, 16, 64 MiB landed while it was disabled), the
///     same after 128 MiB more while still disabled, then exactly 256 MiB
///     after an ENABLE; its clocks stand still across each disabled span
///     and never go back; the reference counts all 511 MiB.
pub fn toggled_in_one_park(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let (hs, [ra, rr]) = open_two(ctx, d, 3, 4, false)?;
    let [a, reference] = hs;
    let both = |ctx: &mut Ctx, x: u64| burst_each(ctx, d, &[(ra, 1), (rr, 1)], x);
    let mut reads: Vec<(&str, Vec<Vec<u64>>)> = vec![("open", ctx.g.read_many(&hs)?)];
    both(ctx, MIB)?;
    park(ctx, &allowed, false)?;
    both(ctx, 2 * MIB)?;
    // Each toggle: its name, the name of the read right before it, ENABLE
    // or DISABLE, and the MiB that land after it.
    let toggles = [
        ("DISABLE 1", "before DISABLE 1", false, 4),
        ("ENABLE 1", "before ENABLE 1", true, 8),
        ("DISABLE 2", "before DISABLE 2", false, 16),
        ("ENABLE 2", "before ENABLE 2", true, 32),
        ("DISABLE 3", "before DISABLE 3", false, 64),
    ];
    for &(name, before, on, burst) in &toggles {
        let io = if on {
            PerfIoctl::Enable { group: false }
        } else {
            PerfIoctl::Disable { group: false }
        };
        reads.push((before, ctx.g.read_many(&hs)?));
        must(ctx, a, io)?;
        reads.push((name, ctx.g.read_many(&hs)?));
        both(ctx, burst * MIB)?;
    }
    park(ctx, &allowed, true)?;
    reads.push(("the return", ctx.g.read_many(&hs)?));
    both(ctx, 128 * MIB)?;
    reads.push(("128 MiB, still disabled", ctx.g.read_many(&hs)?));
    must(ctx, a, PerfIoctl::Enable { group: false })?;
    reads.push(("ENABLE after the return", ctx.g.read_many(&hs)?));
    both(ctx, 256 * MIB)?;
    reads.push(("256 MiB", ctx.g.read_many(&hs)?));
    ctx.g.close(a)?;
    ctx.g.close(reference)?;
    let mut problems = Vec::new();
    let r = |n: &str| -> &Vec<Vec<u64>> {
        &reads
            .iter()
            .find(|(w, _)| *w == n)
            .expect("a read taken above")
            .1
    };
    for (i, name) in ["toggled", "reference"].iter().enumerate() {
        let series: Vec<(&str, &[u64])> = reads.iter().map(|(w, v)| (*w, &v[i][..])).collect();
        clocks_never_back(name, &series, &mut problems);
    }
    for (from, to) in [
        ("DISABLE 1", "before ENABLE 1"),
        ("DISABLE 2", "before ENABLE 2"),
        ("DISABLE 3", "the return"),
        ("DISABLE 3", "128 MiB, still disabled"),
    ] {
        clocks_still(
            &format!("toggled: disabled from \"{from}\" to \"{to}\""),
            &r(from)[0],
            &r(to)[0],
            &mut problems,
        );
    }
    let open = &r("open")[0];
    let back = &r("the return")[0];
    let still = &r("128 MiB, still disabled")[0];
    let want = (1 + 2 + 8 + 32) * MIB;
    let got = back[0].wrapping_sub(open[0]);
    if got != want || still[0] != back[0] {
        problems.push(format!(
            "toggled: 1 MiB, park, 2 MiB, DISABLE, 4, ENABLE, 8, DISABLE, 16, ENABLE, 32, DISABLE, 64, the return: counted {} (want exactly 1 + 2 + 8 + 32 MiB), then {} after 128 MiB more while disabled (want unchanged)",
            bursts_in(got),
            bursts_in(still[0].wrapping_sub(open[0]))
        ));
    }
    judge_window(
        "toggled, from the open to the return",
        open,
        back,
        want,
        &mut problems,
    );
    judge_exact(
        "toggled, ENABLEd after the return, 256 MiB",
        &r("ENABLE after the return")[0],
        &r("256 MiB")[0],
        256 * MIB,
        &mut problems,
    );
    let (ref0, ref1) = (&r("open")[1], &r("256 MiB")[1]);
    if ref1[0].wrapping_sub(ref0[0]) != 511 * MIB {
        problems.push(format!(
            "reference, enabled throughout: counted {} (want all 511 MiB)",
            bursts_in(ref1[0].wrapping_sub(ref0[0]))
        ));
    }
    Ok(Check::from_problems(
        "freeze-attack: toggled in one park",
        problems,
        format!(
            "{}: DISABLE/ENABLE/DISABLE/ENABLE/DISABLE in one park: counted {} to the return, the reference {}",
            pmu_name(d),
            bursts_in(got),
            bursts_in(ref1[0].wrapping_sub(ref0[0]))
        ),
    ))
}

/// F3. Two groups, `{L1, S1}` and `{L2, S2}` (the siblings get twice each
///     burst), all on the PMU's slots: 1 MiB, park, 2 MiB, DISABLE with
///     PERF_IOC_FLAG_GROUP of each, issued on S1 and on L2 (every member
///     frozen), 4 MiB, L2 closed while parked (S2 promoted, its state
///     kept: disabled), 8 MiB, the return, 16 MiB, ENABLE|GROUP on L1 and
///     ENABLE of S2, 32 MiB. The contract: each member counts exactly what
///     landed while it was enabled — 1 + 2 MiB (×2 for the siblings),
///     read exactly from the return on, unchanged while disabled — then
///     exactly the 32 MiB after the ENABLEs at 100 %; clocks still from
///     the DISABLE to the ENABLE.
pub fn groups_frozen_while_parked(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let ([l1, s1], [r1, r2]) = open_two(ctx, d, 1, 2, true)?;
    let ([l2, s2], [r3, r4]) = open_two(ctx, d, 3, 4, true)?;
    let scale = [1, 2, 1, 2];
    let scaled = [(r1, 1), (r2, 2), (r3, 1), (r4, 2)];
    let burst = |ctx: &mut Ctx, x: u64| burst_each(ctx, d, &scaled, x);
    let all = [l1, s1, l2, s2];
    let kept = [l1, s1, s2];
    let names = ["L1", "S1", "S2 (L2 closed)"];
    let kept_at = [0, 1, 3];
    let s = ctx.g.read_many(&all)?;
    burst(ctx, MIB)?;
    park(ctx, &allowed, false)?;
    burst(ctx, 2 * MIB)?;
    must(ctx, s1, PerfIoctl::Disable { group: true })?;
    must(ctx, l2, PerfIoctl::Disable { group: true })?;
    let off = ctx.g.read_many(&all)?;
    burst(ctx, 4 * MIB)?;
    ctx.g.close(l2)?;
    let closed = ctx.g.read_many(&kept)?;
    burst(ctx, 8 * MIB)?;
    park(ctx, &allowed, true)?;
    let u = ctx.g.read_many(&kept)?;
    burst(ctx, 16 * MIB)?;
    let u1 = ctx.g.read_many(&kept)?;
    must(ctx, l1, PerfIoctl::Enable { group: true })?;
    must(ctx, s2, PerfIoctl::Enable { group: false })?;
    let e = ctx.g.read_many(&kept)?;
    burst(ctx, 32 * MIB)?;
    let f = ctx.g.read_many(&kept)?;
    for h in kept {
        ctx.g.close(h)?;
    }
    let mut problems = Vec::new();
    let mut counted = Vec::new();
    for (k, name) in names.iter().enumerate() {
        let i = kept_at[k];
        let m = scale[i];
        let got = u[k][0].wrapping_sub(s[i][0]);
        counted.push(format!("{name} {}", bursts_in(got)));
        if got != 3 * m * MIB || u1[k][0] != u[k][0] {
            problems.push(format!(
                "{name}: {m} MiB, park, {} MiB, DISABLE|GROUP while parked, {} MiB{}, {} MiB, the return: counted {} (want exactly the {} MiB landed while enabled, frozen in its slot), then {} after {} MiB more while disabled (want unchanged)",
                2 * m,
                4 * m,
                if k == 2 { ", its leader closed while parked" } else { "" },
                8 * m,
                bursts_in(got),
                3 * m,
                bursts_in(u1[k][0].wrapping_sub(s[i][0])),
                16 * m
            ));
        }
        clocks_still(
            &format!("{name}: DISABLE|GROUP while parked to after the return"),
            &off[i],
            &u1[k],
            &mut problems,
        );
        clocks_never_back(
            name,
            &[
                ("open", &s[i]),
                ("DISABLE|GROUP while parked", &off[i]),
                ("L2 closed while parked", &closed[k]),
                ("the return", &u[k]),
                ("16 MiB", &u1[k]),
                ("ENABLE", &e[k]),
                ("32 MiB", &f[k]),
            ],
            &mut problems,
        );
        judge_exact(
            &format!("{name}: ENABLEd after the return, {} MiB", 32 * m),
            &e[k],
            &f[k],
            32 * m * MIB,
            &mut problems,
        );
    }
    Ok(Check::from_problems(
        "freeze-attack: groups frozen while parked",
        problems,
        format!(
            "{}: two groups DISABLEd with PERF_IOC_FLAG_GROUP while parked, one leader closed there: {} to the return; exact after the ENABLEs",
            pmu_name(d),
            counted.join(", ")
        ),
    ))
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

/// F7. A frozen slot carried, unread, through a placement, a move and a
///     second park. Three events: A, B and a reference R. 1 MiB, park,
///     2 MiB, A and B DISABLEd while parked (frozen, 3 MiB unread), 4 MiB,
///     the PMU placed on one allowed CPU and moved at once to the other
///     (no read between), B ENABLEd there, 8 MiB, a second park, A ENABLEd
///     while parked, 16 MiB, the return, 32 MiB. The contract: the next
///     read on an owner counts a frozen slot exactly, whatever came
///     between; a move never changes whether an event is enabled. So B
///     counts exactly 1 + 2 + 8 + 16 + 32 MiB (enabled, alone on its
///     slots, a park's count exact); A counts the 1 + 2 MiB, never the 4 or
///     8 MiB landed while disabled, the 16 MiB at most (enabled while
///     parked after it was taken off: maybe counting), the 32 MiB exactly
///     at 100 %; R counts all 63 MiB; no clock goes back.
pub fn frozen_through_move_and_second_park(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let (c0, c1) = (allowed[0], allowed[1]);
    let ([a, b], [ra, rb]) = open_two(ctx, d, 2, 3, false)?;
    let rr = rmid(ctx, 4);
    let reference = open_with(ctx, d, rr, TIMES, 0, None)?;
    let hs = [a, b, reference];
    let every = [(ra, 1), (rb, 1), (rr, 1)];
    let burst = |ctx: &mut Ctx, x: u64| burst_each(ctx, d, &every, x);
    let s = ctx.g.read_many(&hs)?;
    burst(ctx, MIB)?;
    park(ctx, &allowed, false)?;
    burst(ctx, 2 * MIB)?;
    must(ctx, a, PerfIoctl::Disable { group: false })?;
    must(ctx, b, PerfIoctl::Disable { group: false })?;
    let off = ctx.g.read_many(&hs)?;
    burst(ctx, 4 * MIB)?;
    ctx.g.set_online(c0, true)?;
    for &c in &allowed[1..] {
        ctx.g.set_online(c, true)?;
    }
    ctx.g.set_online(c0, false)?;
    must(ctx, b, PerfIoctl::Enable { group: false })?;
    let moved = ctx.g.read_many(&hs)?;
    burst(ctx, 8 * MIB)?;
    let before_park = ctx.g.read_many(&hs)?;
    park(ctx, &allowed[1..], false)?;
    must(ctx, a, PerfIoctl::Enable { group: false })?;
    burst(ctx, 16 * MIB)?;
    park(ctx, &allowed, true)?;
    let u = ctx.g.read_many(&hs)?;
    burst(ctx, 32 * MIB)?;
    let end = ctx.g.read_many(&hs)?;
    for h in hs {
        ctx.g.close(h)?;
    }
    let mut problems = Vec::new();
    for (i, name) in ["A", "B", "R"].iter().enumerate() {
        clocks_never_back(
            name,
            &[
                ("open", &s[i]),
                ("DISABLEs while parked", &off[i]),
                ("placed, moved, B ENABLEd", &moved[i]),
                ("8 MiB", &before_park[i]),
                ("the second return", &u[i]),
                ("32 MiB", &end[i]),
            ],
            &mut problems,
        );
    }
    let a_got = u[0][0].wrapping_sub(s[0][0]);
    if a_got != 3 * MIB && a_got != 19 * MIB {
        problems.push(format!(
            "A: 1 MiB, park, 2 MiB, DISABLE, 4 MiB, placed on CPU {c0} and moved to CPU {c1} unread, 8 MiB, park, ENABLE, 16 MiB, the return: counted {} (want 1 + 2 MiB, or 1 + 2 + 16 MiB: never the 4 + 8 MiB landed while disabled)",
            bursts_in(a_got)
        ));
    }
    clocks_still(
        "A: DISABLEd while parked, placed, moved, 8 MiB, before the second park",
        &off[0],
        &before_park[0],
        &mut problems,
    );
    if before_park[0][0] != s[0][0] + 3 * MIB {
        problems.push(format!(
            "A: disabled, its frozen slot carried through a placement and a move: read {:?} on the new owner (want exactly the 1 + 2 MiB frozen at its DISABLE)",
            before_park[0]
        ));
    }
    judge_exact(
        "A: after the return, 32 MiB",
        &u[0],
        &end[0],
        32 * MIB,
        &mut problems,
    );
    let b_got = end[1][0].wrapping_sub(s[1][0]);
    if b_got != 59 * MIB {
        problems.push(format!(
            "B: 1 MiB, park, 2 MiB, DISABLE, 4 MiB, placed and moved unread, ENABLE, 8 MiB, park, 16 MiB, the return, 32 MiB: counted {} (want exactly 1 + 2 + 8 + 16 + 32 MiB)",
            bursts_in(b_got)
        ));
    }
    judge_exact(
        "B: ENABLEd right after the move, 8 MiB",
        &moved[1],
        &before_park[1],
        8 * MIB,
        &mut problems,
    );
    let r_got = end[2][0].wrapping_sub(s[2][0]);
    if r_got != 63 * MIB {
        problems.push(format!(
            "R, enabled throughout two parks and a move: counted {} (want all 63 MiB)",
            bursts_in(r_got)
        ));
    }
    Ok(Check::from_problems(
        "freeze-attack: frozen through move and second park",
        problems,
        format!(
            "{}: frozen while parked, placed on CPU {c0} and moved to CPU {c1} unread, parked again: A {} (ENABLEd in the second park), B {} (ENABLEd after the move), R {}",
            pmu_name(d),
            bursts_in(end[0][0].wrapping_sub(s[0][0])),
            bursts_in(b_got),
            bursts_in(r_got)
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

/// F9. Three events of one RMID (the device lets several slots count the
///     same (event, RMID)): A and B enabled, C opened disabled. 1 MiB,
///     park, 2 MiB, A DISABLEd while parked, 4 MiB, the return, 8 MiB, A
///     ENABLEd, 16 MiB; a second park, 32 MiB, B DISABLEd while parked,
///     64 MiB, A RESET and C ENABLEd while parked, 128 MiB, the return,
///     256 MiB. The contract holds per event: A's freeze stops A alone,
///     B's stops B alone. So at the first return A reads exactly 1 + 2 MiB
///     and B 1 + 2 + 4 + 8 MiB; after A's ENABLE both count the 16 MiB
///     exactly at 100 %; at the end A reads exactly 128 + 256 MiB (RESET
///     while parked, enabled), B exactly its 1 + 2 + 4 + 8 + 16 + 32 MiB,
///     C 256 MiB, or 128 + 256 MiB if it counted once ENABLEd while parked
///     (maybe counting), never the bursts before its ENABLE.
pub fn frozen_beside_same_rmid(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let r = rmid(ctx, 7);
    let a = open_with(ctx, d, r, TIMES, 0, None)?;
    let b = open_with(ctx, d, r, TIMES, 0, None)?;
    let c = open_with(ctx, d, r, TIMES, FLAG_DISABLED, None)?;
    let hs = [a, b, c];
    let burst = |ctx: &mut Ctx, x: u64| burst_each(ctx, d, &[(r, 1)], x);
    let s = ctx.g.read_many(&hs)?;
    burst(ctx, MIB)?;
    park(ctx, &allowed, false)?;
    burst(ctx, 2 * MIB)?;
    must(ctx, a, PerfIoctl::Disable { group: false })?;
    burst(ctx, 4 * MIB)?;
    park(ctx, &allowed, true)?;
    burst(ctx, 8 * MIB)?;
    let u = ctx.g.read_many(&hs)?;
    must(ctx, a, PerfIoctl::Enable { group: false })?;
    let on = ctx.g.read_many(&hs)?;
    burst(ctx, 16 * MIB)?;
    let mid = ctx.g.read_many(&hs)?;
    park(ctx, &allowed, false)?;
    burst(ctx, 32 * MIB)?;
    must(ctx, b, PerfIoctl::Disable { group: false })?;
    burst(ctx, 64 * MIB)?;
    must(ctx, a, PerfIoctl::Reset { group: false })?;
    must(ctx, c, PerfIoctl::Enable { group: false })?;
    burst(ctx, 128 * MIB)?;
    park(ctx, &allowed, true)?;
    let back = ctx.g.read_many(&hs)?;
    burst(ctx, 256 * MIB)?;
    let end = ctx.g.read_many(&hs)?;
    for h in hs {
        ctx.g.close(h)?;
    }
    let mut problems = Vec::new();
    for (i, name) in ["A", "B", "C"].iter().enumerate() {
        clocks_never_back(
            name,
            &[
                ("open", &s[i]),
                ("the first return, 8 MiB", &u[i]),
                ("A ENABLEd", &on[i]),
                ("16 MiB", &mid[i]),
                ("the second return", &back[i]),
                ("256 MiB", &end[i]),
            ],
            &mut problems,
        );
    }
    let got = |v: &[Vec<u64>], i: usize| v[i][0].wrapping_sub(s[i][0]);
    let mut want = |what: &str, have: u64, wanted: &[u64]| {
        if !wanted.contains(&have) {
            let w: Vec<String> = wanted.iter().map(|&x| bursts_in(x)).collect();
            problems.push(format!(
                "{what}: counted {} (want {})",
                bursts_in(have),
                w.join(" or ")
            ));
        }
    };
    want(
        "A, DISABLEd while parked beside B on its RMID, at the first return",
        got(&u, 0),
        &[3 * MIB],
    );
    want(
        "B, enabled beside A's frozen slot on one RMID, at the first return",
        got(&u, 1),
        &[15 * MIB],
    );
    want(
        "A, RESET while parked in the second park, at the end",
        end[0][0],
        &[384 * MIB],
    );
    want(
        "B, DISABLEd in the second park, at the end",
        got(&end, 1),
        &[63 * MIB],
    );
    want(
        "C, opened disabled, ENABLEd in the second park, at the end",
        got(&end, 2),
        &[256 * MIB, 384 * MIB],
    );
    judge_exact(
        "A, ENABLEd after the first return, 16 MiB",
        &on[0],
        &mid[0],
        16 * MIB,
        &mut problems,
    );
    judge_exact(
        "B beside it, 16 MiB",
        &on[1],
        &mid[1],
        16 * MIB,
        &mut problems,
    );
    judge_exact(
        "A after the second return, 256 MiB",
        &back[0],
        &end[0],
        256 * MIB,
        &mut problems,
    );
    judge_exact(
        "C after the second return, 256 MiB",
        &back[2],
        &end[2],
        256 * MIB,
        &mut problems,
    );
    clocks_still(
        "B, DISABLEd in the second park, after it",
        &back[1],
        &end[1],
        &mut problems,
    );
    Ok(Check::from_problems(
        "freeze-attack: frozen beside same rmid",
        problems,
        format!(
            "{}: three events of RMID {r}, one frozen while parked beside the others twice: A {} at the first return, {} at the end (RESET while parked); B {}; C {}",
            pmu_name(d),
            bursts_in(got(&u, 0)),
            bursts_in(end[0][0]),
            bursts_in(got(&end, 1)),
            bursts_in(got(&end, 2))
        ),
    ))
}

/// Every attack, in order, each by the name its `Check` carries; each
/// leaves every CPU online, nothing open and the mux interval as it found
/// it.
pub(super) const CHECKS: &[Named] = &[
    ("freeze-attack: toggled in one park", toggled_in_one_park),
    (
        "freeze-attack: groups frozen while parked",
        groups_frozen_while_parked,
    ),
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
    (
        "freeze-attack: frozen through move and second park",
        frozen_through_move_and_second_park,
    ),
    (
        "freeze-attack: frozen beside same rmid",
        frozen_beside_same_rmid,
    ),
];
