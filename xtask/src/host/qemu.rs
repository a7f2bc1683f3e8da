//! The QEMU host: perfbed's QEMU runs the guest itself (KVM or TCG), the
//! device mapped by its C shim (images/qemu/perfbed.c).

use std::path::Path;
use std::process::Command;

use perfbed_device::cpus::format_cpu_list;
use perfbed_device::l3_topology;
use perfbed_device::DeviceConfig;

use super::config::{device_gsis, VmConfig, DEVICE_BASE};
use super::Accel;

/// The machine every QEMU boot of perfbed's guest uses.
pub const MACHINE: &str = "microvm,x-option-roms=off,acpi=off";

/// perfbed's QEMU running the guest itself, the device mapped by its shim.
pub fn command(
    config: &VmConfig,
    accel: &Accel,
    cmdline: &[String],
    socket: &Path,
    control_socket: &Path,
) -> Command {
    let mut qemu = Command::new(&config.qemu);
    for dir in &config.firmware_dirs {
        qemu.arg("-L").arg(dir);
    }
    qemu.args(["-M", MACHINE]);
    guest_args(&mut qemu, config, accel, &cmdline.join(" "));
    io_args(
        &mut qemu,
        config,
        socket,
        control_socket,
        DEVICE_BASE,
        device_gsis(config.device.domains.len()),
    );
    qemu
}

/// The guest's serial console, the agent's port, the device (registers at
/// `base`, domain `d`'s line on `lines[d]`) and the gdb stub if asked for.
pub fn io_args(
    qemu: &mut Command,
    config: &VmConfig,
    socket: &Path,
    control_socket: &Path,
    base: u64,
    lines: &[u32],
) {
    serial_args(qemu);
    agent_port_args(qemu, socket);
    qemu.arg("-device")
        .arg(device_arg(&config.device, control_socket, base, lines));
    gdb_args(qemu, config);
}

/// No defaults, no display, exit on reboot.
pub fn quiet_args(qemu: &mut Command) {
    qemu.args([
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ]);
}

/// The guest's serial console on QEMU's stdout, which xtask logs.
fn serial_args(qemu: &mut Command) {
    qemu.args([
        "-chardev",
        "stdio,id=serial0,signal=off",
        "-serial",
        "chardev:serial0",
    ]);
}

/// QEMU's gdb stub, if the config asks for one.
fn gdb_args(qemu: &mut Command, config: &VmConfig) {
    if let Some(gdb) = &config.gdb {
        qemu.arg("-gdb").arg(format!("tcp:127.0.0.1:{}", gdb.port));
        if gdb.stopped {
            qemu.arg("-S");
        }
    }
}

/// What every QEMU boot of perfbed's images says, whatever the machine: no
/// defaults, no display, exit on reboot, the accelerator, the guest's shape,
/// its kernel, initramfs and command line.
pub fn guest_args(qemu: &mut Command, config: &VmConfig, accel: &Accel, cmdline: &str) {
    quiet_args(qemu);
    if accel.kvm {
        qemu.args(["-accel", "kvm", "-cpu", "host"]);
    } else {
        qemu.args(["-accel", "tcg", "-cpu", "max"]);
        if config.instruction_clock {
            // No sleep: an idle guest's clock jumps to its next timer
            // instead of following the host's, so that only executed
            // instructions move it.
            qemu.args(["-icount", "shift=0,sleep=off"]);
        }
    }
    boot_args(
        qemu,
        config,
        &smp_arg(u32::from(config.cpus), &config.device.domains),
        cmdline,
    );
}

/// The guest's CPUs (`-smp`), memory, kernel, initramfs and command line.
pub fn boot_args(qemu: &mut Command, config: &VmConfig, smp: &str, cmdline: &str) {
    qemu.arg("-smp")
        .arg(smp)
        .arg("-m")
        .arg(config.memory_mib.to_string())
        .arg("-kernel")
        .arg(&config.vmlinux)
        .arg("-initrd")
        .arg(&config.initramfs)
        .arg("-append")
        .arg(cmdline);
}

/// `-smp` laying the CPUs out as perfbed-vmm's CPUID does
/// (`perfbed_device::l3_topology`): aligned blocks of `2^b` CPUs, each one
/// L3 and one die as Linux reads them. The blocks are QEMU *sockets*, not
/// dies: `microvm` refuses `dies=` in QEMU 7.2 (only `pc` sets
/// `dies_supported`). With one die per socket QEMU's leaf 4 (its own cache
/// model: `host-cache-info` is off and `l3-cache` on by default, for `host`
/// too) shares the L3 among `1 << die_offset` APIC IDs, the socket, and
/// Linux, with no die level in leaf 0xB, takes the package's shift for the
/// die's, so `die_id` is the socket. APIC IDs are core numbers
/// (`threads=1`, `cores=2^b`), dense from 0 as in perfbed-vmm; when the last
/// block is short (6 CPUs in blocks of 4) `maxcpus` holds the full blocks
/// and the missing CPUs are never present.
///
/// The arm64 `virt` board takes the same line: its device tree's cpu-map
/// puts each block in a socket (the guest's `physical_package_id`) and the
/// board's cache nodes give each socket one L3 (`images/qemu/arm64/0002`).
pub fn smp_arg(cpus: u32, domains: &[Vec<u32>]) -> String {
    let cores = 1u32 << l3_topology::l3_sharing_bits(cpus, domains);
    let sockets = cpus.div_ceil(cores);
    format!(
        "cpus={cpus},maxcpus={},sockets={sockets},dies=1,cores={cores},threads=1",
        sockets * cores
    )
}

/// The agent's virtio-serial port, on a socket QEMU serves and waits on
/// before it starts the guest.
pub fn agent_port_args(qemu: &mut Command, socket: &Path) {
    qemu.args(["-device", "virtio-serial-device", "-chardev"])
        .arg(format!(
            "socket,id=agent,path={},server=on,wait=on",
            socket.display()
        ))
        // A plain port, not a virtconsole: QEMU throttles the guest when our
        // end of the socket is full, where a console port drops the bytes.
        .args(["-device", "virtserialport,chardev=agent,name=perfbed.agent"]);
}

/// The `-device perfbed,...` argument of perfbed's QEMU (images/qemu/perfbed.c):
/// the registers at `base`, domain `d`'s line on `lines[d]` (x86's GSIs, or
/// an Arm board's GIC SPIs).
fn device_arg(device: &DeviceConfig, control: &Path, base: u64, lines: &[u32]) -> String {
    // QEMU splits `-device` options at commas and reads `,,` as one: a
    // domain that is not one range (`0,2`) must be escaped, or QEMU takes
    // `2:1` for a property name and refuses to start.
    let domains: Vec<String> = device
        .domains
        .iter()
        .map(|d| format_cpu_list(d).replace(',', ",,"))
        .collect();
    let mut arg = format!(
        "perfbed,addr={base:#x},domains={},rmids={},slots={},width={},max-rate={},control={}",
        domains.join(":"),
        device.rmids,
        device.slots,
        device.counter_width,
        device.max_rate,
        control.display()
    );
    // Only when asked: a QEMU from before the property still takes the rest.
    if device.trace_capacity != perfbed_device::TRACE_CAPACITY {
        arg += &format!(",trace-capacity={}", device.trace_capacity);
    }
    let lines: Vec<String> = lines.iter().map(u32::to_string).collect();
    if !lines.is_empty() {
        arg += &format!(",irqs={}", lines.join(":"));
    }
    arg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_that_are_not_one_range_have_their_commas_escaped() {
        let device = DeviceConfig {
            domains: vec![vec![0, 2], vec![1, 3]],
            ..DeviceConfig::default()
        };
        let arg = device_arg(&device, Path::new("/run/control.sock"), DEVICE_BASE, &[]);
        assert!(arg.contains(",domains=0,,2:1,,3,rmids="), "{arg}");
        let device = DeviceConfig {
            domains: vec![vec![0, 1], vec![2, 3]],
            ..DeviceConfig::default()
        };
        let arg = device_arg(&device, Path::new("/run/control.sock"), DEVICE_BASE, &[]);
        assert!(arg.contains(",domains=0-1:2-3,rmids="), "{arg}");
    }

    #[test]
    fn only_an_instruction_clock_on_tcg_counts_instructions() {
        let args = |instruction_clock: bool, kvm: bool| {
            let config = VmConfig {
                instruction_clock,
                ..super::super::config::example()
            };
            let mut qemu = Command::new("qemu");
            guest_args(
                &mut qemu,
                &config,
                &Accel {
                    kvm,
                    reason: String::new(),
                },
                "",
            );
            crate::cmd::display(&qemu)
        };
        assert!(args(true, false).contains(" -icount shift=0,sleep=off "));
        assert!(!args(false, false).contains("-icount"));
        assert!(!args(true, true).contains("-icount"));
    }

    #[test]
    fn smp_makes_each_power_of_two_block_a_socket() {
        let halves = [vec![0, 1], vec![2, 3]];
        assert_eq!(
            smp_arg(4, &halves),
            "cpus=4,maxcpus=4,sockets=2,dies=1,cores=2,threads=1"
        );
        let quarters: Vec<Vec<u32>> = (0..4).map(|d| (4 * d..4 * d + 4).collect()).collect();
        assert_eq!(
            smp_arg(16, &quarters),
            "cpus=16,maxcpus=16,sockets=4,dies=1,cores=4,threads=1"
        );
        // A short last block: the missing CPUs are slots, never present.
        assert_eq!(
            smp_arg(6, &[vec![0, 1, 2, 3], vec![4, 5]]),
            "cpus=6,maxcpus=8,sockets=2,dies=1,cores=4,threads=1"
        );
        // Not a power-of-two split: the blocks of the largest domain, as perfbed-vmm.
        assert_eq!(
            smp_arg(6, &[vec![0, 1, 2], vec![3, 4, 5]]),
            "cpus=6,maxcpus=8,sockets=2,dies=1,cores=4,threads=1"
        );
        assert_eq!(
            smp_arg(1, &[vec![0]]),
            "cpus=1,maxcpus=1,sockets=1,dies=1,cores=1,threads=1"
        );
        assert_eq!(
            smp_arg(3, &[]),
            "cpus=3,maxcpus=4,sockets=1,dies=1,cores=4,threads=1"
        );
    }
}
