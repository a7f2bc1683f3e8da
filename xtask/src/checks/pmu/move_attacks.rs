//! Red-team attacks on what a move does to events, counting or not when it
//! happens (docs/counting-semantics.md, "Where this differs from upstream
//! scoped PMUs": a move is seamless, an event the move leaves unscheduled
//! stops counting at the move's end), written from the contract alone: a
//! group sibling whose leader is off (a device or a cpu-clock leader)
//! across moves; more events than slots, a waiting group and an exclusive
//! event crossing moves under a long mux interval (so a window is all or
//! nothing and the contract's rules bite), each then closed, DISABLEd,
//! ENABLEd or RESET right after a move; a pinned event among multiplexed
//! ones; groups with gauge and cpu-clock leaders read right after moves.
//! The attacks on parks are `park_attacks.rs`, with these helpers.
//!
//! Every burst lands between two operations; each window is judged by the
//! contract's rules ([`judge_window`]), and exactly where the contract says
//! the event counts for sure. Moves are made by taking the owner offline
//! (the PMU moves to the domain's other CPU) and bringing it back (nothing
//! moves then).

use anyhow::{bail, Result};
use perfbed_agent::PerfIoctl;
use perfbed_device::regs::Event;

use super::attacks::{cpu_clock, finish_mover, start_mover};
use super::context::{Ctx, MIB, TIMES};
use super::moves::movable_domain;
use super::multiplexing::{set_sysfs, Window};
use super::redteam::{must, open_with, owner, park, rmid, Many, Named};
use crate::checks::Check;
use crate::guest::perf_abi::{FLAG_DISABLED, FLAG_EXCLUSIVE};
use crate::guest::pmu_name;

/// A mux interval longer than a check's windows: a multiplexed event is
/// rotated in or out by a move or an ioctl, seldom by the timer, within a
/// check (a rotation only makes the rules bite less). Not longer: perf
/// core arms each CPU's mux timer of the PMU when the interval is written
/// and does not cancel it when the PMU is unregistered, so a timer still
/// pending when perfbed.ko is unloaded (the `module unload` check) is
/// freed armed, and the guest hangs or oopses once the module is loaded
/// again (seen with 60 s); [`with_mux_interval`] waits it out.
pub(super) const LONG_MUX_MS: u32 = 2_000;

/// Two reads a few microseconds apart (one `read_many`) may differ by this
/// much in `time_enabled` between events enabled the same time.
pub(super) const SKEW_NS: u64 = crate::checks::counting::READ_SKEW_NS;

/// Moves domain `d`'s PMU once: its owner goes offline. Returns that CPU,
/// to bring back online (which moves nothing).
pub(super) fn move_away(ctx: &mut Ctx, d: usize) -> Result<u32> {
    let o = owner(ctx, d)?;
    ctx.g.set_online(o, false)?;
    Ok(o)
}

/// Runs `f` with domain `d`'s mux interval set to `ms`, restores it, and
/// waits until no mux timer armed with `ms` is left.
pub(super) fn with_mux_interval<T>(
    ctx: &mut Ctx,
    d: usize,
    ms: u32,
    f: impl FnOnce(&mut Ctx) -> Result<T>,
) -> Result<T> {
    let file = format!(
        "/sys/bus/event_source/devices/{}/perf_event_mux_interval_ms",
        pmu_name(d)
    );
    let default = ctx.g.read_file(&file)?;
    set_sysfs(ctx.g, &file, &ms.to_string())?;
    let out = f(ctx);
    set_sysfs(ctx.g, &file, default.trim())?;
    // A timer armed with `ms` (at the write, or re-armed by a rotation
    // until the restore) fires within `ms` and, nothing left to rotate,
    // stops: none stays armed with the long interval (see [`LONG_MUX_MS`]).
    std::thread::sleep(std::time::Duration::from_millis(u64::from(ms) + 500));
    out
}

/// Runs `check` on the movable domain with its mux interval set to
/// [`LONG_MUX_MS`], and restores it.
pub(super) fn under_long_mux(
    ctx: &mut Ctx,
    check: fn(&mut Ctx, usize) -> Result<Check>,
) -> Result<Check> {
    let (d, _) = movable_domain(ctx)?;
    with_mux_interval(ctx, d, LONG_MUX_MS, |ctx| check(ctx, d))
}

/// Over one window between the reads `start` and `end` of several events on
/// one PMU: their running time added up, the longest enabled time, and
/// whether more ran at once than the PMU has `slots` (beyond the reads' skew).
fn running_at_once(start: &[Vec<u64>], end: &[Vec<u64>], slots: usize) -> (u64, u64, bool) {
    let n = start.len().min(end.len());
    let running: u64 = (0..n).map(|i| end[i][2].saturating_sub(start[i][2])).sum();
    let enabled = (0..n)
        .map(|i| end[i][1].saturating_sub(start[i][1]))
        .max()
        .unwrap_or(0);
    let over = running > slots as u64 * enabled + n as u64 * SKEW_NS;
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

/// The reads of a `read_many`, one per event.
type Reads = Vec<Vec<u64>>;

/// One round of read, a burst of `round` MiB, read, a move, a read right
/// after it, a burst of `2 × round` MiB, read, over `hs` (`names[i]` for
/// `hs[i]`, which gets `scale[i]` bytes for each byte of a burst), each of
/// the three windows judged by the rules ([`judge_window`]; the move's own
/// lands nothing). Returns the first and the last read.
#[allow(clippy::too_many_arguments)]
fn round_across_move(
    ctx: &mut Ctx,
    d: usize,
    hs: &[u32],
    names: &[String],
    scale: &[u64],
    round: u64,
    burst: &dyn Fn(&mut Ctx, u64) -> Result<()>,
    problems: &mut Vec<String>,
) -> Result<(Reads, Reads)> {
    let a = ctx.g.read_many(hs)?;
    burst(ctx, round * MIB)?;
    let b = ctx.g.read_many(hs)?;
    let o = move_away(ctx, d)?;
    let c = ctx.g.read_many(hs)?;
    burst(ctx, 2 * round * MIB)?;
    let e = ctx.g.read_many(hs)?;
    ctx.g.set_online(o, true)?;
    for (i, name) in names.iter().enumerate() {
        let what = |w: &str| format!("round {round}, {name}: {w}");
        let k = scale[i];
        judge_window(
            &what("before the move"),
            &a[i],
            &b[i],
            k * round * MIB,
            problems,
        );
        judge_window(
            &what("the move (nothing landed)"),
            &b[i],
            &c[i],
            0,
            problems,
        );
        judge_window(
            &what("after the move"),
            &c[i],
            &e[i],
            2 * k * round * MIB,
            problems,
        );
    }
    Ok((a, e))
}

/// Which kind of leader a group of device siblings has.
#[derive(Clone, Copy)]
enum Leader {
    /// An `mbm_total_bytes` event of the same PMU.
    Device,
    /// A cpu-clock event on the owner CPU (a software leader).
    CpuClock,
}

/// S1. `{leader, mbm sibling}` plus a lone reference event: the leader is
///     DISABLEd alone (the sibling stays enabled, its leader off), the PMU
///     moves twice with bursts between, then the leader is ENABLEd. While
///     the leader is off the sibling is enabled but never counting: its
///     value stays, `Δrunning == 0` (a move must not credit it as waiting
///     for a reschedule), its `time_enabled` grows as the reference's; the
///     leader's clocks stand still. After the ENABLE both count exactly at
///     100 %; the reference counts everything at 100 % throughout.
pub fn sibling_of_disabled_leader_across_moves(ctx: &mut Ctx) -> Result<Check> {
    sibling_of_disabled_leader(
        ctx,
        Leader::Device,
        EnabledRule::AsWithoutMove,
        Hop::TwoMoves,
    )
}

/// S2. As S1 with a cpu-clock leader on the owner CPU.
pub fn sibling_of_disabled_cpu_clock_leader_across_moves(ctx: &mut Ctx) -> Result<Check> {
    sibling_of_disabled_leader(
        ctx,
        Leader::CpuClock,
        EnabledRule::AsWithoutMove,
        Hop::TwoMoves,
    )
}

/// S1b. As S1, judged by the contract's word on `time_enabled` itself:
///     perf's effective state, so the sibling of an off leader counts as
///     disabled and its `time_enabled` stands still all along, in the
///     window without a move too.
pub fn sibling_of_disabled_leader_enabled_time(ctx: &mut Ctx) -> Result<Check> {
    sibling_of_disabled_leader(ctx, Leader::Device, EnabledRule::LeaderState, Hop::TwoMoves)
}

/// S2b. As S1 with a park for the two moves: the park installs the sibling
///     of an off leader elsewhere and the return installs it again; its
///     clocks run as without a park. (The lone reference event is judged
///     by its count only: a park may be left out of its time_running.)
pub fn sibling_of_disabled_leader_across_park(ctx: &mut Ctx) -> Result<Check> {
    sibling_of_disabled_leader(ctx, Leader::Device, EnabledRule::AsWithoutMove, Hop::Park)
}

/// How the PMU of a check goes away and comes back.
#[derive(Clone, Copy)]
enum Hop {
    /// Its owner goes offline, back online, and the new owner too.
    TwoMoves,
    /// Every allowed CPU offline (a park), then back online.
    Park,
}

/// How a check judges the `time_enabled` of a sibling whose leader is off.
#[derive(Clone, Copy)]
enum EnabledRule {
    /// The contract's text: `time_enabled` follows perf's effective state,
    /// so a sibling whose leader is off gains none.
    LeaderState,
    /// Whatever perf's clocks do for it without a move (the first window),
    /// a move does too: 0 stays 0, the lone event's stays the lone event's.
    AsWithoutMove,
}

fn sibling_of_disabled_leader(
    ctx: &mut Ctx,
    kind: Leader,
    rule: EnabledRule,
    hop: Hop,
) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let (r1, r2, r3) = (rmid(ctx, 1), rmid(ctx, 2), rmid(ctx, 3));
    let leader = match kind {
        Leader::Device => open_with(ctx, d, r1, TIMES, 0, None)?,
        Leader::CpuClock => {
            let cpu = owner(ctx, d)? as i32;
            cpu_clock(ctx, cpu, None)?
        }
    };
    let sibling = open_with(ctx, d, r2, TIMES, 0, Some(leader))?;
    let reference = open_with(ctx, d, r3, TIMES, 0, None)?;
    let hs = [leader, sibling, reference];
    let all = |ctx: &mut Ctx, b: u64| -> Result<()> {
        ctx.inject_and_land(&[
            (d, r1, Event::MbmTotalBytes, b),
            (d, r2, Event::MbmTotalBytes, b),
            (d, r3, Event::MbmTotalBytes, b),
        ])
    };
    let first = ctx.g.read_many(&hs)?;
    all(ctx, MIB)?;
    must(ctx, leader, PerfIoctl::Disable { group: false })?;
    let a0 = ctx.g.read_many(&hs)?;
    // A window without a move first, as long as a move's: what perf's own
    // clocks do for a sibling of an off leader, to tell a move's part.
    all(ctx, 2 * MIB)?;
    std::thread::sleep(std::time::Duration::from_millis(100));
    let a = ctx.g.read_many(&hs)?;
    let b = match hop {
        Hop::TwoMoves => {
            let o1 = move_away(ctx, d)?;
            let b = ctx.g.read_many(&hs)?;
            all(ctx, 4 * MIB)?;
            ctx.g.set_online(o1, true)?;
            let o2 = move_away(ctx, d)?;
            all(ctx, 8 * MIB)?;
            ctx.g.set_online(o2, true)?;
            b
        }
        Hop::Park => {
            park(ctx, &allowed, false)?;
            let b = ctx.g.read_many(&hs)?;
            all(ctx, 4 * MIB)?;
            all(ctx, 8 * MIB)?;
            park(ctx, &allowed, true)?;
            b
        }
    };
    let c = ctx.g.read_many(&hs)?;
    must(ctx, leader, PerfIoctl::Enable { group: false })?;
    let e = ctx.g.read_many(&hs)?;
    all(ctx, 16 * MIB)?;
    let f = ctx.g.read_many(&hs)?;
    ctx.g.close(sibling)?;
    ctx.g.close(leader)?;
    ctx.g.close(reference)?;
    let mut problems = Vec::new();
    let mut enabled = Vec::new();
    let (off, first_hop, both_hops) = match hop {
        Hop::TwoMoves => (
            "leader off, 2 MiB, move, 4 MiB, move, 8 MiB",
            "right after the first move",
            "after both moves",
        ),
        Hop::Park => (
            "leader off, 2 MiB, park, 4 + 8 MiB, the return",
            "right after the park began",
            "after the return",
        ),
    };
    for (when, r, a) in [
        ("100 ms later, no move yet", &a, &a0),
        (first_hop, &b, &a),
        (both_hops, &c, &a),
    ] {
        if r[1][0] != a[1][0] || r[1][2] != a[1][2] {
            problems.push(format!(
                "sibling, {off}: read {when} {:?} after {:?} (want value and time_running unchanged: it is not counting)",
                r[1], a[1]
            ));
        }
        if matches!(kind, Leader::Device) && r[0] != a[0] {
            problems.push(format!(
                "disabled leader, read {when} {:?} after {:?} (want all three unchanged)",
                r[0], a[0]
            ));
        }
        let (sib, refd) = (
            r[1][1].saturating_sub(a[1][1]),
            r[2][1].saturating_sub(a[2][1]),
        );
        enabled.push(format!("{when}: {sib} of {refd} ns"));
        let (sib0, ref0) = (
            a[1][1].saturating_sub(a0[1][1]),
            a[2][1].saturating_sub(a0[2][1]),
        );
        let without_move = if sib0 == 0 {
            Some(0)
        } else if sib0.abs_diff(ref0) <= SKEW_NS {
            Some(refd)
        } else {
            None
        };
        let want = match rule {
            EnabledRule::LeaderState => Some(0),
            EnabledRule::AsWithoutMove => without_move,
        };
        let ok = match (rule, want) {
            (_, None) => false,
            (_, Some(0)) => sib == 0,
            (_, Some(w)) => sib.abs_diff(w) <= SKEW_NS,
        };
        if !ok {
            problems.push(match rule {
                EnabledRule::LeaderState => format!(
                    "sibling of an off leader, read {when}: Δtime_enabled {sib} while a lone event's grew {refd} (the contract: its leader is off, so perf counts it as disabled and its time_enabled stands still)"
                ),
                EnabledRule::AsWithoutMove => format!(
                    "sibling of an off leader, read {when}: Δtime_enabled {sib} while a lone event's grew {refd}; in a window without a move it grew {sib0} of {ref0} ns (a move must not change how its clocks run: want {})",
                    match without_move {
                        Some(0) => "0".to_string(),
                        Some(_) => "the lone event's".to_string(),
                        None => "0 or the lone event's, not a part of it".to_string(),
                    }
                ),
            });
        }
    }
    if matches!(kind, Leader::Device) {
        judge_exact(
            "leader before its DISABLE, 1 MiB",
            &first[0],
            &a[0],
            MIB,
            &mut problems,
        );
        judge_exact(
            "leader after its ENABLE, 16 MiB",
            &e[0],
            &f[0],
            16 * MIB,
            &mut problems,
        );
    }
    judge_exact(
        "sibling before the leader's DISABLE, 1 MiB",
        &first[1],
        &a[1],
        MIB,
        &mut problems,
    );
    judge_exact(
        "sibling after the leader's ENABLE, 16 MiB",
        &e[1],
        &f[1],
        16 * MIB,
        &mut problems,
    );
    match hop {
        Hop::TwoMoves => judge_exact(
            "lone reference event across both moves",
            &first[2],
            &f[2],
            31 * MIB,
            &mut problems,
        ),
        Hop::Park if f[2][0] - first[2][0] != 31 * MIB || f[2][2] > f[2][1] => {
            problems.push(format!(
                "lone reference event across the park: read {:?} → {:?} (want 31 MiB counted, running <= enabled)",
                first[2], f[2]
            ))
        }
        Hop::Park => {}
    }
    let (name, what) = match (kind, rule, hop) {
        (Leader::Device, EnabledRule::LeaderState, _) => (
            "move-attack: sibling of disabled leader enabled time",
            "mbm",
        ),
        (Leader::Device, EnabledRule::AsWithoutMove, Hop::TwoMoves) => (
            "move-attack: sibling of disabled leader across moves",
            "mbm",
        ),
        (Leader::Device, EnabledRule::AsWithoutMove, Hop::Park) => (
            "move-attack: sibling of disabled leader across a park",
            "mbm",
        ),
        (Leader::CpuClock, _, _) => (
            "move-attack: sibling of disabled cpu-clock leader across moves",
            "cpu-clock",
        ),
    };
    Ok(Check::from_problems(
        name,
        problems,
        format!(
            "{}: {{{what} leader, mbm sibling}}: the sibling counted {} = 1 + 16 MiB, time_running still through 2 moves with its leader off (Δrunning {}), time_enabled {}; the lone event {} at 100 %",
            pmu_name(d),
            f[1][0],
            c[1][2].saturating_sub(a[1][2]),
            enabled.join(", "),
            f[2][0]
        ),
    ))
}

/// Closes the first two of `many`'s events, lets 3 MiB land, and judges
/// each of the others (now as many as the slots) exact at 100 %; returns
/// their handles, their RMIDs and that last read.
fn close_two_rest_exact(
    ctx: &mut Ctx,
    many: &Many,
    when: &str,
    problems: &mut Vec<String>,
) -> Result<(Vec<u32>, Vec<u32>, Reads)> {
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
    Ok((rest, rmids, s1))
}

/// S3. Two more events than slots under a long mux interval, four rounds
///     of: read, a burst, read, a move, a read right after it, a burst,
///     read. Each window obeys the rules ([`judge_window`]): the move's own
///     window, where nothing landed, never gains a byte; no more than
///     `slots` events are running in any window (`Σ Δrunning <= slots ×
///     Δenabled`: a move credits as running only the events it found
///     scheduled). Then a move, two closed right after it: the rest counts
///     for sure, exactly, at 100 %; then another move and a RESET of each
///     right after it: each counts only what lands after the RESET.
pub fn multiplexed_across_moves(ctx: &mut Ctx) -> Result<Check> {
    under_long_mux(ctx, multiplexed_moves)
}

fn multiplexed_moves(ctx: &mut Ctx, d: usize) -> Result<Check> {
    let slots = ctx.device.slots as usize;
    let n = slots + 2;
    let many = Many::open(ctx, d, n, TIMES)?;
    let (rmids, handles) = (many.rmids.clone(), many.handles.clone());
    let mut problems = Vec::new();
    let mut shares = Vec::new();
    for round in 1..=4u64 {
        let names: Vec<String> = rmids.iter().map(|r| format!("rmid {r}")).collect();
        let (a, e) = round_across_move(
            ctx,
            d,
            &handles,
            &names,
            &vec![1; n],
            round,
            &|ctx: &mut Ctx, b: u64| many.burst(ctx, b),
            &mut problems,
        )?;
        let (running, enabled, over) = running_at_once(&a, &e, slots);
        if over {
            problems.push(format!(
                "round {round}: {n} events on {slots} slots ran {running} ns in all across a move, more than {slots} × the window's {enabled} ns"
            ));
        }
        shares.push(format!("{:.1}", running as f64 / enabled.max(1) as f64));
        if problems.len() > 6 {
            break;
        }
    }
    let o = move_away(ctx, d)?;
    let (rest, rest_rmids, s1) =
        close_two_rest_exact(ctx, &many, "closed right after a move", &mut problems)?;
    ctx.g.set_online(o, true)?;
    many.burst(ctx, 5 * MIB)?;
    let o = move_away(ctx, d)?;
    for &h in &rest {
        must(ctx, h, PerfIoctl::Reset { group: false })?;
    }
    let z = ctx.g.read_many(&rest)?;
    many.burst(ctx, 7 * MIB)?;
    let y = ctx.g.read_many(&rest)?;
    ctx.g.set_online(o, true)?;
    for (i, r) in rest_rmids.iter().enumerate() {
        if z[i][0] != 0 || z[i][1] < s1[i][1] || z[i][2] < s1[i][2] {
            problems.push(format!(
                "rmid {r}: 5 MiB, move, RESET: read {:?} after {:?} (want value 0, times kept)",
                z[i], s1[i]
            ));
        }
        judge_exact(
            &format!("rmid {r}, RESET right after a move, 7 MiB"),
            &z[i],
            &y[i],
            7 * MIB,
            &mut problems,
        );
    }
    for h in rest {
        ctx.g.close(h)?;
    }
    Ok(Check::from_problems(
        "move-attack: multiplexed across moves",
        problems,
        format!(
            "{}: {n} events on {slots} slots, mux {LONG_MUX_MS} ms, 4 moves: every window within the rules, events running per round {}; two closed right after a move: the rest exact at 100 %; RESET right after a move: exact",
            pmu_name(d),
            shares.join(", ")
        ),
    ))
}

/// An exclusive `mbm_total_bytes` event and two plain ones of domain `d`
/// (RMIDs `rs`, handles `hs`, the exclusive one first, opened first).
pub(super) struct Trio {
    d: usize,
    pub(super) rs: [u32; 3],
    pub(super) hs: [u32; 3],
}

impl Trio {
    pub(super) fn open(ctx: &mut Ctx, d: usize) -> Result<Trio> {
        let rs = [rmid(ctx, 4), rmid(ctx, 5), rmid(ctx, 6)];
        let ex = open_with(ctx, d, rs[0], TIMES, FLAG_EXCLUSIVE, None)?;
        let p1 = open_with(ctx, d, rs[1], TIMES, 0, None)?;
        let p2 = open_with(ctx, d, rs[2], TIMES, 0, None)?;
        Ok(Trio {
            d,
            rs,
            hs: [ex, p1, p2],
        })
    }

    /// Lets `bytes` land into each of the three RMIDs.
    pub(super) fn burst(&self, ctx: &mut Ctx, bytes: u64) -> Result<()> {
        let inj: Vec<_> = self
            .rs
            .iter()
            .map(|&r| (self.d, r, Event::MbmTotalBytes, bytes))
            .collect();
        ctx.inject_and_land(&inj)
    }
}

/// S4. An exclusive event and two plain ones under a long mux interval,
///     three rounds of burst, move, burst: every window within the rules,
///     and the exclusive one never running beside a plain one (`Δrunning`
///     of the exclusive + a plain ≤ `Δenabled`). Then a DISABLE of the
///     exclusive right after a move: the plain ones count for sure, exactly
///     at 100 %, and the disabled one stands still; ENABLE, a move, the
///     exclusive closed right after it: the plain ones again exactly at 100 %.
pub fn exclusive_across_moves(ctx: &mut Ctx) -> Result<Check> {
    under_long_mux(ctx, exclusive_moves)
}

fn exclusive_moves(ctx: &mut Ctx, d: usize) -> Result<Check> {
    let trio = Trio::open(ctx, d)?;
    let (rs, hs) = (trio.rs, trio.hs);
    let [ex, p1, p2] = hs;
    let burst = |ctx: &mut Ctx, b: u64| trio.burst(ctx, b);
    let mut problems = Vec::new();
    let mut turns = Vec::new();
    for round in 1..=3u64 {
        let names: Vec<String> = rs.iter().map(|r| format!("rmid {r}")).collect();
        let (a, e) = round_across_move(
            ctx,
            d,
            &hs,
            &names,
            &[1, 1, 1],
            round,
            &|ctx: &mut Ctx, b: u64| burst(ctx, b),
            &mut problems,
        )?;
        let w: Vec<Window> = (0..3).map(|i| Window::between(&a[i], &e[i])).collect();
        for p in 1..3 {
            if w[0].running + w[p].running > w[0].enabled.max(w[p].enabled) + SKEW_NS {
                problems.push(format!(
                    "round {round}: across a move the exclusive event ran {} ns and a plain one {} ns of a {} ns window (an exclusive group runs alone)",
                    w[0].running, w[p].running, w[0].enabled
                ));
            }
        }
        turns.push(format!(
            "{:.0}/{:.0} %",
            100.0 * w[0].running as f64 / w[0].enabled.max(1) as f64,
            100.0 * w[1].running as f64 / w[1].enabled.max(1) as f64
        ));
    }
    let o = move_away(ctx, d)?;
    must(ctx, ex, PerfIoctl::Disable { group: false })?;
    let f0 = ctx.g.read_many(&hs)?;
    burst(ctx, 3 * MIB)?;
    let f1 = ctx.g.read_many(&hs)?;
    ctx.g.set_online(o, true)?;
    if f1[0] != f0[0] {
        problems.push(format!(
            "the exclusive event DISABLEd right after a move, 3 MiB: read {:?} after {:?} (want unchanged)",
            f1[0], f0[0]
        ));
    }
    for i in 1..3 {
        judge_exact(
            &format!(
                "plain rmid {}, the exclusive one DISABLEd right after a move",
                rs[i]
            ),
            &f0[i],
            &f1[i],
            3 * MIB,
            &mut problems,
        );
    }
    must(ctx, ex, PerfIoctl::Enable { group: false })?;
    burst(ctx, MIB)?;
    let o = move_away(ctx, d)?;
    ctx.g.close(ex)?;
    let g0 = ctx.g.read_many(&hs[1..])?;
    burst(ctx, 5 * MIB)?;
    let g1 = ctx.g.read_many(&hs[1..])?;
    ctx.g.set_online(o, true)?;
    for i in 0..2 {
        judge_exact(
            &format!(
                "plain rmid {}, the exclusive one closed right after a move",
                rs[i + 1]
            ),
            &g0[i],
            &g1[i],
            5 * MIB,
            &mut problems,
        );
    }
    ctx.g.close(p1)?;
    ctx.g.close(p2)?;
    Ok(Check::from_problems(
        "move-attack: exclusive across moves",
        problems,
        format!(
            "{}: exclusive/plain ran {} over 3 rounds with a move; DISABLE or close of the exclusive right after a move: the plain ones exact at 100 %",
            pmu_name(d),
            turns.join(", ")
        ),
    ))
}

/// S8. A group `{mbm leader, mbm sibling}` opened after `slots - 1` lone
///     events under a long mux interval, so it waits for its turn; two
///     rounds of burst, move, burst: each member's windows obey the rules
///     and the two members run together (equal `Δrunning`). A lone event
///     closed right after a move: the group fits and counts for sure, both
///     exactly at 100 %. DISABLE|GROUP issued on the sibling right after a
///     move freezes both; ENABLE|GROUP: exact again. The leader closed right
///     after a move: the promoted sibling counts on exactly at 100 %.
pub fn waiting_group_across_moves(ctx: &mut Ctx) -> Result<Check> {
    under_long_mux(ctx, waiting_group)
}

fn waiting_group(ctx: &mut Ctx, d: usize) -> Result<Check> {
    let slots = ctx.device.slots as usize;
    let lone = Many::open(ctx, d, slots - 1, TIMES)?;
    let (gl, gs) = (rmid(ctx, slots as u32 - 1), rmid(ctx, slots as u32));
    if lone.rmids.contains(&gl) || lone.rmids.contains(&gs) || gl == gs {
        bail!("the device has too few RMIDs for {} events", slots + 1);
    }
    let leader = open_with(ctx, d, gl, TIMES, 0, None)?;
    let sibling = open_with(ctx, d, gs, TIMES, 0, Some(leader))?;
    let pair = [leader, sibling];
    let both = |ctx: &mut Ctx, b: u64| -> Result<()> {
        lone.burst(ctx, b)?;
        ctx.inject_and_land(&[
            (d, gl, Event::MbmTotalBytes, b),
            (d, gs, Event::MbmTotalBytes, 2 * b),
        ])
    };
    let mut problems = Vec::new();
    let mut ran = Vec::new();
    for round in 1..=2u64 {
        let names = ["group leader".to_string(), "group sibling".to_string()];
        let (a, e) =
            round_across_move(ctx, d, &pair, &names, &[1, 2], round, &both, &mut problems)?;
        let (wl, ws) = (Window::between(&a[0], &e[0]), Window::between(&a[1], &e[1]));
        if wl.running.abs_diff(ws.running) > SKEW_NS {
            problems.push(format!(
                "round {round}: across a move the leader ran {} ns and its sibling {} ns (a group runs together)",
                wl.running, ws.running
            ));
        }
        ran.push(format!(
            "{:.0} %",
            100.0 * wl.running as f64 / wl.enabled.max(1) as f64
        ));
    }
    let o = move_away(ctx, d)?;
    ctx.g.close(lone.handles[0])?;
    let f0 = ctx.g.read_many(&pair)?;
    both(ctx, 3 * MIB)?;
    let f1 = ctx.g.read_many(&pair)?;
    ctx.g.set_online(o, true)?;
    judge_exact(
        "leader, a lone event closed right after a move",
        &f0[0],
        &f1[0],
        3 * MIB,
        &mut problems,
    );
    judge_exact(
        "sibling, a lone event closed right after a move",
        &f0[1],
        &f1[1],
        6 * MIB,
        &mut problems,
    );
    let o = move_away(ctx, d)?;
    must(ctx, sibling, PerfIoctl::Disable { group: true })?;
    let g0 = ctx.g.read_many(&pair)?;
    both(ctx, 4 * MIB)?;
    let g1 = ctx.g.read_many(&pair)?;
    must(ctx, sibling, PerfIoctl::Enable { group: true })?;
    let g2 = ctx.g.read_many(&pair)?;
    both(ctx, 5 * MIB)?;
    let g3 = ctx.g.read_many(&pair)?;
    ctx.g.set_online(o, true)?;
    if g1 != g0 {
        problems.push(format!(
            "DISABLE|GROUP on the sibling right after a move, 4 MiB: read {g1:?} after {g0:?} (want unchanged)"
        ));
    }
    judge_exact(
        "leader, ENABLE|GROUP on the sibling",
        &g2[0],
        &g3[0],
        5 * MIB,
        &mut problems,
    );
    judge_exact(
        "sibling, ENABLE|GROUP on it",
        &g2[1],
        &g3[1],
        10 * MIB,
        &mut problems,
    );
    let o = move_away(ctx, d)?;
    ctx.g.close(leader)?;
    let h0 = ctx.g.read(sibling)?;
    both(ctx, 6 * MIB)?;
    let h1 = ctx.g.read(sibling)?;
    ctx.g.set_online(o, true)?;
    judge_exact(
        "the sibling promoted by its leader's close right after a move",
        &h0,
        &h1,
        12 * MIB,
        &mut problems,
    );
    ctx.g.close(sibling)?;
    for &h in &lone.handles[1..] {
        ctx.g.close(h)?;
    }
    Ok(Check::from_problems(
        "move-attack: waiting group across moves",
        problems,
        format!(
            "{}: a 2-event group beside {} lone events on {slots} slots ran {} of two windows with a move, together; exact at 100 % once a lone event closed, after DISABLE/ENABLE|GROUP on the sibling and promoted by its leader's close, each right after a move",
            pmu_name(d),
            slots - 1,
            ran.join(", ")
        ),
    ))
}

/// S9. A group `{mbm leader, mbm sibling}` that counted, then made to wait
///     for its turn (opened after `slots - 1` lone events, one of them
///     disabled until the group has counted; a long mux interval): across
///     a move its windows obey the rules;
///     RESET|GROUP right after another move zeroes both and keeps the times;
///     a lone event closed: from then both count for sure, exactly at 100 %,
///     and nothing that landed before the RESET ever counts.
pub fn reset_of_waiting_group_after_move(ctx: &mut Ctx) -> Result<Check> {
    under_long_mux(ctx, reset_of_waiting_group)
}

fn reset_of_waiting_group(ctx: &mut Ctx, d: usize) -> Result<Check> {
    let slots = ctx.device.slots as usize;
    // Lone events first (perf schedules groups in open order), one of them
    // disabled so that the group, opened after them, fits and counts.
    let lone = Many::open(ctx, d, slots - 1, TIMES)?;
    let (gl, gs) = (rmid(ctx, slots as u32 - 1), rmid(ctx, slots as u32));
    if lone.rmids.contains(&gl) || lone.rmids.contains(&gs) || gl == gs {
        bail!("the device has too few RMIDs for {} events", slots + 1);
    }
    must(ctx, lone.handles[0], PerfIoctl::Disable { group: false })?;
    let leader = open_with(ctx, d, gl, TIMES, 0, None)?;
    let sibling = open_with(ctx, d, gs, TIMES, 0, Some(leader))?;
    let pair = [leader, sibling];
    let group = |ctx: &mut Ctx, b: u64| -> Result<()> {
        ctx.inject_and_land(&[
            (d, gl, Event::MbmTotalBytes, b),
            (d, gs, Event::MbmTotalBytes, 2 * b),
        ])
    };
    let mut problems = Vec::new();
    let s = ctx.g.read_many(&pair)?;
    group(ctx, MIB)?;
    let counted = ctx.g.read_many(&pair)?;
    judge_exact("leader, fitting", &s[0], &counted[0], MIB, &mut problems);
    judge_exact(
        "sibling, fitting",
        &s[1],
        &counted[1],
        2 * MIB,
        &mut problems,
    );
    // The disabled lone event back on: it comes first, the group waits.
    must(ctx, lone.handles[0], PerfIoctl::Enable { group: false })?;
    let all = |ctx: &mut Ctx, b: u64| -> Result<()> {
        lone.burst(ctx, b)?;
        group(ctx, b)
    };
    let a = ctx.g.read_many(&pair)?;
    all(ctx, 2 * MIB)?;
    let o = move_away(ctx, d)?;
    let b = ctx.g.read_many(&pair)?;
    all(ctx, 4 * MIB)?;
    let c = ctx.g.read_many(&pair)?;
    ctx.g.set_online(o, true)?;
    for (i, k) in [(0, 1), (1, 2)] {
        let what = |w: &str| format!("group member {i}, waiting: {w}");
        judge_window(
            &what("2 MiB, move"),
            &a[i],
            &b[i],
            2 * k * MIB,
            &mut problems,
        );
        judge_window(
            &what("after the move, 4 MiB"),
            &b[i],
            &c[i],
            4 * k * MIB,
            &mut problems,
        );
    }
    let o = move_away(ctx, d)?;
    must(ctx, leader, PerfIoctl::Reset { group: true })?;
    let z = ctx.g.read_many(&pair)?;
    all(ctx, 8 * MIB)?;
    ctx.g.close(lone.handles[0])?;
    let f0 = ctx.g.read_many(&pair)?;
    all(ctx, 16 * MIB)?;
    let f1 = ctx.g.read_many(&pair)?;
    ctx.g.set_online(o, true)?;
    for h in [sibling, leader] {
        ctx.g.close(h)?;
    }
    for &h in &lone.handles[1..] {
        ctx.g.close(h)?;
    }
    for (i, k) in [(0, 1), (1, 2)] {
        if z[i][0] != 0 || z[i][1] < c[i][1] || z[i][2] < c[i][2] {
            problems.push(format!(
                "group member {i}: RESET|GROUP right after a move read {:?} after {:?} (want value 0, times kept)",
                z[i], c[i]
            ));
        }
        judge_window(
            &format!("group member {i}: after the RESET, 8 MiB, a lone event closed"),
            &z[i],
            &f0[i],
            8 * k * MIB,
            &mut problems,
        );
        judge_exact(
            &format!("group member {i}: fits, 16 MiB"),
            &f0[i],
            &f1[i],
            16 * k * MIB,
            &mut problems,
        );
    }
    Ok(Check::from_problems(
        "move-attack: reset of waiting group after move",
        problems,
        format!(
            "{}: a group that counted, then waited beside {} lone events on {slots} slots (ran {} of a window with a move), RESET|GROUP right after a move, then fitting: counted {} and {} = only what landed after the RESET while counting",
            pmu_name(d),
            slots - 1,
            {
                let w = Window::between(&a[0], &c[0]);
                format!("{:.0} %", 100.0 * w.running as f64 / w.enabled.max(1) as f64)
            },
            f1[0][0],
            f1[1][0]
        ),
    ))
}

/// S11. `slots + 1` events, the last opened disabled (the rest fit): it is
///     ENABLEd right after a move (now they contend: every window within
///     the rules, and it never counts what landed before its ENABLE); a
///     slot holder DISABLEd right after a second move: the rest, the late
///     one with them, count for sure, exactly at 100 %.
pub fn enable_right_after_move_contended(ctx: &mut Ctx) -> Result<Check> {
    under_long_mux(ctx, enable_after_move)
}

fn enable_after_move(ctx: &mut Ctx, d: usize) -> Result<Check> {
    let slots = ctx.device.slots as usize;
    let many = Many::open(ctx, d, slots, TIMES)?;
    let lr = rmid(ctx, slots as u32);
    if many.rmids.contains(&lr) {
        bail!("the device has too few RMIDs for {} events", slots + 1);
    }
    let late = open_with(ctx, d, lr, TIMES, FLAG_DISABLED, None)?;
    let mut hs = many.handles.clone();
    hs.push(late);
    let mut rmids = many.rmids.clone();
    rmids.push(lr);
    let all = |ctx: &mut Ctx, b: u64| -> Result<()> {
        many.burst(ctx, b)?;
        super::redteam::inject(ctx, d, lr, b)
    };
    let mut problems = Vec::new();
    all(ctx, MIB)?;
    let o = move_away(ctx, d)?;
    must(ctx, late, PerfIoctl::Enable { group: false })?;
    let a = ctx.g.read_many(&hs)?;
    all(ctx, 2 * MIB)?;
    let b = ctx.g.read_many(&hs)?;
    ctx.g.set_online(o, true)?;
    let o = move_away(ctx, d)?;
    let c = ctx.g.read_many(&hs)?;
    must(ctx, hs[0], PerfIoctl::Disable { group: false })?;
    let e0 = ctx.g.read_many(&hs)?;
    all(ctx, 4 * MIB)?;
    let e1 = ctx.g.read_many(&hs)?;
    ctx.g.set_online(o, true)?;
    for h in hs.iter().copied() {
        ctx.g.close(h)?;
    }
    if a[slots][0] != 0 {
        problems.push(format!(
            "the late event: 1 MiB while disabled, move, ENABLE: read {:?} (want value 0)",
            a[slots]
        ));
    }
    for (i, r) in rmids.iter().enumerate() {
        judge_window(
            &format!("rmid {r}: ENABLE of the late one, 2 MiB"),
            &a[i],
            &b[i],
            2 * MIB,
            &mut problems,
        );
        judge_window(
            &format!("rmid {r}: a move (nothing landed)"),
            &b[i],
            &c[i],
            0,
            &mut problems,
        );
        if i == 0 {
            if e1[0] != e0[0] {
                problems.push(format!(
                    "rmid {r}, DISABLEd right after a move: read {:?} after {:?} (want unchanged)",
                    e1[0], e0[0]
                ));
            }
        } else {
            judge_exact(
                &format!(
                    "rmid {r}: one DISABLEd right after a move, {slots} left on {slots} slots"
                ),
                &e0[i],
                &e1[i],
                4 * MIB,
                &mut problems,
            );
        }
    }
    Ok(Check::from_problems(
        "move-attack: enable right after move contended",
        problems,
        format!(
            "{}: a disabled event ENABLEd right after a move beside {slots} on {slots} slots ran {:.0} % of the next window; a slot holder DISABLEd right after a move: the other {slots} exact at 100 %",
            pmu_name(d),
            {
                let w = Window::between(&a[slots], &b[slots]);
                100.0 * w.running as f64 / w.enabled.max(1) as f64
            }
        ),
    ))
}

/// S13. Groups enabled and counting through moves, each member read right
///     after each move: `{llc_occupancy leader, mbm_total, mbm_local}` (the
///     leader takes no slot) and `{cpu-clock leader, mbm_total}`. A move is
///     seamless: every device member counts exactly what landed, at 100 %
///     (a sibling waiting for its leader's install is counting, patch 0053),
///     the gauge reads the occupancy.
pub fn groups_seamless_across_moves(ctx: &mut Ctx) -> Result<Check> {
    let (d, _) = movable_domain(ctx)?;
    let (r1, r2) = (rmid(ctx, 3), rmid(ctx, 4));
    let occ = 777 * ctx.device.unit_bytes;
    ctx.control.set_occupancy(d as u32, r1, occ)?;
    let mut gauge = ctx.attr(d, Event::LlcOccupancy, r1);
    gauge.read_format = TIMES;
    let gl = match ctx.g.open(gauge, None)? {
        Ok(h) => h,
        Err(errno) => bail!("opening llc_occupancy: {errno}"),
    };
    let total = open_with(ctx, d, r1, TIMES, 0, Some(gl))?;
    let mut local = ctx.attr(d, Event::MbmLocalBytes, r1);
    local.read_format = TIMES;
    let local = match ctx.g.open(local, Some(gl))? {
        Ok(h) => h,
        Err(errno) => bail!("opening mbm_local_bytes as a sibling: {errno}"),
    };
    let cpu = owner(ctx, d)? as i32;
    let clock = cpu_clock(ctx, cpu, None)?;
    let csib = open_with(ctx, d, r2, TIMES, 0, Some(clock))?;
    let hs = [gl, total, local, clock, csib];
    let burst = |ctx: &mut Ctx, b: u64| -> Result<()> {
        ctx.inject_and_land(&[
            (d, r1, Event::MbmTotalBytes, b),
            (d, r1, Event::MbmLocalBytes, 2 * b),
            (d, r2, Event::MbmTotalBytes, 3 * b),
        ])
    };
    let mut problems = Vec::new();
    let mut reads = vec![ctx.g.read_many(&hs)?];
    let mut landed = [0u64; 3];
    for round in 1..=3u64 {
        burst(ctx, round * MIB)?;
        let o = move_away(ctx, d)?;
        reads.push(ctx.g.read_many(&hs)?);
        burst(ctx, 2 * round * MIB)?;
        ctx.g.set_online(o, true)?;
        reads.push(ctx.g.read_many(&hs)?);
        for (k, m) in landed.iter_mut().zip([1, 2, 3]) {
            *k += 3 * m * round * MIB;
        }
    }
    let (first, last) = (&reads[0], &reads[reads.len() - 1]);
    for h in [local, total, gl, csib, clock] {
        ctx.g.close(h)?;
    }
    ctx.control.set_occupancy(d as u32, r1, 0)?;
    let members = [
        ("mbm_total under a gauge leader", 1, landed[0]),
        ("mbm_local under a gauge leader", 2, landed[1]),
        ("mbm_total under a cpu-clock leader", 4, landed[2]),
    ];
    for (name, i, want) in members {
        judge_exact(
            &format!("{name}, 3 moves"),
            &first[i],
            &last[i],
            want,
            &mut problems,
        );
    }
    for (n, r) in reads.iter().enumerate() {
        for (name, i) in [("gauge leader", 0), ("cpu-clock leader", 3)] {
            if r[i][2] != r[i][1] {
                problems.push(format!(
                    "read {n} (odd: right after a move): the {name} enabled {} running {} (want equal: a move is seamless)",
                    r[i][1], r[i][2]
                ));
            }
        }
        if r[0][0] != occ {
            problems.push(format!(
                "read {n}: the gauge leader read {} (want the occupancy {occ})",
                r[0][0]
            ));
        }
    }
    Ok(Check::from_problems(
        "move-attack: groups seamless across moves",
        problems,
        format!(
            "{}: {{llc_occupancy, mbm_total, mbm_local}} and {{cpu-clock, mbm_total}} through 3 moves, read right after each: {}, {} and {} exact at 100 %, the gauge {occ}",
            pmu_name(d),
            last[1][0] - first[1][0],
            last[2][0] - first[2][0],
            last[4][0] - first[4][0]
        ),
    ))
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
    let mut prev = ctx.g.read_many(&handles)?;
    let mut shares = Vec::new();
    for w in 1..=10u64 {
        many.burst(ctx, MIB)?;
        let cur = ctx.g.read_many(&handles)?;
        for (i, r) in rmids.iter().enumerate() {
            judge_window(
                &format!("window {w}, rmid {r}"),
                &prev[i],
                &cur[i],
                MIB,
                &mut problems,
            );
        }
        let (running, enabled, over) = running_at_once(&prev, &cur, slots);
        if over {
            problems.push(format!(
                "window {w}: {n} events on {slots} slots ran {running} ns in all while moving, more than {slots} × the window's {enabled} ns"
            ));
        }
        shares.push(format!("{:.1}", running as f64 / enabled.max(1) as f64));
        prev = cur;
        if problems.len() > 6 {
            break;
        }
    }
    finish_mover(ctx, mover)?;
    let (rest, _, _) = close_two_rest_exact(ctx, &many, "closed after the moves", &mut problems)?;
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
pub(super) const CHECKS: &[Named] = &[
    (
        "move-attack: sibling of disabled leader across moves",
        sibling_of_disabled_leader_across_moves,
    ),
    (
        "move-attack: sibling of disabled cpu-clock leader across moves",
        sibling_of_disabled_cpu_clock_leader_across_moves,
    ),
    (
        "move-attack: sibling of disabled leader enabled time",
        sibling_of_disabled_leader_enabled_time,
    ),
    (
        "move-attack: sibling of disabled leader across a park",
        sibling_of_disabled_leader_across_park,
    ),
    (
        "move-attack: multiplexed across moves",
        multiplexed_across_moves,
    ),
    (
        "move-attack: exclusive across moves",
        exclusive_across_moves,
    ),
    (
        "move-attack: waiting group across moves",
        waiting_group_across_moves,
    ),
    (
        "move-attack: reset of waiting group after move",
        reset_of_waiting_group_after_move,
    ),
    (
        "move-attack: enable right after move contended",
        enable_right_after_move_contended,
    ),
    (
        "move-attack: groups seamless across moves",
        groups_seamless_across_moves,
    ),
    ("move-attack: rotating during moves", rotating_during_moves),
];
