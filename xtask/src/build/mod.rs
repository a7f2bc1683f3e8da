//! Building what a run boots: the packages and tools this machine needs
//! ([`deps`]), the input-keyed build cache ([`cache`]), the guest's images
//! ([`image`]: kernel, perfbed.ko, initramfs, QEMU) and the box's
//! ([`box_image`]). Nothing here knows how a guest is booted.

pub mod box_image;
pub mod cache;
pub mod deps;
pub mod image;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The workspace root: xtask lives one level below it.
pub fn workspace() -> Result<PathBuf> {
    let manifest =
        std::env::var_os("CARGO_MANIFEST_DIR").context("run this through `cargo xtask`")?;
    Ok(Path::new(&manifest)
        .parent()
        .context("xtask has a parent folder")?
        .to_path_buf())
}
