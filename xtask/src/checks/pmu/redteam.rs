//! The helpers the adversarial checks in Rust share (`must`, `open_with`,
//! `Many`, `truth`, `run_each`). Its own check, the ioctls a counting event
//! has no use for, is `scenarios/ioctls/ioctls-that-change-no-count.scn`.

use anyhow::{bail, Context, Result};
use perfbed_agent::PerfIoctl;
use perfbed_device::regs::Event;

use super::context::Ctx;
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
