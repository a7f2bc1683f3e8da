//! `cargo xtask deps`: what a fresh Debian 12 machine lacks, installed.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::cache;
use crate::cmd::{self, Step};

/// Debian packages the image build and the boot need, and why.
pub const PACKAGES: &[(&str, &str)] = &[
    ("linux-source-6.12", "the guest kernel's source"),
    ("rustc-web", "rustc 1.96 for the kernel's Rust (/usr/bin/rustc)"),
    ("rust-web-src", "the Rust library source the kernel builds core from"),
    ("libclang-dev", "libclang for bindgen"),
    ("gcc", "the kernel's C compiler"),
    ("make", "kbuild"),
    ("flex", "kconfig"),
    ("bison", "kconfig"),
    ("bc", "kernel build scripts"),
    ("libelf-dev", "objtool"),
    ("libssl-dev", "kernel build tools"),
    ("patch", "applying images/kernel/patches"),
    ("xz-utils", "unpacking the kernel source"),
    ("libc6-dev", "the static guest agent"),
    ("qemu-system-x86", "the QEMU that boots the guest"),
];

pub const BINDGEN_VERSION: &str = "0.72.1";

/// The pinned bindgen, installed from crates.io into the cache.
pub fn bindgen() -> Result<PathBuf> {
    Ok(cache::root()?.join(format!("tools/bindgen-cli-{BINDGEN_VERSION}/bin/bindgen")))
}

/// Installs whatever is missing; prints nothing when nothing is.
pub fn ensure() -> Result<()> {
    let missing = missing_packages()?;
    if !missing.is_empty() {
        install_packages(&missing)?;
    }
    let bindgen = bindgen()?;
    if !bindgen.exists() {
        install_bindgen(&bindgen)?;
    }
    Ok(())
}

fn missing_packages() -> Result<Vec<&'static str>> {
    if which("dpkg-query").is_none() {
        bail!(
            "dpkg-query not found: perfbed expects Debian 12. Install the equivalents of: {}",
            PACKAGES.iter().map(|(p, _)| *p).collect::<Vec<_>>().join(" ")
        );
    }
    let mut missing = Vec::new();
    for (package, _) in PACKAGES {
        let status = Command::new("dpkg-query")
            .args(["-W", "-f=${db:Status-Status}", package])
            .output()
            .context("running dpkg-query")?;
        if String::from_utf8_lossy(&status.stdout).trim() != "installed" {
            missing.push(*package);
        }
    }
    Ok(missing)
}

fn install_packages(missing: &[&str]) -> Result<()> {
    let list = missing.join(" ");
    let command = format!("apt-get update && apt-get install -y --no-install-recommends {list}");
    for package in missing {
        let why = PACKAGES.iter().find(|(p, _)| p == package).map(|(_, w)| *w).unwrap_or("");
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
    let step = Step::start(&format!("installing {} Debian packages", missing.len()), &log)?;
    let apt = |args: &[&str]| {
        let mut c = Command::new("apt-get");
        c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    step.run(&mut apt(&["update", "-q"])).map_err(|e| {
        e.context(format!("apt is unavailable (no network or no sources?); needed: {list}"))
    })?;
    let mut install = apt(&["install", "-y", "-q", "--no-install-recommends"]);
    install.args(missing);
    step.run(&mut install)?;
    step.finish();
    Ok(())
}

fn install_bindgen(target: &std::path::Path) -> Result<()> {
    let root = target.parent().and_then(|p| p.parent()).expect("<root>/bin/bindgen");
    let log = cache::root()?.join("logs/bindgen.log");
    let step = Step::start(&format!("installing bindgen-cli {BINDGEN_VERSION} from crates.io"), &log)?;
    step.run(
        Command::new(cargo())
            .args(["install", "bindgen-cli", "--locked", "--version", BINDGEN_VERSION, "--root"])
            .arg(root),
    )?;
    step.finish();
    Ok(())
}

/// The cargo that runs xtask (rustup's), not Debian's `/usr/bin/cargo` that
/// cargo-web may have installed.
pub fn cargo() -> PathBuf {
    std::env::var_os("CARGO").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("cargo"))
}

pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(program)).find(|p| p.is_file())
}

/// The first line of `program --version`, for cache keys and reports.
pub fn version_of(program: &str) -> Result<String> {
    let out = cmd::output(Command::new(program).arg("--version"))?;
    Ok(out.lines().next().unwrap_or("").to_string())
}
