//! Red-team attacks on allowed sets that change at run time
//! (`perfbed ctl allowed`, the driver's configuration interrupt, the perf
//! core's `perf_pmu_update_allowed_cpus()`), written from the promise alone
//! before reading its implementation:
//!
//! - a PMU whose owner is outside the new set moves into it, counts exact
//!   against the device's truth, `time_running == time_enabled`;
//! - a set with no online CPU parks the PMU although its CPU is online
//!   (`cpumask` empty, opens `ENODEV`), events stay open and catch up when
//!   a CPU of the set comes online;
//! - the last of close changes wins; a change to one domain leaves another
//!   alone; a set equal to the current one changes nothing;
//! - a malformed set (unknown domain, CPU beyond the device) is refused
//!   with an error and loses nothing;
//! - a change racing a RESET, a DISABLE, a cpu-clock sibling, the new
//!   owner's offline, or an open never costs a byte or a wrong errno;
//! - none of it makes a placement violation.
//!
//! These stay in Rust because each races a change (issued without waiting
//! for the `cpumask`, which a scenario's `allowed` waits for), reloads the
//! module, sends malformed sets or runs perf stat; the attacks on allowed
//! sets the counting model can judge are scenarios (`scenarios/allowed`).
//!
//! Every traffic burst lands (`wait_landed`) while the PMU is settled, so
//! every expected count is exact. Each attack restores the domain's set and
//! brings every CPU back online, whatever happened.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use perfbed_agent::{AgentMessage, HostRequest, JobResult, JobSpec, PerfIoctl};
use perfbed_device::regs::Event;

use super::allowed_sets::set_allowed;
use super::context::{
    every_cpu_back, inject, must, open_with, owner, rmid, truth, Ctx, Named, MIB, TIMES,
};
use super::moves::movable_domain;
use crate::checks::Check;
use crate::guest::{pmu_name, MODULE};

/// How long a change may take to be acted on under TCG on a loaded
/// machine (irq, work, perf core); far above the tens of milliseconds it
/// takes, so a miss means it never happened.
const SETTLE: Duration = Duration::from_secs(30);

/// Where a PMU must end up for a settled change: on one CPU of `want`
/// (`Some`), or parked (`None`).
fn settled(mask: &[u32], want: Option<&[u32]>) -> bool {
    match (mask, want) {
        ([], None) => true,
        ([cpu], Some(set)) => set.contains(cpu),
        _ => false,
    }
}

/// Polls `cpumask` until it satisfies `want`; the mask seen last either way.
fn settle(ctx: &mut Ctx, d: usize, want: Option<&[u32]>) -> Result<(bool, Vec<u32>)> {
    let pmu = pmu_name(d);
    let start = Instant::now();
    loop {
        let mask = ctx.g.cpumask(&pmu)?;
        if settled(&mask, want) {
            return Ok((true, mask));
        }
        if start.elapsed() > SETTLE {
            return Ok((false, mask));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn violations(ctx: &mut Ctx) -> Result<u64> {
    Ok(ctx
        .control
        .state()?
        .domains
        .iter()
        .map(|s| s.violations)
        .sum())
}

/// Adds a problem if the device counted placement violations since `v0`
/// (from [`violations`]).
fn no_new_violations(ctx: &mut Ctx, v0: u64, problems: &mut Vec<String>) -> Result<()> {
    let v = violations(ctx)? - v0;
    if v != 0 {
        problems.push(format!("{v} placement violations"));
    }
    Ok(())
}

/// Checks a settle and names what it waited for.
fn expect_settled(
    ctx: &mut Ctx,
    d: usize,
    want: Option<&[u32]>,
    what: &str,
    problems: &mut Vec<String>,
) -> Result<Vec<u32>> {
    let (ok, mask) = settle(ctx, d, want)?;
    if !ok {
        problems.push(format!(
            "{what}: cpumask {mask:?} after {}s (want {})",
            SETTLE.as_secs(),
            want.map_or("parked".to_string(), |s| format!("a CPU of {s:?}"))
        ));
    }
    Ok(mask)
}

/// Judges an event read with [`TIMES`]: exact value, running == enabled.
fn judge_read(what: &str, w: &[u64], want: u64, problems: &mut Vec<String>) {
    if w[0] != want {
        problems.push(format!(
            "{what}: counted {} (want {want}, the device's truth)",
            w[0]
        ));
    }
    if w.len() >= 3 && w[1] != w[2] {
        problems.push(format!(
            "{what}: time_enabled {} != time_running {}",
            w[1], w[2]
        ));
    }
}

/// One attack's counting event (`mbm_total_bytes` of domain `d`, RMID
/// `r`, with [`TIMES`]) and the device's truth when it was opened: every
/// attack opens one, lets traffic land, changes sets, and judges the read
/// against what landed since.
struct Counted {
    h: u32,
    d: usize,
    r: u32,
    start: u64,
}

impl Counted {
    fn open(ctx: &mut Ctx, d: usize, r: u32) -> Result<Counted> {
        let h = open_with(ctx, d, r, TIMES, 0, None)?;
        let start = truth(ctx, d, r)?;
        Ok(Counted { h, d, r, start })
    }

    /// Lets `bytes` land into the event's RMID.
    fn inject(&self, ctx: &mut Ctx, bytes: u64) -> Result<()> {
        inject(ctx, self.d, self.r, bytes)
    }

    /// Reads the event and judges it ([`judge_read`]) against the truth
    /// since the open; returns the read.
    fn judge(&self, ctx: &mut Ctx, what: &str, problems: &mut Vec<String>) -> Result<Vec<u64>> {
        let w = ctx.g.read(self.h)?;
        let want = truth(ctx, self.d, self.r)? - self.start;
        judge_read(what, &w, want, problems);
        Ok(w)
    }

    /// As [`Counted::judge`], the count only: for an event that was parked,
    /// whose `time_running` the contract lets fall behind.
    fn judge_count(
        &self,
        ctx: &mut Ctx,
        what: &str,
        problems: &mut Vec<String>,
    ) -> Result<Vec<u64>> {
        let w = ctx.g.read(self.h)?;
        let want = truth(ctx, self.d, self.r)? - self.start;
        judge_read(what, &w[..1], want, problems);
        Ok(w)
    }

    fn close(self, ctx: &mut Ctx) -> Result<()> {
        ctx.g.close(self.h)
    }
}

/// The CPU of `allowed` that is not `cpu`.
fn other(allowed: &[u32], cpu: u32) -> u32 {
    allowed.iter().copied().find(|&c| c != cpu).unwrap_or(cpu)
}

/// A1. `S = {c}` and `c` goes offline right after the change is issued
///     (before the driver may have acted): the PMU must end parked (no
///     online CPU in S), then, with `c` back, placed on `c`; the event
///     open throughout counts exactly.
pub fn change_racing_offline_of_target(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let r = rmid(ctx, 2);
    let mut problems = Vec::new();
    let ev = Counted::open(ctx, d, r)?;
    ev.inject(ctx, MIB)?;
    let target = other(&allowed, owner(ctx, d)?);
    set_allowed(ctx, d, &[target])?;
    ctx.g.set_online(target, false)?;
    let parked = expect_settled(ctx, d, None, "S={target} then CPU offline", &mut problems)?;
    ev.inject(ctx, 2 * MIB)?;
    ctx.g.set_online(target, true)?;
    let back = expect_settled(ctx, d, Some(&[target]), "CPU back online", &mut problems)?;
    ev.inject(ctx, 4 * MIB)?;
    let w = ev.judge_count(ctx, "at the end", &mut problems)?;
    ev.close(ctx)?;
    Ok(Check::from_problems(
        "allowed-attack: change racing offline",
        problems,
        format!("S={{{target}}} then CPU {target} offline: cpumask {parked:?} (parked); online: {back:?}; counted {} = the truth", w[0]),
    ))
}

/// A3. Malformed changes: an unknown domain and a CPU beyond the device
///     are refused with an error; the set, the placement and the count are
///     unchanged.
pub fn malformed_sets(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let r = rmid(ctx, 4);
    let mut problems = Vec::new();
    let ev = Counted::open(ctx, d, r)?;
    let before_mask = ctx.g.cpumask(&pmu_name(d))?;
    let before_set = ctx.control.state()?.domains[d].allowed_cpu_list.clone();
    let domains = ctx.device.domains.len() as u32;
    let mut errors = Vec::new();
    for (what, dom, cpus) in [
        ("unknown domain", domains + 7, allowed.clone()),
        ("CPU 200", d as u32, vec![200u32]),
        (
            "CPU 4096 with good ones",
            d as u32,
            [allowed.clone(), vec![4096]].concat(),
        ),
    ] {
        match ctx.control.set_allowed(dom, &cpus) {
            Ok(()) => problems.push(format!("{what}: accepted (want a clear error)")),
            Err(e) => errors.push(format!("{what}: {e}")),
        }
    }
    // Anything the driver would do with a change is done by then.
    std::thread::sleep(Duration::from_millis(500));
    ev.inject(ctx, 3 * MIB)?;
    let after_set = ctx.control.state()?.domains[d].allowed_cpu_list.clone();
    let after_mask = ctx.g.cpumask(&pmu_name(d))?;
    if after_set != before_set || after_mask != before_mask {
        problems.push(format!(
            "after refused changes: set {before_set} → {after_set}, cpumask {before_mask:?} → {after_mask:?}"
        ));
    }
    let w = ev.judge(ctx, "after refused changes", &mut problems)?;
    ev.close(ctx)?;
    Ok(Check::from_problems(
        "allowed-attack: malformed sets refused",
        problems,
        format!(
            "{}; set {after_set} and cpumask {after_mask:?} unchanged, counted {} = truth",
            errors.join("; "),
            w[0]
        ),
    ))
}

/// A4. Five changes back to back, none waited for: the last wins (the PMU
///     ends on its CPU and stays there), the count is exact, no violation.
pub fn back_to_back_last_wins(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let r = rmid(ctx, 5);
    let mut problems = Vec::new();
    let ev = Counted::open(ctx, d, r)?;
    let v0 = violations(ctx)?;
    ev.inject(ctx, MIB)?;
    let own = owner(ctx, d)?;
    let last = other(&allowed, own);
    let seq: Vec<Vec<u32>> = vec![vec![last], vec![], vec![own], allowed.clone(), vec![last]];
    for _ in 0..3 {
        for s in &seq {
            set_allowed(ctx, d, s)?;
        }
    }
    let mask = expect_settled(
        ctx,
        d,
        Some(&[last]),
        "after 15 back-to-back changes",
        &mut problems,
    )?;
    // Stays: no stale change lands late.
    std::thread::sleep(Duration::from_millis(1000));
    let later = ctx.g.cpumask(&pmu_name(d))?;
    if later != [last] {
        problems.push(format!(
            "a second after settling on [{last}] the cpumask is {later:?}: a stale change won"
        ));
    }
    ev.inject(ctx, 2 * MIB)?;
    let w = ev.judge(ctx, "after the changes", &mut problems)?;
    no_new_violations(ctx, v0, &mut problems)?;
    ev.close(ctx)?;
    Ok(Check::from_problems(
        "allowed-attack: back-to-back changes, last wins",
        problems,
        format!("15 changes without waiting, last {{{last}}}: cpumask {mask:?}, still {later:?} 1 s later; counted {} = truth, running = enabled; 0 violations", w[0]),
    ))
}

/// A6. A change in the very next instruction after RESET (and a RESET
///     right after a change, before it settled): the count after the last
///     RESET is exactly the traffic after it.
pub fn reset_racing_change(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let r = rmid(ctx, 7);
    let mut problems = Vec::new();
    let h = open_with(ctx, d, r, TIMES, 0, None)?;
    inject(ctx, d, r, 3 * MIB)?;
    let target = other(&allowed, owner(ctx, d)?);
    set_allowed(ctx, d, &[target])?;
    must(ctx, h, PerfIoctl::Reset { group: false })?;
    expect_settled(ctx, d, Some(&[target]), "change then RESET", &mut problems)?;
    inject(ctx, d, r, 2 * MIB)?;
    let a = ctx.g.read(h)?[0];
    if a != 2 * MIB {
        problems.push(format!(
            "RESET right after a change: {a} (want {})",
            2 * MIB
        ));
    }
    must(ctx, h, PerfIoctl::Reset { group: false })?;
    set_allowed(ctx, d, &[])?;
    expect_settled(ctx, d, None, "RESET then park", &mut problems)?;
    inject(ctx, d, r, 5 * MIB)?;
    set_allowed(ctx, d, &allowed)?;
    expect_settled(ctx, d, Some(&allowed), "placed again", &mut problems)?;
    inject(ctx, d, r, MIB)?;
    let b = ctx.g.read(h)?[0];
    if b != 6 * MIB {
        problems.push(format!("RESET then park and place: {b} (want {})", 6 * MIB));
    }
    ctx.g.close(h)?;
    Ok(Check::from_problems(
        "allowed-attack: RESET racing a change",
        problems,
        format!("change+RESET: {a} = 2 MiB after it; RESET+park+place: {b} = 6 MiB after it"),
    ))
}

/// A8. Opens issued right after each change, before it settled: each
///     succeeds (and counts exactly) or, only when the PMU is parked at one
///     end of the change (it parks, or it was parked and the change has not
///     placed it yet), gets ENODEV; never EBUSY or anything else. After an
///     ENODEV, an open once the change settled on a CPU must succeed.
pub fn opens_racing_changes(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let r = rmid(ctx, 2);
    let mut problems = Vec::new();
    let mut outcomes = Vec::new();
    let sets: Vec<Vec<u32>> = vec![
        vec![allowed[1]],
        vec![],
        vec![allowed[0]],
        vec![],
        allowed.clone(),
    ];
    let mut was_parked = false;
    // An open that beat a park: its event is held while parked, and a read
    // shows the traffic of the park only once the PMU is placed again, so
    // it is judged after the next change (the promise: "events stay open
    // and enabled, catch up when placed again").
    let mut held: Option<(u32, u64, u64, String)> = None;
    for s in &sets {
        set_allowed(ctx, d, s)?;
        let opened = ctx.g.open(ctx.attr(d, Event::MbmTotalBytes, r), None)?;
        let want = if s.is_empty() {
            None
        } else {
            Some(s.as_slice())
        };
        expect_settled(ctx, d, want, &format!("S={s:?}"), &mut problems)?;
        if let Some((h, start, base, parked_in)) = held.take() {
            let got = ctx.g.read(h)?[0] - base;
            let t = truth(ctx, d, r)? - start;
            if got != t {
                problems.push(format!(
                    "{parked_in}: opened in the change, held through the park, counted {got} once placed in S={s:?} (want {t})"
                ));
            }
            ctx.g.close(h)?;
        }
        match opened {
            Ok(h) => {
                let start = truth(ctx, d, r)?;
                let base = ctx.g.read(h)?[0];
                inject(ctx, d, r, MIB)?;
                if s.is_empty() {
                    held = Some((h, start, base, format!("S={s:?}")));
                    outcomes.push("ok (held, judged once placed)".to_string());
                    was_parked = true;
                    continue;
                }
                let got = ctx.g.read(h)?[0] - base;
                let t = truth(ctx, d, r)? - start;
                if got != t {
                    problems.push(format!(
                        "S={s:?}: opened in the change, counted {got} (want {t})"
                    ));
                }
                ctx.g.close(h)?;
                outcomes.push("ok".to_string());
            }
            Err(e) if e == "ENODEV" && s.is_empty() => outcomes.push(e),
            Err(e) if e == "ENODEV" && was_parked => {
                // Still parked when it opened; placed now, so opens work.
                match ctx.g.open(ctx.attr(d, Event::MbmTotalBytes, r), None)? {
                    Ok(h) => ctx.g.close(h)?,
                    Err(again) => problems.push(format!(
                        "S={s:?}: ENODEV racing the placement, then {again} once placed"
                    )),
                }
                outcomes.push(format!("{e} (still parked), then ok"));
            }
            Err(e) => {
                problems.push(format!("S={s:?}: an open racing the change gave {e}"));
                outcomes.push(e);
            }
        }
        was_parked = s.is_empty();
    }
    Ok(Check::from_problems(
        "allowed-attack: opens racing changes",
        problems,
        format!(
            "5 changes, an open right after each: {}",
            outcomes.join(", ")
        ),
    ))
}

/// A11. Changes while perfbed.ko is not loaded, after changes made while it
///      was: loaded again, it is placed by the set the device has now (a
///      one-CPU set: that CPU; an empty one: parked, opens ENODEV), and a
///      change after the load still places it; counts exact, 0 violations.
pub fn reload_after_changes(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let r = rmid(ctx, 5);
    let mut problems = Vec::new();
    let v0 = violations(ctx)?;
    let first = other(&allowed, owner(ctx, d)?);
    let then = other(&allowed, first);
    set_allowed(ctx, d, &[first])?;
    expect_settled(ctx, d, Some(&[first]), "before unload", &mut problems)?;
    let reload = |ctx: &mut Ctx, during: &[u32]| -> Result<()> {
        let gone = ctx.g.ask(HostRequest::UnloadModule {
            name: MODULE.into(),
        })?;
        set_allowed(ctx, d, during)?;
        let back = ctx.g.ask(HostRequest::LoadModule {
            name: MODULE.into(),
        })?;
        if gone != AgentMessage::Done || back != AgentMessage::Done {
            bail!("unload {gone:?}, load {back:?}");
        }
        for x in 0..ctx.types.len() {
            ctx.types[x] = ctx.g.pmu_type(&pmu_name(x))?;
        }
        Ok(())
    };
    reload(ctx, &[then])?;
    let placed = expect_settled(ctx, d, Some(&[then]), "loaded with S={then}", &mut problems)?;
    let ev = Counted::open(ctx, d, r)?;
    ev.inject(ctx, MIB)?;
    let w = ev.judge(ctx, "after reload", &mut problems)?;
    ev.close(ctx)?;
    reload(ctx, &[])?;
    let parked = expect_settled(ctx, d, None, "loaded with S empty", &mut problems)?;
    match ctx.g.open(ctx.attr(d, Event::MbmTotalBytes, r), None)? {
        Err(e) if e == "ENODEV" => {}
        Ok(x) => {
            ctx.g.close(x)?;
            problems.push("loaded with S empty, an open succeeded (want ENODEV)".into());
        }
        Err(e) => problems.push(format!(
            "loaded with S empty, an open gave {e} (want ENODEV)"
        )),
    }
    set_allowed(ctx, d, &allowed)?;
    let again = expect_settled(
        ctx,
        d,
        Some(&allowed),
        "change after the load",
        &mut problems,
    )?;
    no_new_violations(ctx, v0, &mut problems)?;
    Ok(Check::from_problems(
        "allowed-attack: reload after changes",
        problems,
        format!("S={{{first}}}, unloaded, S={{{then}}}, loaded: {placed:?}, counted {} = truth; unloaded, S empty, loaded: {parked:?}, ENODEV; S={allowed:?}: {again:?}; 0 violations", w[0]),
    ))
}

/// A13. `S = {t}` and the *old* owner goes offline right after the change
///     is issued: whichever acts first (the change's re-placement or the
///     hotplug), the PMU ends on `t`, the event counts exactly, no
///     violation; onlining the old owner moves nothing.
pub fn change_racing_offline_of_owner(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let r = rmid(ctx, 7);
    let mut problems = Vec::new();
    let v0 = violations(ctx)?;
    let ev = Counted::open(ctx, d, r)?;
    ev.inject(ctx, MIB)?;
    let own = owner(ctx, d)?;
    let target = other(&allowed, own);
    if own == 0 {
        bail!("the owner is CPU 0, which cannot go offline");
    }
    set_allowed(ctx, d, &[target])?;
    ctx.g.set_online(own, false)?;
    let moved = expect_settled(
        ctx,
        d,
        Some(&[target]),
        "S={target}, old owner offline",
        &mut problems,
    )?;
    ev.inject(ctx, 2 * MIB)?;
    ctx.g.set_online(own, true)?;
    // Anything the online could wrongly do is done by then.
    std::thread::sleep(Duration::from_millis(500));
    let after = ctx.g.cpumask(&pmu_name(d))?;
    if after != [target] {
        problems.push(format!(
            "the old owner {own} back online: cpumask {after:?} (want [{target}])"
        ));
    }
    ev.inject(ctx, 4 * MIB)?;
    let w = ev.judge(ctx, "at the end", &mut problems)?;
    ev.close(ctx)?;
    no_new_violations(ctx, v0, &mut problems)?;
    Ok(Check::from_problems(
        "allowed-attack: change racing the old owner's offline",
        problems,
        format!("S={{{target}}} then owner {own} offline: cpumask {moved:?}; {own} online: {after:?}; counted {} = truth, running = enabled; 0 violations", w[0]),
    ))
}

/// Sums the values of `spec`'s interval lines in `perf stat -I -x,`
/// output (`time,value,unit,event,...`); `<not counted>` is 0 (nothing
/// ran, so by the contract nothing counted). Returns the sum and how many
/// lines there were.
fn interval_sum(stderr: &str, spec: &str) -> Result<(u64, usize)> {
    let mut sum = 0u64;
    let mut lines = 0;
    for line in stderr.lines() {
        let Some((head, _)) = line.split_once(&format!(",{spec},")) else {
            continue;
        };
        lines += 1;
        let value = head.split(',').nth(1).unwrap_or("").trim();
        if value.starts_with('<') {
            continue;
        }
        let v: u64 = value
            .parse()
            .map_err(|_| anyhow::anyhow!("{spec}: value {value:?} in {line:?}"))?;
        sum += v;
    }
    Ok((sum, lines))
}

/// A14. The real `perf stat -a -I 100 --no-scale` on the raw event, running
///     across a move, a park and a placement made by allowed-set changes,
///     with bursts between: its intervals add up to exactly what landed.
pub fn perf_stat_intervals_across_changes(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let r = rmid(ctx, 6);
    let mut problems = Vec::new();
    let v0 = violations(ctx)?;
    let raw = format!(
        "{}/event={:#04x},rmid={r}/",
        pmu_name(d),
        Event::MbmTotalBytes as u64
    );
    let argv = [
        "/usr/bin/perf",
        "stat",
        "-a",
        "-I",
        "100",
        "--no-scale",
        "-x,",
        "-e",
        &raw,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let job = match ctx.g.ask(HostRequest::StartJob {
        spec: JobSpec::Process {
            argv,
            perf_fds: 1,
            settle_ms: 200,
        },
    })? {
        AgentMessage::JobStarted { job } => job,
        other => bail!("starting perf stat -I: {other:?}"),
    };
    inject(ctx, d, r, MIB)?;
    let target = other(&allowed, owner(ctx, d)?);
    set_allowed(ctx, d, &[target])?;
    expect_settled(ctx, d, Some(&[target]), "S={target}", &mut problems)?;
    inject(ctx, d, r, 2 * MIB)?;
    set_allowed(ctx, d, &[])?;
    expect_settled(ctx, d, None, "S empty", &mut problems)?;
    inject(ctx, d, r, 4 * MIB)?;
    set_allowed(ctx, d, &allowed)?;
    expect_settled(ctx, d, Some(&allowed), "S restored", &mut problems)?;
    inject(ctx, d, r, 8 * MIB)?;
    // Two more intervals, so the last burst is printed.
    std::thread::sleep(Duration::from_millis(300));
    let result = match ctx.g.ask(HostRequest::StopJob {
        job,
        signal: 2,
        timeout_ms: 20_000,
    })? {
        AgentMessage::JobDone(result) => result,
        other => bail!("stopping perf stat -I: {other:?}"),
    };
    let JobResult::Process { stderr, .. } = &result else {
        bail!("perf stat -I: not a process result: {result:?}")
    };
    let (sum, lines) = interval_sum(stderr, &raw)?;
    let landed = 15 * MIB;
    if sum != landed {
        problems.push(format!(
            "{lines} intervals add up to {sum} (want {landed}, what landed)"
        ));
    }
    no_new_violations(ctx, v0, &mut problems)?;
    Ok(Check::from_problems(
        "allowed-attack: perf stat -I across changes",
        problems,
        format!("perf stat -a -I 100 --no-scale -e {raw} across a move to {target}, a park and a placement: {lines} intervals add up to {sum} = what landed; 0 violations"),
    ))
}

/// Its checks, in order.
pub(super) const CHECKS: &[Named] = &[
    (
        "allowed-attack: change racing offline",
        change_racing_offline_of_target,
    ),
    ("allowed-attack: malformed sets refused", malformed_sets),
    (
        "allowed-attack: back-to-back changes, last wins",
        back_to_back_last_wins,
    ),
    ("allowed-attack: RESET racing a change", reset_racing_change),
    ("allowed-attack: opens racing changes", opens_racing_changes),
    ("allowed-attack: reload after changes", reload_after_changes),
    (
        "allowed-attack: change racing the old owner's offline",
        change_racing_offline_of_owner,
    ),
    (
        "allowed-attack: perf stat -I across changes",
        perf_stat_intervals_across_changes,
    ),
];

/// Runs each of `checks` (of [`CHECKS`]); whatever it did, the domain's
/// set is restored and every CPU is online again before the next, so one
/// broken attack never hides the others' verdicts.
pub(super) fn run_these(ctx: &mut Ctx, checks: &[Named]) -> Result<Vec<Check>> {
    let (d, allowed) = movable_domain(ctx)?;
    let mut out = Vec::new();
    for &(name, check) in checks {
        let result = check(ctx);
        every_cpu_back(ctx, name, result.as_ref().err())?;
        set_allowed(ctx, d, &allowed)?;
        let mut problems = Vec::new();
        expect_settled(ctx, d, Some(&allowed), "restoring the set", &mut problems)?;
        out.push(match result {
            Ok(mut c) if !problems.is_empty() => {
                c.passed = false;
                c.detail = format!("{}; {}", c.detail, problems.join("; "));
                c
            }
            Ok(c) => c,
            Err(e) => Check::from_problems(
                name,
                vec![format!("could not finish: {e:#}")],
                String::new(),
            ),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_add_up_and_not_counted_is_nothing() {
        let spec = "perfbed_l3_1/event=0x02,rmid=6/";
        let out = format!(
            "     0.100,1048576,,{spec},100,100.00,,\n     0.200,<not counted>,,{spec},0,0.00,,\n     0.300,2097152,,{spec},100,100.00,,\nother line\n"
        );
        assert_eq!(interval_sum(&out, spec).unwrap(), (3 * MIB, 3));
        assert!(interval_sum(&format!("0.1,x,,{spec},1"), spec).is_err());
    }

    #[test]
    fn settled_tells_placed_from_parked_and_outside() {
        assert!(settled(&[3], Some(&[2, 3])));
        assert!(!settled(&[1], Some(&[2, 3])));
        assert!(!settled(&[], Some(&[2, 3])));
        assert!(settled(&[], None));
        assert!(!settled(&[2], None));
    }

    #[test]
    fn a_wrong_count_or_stopped_time_is_named() {
        let mut p = Vec::new();
        judge_read("x", &[5, 10, 10], 5, &mut p);
        assert!(p.is_empty());
        judge_read("x", &[4, 10, 9], 5, &mut p);
        assert_eq!(p.len(), 2, "{p:?}");
    }
}
