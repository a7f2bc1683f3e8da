//! perfbed's aarch64 QEMU running an arm64 guest on the `virt` board
//! (docs/arm64.md): GICv3, PSCI, a PL011 for the kernel log, the agent's
//! port on one of the board's virtio-mmio transports, and the device at a
//! fixed address with its domains' lines on GIC SPIs, all in the device
//! tree the board hands the guest (the arm64 patch of the device's shim,
//! `images/qemu/arm64/`, adds the device's node).

use std::path::Path;
use std::process::Command;

use super::config::VmConfig;
use super::qemu::{boot_args, io_args, quiet_args, smp_arg};

/// The board: GICv3 (its SPIs' affinity is what `irq_set_affinity` sets),
/// no firmware (QEMU answers PSCI itself, over HVC).
pub const MACHINE: &str = "virt,gic-version=3";
/// Where the device's registers sit: a hole in `virt`'s map between its
/// virtio-mmio transports (0x0a000000, 32 x 512 bytes) and its platform bus
/// (0x0c000000).
pub const DEVICE_BASE: u64 = 0x0b00_0000;
/// Domain `d`'s line is SPI `FIRST_SPI + d`: `virt` gives SPIs 0-9, 16-47
/// (virtio-mmio), 48-111 (GICv2m, unused with GICv3's ITS absent) and
/// 112-175 (the platform bus) away, and has 256 SPIs.
pub const FIRST_SPI: u32 = 176;

/// The SPIs of a device with `domains` domains, one each.
pub fn device_spis(domains: usize) -> Vec<u32> {
    // CAST: at most regs::MAX_DOMAINS (16) domains.
    (0..domains as u32).map(|d| FIRST_SPI + d).collect()
}

/// The kernel command line: the PL011 console; a panic ends the VM (PSCI
/// SYSTEM_RESET, which -no-reboot turns into QEMU's exit). The device needs
/// no parameter: the driver finds it in the device tree.
pub fn cmdline() -> Vec<String> {
    vec!["console=ttyAMA0".to_string(), "panic=-1".to_string()]
}

pub fn command(
    config: &VmConfig,
    cmdline: &[String],
    socket: &Path,
    control_socket: &Path,
) -> Command {
    let mut qemu = Command::new(&config.qemu);
    qemu.args(["-M", MACHINE]);
    quiet_args(&mut qemu);
    qemu.args([
        "-accel",
        "tcg",
        // QARMA's pointer authentication costs TCG dearly; the
        // implementation-defined algorithm is the cheap one.
        "-cpu",
        "max,pauth-impdef=on",
    ]);
    // Sockets by the domains, as on x86: each socket is one L3 in the
    // board's device tree.
    boot_args(
        &mut qemu,
        config,
        &smp_arg(u32::from(config.cpus), &config.device.domains),
        &cmdline.join(" "),
    );
    io_args(
        &mut qemu,
        config,
        socket,
        control_socket,
        DEVICE_BASE,
        &device_spis(config.device.domains.len()),
    );
    qemu
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::config::example;

    #[test]
    fn the_device_is_on_spis_at_the_fixed_address_of_the_virt_board() {
        let config = example();
        let command = command(
            &config,
            &cmdline(),
            Path::new("a.sock"),
            Path::new("c.sock"),
        );
        let args: Vec<String> = command
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let after = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .map(|i| args[i + 1].clone())
        };
        assert_eq!(after("-M").as_deref(), Some(MACHINE));
        let device = args
            .iter()
            .find(|a| a.starts_with("perfbed,"))
            .expect("a perfbed device");
        assert!(device.starts_with("perfbed,addr=0xb000000,"), "{device}");
        // The example has two domains: one SPI each, from the first free one.
        assert!(device.ends_with(",irqs=176:177"), "{device}");
        // The driver finds the device in the device tree, not on the command line.
        let line = after("-append").unwrap();
        assert!(!line.contains("perfbed.device="), "{line}");
        assert!(line.contains("console=ttyAMA0"), "{line}");
        // Two domains of two CPUs: two sockets, each an L3 in the device tree.
        assert_eq!(
            after("-smp").as_deref(),
            Some("cpus=4,maxcpus=4,sockets=2,dies=1,cores=2,threads=1")
        );
    }
}
