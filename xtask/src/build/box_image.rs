//! What the box boots: the box is where perfbed-vmm runs on a machine
//! without VT-x/SVM (the host that runs it is `host::the_box`).
//!
//! An L1 Linux (Debian's own kernel package, fetched with apt and cached)
//! boots under perfbed's QEMU with TCG emulating AMD SVM and nested paging
//! (`-cpu max`), on ONE vCPU (two corrupt L1, see shared/FACTS.md). Its
//! initramfs holds `/init` (images/box), perfbed-vmm, KVM's modules and the
//! guest's kernel and initramfs. QEMU exposes three virtio-serial ports as
//! the host-side files xtask already uses: the agent socket, the control
//! socket and the guest's serial log.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use perfbed_box_init::{GUEST_INITRAMFS, GUEST_KERNEL, MODULE_ORDER, VMM_PATH};

use super::cache::{Entry, Key};
use super::deps;
use super::image::cpio::{Archive, Kind};
use crate::cmd::{self, Step};

/// 3: the kernel's `System.map` (from its -dbg package) kept, to name a
/// hung box's RIP.
const KERNEL_RECIPE: &str = "l1-kernel-3";
const INITRAMFS_RECIPE: &str = "l1-initramfs-2";
/// The kernel package apt's metapackage points at.
const METAPACKAGE: &str = "linux-image-amd64";

/// L1's modules with their parameters: KVM for AMD (what TCG's `-cpu max`
/// emulates) and the virtio-serial driver stack. They are loaded in the
/// order their own `depends=` lists require (which changes between package
/// versions).
const MODULES: &[(&str, &str)] = &[
    ("kernel/virt/lib/irqbypass.ko", ""),
    ("kernel/drivers/crypto/ccp/ccp.ko", ""),
    ("kernel/arch/x86/kvm/kvm.ko", ""),
    ("kernel/arch/x86/kvm/kvm-amd.ko", "npt=1 vgif=0"),
    ("kernel/drivers/virtio/virtio_ring.ko", ""),
    ("kernel/drivers/virtio/virtio.ko", ""),
    ("kernel/drivers/virtio/virtio_mmio.ko", ""),
    ("kernel/drivers/char/virtio_console.ko", ""),
];

/// What the box boots.
#[derive(Debug, Clone)]
pub struct BoxImages {
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
    /// The L1 kernel package, for reports.
    pub kernel_package: String,
    /// The L1 kernel's `System.map` (from its -dbg package), to name the
    /// function a hung box's RIP was in.
    pub system_map: PathBuf,
}

/// The L1 kernel: Debian's package, unpacked, only the bzImage and the
/// modules the box loads kept, and the `System.map` from its -dbg package.
struct L1Kernel {
    vmlinuz: PathBuf,
    system_map: PathBuf,
    modules: Vec<(String, PathBuf, &'static str)>,
    package: String,
}

fn apt_output(args: &[&str]) -> Result<String> {
    cmd::output(Command::new("apt-cache").args(args))
}

/// The package `linux-image-amd64` depends on, and its candidate version.
fn l1_package() -> Result<(String, String)> {
    let depends = apt_output(&["depends", METAPACKAGE])?;
    let package = depends
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .with_context(|| format!("`apt-cache depends {METAPACKAGE}` names no kernel package (is apt's list current?)"))?
        .to_string();
    let policy = apt_output(&["policy", &package])?;
    let version = policy
        .lines()
        .find_map(|l| l.trim().strip_prefix("Candidate: "))
        .filter(|v| *v != "(none)")
        .with_context(|| format!("apt has no candidate version of {package}"))?
        .to_string();
    Ok((package, version))
}

fn l1_kernel() -> Result<L1Kernel> {
    let (package, version) = l1_package()?;
    let mut key = Key::new(KERNEL_RECIPE);
    key.add("package", package.as_bytes())
        .add("version", version.as_bytes());
    for (path, params) in MODULES {
        key.add(path, params.as_bytes());
    }
    let entry = Entry::new("l1-kernel", &key)?;
    let dir = entry.dir.clone();
    let modules = MODULES
        .iter()
        .map(|(path, params)| {
            let name = Path::new(path)
                .file_name()
                .expect("a module path has a name")
                .to_string_lossy()
                .into_owned();
            (name.clone(), dir.join("modules").join(&name), *params)
        })
        .collect();
    let kernel = L1Kernel {
        vmlinuz: dir.join("vmlinuz"),
        system_map: dir.join("System.map"),
        modules,
        package: format!("{package} {version}"),
    };
    if entry.is_ready() {
        return Ok(kernel);
    }
    entry.begin()?;
    let step = Step::start(
        &format!("fetching the box's L1 kernel ({package} {version})"),
        &dir.join("fetch.log"),
    )?;
    let deb = deps::apt_download(&step, &dir, &format!("{package}={version}"))?;
    let unpacked = dir.join("unpacked");
    step.run(Command::new("dpkg").arg("-x").arg(&deb).arg(&unpacked))?;
    let release = fs::read_dir(unpacked.join("lib/modules"))?
        .flatten()
        .next()
        .context("the kernel package has no lib/modules/<release>")?
        .file_name();
    let vmlinuz = unpacked
        .join("boot")
        .join(format!("vmlinuz-{}", release.to_string_lossy()));
    fs::rename(&vmlinuz, &kernel.vmlinuz)
        .with_context(|| format!("moving {}", vmlinuz.display()))?;
    fs::create_dir_all(dir.join("modules"))?;
    for ((path, _), (_, dest, _)) in MODULES.iter().zip(&kernel.modules) {
        let from = unpacked.join("lib/modules").join(&release).join(path);
        if !from.exists() {
            bail!("{package} has no {path} (compressed modules are not supported)");
        }
        fs::rename(&from, dest).with_context(|| format!("moving {}", from.display()))?;
    }
    // The rest (hundreds of MB of modules) is not needed.
    fs::remove_dir_all(&unpacked)?;
    fs::remove_file(&deb)?;
    if let Err(e) = fetch_system_map(&step, &dir, &package, &version, &kernel.system_map) {
        // Only a hung box's story needs it: say so, and go on without it.
        eprintln!("warning: no System.map for the box's L1 kernel ({e:#}); a hung box's RIP will name only the guest's functions");
    }
    step.finish();
    entry.mark_ready()?;
    Ok(kernel)
}

/// `apt-get download package=version` into `dir`: the .deb it left.
/// The L1 kernel's real `System.map`: the kernel package's own is a stub
/// ("The real System.map is in the linux-image-<version>-dbg package"),
/// so it comes from `<package>-dbg` (859 MB for 6.1.0-57). The map is
/// the tar stream's first member, so tar stops after it (0.2 s, where
/// unpacking the whole package takes minutes); the package is then deleted.
fn fetch_system_map(
    step: &Step,
    dir: &Path,
    package: &str,
    version: &str,
    out: &Path,
) -> Result<()> {
    let dbg = dir.join("dbg");
    fs::create_dir_all(&dbg)?;
    let result = (|| {
        let deb = deps::apt_download(step, &dbg, &format!("{package}-dbg={version}"))?;
        // dpkg-deb dies of SIGPIPE once tar has its member; the pipeline's
        // status is tar's.
        step.run(Command::new("sh").current_dir(&dbg).arg("-c").arg(format!(
            "dpkg-deb --fsys-tarfile '{}' | tar -x --wildcards --occurrence=1 './usr/lib/debug/boot/System.map-*'",
            deb.display()
        )))?;
        let boot = dbg.join("usr/lib/debug/boot");
        let map = fs::read_dir(&boot)
            .with_context(|| format!("reading {}", boot.display()))?
            .flatten()
            .map(|e| e.path())
            .next()
            .context("the -dbg package had no System.map")?;
        fs::rename(&map, out).with_context(|| format!("moving {}", map.display()))
    })();
    let _ = fs::remove_dir_all(&dbg);
    result
}

/// A module's `depends=` list, from its `.modinfo` strings.
fn module_depends(bytes: &[u8]) -> Vec<String> {
    const KEY: &[u8] = b"\0depends=";
    let Some(at) = bytes.windows(KEY.len()).position(|w| w == KEY) else {
        return Vec::new();
    };
    let rest = &bytes[at + KEY.len()..];
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end])
        .split(',')
        .filter(|d| !d.is_empty())
        .map(|d| d.replace('-', "_"))
        .collect()
}

/// `modules` (name, contents) ordered so that each comes after what it
/// depends on; a dependency outside the list is an error.
fn load_order(modules: &[(String, Vec<u8>)]) -> Result<Vec<String>> {
    let stem = |name: &str| name.trim_end_matches(".ko").replace('-', "_");
    let mut order: Vec<String> = Vec::new();
    while order.len() < modules.len() {
        let before = order.len();
        for (name, bytes) in modules {
            let loaded = |d: &String| order.iter().any(|o| stem(o) == *d);
            if !order.contains(name) && module_depends(bytes).iter().all(loaded) {
                order.push(name.clone());
            }
        }
        if order.len() == before {
            let stuck: Vec<String> = modules
                .iter()
                .filter(|(n, _)| !order.contains(n))
                .map(|(n, b)| format!("{n} (depends={})", module_depends(b).join(",")))
                .collect();
            bail!(
                "the box's modules need modules it does not have: {}",
                stuck.join("; ")
            );
        }
    }
    Ok(order)
}

/// perfbed-vmm and the box's `/init`, static, built by the cargo that runs
/// xtask (as the guest agent is).
pub fn build_binaries(workspace: &Path) -> Result<(PathBuf, PathBuf)> {
    const TARGET: &str = "x86_64-unknown-linux-gnu";
    let target_dir = workspace.join("target");
    let step = Step::start(
        "building perfbed-vmm and the box's /init",
        &target_dir.join("perfbed/logs/vmm.log"),
    )?;
    step.run(
        Command::new(deps::cargo())
            .current_dir(workspace)
            .args([
                "build",
                "--release",
                "-p",
                "perfbed-vmm",
                "-p",
                "perfbed-box-init",
                "--target",
                TARGET,
            ])
            .env("RUSTFLAGS", "-C target-feature=+crt-static"),
    )?;
    step.finish();
    let release = target_dir.join(TARGET).join("release");
    Ok((
        release.join("perfbed-vmm"),
        release.join("perfbed-box-init"),
    ))
}

/// Everything the box boots, for this guest.
pub fn ensure(workspace: &Path, guest_vmlinux: &Path, guest_initramfs: &Path) -> Result<BoxImages> {
    let kernel = l1_kernel()?;
    let (vmm, init) = build_binaries(workspace)?;
    let read = |p: &Path| fs::read(p).with_context(|| format!("reading {}", p.display()));
    let mut files: Vec<(String, Vec<u8>, bool)> = vec![
        ("init".into(), read(&init)?, true),
        (VMM_PATH.trim_start_matches('/').into(), read(&vmm)?, true),
        (
            GUEST_KERNEL.trim_start_matches('/').into(),
            read(guest_vmlinux)?,
            false,
        ),
        (
            GUEST_INITRAMFS.trim_start_matches('/').into(),
            read(guest_initramfs)?,
            false,
        ),
    ];
    let mut modules = Vec::new();
    for (name, path, _) in &kernel.modules {
        modules.push((name.clone(), read(path)?));
    }
    let mut order = String::new();
    for name in load_order(&modules)? {
        let params = kernel
            .modules
            .iter()
            .find(|(n, _, _)| *n == name)
            .map_or("", |(_, _, p)| *p);
        order += &format!("{name} {params}\n");
    }
    for (name, bytes) in modules {
        files.push((format!("lib/modules/{name}"), bytes, false));
    }
    files.push((MODULE_ORDER.into(), order.into_bytes(), false));

    let mut key = Key::new(INITRAMFS_RECIPE);
    for (path, bytes, _) in &files {
        key.add(path, bytes);
    }
    let entry = Entry::new("l1-initramfs", &key)?;
    let cpio = entry.dir.join("initramfs.cpio");
    let images = BoxImages {
        kernel: kernel.vmlinuz.clone(),
        initramfs: cpio.clone(),
        kernel_package: kernel.package.clone(),
        system_map: kernel.system_map.clone(),
    };
    if entry.is_ready() {
        return Ok(images);
    }
    entry.begin()?;
    let mut archive = Archive::new();
    for dir in ["dev", "proc", "sys", "run", "lib", "lib/modules", "guest"] {
        archive.add(dir, Kind::Dir);
    }
    archive.add("dev/console", Kind::CharDevice { major: 5, minor: 1 });
    for (path, bytes, executable) in &files {
        archive.add(
            path,
            Kind::File {
                data: bytes,
                executable: *executable,
            },
        );
    }
    fs::write(&cpio, archive.finish()).with_context(|| format!("writing {}", cpio.display()))?;
    entry.mark_ready()?;
    eprintln!("==> the box's initramfs written: {}", cpio.display());
    Ok(images)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(depends: &str) -> Vec<u8> {
        format!("\x7fELF...\0license=GPL\0depends={depends}\0retpoline=Y\0").into_bytes()
    }

    #[test]
    fn modules_load_after_their_dependencies() {
        let modules = vec![
            ("kvm-amd.ko".to_string(), module("kvm,ccp")),
            ("virtio.ko".into(), module("virtio_ring")),
            ("kvm.ko".into(), module("irqbypass")),
            ("ccp.ko".into(), module("")),
            ("virtio_ring.ko".into(), module("")),
            ("irqbypass.ko".into(), module("")),
        ];
        let order = load_order(&modules).unwrap();
        let at = |n: &str| order.iter().position(|o| o == n).unwrap();
        assert!(at("virtio_ring.ko") < at("virtio.ko"));
        assert!(
            at("irqbypass.ko") < at("kvm.ko")
                && at("kvm.ko") < at("kvm-amd.ko")
                && at("ccp.ko") < at("kvm-amd.ko")
        );
        let missing = vec![("virtio.ko".to_string(), module("virtio_ring"))];
        assert!(load_order(&missing)
            .unwrap_err()
            .to_string()
            .contains("virtio.ko (depends=virtio_ring)"));
        assert_eq!(module_depends(b"no modinfo"), Vec::<String>::new());
    }
}
