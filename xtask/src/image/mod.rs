//! `cargo xtask image`: the guest kernel, perfbed.ko and the initramfs, each
//! cached under its own key so that changing one rebuilds only what depends
//! on it.

pub mod agent;
pub mod cpio;
pub mod initramfs;
pub mod kernel;
pub mod module;

use std::path::{Path, PathBuf};

use anyhow::Result;

/// Everything a boot needs.
pub struct Images {
    pub vmlinux: PathBuf,
    pub initramfs: PathBuf,
    /// `uname -r` the guest should report.
    pub kernel_release: String,
}

pub fn ensure(workspace: &Path) -> Result<Images> {
    crate::deps::ensure()?;
    let kernel = kernel::ensure(workspace)?;
    let module = module::ensure(workspace, &kernel)?;
    let agent = agent::build(workspace)?;
    let initramfs = initramfs::ensure(&agent, &[module])?;
    Ok(Images { vmlinux: kernel.vmlinux, initramfs, kernel_release: kernel.release })
}
