//! `cargo xtask image`: the guest kernel, perfbed.ko, the initramfs and the
//! QEMU that hosts the device, each
//! cached under its own key so that changing one rebuilds only what depends
//! on it.

pub mod agent;
pub mod arch;
pub mod busybox;
pub mod cpio;
pub mod initramfs;
pub mod kernel;
pub mod module;
pub mod perf;
pub mod qemu;

use std::path::{Path, PathBuf};

use anyhow::Result;

/// Everything a boot needs.
pub struct Images {
    pub vmlinux: PathBuf,
    pub initramfs: PathBuf,
    /// `uname -r` the guest should report.
    pub kernel_release: String,
    pub qemu: qemu::Qemu,
    /// perfbed.ko as built (with its symbols), for gdb.
    pub driver: PathBuf,
    /// The device-scope test module as built, in a test's images only (its
    /// symbols name the CPU it hangs on purpose).
    pub scope_test: Option<PathBuf>,
    /// Which kernel `vmlinux` is.
    pub variant: Variant,
}

pub use kernel::Variant;

/// What an image build is for: the test run also needs the device-scope
/// test module, which `run` never loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Run,
    Test,
}

/// Everything a boot needs, built if missing. QEMU needs neither the kernel
/// nor bindgen, so it builds on a thread of its own beside them: a kernel
/// build leaves a core idle for minutes (rustc builds `core` and `kernel`
/// alone, vmlinux links alone), and so do downloads and unpacking. The
/// kernel build in turn installs bindgen while it unpacks its source.
pub fn ensure(workspace: &Path, variant: Variant) -> Result<Images> {
    ensure_for(workspace, variant, Purpose::Test)
}

pub fn ensure_for(workspace: &Path, variant: Variant, purpose: Purpose) -> Result<Images> {
    ensure_with_driver(workspace, variant, purpose, None)
}

/// [`ensure`] in a run that boots guests of each of `archs` (`cargo xtask
/// test`): their QEMUs are one build when none is built yet
/// ([`qemu::ensure_among`]).
pub fn ensure_beside(workspace: &Path, variant: Variant, archs: &[arch::Arch]) -> Result<Images> {
    ensure_mutated(workspace, variant, Purpose::Test, None, None, archs)
}

/// [`ensure_for`] with perfbed.ko built from `driver` (a folder laid out as
/// `guest-driver/`, such as a planted-bug copy) instead of `guest-driver/`.
pub fn ensure_with_driver(
    workspace: &Path,
    variant: Variant,
    purpose: Purpose,
    driver: Option<&Path>,
) -> Result<Images> {
    ensure_mutated(
        workspace,
        variant,
        purpose,
        driver,
        None,
        &[arch::Arch::X86_64],
    )
}

/// [`ensure`] with a kernel of the patches `choose` picks from the series
/// (a planted-bug kernel).
pub fn ensure_with_kernel_patches(
    workspace: &Path,
    variant: Variant,
    choose: kernel::ChoosePatches,
) -> Result<Images> {
    ensure_mutated(
        workspace,
        variant,
        Purpose::Test,
        None,
        Some(choose),
        &[arch::Arch::X86_64],
    )
}

fn ensure_mutated(
    workspace: &Path,
    variant: Variant,
    purpose: Purpose,
    driver: Option<&Path>,
    choose: Option<kernel::ChoosePatches>,
    qemu_archs: &[arch::Arch],
) -> Result<Images> {
    crate::build::deps::ensure_packages()?;
    std::thread::scope(|s| {
        let qemu = s.spawn(|| qemu::ensure_among(workspace, arch::Arch::X86_64, qemu_archs));
        let guest = guest_images(workspace, variant, purpose, driver, choose);
        let qemu = qemu
            .join()
            .map_err(|_| anyhow::anyhow!("the QEMU build thread panicked"))?;
        let (kernel, initramfs, driver, scope_test) = guest?;
        Ok(Images {
            vmlinux: kernel.vmlinux,
            initramfs,
            kernel_release: kernel.release,
            qemu: qemu?,
            driver,
            scope_test,
            variant,
        })
    })
}

/// The kernel the series patches, for the bench's side-by-side rows: the
/// same source, configuration and testbed patches without the series
/// (`images/kernel/patches/`), booted with the same agent and perf (built
/// from the patched tree, so that only the kernel differs) and no modules:
/// perfbed.ko needs the series. `gdb` symbols are the patched driver's.
pub fn ensure_unpatched(workspace: &Path, patched: &Images) -> Result<Images> {
    let testbed_only = |series: &[PathBuf]| -> Result<Vec<PathBuf>> {
        let testbed = kernel::images_dir(workspace).join(kernel::PATCH_DIRS[1]);
        Ok(series
            .iter()
            .filter(|p| p.starts_with(&testbed))
            .cloned()
            .collect())
    };
    let (kernel, _) =
        kernel::ensure_patched_beside::<()>(workspace, Variant::Normal, Some(&testbed_only), None)?;
    let (with_series, _) =
        kernel::ensure_patched_beside::<()>(workspace, Variant::Normal, None, None)?;
    let perf = perf::ensure(&with_series.tree, &with_series.source)?;
    let agent = agent::build(workspace)?;
    let selftest = [(
        initramfs::SELFTEST_IN_GUEST,
        kernel.tree.join(initramfs::SELFTEST_IN_TREE),
    )];
    let initramfs = initramfs::ensure(&agent, &[], &selftest, &perf)?;
    Ok(Images {
        vmlinux: kernel.vmlinux,
        initramfs,
        kernel_release: kernel.release,
        qemu: patched.qemu.clone(),
        driver: patched.driver.clone(),
        variant: Variant::Normal,
        scope_test: None,
    })
}

/// The debug kernel's rcutorture modules, in the order they load.
const RCUTORTURE_MODULES: [&str; 2] = ["kernel/torture.ko", "kernel/rcu/rcutorture.ko"];

/// The kernel, and the initramfs with the agent and the modules, and
/// perfbed.ko (for gdb's symbols) and the scope test module (a test's).
fn guest_images(
    workspace: &Path,
    variant: Variant,
    purpose: Purpose,
    driver: Option<&Path>,
    choose: Option<kernel::ChoosePatches>,
) -> Result<(kernel::Kernel, PathBuf, PathBuf, Option<PathBuf>)> {
    // A kernel build installs bindgen while it unpacks the source, and
    // builds perf from the patched tree beside its own make; modules built
    // against a cached kernel need bindgen too, and perf from a cached
    // kernel's tree builds now.
    let (kernel, perf) =
        kernel::ensure_patched_beside(workspace, variant, choose, Some(&perf::ensure))?;
    let perf = match perf {
        Some(perf) => perf,
        None => perf::ensure(&kernel.tree, &kernel.source)?,
    };
    crate::build::deps::ensure_bindgen()?;
    // Loaded by the scenario once the device has been checked on its own.
    // An absolute folder replaces the workspace's (Path::join).
    let dir = driver.map_or_else(|| "guest-driver".to_string(), |d| d.display().to_string());
    let driver = module::ensure(workspace, &kernel, &dir, "perfbed", &["device/src/regs.rs"])?;
    let mut modules = vec![driver.clone()];
    let mut scope_test = None;
    if purpose == Purpose::Test {
        // Loaded only by the device-scope test and the hang tests
        // (images/kernel/scope-test).
        let ko = module::ensure(
            workspace,
            &kernel,
            "images/kernel/scope-test",
            "perfbed_scope_test",
            &[],
        )?;
        modules.push(ko.clone());
        scope_test = Some(ko);
        // rcutorture and its torture framework, built as modules by the
        // debug kernels: loaded only by `stress --lifecycle N --rcutorture`.
        if variant.is_debug() {
            for ko in RCUTORTURE_MODULES {
                modules.push(kernel.tree.join(ko));
            }
        }
    }
    let agent = agent::build(workspace)?;
    // The kernel's own cpu-hotplug selftest and perf, from the tree the
    // guest runs.
    let selftest = [(
        initramfs::SELFTEST_IN_GUEST,
        kernel.tree.join(initramfs::SELFTEST_IN_TREE),
    )];
    let initramfs = initramfs::ensure(&agent, &modules, &selftest, &perf)?;
    Ok((kernel, initramfs, driver, scope_test))
}

/// Everything an `arch` guest's boot needs, built if missing: the kernel
/// cross-built for it, perfbed.ko against that tree (and the debug
/// kernel's rcutorture modules), the agent, an initramfs of them, busybox
/// and perf, and perfbed's QEMU for it (docs/arm64.md).
/// The normal or the debug kernel, of the patches `choose` picks from the
/// series (all of them for `None`; a planted-bug kernel otherwise), for
/// `cargo xtask run`, `scenario` and `stress`; x86 goes through
/// [`ensure_for`].
pub fn ensure_arch(
    workspace: &Path,
    variant: Variant,
    arch: arch::Arch,
    choose: Option<kernel::ChoosePatches>,
) -> Result<Images> {
    if !matches!(variant, Variant::Normal | Variant::Debug) {
        anyhow::bail!(
            "the {} kernel is not built for --arch {} (the normal and the debug kernel are)",
            variant.name(),
            arch.kernel_arch()
        );
    }
    crate::build::deps::ensure_packages()?;
    crate::build::deps::ensure_arm64()?;
    crate::build::deps::ensure_bindgen()?;
    let kernel = kernel::ensure_for_arch(workspace, variant, arch, choose)?;
    let driver = module::ensure(
        workspace,
        &kernel,
        "guest-driver",
        "perfbed",
        &["device/src/regs.rs"],
    )?;
    let mut modules = vec![driver.clone()];
    // rcutorture for `stress --arch arm64 --lifecycle N --rcutorture`, as
    // on x86.
    if variant.is_debug() {
        modules.extend(RCUTORTURE_MODULES.map(|ko| kernel.tree.join(ko)));
    }
    let agent = agent::build_for(workspace, arch)?;
    let busybox = busybox::ensure(arch)?;
    let perf = perf::ensure_for(&kernel.tree, &kernel.source, arch)?;
    let initramfs = initramfs::ensure_arm64(&agent, &modules, &busybox, &perf)?;
    let qemu = qemu::ensure_for_arch(workspace, arch)?;
    Ok(Images {
        vmlinux: kernel.vmlinux,
        initramfs,
        kernel_release: kernel.release,
        qemu,
        driver,
        variant,
        scope_test: None,
    })
}
