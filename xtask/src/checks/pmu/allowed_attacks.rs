//! The red-team attacks on allowed sets changed at run time that stay in
//! Rust (written from the promise alone, as the rest of them, which are
//! scenarios: `scenarios/allowed`):
//!
//! - perfbed.ko unloaded and loaded again with the set changed while it
//!   was gone: placed by the set the device has now, parked by an empty
//!   one (in Rust: a scenario cannot reload the module);
//! - the real `perf stat -I` across a move, a park and a placement made by
//!   changes: its intervals add up to what landed (in Rust: a scenario has
//!   no job that runs across its lines).
//!
//! Every traffic burst lands (`wait_landed`) while the PMU is settled, so
//! every expected count is exact. Each attack restores the domain's set and
//! brings every CPU back online, whatever happened.

use std::time::Duration;

use anyhow::{bail, Result};
use perfbed_agent::{AgentMessage, HostRequest, JobResult, JobSpec};
use perfbed_device::regs::Event;

use super::context::{
    every_cpu_back, inject, open_with, owner, rmid, truth, Ctx, Named, MIB, TIMES,
};
use super::moves::movable_domain;
use crate::checks::Check;
use crate::guest::{pmu_name, MODULE};

/// Sets domain `d`'s allowed CPUs from the host.
fn set_allowed(ctx: &mut Ctx, d: usize, cpus: &[u32]) -> Result<()> {
    ctx.control
        .set_allowed(d as u32, cpus)
        .map_err(|e| anyhow::anyhow!("allowed set {cpus:?} for domain {d}: {e}"))
}

/// Where a PMU must end up for a settled change: on one CPU of `want`
/// (`Some`), or parked (`None`).
fn settled(mask: &[u32], want: Option<&[u32]>) -> bool {
    match (mask, want) {
        ([], None) => true,
        ([cpu], Some(set)) => set.contains(cpu),
        _ => false,
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

/// Waits until the change settled ([`settled`]), 30 s at most (far above
/// the tens of milliseconds it takes under TCG on a loaded machine, so a
/// miss means it never happened); a miss is a problem naming `what`. The
/// mask seen last.
fn expect_settled(
    ctx: &mut Ctx,
    d: usize,
    want: Option<&[u32]>,
    what: &str,
    problems: &mut Vec<String>,
) -> Result<Vec<u32>> {
    let (ok, mask) = ctx.g.wait_cpumask(&pmu_name(d), |m| settled(m, want))?;
    if !ok {
        problems.push(format!(
            "{what}: cpumask {mask:?} after 30 s (want {})",
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

/// The CPU of `allowed` that is not `cpu`.
fn other(allowed: &[u32], cpu: u32) -> u32 {
    allowed.iter().copied().find(|&c| c != cpu).unwrap_or(cpu)
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
    let h = open_with(ctx, d, r, TIMES, 0, None)?;
    let start = truth(ctx, d, r)?;
    inject(ctx, d, r, MIB)?;
    let w = ctx.g.read(h)?;
    let landed = truth(ctx, d, r)? - start;
    judge_read("after reload", &w, landed, &mut problems);
    ctx.g.close(h)?;
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
    ("allowed-attack: reload after changes", reload_after_changes),
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
