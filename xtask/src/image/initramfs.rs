//! The guest's initramfs: the agent as `/init`, the modules it loads, and the
//! few nodes the kernel needs before devtmpfs is mounted.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::cpio::{Archive, Kind};
use crate::cache::{Entry, Key};

const RECIPE: &str = "initramfs-2";

/// Returns the cached initramfs for this agent and these modules: the agent
/// loads `boot_modules` (in `/lib/modules`) as it starts, `extra_modules`
/// (in `/lib/modules/extra`) only when a test asks.
pub fn ensure(agent: &Path, boot_modules: &[PathBuf], extra_modules: &[PathBuf]) -> Result<PathBuf> {
    let agent_bytes = fs::read(agent).with_context(|| format!("reading {}", agent.display()))?;
    let mut module_bytes = Vec::new();
    for (dir, modules) in [("lib/modules", boot_modules), ("lib/modules/extra", extra_modules)] {
        for ko in modules {
            let name = ko.file_name().context("a module path has a file name")?.to_string_lossy();
            let bytes = fs::read(ko).with_context(|| format!("reading {}", ko.display()))?;
            module_bytes.push((format!("{dir}/{name}"), bytes));
        }
    }
    let mut key = Key::new(RECIPE);
    key.add("agent", &agent_bytes);
    for (name, bytes) in &module_bytes {
        key.add(name, bytes);
    }
    let entry = Entry::new("initramfs", &key)?;
    let cpio = entry.dir.join("initramfs.cpio");
    if entry.is_ready() {
        return Ok(cpio);
    }
    entry.begin()?;
    let mut archive = Archive::new();
    for dir in ["dev", "proc", "sys", "lib", "lib/modules", "lib/modules/extra"] {
        archive.add(dir, Kind::Dir);
    }
    // The kernel opens /dev/console for init's stdio before anything mounts
    // devtmpfs; without it the agent's fatal errors would go nowhere.
    archive.add("dev/console", Kind::CharDevice { major: 5, minor: 1 });
    archive.add("init", Kind::File { data: &agent_bytes, executable: true });
    for (path, bytes) in &module_bytes {
        archive.add(path, Kind::File { data: bytes, executable: false });
    }
    fs::write(&cpio, archive.finish()).with_context(|| format!("writing {}", cpio.display()))?;
    entry.mark_ready()?;
    eprintln!("==> initramfs written: {}", cpio.display());
    Ok(cpio)
}
