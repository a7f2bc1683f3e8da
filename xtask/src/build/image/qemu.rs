//! perfbed's QEMU: Debian's QEMU 7.2 source, built minimal (x86_64-softmmu,
//! TCG and KVM, microvm, a handful of devices) with perfbed's device shim
//! (`images/qemu/`) and the Rust device linked in as a static library.
//!
//! The aarch64 QEMU (`--arch arm64`) is its own tree; a run that boots
//! both (`cargo xtask test`) builds one tree of both targets, whose
//! target-independent code compiles once, and a tree of both serves a
//! request for either.
//!
//! Two caches: the configured and built QEMU tree, keyed by the source
//! package version, our shim files and the configure line; and, inside it,
//! one linked binary per Rust device library (`linked/<library hash>/`).
//! Cargo rebuilds the library incrementally; a library not linked before
//! costs one relink. Work trees with different devices (branches, a stale
//! checkout) each get their own binary and never relink another's away.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::arch::Arch;
use crate::build::cache::{Entry, Key};
use crate::build::deps;
use crate::cmd::{self, Step};

const RECIPE: &str = "qemu-1";
/// The configure line: a target's own options, then these.
const CONFIGURE_COMMON: &[&str] = &[
    // No -g: it costs ~30% of each file's compile time (16.8 s against
    // 12.0 s of CPU for four of the largest, 2026-12-02) and makes a 44 MB
    // binary to link, for a QEMU nobody steps through; the device's own
    // code is Rust, built by cargo with its own settings.
    "--disable-debug-info",
    "--disable-docs",
    "--disable-werror",
    "--disable-user",
    "--with-git-submodules=ignore",
    "--disable-install-blobs",
];
const CONFIGURE: &[&str] = &[
    "--target-list=x86_64-softmmu",
    "--without-default-features",
    "--without-default-devices",
    "--with-devices-x86_64=perfbed",
    "--enable-tcg",
    "--enable-kvm",
];
/// Our files, copied into the QEMU tree's `hw/misc/perfbed/`.
const SHIM_FILES: &[&str] = &["perfbed.c", "perfbed.h", "meson.build"];
const STATICLIB: &str = "libperfbed_qemu.a";
/// Our patches to QEMU's tree (images/qemu/), applied in this order.
const PATCHES: &[&str] = &[
    "0001-hw-misc-add-perfbed.patch",
    "0002-hw-acpi-no-pc_madt_cpu_entry-stub.patch",
    "0003-target-i386-show-interrupt-gates-in-info-registers.patch",
    "0004-target-i386-svm-interrupt_request-under-the-BQL.patch",
    "0006-target-i386-svm-vmrun-no-stale-exception_index.patch",
];
/// The box's QEMU when gdb debugs perfbed-vmm's guest in it: the patches
/// above and 0005, which lets the box's KVM see its guest's `int3` (gdb's
/// breakpoints). Only there, so that a run without gdb keeps the cached
/// QEMU (docs/vmm-and-box.md, "gdb on perfbed-vmm").
const BOX_GDB_PATCHES: &[&str] = &[
    "0001-hw-misc-add-perfbed.patch",
    "0002-hw-acpi-no-pc_madt_cpu_entry-stub.patch",
    "0003-target-i386-show-interrupt-gates-in-info-registers.patch",
    "0004-target-i386-svm-interrupt_request-under-the-BQL.patch",
    "0005-target-i386-svm-int3-bp-intercept.patch",
    "0006-target-i386-svm-vmrun-no-stale-exception_index.patch",
];
/// The aarch64 QEMU (`--arch arm64`): the `virt` board, TCG only (no KVM
/// for an Arm guest on this host), the device wired by an Arm-only patch
/// (`images/qemu/arm64/`, docs/arm64.md) so that x86's inputs stay as they
/// are.
const ARM64_CONFIGURE: &[&str] = &[
    "--target-list=aarch64-softmmu",
    "--without-default-features",
    "--without-default-devices",
    "--with-devices-aarch64=perfbed",
    "--enable-tcg",
    "--enable-fdt=system",
];
const ARM64_PATCHES: &[&str] = &[
    "0001-hw-misc-add-perfbed.patch",
    "arm64/0001-perfbed-gic-spis-and-device-tree-node.patch",
    "arm64/0002-hw-arm-virt-cache-nodes-one-l3-per-socket.patch",
];

/// What one build tree takes and makes: one QEMU target, or several
/// sharing QEMU's target-independent code (compiled once per tree).
struct Target<'a> {
    /// Keys the tree; None for x86 alone, whose key predates the others.
    arch: Option<&'a str>,
    /// Its own configure options, before [`CONFIGURE_COMMON`].
    configure: &'a [&'a str],
    /// Below images/qemu/: each target's devices file, with QEMU's
    /// `configs/devices/<dir>/` it goes to.
    devices: &'a [(&'a str, &'a str)],
    /// Below images/qemu/, in order.
    patches: &'a [&'a str],
    binaries: &'a [&'a str],
}

const X86_64: Target = Target {
    arch: None,
    configure: CONFIGURE,
    devices: &[("devices.mak", "x86_64-softmmu")],
    patches: PATCHES,
    binaries: &["qemu-system-x86_64"],
};

const AARCH64: Target = Target {
    arch: Some("arm64"),
    configure: ARM64_CONFIGURE,
    devices: &[("arm64/devices.mak", "aarch64-softmmu")],
    patches: ARM64_PATCHES,
    binaries: &["qemu-system-aarch64"],
};

/// Both targets in one tree, for a run that wants both (`cargo xtask
/// test`): each target's configure options and devices, x86's patches then
/// arm64's own. perfbed.c carries arm64/0001 here, whose code finds no GIC
/// and no `ms->fdt` on x86's microvm and so leaves x86's device as it is.
const BOTH_CONFIGURE: &[&str] = &[
    "--target-list=x86_64-softmmu,aarch64-softmmu",
    "--without-default-features",
    "--without-default-devices",
    "--with-devices-x86_64=perfbed",
    "--with-devices-aarch64=perfbed",
    "--enable-tcg",
    "--enable-kvm",
    "--enable-fdt=system",
];
const BOTH_PATCHES: &[&str] = &[
    "0001-hw-misc-add-perfbed.patch",
    "0002-hw-acpi-no-pc_madt_cpu_entry-stub.patch",
    "0003-target-i386-show-interrupt-gates-in-info-registers.patch",
    "0004-target-i386-svm-interrupt_request-under-the-BQL.patch",
    "0006-target-i386-svm-vmrun-no-stale-exception_index.patch",
    "arm64/0001-perfbed-gic-spis-and-device-tree-node.patch",
    "arm64/0002-hw-arm-virt-cache-nodes-one-l3-per-socket.patch",
];
const BOTH: Target = Target {
    arch: Some("x86+arm64"),
    configure: BOTH_CONFIGURE,
    devices: &[
        ("devices.mak", "x86_64-softmmu"),
        ("arm64/devices.mak", "aarch64-softmmu"),
    ],
    patches: BOTH_PATCHES,
    binaries: &["qemu-system-x86_64", "qemu-system-aarch64"],
};

/// Firmware from Debian's packages, in the order QEMU must search it (qboot
/// for microvm lives in the first; SeaBIOS's copy would shadow it).
pub const FIRMWARE_DIRS: &[&str] = &["/usr/share/qemu", "/usr/share/seabios"];

#[derive(Clone)]
pub struct Qemu {
    pub binary: PathBuf,
    pub firmware_dirs: Vec<PathBuf>,
}

/// perfbed's QEMU for the box when gdb debugs its guest ([`BOX_GDB_PATCHES`]).
pub fn ensure_for_box_gdb(workspace: &Path) -> Result<Qemu> {
    let target = Target {
        patches: BOX_GDB_PATCHES,
        ..X86_64
    };
    let inputs = Inputs::gather(workspace)?;
    ensure_tree(&inputs, &target, "qemu-system-x86_64")
}

/// perfbed's QEMU for an `arch` guest.
pub fn ensure_for_arch(workspace: &Path, arch: Arch) -> Result<Qemu> {
    ensure_among(workspace, arch, &[arch])
}

/// perfbed's QEMU for an `arch` guest, where this process wants those of
/// `wanted` too: its own tree if built, else a tree of both targets if
/// built; else, when both targets are wanted and the other has no tree of
/// its own either, one tree of both (cold, 50 s more than x86's alone,
/// where an aarch64 tree of its own takes about 5 min: docs/test.md), else
/// its own.
pub fn ensure_among(workspace: &Path, arch: Arch, wanted: &[Arch]) -> Result<Qemu> {
    let inputs = Inputs::gather(workspace)?;
    let (own, other) = match arch {
        Arch::X86_64 => (&X86_64, &AARCH64),
        Arch::Arm64 => (&AARCH64, &X86_64),
    };
    let other_wanted = wanted.iter().any(|&a| a != arch);
    let tree = choose_tree(own, other, other_wanted, |t| is_built(&inputs, t))?;
    ensure_tree(&inputs, tree, own.binaries[0])
}

/// The tree that serves `own`'s target: its own if built, else one of both
/// targets if built, or if `other` is wanted too and has no tree of its own.
fn choose_tree<'t>(
    own: &'t Target<'t>,
    other: &Target,
    other_wanted: bool,
    is_built: impl Fn(&Target) -> Result<bool>,
) -> Result<&'t Target<'t>> {
    Ok(
        if !is_built(own)? && (is_built(&BOTH)? || (other_wanted && !is_built(other)?)) {
            &BOTH
        } else {
            own
        },
    )
}

/// What every tree's key and build share: the device library, the source
/// package's version, gcc's.
struct Inputs {
    shim: PathBuf,
    staticlib: PathBuf,
    version: String,
    gcc: String,
}

impl Inputs {
    fn gather(workspace: &Path) -> Result<Inputs> {
        Ok(Inputs {
            shim: workspace.join("images/qemu"),
            staticlib: build_staticlib(workspace)?,
            version: source_version()?,
            gcc: deps::version_of("gcc")?,
        })
    }
}

fn key(inputs: &Inputs, target: &Target) -> Result<Key> {
    let mut key = Key::new(RECIPE);
    if let Some(arch) = target.arch {
        key.add("arch", arch.as_bytes());
    }
    key.add("source", inputs.version.as_bytes());
    for name in SHIM_FILES
        .iter()
        .chain(target.devices.iter().map(|(file, _)| file))
        .chain(target.patches)
    {
        key.add(
            name,
            &fs::read(inputs.shim.join(name))
                .with_context(|| format!("reading images/qemu/{name}"))?,
        );
    }
    key.add("configure", configure_line(target).join(" ").as_bytes());
    key.add("gcc", inputs.gcc.as_bytes());
    Ok(key)
}

/// Whether `target`'s tree is built, without locking it (a tree being
/// pruned meanwhile is built again by [`ensure_tree`]).
fn is_built(inputs: &Inputs, target: &Target) -> Result<bool> {
    Ok(crate::build::cache::root()?
        .join("qemu")
        .join(key(inputs, target)?.hex())
        .join("READY")
        .is_file())
}

/// `binary` of `target`'s tree (built if missing), linked with this device
/// library.
fn ensure_tree(inputs: &Inputs, target: &Target, binary: &str) -> Result<Qemu> {
    let entry = Entry::new("qemu", &key(inputs, target)?)?;
    let tree = entry.dir.join("qemu");
    if !entry.is_ready() {
        build_tree(&entry, &tree, inputs, target)?;
    }
    let binary = linked_binary(&entry, &tree, &inputs.staticlib, binary, target.binaries)?;
    Ok(Qemu {
        binary,
        firmware_dirs: FIRMWARE_DIRS.iter().map(PathBuf::from).collect(),
    })
}

/// How many linked binaries (one per device library) an entry keeps.
const KEEP_LINKED: usize = 6;

/// The QEMU binary `name` linked with `staticlib`, linking it first if no
/// binary has this library yet. Relinks happen in the shared tree, one at a
/// time; a new library drops every binary of the tree (`all`), so that none
/// is copied out still linked with the one before.
fn linked_binary(
    entry: &Entry,
    tree: &Path,
    staticlib: &Path,
    name: &str,
    all: &[&str],
) -> Result<PathBuf> {
    let lib = fs::read(staticlib).with_context(|| format!("reading {}", staticlib.display()))?;
    let mut lib_key = Key::new("qemu-link-1");
    lib_key.add("device-library", &lib);
    let linked = entry.dir.join("linked");
    let dir = linked.join(lib_key.hex());
    let binary = dir.join(name);
    if let Ok(file) = fs::OpenOptions::new().write(true).open(&binary) {
        // Used now: pruning drops the least recently used.
        let _ = file.set_modified(std::time::SystemTime::now());
        return Ok(binary);
    }
    fs::create_dir_all(&linked)?;
    let _lock = crate::build::cache::lock_exclusive(&entry.dir.join("link.lock"))?;
    if binary.is_file() {
        return Ok(binary);
    }
    // Ninja does not track a library named in link_args: drop the binary to
    // make it relink.
    let built = tree.join("build").join(name);
    let installed_lib = tree.join("hw/misc/perfbed").join(STATICLIB);
    let new_lib = fs::read(&installed_lib).ok().as_deref() != Some(&lib[..]);
    if new_lib || !built.is_file() {
        let step = Step::start(
            "linking QEMU with this device library",
            &entry.dir.join("link.log"),
        )?;
        if new_lib {
            fs::write(&installed_lib, &lib)?;
            for binary in all {
                let _ = fs::remove_file(tree.join("build").join(binary));
            }
        }
        step.run(&mut ninja(tree, &[name]))?;
        step.finish();
    }
    fs::create_dir_all(&dir)?;
    let partial = dir.join(format!("{name}.partial"));
    fs::copy(&built, &partial)?;
    fs::rename(&partial, &binary)?;
    prune_linked(&linked, KEEP_LINKED, name)?;
    Ok(binary)
}

/// Drops the least recently used linked binaries beyond `keep`.
fn prune_linked(linked: &Path, keep: usize, name: &str) -> Result<()> {
    let mut dirs = Vec::new();
    for entry in fs::read_dir(linked)? {
        let dir = entry?.path();
        let Ok(modified) = fs::metadata(dir.join(name)).and_then(|m| m.modified()) else {
            continue;
        };
        dirs.push((modified, dir));
    }
    dirs.sort_by_key(|(modified, _)| std::cmp::Reverse(*modified));
    for (_, dir) in dirs.into_iter().skip(keep) {
        let _ = fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// The Rust device as a static library, by the cargo that runs xtask.
fn build_staticlib(workspace: &Path) -> Result<PathBuf> {
    let target = workspace.join("target");
    let step = Step::start(
        "building the device library for QEMU",
        &target.join("perfbed/logs/qemu-ffi.log"),
    )?;
    step.run(Command::new(deps::cargo()).current_dir(workspace).args([
        "build",
        "--release",
        "--package",
        "perfbed-qemu",
        "--lib",
    ]))?;
    step.finish();
    Ok(target.join("release").join(STATICLIB))
}

/// The version `apt-get source qemu` would fetch (without its epoch), from
/// the `.dsc` it names.
fn source_version() -> Result<String> {
    let uris = cmd::output(Command::new("apt-get").args(["source", "--print-uris", "qemu"]))
        .context("no QEMU source package is available; `cargo xtask deps` enables deb-src")?;
    uris.split_whitespace()
        .find_map(|word| {
            word.strip_prefix("qemu_")
                .and_then(|w| w.strip_suffix(".dsc"))
        })
        .map(str::to_string)
        .context("`apt-get source --print-uris qemu` named no .dsc")
}

fn build_tree(entry: &Entry, tree: &Path, inputs: &Inputs, target: &Target) -> Result<()> {
    entry.begin()?;
    let title = match target.arch {
        None => "building QEMU 7.2 with the perfbed device (about 2.5 min)".to_string(),
        Some(_) => format!(
            "building QEMU 7.2 ({}) with the perfbed device",
            target
                .devices
                .iter()
                .map(|(_, dir)| *dir)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let step = Step::start(&title, &entry.dir.join("build.log"))?;
    let download = entry.dir.join("source");
    fs::create_dir_all(&download)?;
    step.run(Command::new("apt-get").current_dir(&download).args([
        "source",
        "--download-only",
        "-q",
        "qemu",
    ]))?;
    let version = &inputs.version;
    let dsc = download.join(format!("qemu_{version}.dsc"));
    if !dsc.is_file() {
        bail!("apt fetched another QEMU source than {version} (did the package lists change?); run again");
    }
    step.run(Command::new("dpkg-source").arg("-x").arg(&dsc).arg(tree))?;

    let shim = &inputs.shim;
    let dir = tree.join("hw/misc/perfbed");
    fs::create_dir_all(&dir)?;
    for name in SHIM_FILES {
        fs::copy(shim.join(name), dir.join(name)).with_context(|| format!("copying {name}"))?;
    }
    fs::copy(&inputs.staticlib, dir.join(STATICLIB))?;
    for (devices, config_dir) in target.devices {
        fs::copy(
            shim.join(devices),
            tree.join("configs/devices")
                .join(config_dir)
                .join("perfbed.mak"),
        )?;
    }
    for patch in target.patches {
        step.run(
            Command::new("patch")
                .args(["-p1", "--forward", "--batch", "-d"])
                .arg(tree)
                .arg("-i")
                .arg(shim.join(patch)),
        )?;
    }
    let build = tree.join("build");
    fs::create_dir_all(&build)?;
    step.run(
        Command::new("../configure")
            .current_dir(&build)
            .args(configure_line(target)),
    )?;
    step.run(&mut ninja(tree, target.binaries))?;
    for binary in target.binaries {
        if !build.join(binary).is_file() {
            bail!(
                "the QEMU build finished without a {binary} (see {})",
                step.log().display()
            );
        }
    }
    entry.mark_ready()?;
    step.finish();
    Ok(())
}

fn configure_line<'a>(target: &Target<'a>) -> Vec<&'a str> {
    target
        .configure
        .iter()
        .chain(CONFIGURE_COMMON)
        .copied()
        .collect()
}

fn ninja(tree: &Path, binaries: &[&str]) -> Command {
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut ninja = Command::new("ninja");
    ninja
        .arg("-C")
        .arg(tree.join("build"))
        .arg(format!("-j{jobs}"))
        .args(binaries);
    ninja
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_of_both_targets_has_each_targets_inputs() {
        for target in [&X86_64, &AARCH64] {
            for patch in target.patches {
                assert!(BOTH.patches.contains(patch), "{patch}");
            }
            for devices in target.devices {
                assert!(BOTH.devices.contains(devices), "{devices:?}");
            }
            for option in target
                .configure
                .iter()
                .filter(|o| !o.starts_with("--target-list="))
            {
                assert!(BOTH.configure.contains(option), "{option}");
            }
            assert!(BOTH.binaries.contains(&target.binaries[0]));
        }
        // Each patch once, in order: x86's, then arm64's own.
        let x86_then_arm64: Vec<&str> = X86_64
            .patches
            .iter()
            .chain(
                AARCH64
                    .patches
                    .iter()
                    .filter(|p| !X86_64.patches.contains(p)),
            )
            .copied()
            .collect();
        assert_eq!(BOTH.patches, x86_then_arm64);
        assert_eq!(
            BOTH.configure[0],
            "--target-list=x86_64-softmmu,aarch64-softmmu"
        );
    }

    #[test]
    fn a_tree_of_both_is_built_only_when_both_are_wanted_and_serves_either() {
        let chosen = |own: &Target, other: &Target, other_wanted, built: &[&str]| {
            let built = |t: &Target| Ok(built.contains(&t.binaries.join("+").as_str()));
            let tree = choose_tree(own, other, other_wanted, built).unwrap();
            tree.binaries.join("+")
        };
        let (x86, arm64, both) = (
            "qemu-system-x86_64",
            "qemu-system-aarch64",
            "qemu-system-x86_64+qemu-system-aarch64",
        );
        // `cargo xtask run`: x86 alone, never a tree of both unless built.
        assert_eq!(chosen(&X86_64, &AARCH64, false, &[]), x86);
        assert_eq!(chosen(&X86_64, &AARCH64, false, &[both]), both);
        assert_eq!(chosen(&X86_64, &AARCH64, false, &[x86, both]), x86);
        assert_eq!(chosen(&AARCH64, &X86_64, false, &[both]), both);
        // `cargo xtask test`: one tree of both, unless a target has its own.
        assert_eq!(chosen(&X86_64, &AARCH64, true, &[]), both);
        assert_eq!(chosen(&AARCH64, &X86_64, true, &[both]), both);
        assert_eq!(chosen(&X86_64, &AARCH64, true, &[arm64]), x86);
        assert_eq!(chosen(&AARCH64, &X86_64, true, &[x86]), arm64);
        assert_eq!(chosen(&X86_64, &AARCH64, true, &[x86]), x86);
    }
}
