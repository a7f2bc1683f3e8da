//! The guest's kernel command line: the user's part, then the devices,
//! announced the way the QEMU host announces them, so the guest's drivers
//! find them the same way on either host.

use linux_loader::cmdline::{Cmdline, Error as CmdlineLibError};

use crate::memory::CMDLINE_MAX;

/// A virtio-mmio transport the kernel must be told about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VirtioMmioSlot {
    pub base: u64,
    pub size: u64,
    pub irq: u32,
}

/// Why the command line could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CmdlineError {
    #[error("the kernel command line would exceed {CMDLINE_MAX} bytes")]
    TooLong,
    #[error("the kernel command line: {0}")]
    Invalid(CmdlineLibError),
    #[error(
        "the command line already announces the monitoring device ({0}); the VMM does that itself"
    )]
    DeviceAlreadyAnnounced(String),
}

/// `perfbed.device=<size>@<base>[:<gsi>,...]` (each domain's GSI, those
/// that have one), as xtask writes it for the QEMU host.
pub fn perfbed_device_param(size: u64, base: u64, gsis: &[u32]) -> String {
    let mut param = format!("perfbed.device={size:#x}@{base:#x}");
    if !gsis.is_empty() {
        let list: Vec<String> = gsis.iter().map(u32::to_string).collect();
        param += &format!(":{}", list.join(","));
    }
    param
}

/// `virtio_mmio.device=<size>@<base>:<irq>`, as QEMU's microvm writes it.
pub fn virtio_mmio_param(slot: &VirtioMmioSlot) -> String {
    format!(
        "virtio_mmio.device={}@{:#x}:{}",
        slot.size, slot.base, slot.irq
    )
}

/// The whole command line: `user`, then the monitoring device, then each
/// virtio-mmio transport.
pub fn build(
    user: &str,
    device: Option<(u64, u64, &[u32])>,
    virtio: &[VirtioMmioSlot],
) -> Result<Cmdline, CmdlineError> {
    if let Some(word) = user
        .split_whitespace()
        .find(|w| w.starts_with("perfbed.device="))
    {
        return Err(CmdlineError::DeviceAlreadyAnnounced(word.to_string()));
    }
    let mut cmdline = Cmdline::new(CMDLINE_MAX).map_err(CmdlineError::Invalid)?;
    let mut push = |text: &str| -> Result<(), CmdlineError> {
        if text.trim().is_empty() {
            return Ok(());
        }
        cmdline.insert_str(text.trim()).map_err(|e| match e {
            CmdlineLibError::TooLarge => CmdlineError::TooLong,
            other => CmdlineError::Invalid(other),
        })
    };
    push(user)?;
    if let Some((size, base, gsis)) = device {
        push(&perfbed_device_param(size, base, gsis))?;
    }
    for slot in virtio {
        push(&virtio_mmio_param(slot))?;
    }
    Ok(cmdline)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(c: &Cmdline) -> String {
        c.as_cstring().unwrap().into_string().unwrap()
    }

    #[test]
    fn devices_follow_the_user_part() {
        let slot = VirtioMmioSlot {
            base: 0xfeb0_0000,
            size: 512,
            irq: 5,
        };
        let c = build(
            "console=ttyS0 panic=-1",
            Some((0x3000, 0xfe00_0000, &[13, 14])),
            &[slot],
        )
        .unwrap();
        assert_eq!(
            text(&c),
            "console=ttyS0 panic=-1 perfbed.device=0x3000@0xfe000000:13,14 virtio_mmio.device=512@0xfeb00000:5"
        );
    }

    #[test]
    fn the_device_parameter_matches_the_qemu_hosts() {
        // xtask/src/host/config.rs: device_param(size, gsis)
        assert_eq!(
            perfbed_device_param(3 * 4096, 0xfe00_0000, &[]),
            "perfbed.device=0x3000@0xfe000000"
        );
        assert_eq!(
            perfbed_device_param(3 * 4096, 0xfe00_0000, &[13, 14]),
            "perfbed.device=0x3000@0xfe000000:13,14"
        );
    }

    #[test]
    fn an_empty_user_part_is_fine() {
        let c = build("  ", Some((0x1000, 0x2000, &[])), &[]).unwrap();
        assert_eq!(text(&c), "perfbed.device=0x1000@0x2000");
    }

    #[test]
    fn too_long_and_doubled_are_refused() {
        let long = "x".repeat(CMDLINE_MAX);
        assert!(matches!(
            build(&long, None, &[]),
            Err(CmdlineError::TooLong)
        ));
        assert!(matches!(
            build("a perfbed.device=0x1000@0x0", Some((0x1000, 0, &[])), &[]),
            Err(CmdlineError::DeviceAlreadyAnnounced(_))
        ));
        assert!(matches!(
            build("caf\u{e9}", None, &[]),
            Err(CmdlineError::Invalid(_))
        ));
    }
}
