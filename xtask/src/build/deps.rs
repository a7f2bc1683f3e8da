//! `cargo xtask deps`: what a fresh Debian 12 machine lacks, installed.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::build::cache;
use crate::cmd::{self, Step};

/// Debian packages the image build and the boot need, and why.
pub const PACKAGES: &[(&str, &str)] = &[
    ("linux-source-6.12", "the guest kernel's source"),
    (
        "rustc-web",
        "rustc 1.96 for the kernel's Rust (/usr/bin/rustc)",
    ),
    (
        "rust-web-src",
        "the Rust library source the kernel builds core from",
    ),
    ("libclang-dev", "libclang for bindgen"),
    ("gcc", "the kernel's C compiler"),
    ("make", "kbuild"),
    ("flex", "kconfig, perf's event parser"),
    ("bison", "kconfig, perf's event parser"),
    ("bc", "kernel build scripts"),
    ("libelf-dev", "objtool, perf"),
    ("zlib1g-dev", "perf (libelf's compressed sections)"),
    (
        "libtraceevent-dev",
        "perf: tracepoints as events, perf trace",
    ),
    ("libssl-dev", "kernel build tools"),
    ("patch", "applying images/kernel/patches"),
    ("xz-utils", "unpacking the kernel source"),
    ("libc6-dev", "the static guest agent"),
    ("dpkg-dev", "unpacking QEMU's source package (dpkg-source)"),
    ("ninja-build", "building QEMU"),
    ("meson", "building QEMU (its tarball has no meson)"),
    ("pkg-config", "building QEMU"),
    ("libglib2.0-dev", "building QEMU"),
    ("libpixman-1-dev", "building QEMU"),
    ("libfdt-dev", "building QEMU"),
    ("qemu-system-data", "firmware for microvm (qboot)"),
    ("seabios", "firmware for QEMU's pc machine"),
    ("busybox-static", "sleep and friends in the guest"),
    (
        "gdb",
        "the scripted gdb session on the guest kernel (VM test gdb_session)",
    ),
];

/// Debian packages only `cargo xtask bench` needs, and why.
pub const BENCH_PACKAGES: &[(&str, &str)] = &[(
    "qemu-system-x86",
    "stock Debian QEMU, the boot baseline (`-M pc`) of `cargo xtask bench`",
)];

/// Debian packages only an arm64 guest needs (`--arch arm64`), and why;
/// the `:arm64` ones come through multiarch (docs/arm64.md).
pub const ARM64_PACKAGES: &[(&str, &str)] = &[
    (
        "gcc-aarch64-linux-gnu",
        "the arm64 kernel's C compiler, the agent's linker",
    ),
    (
        "libc6-dev-arm64-cross",
        "the static arm64 agent's C library",
    ),
    (
        "libstd-rust-web-dev:arm64",
        "rustc-web's aarch64 standard library, for the arm64 agent",
    ),
    (
        "libtraceevent-dev:arm64",
        "the static arm64 perf: tracepoints as events, perf trace",
    ),
];

/// Installs the arm64 guest's packages if missing, enabling Debian's arm64
/// architecture (multiarch) first.
pub fn ensure_arm64() -> Result<()> {
    let foreign = cmd::output(Command::new("dpkg").arg("--print-foreign-architectures"))?;
    if !foreign.split_whitespace().any(|a| a == "arm64") {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            bail!("the arm64 guest needs Debian's arm64 packages; as root run `dpkg --add-architecture arm64 && apt-get update`");
        }
        eprintln!("==> enabling Debian's arm64 architecture (dpkg --add-architecture arm64)");
        cmd::output(Command::new("dpkg").args(["--add-architecture", "arm64"]))?;
    }
    let missing = missing_of(ARM64_PACKAGES)?;
    if !missing.is_empty() {
        install_packages(&missing)?;
    }
    Ok(())
}

/// Installs the benchmark's own packages if missing.
pub fn ensure_bench() -> Result<()> {
    let missing = missing_of(BENCH_PACKAGES)?;
    if !missing.is_empty() {
        install_packages(&missing)?;
    }
    Ok(())
}

/// Where perfbed adds deb-src entries when the machine has none.
const DEB_SRC_FILE: &str = "/etc/apt/sources.list.d/perfbed-deb-src.sources";

pub const BINDGEN_VERSION: &str = "0.72.1";

/// The pinned bindgen, installed from crates.io into the cache.
pub fn bindgen() -> Result<PathBuf> {
    Ok(cache::root()?.join(format!("tools/bindgen-cli-{BINDGEN_VERSION}/bin/bindgen")))
}

/// Installs whatever is missing; prints nothing when nothing is.
pub fn ensure() -> Result<()> {
    ensure_packages()?;
    ensure_lint_tools()?;
    ensure_bindgen()
}

/// The unit tests' lint tools, as cargo subcommands: rustup's components of
/// the toolchain that runs xtask. (Debian's `rust-clippy` and `rustfmt`
/// packages are built for its own rustc 1.63 and cannot check this
/// workspace, so they are no substitute.)
pub const LINT_TOOLS: &[(&str, &str)] = &[("clippy", "clippy"), ("fmt", "rustfmt")];

/// Adds the toolchain's missing lint components with rustup; without
/// rustup, says what is missing and how to get it.
pub fn ensure_lint_tools() -> Result<()> {
    let missing: Vec<&str> = LINT_TOOLS
        .iter()
        .filter(|(subcommand, _)| {
            !Command::new(cargo())
                .args([subcommand, "--version"])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(|(_, component)| *component)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let Some(rustup) = which("rustup") else {
        bail!(
            "the Rust toolchain lacks {} and there is no rustup to add them; install this toolchain's components (Debian's packages are for its rustc 1.63)",
            missing.join(" and ")
        );
    };
    let step = Step::start(
        &format!(
            "adding the toolchain's {} with rustup",
            missing.join(" and ")
        ),
        &cache::root()?.join("logs/rustup-components.log"),
    )?;
    step.run(
        Command::new(rustup)
            .args(["component", "add"])
            .args(&missing),
    )?;
    step.finish();
    Ok(())
}

/// The Debian packages and QEMU's deb-src entries: what every build step
/// needs first.
pub fn ensure_packages() -> Result<()> {
    let missing = missing_packages()?;
    if !missing.is_empty() {
        install_packages(&missing)?;
    }
    ensure_qemu_source()
}

/// The pinned bindgen, which only the kernel build needs (so the image build
/// installs it while QEMU's build runs).
pub fn ensure_bindgen() -> Result<()> {
    let bindgen = bindgen()?;
    if !bindgen.exists() {
        install_bindgen(&bindgen)?;
    }
    Ok(())
}

/// QEMU is built from Debian's source package, which needs deb-src entries
/// for the suites the machine already takes binaries from.
fn ensure_qemu_source() -> Result<()> {
    let available = Command::new("apt-get")
        .args(["source", "--print-uris", "qemu"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if available {
        return Ok(());
    }
    let stanzas = deb_src_stanzas()?;
    if stanzas.is_empty() {
        bail!("no Debian apt sources found to derive deb-src entries from; add deb-src lines for your suites and run `apt-get update`");
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("QEMU's source package needs deb-src entries; as root, write this to {DEB_SRC_FILE} and run `apt-get update`:\n{stanzas}");
    }
    eprintln!("==> enabling deb-src for the machine's Debian suites ({DEB_SRC_FILE})");
    std::fs::write(DEB_SRC_FILE, &stanzas).with_context(|| format!("writing {DEB_SRC_FILE}"))?;
    let log = cache::root()?.join("logs/apt.log");
    let step = Step::start("refreshing apt's package lists", &log)?;
    step.run(apt_get().args(["update", "-q"]))?;
    step.finish();
    Ok(())
}

/// `apt-get` that waits for another apt or dpkg to let go of its locks (an
/// unattended upgrade, another run's install) instead of failing at once.
fn apt_get() -> Command {
    let mut c = Command::new("apt-get");
    c.args(["-o", "DPkg::Lock::Timeout=600"]);
    c
}

/// deb-src twins of the machine's Debian `deb` sources (deb822 stanzas in
/// `debian.sources`, or one-line entries in `sources.list`).
fn deb_src_stanzas() -> Result<String> {
    let deb822 =
        std::fs::read_to_string("/etc/apt/sources.list.d/debian.sources").unwrap_or_default();
    let mut out = String::new();
    for stanza in deb822.split("\n\n") {
        if stanza.lines().any(|l| l.trim() == "Types: deb") {
            let twin: Vec<String> = stanza
                .lines()
                .filter(|l| !l.starts_with('#'))
                .map(|l| {
                    if l.trim() == "Types: deb" {
                        "Types: deb-src".to_string()
                    } else {
                        l.to_string()
                    }
                })
                .collect();
            out += &twin.join("\n");
            out += "\n\n";
        }
    }
    let list = std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    let lines: Vec<String> = list
        .lines()
        .filter(|l| l.starts_with("deb ") && l.contains("debian"))
        .map(|l| format!("deb-src {}", &l[4..]))
        .collect();
    if !lines.is_empty() {
        // One-line entries cannot go in a .sources file: convert them.
        for line in lines {
            let mut words = line
                .split_whitespace()
                .skip(1)
                .filter(|w| !w.starts_with('['));
            if let (Some(uri), Some(suite)) = (words.next(), words.next()) {
                let components: Vec<&str> = words.collect();
                out += &format!(
                    "Types: deb-src\nURIs: {uri}\nSuites: {suite}\nComponents: {}\n\n",
                    components.join(" ")
                );
            }
        }
    }
    Ok(out)
}

fn missing_packages() -> Result<Vec<&'static str>> {
    missing_of(PACKAGES)
}

fn missing_of(packages: &[(&'static str, &str)]) -> Result<Vec<&'static str>> {
    if which("dpkg-query").is_none() {
        bail!(
            "dpkg-query not found: perfbed expects Debian 12. Install the equivalents of: {}",
            PACKAGES
                .iter()
                .map(|(p, _)| *p)
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let native = cmd::output(Command::new("dpkg").arg("--print-architecture"))?;
    let mut missing = Vec::new();
    for (package, _) in packages {
        // One line per installed architecture of the package: a name
        // without `:ARCH` wants the machine's own (or `all`), also where
        // multiarch put a foreign one beside it (`libtraceevent-dev:arm64`).
        let status = Command::new("dpkg-query")
            .args(["-W", "-f=${Architecture} ${db:Status-Status}\n", package])
            .output()
            .context("running dpkg-query")?;
        let installed = String::from_utf8_lossy(&status.stdout).lines().any(|line| {
            let (arch, state) = line.split_once(' ').unwrap_or((line, ""));
            state == "installed"
                && (package.contains(':') || arch == native.trim() || arch == "all")
        });
        if !installed {
            missing.push(*package);
        }
    }
    Ok(missing)
}

fn install_packages(missing: &[&str]) -> Result<()> {
    let list = missing.join(" ");
    let command = format!("apt-get update && apt-get install -y --no-install-recommends {list}");
    for package in missing {
        let why = PACKAGES
            .iter()
            .chain(BENCH_PACKAGES)
            .chain(ARM64_PACKAGES)
            .find(|(p, _)| p == package)
            .map(|(_, w)| *w)
            .unwrap_or("");
        eprintln!("    missing: {package} ({why})");
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("these packages are missing and installing them needs root; run:\n    sudo sh -c '{command}'");
    }
    if which("apt-get").is_none() {
        bail!("apt-get not found; install these packages by hand: {list}");
    }
    let log = cache::root()?.join("logs/apt.log");
    let step = Step::start(
        &format!("installing {} Debian packages", missing.len()),
        &log,
    )?;
    let apt = |args: &[&str]| {
        let mut c = apt_get();
        c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    step.run(&mut apt(&["update", "-q"])).map_err(|e| {
        e.context(format!(
            "apt is unavailable (no network or no sources?); needed: {list}"
        ))
    })?;
    let mut install = apt(&["install", "-y", "-q", "--no-install-recommends"]);
    install.args(missing);
    step.run(&mut install)?;
    step.finish();
    Ok(())
}

fn install_bindgen(target: &std::path::Path) -> Result<()> {
    let root = target
        .parent()
        .and_then(|p| p.parent())
        .expect("<root>/bin/bindgen");
    let log = cache::root()?.join("logs/bindgen.log");
    let step = Step::start(
        &format!("installing bindgen-cli {BINDGEN_VERSION} from crates.io"),
        &log,
    )?;
    step.run(
        Command::new(cargo())
            .args([
                "install",
                "bindgen-cli",
                "--locked",
                "--version",
                BINDGEN_VERSION,
                "--root",
            ])
            .arg(root),
    )?;
    step.finish();
    Ok(())
}

/// The cargo that runs xtask (rustup's), not Debian's `/usr/bin/cargo` that
/// cargo-web may have installed.
pub fn cargo() -> PathBuf {
    std::env::var_os("CARGO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("cargo"))
}

pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// The first line of `program --version`, for cache keys and reports.
pub fn version_of(program: &str) -> Result<String> {
    let out = cmd::output(Command::new(program).arg("--version"))?;
    Ok(out.lines().next().unwrap_or("").to_string())
}

/// Fetches the package `spec` (`name=version`, `name:arch`) with `apt-get
/// download` into `dir`; returns the `.deb`.
pub fn apt_download(step: &Step, dir: &Path, spec: &str) -> Result<PathBuf> {
    step.run(
        Command::new("apt-get")
            .current_dir(dir)
            .args(["download", spec]),
    )?;
    fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download left no .deb")
}
