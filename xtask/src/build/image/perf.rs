//! The guest's perf tool: `tools/perf` built from the same patched tree as
//! the guest kernel, with a small feature set, and its shell tests (`perf
//! test` runs them from the initramfs).
//!
//! Dynamically linked: its libraries (libelf, libz, libtraceevent, libm,
//! libc) go into the initramfs the way every host program's do
//! (`initramfs::shared_libraries`), about 0.6 MB; a static perf would need
//! the static archives of each and of their own dependencies, which Debian
//! does not ship for all of them.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::build::cache::{self, Entry, Key};
use crate::build::deps;
use crate::cmd::{self, Step};

/// Bump when the steps below change in a way that changes the result.
const RECIPE: &str = "perf-1";

/// perf's build switches: what a device-scope PMU's tests need (event
/// parsing, `perf stat`, `perf list`, tracepoints and `perf trace` through
/// libtraceevent, libelf for symbols) and nothing else: no Python or Perl
/// scripting, no TUI/GTK, no DWARF or unwinding, no BPF skeletons, no
/// hardware trace decoders. `prefix=/usr` puts the shell tests where perf
/// looks for them (`/usr/libexec/perf-core/tests/shell`).
pub const MAKE_FLAGS: &[&str] = &[
    "prefix=/usr",
    "NO_LIBPYTHON=1",
    "NO_LIBPERL=1",
    "NO_GTK2=1",
    "NO_SLANG=1",
    "NO_LIBUNWIND=1",
    "NO_DWARF=1",
    "NO_LIBDW_DWARF_UNWIND=1",
    "NO_LIBBPF=1",
    "BUILD_BPF_SKEL=0",
    "NO_LIBCRYPTO=1",
    "NO_LIBNUMA=1",
    "NO_LIBCAP=1",
    "NO_LIBBABELTRACE=1",
    "NO_JVMTI=1",
    "NO_LIBZSTD=1",
    "NO_LZMA=1",
    "NO_AUXTRACE=1",
    "NO_DEMANGLE=1",
    "NO_LIBLLVM=1",
    "NO_CAPSTONE=1",
    "NO_LIBPFM4=1",
    "NO_SDT=1",
    "NO_LIBAUDIT=1",
    "NO_LIBDEBUGINFOD=1",
    "NO_SHELLCHECK=1",
];

/// The Debian packages perf compiles and links against: their versions are
/// part of the key.
pub const LIBRARY_PACKAGES: &[&str] = &["libelf-dev", "libtraceevent-dev", "zlib1g-dev"];

/// Where the guest finds perf, and its shell tests (perf's own installed
/// layout for `prefix=/usr`).
pub const IN_GUEST: &str = "usr/bin/perf";
pub const TESTS_IN_GUEST: &str = "usr/libexec/perf-core/tests/shell";
const TESTS_IN_TREE: &str = "tools/perf/tests/shell";

/// A built perf in the cache.
pub struct Perf {
    /// The stripped binary.
    pub binary: PathBuf,
    /// A copy of the tree's `tools/perf/tests/shell`.
    pub tests: PathBuf,
}

/// The key of a perf built from a tree whose own inputs (source package
/// and patches) `source` names.
fn key(source: &str) -> Result<Key> {
    let mut key = Key::new(RECIPE);
    key.add("source", source.as_bytes());
    key.add("flags", MAKE_FLAGS.join(" ").as_bytes());
    key.add("gcc", deps::version_of("gcc")?.as_bytes());
    for package in LIBRARY_PACKAGES {
        let version =
            cmd::output(Command::new("dpkg-query").args(["-W", "-f=${Version}", package]))
                .with_context(|| format!("{package} is not installed; run `cargo xtask deps`"))?;
        key.add(package, version.as_bytes());
    }
    Ok(key)
}

/// Returns the cached perf for the tree `tree` (unpacked and patched from
/// the inputs `source` names), building it first if needed. Reads the tree
/// only: the objects go to the cache entry (`O=`), so it can build while
/// the kernel builds in the same tree.
pub fn ensure(tree: &Path, source: &str) -> Result<Perf> {
    let entry = Entry::new("perf", &key(source)?)?;
    let perf = Perf {
        binary: entry.dir.join("perf"),
        tests: entry.dir.join("tests/shell"),
    };
    if entry.is_ready() {
        return Ok(perf);
    }
    entry.begin()?;
    let step = Step::start(
        "building perf from the guest kernel's tree (about 40 s of both cores)",
        &entry.dir.join("build.log"),
    )?;
    let out = entry.dir.join("out");
    fs::create_dir_all(&out)?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    step.run(
        Command::new("make")
            .arg("-C")
            .arg(tree.join("tools/perf"))
            .arg(format!("O={}", out.display()))
            .arg(format!("-j{jobs}"))
            .args(MAKE_FLAGS),
    )?;
    step.run(
        Command::new("strip")
            .arg("-o")
            .arg(&perf.binary)
            .arg(out.join("perf")),
    )?;
    copy_tree(&tree.join(TESTS_IN_TREE), &perf.tests)?;
    fs::remove_dir_all(&out).context("removing perf's objects")?;
    entry.mark_ready()?;
    step.finish();
    Ok(perf)
}

/// Copies the regular files below `from` to `to`, keeping their modes
/// (perf runs only the executable `*.sh` as tests).
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    for file in cache::files_below(from)? {
        let target = to.join(file.strip_prefix(from).expect("below from"));
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::copy(&file, &target).with_context(|| format!("copying {}", file.display()))?;
    }
    Ok(())
}

/// `perf --version`'s version ("6.12.118") matches the guest kernel's
/// release ("6.12.118" or "6.12.118-perfbed"): the tool is the tree's.
pub fn version_matches(perf_version: &str, kernel_release: &str) -> bool {
    let version = perf_version.trim().trim_start_matches("perf version ");
    let base = |v: &str| v.split(['-', '+', ' ']).next().unwrap_or("").to_string();
    !version.is_empty() && base(version) == base(kernel_release)
}

#[cfg(test)]
mod tests {
    use super::version_matches;

    #[test]
    fn perf_version_is_the_kernels() {
        assert!(version_matches("perf version 6.12.118\n", "6.12.118"));
        assert!(version_matches("perf version 6.12.118", "6.12.118-perfbed"));
        // Debian's perf of another release is not the guest's.
        assert!(!version_matches("perf version 6.1.187", "6.12.118"));
        assert!(!version_matches("perf version 6.12.11", "6.12.118"));
        assert!(!version_matches("", "6.12.118"));
    }
}
