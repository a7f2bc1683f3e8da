//! Red-team attacks on the holding CPU (docs/counting-semantics.md, "Parks
//! and wraps", and kernel patch 0007) that a known, open bug fails: a PMU
//! parked past two wraps, read while parked, placed again, with its events
//! held on CPU 0. A parked PMU's events wait on the first online CPU, CPU
//! 0, and the contract says a park and a placement are the same whichever
//! CPU keeps them. Every attack gives both domains their default sets back
//! at its end, also when it fails.
//!
//! They stay in Rust because they judge the PMU's `lost_wraps` beside the
//! counts, which no scenario line reads, and because `cargo xtask run`
//! runs them only with `--known-bugs`; the attacks on the holding CPU that
//! pass are scenarios (`scenarios/holding-cpu`).

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

/// Checks of a known, open bug, run with `cargo xtask run --known-bugs`
/// (and by name): a park longer than a wrap that a read saw while parked
/// has its unread interval taken back from `time_running` at the placement,
/// so `time_running` goes down, which the contract forbids
/// (docs/counting-semantics.md, "Known violations"). They fail until it is
/// fixed; then they run by default.
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
