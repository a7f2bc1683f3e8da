//! The contract between xtask (the host) and the box's `/init` (in L1).
//!
//! The box is an L1 Linux under QEMU with KVM inside it. The host gives
//! `/init` perfbed-vmm's arguments on L1's kernel command line, and three
//! virtio-serial ports carry what the host would otherwise reach directly:
//! the agent channel, the device's control socket and the guest's serial
//! console; a fourth, with gdb, carries gdb's connections to perfbed-vmm's
//! stub (`--gdb-socket` [`GDB_SOCKET`] among the arguments asks for it).
//! `/init` runs perfbed-vmm, relays the sockets to the ports and ends L1
//! with perfbed-vmm's exit status.

/// virtio-serial port names (`-device virtserialport,name=...`).
pub const PORT_AGENT: &str = "perfbed.agent";
pub const PORT_CONTROL: &str = "perfbed.control";
pub const PORT_SERIAL: &str = "perfbed.serial";
pub const PORT_GDB: &str = "perfbed.gdb";

/// Where perfbed-vmm serves gdb in L1 (`--gdb-socket`); `/init` relays each
/// gdb connection the host makes on [`PORT_GDB`] to it.
pub const GDB_SOCKET: &str = "/run/gdb.sock";

/// Whether perfbed-vmm's arguments ask for gdb on [`GDB_SOCKET`].
pub fn wants_gdb(args: &[String]) -> bool {
    args.windows(2)
        .any(|w| w[0] == "--gdb-socket" && w[1] == GDB_SOCKET)
}

/// L1 kernel command-line key carrying perfbed-vmm's arguments.
pub const ARGS_KEY: &str = "perfbed_box.vmm=";

/// The I/O port of QEMU's `isa-debug-exit`, through which `/init` ends L1
/// with a status when perfbed-vmm failed: QEMU exits with `(code << 1) | 1`.
pub const DEBUG_EXIT_PORT: u16 = 0xf4;

/// A word in the guest's command line (perfbed-vmm's `--cmdline`) that
/// makes `/init` send SIGTERM to perfbed-vmm while it waits for the agent's
/// client, instead of connecting: the hook of the test that a signal ends
/// that wait (the guest's kernel ignores the dotted word).
pub const TERMINATE_BEFORE_AGENT: &str = "perfbed_box.terminate_before_agent";

/// Whether perfbed-vmm's arguments carry [`TERMINATE_BEFORE_AGENT`] in the
/// guest's command line.
pub fn terminate_before_agent(vmm_args: &[String]) -> bool {
    vmm_args.windows(2).any(|w| {
        w[0] == "--cmdline"
            && w[1]
                .split_whitespace()
                .any(|word| word == TERMINATE_BEFORE_AGENT)
    })
}

/// `/init` itself failed (before or around perfbed-vmm).
pub const BOX_FAILED: u8 = 0x7f;

/// The file in L1's initramfs listing the modules to load, in order, one
/// `<file> [params]` a line.
pub const MODULE_ORDER: &str = "lib/modules/order";

/// perfbed-vmm's path in L1, and where its guest images are.
pub const VMM_PATH: &str = "/perfbed-vmm";
pub const GUEST_KERNEL: &str = "/guest/vmlinux";
pub const GUEST_INITRAMFS: &str = "/guest/initramfs";

/// Arguments as one command-line word: NUL-joined, hex-encoded (the kernel
/// command line has no quoting an argument could not break).
pub fn encode_args(args: &[String]) -> String {
    let joined = args.join("\0");
    let hex: String = joined.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{ARGS_KEY}{hex}")
}

/// The arguments from L1's `/proc/cmdline`, if the key is there and valid.
pub fn decode_args(cmdline: &str) -> Option<Vec<String>> {
    let hex = cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix(ARGS_KEY))?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    let text = String::from_utf8(bytes?).ok()?;
    if text.is_empty() {
        return Some(Vec::new());
    }
    Some(text.split('\0').map(String::from).collect())
}

/// How the host reads QEMU's exit status: `Ok` with perfbed-vmm's status,
/// or `Err` with a sentence.
pub fn vmm_status_from_qemu(qemu_status: i32) -> Result<u8, String> {
    match qemu_status {
        0 => Ok(0),
        s if s & 1 == 1 && (s >> 1) == i32::from(BOX_FAILED) => {
            Err("the box's /init failed (see the L1 log)".into())
        }
        s if s & 1 == 1 && (1..=255).contains(&(s >> 1)) => Ok((s >> 1) as u8),
        s => Err(format!("the box's QEMU exited with status {s}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_survive_the_kernel_command_line() {
        let args: Vec<String> = [
            "--cmdline",
            "console=ttyS0 panic=-1 a=\"b c\"",
            "--cpus",
            "4",
            "",
        ]
        .map(String::from)
        .to_vec();
        let word = encode_args(&args);
        assert!(!word.contains(' ') && !word.contains('"'));
        let cmdline = format!("console=ttyS0 {word} quiet");
        assert_eq!(decode_args(&cmdline).unwrap(), args);
        assert_eq!(decode_args("console=ttyS0"), None);
        assert_eq!(decode_args("perfbed_box.vmm=abc"), None);
        assert_eq!(decode_args("perfbed_box.vmm=zz"), None);
        assert_eq!(decode_args("perfbed_box.vmm="), Some(vec![]));
    }

    #[test]
    fn gdb_is_asked_for_by_the_socket_argument() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(wants_gdb(&args(&[
            "--cpus",
            "4",
            "--gdb-socket",
            GDB_SOCKET,
            "--gdb-stopped"
        ])));
        assert!(!wants_gdb(&args(&["--cpus", "4"])));
        assert!(!wants_gdb(&args(&["--gdb-socket", "/elsewhere"])));
        assert!(!wants_gdb(&args(&[GDB_SOCKET])));
    }

    #[test]
    fn qemu_statuses_map_back() {
        assert_eq!(vmm_status_from_qemu(0), Ok(0));
        assert_eq!(vmm_status_from_qemu((3 << 1) | 1), Ok(3));
        assert!(vmm_status_from_qemu((i32::from(BOX_FAILED) << 1) | 1).is_err());
        assert!(vmm_status_from_qemu(2).is_err());
        assert!(vmm_status_from_qemu(1).is_err());
    }

    #[test]
    fn the_terminate_hook_is_a_word_of_the_guests_command_line_only() {
        let args = |cmdline: &str| {
            ["--cpus", "2", "--cmdline", cmdline]
                .map(String::from)
                .to_vec()
        };
        assert!(terminate_before_agent(&args(
            "console=ttyS0 perfbed_box.terminate_before_agent"
        )));
        assert!(!terminate_before_agent(&args("console=ttyS0")));
        assert!(!terminate_before_agent(&args(
            "perfbed_box.terminate_before_agent_not"
        )));
        let elsewhere = ["--serial-log", TERMINATE_BEFORE_AGENT]
            .map(String::from)
            .to_vec();
        assert!(!terminate_before_agent(&elsewhere));
    }
}
