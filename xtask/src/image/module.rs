//! perfbed.ko: `guest-driver/` built out of tree against the cached kernel.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::kernel::Kernel;
use crate::cache::{self, Entry, Key};
use crate::cmd::Step;

const RECIPE: &str = "module-1";

/// Returns the cached module, building it if the kernel or the module's
/// sources changed. The build runs on a copy of `guest-driver/` inside the
/// cache entry so that the work tree never sees build outputs.
pub fn ensure(workspace: &Path, kernel: &Kernel) -> Result<PathBuf> {
    let sources = workspace.join("guest-driver");
    let mut key = Key::new(RECIPE);
    key.add("kernel", kernel.key.as_bytes());
    key.add_tree("guest-driver", &sources)?;
    let entry = Entry::new("module", &key)?;
    let ko = entry.dir.join("build/perfbed.ko");
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
    let step = Step::start("building perfbed.ko", &entry.dir.join("build.log"))?;
    step.run(Kernel::make(&kernel.tree)?.arg(format!("M={}", build.display())).arg("modules"))?;
    entry.mark_ready()?;
    step.finish();
    Ok(ko)
}
