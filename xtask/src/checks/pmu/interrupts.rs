//! The device's overflow interrupt follows the PMU: under a rate that
//! makes the counters wrap, every interrupt of the domain's line is taken
//! on the CPU that owns the domain, across a move and a park and back;
//! `/proc/irq/N/smp_affinity_list` is the PMU's `cpumask` whenever it is
//! placed (and outside the domain's CPUs while it is parked); the count is
//! exact and the device saw no placement violation (a status read off the
//! owner would be one).
//!
//! x86 moves an IOAPIC edge interrupt when its next interrupt is
//! acknowledged on the old target, so after each change of placement one
//! interrupt may still land on the CPU the line pointed at before (the
//! driver counts it in `irqs_off_owner` and leaves it to the owner's poll):
//! each placement allows that one, no more.
//!
//! A failure names what broke: an affinity that stayed behind (the driver
//! does not move the interrupt in `migrate_cpu`), interrupts counted on a
//! CPU that was not the owner (by the kernel in `/proc/interrupts`, by the
//! driver in its `irqs_off_owner` file), or no interrupt at all.

use std::collections::BTreeMap;
use std::thread;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use perfbed_device::cpus::{format_cpu_list, parse_cpu_list};
use perfbed_device::regs::{whole_units, Event};
use perfbed_device::DeviceState;

use super::context::{Ctx, MIB};
use super::moves::movable_domain;
use crate::checks::Check;
use crate::guest::pmu_name;

/// Fast enough that a 24-bit counter of 64-byte units (1 GiB) wraps about
/// once a second and the driver's threshold (an eighth of a wrap) is
/// crossed before its poll (every 0.2 s) comes.
const RATE: u64 = 1024 * MIB;
/// The rate while nobody may read the counters: a park, and each CPU going
/// offline or online (a move's transit; in a nested guest `stop_machine`
/// holds every vCPU with interrupts off for seconds). Unread time longer
/// than two wraps loses counts by design (`long_park`); this keeps it far
/// below one.
const UNREAD_RATE: u64 = RATE / 8;
/// How long traffic flows in each placement.
const PHASE: Duration = Duration::from_millis(1500);
const RMID: u32 = 7;

/// The IRQ of `pmu`'s line and its count per CPU, from `/proc/interrupts`
/// (only online CPUs have a column).
pub fn irq_counts(text: &str, pmu: &str) -> Option<(u32, BTreeMap<u32, u64>)> {
    let mut lines = text.lines();
    let cpus: Vec<u32> = lines
        .next()?
        .split_whitespace()
        .filter_map(|c| c.strip_prefix("CPU")?.parse().ok())
        .collect();
    for line in lines {
        let mut words = line.split_whitespace();
        let Some(irq) = words
            .next()
            .and_then(|w| w.strip_suffix(':'))
            .and_then(|w| w.parse::<u32>().ok())
        else {
            continue;
        };
        if line.split_whitespace().last() != Some(pmu) {
            continue;
        }
        let counts = cpus
            .iter()
            .zip(words)
            .map(|(&cpu, n)| Some((cpu, n.parse::<u64>().ok()?)))
            .collect::<Option<_>>()?;
        return Some((irq, counts));
    }
    None
}

/// Interrupts taken between two samples, per CPU present in both.
fn taken(before: &BTreeMap<u32, u64>, after: &BTreeMap<u32, u64>) -> BTreeMap<u32, u64> {
    after
        .iter()
        .filter_map(|(cpu, n)| Some((*cpu, n.checked_sub(*before.get(cpu)?)?)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// One placement of the PMU while traffic flowed.
struct Phase {
    what: String,
    cpumask: Vec<u32>,
    affinity: Vec<u32>,
    taken: BTreeMap<u32, u64>,
}

/// What the driver's counter file `name` of `pmu` says.
pub(super) fn counter_file(ctx: &mut Ctx, pmu: &str, name: &str) -> Result<u64> {
    ctx.g.pmu_count(pmu, name)
}

/// The device's acks (status reads that cleared an interrupt) by vCPU.
fn acks(state: &DeviceState, d: usize) -> BTreeMap<u32, u64> {
    state
        .domains
        .get(d)
        .map(|dom| dom.irq.acks_by_vcpu.clone())
        .unwrap_or_default()
}

/// The verdict on what was seen; pure, for the unit tests.
fn verdict(
    pmu: &str,
    irq: u32,
    phases: &[Phase],
    allowed: &[u32],
    off_owner: u64,
    on_owner: u64,
    violations: u64,
) -> Vec<String> {
    let mut problems = Vec::new();
    for p in phases {
        match p.cpumask.as_slice() {
            [owner] => {
                if p.affinity != [*owner] {
                    problems.push(format!(
                        "{}: /proc/irq/{irq}/smp_affinity_list is {} but {pmu}'s cpumask is {owner}: the interrupt's affinity did not follow the PMU (a driver without the affinity move in migrate_cpu)",
                        p.what,
                        format_cpu_list(&p.affinity)
                    ));
                }
                let elsewhere: BTreeMap<&u32, &u64> =
                    p.taken.iter().filter(|(cpu, _)| *cpu != owner).collect();
                if elsewhere.values().copied().sum::<u64>() > 1 {
                    problems.push(format!(
                        "{}: interrupts taken on CPUs other than the owner {owner}: {elsewhere:?}",
                        p.what
                    ));
                }
            }
            [] => {
                if p.affinity.iter().any(|cpu| allowed.contains(cpu)) {
                    problems.push(format!(
                        "{}: parked, but /proc/irq/{irq}/smp_affinity_list is {}, inside the domain's CPUs {}",
                        p.what,
                        format_cpu_list(&p.affinity),
                        format_cpu_list(allowed)
                    ));
                }
                if !p.taken.is_empty() {
                    problems.push(format!(
                        "{}: parked, yet overflow interrupts were taken: {:?}",
                        p.what, p.taken
                    ));
                }
            }
            more => problems.push(format!("{}: cpumask {more:?} is not one CPU", p.what)),
        }
    }
    if off_owner > phases.len() as u64 {
        problems.push(format!(
            "the driver took {off_owner} interrupts off the owner (irqs_off_owner), more than one per placement ({})",
            phases.len()
        ));
    }
    if on_owner == 0 {
        problems.push(format!(
            "no interrupt was handled on the owner (irqs_on_owner stayed put) under {} MiB/s",
            RATE / MIB
        ));
    }
    if violations != 0 {
        problems.push(format!(
            "the device counted {violations} placement violations in the domain"
        ));
    }
    problems
}

/// One step of a placement walk: what it does, the CPUs it takes offline
/// (false) or online (true), and the traffic rate after it.
type PlacementStep = (String, Vec<(u32, bool)>, u64);

/// Runs the check on the domain whose CPUs can all go offline.
pub fn follow_the_owner(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let pmu = pmu_name(d);
    let Some((irq, _)) = irq_counts(&ctx.g.read_file("/proc/interrupts")?, &pmu) else {
        return Ok(Check::from_problems(
            "interrupts",
            vec![format!("{pmu} has no line in /proc/interrupts: the driver requested no interrupt (is the GSI on perfbed.device=?)")],
            String::new(),
        ));
    };
    let affinity_file = format!("/proc/irq/{irq}/smp_affinity_list");
    let off_before = counter_file(ctx, &pmu, "irqs_off_owner")?;
    let on_before = counter_file(ctx, &pmu, "irqs_on_owner")?;
    let state = ctx.control.state()?;
    let (acks_before, violations_before) = (acks(&state, d), state.domains[d].violations);
    let start = Ctx::truth(&state, d, RMID, Event::MbmTotalBytes);
    let h = ctx.open(d, Event::MbmTotalBytes, RMID)?;
    ctx.control
        .set_rate(d as u32, RMID, Event::MbmTotalBytes, RATE)?;

    let mut phases = Vec::new();
    // Each step changes the placement, then traffic flows for a phase.
    let steps: Vec<PlacementStep> = vec![
        ("placed".into(), vec![], RATE),
        (
            format!("CPU {} offline (a move)", allowed[0]),
            vec![(allowed[0], false)],
            RATE,
        ),
        (
            format!("CPUs {} offline (a park)", format_cpu_list(&allowed)),
            allowed[1..].iter().map(|&c| (c, false)).collect(),
            UNREAD_RATE,
        ),
        (
            format!("CPU {} back (placed again)", allowed[0]),
            vec![(allowed[0], true)],
            RATE,
        ),
    ];
    for (what, hotplug, rate) in steps {
        if !hotplug.is_empty() {
            ctx.control
                .set_rate(d as u32, RMID, Event::MbmTotalBytes, UNREAD_RATE)?;
        }
        for (cpu, online) in hotplug {
            ctx.g.set_online(cpu, online)?;
        }
        ctx.control
            .set_rate(d as u32, RMID, Event::MbmTotalBytes, rate)?;
        let cpumask = ctx.g.cpumask(&pmu)?;
        let affinity = parse_cpu_list(ctx.g.read_file(&affinity_file)?.trim())
            .with_context(|| affinity_file.clone())?;
        let Some((_, before)) = irq_counts(&ctx.g.read_file("/proc/interrupts")?, &pmu) else {
            bail!("{pmu}'s line left /proc/interrupts")
        };
        thread::sleep(PHASE);
        let Some((_, after)) = irq_counts(&ctx.g.read_file("/proc/interrupts")?, &pmu) else {
            bail!("{pmu}'s line left /proc/interrupts")
        };
        phases.push(Phase {
            what,
            cpumask,
            affinity,
            taken: taken(&before, &after),
        });
    }
    for &cpu in &allowed[1..] {
        ctx.g.set_online(cpu, true)?;
    }
    ctx.control
        .set_rate(d as u32, RMID, Event::MbmTotalBytes, 0)?;
    let got = ctx.count(h)?;
    ctx.g.close(h)?;
    let state = ctx.control.state()?;
    let truth = whole_units(
        Ctx::truth(&state, d, RMID, Event::MbmTotalBytes) - start,
        ctx.device.unit_bytes,
    );
    let off_owner = counter_file(ctx, &pmu, "irqs_off_owner")? - off_before;
    let on_owner = counter_file(ctx, &pmu, "irqs_on_owner")? - on_before;
    let acks_now = acks(&state, d);
    let acked: BTreeMap<u32, u64> = acks_now
        .iter()
        .map(|(cpu, n)| (*cpu, n - acks_before.get(cpu).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    let violations = state.domains[d].violations - violations_before;
    let mut problems = verdict(
        &pmu, irq, &phases, &allowed, off_owner, on_owner, violations,
    );
    if got != truth {
        problems.push(format!(
            "counted {got} across the moves, the device's truth is {truth} (in whole units)"
        ));
    }
    if let Some(cpu) = acked.keys().find(|cpu| !allowed.contains(cpu)) {
        problems.push(format!(
            "the device saw CPU {cpu}, outside the domain, ack an interrupt: {acked:?}"
        ));
    }
    let taken_total: u64 = phases.iter().flat_map(|p| p.taken.values()).sum();
    let path: Vec<String> = phases
        .iter()
        .map(|p| {
            if p.cpumask.is_empty() {
                "parked".into()
            } else {
                format_cpu_list(&p.cpumask)
            }
        })
        .collect();
    Ok(Check::from_problems(
        "interrupts",
        problems,
        format!(
            "{pmu} (IRQ {irq}) under {} MiB/s: {taken_total} interrupts in /proc/interrupts during the phases; over the whole check the driver handled {on_owner} on the owner and left {off_owner} that reached the line's previous target right after a move to the owner's poll; affinity followed cpumask {}; acks by vCPU {acked:?}; counted {got} = the truth; 0 placement violations",
            RATE / MIB,
            path.join(" → ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROC: &str = "           CPU0       CPU2       CPU3       \n  4:        120          0          0   IO-APIC   4-edge      ttyS0\n 14:          0          5          2   IO-APIC  14-edge      perfbed_l3_1\nNMI:          0          0          0   Non-maskable interrupts\n";

    #[test]
    fn proc_interrupts_columns_are_the_online_cpus() {
        let (irq, counts) = irq_counts(PROC, "perfbed_l3_1").unwrap();
        assert_eq!(irq, 14);
        assert_eq!(counts, BTreeMap::from([(0, 0), (2, 5), (3, 2)]));
        assert!(irq_counts(PROC, "perfbed_l3_0").is_none());
        let later = BTreeMap::from([(0, 0), (2, 9), (3, 2)]);
        assert_eq!(taken(&counts, &later), BTreeMap::from([(2, 4)]));
    }

    fn phase(cpumask: &[u32], affinity: &[u32], taken: &[(u32, u64)]) -> Phase {
        Phase {
            what: "p".into(),
            cpumask: cpumask.to_vec(),
            affinity: affinity.to_vec(),
            taken: taken.iter().copied().collect(),
        }
    }

    #[test]
    fn an_affinity_left_behind_is_named() {
        let good = [
            phase(&[2], &[2], &[(2, 3)]),
            phase(&[3], &[3], &[(3, 2)]),
            phase(&[], &[0, 1], &[]),
            phase(&[2], &[2], &[(2, 1)]),
        ];
        assert!(verdict("perfbed_l3_1", 14, &good, &[2, 3], 0, 6, 0).is_empty());
        let strays = [
            phase(&[2], &[2], &[(2, 3), (0, 1)]),
            phase(&[3], &[3], &[(3, 2)]),
        ];
        assert!(
            verdict("perfbed_l3_1", 14, &strays, &[2, 3], 2, 5, 0).is_empty(),
            "one stray per placement"
        );
        let stuck = [phase(&[2], &[2], &[(2, 3)]), phase(&[3], &[2], &[(0, 2)])];
        let problems = verdict("perfbed_l3_1", 14, &stuck, &[2, 3], 3, 3, 0);
        assert!(
            problems
                .iter()
                .any(|p| p.contains("did not follow the PMU")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("other than the owner 3")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("irqs_off_owner")),
            "{problems:?}"
        );
        let silent = verdict(
            "perfbed_l3_1",
            14,
            &[phase(&[2], &[2], &[])],
            &[2, 3],
            0,
            0,
            1,
        );
        assert_eq!(silent.len(), 2, "{silent:?}");
    }
}
