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
//!
//! These stay in Rust because they count a steady rate against the
//! device's truth across placements, or a park long enough to lose wraps
//! (`lost_wraps`), which the model does not judge; the attacks on the
//! holding CPU it can judge are scenarios (`scenarios/holding-cpu`).

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use perfbed_device::regs::{whole_units, Event};

use super::allowed_sets::{set_allowed, wait_mask};
use super::attacks::cpu_clock;
use super::context::{Ctx, MIB, TIMES};
use super::moves::movable_domain;
use super::multiplexing::Window;
use super::redteam::{open_with, rmid, truth, Named};
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

/// H10. A park in place on CPU 0 longer than two wraps ([`two_wrap_park`]),
///      read while parked, placed on CPU 0. CPU 0's domain on CPU 0, a
///      cpu-clock on CPU 0, A: the set emptied, 2.4 wraps' worth of
///      traffic, a read while parked, the set {0}, a read, 1 MiB.
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

/// An event counting for sure through a window: exactly `landed`, and
/// `Δrunning == Δenabled > 0`.
fn judge_exact(what: &str, start: &[u64], end: &[u64], landed: u64, problems: &mut Vec<String>) {
    let w = Window::between(start, end);
    if end[0] < start[0] || w.value != landed || w.running != w.enabled || w.enabled == 0 {
        problems.push(format!(
            "{what}: {landed} landed; read {start:?} → {end:?}: Δvalue {} Δenabled {} Δrunning {} (want Δvalue = landed, Δrunning = Δenabled > 0: it counts for sure)",
            w.value as i64, w.enabled, w.running
        ));
    }
}

/// Over a series of reads of one event (name, read): neither clock ever
/// goes back, and running never leads enabled.
fn clocks_never_back(what: &str, reads: &[(&str, &[u64])], problems: &mut Vec<String>) {
    for pair in reads.windows(2) {
        let ((w0, r0), (w1, r1)) = (pair[0], pair[1]);
        if r1[1] < r0[1] || r1[2] < r0[2] || r1[2] > r1[1] {
            problems.push(format!(
                "{what}: read after \"{w1}\" {r1:?} follows {r0:?} after \"{w0}\" (clocks never go back, running <= enabled)"
            ));
        }
    }
}

/// Lets `x` bytes land into each RMID of `rs` (times its scale) in domain
/// `d`, in one burst.
fn burst_each(ctx: &mut Ctx, d: usize, rs: &[(u32, u64)], x: u64) -> Result<()> {
    let inj: Vec<_> = rs
        .iter()
        .map(|&(r, k)| (d, r, Event::MbmTotalBytes, k * x))
        .collect();
    ctx.inject_and_land(&inj)
}
