//! Overflow interrupts while an event is reset and while one is disabled:
//! bursts big enough that each crosses the driver's interrupt threshold (an
//! eighth of a wrap) on an event that is reset and one that is disabled and
//! enabled again; the interrupts handled meanwhile must not make either
//! count anything but its windows, exactly. It stays in Rust because it
//! also counts the interrupts taken on the owner (`irqs_on_owner`), which
//! no scenario line reads. (Allowed sets that change at run time are
//! `scenarios/allowed/`, "allowed sets" the first of them.)
//!
//! `set_allowed` sets a domain's allowed set for the checks in Rust that
//! change sets.

use anyhow::Result;
use perfbed_agent::PerfIoctl;
use perfbed_device::regs::Event;

use super::context::{must, Ctx, MIB};
use super::interrupts::counter_file;
use super::moves::movable_domain;
use crate::checks::Check;
use crate::guest::pmu_name;

/// The RMID of the check's events.
const RMID: u32 = 7;

/// Bigger than the driver's interrupt threshold (an eighth of a wrap of a
/// 24-bit counter of 64-byte units: 128 MiB) and well below a wrap.
const BURST: u64 = 300 * MIB;

/// Overflow interrupts while an event is reset and while one is disabled.
pub fn with_reset_and_disable(ctx: &mut Ctx) -> Result<Check> {
    let (d, _) = movable_domain(ctx)?;
    let pmu = pmu_name(d);
    let rmid = RMID;
    let on_before = counter_file(ctx, &pmu, "irqs_on_owner")?;
    let violations_before = ctx.control.state()?.domains[d].violations;
    let reset = ctx.open(d, Event::MbmTotalBytes, rmid)?;
    let toggled = ctx.open(d, Event::MbmTotalBytes, rmid)?;
    let all = ctx.open(d, Event::MbmTotalBytes, rmid)?;
    let burst =
        |ctx: &mut Ctx, bytes: u64| ctx.inject_and_land(&[(d, rmid, Event::MbmTotalBytes, bytes)]);
    burst(ctx, BURST)?;
    must(ctx, reset, PerfIoctl::Reset { group: false })?;
    burst(ctx, BURST + 64)?;
    must(ctx, toggled, PerfIoctl::Disable { group: false })?;
    burst(ctx, BURST + 128)?;
    must(ctx, reset, PerfIoctl::Reset { group: false })?;
    must(ctx, toggled, PerfIoctl::Enable { group: false })?;
    burst(ctx, BURST + 192)?;
    let counts = [ctx.count(reset)?, ctx.count(toggled)?, ctx.count(all)?];
    for h in [reset, toggled, all] {
        ctx.g.close(h)?;
    }
    let on_owner = counter_file(ctx, &pmu, "irqs_on_owner")? - on_before;
    let violations = ctx.control.state()?.domains[d].violations - violations_before;
    let want = [BURST + 192, 3 * BURST + 256, 4 * BURST + 384];
    let mut problems = Vec::new();
    for ((name, got), want) in ["reset twice", "disabled for a burst", "open throughout"]
        .iter()
        .zip(counts)
        .zip(want)
    {
        if got != want {
            problems.push(format!("the event {name} counted {got}, want {want}"));
        }
    }
    if on_owner < 4 {
        problems.push(format!("only {on_owner} overflow interrupts handled on the owner for 4 bursts over the threshold"));
    }
    if violations != 0 {
        problems.push(format!(
            "the device counted {violations} placement violations in the domain"
        ));
    }
    Ok(Check::from_problems(
        "interrupts with RESET and DISABLE",
        problems,
        format!(
            "{pmu}: 4 bursts of ~{} MiB, each over the interrupt threshold, {on_owner} interrupts handled on the owner; an event reset twice, one disabled for a burst and one open throughout counted {counts:?} = exactly their windows; 0 placement violations",
            BURST / MIB
        ),
    ))
}

/// Sets domain `d`'s allowed CPUs from the host.
pub(super) fn set_allowed(ctx: &mut Ctx, d: usize, cpus: &[u32]) -> Result<()> {
    ctx.control
        .set_allowed(d as u32, cpus)
        .map_err(|e| anyhow::anyhow!("allowed set {cpus:?} for domain {d}: {e}"))
}
