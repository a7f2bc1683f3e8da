//! The QEMU host: perfbed's QEMU runs the guest itself (KVM or TCG), the
//! device mapped by its C shim (images/qemu/perfbed.c).

use std::path::Path;
use std::process::Command;

use perfbed_device::cpus::format_cpu_list;
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
    qemu.args([
        "-chardev",
        "stdio,id=serial0,signal=off",
        "-serial",
        "chardev:serial0",
    ]);
    agent_port_args(&mut qemu, socket);
    qemu.arg("-device")
        .arg(device_arg(&config.device, control_socket));
    if let Some(gdb) = &config.gdb {
        qemu.arg("-gdb").arg(format!("tcp:127.0.0.1:{}", gdb.port));
        if gdb.stopped {
            qemu.arg("-S");
        }
    }
    qemu
}

/// What every QEMU boot of perfbed's images says, whatever the machine: no
/// defaults, no display, exit on reboot, the accelerator, the guest's shape,
/// its kernel, initramfs and command line.
pub fn guest_args(qemu: &mut Command, config: &VmConfig, accel: &Accel, cmdline: &str) {
    qemu.args([
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ]);
    if accel.kvm {
        qemu.args(["-accel", "kvm", "-cpu", "host"]);
    } else {
        qemu.args(["-accel", "tcg", "-cpu", "max"]);
    }
    qemu.arg("-smp")
        .arg(config.cpus.to_string())
        .arg("-m")
        .arg(config.memory_mib.to_string())
        .arg("-kernel")
        .arg(&config.vmlinux)
        .arg("-initrd")
        .arg(&config.initramfs)
        .arg("-append")
        .arg(cmdline);
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

/// The `-device perfbed,...` argument of perfbed's QEMU (images/qemu/perfbed.c).
fn device_arg(device: &DeviceConfig, control: &Path) -> String {
    let domains: Vec<String> = device.domains.iter().map(|d| format_cpu_list(d)).collect();
    let mut arg = format!(
        "perfbed,addr={DEVICE_BASE:#x},domains={},rmids={},slots={},width={},max-rate={},control={}",
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
    let gsis: Vec<String> = device_gsis(device.domains.len())
        .iter()
        .map(u32::to_string)
        .collect();
    if !gsis.is_empty() {
        arg += &format!(",irqs={}", gsis.join(":"));
    }
    arg
}
