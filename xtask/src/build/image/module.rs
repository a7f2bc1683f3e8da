//! Out-of-tree Rust modules (perfbed.ko from `guest-driver/`, the scope test
//! module from `images/kernel/scope-test/`) built against the cached kernel.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::kernel::Kernel;
use crate::build::cache::{self, Entry, Key};
use crate::cmd::Step;

const RECIPE: &str = "module-1";

/// Returns the cached module `name`.ko built from the folder `dir` of the
/// workspace, building it if the kernel or the module's sources changed. The
/// build runs on a copy inside the cache entry so that the work tree never
/// sees build outputs.
///
/// `shared` names workspace files copied next to the module's sources, such
/// as the device's register map (`device/src/regs.rs`), which the driver
/// compiles as `mod regs;`: one definition for the device and the driver.
pub fn ensure(
    workspace: &Path,
    kernel: &Kernel,
    dir: &str,
    name: &str,
    shared: &[&str],
) -> Result<PathBuf> {
    let sources = workspace.join(dir);
    let mut key = Key::new(RECIPE);
    key.add("kernel", kernel.key.as_bytes());
    key.add_tree(dir, &sources)?;
    for file in shared {
        key.add(
            file,
            &fs::read(workspace.join(file)).with_context(|| format!("reading {file}"))?,
        );
    }
    let entry = Entry::new("module", &key)?;
    let ko = entry.dir.join("build").join(format!("{name}.ko"));
    if entry.is_ready() {
        return Ok(ko);
    }
    entry.begin()?;
    let build = entry.dir.join("build");
    fs::create_dir_all(&build)?;
    for file in cache::files_below(&sources)? {
        let rel = file.strip_prefix(&sources).expect("below sources");
        let to = build.join(rel);
        fs::create_dir_all(to.parent().expect("a file has a parent"))?;
        fs::copy(&file, &to).with_context(|| format!("copying {}", file.display()))?;
    }
    for file in shared {
        let name = Path::new(file)
            .file_name()
            .context("a shared file has a name")?;
        fs::copy(workspace.join(file), build.join(name))
            .with_context(|| format!("copying {file}"))?;
    }
    let step = Step::start(&format!("building {name}.ko"), &entry.dir.join("build.log"))?;
    step.run(
        Kernel::make_for(&kernel.tree, kernel.arch)?
            .arg(format!("M={}", build.display()))
            .arg("modules"),
    )?;
    entry.mark_ready()?;
    step.finish();
    Ok(ko)
}
