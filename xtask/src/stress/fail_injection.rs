//! The stress's fail-injection steps (`stress --fail-injection`): a CPU
//! offline or online armed to fail at one of the hotplug states around
//! perf's (the states the scenarios of `scenarios/hotplug-failures/` fail
//! one by one),
//! dealt among the schedule's other steps while traffic flows and events
//! are read, and after each the PMUs where the placement rule says.
//!
//! After an operation that failed at its state and rolled back:
//! - a PMU of another domain, or of the CPU's domain that the CPU does not
//!   count it, has not moved;
//! - an online that failed leaves the PMU where it was (a parked PMU stays
//!   parked: if perf's startup ran and placed it, the rollback's teardown
//!   parked it again);
//! - an offline of the owner that failed above perf's state never ran
//!   perf's teardown: the PMU stays; one that failed below it ran the
//!   teardown, which moved the PMU to another online CPU of its domain
//!   (where the rollback's online of perf leaves it), or, with none,
//!   parked it, and the rollback's online placed it on the CPU again.
//!
//! Every PMU, after any of these operations, is on an online CPU of its
//! domain, or parked when none is online.

use std::fmt::Write as _;

use anyhow::{bail, Context, Result};
use perfbed_agent::{parse_cpu_list, HotplugBatchResult, HotplugOp};

use crate::checks::Check;
use crate::guest::Guest;
use crate::stress::lifecycle::journal::PERF_STATE;

/// The CPU whose fail file tells which states can fail (any hotpluggable
/// CPU: the states are the same on all).
const PROBE_CPU: u32 = 1;

/// The kernel's CPU folder in sysfs.
pub const CPU_SYSFS: &str = "/sys/devices/system/cpu";
/// What names the driver's own dynamic state, if it registers one.
const DRIVER_STATE: &str = "perfbed";
/// `CPUHP_INVALID`: a CPU's fail injection disarmed.
const DISARMED: i64 = -1;
/// The failable states taken on each side of perf's when the driver has no
/// state of its own: below, the first whose teardown runs after perf moved
/// the PMU; above, those torn down before perf's.
const AROUND_PERF: usize = 2;

/// One hotplug state, as `/sys/devices/system/cpu/hotplug/states` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotplugState {
    pub number: i64,
    pub name: String,
}

/// The `N: name` lines of the states file.
pub fn parse_states(text: &str) -> Result<Vec<HotplugState>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (number, name) = line
                .split_once(':')
                .with_context(|| format!("hotplug state line {line:?}"))?;
            Ok(HotplugState {
                number: number
                    .trim()
                    .parse()
                    .with_context(|| format!("hotplug state line {line:?}"))?,
                name: name.trim().to_string(),
            })
        })
        .collect()
}

fn write(g: &mut Guest, path: &str, value: &str) -> Result<std::result::Result<(), String>> {
    let (status, _, stderr) = g.run(&[
        "/bin/busybox",
        "sh",
        "-c",
        &format!("echo {value} > {path}"),
    ])?;
    Ok(if status == Some(0) {
        Ok(())
    } else {
        Err(stderr.trim().to_string())
    })
}

fn fail_file(cpu: u32) -> String {
    format!("{CPU_SYSFS}/cpu{cpu}/hotplug/fail")
}

/// The states to fail at: from the driver's own (if it has one) or the
/// [`AROUND_PERF`] failable states above perf's, down to perf's and the
/// [`AROUND_PERF`] failable states below it. A state is failable when the
/// kernel takes it in the fail file (it has a callback and is not atomic).
pub fn chosen_states(
    g: &mut Guest,
    states: &[HotplugState],
    cpu: u32,
) -> Result<Vec<HotplugState>> {
    let Some(perf) = states.iter().position(|s| s.name == PERF_STATE) else {
        bail!("no {PERF_STATE:?} among the hotplug states");
    };
    let failable = |g: &mut Guest, s: &HotplugState| -> Result<bool> {
        let taken = write(g, &fail_file(cpu), &s.number.to_string())?.is_ok();
        if taken {
            write(g, &fail_file(cpu), &DISARMED.to_string())?
                .map_err(|e| anyhow::anyhow!("disarming CPU {cpu}'s fail injection: {e}"))?;
        }
        Ok(taken)
    };
    let mut chosen = vec![states[perf].clone()];
    for s in states[..perf].iter().rev() {
        if chosen.len() > AROUND_PERF {
            break;
        }
        if failable(g, s)? {
            chosen.insert(0, s.clone());
        }
    }
    let driver = states.iter().rposition(|s| s.name.contains(DRIVER_STATE));
    let mut above = 0;
    for (i, s) in states.iter().enumerate().skip(perf + 1) {
        let within = match driver {
            Some(d) => i <= d,
            None => above < AROUND_PERF,
        };
        if !within {
            break;
        }
        if failable(g, s)? {
            chosen.push(s.clone());
            above += 1;
        }
    }
    Ok(chosen)
}

/// The states a fail-injection step may arm, and perf's.
pub struct Failable {
    states: Vec<HotplugState>,
    perf: i64,
}

impl Failable {
    pub fn find(g: &mut Guest) -> Result<Failable> {
        let states = parse_states(&g.read_file("/sys/devices/system/cpu/hotplug/states")?)?;
        let Some(perf) = states.iter().find(|s| s.name == PERF_STATE) else {
            bail!("no {PERF_STATE:?} among the guest's hotplug states");
        };
        let perf = perf.number;
        let states = chosen_states(g, &states, PROBE_CPU)?;
        if states.is_empty() {
            bail!("no hotplug state around {PERF_STATE:?} can be armed to fail (is this the debug kernel?)");
        }
        Ok(Failable { states, perf })
    }

    /// The state a step's `pick` names.
    pub fn pick(&self, pick: u32) -> i64 {
        self.states[pick as usize % self.states.len()].number
    }

    fn name(&self, number: i64) -> &str {
        self.states
            .iter()
            .find(|s| s.number == number)
            .map_or("?", |s| s.name.as_str())
    }
}

/// What the fail-injection steps of a run did.
#[derive(Default)]
pub struct Tally {
    /// (state, online, injected) → operations.
    outcomes: std::collections::BTreeMap<(i64, bool, bool), u32>,
    problems: Vec<String>,
    names: std::collections::BTreeMap<i64, String>,
}

impl Tally {
    /// Judges each `FailAt` of one batch: `ops` as sent, `result` as the
    /// agent answered, `domains` each domain's CPUs (in PMU order).
    pub fn add(
        &mut self,
        ops: &[HotplugOp],
        result: &HotplugBatchResult,
        domains: &[Vec<u32>],
        failable: &Failable,
        batch_no: usize,
    ) {
        let mut before = &result.masks_before;
        for (i, (op, done)) in ops.iter().zip(&result.ops).enumerate() {
            let after = &done.masks;
            if let HotplugOp::FailAt { cpu, online, state } = *op {
                self.names.insert(state, failable.name(state).to_string());
                let at = format!(
                    "batch {batch_no} op {i} ({} of CPU {cpu} failing at {state} {})",
                    if online { "online" } else { "offline" },
                    failable.name(state)
                );
                match done.injected {
                    Some(injected) => {
                        *self.outcomes.entry((state, online, injected)).or_default() += 1;
                        let online_now = parse_cpu_list(&done.online).unwrap_or_default();
                        for (d, cpus) in domains.iter().enumerate() {
                            let (was, is) = (before.get(d), after.get(d));
                            let (Some(was), Some(is)) = (was, is) else {
                                self.problems.push(format!("{at}: no cpumask of PMU {d}"));
                                continue;
                            };
                            if let Some(problem) = placement_problem(
                                cpus,
                                &online_now,
                                (cpu, online, state, failable.perf),
                                injected,
                                (was, is),
                            ) {
                                self.problems.push(format!("{at}: PMU {d} {problem}"));
                            }
                        }
                    }
                    None => self
                        .problems
                        .push(format!("{at}: no outcome ({:?})", done.error)),
                }
            }
            // A flap's middle look does not matter here: the last one does.
            before = after;
        }
    }

    pub fn check(&self) -> Check {
        let mut problems = self.problems.clone();
        let injected: u32 = self
            .outcomes
            .iter()
            .filter(|((_, _, inj), _)| *inj)
            .map(|(_, n)| n)
            .sum();
        let total: u32 = self.outcomes.values().sum();
        if total > 0 && injected == 0 {
            problems.push(format!(
                "none of {total} operations failed at its state: no rollback was tried"
            ));
        }
        if total == 0 {
            problems.push("the schedule dealt no fail-injection step".into());
        }
        let mut detail = format!("{injected} of {total} operations failed at their state and rolled back, each PMU where the placement rule says:");
        for ((state, online, inj), n) in &self.outcomes {
            let _ = write!(
                detail,
                " {} {state} {} {}×{n};",
                if *online { "online" } else { "offline" },
                self.names.get(state).map_or("?", String::as_str),
                if *inj { "failed" } else { "not reached" },
            );
        }
        Check::from_problems("hotplug fail injection under stress", problems, detail)
    }
}

/// What is wrong with a PMU of domain `cpus` going from cpumask `was` to
/// `is` through a fail-injection operation, if anything.
pub fn placement_problem(
    cpus: &[u32],
    online_now: &[u32],
    (cpu, online, state, perf): (u32, bool, i64, i64),
    injected: bool,
    (was, is): (&str, &str),
) -> Option<String> {
    let here: Vec<u32> = cpus
        .iter()
        .copied()
        .filter(|c| online_now.contains(c))
        .collect();
    let is_cpu = match is {
        "" => None,
        text => match text.parse::<u32>() {
            Ok(c) => Some(c),
            Err(_) => return Some(format!("has cpumask {is:?}, not one CPU")),
        },
    };
    // The rule for any operation: on an online CPU of the domain, parked
    // only when none is.
    match is_cpu {
        Some(c) if !here.contains(&c) => {
            return Some(format!("is on CPU {c}, not an online CPU of {cpus:?}"))
        }
        None if !here.is_empty() => return Some(format!("is parked with {here:?} online")),
        _ => {}
    }
    if !injected {
        // Completed and undone: two operations; the rule above is all.
        return None;
    }
    let owner = was.parse::<u32>().ok();
    let moved_off = !online && owner == Some(cpu) && cpus.contains(&cpu) && state < perf;
    if !moved_off {
        return (was != is)
            .then(|| format!("moved {was:?} → {is:?}, where the rollback leaves it"));
    }
    let others: Vec<u32> = here.iter().copied().filter(|&c| c != cpu).collect();
    match is_cpu {
        Some(c) if c == cpu && !others.is_empty() => Some(format!(
            "is back on CPU {cpu}: perf's teardown ran, so it should have moved to one of {others:?}"
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERF: i64 = 155;
    const DOMAIN: [u32; 2] = [2, 3];

    fn problem(
        op: (u32, bool, i64),
        injected: bool,
        online: &[u32],
        masks: (&str, &str),
    ) -> Option<String> {
        placement_problem(&DOMAIN, online, (op.0, op.1, op.2, PERF), injected, masks)
    }

    #[test]
    fn states_parse_and_bad_lines_are_errors() {
        let states = parse_states("  0: offline\n 93: perf:online\n235: online\n").unwrap();
        assert_eq!(states.len(), 3);
        assert_eq!(
            states[1],
            HotplugState {
                number: 93,
                name: "perf:online".into()
            }
        );
        assert!(parse_states("perf online\n").is_err());
        assert!(parse_states("x: perf:online\n").is_err());
    }

    #[test]
    fn a_failed_offline_of_the_owner_moves_it_only_below_perfs_state() {
        let all = [0, 1, 2, 3];
        // Below perf's state: the teardown ran, the PMU moved.
        assert_eq!(problem((2, false, 140), true, &all, ("2", "3")), None);
        assert!(problem((2, false, 140), true, &all, ("2", "2")).is_some());
        // At or above it: the teardown never ran.
        assert_eq!(problem((2, false, 160), true, &all, ("2", "2")), None);
        assert!(problem((2, false, 160), true, &all, ("2", "3")).is_some());
        // The owner alone in its domain: parked, then placed again on it.
        assert_eq!(problem((2, false, 140), true, &[0, 1, 2], ("2", "2")), None);
    }

    #[test]
    fn a_failed_online_or_a_non_owner_leaves_the_pmu() {
        // A parked domain's CPU fails to come: still parked.
        assert_eq!(problem((2, true, 160), true, &[0, 1], ("", "")), None);
        assert!(problem((2, true, 160), true, &[0, 1], ("", "2")).is_some());
        // A non-owner's failed offline does not move the PMU.
        assert_eq!(
            problem((3, false, 140), true, &[0, 1, 2, 3], ("2", "2")),
            None
        );
        assert!(problem((3, false, 140), true, &[0, 1, 2, 3], ("2", "3")).is_some());
        // Another domain's PMU never moves.
        assert!(placement_problem(
            &[0, 1],
            &[0, 1, 2, 3],
            (2, false, 140, PERF),
            true,
            ("1", "0")
        )
        .is_some());
    }

    #[test]
    fn every_pmu_sits_on_an_online_cpu_of_its_domain() {
        // Not reached (completed and undone): only the general rule.
        assert_eq!(
            problem((2, false, 140), false, &[0, 1, 2, 3], ("2", "3")),
            None
        );
        assert!(problem((2, false, 140), false, &[0, 1, 2, 3], ("2", "")).is_some());
        assert!(problem((2, false, 140), false, &[0, 1, 3], ("3", "2")).is_some());
        assert!(problem((2, false, 140), false, &[0, 1, 2, 3], ("2", "2-3")).is_some());
    }
}
