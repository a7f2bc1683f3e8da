//! Group reads and the groups and attributes that must be refused.

use anyhow::{bail, Result};
use perfbed_agent::PerfAttr;
use perfbed_device::regs::Event;

use super::context::{config, Ctx, MIB};
use crate::checks::Check;
use crate::guest::perf_abi::{
    FLAG_EXCLUDE_USER, FORMAT_GROUP, FORMAT_TOTAL_TIME_ENABLED, FORMAT_TOTAL_TIME_RUNNING,
    PERF_COUNT_SW_CPU_CLOCK, PERF_TYPE_SOFTWARE,
};
use crate::guest::pmu_name;

/// 6. A group read of a domain's three events; the groups that must be refused.
pub fn groups(ctx: &mut Ctx) -> Result<Check> {
    let d = 0;
    let rmid = 6;
    let mut problems = Vec::new();
    let mut leader_attr = ctx.attr(d, Event::MbmTotalBytes, rmid);
    leader_attr.read_format = FORMAT_GROUP | FORMAT_TOTAL_TIME_ENABLED | FORMAT_TOTAL_TIME_RUNNING;
    let leader = match ctx.g.open(leader_attr, None)? {
        Ok(h) => h,
        Err(errno) => bail!("opening the group leader: {errno}"),
    };
    let mut members = vec![leader];
    for event in [Event::MbmLocalBytes, Event::LlcOccupancy] {
        match ctx.g.open(ctx.attr(d, event, rmid), Some(leader))? {
            Ok(h) => members.push(h),
            Err(errno) => problems.push(format!("a {event:?} sibling was refused: {errno}")),
        }
    }
    ctx.control
        .set_occupancy(d as u32, rmid, 4096 * ctx.device.unit_bytes)?;
    ctx.inject_and_land(&[
        (d, rmid, Event::MbmTotalBytes, 2 * MIB),
        (d, rmid, Event::MbmLocalBytes, MIB),
    ])?;
    let v = ctx.g.read(leader)?;
    let want = [3, 2 * MIB, MIB, 4096 * ctx.device.unit_bytes];
    // GROUP|TOTAL_TIME_ENABLED|TOTAL_TIME_RUNNING: nr, enabled, running, values...
    if v.len() < 6 || v[0] != want[0] || v[3..6] != want[1..] || v[1] != v[2] {
        problems.push(format!(
            "group read {v:?}, expected nr 3, enabled == running, values {:?}",
            &want[1..]
        ));
    }

    // A software event may join, on the group's CPU.
    let cpu = ctx.g.cpumask(&pmu_name(d))?.first().copied().unwrap_or(0) as i32;
    let sw = PerfAttr {
        type_: PERF_TYPE_SOFTWARE,
        config: PERF_COUNT_SW_CPU_CLOCK,
        ..PerfAttr::default()
    };
    match ctx.g.open_as(sw, -1, cpu, Some(leader))? {
        Ok(h) => members.push(h),
        Err(errno) => problems.push(format!("a software sibling was refused: {errno}")),
    }
    for h in members.into_iter().rev() {
        ctx.g.close(h)?;
    }

    // More slot events than the domain has slots: refused at open.
    let big = match ctx.g.open(ctx.attr(d, Event::MbmTotalBytes, 0), None)? {
        Ok(h) => h,
        Err(errno) => bail!("opening a leader: {errno}"),
    };
    let mut big_members = vec![big];
    let mut refused_big = None;
    for i in 1..=ctx.device.slots {
        match ctx.g.open(
            ctx.attr(d, Event::MbmTotalBytes, i % ctx.device.rmids),
            Some(big),
        )? {
            Ok(h) => big_members.push(h),
            Err(errno) => {
                refused_big = Some((i + 1, errno));
                break;
            }
        }
    }
    for h in big_members.into_iter().rev() {
        ctx.g.close(h)?;
    }
    let slots = ctx.device.slots;
    if refused_big != Some((slots + 1, "EINVAL".into())) {
        problems.push(format!("a group of {} slot events: refusal {refused_big:?}, expected the event {} refused with EINVAL", slots + 1, slots + 1));
    }

    // Another hardware PMU in the group: refused.
    let mut mixed = None;
    if ctx.types.len() > 1 {
        let leader = match ctx.g.open(ctx.attr(0, Event::MbmTotalBytes, 1), None)? {
            Ok(h) => h,
            Err(errno) => bail!("opening a leader: {errno}"),
        };
        mixed = Some(
            ctx.g
                .open(ctx.attr(1, Event::MbmTotalBytes, 1), Some(leader))?,
        );
        if let Some(Ok(h)) = mixed {
            ctx.g.close(h)?;
        }
        ctx.g.close(leader)?;
        if mixed != Some(Err("EINVAL".into())) {
            problems.push(format!(
                "a {} event in a {} group gave {mixed:?}, expected EINVAL",
                pmu_name(1),
                pmu_name(0)
            ));
        }
    }
    Ok(Check::from_problems("groups", problems, format!("group read of 3 events exact and co-scheduled; software sibling joins; {}-event group refused (EINVAL); cross-PMU group refused ({mixed:?})", slots + 1)))
}

/// 7. The bad-attribute matrix, each with its errno.
pub fn bad_attributes(ctx: &mut Ctx) -> Result<Check> {
    let d = 0;
    let good = ctx.attr(d, Event::MbmTotalBytes, 1);
    let cases: Vec<(&str, PerfAttr, i32, i32, &str)> = vec![
        (
            "wrong type",
            PerfAttr {
                type_: good.type_ + 1000,
                ..good.clone()
            },
            -1,
            0,
            "ENOENT",
        ),
        (
            "unknown event",
            PerfAttr {
                config: 0x09,
                ..good.clone()
            },
            -1,
            0,
            "EINVAL",
        ),
        (
            "unknown config bits",
            PerfAttr {
                config: good.config | 1 << 40,
                ..good.clone()
            },
            -1,
            0,
            "EINVAL",
        ),
        (
            "RMID out of range",
            PerfAttr {
                config: config(Event::MbmTotalBytes, ctx.device.rmids + 100),
                ..good.clone()
            },
            -1,
            0,
            "EINVAL",
        ),
        (
            "exclude_user",
            PerfAttr {
                flags: FLAG_EXCLUDE_USER,
                ..good.clone()
            },
            -1,
            0,
            "EINVAL",
        ),
        ("per-task", good.clone(), 0, -1, "EINVAL"),
        (
            "sampling",
            PerfAttr {
                sample_period: 1000,
                ..good.clone()
            },
            -1,
            0,
            "EOPNOTSUPP",
        ),
    ];
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    for (name, attr, pid, cpu, want) in cases {
        let got = ctx.g.open_as(attr, pid, cpu, None)?;
        if let Ok(h) = got {
            ctx.g.close(h)?;
        }
        seen.push(format!(
            "{name}: {}",
            got.as_ref().err().map_or("opened", |e| e.as_str())
        ));
        if got != Err(want.into()) {
            problems.push(format!("{name}: {got:?}, expected {want}"));
        }
    }
    Ok(Check::from_problems(
        "bad attributes",
        problems,
        seen.join(", "),
    ))
}
