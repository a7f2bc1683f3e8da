//! The guest's perf tool: `tools/perf` built from the same patched tree as
//! the guest kernel, with a small feature set, and its shell tests (`perf
//! test` runs them from the initramfs).
//!
//! x86's is dynamically linked: its libraries (libelf, libz, libtraceevent,
//! libm, libc) go into the initramfs the way every host program's do
//! (`initramfs::shared_libraries`), about 0.6 MB; a static perf would need
//! the static archives of each and of their own dependencies, which Debian
//! does not ship for all of them. arm64's is cross-built with Debian's
//! `aarch64-linux-gnu-gcc` and linked statically against
//! `libtraceevent-dev:arm64` (multiarch, which ships `libtraceevent.a`) and
//! the cross C library, without libelf and zlib ([`ARM64_FLAGS`]): one file
//! in the initramfs, and no arm64 shared library to find on the host.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::arch::Arch;
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

/// What the arm64 perf adds to [`MAKE_FLAGS`]: cross-built, static (perf's
/// Makefile takes `-static` in `LDFLAGS` to link the static archives), and
/// without libelf (perf's minimal ELF reader finds symbols; no
/// `libelf-dev:arm64`, whose static archive would want zstd's too) and
/// zlib (compressed kernel modules, which the guest has none of). What the
/// checks use, `perf stat` (`-I`, `--control`), tracepoints, `perf trace`,
/// `perf record`'s refusal and `perf list`, needs neither. `PKG_CONFIG`:
/// Debian has no `aarch64-linux-gnu-pkg-config`; the host's finds the
/// arm64 `.pc` files through [`ARM64_PKG_CONFIG_LIBDIR`]. `DLFILTERS=`:
/// perf's example `perf script` filters are shared objects, which a static
/// link cannot make (and the guest does not use); `Makefile.perf` directly,
/// since `tools/perf/Makefile` hands its sub-make the command line's
/// variables through the environment only, where `Makefile.perf`'s own
/// `DLFILTERS :=` would win.
pub const ARM64_FLAGS: &[&str] = &[
    "-f",
    "Makefile.perf",
    "ARCH=arm64",
    "CROSS_COMPILE=aarch64-linux-gnu-",
    "LDFLAGS=-static",
    "NO_LIBELF=1",
    "NO_ZLIB=1",
    "PKG_CONFIG=pkg-config",
    "DLFILTERS=",
];

/// The arm64 perf's library, through multiarch (`deps::ARM64_PACKAGES`).
pub const ARM64_LIBRARY_PACKAGES: &[&str] = &["libtraceevent-dev:arm64"];

/// Where pkg-config finds the arm64 libraries' `.pc` files.
const ARM64_PKG_CONFIG_LIBDIR: &str = "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig";

/// perf's make switches for `arch`.
fn make_flags(arch: Arch) -> Vec<&'static str> {
    let extra = match arch {
        Arch::X86_64 => &[][..],
        Arch::Arm64 => ARM64_FLAGS,
    };
    MAKE_FLAGS.iter().chain(extra).copied().collect()
}

fn library_packages(arch: Arch) -> &'static [&'static str] {
    match arch {
        Arch::X86_64 => LIBRARY_PACKAGES,
        Arch::Arm64 => ARM64_LIBRARY_PACKAGES,
    }
}

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

/// The key of a perf for `arch` built from a tree whose own inputs (source
/// package and patches) `source` names; x86's is what it was before arm64
/// had a perf.
fn key(source: &str, arch: Arch) -> Result<Key> {
    let mut key = Key::new(RECIPE);
    if arch != Arch::X86_64 {
        key.add("arch", arch.kernel_arch().as_bytes());
    }
    key.add("source", source.as_bytes());
    key.add("flags", make_flags(arch).join(" ").as_bytes());
    key.add("gcc", deps::version_of(&arch.gcc())?.as_bytes());
    for package in library_packages(arch) {
        let version =
            cmd::output(Command::new("dpkg-query").args(["-W", "-f=${Version}", package]))
                .with_context(|| format!("{package} is not installed; run `cargo xtask deps`"))?;
        key.add(package, version.as_bytes());
    }
    Ok(key)
}

/// Returns the cached x86 perf for the tree `tree` (unpacked and patched
/// from the inputs `source` names), building it first if needed. Reads the
/// tree only: the objects go to the cache entry (`O=`), so it can build
/// while the kernel builds in the same tree.
pub fn ensure(tree: &Path, source: &str) -> Result<Perf> {
    ensure_for(tree, source, Arch::X86_64)
}

/// [`ensure`] for a guest of `arch`: arm64's cross-built and static.
pub fn ensure_for(tree: &Path, source: &str, arch: Arch) -> Result<Perf> {
    let entry = Entry::new("perf", &key(source, arch)?)?;
    let perf = Perf {
        binary: entry.dir.join("perf"),
        tests: entry.dir.join("tests/shell"),
    };
    if entry.is_ready() {
        return Ok(perf);
    }
    entry.begin()?;
    let step = Step::start(
        &format!(
            "building perf for {} from the guest kernel's tree (about 40 s of both cores)",
            arch.kernel_arch()
        ),
        &entry.dir.join("build.log"),
    )?;
    let out = entry.dir.join("out");
    fs::create_dir_all(&out)?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut make = Command::new("make");
    make.arg("-C")
        .arg(tree.join("tools/perf"))
        .arg(format!("O={}", out.display()))
        .arg(format!("-j{jobs}"))
        .args(make_flags(arch));
    if arch == Arch::Arm64 {
        make.env("PKG_CONFIG_LIBDIR", ARM64_PKG_CONFIG_LIBDIR);
    }
    step.run(&mut make)?;
    step.run(
        Command::new(format!("{}strip", arch.cross_compile().unwrap_or("")))
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
