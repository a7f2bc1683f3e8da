//! busybox for a foreign guest: Debian's `busybox-static` for that
//! architecture, fetched with `apt-get download` and unpacked into the
//! cache (it cannot be installed beside the host's own: the package is not
//! `Multi-Arch: same`).

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result};

use super::arch::Arch;
use crate::build::cache::{Entry, Key};
use crate::build::deps;
use crate::cmd::{self, Step};

const RECIPE: &str = "busybox-1";
const PACKAGE: &str = "busybox-static";

/// The static busybox binary for `arch`, fetched if missing.
pub fn ensure(arch: Arch) -> Result<PathBuf> {
    let spec = format!("{PACKAGE}:{}", arch.debian());
    let policy = cmd::output(Command::new("apt-cache").args(["policy", &spec]))?;
    let version = policy
        .lines()
        .find_map(|l| l.trim().strip_prefix("Candidate: "))
        .filter(|v| *v != "(none)")
        .with_context(|| {
            format!(
                "apt has no {spec} (is Debian's {} architecture enabled? `cargo xtask deps`)",
                arch.debian()
            )
        })?
        .to_string();
    let mut key = Key::new(RECIPE);
    key.add("package", spec.as_bytes())
        .add("version", version.as_bytes());
    let entry = Entry::new("busybox", &key)?;
    let binary = entry.dir.join("busybox");
    if entry.is_ready() {
        return Ok(binary);
    }
    entry.begin()?;
    let step = Step::start(
        &format!("fetching {spec} {version}"),
        &entry.dir.join("fetch.log"),
    )?;
    let download = entry.dir.join("deb");
    fs::create_dir_all(&download)?;
    let deb = deps::apt_download(&step, &download, &format!("{spec}={version}"))?;
    let unpacked = entry.dir.join("unpacked");
    step.run(Command::new("dpkg").arg("-x").arg(&deb).arg(&unpacked))?;
    fs::rename(unpacked.join("bin/busybox"), &binary).context("the package has no bin/busybox")?;
    let _ = fs::remove_dir_all(&unpacked);
    let _ = fs::remove_dir_all(&download);
    entry.mark_ready()?;
    step.finish();
    Ok(binary)
}
