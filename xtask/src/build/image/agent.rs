//! The guest agent: a static binary built by the cargo that runs xtask
//! (cargo's own incremental build is its cache).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;

use super::arch::Arch;
use crate::build::deps;
use crate::cmd::Step;

pub fn build(workspace: &Path) -> Result<PathBuf> {
    build_for(workspace, Arch::X86_64)
}

/// The agent for `arch`. The target is named explicitly even for the
/// host's own: with `--target`, RUSTFLAGS reach only the agent and not the
/// build scripts of its dependencies.
///
/// arm64's is cross-built by Debian's rustc (`/usr/bin/rustc`), whose
/// aarch64 standard library comes from `libstd-rust-web-dev:arm64` through
/// multiarch (rustup's toolchain has no aarch64 target here and cannot
/// fetch one), linked by Debian's `aarch64-linux-gnu-gcc` against
/// `libc6-dev-arm64-cross`.
pub fn build_for(workspace: &Path, arch: Arch) -> Result<PathBuf> {
    let target = arch.rust_target();
    let target_dir = workspace.join("target");
    let log = match arch {
        Arch::X86_64 => "perfbed/logs/agent.log".to_string(),
        _ => format!("perfbed/logs/agent-{}.log", arch.kernel_arch()),
    };
    let step = Step::start("building the guest agent", &target_dir.join(log))?;
    let mut cargo = Command::new(deps::cargo());
    cargo
        .current_dir(workspace)
        .args([
            "build",
            "--release",
            "--package",
            "perfbed-agent",
            "--target",
            target,
        ])
        .env("RUSTFLAGS", "-C target-feature=+crt-static");
    if let Some(cross) = arch.cross_compile() {
        cargo
            .env("RUSTC", super::kernel::RUSTC)
            .env_remove("RUSTUP_TOOLCHAIN")
            .env(
                format!(
                    "CARGO_TARGET_{}_LINKER",
                    target.to_uppercase().replace('-', "_")
                ),
                format!("{cross}gcc"),
            );
    }
    step.run(&mut cargo)?;
    step.finish();
    Ok(target_dir.join(target).join("release/perfbed-agent"))
}
