//! The guest agent: a static binary built by the cargo that runs xtask
//! (cargo's own incremental build is its cache).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;

use crate::build::deps;
use crate::cmd::Step;

/// Always the host's triple, named explicitly: with `--target`, RUSTFLAGS
/// reach only the agent and not the build scripts of its dependencies.
const TARGET: &str = "x86_64-unknown-linux-gnu";

pub fn build(workspace: &Path) -> Result<PathBuf> {
    let target_dir = workspace.join("target");
    let step = Step::start(
        "building the guest agent",
        &target_dir.join("perfbed/logs/agent.log"),
    )?;
    step.run(
        Command::new(deps::cargo())
            .current_dir(workspace)
            .args([
                "build",
                "--release",
                "--package",
                "perfbed-agent",
                "--target",
                TARGET,
            ])
            .env("RUSTFLAGS", "-C target-feature=+crt-static"),
    )?;
    step.finish();
    Ok(target_dir.join(TARGET).join("release/perfbed-agent"))
}
