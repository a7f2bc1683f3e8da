//! The one move attack that stays in Rust, and the window rules the
//! hand-judged attacks share. S14 (`rotating during moves`) stays because
//! its moves come from a guest thread racing the reads (a background job):
//! a journal cannot say which reads a move fell between, so the model
//! cannot judge it. The other move attacks are scenarios
//! (`scenarios/moves`), judged by the counting model.
//!
//! [`judge_window`] and [`judge_exact`] are docs/counting-semantics.md's
//! rules for one window of an event, by hand, for the attacks the model
//! cannot judge yet (rate traffic, background jobs, the holding CPU's
//! walks); [`clocks_never_back`] the same for clocks.

use std::time::Instant;

use anyhow::Result;
use perfbed_device::regs::Event;

use super::attacks::{finish_mover, start_mover};
use super::context::{Ctx, MIB, TIMES};
use super::moves::movable_domain;
use super::multiplexing::Window;
use super::redteam::{Many, Named};
use crate::checks::Check;
use crate::guest::pmu_name;

/// Two reads a few microseconds apart (one `read_many`) may differ by this
/// much in `time_enabled` between events enabled the same time.
pub(super) const SKEW_NS: u64 = crate::checks::counting::READ_SKEW_NS;

/// Over one window between the reads `start` and `end` of several events on
/// one PMU: their running time added up, the longest enabled time, and
/// whether more ran at once than the PMU has `slots`. The events' windows
/// do not start at one moment: their first reads were spread over at most
/// `start_spread_ns` (the host's measure of the `read_many` that took
/// them), so all the windows lie within the longest one and that spread,
/// and no more than `slots` events running at once can run more than
/// `slots` times that (the reads' skew, at the least).
fn running_at_once(
    start: &[Vec<u64>],
    end: &[Vec<u64>],
    slots: usize,
    start_spread_ns: u64,
) -> (u64, u64, bool) {
    let n = start.len().min(end.len());
    let running: u64 = (0..n).map(|i| end[i][2].saturating_sub(start[i][2])).sum();
    let enabled = (0..n)
        .map(|i| end[i][1].saturating_sub(start[i][1]))
        .max()
        .unwrap_or(0);
    let slack = (n as u64 * SKEW_NS).max(slots as u64 * start_spread_ns);
    let over = running > slots as u64 * enabled + slack;
    (running, enabled, over)
}

/// The contract's rules for one window (reads `start`, `end` with
/// [`TIMES`]) of an event that may be counting, in which `landed` bytes
/// landed for it: clocks never go back, running never leads enabled, the
/// value never exceeds what landed, `Δrunning == 0` ⇒ nothing counted,
/// running throughout ⇒ everything counted.
pub(super) fn judge_window(
    what: &str,
    start: &[u64],
    end: &[u64],
    landed: u64,
    problems: &mut Vec<String>,
) {
    let w = Window::between(start, end);
    let back = end[1] < start[1] || end[2] < start[2] || end[0] < start[0];
    let bad = back
        || end[2] > end[1]
        || w.value > landed
        || (w.running == 0 && w.value != 0)
        || (w.running == w.enabled && w.enabled > 0 && w.value != landed);
    if bad {
        problems.push(format!(
            "{what}: {landed} landed; read {start:?} → {end:?}: Δvalue {} Δenabled {} Δrunning {} (want Δvalue <= landed, 0 if Δrunning = 0, = landed if Δrunning = Δenabled; nothing going back)",
            w.value as i64, w.enabled, w.running
        ));
    }
}

/// An event counting for sure through a window: exactly `landed`, and
/// `Δrunning == Δenabled > 0`.
pub(super) fn judge_exact(
    what: &str,
    start: &[u64],
    end: &[u64],
    landed: u64,
    problems: &mut Vec<String>,
) {
    let w = Window::between(start, end);
    if end[0] < start[0] || w.value != landed || w.running != w.enabled || w.enabled == 0 {
        problems.push(format!(
            "{what}: {landed} landed; read {start:?} → {end:?}: Δvalue {} Δenabled {} Δrunning {} (want Δvalue = landed, Δrunning = Δenabled > 0: it counts for sure)",
            w.value as i64, w.enabled, w.running
        ));
    }
}

/// Closes the first two of `many`'s events, lets 3 MiB land, and judges
/// each of the others (now as many as the slots) exact at 100 %; returns
/// their handles.
fn close_two_rest_exact(
    ctx: &mut Ctx,
    many: &Many,
    when: &str,
    problems: &mut Vec<String>,
) -> Result<Vec<u32>> {
    for &h in &many.handles[..2] {
        ctx.g.close(h)?;
    }
    let (rest, rmids) = (many.handles[2..].to_vec(), many.rmids[2..].to_vec());
    let s0 = ctx.g.read_many(&rest)?;
    many.burst(ctx, 3 * MIB)?;
    let s1 = ctx.g.read_many(&rest)?;
    for (i, r) in rmids.iter().enumerate() {
        judge_exact(
            &format!("rmid {r}, two events {when}, {} left", rest.len()),
            &s0[i],
            &s1[i],
            3 * MIB,
            problems,
        );
    }
    Ok(rest)
}

/// S14. Two more events than slots rotating at the default mux interval
///     while a guest thread moves the PMU back and forth: ten windows, each
///     with a burst landed in it, each event's window within the rules,
///     and never more than `slots` of them running (`Σ Δrunning <= slots ×
///     Δenabled`: a move credits a wait as running only to an event it
///     found scheduled). Then two closed: the rest exact at 100 %.
pub fn rotating_during_moves(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let slots = ctx.device.slots as usize;
    let n = slots + 2;
    let many = Many::open(ctx, d, n, TIMES)?;
    let (rmids, handles) = (many.rmids.clone(), many.handles.clone());
    let mut problems = Vec::new();
    let mover = start_mover(ctx, &allowed, 6)?;
    let read_at = Instant::now();
    let mut prev = ctx.g.read_many(&handles)?;
    let mut prev_spread = read_at.elapsed();
    let mut shares = Vec::new();
    for w in 1..=10u64 {
        many.burst(ctx, MIB)?;
        let read_at = Instant::now();
        let cur = ctx.g.read_many(&handles)?;
        let cur_spread = read_at.elapsed();
        for (i, r) in rmids.iter().enumerate() {
            judge_window(
                &format!("window {w}, rmid {r}"),
                &prev[i],
                &cur[i],
                MIB,
                &mut problems,
            );
        }
        let spread_ns = u64::try_from(prev_spread.as_nanos()).unwrap_or(u64::MAX);
        let (running, enabled, over) = running_at_once(&prev, &cur, slots, spread_ns);
        if over {
            problems.push(format!(
                "window {w}: {n} events on {slots} slots ran {running} ns in all while moving, more than {slots} × the window's {enabled} ns"
            ));
        }
        shares.push(format!("{:.1}", running as f64 / enabled.max(1) as f64));
        (prev, prev_spread) = (cur, cur_spread);
        if problems.len() > 6 {
            break;
        }
    }
    finish_mover(ctx, mover)?;
    let rest = close_two_rest_exact(ctx, &many, "closed after the moves", &mut problems)?;
    for h in rest {
        ctx.g.close(h)?;
    }
    Ok(Check::from_problems(
        "move-attack: rotating during moves",
        problems,
        format!(
            "{}: {n} events on {slots} slots rotating while CPUs {allowed:?} toggled: every window within the rules, events running per window {}; two closed: the rest exact at 100 %",
            pmu_name(d),
            shares.join(", ")
        ),
    ))
}

/// Its checks, in order.
pub(super) const CHECKS: &[Named] =
    &[("move-attack: rotating during moves", rotating_during_moves)];

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

/// Lets `x` bytes land into each RMID of `rs` (times its scale) in domain
/// `d`, in one burst.
pub(super) fn burst_each(ctx: &mut Ctx, d: usize, rs: &[(u32, u64)], x: u64) -> Result<()> {
    let inj: Vec<_> = rs
        .iter()
        .map(|&(r, k)| (d, r, Event::MbmTotalBytes, k * x))
        .collect();
    ctx.inject_and_land(&inj)
}
