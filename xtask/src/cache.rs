//! The build cache outside the work tree: `$XDG_CACHE_HOME/perfbed`, or
//! `~/.cache/perfbed`. Every artifact lives in a folder named by a hash of
//! everything that went into it, and counts only once its `READY` marker is
//! written, so an interrupted build is redone rather than trusted.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

pub fn root() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("perfbed"));
    }
    let home = std::env::var_os("HOME").context("neither XDG_CACHE_HOME nor HOME is set")?;
    Ok(PathBuf::from(home).join(".cache/perfbed"))
}

/// Collects the inputs of one artifact into a cache key.
pub struct Key(Sha256);

impl Key {
    /// `recipe` names the artifact and the version of the code that builds it:
    /// bump it when the build steps change.
    pub fn new(recipe: &str) -> Key {
        let mut key = Key(Sha256::new());
        key.add("recipe", recipe.as_bytes());
        key
    }

    /// Adds a named input. The name and length are hashed too, so that
    /// ("ab", "c") and ("a", "bc") give different keys.
    pub fn add(&mut self, name: &str, value: &[u8]) -> &mut Key {
        for part in [name.as_bytes(), value] {
            self.0.update((part.len() as u64).to_le_bytes());
            self.0.update(part);
        }
        self
    }

    /// Adds every file below `dir` (path relative to `dir`, and contents), in
    /// a stable order.
    pub fn add_tree(&mut self, name: &str, dir: &Path) -> Result<&mut Key> {
        for file in files_below(dir)? {
            let rel = file.strip_prefix(dir).expect("below dir").to_string_lossy().into_owned();
            let bytes = fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            self.add(&format!("{name}/{rel}"), &bytes);
        }
        Ok(self)
    }

    /// 16 hex digits: short enough for paths, long enough never to collide
    /// among one machine's builds.
    pub fn hex(&self) -> String {
        let digest = self.0.clone().finalize();
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Regular files below `dir`, sorted; dot-files and build outputs of an
/// in-place module build are skipped.
pub fn files_below(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let path = entry?.path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if name.starts_with('.') {
                continue;
            }
            if path.is_dir() {
                pending.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// One artifact folder in the cache.
pub struct Entry {
    pub dir: PathBuf,
}

impl Entry {
    pub fn new(kind: &str, key: &Key) -> Result<Entry> {
        Ok(Entry { dir: root()?.join(kind).join(key.hex()) })
    }

    /// Whether the artifact is complete. A complete one is marked as used
    /// now: pruning drops the least recently used, never one this run needs.
    pub fn is_ready(&self) -> bool {
        let marker = self.dir.join("READY");
        let Ok(file) = fs::OpenOptions::new().write(true).open(&marker) else { return false };
        let _ = file.set_modified(std::time::SystemTime::now());
        true
    }

    /// Starts the artifact afresh: whatever a previous, unfinished attempt
    /// left is removed.
    pub fn begin(&self) -> Result<()> {
        if self.dir.exists() {
            fs::remove_dir_all(&self.dir)
                .with_context(|| format!("removing the unfinished {}", self.dir.display()))?;
        }
        fs::create_dir_all(&self.dir).with_context(|| format!("creating {}", self.dir.display()))
    }

    /// Marks the artifact complete, and drops the least recently used of its
    /// kind beyond the [`keep`] most recent (a kernel tree is ~2 GB).
    pub fn mark_ready(&self) -> Result<()> {
        fs::write(self.dir.join("READY"), b"").context("writing the READY marker")?;
        let kind = self.dir.parent().expect("an entry lives in its kind's folder");
        let name = kind.file_name().unwrap_or_default().to_string_lossy();
        for old in entries_to_prune(kind, keep(&name))? {
            eprintln!("    pruning the old cache entry {}", old.display());
            fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))?;
        }
        Ok(())
    }
}

/// How many finished entries of a kind the cache keeps: enough for every
/// variant in use at once (normal and debug kernels; two modules and an
/// initramfs per kernel) and the previous build of each, few of the big ones.
pub fn keep(kind: &str) -> usize {
    match kind {
        "kernel" => 3,
        "qemu" => 2,
        _ => 8,
    }
}

/// Finished entries of one kind beyond the `keep` most recently used (the
/// READY marker's modification time: written when finished, touched on use).
/// Unfinished ones are left alone: another build may be writing them.
fn entries_to_prune(kind: &Path, keep: usize) -> Result<Vec<PathBuf>> {
    let mut finished = Vec::new();
    for entry in fs::read_dir(kind).with_context(|| format!("reading {}", kind.display()))? {
        let dir = entry?.path();
        if let Ok(meta) = fs::metadata(dir.join("READY")) {
            finished.push((meta.modified()?, dir));
        }
    }
    finished.sort_by_key(|(modified, _)| std::cmp::Reverse(*modified));
    Ok(finished.into_iter().skip(keep).map(|(_, dir)| dir).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_oldest_finished_entries_are_pruned() {
        let kind = std::env::temp_dir().join(format!("perfbed-prune-{}", std::process::id()));
        let _ = fs::remove_dir_all(&kind);
        for (name, ready) in [("a", true), ("b", true), ("c", false), ("d", true)] {
            fs::create_dir_all(kind.join(name)).unwrap();
            if ready {
                fs::write(kind.join(name).join("READY"), b"").unwrap();
                // Distinct modification times, in name order.
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        assert_eq!(entries_to_prune(&kind, 2).unwrap(), vec![kind.join("a")]);
        assert!(entries_to_prune(&kind, 3).unwrap().is_empty());
        // Using the oldest makes it the newest: the next oldest goes instead.
        assert!(Entry { dir: kind.join("a") }.is_ready());
        assert!(!Entry { dir: kind.join("c") }.is_ready());
        assert_eq!(entries_to_prune(&kind, 2).unwrap(), vec![kind.join("b")]);
        fs::remove_dir_all(&kind).unwrap();
    }

    #[test]
    fn keys_depend_on_names_values_and_boundaries() {
        let hex = |parts: &[(&str, &str)]| {
            let mut key = Key::new("test-1");
            for (n, v) in parts {
                key.add(n, v.as_bytes());
            }
            key.hex()
        };
        assert_eq!(hex(&[("a", "1")]), hex(&[("a", "1")]));
        assert_ne!(hex(&[("a", "1")]), hex(&[("a", "2")]));
        assert_ne!(hex(&[("a", "1")]), hex(&[("b", "1")]));
        assert_ne!(hex(&[("a", "bc")]), hex(&[("ab", "c")]));
        assert_ne!(Key::new("x-1").hex(), Key::new("x-2").hex());
        assert_eq!(hex(&[]).len(), 16);
    }
}
