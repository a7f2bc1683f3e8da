//! Adversarial checks of the counting semantics (docs/counting-semantics.md,
//! DESIGN.md "Counting semantics"): operation sequences a perf user can issue
//! that the other checks do not, each judged against the written promise and
//! the device's truth. Every traffic burst is injected and landed between two
//! operations, so each expected count is exact, not a rate estimate (the
//! attacks the counting model can judge are scenarios, `scenarios/`):
//!
//! REFRESH/PERIOD/SET_FILTER/SET_OUTPUT on a counting event: refused or
//! harmless, the count stays exact and the event stays enabled. It stays in
//! Rust because the scenario format has none of those ioctls. The file
//! also holds the helpers the attacks in Rust share (`must`, `open_with`,
//! `Many`, `truth`, `run_each`).

use anyhow::{bail, Context, Result};
use perfbed_agent::PerfIoctl;
use perfbed_device::regs::Event;

use super::context::{Ctx, MIB};
use super::moves::movable_domain;
use crate::checks::Check;
use crate::guest::pmu_name;

pub(super) fn must(ctx: &mut Ctx, handle: u32, ioctl: PerfIoctl) -> Result<()> {
    let name = format!("{ioctl:?}");
    match ctx.g.ioctl(handle, ioctl)? {
        Ok(_) => Ok(()),
        Err(errno) => bail!("ioctl {name} on handle {handle}: {errno}"),
    }
}

pub(super) fn open_with(
    ctx: &mut Ctx,
    d: usize,
    rmid: u32,
    read_format: u64,
    flags: u64,
    group: Option<u32>,
) -> Result<u32> {
    let mut attr = ctx.attr(d, Event::MbmTotalBytes, rmid);
    attr.read_format = read_format;
    attr.flags = flags;
    match ctx.g.open(attr, group)? {
        Ok(h) => Ok(h),
        Err(errno) => bail!(
            "opening {}/mbm_total_bytes,rmid={rmid}/ (group {group:?}): {errno}",
            pmu_name(d)
        ),
    }
}

/// RMID `n` of the device (RMIDs wrap at the device's count: the default
/// device has 8). Each check measures from its own open, so two checks may
/// share an RMID; within a check the RMIDs are distinct.
pub(super) fn rmid(ctx: &Ctx, n: u32) -> u32 {
    n % ctx.device.rmids
}

pub(super) fn truth(ctx: &mut Ctx, d: usize, rmid: u32) -> Result<u64> {
    Ok(Ctx::truth(
        &ctx.control.state()?,
        d,
        rmid,
        Event::MbmTotalBytes,
    ))
}

pub(super) fn inject(ctx: &mut Ctx, d: usize, rmid: u32, bytes: u64) -> Result<()> {
    ctx.inject_and_land(&[(d, rmid, Event::MbmTotalBytes, bytes)])
}

/// The shortest park the contract lets a driver leave out of
/// `time_running` even when no wrap landed: half a wrap's time at the
/// The CPU the PMU of domain `d` counts on now, from its `cpumask`; an
/// error if it is parked (a check that means to move it must not guess).
pub(super) fn owner(ctx: &mut Ctx, d: usize) -> Result<u32> {
    ctx.g
        .cpumask(&pmu_name(d))?
        .first()
        .copied()
        .context("the PMU is parked")
}

pub(super) fn park(ctx: &mut Ctx, allowed: &[u32], online: bool) -> Result<()> {
    for &cpu in allowed {
        ctx.g.set_online(cpu, online)?;
    }
    Ok(())
}

/// F. The ioctls a counting event cannot honour (REFRESH, PERIOD,
///    SET_FILTER, SET_BPF, MODIFY_ATTRIBUTES) and the harmless ones
///    (SET_OUTPUT to none, ID, PAUSE_OUTPUT, QUERY_BPF): each refused or
///    harmless, with 1 MiB landing after each; the event
///    stays enabled and its count exact, and a DISABLE still stops it.
pub fn odd_ioctls(ctx: &mut Ctx) -> Result<Check> {
    let (d, _) = movable_domain(ctx)?;
    let rmid = rmid(ctx, 13);
    let h = open_with(ctx, d, rmid, 0, 0, None)?;
    inject(ctx, d, rmid, MIB)?;
    let mut answers = Vec::new();
    for io in [
        PerfIoctl::Refresh { count: 1 },
        PerfIoctl::Period { period: 1000 },
        PerfIoctl::SetFilter {
            filter: "filter 0x0/0x1000".into(),
        },
        PerfIoctl::SetOutput { target: None },
        PerfIoctl::Refresh { count: 0 },
        PerfIoctl::Id,
        PerfIoctl::PauseOutput { pause: true },
        PerfIoctl::PauseOutput { pause: false },
        PerfIoctl::SetBpf { fd: -1 },
        PerfIoctl::QueryBpf,
        PerfIoctl::ModifyAttributes {
            attr: ctx.attr(d, Event::MbmTotalBytes, rmid),
        },
    ] {
        let name = format!("{io:?}");
        answers.push((name, ctx.g.ioctl(h, io)?));
        inject(ctx, d, rmid, MIB)?;
    }
    let mid = ctx.count(h)?;
    must(ctx, h, PerfIoctl::Disable { group: false })?;
    inject(ctx, d, rmid, 4 * MIB)?;
    let end = ctx.count(h)?;
    ctx.g.close(h)?;
    let mut problems = Vec::new();
    let want = (1 + answers.len() as u64) * MIB;
    if mid != want || end != want {
        problems.push(format!("after {answers:?} with 1 MiB after each: counted {mid} then {end} after DISABLE and 4 MiB, want {want} both"));
    }
    Ok(Check::from_problems(
        "redteam: odd ioctls",
        problems,
        format!("{}: {answers:?}; count exact ({mid})", pmu_name(d)),
    ))
}

/// Its checks, in order.
pub(super) const CHECKS: &[Named] = &[("redteam: odd ioctls", odd_ioctls)];

/// A check and its name, for [`run_each`].
pub(super) type Named = (&'static str, fn(&mut Ctx) -> Result<Check>);

/// Runs each check; an error becomes that check's FAIL (after every CPU of
/// the device is brought back online), so one broken attack never hides
/// the verdicts of the others.
pub(super) fn run_each(ctx: &mut Ctx, checks: &[Named]) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    for &(name, check) in checks {
        match check(ctx) {
            Ok(c) => out.push(c),
            Err(e) => {
                let cpus: Vec<u32> = ctx
                    .device
                    .domains
                    .iter()
                    .flatten()
                    .copied()
                    .filter(|&c| c != 0)
                    .collect();
                for cpu in cpus {
                    // If the guest is gone, say why the check stopped too.
                    ctx.g.set_online(cpu, true).with_context(|| {
                        format!("bringing CPU {cpu} back online after \"{name}\" could not finish: {e:#}")
                    })?;
                }
                out.push(Check::from_problems(
                    name,
                    vec![format!("could not finish: {e:#}")],
                    String::new(),
                ));
            }
        }
    }
    Ok(out)
}
