//! The box host: perfbed-vmm inside an L1 Linux with KVM, booted under
//! perfbed's QEMU with TCG emulating AMD SVM (what it boots is built by
//! `build::box_image`). QEMU exposes three virtio-serial ports as the
//! host-side files every host gives: the agent socket, the control socket
//! (through [`control_proxy`](super::control_proxy)) and the guest's serial
//! log; with gdb, a fourth as gdb's TCP port on 127.0.0.1, which the box's
//! `/init` relays to perfbed-vmm's stub.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use anyhow::Result;
use perfbed_box_init::{encode_args, PORT_AGENT, PORT_CONTROL, PORT_GDB, PORT_SERIAL};

use super::config::VmConfig;
use super::{control_proxy, vmm};
use crate::build::box_image::BoxImages;

/// perfbed-vmm's log line, on the box's console, once its gdb stub
/// listens (`vmm/src/vmm.rs`).
pub const GDB_READY: &str = "perfbed-vmm: gdb: listening";

/// L1's RAM beyond the guest's: its kernel, the initramfs (held in RAM) and
/// the VMM.
const L1_OVERHEAD_MIB: u32 = 640;

/// The box's QEMU for `config`'s guest with perfbed's kernel command line
/// `cmdline`, its agent socket, control socket and serial log at the given
/// paths. The box relays one control connection; xtask serves the usual
/// socket to its several clients over it.
pub fn command(
    config: &VmConfig,
    images: &BoxImages,
    cmdline: &[String],
    agent_socket: &Path,
    control_socket: &Path,
    serial_log: &Path,
    tsc_khz: u64,
) -> Result<Command> {
    let args = vmm::vmm_args(config, cmdline);
    let relayed = config.run_dir.join("control-box.sock");
    control_proxy::start(control_socket, &relayed)?;
    Ok(qemu_command(
        config,
        images,
        &args,
        agent_socket,
        &relayed,
        serial_log,
        tsc_khz,
    ))
}

/// The QEMU command that boots the box (sized for `config`'s guest) to run
/// perfbed-vmm with `vmm_args`, its sockets and log at the given paths.
pub fn qemu_command(
    config: &VmConfig,
    images: &BoxImages,
    vmm_args: &[String],
    agent_socket: &Path,
    control_socket: &Path,
    serial_log: &Path,
    tsc_khz: u64,
) -> Command {
    let l1_cmdline = [
        "console=ttyS0".to_string(),
        "reboot=t".into(),
        "panic=-1".into(),
        "mitigations=off".into(),
        "loglevel=4".into(),
        // L1 linked where its System.map says, so that a hung box's RIP
        // names a function (host::symbols).
        "nokaslr".into(),
        format!("tsc_early_khz={tsc_khz}"),
        "tsc=reliable".into(),
        encode_args(vmm_args),
    ];
    let mut qemu = Command::new(&config.qemu);
    for dir in &config.firmware_dirs {
        qemu.arg("-L").arg(dir);
    }
    qemu.args([
        "-M",
        "microvm",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ])
    // One vCPU: two corrupt L1 under TCG with SVM (shared/FACTS.md).
    .args(["-accel", "tcg", "-cpu", "max", "-smp", "1"])
    .arg("-m")
    .arg((config.memory_mib + L1_OVERHEAD_MIB).to_string())
    .arg("-kernel")
    .arg(&images.kernel)
    .arg("-initrd")
    .arg(&images.initramfs)
    .arg("-append")
    .arg(l1_cmdline.join(" "))
    .args([
        "-chardev",
        "stdio,id=l1console,signal=off",
        "-serial",
        "chardev:l1console",
    ])
    .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=1"])
    // Port 0 is kept for a console, and the agent, the control socket and
    // the serial log take three: gdb's fourth needs more than four. Only
    // then: the box's runs without gdb stay as they were measured
    // (docs/vmm-and-box.md, "gdb on perfbed-vmm").
    .arg("-device")
    .arg(format!(
        "virtio-serial-device,max_ports={}",
        if config.gdb.is_some() { 8 } else { 4 }
    ))
    .arg("-chardev")
    .arg(format!(
        "socket,id=agent,path={},server=on,wait=on",
        agent_socket.display()
    ))
    .arg("-device")
    .arg(format!("virtserialport,chardev=agent,name={PORT_AGENT}"))
    .arg("-chardev")
    .arg(format!(
        "socket,id=control,path={},server=on,wait=off",
        control_socket.display()
    ))
    .arg("-device")
    .arg(format!(
        "virtserialport,chardev=control,name={PORT_CONTROL}"
    ))
    // The guest's serial console reaches xtask through a socket it reads
    // (into serial.log), so that a test can stall it (`Vm::pause_serial`).
    .arg("-chardev")
    .arg(format!(
        "socket,id=serial,path={},server=on,wait=off",
        serial_socket(serial_log).display()
    ))
    .arg("-device")
    .arg(format!("virtserialport,chardev=serial,name={PORT_SERIAL}"));
    if let Some(gdb) = &config.gdb {
        qemu.arg("-chardev")
            .arg(format!(
                "socket,id=gdb,host=127.0.0.1,port={},server=on,wait=off",
                gdb.port
            ))
            .arg("-device")
            .arg(format!("virtserialport,chardev=gdb,name={PORT_GDB}"));
    }
    qemu
}

/// The socket the box's QEMU serves the guest's serial console on, beside
/// `serial_log`, where xtask copies it.
pub fn serial_socket(serial_log: &Path) -> PathBuf {
    serial_log.with_file_name("serial.sock")
}

/// The box's QEMU exit status in perfbed-vmm's terms.
pub fn describe_exit(status: ExitStatus) -> String {
    let Some(code) = status.code() else {
        return format!("the box's QEMU was killed ({status})");
    };
    match perfbed_box_init::vmm_status_from_qemu(code) {
        Ok(vmm) => format!("{} (see box.log)", vmm::describe_code(i32::from(vmm))),
        Err(why) => why,
    }
}

/// L1's own word that its timer interrupt was not handled: its RCU's
/// "kthread timer wakeup didn't happen for N jiffies" line (on L1's one
/// CPU, nothing but L1 not taking its own timer interrupt explains it).
/// The second positive sign of a box self-hang beside
/// `cpu_state::timer_stuck_in_both`.
pub fn l1_timer_missing(box_log: &str) -> Option<&str> {
    box_log
        .lines()
        .find(|l| l.contains("kthread timer wakeup didn't happen"))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd;
    use crate::host::config;

    #[test]
    fn the_box_has_one_vcpu_and_the_three_ports() {
        let images = BoxImages {
            kernel: "bzImage".into(),
            initramfs: "l1.cpio".into(),
            kernel_package: String::new(),
            system_map: "System.map".into(),
        };
        let qemu = qemu_command(
            &config::example(),
            &images,
            &[],
            Path::new("a.sock"),
            Path::new("c.sock"),
            Path::new("s.log"),
            1,
        );
        let line = cmd::display(&qemu);
        assert!(
            line.contains("-smp 1") && line.contains("-cpu max"),
            "{line}"
        );
        assert!(line.contains("-m 1152"), "{line}");
        assert!(line.contains(" nokaslr "), "{line}");
        for port in [PORT_AGENT, PORT_CONTROL, PORT_SERIAL] {
            assert!(line.contains(&format!("name={port}")), "{line}");
        }
        assert!(line.contains("path=a.sock,server=on,wait=on"), "{line}");
        assert!(!line.contains(PORT_GDB), "{line}");
        assert!(line.contains("max_ports=4"), "{line}");
        let mut with_gdb = config::example();
        with_gdb.gdb = Some(config::GdbStub {
            port: 4321,
            stopped: true,
            hint: String::new(),
        });
        let line = cmd::display(&qemu_command(
            &with_gdb,
            &images,
            &[],
            Path::new("a.sock"),
            Path::new("c.sock"),
            Path::new("s.log"),
            1,
        ));
        assert!(
            line.contains("socket,id=gdb,host=127.0.0.1,port=4321,server=on,wait=off")
                && line.contains(&format!("name={PORT_GDB}"))
                && line.contains("max_ports=8"),
            "{line}"
        );
    }

    #[test]
    fn l1s_rcu_saying_its_timer_did_not_fire_is_found() {
        let log = "[  156.402772] rcu: INFO: rcu_preempt self-detected stall on CPU\n[  156.404565] rcu: rcu_preempt kthread timer wakeup didn't happen for 29784 jiffies! g6057\n";
        assert_eq!(
            l1_timer_missing(log),
            Some("[  156.404565] rcu: rcu_preempt kthread timer wakeup didn't happen for 29784 jiffies! g6057")
        );
        // A plain stall (a busy guest vCPU thread) is not that.
        assert_eq!(
            l1_timer_missing("[ 1.0] rcu: INFO: rcu_preempt self-detected stall on CPU\n"),
            None
        );
    }
}
