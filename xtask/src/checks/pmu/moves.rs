//! Counts across CPUs going: the owner CPU moving while traffic flows, and a
//! whole domain parked and back.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use perfbed_device::regs::whole_units;
use perfbed_device::regs::Event;

use super::context::{Ctx, MIB};
use crate::checks::Check;
use crate::guest::{pmu_name, Opened};

/// The first domain of `domains` with two CPUs or more, none of them CPU
/// 0 (which cannot go offline): its owner can move and it can park.
pub fn movable_in(domains: &[Vec<u32>]) -> Option<usize> {
    domains
        .iter()
        .position(|cpus| cpus.len() >= 2 && !cpus.contains(&0))
}

/// The domain whose CPUs can all go offline (CPU 0 cannot) and its set.
pub fn movable_domain(ctx: &Ctx) -> Result<(usize, Vec<u32>)> {
    match movable_in(&ctx.device.domains) {
        Some(d) => Ok((d, ctx.device.domains[d].clone())),
        None => bail!(
            "no domain with two CPUs besides CPU 0 to take offline (domains {:?})",
            ctx.device.domains
        ),
    }
}

/// Steady traffic that flows while CPUs move: 64 MiB/s, so that a move
/// (tens of milliseconds under TCG) always has some land while it is under way.
const MOVING_RATE: u64 = 64 * MIB;

/// 3. The owner CPU goes while traffic flows: `cpumask` moves inside the
///    set, the count is exactly the traffic that landed while the event was
///    open, and the device saw no placement violation.
pub fn migration(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let h = ctx.open(d, Event::MbmTotalBytes, 2)?;
    let start = Ctx::truth(&ctx.control.state()?, d, 2, Event::MbmTotalBytes);
    ctx.inject_and_land(&[(d, 2, Event::MbmTotalBytes, 3 * MIB)])?;
    let before = ctx.g.cpumask(&pmu_name(d))?;
    let owner = *before.first().unwrap_or(&allowed[0]);
    ctx.control
        .set_rate(d as u32, 2, Event::MbmTotalBytes, MOVING_RATE)?;
    ctx.g.set_online(owner, false)?;
    let after = ctx.g.cpumask(&pmu_name(d))?;
    ctx.g.set_online(owner, true)?;
    ctx.control.set_rate(d as u32, 2, Event::MbmTotalBytes, 0)?;
    ctx.inject_and_land(&[(d, 2, Event::MbmTotalBytes, 7 * MIB + 64)])?;
    let got = ctx.count(h)?;
    ctx.g.close(h)?;
    let state = ctx.control.state()?;
    let truth = whole_units(
        Ctx::truth(&state, d, 2, Event::MbmTotalBytes) - start,
        ctx.device.unit_bytes,
    );
    let violations: u64 = state.domains.iter().map(|dom| dom.violations).sum();
    let mut problems = Vec::new();
    if after.len() != 1 || after == before || !allowed.contains(&after[0]) {
        problems.push(format!(
            "cpumask {before:?} → {after:?} after CPU {owner} went offline (allowed {allowed:?})"
        ));
    }
    if got != truth {
        problems.push(format!("counted {got} across the move and back, the device's truth is {truth} (in whole units)"));
    }
    if violations != 0 {
        let by: BTreeMap<usize, &BTreeMap<u32, u64>> = state
            .domains
            .iter()
            .enumerate()
            .map(|(i, dom)| (i, &dom.violations_by_vcpu))
            .collect();
        problems.push(format!(
            "the device counted {violations} placement violations: {by:?}"
        ));
    }
    Ok(Check::from_problems(
        "migration",
        problems,
        format!(
            "{}: CPU {owner} offline and back under {} MiB/s moved it {before:?} → {after:?}; counted {got} = the truth; 0 placement violations",
            pmu_name(d),
            MOVING_RATE / MIB
        ),
    ))
}

/// 4. A domain's CPUs all go: new opens get ENODEV, an open event stays
///    open and counts on in the device; one CPU comes back: opens work
///    again, and the open event has caught up with what landed meanwhile.
pub fn parking(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let kept = ctx.open(d, Event::MbmTotalBytes, 4)?;
    let start = Ctx::truth(&ctx.control.state()?, d, 4, Event::MbmTotalBytes);
    ctx.inject_and_land(&[(d, 4, Event::MbmTotalBytes, MIB)])?;
    ctx.control
        .set_rate(d as u32, 4, Event::MbmTotalBytes, MOVING_RATE)?;
    for &cpu in &allowed {
        ctx.g.set_online(cpu, false)?;
    }
    ctx.control.set_rate(d as u32, 4, Event::MbmTotalBytes, 0)?;
    let mask = ctx.g.cpumask(&pmu_name(d))?;
    let refused = ctx.g.open(ctx.attr(d, Event::MbmTotalBytes, 4), None)?;
    let parked_value = ctx.count(kept)?;
    ctx.inject_and_land(&[(d, 4, Event::MbmTotalBytes, 5 * MIB)])?;
    let parked_state = ctx.control.state()?;
    let parked_truth = whole_units(
        Ctx::truth(&parked_state, d, 4, Event::MbmTotalBytes) - start,
        ctx.device.unit_bytes,
    );
    ctx.g.set_online(allowed[0], true)?;
    let back = ctx.g.cpumask(&pmu_name(d))?;
    let returned_value = ctx.count(kept)?;
    let reopened: Opened = ctx.g.open(ctx.attr(d, Event::MbmTotalBytes, 4), None)?;
    let mut fresh = None;
    if let Ok(h) = reopened {
        ctx.inject_and_land(&[(d, 4, Event::MbmTotalBytes, 2 * MIB)])?;
        fresh = Some(ctx.count(h)?);
        ctx.g.close(h)?;
    }
    for &cpu in &allowed[1..] {
        ctx.g.set_online(cpu, true)?;
    }
    let final_value = ctx.count(kept)?;
    ctx.g.close(kept)?;
    let final_state = ctx.control.state()?;
    let final_truth = whole_units(
        Ctx::truth(&final_state, d, 4, Event::MbmTotalBytes) - start,
        ctx.device.unit_bytes,
    );
    let mut problems = Vec::new();
    if !mask.is_empty() || refused != Err("ENODEV".into()) {
        problems.push(format!("with CPUs {allowed:?} offline: cpumask {mask:?}, open gave {refused:?} (want empty, ENODEV)"));
    }
    // While parked nobody can read the device: the count may lag, never lead.
    if parked_value > parked_truth {
        problems.push(format!("the open event read {parked_value} while parked, more than the {parked_truth} that landed"));
    }
    if back != [allowed[0]] || fresh != Some(2 * MIB) {
        problems.push(format!(
            "after CPU {} returned: cpumask {back:?}, a new event counted {fresh:?} of {}",
            allowed[0],
            2 * MIB
        ));
    }
    if returned_value != parked_truth || final_value != final_truth {
        problems.push(format!(
            "the event open across the park read {returned_value} on return (truth {parked_truth}) and {final_value} at the end (truth {final_truth})"
        ));
    }
    Ok(Check::from_problems(
        "parking",
        problems,
        format!(
            "{} parked with CPUs {allowed:?} offline (open: ENODEV); the event open across it caught up on return ({returned_value} = truth, traffic landed while parked included) and ended at {final_value} = truth",
            pmu_name(d)
        ),
    ))
}
