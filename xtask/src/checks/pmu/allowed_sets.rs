//! Allowed sets that change while the guest runs (`perfbed ctl allowed`):
//! the device raises its configuration interrupt, the driver re-reads
//! `DOM_ALLOWED_CPUS` and asks the perf core to place the PMU again
//! (`perf_pmu_update_allowed_cpus()`, patch 0041). With traffic flowing and
//! an event open, on the movable domain:
//!
//! - a set that grows keeps the PMU where it is;
//! - a set without the owner moves the PMU to a CPU of the new set;
//! - an empty set parks it (new opens get `ENODEV`);
//! - the original set places it again;
//!
//! each time `cpumask` and `/proc/irq/N/smp_affinity_list` follow (while
//! parked the line points outside the new set), the open event counts
//! exactly the device's truth at the end, and the device counted 0
//! placement violations. The original set is restored whatever happens.
//!
//! A core that does not re-evaluate placement (the kernel mutant
//! `update-allowed-does-nothing`) leaves `cpumask` on a CPU the device no
//! longer allows, and the check says so.
//!
//! The second check, "interrupts with RESET and DISABLE", runs bursts big
//! enough that each crosses the driver's interrupt threshold (an eighth of a
//! wrap) on an event that is reset and one that is disabled and enabled
//! again: the overflow interrupts handled meanwhile must not make either
//! count anything but its windows, exactly.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use perfbed_agent::PerfIoctl;
use perfbed_device::cpus::{format_cpu_list, parse_cpu_list};
use perfbed_device::regs::{whole_units, Event};

use super::context::{Ctx, MIB, TIMES};
use super::interrupts::{counter_file, irq_counts};
use super::moves::movable_domain;
use super::redteam::{must, open_with};
use crate::checks::Check;
use crate::guest::pmu_name;

/// Steady traffic while the sets change: a change's re-placement (an
/// interrupt, a work, a move) always has some land while it is under way.
const RATE: u64 = 32 * MIB;
const RMID: u32 = 6;
/// How long a re-placement may take on a loaded TCG host.
const PLACEMENT_TIMEOUT: Duration = Duration::from_secs(20);
/// Traffic flows this long in each placement.
const PHASE: Duration = Duration::from_millis(300);

/// One allowed set and where the PMU ended up.
struct Step {
    what: String,
    allowed: Vec<u32>,
    cpumask: Vec<u32>,
    affinity: Vec<u32>,
    /// What a new open gave there: `None` when it opened.
    open_error: Option<String>,
}

/// What each step must look like; pure, for the unit tests. `before` is
/// the owner before the step.
fn judge(pmu: &str, irq: Option<u32>, step: &Step, before: &[u32]) -> Vec<String> {
    let mut problems = Vec::new();
    let what = &step.what;
    let allowed = format_cpu_list(&step.allowed);
    match step.cpumask.as_slice() {
        [] if step.allowed.is_empty() => {
            if step.open_error.as_deref() != Some("ENODEV") {
                problems.push(format!("{what}: parked, but a new open gave {:?} (want ENODEV)", step.open_error));
            }
        }
        [] => problems.push(format!("{what}: {pmu} is parked although CPUs {allowed} are allowed")),
        [cpu] if !step.allowed.contains(cpu) => problems.push(format!(
            "{what}: {pmu}'s cpumask is {cpu}, which the device no longer allows (allowed {allowed}): the perf core did not place the PMU again"
        )),
        [cpu] => {
            if before.len() == 1 && step.allowed.contains(&before[0]) && before != [*cpu] {
                problems.push(format!("{what}: {pmu} moved {} → {cpu} although its CPU stayed allowed", before[0]));
            }
            if step.open_error.is_some() {
                problems.push(format!("{what}: placed on CPU {cpu}, but a new open gave {:?}", step.open_error));
            }
        }
        more => problems.push(format!("{what}: cpumask {more:?} is not one CPU")),
    }
    if let Some(irq) = irq {
        match step.cpumask.as_slice() {
            [cpu] if step.affinity != [*cpu] => problems.push(format!(
                "{what}: /proc/irq/{irq}/smp_affinity_list is {} but cpumask is {cpu}: the interrupt did not follow the PMU",
                format_cpu_list(&step.affinity)
            )),
            [] if step.affinity.iter().any(|c| step.allowed.contains(c)) || step.affinity.is_empty() => problems.push(format!(
                "{what}: parked, but /proc/irq/{irq}/smp_affinity_list is {} (want online CPUs outside {allowed})",
                format_cpu_list(&step.affinity)
            )),
            _ => {}
        }
    }
    problems
}

/// Waits until `pmu`'s cpumask says the change to `allowed` was acted on:
/// one CPU of the set, or parked if it is empty. Returns what it last read
/// (the caller judges it), at the latest after [`PLACEMENT_TIMEOUT`].
fn settle(ctx: &mut Ctx, pmu: &str, allowed: &[u32]) -> Result<Vec<u32>> {
    let start = Instant::now();
    loop {
        let mask = ctx.g.cpumask(pmu)?;
        let placed = match mask.as_slice() {
            [] => allowed.is_empty(),
            [cpu] => allowed.contains(cpu),
            _ => false,
        };
        if placed || start.elapsed() > PLACEMENT_TIMEOUT {
            return Ok(mask);
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A CPU outside the domain to grow its set with (CPU 0 is always online).
fn outsider(allowed: &[u32]) -> u32 {
    (0..).find(|c| !allowed.contains(c)).unwrap_or(0)
}

/// Changes the movable domain's set: grow, move, park, back.
pub fn changes(ctx: &mut Ctx) -> Result<Check> {
    let (d, original) = movable_domain(ctx)?;
    let result = run_changes(ctx, d, &original);
    // Whatever happened, the domain gets its set back for the checks after.
    let restored = ctx
        .control
        .set_allowed(d as u32, &original)
        .map_err(anyhow::Error::from)
        .and_then(|()| settle(ctx, &pmu_name(d), &original));
    ctx.control
        .set_rate(d as u32, RMID, Event::MbmTotalBytes, 0)?;
    let check = result?;
    let mask = restored?;
    if !matches!(mask.as_slice(), [cpu] if original.contains(cpu)) {
        bail!(
            "{}: cpumask {mask:?} after restoring the allowed set {original:?}",
            pmu_name(d)
        );
    }
    Ok(check)
}

fn run_changes(ctx: &mut Ctx, d: usize, original: &[u32]) -> Result<Check> {
    let pmu = pmu_name(d);
    let irq = irq_counts(&ctx.g.read_file("/proc/interrupts")?, &pmu).map(|(irq, _)| irq);
    let state = ctx.control.state()?;
    let violations_before = state.domains[d].violations;
    let start = Ctx::truth(&state, d, RMID, Event::MbmTotalBytes);
    let lost_before = counter_file(ctx, &pmu, "lost_wraps")?;
    let h = open_with(ctx, d, RMID, TIMES, 0, None)?;
    let opened = ctx.g.read(h)?;
    ctx.control
        .set_rate(d as u32, RMID, Event::MbmTotalBytes, RATE)?;
    let first = ctx.g.cpumask(&pmu)?;
    let Some(&owner) = first.first() else {
        bail!("{pmu} is parked before the check (allowed {original:?})")
    };

    let mut grown = original.to_vec();
    grown.push(outsider(original));
    grown.sort_unstable();
    let without_owner: Vec<u32> = original.iter().copied().filter(|&c| c != owner).collect();
    let sets = [
        ("a set that grows", grown),
        ("a set without the owner (a move)", without_owner),
        ("an empty set (a park)", Vec::new()),
        ("the original set (placed again)", original.to_vec()),
    ];
    let mut problems = Vec::new();
    let mut path = vec![format_cpu_list(&first)];
    let mut before = first;
    for (what, allowed) in sets {
        ctx.control.set_allowed(d as u32, &allowed)?;
        let cpumask = settle(ctx, &pmu, &allowed)?;
        let affinity = match irq {
            Some(irq) => {
                let file = format!("/proc/irq/{irq}/smp_affinity_list");
                parse_cpu_list(ctx.g.read_file(&file)?.trim()).with_context(|| file.clone())?
            }
            None => Vec::new(),
        };
        let open_error = match ctx
            .g
            .open(ctx.attr(d, Event::MbmTotalBytes, RMID + 1), None)?
        {
            Ok(other) => {
                ctx.g.close(other)?;
                None
            }
            Err(errno) => Some(errno),
        };
        ctx.inject_and_land(&[(d, RMID, Event::MbmTotalBytes, 3 * MIB + 64)])?;
        thread::sleep(PHASE);
        let step = Step {
            what: format!(
                "{what}, {}",
                if allowed.is_empty() {
                    "none".into()
                } else {
                    format_cpu_list(&allowed)
                }
            ),
            allowed,
            cpumask,
            affinity,
            open_error,
        };
        problems.extend(judge(&pmu, irq, &step, &before));
        path.push(if step.cpumask.is_empty() {
            "parked".into()
        } else {
            format_cpu_list(&step.cpumask)
        });
        before = step.cpumask;
    }
    ctx.control
        .set_rate(d as u32, RMID, Event::MbmTotalBytes, 0)?;
    let end = ctx.g.read(h)?;
    let got = end[0].wrapping_sub(opened[0]);
    ctx.g.close(h)?;
    let state = ctx.control.state()?;
    let truth = whole_units(
        Ctx::truth(&state, d, RMID, Event::MbmTotalBytes) - start,
        ctx.device.unit_bytes,
    );
    let violations = state.domains[d].violations - violations_before;
    let lost = counter_file(ctx, &pmu, "lost_wraps")? - lost_before;
    // The park lasts a phase, past its deadline: exact up to it.
    if let Some(problem) = ctx.judge_park_cut(&opened, &end, truth, RATE, 3 * MIB + 64, None) {
        problems.push(format!("across the changes: {problem}"));
    }
    if violations != 0 {
        problems.push(format!(
            "the device counted {violations} placement violations in the domain: {:?}",
            state.domains[d].violations_by_vcpu
        ));
    }
    if lost != 0 {
        problems.push(format!("{lost} lost wraps (lost_wraps) during the changes"));
    }
    Ok(Check::from_problems(
        "allowed sets",
        problems,
        format!(
            "{pmu} under {} MiB/s, allowed {} → grown → without CPU {owner} → none → back: cpumask {}; interrupt affinity followed; opens ENODEV while parked; counted {got} of {truth} (exact up to the park's deadline); 0 placement violations",
            RATE / MIB,
            format_cpu_list(original),
            path.join(" → ")
        ),
    ))
}

/// Bigger than the driver's interrupt threshold (an eighth of a wrap of a
/// 24-bit counter of 64-byte units: 128 MiB) and well below a wrap.
const BURST: u64 = 300 * MIB;

/// Overflow interrupts while an event is reset and while one is disabled.
pub fn with_reset_and_disable(ctx: &mut Ctx) -> Result<Check> {
    let (d, _) = movable_domain(ctx)?;
    let pmu = pmu_name(d);
    let rmid = RMID + 1;
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

/// Polls domain `d`'s `cpumask` until `ok` holds of it
/// ([`crate::guest::Guest::wait_cpumask`]).
pub(super) fn wait_mask(
    ctx: &mut Ctx,
    d: usize,
    ok: impl Fn(&[u32]) -> bool,
) -> Result<(bool, Vec<u32>)> {
    ctx.g.wait_cpumask(&pmu_name(d), ok)
}

/// Sets domain `d`'s allowed CPUs from the host.
pub(super) fn set_allowed(ctx: &mut Ctx, d: usize, cpus: &[u32]) -> Result<()> {
    ctx.control
        .set_allowed(d as u32, cpus)
        .map_err(|e| anyhow::anyhow!("allowed set {cpus:?} for domain {d}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(allowed: &[u32], cpumask: &[u32], affinity: &[u32], open_error: Option<&str>) -> Step {
        Step {
            what: "s".into(),
            allowed: allowed.to_vec(),
            cpumask: cpumask.to_vec(),
            affinity: affinity.to_vec(),
            open_error: open_error.map(String::from),
        }
    }

    /// The verdict on a move from CPU 2 to a step with a line (IRQ 14).
    fn from_2(allowed: &[u32], cpumask: &[u32], affinity: &[u32]) -> Vec<String> {
        judge(
            "perfbed_l3_1",
            Some(14),
            &step(allowed, cpumask, affinity, None),
            &[2],
        )
    }

    #[test]
    fn a_pmu_left_on_a_cpu_no_longer_allowed_is_named() {
        let stuck = from_2(&[3], &[2], &[2]);
        assert!(
            stuck
                .iter()
                .any(|p| p.contains("did not place the PMU again")),
            "{stuck:?}"
        );
        let moved = from_2(&[3], &[3], &[3]);
        assert!(moved.is_empty(), "{moved:?}");
        let behind = from_2(&[3], &[3], &[2]);
        assert!(
            behind.iter().any(|p| p.contains("did not follow")),
            "{behind:?}"
        );
    }

    #[test]
    fn parks_and_needless_moves_are_judged() {
        assert!(judge(
            "p",
            Some(14),
            &step(&[], &[], &[0, 1], Some("ENODEV")),
            &[3]
        )
        .is_empty());
        assert!(
            !judge("p", Some(14), &step(&[], &[], &[0, 1], None), &[3]).is_empty(),
            "an open while parked"
        );
        assert!(
            !judge(
                "p",
                Some(14),
                &step(&[2, 3], &[], &[0], Some("ENODEV")),
                &[3]
            )
            .is_empty(),
            "parked with CPUs allowed"
        );
        let needless = judge("p", None, &step(&[1, 2, 3], &[2], &[], None), &[3]);
        assert!(
            needless.iter().any(|p| p.contains("stayed allowed")),
            "{needless:?}"
        );
    }

    #[test]
    fn the_grown_set_takes_a_cpu_outside() {
        assert_eq!(outsider(&[0, 1]), 2);
        assert_eq!(outsider(&[2, 3]), 0);
    }
}
