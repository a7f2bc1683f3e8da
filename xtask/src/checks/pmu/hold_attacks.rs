//! Red-team attacks on the holding CPU (docs/counting-semantics.md, "Parks
//! and wraps", and kernel patch 0063): a parked PMU's events wait on the
//! first online CPU, CPU 0, and a PMU parked while it counts there, or
//! placed there by its allowed set, moves its events off and back on that
//! CPU in place. The contract says a park and a placement are the same
//! whichever CPU keeps the parked events: exact counts, clocks that never
//! go back, frozen slots read exactly at the placement.
//!
//! Each attack runs on CPU 0's own domain (parked in place by an emptied
//! set, placed back on CPU 0) or on the other domain placed onto CPU 0,
//! mostly with a cpu-clock event open on CPU 0 all along, so that CPU 0's
//! context stays active through the in-place moves (the driver tells a
//! reschedule from a disable by the context's time, which only an active
//! context moves on). Burst sizes are distinct powers of two, so a count
//! names the bursts it took. Every attack gives both domains their
//! default sets back at its end, also when it fails.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use perfbed_agent::PerfIoctl;
use perfbed_device::regs::{whole_units, Event};

use super::attacks::cpu_clock;
use super::context::{Ctx, MIB, TIMES};
use super::freeze_attacks::{
    burst_each, bursts_in, clocks_never_back, clocks_still, open_two, set_allowed, wait_mask,
};
use super::move_attacks::{judge_exact, judge_window, with_mux_interval, LONG_MUX_MS, SKEW_NS};
use super::moves::movable_domain;
use super::redteam::{must, open_with, rmid, truth, Many, Named};
use super::semantics::{lost_wraps_file, two_wrap_park};
use crate::checks::Check;
use crate::guest::pmu_name;

/// Steady traffic while the PMU parks and is placed: 64 MiB/s, so that a
/// move's transit (milliseconds under TCG) always has some land.
const RATE: u64 = 64 * MIB;
/// How long each step of a walk lets the rate run before the next change.
const DWELL: Duration = Duration::from_millis(40);
/// A park shorter than this is far from the contract's 0.25 s, under which
/// it must stay running time.
const SHORT_PARK: Duration = Duration::from_millis(200);

/// CPU 0's domain and its default set.
fn holding_domain(ctx: &Ctx) -> Result<(usize, Vec<u32>)> {
    match ctx.device.domains.iter().position(|cpus| cpus.contains(&0)) {
        Some(d) => Ok((d, ctx.device.domains[d].clone())),
        None => bail!("no domain holds CPU 0 (domains {:?})", ctx.device.domains),
    }
}

/// Whether cpumask `m` is what a set `want` gives: parked for an empty
/// set, else one CPU of it.
fn mask_is(m: &[u32], want: &[u32]) -> bool {
    if want.is_empty() {
        m.is_empty()
    } else {
        m.len() == 1 && want.contains(&m[0])
    }
}

/// Gives domain `d` the set `cpus` and waits until its cpumask is `want`'s
/// (parked for an empty one, else one of its CPUs).
fn place(ctx: &mut Ctx, d: usize, cpus: &[u32], want: &[u32]) -> Result<()> {
    set_allowed(ctx, d, cpus)?;
    let (ok, mask) = wait_mask(ctx, d, |m| mask_is(m, want))?;
    if !ok {
        bail!(
            "{}: the set {cpus:?}: cpumask {mask:?} after 30 s (want {})",
            pmu_name(d),
            if want.is_empty() {
                "parked".to_string()
            } else {
                format!("one of {want:?}")
            }
        );
    }
    Ok(())
}

/// Runs `check`, then gives every domain its default set back and waits
/// until each counts on one of its CPUs, whether `check` finished or not.
fn with_defaults_back(
    ctx: &mut Ctx,
    check: impl FnOnce(&mut Ctx) -> Result<Check>,
) -> Result<Check> {
    let out = check(ctx);
    let defaults = ctx.device.domains.clone();
    for (d, cpus) in defaults.iter().enumerate() {
        set_allowed(ctx, d, cpus)?;
    }
    for (d, cpus) in defaults.iter().enumerate() {
        let (ok, mask) = wait_mask(ctx, d, |m| mask_is(m, cpus))?;
        if !ok && out.is_ok() {
            bail!(
                "{}: its default set {cpus:?} given back: cpumask {mask:?} after 30 s",
                pmu_name(d)
            );
        }
    }
    out
}

/// One step of a walk: the set given, and the set the cpumask must then
/// be in (empty: parked).
type Step = (Vec<u32>, Vec<u32>);

/// Walks domain `d` through `steps`, letting the traffic run `DWELL`
/// after each; returns the cpumasks seen and the longest park.
fn walk(ctx: &mut Ctx, d: usize, steps: &[Step]) -> Result<(Vec<String>, Duration)> {
    let mut path = Vec::new();
    let mut longest = Duration::ZERO;
    let mut parked_at: Option<Instant> = None;
    for (cpus, want) in steps {
        let t = Instant::now();
        place(ctx, d, cpus, want)?;
        std::thread::sleep(DWELL);
        let mask = ctx.g.cpumask(&pmu_name(d))?;
        path.push(if mask.is_empty() {
            "parked".to_string()
        } else {
            format!("{mask:?}")
        });
        match (want.is_empty(), parked_at) {
            (true, None) => parked_at = Some(t),
            (false, Some(p)) => {
                longest = longest.max(p.elapsed());
                parked_at = None;
            }
            _ => {}
        }
    }
    if let Some(p) = parked_at {
        longest = longest.max(p.elapsed());
    }
    Ok((path, longest))
}

/// H1-H3's sequence: an event of domain `d` (a cpu-clock on CPU 0 open
/// beside it if `busy`) counts a steady rate while `steps` park and place
/// the PMU; the count must be the device's truth in whole units, running
/// equal to enabled (the parks are short).
fn traffic_through(
    ctx: &mut Ctx,
    d: usize,
    steps: &[Step],
    busy: bool,
    name: &'static str,
) -> Result<Check> {
    let r = rmid(ctx, 6);
    let clock = if busy {
        Some(cpu_clock(ctx, 0, None)?)
    } else {
        None
    };
    let a = open_with(ctx, d, r, TIMES, 0, None)?;
    let t0 = truth(ctx, d, r)?;
    let s = ctx.g.read(a)?;
    ctx.control
        .set_rate(d as u32, r, Event::MbmTotalBytes, RATE)?;
    let walked = walk(ctx, d, steps);
    ctx.control.set_rate(d as u32, r, Event::MbmTotalBytes, 0)?;
    ctx.inject_and_land(&[])?;
    let e = ctx.g.read(a)?;
    let t1 = truth(ctx, d, r)?;
    ctx.g.close(a)?;
    if let Some(c) = clock {
        ctx.g.close(c)?;
    }
    let (path, longest) = walked?;
    let want = whole_units(t1.wrapping_sub(t0), ctx.device.unit_bytes);
    let got = e[0].wrapping_sub(s[0]);
    let (enabled, running) = (e[1].wrapping_sub(s[1]), e[2].wrapping_sub(s[2]));
    let mut problems = Vec::new();
    if got != want {
        problems.push(format!(
            "{} at {} MiB/s through {}: counted {got} bytes, the device's truth {want} (in whole units): {} bytes {} (read {s:?} → {e:?})",
            pmu_name(d),
            RATE / MIB,
            path.join(" → "),
            want.abs_diff(got),
            if got < want { "lost" } else { "too many" }
        ));
    }
    if running > enabled || (longest < SHORT_PARK && running != enabled) {
        problems.push(format!(
            "Δenabled {enabled} Δrunning {running}, longest park {longest:?} (want running = enabled: parks under {SHORT_PARK:?})"
        ));
    }
    Ok(Check::from_problems(
        name,
        problems,
        format!(
            "{}{}: {} MiB/s through {}: counted {got} = truth, 100 % running",
            pmu_name(d),
            if busy {
                ", a cpu-clock open on CPU 0"
            } else {
                ""
            },
            RATE / MIB,
            path.join(" → ")
        ),
    ))
}

/// On CPU 0 by the set {0}, then three rounds of the set emptied (parked
/// where the events are) and {0} again (placed where they are).
fn in_place_rounds() -> Vec<Step> {
    let on0 = (vec![0], vec![0]);
    let parked = (vec![], vec![]);
    let mut steps = vec![on0.clone()];
    for _ in 0..3 {
        steps.push(parked.clone());
        steps.push(on0.clone());
    }
    steps
}

/// H1. Traffic through in-place parks and placements on CPU 0. CPU 0's
///     domain counts on CPU 0 (the set {0}), a cpu-clock event is open on
///     CPU 0, and an event counts a steady 64 MiB/s while the set is
///     emptied (parked where its events are) and given {0} again (placed
///     where they are), three times. The contract: a park and a placement
///     are the same whichever CPU keeps the parked events, and a move is
///     seamless: every byte that landed is counted, running = enabled.
pub fn traffic_through_placements_on_cpu0(ctx: &mut Ctx) -> Result<Check> {
    let (d, _) = holding_domain(ctx)?;
    let steps = in_place_rounds();
    with_defaults_back(ctx, |ctx| {
        traffic_through(
            ctx,
            d,
            &steps,
            true,
            "hold-attack: traffic through placements on cpu 0",
        )
    })
}

/// H2. H1 with nothing else open on CPU 0: the same exact count (a
///     control for H1: only whether CPU 0's context stays active between
///     the in-place removal and install differs).
pub fn traffic_through_placements_on_idle_cpu0(ctx: &mut Ctx) -> Result<Check> {
    let (d, _) = holding_domain(ctx)?;
    let steps = in_place_rounds();
    with_defaults_back(ctx, |ctx| {
        traffic_through(
            ctx,
            d,
            &steps,
            false,
            "hold-attack: traffic through placements on idle cpu 0",
        )
    })
}

/// H3. The other domain under traffic, moved onto the holding CPU and
///     back: parked (its events move to CPU 0), placed by the set {0}
///     (in place), given its set back (moved off CPU 0), twice; a
///     cpu-clock open on CPU 0. Exact, running = enabled.
pub fn traffic_through_other_domain_on_cpu0(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    if allowed.contains(&0) {
        bail!("CPU 0 is already domain {d}'s ({allowed:?})");
    }
    let mut steps: Vec<Step> = Vec::new();
    for _ in 0..2 {
        steps.push((vec![], vec![]));
        steps.push((vec![0], vec![0]));
        steps.push((allowed.clone(), allowed.clone()));
    }
    with_defaults_back(ctx, |ctx| {
        traffic_through(
            ctx,
            d,
            &steps,
            true,
            "hold-attack: traffic through other domain on cpu 0",
        )
    })
}

/// Over one window between `start` and `end` reads of events of one PMU:
/// whether more ran at once than it has `slots` (beyond the reads' skew).
fn over_slots(start: &[Vec<u64>], end: &[Vec<u64>], slots: usize) -> Option<String> {
    let n = start.len().min(end.len());
    let running: u64 = (0..n).map(|i| end[i][2].saturating_sub(start[i][2])).sum();
    let enabled = (0..n)
        .map(|i| end[i][1].saturating_sub(start[i][1]))
        .max()
        .unwrap_or(0);
    (running > slots as u64 * enabled + n as u64 * SKEW_NS).then(|| {
        format!("Δrunning adds up to {running} ns over {enabled} ns enabled: more than {slots} slots at once")
    })
}

/// H6. More slot events than slots, parked in place on CPU 0 and placed
///     back. CPU 0's domain on CPU 0, a cpu-clock on CPU 0, slots + 2
///     events (a long mux interval): 1 MiB, parked in place, 2 MiB, a
///     read while parked, 4 MiB, placed on CPU 0, 8 MiB, two closed, 16
///     MiB. The contract: contended windows obey the rules (never above
///     what landed, nothing if never running, all if running throughout,
///     running never above enabled, never more running at once than
///     slots, no clock or value back); once two are closed the rest fit
///     and count exactly at 100 %.
pub fn contended_on_holding_cpu(ctx: &mut Ctx) -> Result<Check> {
    let (d, _) = holding_domain(ctx)?;
    with_defaults_back(ctx, |ctx| {
        place(ctx, d, &[0], &[0])?;
        with_mux_interval(ctx, d, LONG_MUX_MS, |ctx| contended(ctx, d))
    })
}

fn contended(ctx: &mut Ctx, d: usize) -> Result<Check> {
    let slots = ctx.device.slots as usize;
    let n = slots + 2;
    let clock = cpu_clock(ctx, 0, None)?;
    let many = Many::open(ctx, d, n, TIMES)?;
    let (rmids, hs) = (many.rmids.clone(), many.handles.clone());
    let s = ctx.g.read_many(&hs)?;
    many.burst(ctx, MIB)?;
    place(ctx, d, &[], &[])?;
    many.burst(ctx, 2 * MIB)?;
    let p = ctx.g.read_many(&hs)?;
    many.burst(ctx, 4 * MIB)?;
    place(ctx, d, &[0], &[0])?;
    let u = ctx.g.read_many(&hs)?;
    many.burst(ctx, 8 * MIB)?;
    let u1 = ctx.g.read_many(&hs)?;
    for &h in &hs[..2] {
        ctx.g.close(h)?;
    }
    let rest = hs[2..].to_vec();
    let g0 = ctx.g.read_many(&rest)?;
    many.burst(ctx, 16 * MIB)?;
    let g1 = ctx.g.read_many(&rest)?;
    for h in rest {
        ctx.g.close(h)?;
    }
    ctx.g.close(clock)?;
    let mut problems = Vec::new();
    let mut counts = Vec::new();
    for (i, r) in rmids.iter().enumerate() {
        let name = format!("rmid {r}");
        let mut series: Vec<(&str, &[u64])> = vec![
            ("open", &s[i]),
            ("parked in place, 2 MiB", &p[i]),
            ("placed on CPU 0", &u[i]),
            ("8 MiB", &u1[i]),
        ];
        if i >= 2 {
            series.push(("two closed", &g0[i - 2]));
            series.push(("16 MiB", &g1[i - 2]));
        }
        clocks_never_back(&name, &series, &mut problems);
        for (a, b, what) in [
            (&s[i], &p[i], "open to the read while parked"),
            (&p[i], &u[i], "the read while parked to the placement"),
            (&u[i], &u1[i], "the placement to 8 MiB"),
        ] {
            if b[0] < a[0] {
                problems.push(format!(
                    "{name}: value went back from {a:?} to {b:?} ({what})"
                ));
            }
        }
        counts.push(bursts_in(u[i][0].wrapping_sub(s[i][0])));
        judge_window(
            &format!("{name}: {n} on {slots} slots, 1 MiB, parked on CPU 0 in place, 2 + 4 MiB, placed on CPU 0"),
            &s[i],
            &u[i],
            7 * MIB,
            &mut problems,
        );
        judge_window(
            &format!("{name}: placed on CPU 0, contended, 8 MiB"),
            &u[i],
            &u1[i],
            8 * MIB,
            &mut problems,
        );
        if i >= 2 {
            judge_exact(
                &format!("{name}: two closed, {} on {slots} slots, 16 MiB", n - 2),
                &g0[i - 2],
                &g1[i - 2],
                16 * MIB,
                &mut problems,
            );
        }
    }
    for (a, b, what) in [
        (&s, &u, "open to the placement"),
        (&u, &u1, "after the placement"),
    ] {
        if let Some(p) = over_slots(a, b, slots) {
            problems.push(format!("{what}: {p}"));
        }
    }
    Ok(Check::from_problems(
        "hold-attack: contended on holding cpu",
        problems,
        format!(
            "{}: {n} events on {slots} slots parked in place on CPU 0 and placed back: {} to the placement (7 MiB landed), within the rules; exact after two closes",
            pmu_name(d),
            counts.join(", ")
        ),
    ))
}

/// H9. CPU hotplug while parked by the set on CPU 0. CPU 0's domain, a
///     cpu-clock on CPU 0, A and B: 1 MiB, the set emptied (parked in
///     place), 2 MiB, B DISABLEd (frozen), 4 MiB, CPU 1 offline, 8 MiB,
///     the set {1} (still parked: its only CPU is offline), 16 MiB, CPU 1
///     online (placed there by hotplug: a real move off the holding CPU),
///     32 MiB, B ENABLEd, 64 MiB, the set {0} (moved back to CPU 0), 128
///     MiB. The contract: A all 255 MiB; B the 1 + 2 MiB frozen at its
///     DISABLE, read exactly on CPU 1, and 64 + 128 MiB after its ENABLE;
///     no clock back; running = enabled for A if its park was short.
pub fn hotplug_while_parked_by_set(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = holding_domain(ctx)?;
    let Some(&other) = allowed.iter().find(|&&c| c != 0) else {
        bail!("domain {d} ({allowed:?}) has no CPU besides CPU 0");
    };
    let out = with_defaults_back(ctx, |ctx| hotplug_parked(ctx, d, other));
    // Whatever happened, the CPU comes back.
    ctx.g.set_online(other, true)?;
    out
}

fn hotplug_parked(ctx: &mut Ctx, d: usize, other: u32) -> Result<Check> {
    place(ctx, d, &[0], &[0])?;
    let clock = cpu_clock(ctx, 0, None)?;
    let ([a, b], [ra, rb]) = open_two(ctx, d, 5, 6, false)?;
    let hs = [a, b];
    let every = [(ra, 1), (rb, 1)];
    let burst = |ctx: &mut Ctx, x: u64| burst_each(ctx, d, &every, x);
    let mut problems = Vec::new();
    let st = ctx.g.read_many(&hs)?;
    burst(ctx, MIB)?;
    let parked_at = Instant::now();
    place(ctx, d, &[], &[])?;
    burst(ctx, 2 * MIB)?;
    must(ctx, b, PerfIoctl::Disable { group: false })?;
    let off = ctx.g.read_many(&hs)?;
    burst(ctx, 4 * MIB)?;
    ctx.g.set_online(other, false)?;
    burst(ctx, 8 * MIB)?;
    set_allowed(ctx, d, &[other])?;
    // The change is seen (interrupt or poll) and leaves it parked.
    std::thread::sleep(Duration::from_millis(300));
    let mask = ctx.g.cpumask(&pmu_name(d))?;
    if !mask.is_empty() {
        problems.push(format!(
            "the set {{{other}}} with CPU {other} offline: cpumask {mask:?} (want parked)"
        ));
    }
    burst(ctx, 16 * MIB)?;
    ctx.g.set_online(other, true)?;
    let park = parked_at.elapsed();
    let (ok, mask) = wait_mask(ctx, d, |m| m == [other])?;
    if !ok {
        problems.push(format!(
            "CPU {other} online with the set {{{other}}}: cpumask {mask:?} after 30 s (want [{other}])"
        ));
    }
    let placed = ctx.g.read_many(&hs)?;
    burst(ctx, 32 * MIB)?;
    must(ctx, b, PerfIoctl::Enable { group: false })?;
    let on = ctx.g.read_many(&hs)?;
    burst(ctx, 64 * MIB)?;
    place(ctx, d, &[0], &[0])?;
    burst(ctx, 128 * MIB)?;
    let end = ctx.g.read_many(&hs)?;
    for h in hs {
        ctx.g.close(h)?;
    }
    ctx.g.close(clock)?;
    for (i, name) in ["A", "B"].iter().enumerate() {
        clocks_never_back(
            name,
            &[
                ("open", &st[i]),
                ("B DISABLEd while parked", &off[i]),
                ("placed on CPU 1 by hotplug", &placed[i]),
                ("B ENABLEd", &on[i]),
                ("moved to CPU 0, 128 MiB", &end[i]),
            ],
            &mut problems,
        );
    }
    let a_at = placed[0][0].wrapping_sub(st[0][0]);
    if a_at != 31 * MIB {
        problems.push(format!(
            "A: parked by the set on CPU 0 through CPU {other} offline, the set {{{other}}}, CPU {other} online: read {} at the placement (want exactly 1 + 2 + 4 + 8 + 16 MiB)",
            bursts_in(a_at)
        ));
    }
    let a_all = end[0][0].wrapping_sub(st[0][0]);
    let (en, run) = (
        end[0][1].wrapping_sub(st[0][1]),
        end[0][2].wrapping_sub(st[0][2]),
    );
    if a_all != 255 * MIB || run > en || (park < SHORT_PARK && run != en) {
        problems.push(format!(
            "A, enabled throughout: counted {}, Δenabled {en} Δrunning {run}, park {park:?} (want all 255 MiB; running = enabled for a park under {SHORT_PARK:?})",
            bursts_in(a_all)
        ));
    }
    clocks_still(
        "B: DISABLEd while parked to the placement on CPU 1",
        &off[1],
        &placed[1],
        &mut problems,
    );
    let b_at = placed[1][0].wrapping_sub(st[1][0]);
    if b_at != 3 * MIB {
        problems.push(format!(
            "B: DISABLEd while parked on CPU 0, placed on CPU {other} by hotplug: read {:?}: counted {} (want exactly the 1 + 2 MiB frozen at its DISABLE)",
            placed[1],
            bursts_in(b_at)
        ));
    }
    judge_exact(
        "B: ENABLEd on CPU 1, 64 MiB, moved to CPU 0, 128 MiB",
        &on[1],
        &end[1],
        192 * MIB,
        &mut problems,
    );
    Ok(Check::from_problems(
        "hold-attack: hotplug while parked by set",
        problems,
        format!(
            "{}: parked by the set on CPU 0, CPU {other} offline and the set {{{other}}} (still parked), CPU {other} online (placed there), then moved back to CPU 0: A {}, B {} frozen then {} (park {park:?})",
            pmu_name(d),
            bursts_in(a_all),
            bursts_in(b_at),
            bursts_in(end[1][0].wrapping_sub(on[1][0]))
        ),
    ))
}

/// H10. A park in place on CPU 0 longer than two wraps at the device's
///      maximum rate, read while parked, placed on CPU 0. CPU 0's domain
///      on CPU 0, a cpu-clock on CPU 0, A: the set emptied, the maximum
///      rate for 1.2 s, a read while parked, the set {0}, a read, 1 MiB.
///      The contract ("Parks and wraps"): either the count is exact at
///      100 % running, or the lost interval is left out of time_running
///      (and `lost_wraps` counts it); time_running never goes down (left
///      out, not taken back), so no read after the placement shows less
///      running than the read while parked; never more counted than
///      landed; exact at 100 % after the placement.
pub fn wrap_lost_parked_on_holding_cpu(ctx: &mut Ctx) -> Result<Check> {
    let (d, _) = holding_domain(ctx)?;
    with_defaults_back(ctx, |ctx| {
        place(ctx, d, &[0], &[0])?;
        wrap_lost(
            ctx,
            d,
            &[0],
            "hold-attack: wrap lost while parked on holding cpu",
        )
    })
}

/// H11. H10 on the other domain: parked by its emptied set (its events
///      held on CPU 0), past two wraps, read while parked, placed back on
///      its own CPUs by its set. The same rules.
pub fn wrap_lost_held_on_cpu0(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    with_defaults_back(ctx, |ctx| {
        wrap_lost(
            ctx,
            d,
            &allowed,
            "hold-attack: wrap lost while held on cpu 0",
        )
    })
}

/// H10 and H11: domain `d` parked by an empty set, traffic at the maximum
/// rate past two wraps, a read while parked, placed by the set `home`.
fn wrap_lost(ctx: &mut Ctx, d: usize, home: &[u32], name: &'static str) -> Result<Check> {
    let (park, rate, wrap) = two_wrap_park(ctx)?;
    let lost_file = lost_wraps_file(d);
    let lost_before: u64 = ctx.g.read_file(&lost_file)?.trim().parse()?;
    let clock = cpu_clock(ctx, 0, None)?;
    let r = rmid(ctx, 7);
    let a = open_with(ctx, d, r, TIMES, 0, None)?;
    let t0 = truth(ctx, d, r)?;
    let s = ctx.g.read(a)?;
    place(ctx, d, &[], &[])?;
    ctx.control
        .set_rate(d as u32, r, Event::MbmTotalBytes, rate)?;
    std::thread::sleep(park);
    ctx.control.set_rate(d as u32, r, Event::MbmTotalBytes, 0)?;
    ctx.inject_and_land(&[])?;
    let p = ctx.g.read(a)?;
    let t1 = truth(ctx, d, r)?;
    place(ctx, d, home, home)?;
    let u = ctx.g.read(a)?;
    let mask = ctx.g.cpumask(&pmu_name(d))?;
    burst_each(ctx, d, &[(r, 1)], MIB)?;
    let e = ctx.g.read(a)?;
    ctx.g.close(a)?;
    ctx.g.close(clock)?;
    let lost_after: u64 = ctx.g.read_file(&lost_file)?.trim().parse()?;
    let landed = whole_units(t1.wrapping_sub(t0), ctx.device.unit_bytes);
    let mut problems = Vec::new();
    clocks_never_back(
        "A",
        &[
            ("open", &s),
            ("parked by the empty set past two wraps", &p),
            ("placed again", &u),
            ("1 MiB", &e),
        ],
        &mut problems,
    );
    let got = u[0].wrapping_sub(s[0]);
    let (en, run) = (u[1].wrapping_sub(s[1]), u[2].wrapping_sub(s[2]));
    if got > landed || (run == en && got != landed) {
        problems.push(format!(
            "A: counted {got}, Δenabled {en} Δrunning {run} (want exact at 100 %, or less than 100 % running; never above what landed)"
        ));
    }
    if got != landed && lost_after <= lost_before {
        problems.push(format!("{lost_file} stayed {lost_before} through the loss"));
    }
    judge_exact("A: placed again, 1 MiB", &u, &e, MIB, &mut problems);
    let summary = format!(
        "{}: parked by the empty set (events on CPU 0) for {park:?} at {} MiB/s ({:.1} wraps), placed on {mask:?}: counted {got} of {landed} bytes, running {:.1} % (read while parked {p:?}, after the placement {u:?}); lost_wraps {lost_before} → {lost_after}",
        pmu_name(d),
        rate / MIB,
        landed as f64 / wrap as f64,
        100.0 * run as f64 / en.max(1) as f64,
    );
    if !problems.is_empty() {
        problems.push(summary.clone());
    }
    Ok(Check::from_problems(name, problems, summary))
}

/// Every attack, in order, each by the name its `Check` carries; each
/// leaves every CPU online, nothing open, the mux interval as it found it
/// and both domains on their default sets.
pub(super) const CHECKS: &[Named] = &[
    (
        "hold-attack: traffic through placements on cpu 0",
        traffic_through_placements_on_cpu0,
    ),
    (
        "hold-attack: traffic through placements on idle cpu 0",
        traffic_through_placements_on_idle_cpu0,
    ),
    (
        "hold-attack: traffic through other domain on cpu 0",
        traffic_through_other_domain_on_cpu0,
    ),
    (
        "hold-attack: contended on holding cpu",
        contended_on_holding_cpu,
    ),
    (
        "hold-attack: hotplug while parked by set",
        hotplug_while_parked_by_set,
    ),
];

/// Checks of a known, open bug, run with `cargo xtask run --known-bugs`
/// (and by name): a park longer than a wrap that a read saw while parked
/// has its unread interval taken back from `time_running` at the placement,
/// so `time_running` goes down, which the contract forbids
/// (docs/counting-semantics.md, "Known violations"). They fail until it is
/// fixed; then they move to [`CHECKS`].
pub(super) const KNOWN_BUGS: &[Named] = &[
    (
        "hold-attack: wrap lost while parked on holding cpu",
        wrap_lost_parked_on_holding_cpu,
    ),
    (
        "hold-attack: wrap lost while held on cpu 0",
        wrap_lost_held_on_cpu0,
    ),
];
