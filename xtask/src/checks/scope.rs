//! The device-scope PMU test, on the debug kernel: the test module
//! `perfbed_scope_test` registers `perfbed_scope_a` (allowed CPUs 1-2),
//! `perfbed_scope_b` (allowed CPU 3) and `perfbed_scope_core` (an ordinary
//! core-scope PMU), whose events read back the CPU they are counted on, plus
//! one. From userspace the agent follows the PMUs as CPUs go
//! offline and online, parks them, places them again (an event open across
//! the park comes back with them), and races opens against hotplug: none
//! may fail because of a move. A group member the PMU refuses is released
//! (its `live_events` counter file). Before any of that, at boot, the
//! kernel ran the series' KUnit suite `perf_device_scope` (placement decided
//! by the core alone, `CONFIG_PERF_DEVICE_SCOPE_KUNIT_TEST`): every case must
//! have passed, none skipped.

use std::time::Duration;

use anyhow::{bail, Result};
use perfbed_agent::{AgentMessage, HostRequest, PerfAttr};

use crate::checks::Check;
use crate::guest::Guest;
use crate::host::vm::Vm;

const MODULE: &str = "perfbed_scope_test";
const PMU_A: &str = "perfbed_scope_a";
const PMU_B: &str = "perfbed_scope_b";
const A_ALLOWED: [u32; 2] = [1, 2];
const B_ALLOWED: u32 = 3;
/// A core-scope PMU: the existing scopes must work as before.
const PMU_CORE: &str = "perfbed_scope_core";
/// The probe event: `events/cpu` = "event=0x01".
const PROBE_CONFIG: u64 = 0x01;
/// Hotplug operations the opens race against, and how many of the events
/// that open are kept open to check where they ended up.
const RACE_HOTPLUG_OPS: u32 = 40;
const RACE_KEEP: u32 = 400;

/// The series' KUnit suite, run by the debug kernel at boot.
const KUNIT_SUITE: &str = "perf_device_scope";

/// The verdict of KUnit suite `suite` from the kernel's KTAP output in
/// `log`: its cases' results and its summary line
/// (`# SUITE: pass:P fail:F skip:S total:T`). Passes only if the suite ran
/// and every case passed: a skipped case is a failure here, as is a suite
/// the kernel did not run.
fn kunit_suite(suite: &str, log: &str) -> Check {
    let name = "kunit: perf_device_scope";
    let summary = format!("# {suite}: pass:");
    let Some(line) = log
        .lines()
        .find_map(|l| l.split_once(&summary).map(|(_, rest)| rest))
    else {
        return check(
            name,
            false,
            format!(
                "the kernel ran no KUnit suite {suite} (CONFIG_PERF_DEVICE_SCOPE_KUNIT_TEST set?)"
            ),
        );
    };
    let field = |key: &str| -> Option<u32> {
        let line = format!("pass:{line}");
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(key)?.strip_prefix(':')?.parse().ok())
    };
    let counts = (field("pass"), field("fail"), field("skip"), field("total"));
    // The cases that did not pass, by name, as KTAP prints them.
    let failed: Vec<&str> = log
        .lines()
        // After printk's "[    1.234] " stamp, KTAP's indentation.
        .map(|l| l.split_once("] ").map_or(l, |(_, rest)| rest).trim())
        .filter(|l| l.starts_with("not ok ") || (l.starts_with("ok ") && l.contains("# SKIP")))
        .collect();
    match counts {
        (Some(pass), Some(0), Some(0), Some(total)) if pass == total && total > 0 => check(
            name,
            true,
            format!("{pass} of {total} cases passed at boot"),
        ),
        _ => check(
            name,
            false,
            format!("{suite}: pass:{line}; not passed: {failed:?}"),
        ),
    }
}

/// A step's check: `passed` and what was seen.
fn check(name: &'static str, passed: bool, detail: String) -> Check {
    Check {
        name,
        passed,
        detail,
    }
}

fn probe_open(g: &mut Guest, pmu_type: u32) -> Result<crate::guest::Opened> {
    probe_open_on(g, pmu_type, 0)
}

/// The probe event of the PMU of type `pmu_type`.
fn probe_attr(pmu_type: u32) -> PerfAttr {
    PerfAttr {
        type_: pmu_type,
        config: PROBE_CONFIG,
        ..PerfAttr::default()
    }
}

fn probe_open_on(g: &mut Guest, pmu_type: u32, cpu: i32) -> Result<crate::guest::Opened> {
    g.open_as(probe_attr(pmu_type), -1, cpu, None)
}

/// A probe event in the group that `leader` leads.
fn probe_open_in(g: &mut Guest, pmu_type: u32, leader: u32) -> Result<crate::guest::Opened> {
    g.open(probe_attr(pmu_type), Some(leader))
}

/// The CPU a probe event says it is counted on (its value minus one).
fn probe_cpu(g: &mut Guest, handle: u32) -> Result<i64> {
    Ok(g.read(handle)?[0] as i64 - 1)
}

pub fn run(vm: &mut Vm, timeout: Duration) -> Result<Vec<Check>> {
    let boot_log = std::fs::read_to_string(&vm.serial_log).unwrap_or_default();
    let mut checks = vec![kunit_suite(KUNIT_SUITE, &boot_log)];
    let mut g = Guest { vm, timeout };
    g.expect_done(HostRequest::LoadModule {
        name: MODULE.into(),
    })?;
    let (type_a, type_b) = (g.pmu_type(PMU_A)?, g.pmu_type(PMU_B)?);

    // Placed inside the allowed set at registration.
    let (mask_a, mask_b) = (g.cpumask(PMU_A)?, g.cpumask(PMU_B)?);
    let placed = mask_a.len() == 1 && A_ALLOWED.contains(&mask_a[0]) && mask_b == [B_ALLOWED];
    checks.push(check(
        "placed in its set",
        placed,
        format!("{PMU_A} on {mask_a:?} (allowed {A_ALLOWED:?}), {PMU_B} on {mask_b:?}"),
    ));
    let Some(&first) = mask_a.first() else {
        return Ok(checks);
    };

    // An event counts on the PMU's CPU, whatever CPU it was opened on.
    let e1 = match probe_open(&mut g, type_a)? {
        Ok(handle) => handle,
        Err(errno) => bail!("opening a probe event on {PMU_A}: {errno}"),
    };
    let on = probe_cpu(&mut g, e1)?;
    checks.push(check(
        "event bound to pmu->cpu",
        on == i64::from(first),
        format!("opened with cpu=0, counts on CPU {on}"),
    ));

    // A group member the PMU refuses (`check_group`: one probe event per group) is released
    // as any event whose creation fails: what its `event_init` took goes back.
    let live_before = g.pmu_count(PMU_A, "live_events")?;
    let refused_before = g.pmu_count(PMU_A, "groups_refused")?;
    let sibling = probe_open_in(&mut g, type_a, e1)?;
    let live_after = g.pmu_count(PMU_A, "live_events")?;
    let refused = g.pmu_count(PMU_A, "groups_refused")? - refused_before;
    checks.push(check(
        "a refused group member is released",
        sibling == Err("EINVAL".into()) && refused == 1 && live_after == live_before,
        format!(
            "a second probe event in the group of the first: {sibling:?}, refused by check_group {refused} time(s); live events {live_before} before, {live_after} after"
        ),
    ));
    if let Ok(handle) = sibling {
        g.close(handle)?;
    }

    // The owner CPU goes: the PMU and its event move to the other allowed CPU.
    let other = if first == A_ALLOWED[0] {
        A_ALLOWED[1]
    } else {
        A_ALLOWED[0]
    };
    g.set_online(first, false)?;
    let (mask, on) = (g.cpumask(PMU_A)?, probe_cpu(&mut g, e1)?);
    checks.push(check(
        "moves on offline",
        mask == [other] && on == i64::from(other),
        format!("CPU {first} offline: cpumask {mask:?}, event counts on CPU {on}"),
    ));

    // The last allowed CPU goes: parked, opens refused, the event keeps its value.
    g.set_online(other, false)?;
    let (mask, refused, kept) = (
        g.cpumask(PMU_A)?,
        probe_open(&mut g, type_a)?,
        probe_cpu(&mut g, e1)?,
    );
    checks.push(check(
        "parks when its set is offline",
        mask.is_empty() && refused == Err("ENODEV".into()) && kept == i64::from(other),
        format!("cpumask {mask:?}, a new open gives {refused:?}, the open event reads CPU {kept} (its last)"),
    ));

    // A CPU outside the set returning changes nothing; one inside places it again.
    g.set_online(B_ALLOWED, false)?;
    g.set_online(B_ALLOWED, true)?;
    let still_parked = g.cpumask(PMU_A)?;
    g.set_online(first, true)?;
    let mask = g.cpumask(PMU_A)?;
    let reopened = probe_open(&mut g, type_a)?;
    let reopened_on = match reopened {
        Ok(handle) => Some(probe_cpu(&mut g, handle)?),
        Err(_) => None,
    };
    let returned_on = probe_cpu(&mut g, e1)?;
    checks.push(check(
        "placed again on return, with its events",
        still_parked.is_empty()
            && mask == [first]
            && reopened_on == Some(i64::from(first))
            && returned_on == i64::from(first),
        format!(
            "after CPU {B_ALLOWED} cycled: cpumask {still_parked:?}; after CPU {first} online: cpumask {mask:?}, \
             a new open counts on {reopened_on:?}, the event open across the park on {returned_on}"
        ),
    ));
    g.set_online(other, true)?;

    // The other PMU parks and returns on its own.
    g.set_online(B_ALLOWED, false)?;
    let (mask_parked, refused) = (g.cpumask(PMU_B)?, probe_open(&mut g, type_b)?);
    g.set_online(B_ALLOWED, true)?;
    let mask_back = g.cpumask(PMU_B)?;
    checks.push(check(
        "a single-CPU PMU parks and returns",
        mask_parked.is_empty() && refused == Err("ENODEV".into()) && mask_back == [B_ALLOWED],
        format!("{PMU_B}: CPU {B_ALLOWED} offline: cpumask {mask_parked:?}, open {refused:?}; back: {mask_back:?}"),
    ));

    // Opens racing moves: each succeeds where the PMU is, or fails with
    // ENODEV while it is parked; a move is never the caller's problem.
    let attr = probe_attr(type_a);
    let race = match g.ask(HostRequest::PerfOpenRace {
        attr,
        cpu: 0,
        hotplug_ops: RACE_HOTPLUG_OPS,
        toggle_cpus: A_ALLOWED.to_vec(),
        keep: RACE_KEEP,
        software_siblings: false,
    })? {
        AgentMessage::Race(race) => race,
        other => bail!("the open race: {other:?}"),
    };
    let mask = g.cpumask(PMU_A)?;
    // What the race cost inside the kernel (patch 0006), to show that the
    // opens did meet moves and were waited or tried again, not just lucky.
    let (waits, retries) = g.open_waits_and_retries(PMU_A)?;
    let home = mask.first().map(|&c| u64::from(c) + 1);
    let strays = race
        .final_values
        .iter()
        .filter(|&&v| Some(v) != home)
        .count();
    let only_parked = race.other_errors.iter().all(|e| e.starts_with("ENODEV:"));
    checks.push(check(
        "opens racing hotplug",
        race.busy == 0
            && race.opened > 0
            && only_parked
            && strays == 0
            && race.hotplug_ops == RACE_HOTPLUG_OPS,
        format!(
            "{} opens during {} hotplug operations: {} opened, {} EBUSY, other errors {:?} (only ENODEV, while parked, may appear); in the kernel {waits} waited for a move and {retries} were tried again; of the {} kept open, {strays} left off the PMU's CPU {mask:?}",
            race.attempts, race.hotplug_ops, race.opened, race.busy, race.other_errors, race.final_values.len()
        ),
    ));

    // An existing scope (core) is untouched: its events stay on the CPU they
    // were opened on, and its cpumask follows the online CPUs.
    let type_core = g.pmu_type(PMU_CORE)?;
    let before = g.cpumask(PMU_CORE)?;
    let core_event = probe_open_on(&mut g, type_core, B_ALLOWED as i32)?;
    let core_on = match core_event {
        Ok(handle) => Some(probe_cpu(&mut g, handle)?),
        Err(_) => None,
    };
    g.set_online(B_ALLOWED, false)?;
    let without = g.cpumask(PMU_CORE)?;
    g.set_online(B_ALLOWED, true)?;
    let back = g.cpumask(PMU_CORE)?;
    let expected_without: Vec<u32> = before.iter().copied().filter(|&c| c != B_ALLOWED).collect();
    checks.push(check(
        "core scope unchanged",
        before.contains(&B_ALLOWED) && core_on == Some(i64::from(B_ALLOWED)) && without == expected_without && back == before,
        format!("{PMU_CORE}: cpumask {before:?}; an event opened on CPU {B_ALLOWED} counts on {core_on:?}; CPU {B_ALLOWED} offline: {without:?}; back: {back:?}"),
    ));
    if let Ok(handle) = core_event {
        g.close(handle)?;
    }

    for handle in [Some(e1), reopened.ok()].into_iter().flatten() {
        g.close(handle)?;
    }
    g.expect_done(HostRequest::UnloadModule {
        name: MODULE.into(),
    })?;
    Ok(checks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kunit_results_are_read_from_ktap() {
        let passed = "[    1.0] KTAP version 1\n[    1.0] 1..1\n[    1.1]     # Subtest: perf_device_scope\n\
                      [    1.1]     ok 1 pmu_registers_on_an_allowed_cpu\n[    1.2]     ok 2 pmu_follows_cpu_hotplug\n\
                      [    1.2] # perf_device_scope: pass:2 fail:0 skip:0 total:2\n[    1.2] ok 1 perf_device_scope\n";
        let verdict = kunit_suite(KUNIT_SUITE, passed);
        assert!(verdict.passed, "{}", verdict.detail);
        assert_eq!(verdict.detail, "2 of 2 cases passed at boot");

        let failed = passed
            .replace("    ok 2 pmu_follows", "    not ok 2 pmu_follows")
            .replace("pass:2 fail:0", "pass:1 fail:1");
        let verdict = kunit_suite(KUNIT_SUITE, &failed);
        assert!(!verdict.passed);
        assert!(
            verdict.detail.contains("not ok 2 pmu_follows_cpu_hotplug"),
            "{}",
            verdict.detail
        );

        let skipped = passed
            .replace(
                "ok 2 pmu_follows_cpu_hotplug",
                "ok 2 pmu_follows_cpu_hotplug # SKIP needs 4 online CPUs",
            )
            .replace("pass:2 fail:0 skip:0", "pass:1 fail:0 skip:1");
        assert!(!kunit_suite(KUNIT_SUITE, &skipped).passed);

        let absent = kunit_suite(KUNIT_SUITE, "[    1.0] Run /init as init process\n");
        assert!(!absent.passed && absent.detail.contains("ran no KUnit suite"));
    }
}
