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
            let rel = file
                .strip_prefix(dir)
                .expect("below dir")
                .to_string_lossy()
                .into_owned();
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

/// One artifact folder in the cache, locked against other perfbed processes
/// for as long as this one may use it.
///
/// Each entry has a lock file beside its folder (`<kind>/<hex>.lock`, outside
/// the folder so that [`Entry::begin`] cannot remove it). A process holds it
/// shared while it uses a finished entry, and exclusive while it builds one:
/// two runs at once share what is built, wait for what is being built rather
/// than build it twice into the same folder, and never prune what the other
/// still uses. The lock lives until the process exits (see [`Drop`]).
pub struct Entry {
    pub dir: PathBuf,
    lock: Option<fs::File>,
    ready: bool,
}

impl Entry {
    /// Finds the entry for `key` and locks it: shared if it is finished,
    /// exclusive (the caller builds it) if not.
    pub fn new(kind: &str, key: &Key) -> Result<Entry> {
        Entry::at(root()?.join(kind).join(key.hex()))
    }

    /// The entry in folder `dir` (`<cache>/<kind>/<key>`), locked.
    fn at(dir: PathBuf) -> Result<Entry> {
        let kind_dir = dir.parent().expect("an entry lives in its kind's folder");
        fs::create_dir_all(kind_dir).with_context(|| format!("creating {}", kind_dir.display()))?;
        let lock_path = lock_path(&dir);
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .with_context(|| format!("opening {}", lock_path.display()))?;
        let what = dir.display().to_string();
        flock(&lock, libc::LOCK_SH, &what)?;
        let mut ready = dir.join("READY").exists();
        if !ready {
            // Not finished: build it, unless another process finishes it
            // while this one waits for the exclusive lock.
            flock(&lock, libc::LOCK_UN, &what)?;
            flock(&lock, libc::LOCK_EX, &what)?;
            ready = dir.join("READY").exists();
            if ready {
                flock(&lock, libc::LOCK_SH, &what)?;
            }
        }
        Ok(Entry {
            dir,
            lock: Some(lock),
            ready,
        })
    }

    /// Whether the artifact is complete. A complete one is marked as used
    /// now: pruning drops the least recently used, never one this run needs.
    pub fn is_ready(&self) -> bool {
        if !self.ready {
            return false;
        }
        if let Ok(file) = fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("READY"))
        {
            let _ = file.set_modified(std::time::SystemTime::now());
        }
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
    /// kind beyond the [`keep`] most recent (a kernel tree is ~2 GB) that no
    /// other process is using.
    pub fn mark_ready(&self) -> Result<()> {
        fs::write(self.dir.join("READY"), b"").context("writing the READY marker")?;
        if let Some(lock) = &self.lock {
            flock(lock, libc::LOCK_SH, &self.dir.display().to_string())?;
        }
        let kind = self
            .dir
            .parent()
            .expect("an entry lives in its kind's folder");
        let name = kind.file_name().unwrap_or_default().to_string_lossy();
        for old in entries_to_prune(kind, keep(&name))? {
            // Skip an entry another process holds; take it exclusively while
            // removing it so that nobody starts using it meanwhile.
            let Ok(lock) = fs::OpenOptions::new().write(true).open(lock_path(&old)) else {
                continue;
            };
            // SAFETY: flock on a file descriptor this function owns.
            if unsafe {
                libc::flock(
                    std::os::fd::AsRawFd::as_raw_fd(&lock),
                    libc::LOCK_EX | libc::LOCK_NB,
                )
            } != 0
            {
                continue;
            }
            // Another process may have pruned it between the listing and
            // the lock (it held the lock while removing): nothing to do.
            if !old.join("READY").exists() {
                continue;
            }
            eprintln!("    pruning the old cache entry {}", old.display());
            match fs::remove_dir_all(&old) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("removing {}", old.display()));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl Drop for Entry {
    /// Keeps the entry's lock until the process exits: the caller goes on
    /// using the artifact's paths after the `Entry` is gone.
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            HELD_LOCKS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(lock);
        }
    }
}

/// Locks of the entries this process has used, held until it exits.
static HELD_LOCKS: std::sync::Mutex<Vec<fs::File>> = std::sync::Mutex::new(Vec::new());

/// Takes `path` (created if missing) as an exclusive lock, waiting for any
/// other perfbed process that holds it; released when the file is dropped.
pub fn lock_exclusive(path: &Path) -> Result<fs::File> {
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    flock(&file, libc::LOCK_EX, &path.display().to_string())?;
    Ok(file)
}

fn lock_path(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().expect("an entry has a name").to_os_string();
    name.push(".lock");
    dir.with_file_name(name)
}

/// `flock(2)`, saying so when it has to wait for another process.
fn flock(file: &fs::File, op: libc::c_int, what: &str) -> Result<()> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(file);
    // SAFETY: flock on a file descriptor `file` keeps open for this call.
    if op != libc::LOCK_UN && unsafe { libc::flock(fd, op | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    if op != libc::LOCK_UN {
        eprintln!("    waiting for another perfbed process that holds the cache entry {what}");
    }
    loop {
        // SAFETY: as above.
        if unsafe { libc::flock(fd, op) } == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err).with_context(|| format!("locking the cache entry {what}"));
        }
    }
}

/// How many finished entries of a kind the cache keeps: enough for every
/// variant in use at once (normal, debug, sanitize and gdb kernels; two
/// modules and an initramfs per kernel) and the previous build of each, so
/// that switching between two branches that patch the kernel differently
/// rebuilds nothing (the bench's unpatched kernel and an arm64 one evict
/// the oldest).
/// A kernel tree is ~1.8 GB. `PERFBED_CACHE_KERNELS=N` keeps N kernel
/// trees instead, for a machine that works on more branches at once.
pub fn keep(kind: &str) -> usize {
    match kind {
        "kernel" => std::env::var("PERFBED_CACHE_KERNELS")
            .ok()
            .and_then(|n| n.parse().ok())
            .filter(|&n: &usize| n > 0)
            .unwrap_or(8),
        // Main's and two branches' (say, one changing the shim and one the
        // configure line) and a previous one: with two, three branches'
        // QEMU builds evicted each other, ~5 min of both cores each time.
        "qemu" => 5,
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
    Ok(finished
        .into_iter()
        .skip(keep)
        .map(|(_, dir)| dir)
        .collect())
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
        let entry = |name: &str| Entry {
            dir: kind.join(name),
            lock: None,
            ready: kind.join(name).join("READY").exists(),
        };
        assert!(entry("a").is_ready());
        assert!(!entry("c").is_ready());
        assert_eq!(entries_to_prune(&kind, 2).unwrap(), vec![kind.join("b")]);
        fs::remove_dir_all(&kind).unwrap();
    }

    #[test]
    fn a_second_process_waits_for_the_build_then_shares_it() {
        let kind = std::env::temp_dir().join(format!("perfbed-lock-{}", std::process::id()));
        let _ = fs::remove_dir_all(&kind);
        let builder = Entry::at(kind.join("k")).unwrap();
        assert!(!builder.is_ready());
        builder.begin().unwrap();
        // flock locks belong to the open file, so a thread that opens the
        // lock file again contends like another process would.
        let (tx, rx) = std::sync::mpsc::channel();
        let dir = kind.join("k");
        let waiter = std::thread::spawn(move || {
            let entry = Entry::at(dir).unwrap();
            tx.send(entry.is_ready()).unwrap();
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            rx.try_recv().is_err(),
            "the second user must wait while the entry is built"
        );
        fs::write(builder.dir.join("artifact"), b"x").unwrap();
        builder.mark_ready().unwrap();
        assert!(
            rx.recv().unwrap(),
            "the second user sees the finished entry"
        );
        waiter.join().unwrap();
        // Both hold it shared now: nobody may prune it.
        let lock = fs::OpenOptions::new()
            .write(true)
            .open(lock_path(&kind.join("k")))
            .unwrap();
        // SAFETY: flock on a file this test owns.
        assert_ne!(
            unsafe {
                libc::flock(
                    std::os::fd::AsRawFd::as_raw_fd(&lock),
                    libc::LOCK_EX | libc::LOCK_NB,
                )
            },
            0
        );
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
