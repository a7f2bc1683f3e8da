//! The device model's own cost: criterion's `device/benches/access.rs`,
//! run by cargo, its estimates read back from `target/criterion`.

use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

use super::report::{Goal, Row};
use super::stats::Summary;
use crate::build::deps;
use crate::cmd::Step;

/// The goal of the issue: a register access in the model within 100 ns.
const MODEL_GOAL_NS: f64 = 100.0;

pub fn rows(workspace: &Path, quick: bool) -> Result<Vec<Row>> {
    let step = Step::start(
        "criterion: device register accesses",
        &workspace.join("target/perfbed/logs/bench-device.log"),
    )?;
    let mut cargo = Command::new(deps::cargo());
    cargo.current_dir(workspace).args([
        "bench",
        "--package",
        "perfbed-device",
        "--bench",
        "access",
        "--",
    ]);
    if quick {
        cargo.args([
            "--warm-up-time",
            "0.2",
            "--measurement-time",
            "0.5",
            "--sample-size",
            "10",
        ]);
    } else {
        cargo.args(["--warm-up-time", "1", "--measurement-time", "3"]);
    }
    step.run(&mut cargo)?;
    step.finish();
    let criterion = workspace.join("target/criterion");
    let median = |id: &str| median_ns(&criterion.join(id).join("new/estimates.json"));
    let owner = median("model/owner_counter_read")?;
    let violating = median("model/violating_counter_read")?;
    let global = median("model/global_read")?;
    let write = median("model/slot_ctl_write")?;
    let shared = median("shared/owner_counter_read")?;
    let how =
        "criterion median of the benchmark thread's CPU time ± half its 95% confidence interval; \
               each access moves time 1 us with traffic landing";
    Ok(vec![
        Row::measured("device: model ns/access (owner counter read)", owner, "ns")
            .against("global register read", global.median)
            .goal(Goal::AtMost(MODEL_GOAL_NS))
            .note(how),
        Row::measured(
            "device: model ns/access (placement violation)",
            violating,
            "ns",
        )
        .against("owner counter read", owner.median),
        Row::measured("device: model ns/access (SLOT_CTL write)", write, "ns")
            .goal(Goal::AtMost(MODEL_GOAL_NS)),
        Row::measured("device: host lock + clock + model ns/access", shared, "ns")
            .against("model alone", owner.median)
            .note("SharedDevice::mmio_read: what both hosts call per access"),
    ])
}

/// The median point estimate (ns) of one criterion benchmark, its spread
/// half the width of criterion's confidence interval for it.
fn median_ns(estimates: &Path) -> Result<Summary> {
    let text = fs::read_to_string(estimates)
        .with_context(|| format!("reading {}", estimates.display()))?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", estimates.display()))?;
    let median = &doc["median"];
    let field = |value: &serde_json::Value, what: &str| {
        value
            .as_f64()
            .with_context(|| format!("{} has no median {what}", estimates.display()))
    };
    let interval = &median["confidence_interval"];
    let (lower, upper) = (
        field(&interval["lower_bound"], "lower bound")?,
        field(&interval["upper_bound"], "upper bound")?,
    );
    Ok(Summary {
        median: field(&median["point_estimate"], "point estimate")?,
        spread: (upper - lower) / 2.0,
    })
}
