//! `cargo xtask image`: the guest kernel, perfbed.ko, the initramfs and the
//! QEMU that hosts the device, each
//! cached under its own key so that changing one rebuilds only what depends
//! on it.

pub mod agent;
pub mod cpio;
pub mod initramfs;
pub mod kernel;
pub mod module;
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
}

pub use kernel::Variant;

pub fn ensure(workspace: &Path, variant: Variant) -> Result<Images> {
    crate::deps::ensure()?;
    let kernel = kernel::ensure(workspace, variant)?;
    // Loaded by the scenario once the device has been checked on its own.
    let driver = module::ensure(workspace, &kernel, "guest-driver", "perfbed", &["device/src/regs.rs"])?;
    // Loaded only by the device-scope test (images/kernel/scope-test).
    let scope_test = module::ensure(workspace, &kernel, "images/kernel/scope-test", "perfbed_scope_test", &[])?;
    let agent = agent::build(workspace)?;
    let initramfs = initramfs::ensure(&agent, &[driver.clone(), scope_test])?;
    let qemu = qemu::ensure(workspace)?;
    Ok(Images { vmlinux: kernel.vmlinux, initramfs, kernel_release: kernel.release, qemu, driver })
}
