//! The attributes that must be refused, each with its errno: an errno
//! matrix, not a counting check (group reads and the groups refused are a
//! scenario, `scenarios/groups/group-read-and-refused-groups.scn`).

use anyhow::Result;
use perfbed_agent::PerfAttr;
use perfbed_device::regs::Event;

use super::context::{config, Ctx};
use crate::checks::Check;
use crate::guest::perf_abi::FLAG_EXCLUDE_USER;

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
