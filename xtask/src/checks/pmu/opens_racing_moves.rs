//! Stays in Rust: not a counting check, it judges the errnos of opens the
//! agent makes in a loop while CPUs come and go, and the kernel's open-wait
//! figures.
//!
//! An open that races a move waits for it and never fails with EBUSY
//! (kernel patch 0006); how long it slept, beside how long the
//! moves took, is measured in the kernel and reported. (What a move or a
//! park must not change for the events themselves is the scenarios'
//! business: `scenarios/moves`, `scenarios/parks`, `scenarios/groups`.)

use anyhow::{bail, Result};
use perfbed_agent::{AgentMessage, HostRequest, RaceResult};
use perfbed_device::regs::Event;

use super::context::Ctx;
use super::moves::movable_domain;
use crate::checks::Check;
use crate::guest::pmu_name;

/// Hotplug operations each round of the open race of [`opens_racing_moves`]
/// makes.
const RACE_HOTPLUG_OPS: u32 = 24;

/// Rounds of the race at most: another one runs while no open has met a
/// move yet (whether one does is up to the scheduler, and in the box, whose
/// vCPUs run in coarse slices, a round of about 350 opens has missed them
/// all).
const RACE_ROUNDS: u32 = 3;

/// Opens in a loop while the PMU's CPUs go offline and
/// online, in rounds until one met a move (at most [`RACE_ROUNDS`]): no
/// open fails with EBUSY, only ENODEV while the PMU is parked, and opens
/// did meet moves. Reports the longest sleep of an open beside the longest
/// move.
pub fn opens_racing_moves(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let attr = ctx.attr(d, Event::MbmTotalBytes, 7);
    // A kernel without 0006 lacks some of these files: a failed
    // check, not an aborted run.
    let mut problems = Vec::new();
    let mut measured = |ctx: &mut Ctx, file: &str| {
        ctx.g.pmu_count(&pmu_name(d), file).unwrap_or_else(|e| {
            problems.push(format!("{e:#}"));
            0
        })
    };
    let waits_before = measured(ctx, "open_waits");
    let mut rounds = Vec::new();
    let mut waits = 0;
    while waits == 0 && rounds.len() < RACE_ROUNDS as usize {
        rounds.push(
            match ctx.g.ask(HostRequest::PerfOpenRace {
                attr: attr.clone(),
                cpu: 0,
                hotplug_ops: RACE_HOTPLUG_OPS,
                toggle_cpus: allowed.clone(),
                keep: 16,
                software_siblings: false,
            })? {
                AgentMessage::Race(race) => race,
                other => bail!("the open race: {other:?}"),
            },
        );
        waits = measured(ctx, "open_waits").saturating_sub(waits_before);
    }
    let race = rounds_together(&rounds);
    let retries = measured(ctx, "open_retries");
    let slept = measured(ctx, "open_wait_max_ns");
    let longest_move = measured(ctx, "move_max_ns");
    if race.busy != 0 {
        problems.push(format!(
            "{} of {} opens failed with EBUSY",
            race.busy, race.attempts
        ));
    }
    if let Some(other) = race.other_errors.iter().find(|e| !e.starts_with("ENODEV:")) {
        problems.push(format!(
            "opens failed with {other} (only ENODEV, while parked, may)"
        ));
    }
    problems.extend(unfinished(
        &race,
        RACE_HOTPLUG_OPS * rounds.len() as u32,
        "opens",
    ));
    if waits == 0 {
        problems.push(format!(
            "no open met a move in {} attempts ({} rounds): the race proved nothing",
            race.attempts,
            rounds.len()
        ));
    }
    // How long they slept is reported, not judged (a measurement on a
    // shared machine): each sleep waits for one move and ends when that
    // move wakes it, plus however late the woken task gets to run.
    if waits > 0 && (slept == 0 || longest_move == 0) {
        problems.push(format!("opens waited for moves, but the kernel measured a longest sleep of {slept} ns and a longest move of {longest_move} ns"));
    }
    Ok(Check::from_problems(
        "opens racing moves",
        problems,
        format!(
            "{} opens during {} hotplug operations on CPUs {allowed:?}: {} opened, {} EBUSY, others {:?}; {waits} waited for a move ({retries} retried in all), the longest sleep of an open {} µs, the longest move {} µs",
            race.attempts,
            race.hotplug_ops,
            race.opened,
            race.busy,
            race.other_errors,
            slept / 1000,
            longest_move / 1000
        ),
    ))
}

/// cpu-clock siblings opened into a device group, and closed again, in a
/// loop while the group's PMU moves over the movable domain's CPUs, one
/// offline at a time (so it never parks): each sibling follows the group's
/// CPU (kernel patch 0006), and no open fails at all, not even when the
/// CPU it read from the group goes offline before the open takes that
/// CPU's context. Opens that met a move and were made again show in the
/// PMU's `open_retries`: reported, not judged, as whether one meets the
/// few microseconds of a move's hold on the context is up to the
/// scheduler.
pub fn software_siblings_racing_moves(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let attr = ctx.attr(d, Event::MbmTotalBytes, 7);
    let retries_before = ctx.g.pmu_count(&pmu_name(d), "open_retries")?;
    let race = match ctx.g.ask(HostRequest::PerfOpenRace {
        attr,
        cpu: 0,
        hotplug_ops: SIBLING_RACE_HOTPLUG_OPS,
        toggle_cpus: allowed.clone(),
        keep: 0,
        software_siblings: true,
    })? {
        AgentMessage::Race(race) => race,
        other => bail!("the sibling open race: {other:?}"),
    };
    let retries = ctx
        .g
        .pmu_count(&pmu_name(d), "open_retries")?
        .saturating_sub(retries_before);
    let mut problems = Vec::new();
    let refused = race.attempts - race.opened;
    if refused != 0 {
        problems.push(format!(
            "{refused} of {} sibling opens failed ({} with EBUSY, others {:?}); the group never parked, so none may",
            race.attempts, race.busy, race.other_errors
        ));
    }
    problems.extend(unfinished(&race, SIBLING_RACE_HOTPLUG_OPS, "sibling opens"));
    Ok(Check::from_problems(
        "software siblings racing moves",
        problems,
        format!(
            "{} cpu-clock siblings opened into a group of {} during {} hotplug operations on CPUs {allowed:?}: {} opened, {retries} made again after a move",
            race.attempts,
            pmu_name(d),
            race.hotplug_ops,
            race.opened
        ),
    ))
}

/// Hotplug operations of the sibling race: two moves of the PMU each
/// round of the domain's CPUs.
const SIBLING_RACE_HOTPLUG_OPS: u32 = 48;

/// What a race that proves nothing lacked: not all of its `ops` hotplug
/// operations made, or not one of its `opens` succeeded.
fn unfinished(race: &RaceResult, ops: u32, opens: &str) -> Option<String> {
    (race.hotplug_ops != ops || race.opened == 0).then(|| {
        format!(
            "{} of {ops} hotplug operations, {} {opens} succeeded",
            race.hotplug_ops, race.opened
        )
    })
}

/// The rounds of the race as one: their counts added, their errors listed
/// together.
fn rounds_together(rounds: &[RaceResult]) -> RaceResult {
    let mut all = RaceResult {
        attempts: 0,
        opened: 0,
        busy: 0,
        other_errors: Vec::new(),
        hotplug_ops: 0,
        final_values: Vec::new(),
    };
    for r in rounds {
        all.attempts += r.attempts;
        all.opened += r.opened;
        all.busy += r.busy;
        all.other_errors.extend(r.other_errors.iter().cloned());
        all.hotplug_ops += r.hotplug_ops;
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(attempts: u32, busy: u32, errors: &[&str]) -> RaceResult {
        RaceResult {
            attempts,
            opened: attempts - busy,
            busy,
            other_errors: errors.iter().map(|e| e.to_string()).collect(),
            hotplug_ops: RACE_HOTPLUG_OPS,
            final_values: vec![1],
        }
    }

    /// Rounds add up, so that an EBUSY or another errno of any round fails
    /// the check, and the hotplug operations are judged against all rounds.
    #[test]
    fn the_rounds_of_the_race_add_up() {
        let all = rounds_together(&[round(300, 0, &[]), round(350, 2, &["ENODEV: 3"])]);
        assert_eq!(all.attempts, 650);
        assert_eq!(all.busy, 2);
        assert_eq!(all.opened, 648);
        assert_eq!(all.hotplug_ops, 2 * RACE_HOTPLUG_OPS);
        assert_eq!(all.other_errors, vec!["ENODEV: 3".to_string()]);
    }

    /// A race that did not make all its hotplug operations, or opened
    /// nothing, fails; one that did passes this part.
    #[test]
    fn a_race_short_of_operations_or_opens_proves_nothing() {
        let full = round(300, 0, &[]);
        assert_eq!(unfinished(&full, RACE_HOTPLUG_OPS, "opens"), None);
        assert_eq!(
            unfinished(&full, 2 * RACE_HOTPLUG_OPS, "opens").as_deref(),
            Some("24 of 48 hotplug operations, 300 opens succeeded")
        );
        let none_opened = round(5, 5, &[]);
        assert!(unfinished(&none_opened, RACE_HOTPLUG_OPS, "sibling opens")
            .is_some_and(|p| p.ends_with("0 sibling opens succeeded")));
    }
}
