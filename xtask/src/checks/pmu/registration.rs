//! The PMUs as perfbed.ko registers them: sysfs, `perf list`, and rmmod.

use anyhow::Result;
use perfbed_agent::{AgentMessage, HostRequest};
use perfbed_device::regs::Event;

use super::context::{Ctx, EVENT_FILES, SCALE, UNIT};
use crate::checks::Check;
use crate::guest::{pmu_name, MODULE};

/// 1. The PMUs, their events/format files, a cpumask inside each domain's
///    allowed set, and `perf list` showing the events.
pub fn sysfs(ctx: &mut Ctx) -> Result<Check> {
    let mut problems = Vec::new();
    let mut placed = Vec::new();
    for (d, allowed) in ctx.device.domains.clone().iter().enumerate() {
        let dir = format!("/sys/bus/event_source/devices/{}", pmu_name(d));
        let mask = ctx.g.cpumask(&pmu_name(d))?;
        if mask.len() != 1 || !allowed.contains(&mask[0]) {
            problems.push(format!(
                "{} cpumask {mask:?}, allowed {allowed:?}",
                pmu_name(d)
            ));
        }
        placed.push(format!("{}→{mask:?}", pmu_name(d)));
        let mut expected: Vec<(String, String)> = vec![
            ("format/event".into(), "config:0-7".into()),
            ("format/rmid".into(), "config:8-23".into()),
        ];
        for (name, event) in EVENT_FILES {
            expected.push((
                format!("events/{name}"),
                format!("event=0x{:02x}", event as u64),
            ));
            expected.push((format!("events/{name}.unit"), UNIT.into()));
            expected.push((format!("events/{name}.scale"), SCALE.into()));
        }
        for (file, want) in expected {
            let got = ctx.g.read_file(&format!("{dir}/{file}"))?;
            if got != want {
                problems.push(format!(
                    "{}/{file} is {got:?}, expected {want:?}",
                    pmu_name(d)
                ));
            }
        }
    }
    // `-v`: perf 6.12 lists the instances of a PMU whose names differ only
    // in a `_N` suffix once (as `perfbed_l3/...`), unless asked for the long
    // descriptions.
    let (status, stdout, stderr) = ctx.g.run(&["/usr/bin/perf", "list", "-v", "pmu"])?;
    for d in 0..ctx.device.domains.len() {
        for (name, _) in EVENT_FILES {
            let entry = format!("{}/{name}/", pmu_name(d));
            if !stdout.contains(&entry) {
                problems.push(format!(
                    "`perf list` (exit {status:?}) lacks {entry}: {}",
                    stderr.trim()
                ));
            }
        }
    }
    Ok(Check::from_problems(
        "PMUs and sysfs",
        problems,
        format!(
            "events/ with unit and scale, format/, {}; perf list shows all events",
            placed.join(", ")
        ),
    ))
}

/// rmmod is refused while an event is open, then unregisters cleanly (and
/// the driver loads again, leaving the device as it found it).
pub fn unload(ctx: &mut Ctx) -> Result<Check> {
    let h = ctx.open(0, Event::MbmTotalBytes, 1)?;
    let busy = ctx.g.ask(HostRequest::UnloadModule {
        name: MODULE.into(),
    })?;
    ctx.g.close(h)?;
    let unloaded = ctx.g.ask(HostRequest::UnloadModule {
        name: MODULE.into(),
    })?;
    let gone = ctx
        .g
        .read_file(&format!(
            "/sys/bus/event_source/devices/{}/type",
            pmu_name(0)
        ))
        .is_err();
    let state = ctx.control.state()?;
    let left: Vec<String> = state
        .domains
        .iter()
        .filter(|d| d.owner.is_some() || d.slots.iter().any(|s| s.event.is_some()))
        .map(|d| {
            format!(
                "domain {}: owner {:?}, slots {:?}",
                d.domain,
                d.owner,
                d.slots.iter().filter_map(|s| s.event).collect::<Vec<_>>()
            )
        })
        .collect();
    let reloaded = ctx.g.ask(HostRequest::LoadModule {
        name: MODULE.into(),
    })?;
    let mut problems = Vec::new();
    if busy == AgentMessage::Done {
        problems.push("rmmod with an open event succeeded".into());
    }
    if unloaded != AgentMessage::Done || !gone {
        problems.push(format!(
            "rmmod without events: {unloaded:?}, PMU gone: {gone}"
        ));
    }
    if !left.is_empty() {
        problems.push(format!(
            "after unload the device still has {}",
            left.join("; ")
        ));
    }
    if reloaded != AgentMessage::Done {
        problems.push(format!("loading again: {reloaded:?}"));
    }
    Ok(Check::from_problems("module unload", problems, format!("refused with an event open ({}); clean without: PMUs gone, no owner or slot left on the device; loads again", describe(&busy))))
}

fn describe(message: &AgentMessage) -> String {
    match message {
        AgentMessage::Error { error } => error.clone(),
        other => format!("{other:?}"),
    }
}
