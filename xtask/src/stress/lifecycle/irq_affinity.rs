//! The overflow interrupt follows the PMU: after every step that places a
//! domain's PMU (a move, a park, an unpark, an allowed set, a `cpumask`
//! that settles a set not waited for, each PMU at a module reload), the line's
//! `/proc/irq/N/smp_affinity_list` is the owner alone, or, parked, away
//! from the domain (none of the CPUs it allows that are online). A driver that leaves it behind counts right
//! (the owner's poll reads the counters), so only this sees it. The
//! lifecycle stress and every scenario check it.

use anyhow::Result;
use perfbed_device::cpus::parse_cpu_list;

use super::journal::{Doubt, Entry, Step, PARKED};
use crate::guest::Guest;

/// Each PMU's interrupt line, as `/proc/interrupts` names it.
#[derive(Debug, Clone)]
pub struct IrqLines {
    irqs: Vec<Option<u32>>,
}

impl IrqLines {
    /// The lines of `pmus` (in domain order), and what is wrong with them:
    /// the hosts give lines to the first domains only (`DEVICE_GSIS`), and
    /// the others are polled and must have none.
    pub fn read(g: &mut Guest, pmus: &[String]) -> Result<(IrqLines, Vec<String>)> {
        let interrupts = g.read_file("/proc/interrupts")?;
        let irqs: Vec<Option<u32>> = pmus.iter().map(|pmu| irq_line(&interrupts, pmu)).collect();
        let lines = crate::host::config::device_gsis(pmus.len()).len();
        let problems = pmus
            .iter()
            .zip(&irqs)
            .enumerate()
            .filter(|(d, (_, irq))| irq.is_some() != (*d < lines))
            .map(|(d, (pmu, _))| {
                if d < lines {
                    format!("{pmu} has no line in /proc/interrupts")
                } else {
                    format!("{pmu} has a line in /proc/interrupts, but the host gives lines to {lines} domains")
                }
            })
            .collect();
        Ok((IrqLines { irqs }, problems))
    }

    /// After `entry`, if it placed `domain`'s PMU, which has a line, and
    /// succeeded: what is wrong with the line's affinity, if anything; its
    /// result is the PMU's `cpumask`; a parked line
    /// must be away from the CPUs `allowed`. `at` names the step in the
    /// problem.
    pub fn after(
        &self,
        g: &mut Guest,
        entry: &Entry,
        domain: Option<u32>,
        allowed: &[u32],
        at: &str,
    ) -> Result<Option<String>> {
        let Some(domain) = domain else {
            return Ok(None);
        };
        let (Ok(mask), Some(Some(irq))) = (&entry.result, self.irqs.get(domain as usize)) else {
            return Ok(None);
        };
        let file = format!("/proc/irq/{irq}/smp_affinity_list");
        let text = g.read_file(&file)?;
        let affinity =
            parse_cpu_list(&text).map_err(|e| anyhow::anyhow!("{file} {text:?}: {e}"))?;
        let wrong = affinity_wrong(mask.first().copied(), &affinity, allowed);
        Ok(wrong.then(|| {
            format!(
                "{at} ({:?}): {file} is {} but cpumask is {}: the interrupt did not follow the PMU",
                entry.step,
                text.trim(),
                mask.first()
                    .map_or("empty (parked)".to_string(), u64::to_string)
            )
        }))
    }
}

/// A scenario's watch on its interrupt lines: the allowed sets its steps
/// gave, and what was wrong after each placement, by scenario line.
pub struct Watch {
    pmus: Vec<String>,
    lines: IrqLines,
    allowed: Vec<Vec<u32>>,
    /// The domains in doubt ([`Doubt`]): the `cpumask` that settles one is
    /// its placement.
    doubt: std::collections::BTreeSet<u32>,
    pub problems: Vec<(usize, String)>,
}

impl Watch {
    /// The lines of `pmus`, each domain on its default set `defaults`.
    pub fn new(g: &mut Guest, pmus: &[String], defaults: &[Vec<u32>]) -> Result<Watch> {
        Ok(Watch {
            pmus: pmus.to_vec(),
            lines: IrqLines::read(g, pmus)?.0,
            allowed: defaults.to_vec(),
            doubt: Default::default(),
            problems: Vec::new(),
        })
    }

    /// After the step of scenario line `line`, journaled as `entry`.
    pub fn after(&mut self, g: &mut Guest, entry: &Entry, line: usize) -> Result<()> {
        if let (Step::Allowed { domain, cpus, .. }, Ok(_)) = (&entry.step, &entry.result) {
            if let Some(set) = self.allowed.get_mut(*domain as usize) {
                set.clone_from(cpus);
            }
        }
        if let (Step::Reload { allowed }, Ok(_)) = (&entry.step, &entry.result) {
            // Registered again: its lines requested afresh.
            if let Some((domain, cpus)) = allowed {
                if let Some(set) = self.allowed.get_mut(*domain as usize) {
                    set.clone_from(cpus);
                }
            }
            self.lines = IrqLines::read(g, &self.pmus)?.0;
        }
        if let (Step::Reload { .. }, Ok(owners)) = (&entry.step, &entry.result) {
            // Each PMU placed as it registered: its line with it.
            for (domain, &owner) in (0u32..).zip(owners) {
                let mask = if owner == PARKED { vec![] } else { vec![owner] };
                let placed = Entry {
                    result: Ok(mask),
                    ..entry.clone()
                };
                self.judge(g, &placed, domain, line)?;
            }
            return Ok(());
        }
        let settled = match Doubt::of(&entry.step) {
            Some(Doubt::Begins(d)) => {
                self.doubt.insert(d);
                None
            }
            Some(Doubt::Settles(d)) => self.doubt.remove(&d).then_some(d),
            None => None,
        };
        match placement_step(&entry.step).or(settled) {
            Some(domain) => self.judge(g, entry, domain, line),
            None => Ok(()),
        }
    }

    /// Whether the line of `domain`, which `entry` placed (its result is the
    /// `cpumask`), followed it; a problem at scenario line `line` if not.
    fn judge(&mut self, g: &mut Guest, entry: &Entry, domain: u32, line: usize) -> Result<()> {
        let Some(allowed) = self.allowed.get(domain as usize) else {
            return Ok(());
        };
        // Parked, the line is pointed away from the set it had then: a set
        // given while parked may name a CPU it still covers, offline.
        let away: Vec<u32> = match &entry.result {
            Ok(mask) if mask.is_empty() => {
                let text = g.read_file("/sys/devices/system/cpu/online")?;
                let online = parse_cpu_list(text.trim())
                    .map_err(|e| anyhow::anyhow!("/sys/devices/system/cpu/online {text:?}: {e}"))?;
                allowed
                    .iter()
                    .copied()
                    .filter(|c| online.contains(c))
                    .collect()
            }
            _ => allowed.clone(),
        };
        let at = format!("line {line}");
        if let Some(problem) = self.lines.after(g, entry, Some(domain), &away, &at)? {
            self.problems.push((line, problem));
        }
        Ok(())
    }
}

/// The domain a step places the PMU of (its result is the `cpumask`); an
/// allowed set not waited for places none yet.
pub fn placement_step(step: &Step) -> Option<u32> {
    match *step {
        Step::Move { domain }
        | Step::Park { domain }
        | Step::Unpark { domain, .. }
        | Step::Allowed {
            domain,
            nowait: false,
            ..
        } => Some(domain),
        _ => None,
    }
}

/// The IRQ of `pmu`'s line in `/proc/interrupts` (`text`), if it has one:
/// the line whose last word is the PMU's name.
pub fn irq_line(text: &str, pmu: &str) -> Option<u32> {
    text.lines().skip(1).find_map(|line| {
        let irq = line
            .split_whitespace()
            .next()?
            .strip_suffix(':')?
            .parse()
            .ok()?;
        (line.split_whitespace().last() == Some(pmu)).then_some(irq)
    })
}

/// Whether an interrupt's affinity `affinity` is wrong for a PMU owned by
/// `owner` (`None`: parked) whose domain allows `allowed`: placed, it must
/// be the owner alone; parked, on none of them (and on some CPU).
fn affinity_wrong(owner: Option<u64>, affinity: &[u32], allowed: &[u32]) -> bool {
    match owner {
        Some(owner) => affinity != [owner as u32],
        None => affinity.is_empty() || affinity.iter().any(|c| allowed.contains(c)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pmus_line_is_the_one_its_name_ends() {
        let proc = "           CPU0       CPU2       CPU3       \n  4:        120          0          0   IO-APIC   4-edge      ttyS0\n 14:          0          5          2   IO-APIC  14-edge      perfbed_l3_1\nNMI:          0          0          0   Non-maskable interrupts\n";
        assert_eq!(irq_line(proc, "perfbed_l3_1"), Some(14));
        assert_eq!(irq_line(proc, "perfbed_l3_0"), None);
        assert_eq!(irq_line(proc, "ttyS0"), Some(4));
    }

    #[test]
    fn an_affinity_is_right_on_the_owner_alone_or_outside_a_parked_domain() {
        let domain = [2, 3];
        assert!(!affinity_wrong(Some(3), &[3], &domain));
        assert!(affinity_wrong(Some(3), &[2], &domain), "the CPU it left");
        assert!(
            affinity_wrong(Some(3), &[0, 1, 2, 3], &domain),
            "where the kernel put it"
        );
        assert!(!affinity_wrong(None, &[0, 1], &domain));
        assert!(
            affinity_wrong(None, &[1, 2], &domain),
            "parked, inside the domain"
        );
        assert!(
            !affinity_wrong(None, &[0], &[]),
            "parked by an empty set: anywhere"
        );
        assert!(affinity_wrong(None, &[], &[]), "nowhere");
    }
}
