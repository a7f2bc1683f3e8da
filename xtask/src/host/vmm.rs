//! The perfbed-vmm host: rust-vmm on KVM, natively here, or inside the box
//! ([`the_box`](super::the_box) passes it the same arguments).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use anyhow::{anyhow, Context, Result};
use perfbed_device::ControlClient;
use perfbed_vmm::vcpu::snapshot::{BEGIN_MARKER, END_MARKER};
use perfbed_vmm::ExitStatus as VmmExit;

use super::config::VmConfig;
use super::Host;

/// perfbed-vmm on this machine's /dev/kvm for `config`'s guest, with
/// perfbed's kernel command line `cmdline` and its endpoints at the given
/// paths (it writes the guest's serial log itself).
pub fn command(
    vmm: &Path,
    config: &VmConfig,
    cmdline: &[String],
    agent_socket: &Path,
    control_socket: &Path,
    serial_log: &Path,
) -> Command {
    let mut command = Command::new(vmm);
    command
        .arg("--kernel")
        .arg(&config.vmlinux)
        .arg("--initramfs")
        .arg(&config.initramfs)
        .args(vmm_args(config, cmdline))
        .arg("--agent-socket")
        .arg(agent_socket)
        .arg("--control-socket")
        .arg(control_socket)
        .arg("--serial-log")
        .arg(serial_log);
    command
}

/// Set to N, perfbed-vmm keeps the guest's first N accesses to each bus and
/// prints them at the end of the run (`perfbed-vmm: access` lines).
pub const RECORD_ACCESSES_ENV: &str = "PERFBED_VMM_RECORD_ACCESSES";

/// perfbed-vmm's arguments for `config` (the box adds the kernel, the
/// initramfs and the endpoints).
pub fn vmm_args(config: &VmConfig, cmdline: &[String]) -> Vec<String> {
    let mut args = vec![
        "--cpus".to_string(),
        config.cpus.to_string(),
        "--memory".into(),
        config.memory_mib.to_string(),
        "--cmdline".into(),
        cmdline.join(" "),
        "--pmu-rmids".into(),
        config.device.rmids.to_string(),
        "--pmu-slots".into(),
        config.device.slots.to_string(),
        "--pmu-counter-width".into(),
        config.device.counter_width.to_string(),
        "--pmu-max-rate".into(),
        config.device.max_rate.to_string(),
        "--pmu-trace-capacity".into(),
        config.device.trace_capacity.to_string(),
    ];
    if let Some(ring) = config.serial_ring {
        args.extend(["--serial-ring".into(), ring.to_string()]);
    }
    if matches!(config.host, Host::VmmBox(_)) {
        // TCG's SVM does not make XSETBV exit (see perfbed-vmm --help).
        args.push("--no-xsave".into());
    }
    if let Some(gdb) = &config.gdb {
        match config.host {
            // The box's /init relays its gdb port to this socket in L1.
            Host::VmmBox(_) => {
                args.extend(["--gdb-socket".into(), perfbed_box_init::GDB_SOCKET.into()])
            }
            _ => args.extend(["--gdb-port".into(), gdb.port.to_string()]),
        }
        if gdb.stopped {
            args.push("--gdb-stopped".into());
        }
    }
    // Seeds for the fuzz targets: the guest's first accesses to each bus,
    // printed at the end of the run (fuzz/src/recorded.rs reads them).
    if let Some(n) = std::env::var_os(RECORD_ACCESSES_ENV) {
        args.push("--record-accesses".into());
        args.push(n.to_string_lossy().into_owned());
    }
    for domain in &config.device.domains {
        args.push("--pmu-domain".into());
        args.push(format!(
            "cpus={}",
            perfbed_device::cpus::format_cpu_list(domain)
        ));
    }
    args
}

/// perfbed-vmm's exit `status`, named from its table.
pub fn describe_exit(status: ExitStatus) -> String {
    match status.code() {
        Some(code) => describe_code(code),
        None => format!("perfbed-vmm was killed ({status})"),
    }
}

/// perfbed-vmm's exit code `code` (native, or passed on by the box), named
/// from its table ([`perfbed_vmm::ExitStatus`]).
pub fn describe_code(code: i32) -> String {
    match u8::try_from(code).ok().and_then(VmmExit::from_code) {
        Some(status) => format!(
            "perfbed-vmm exited with status {code} ({}): {}",
            status.name(),
            status.meaning()
        ),
        None => format!("perfbed-vmm exited with status {code}, which is not one of its own"),
    }
}

/// perfbed-vmm's own report and the box's timing, from the run's host log
/// (the box's console, or perfbed-vmm's stderr when it runs natively).
pub fn host_report(run_dir: &Path) -> Vec<String> {
    ["box.log", "vmm.log"]
        .iter()
        .filter_map(|name| fs::read_to_string(run_dir.join(name)).ok())
        .flat_map(|log| {
            log.lines()
                .filter(|l| {
                    l.contains("perfbed-vmm: stat ")
                        || l.contains("perfbed-vmm: exit status ")
                        || l.contains("perfbed-box: L1 ready")
                })
                .map(|l| l.trim().to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// perfbed-vmm's guest vCPUs (registers, local APICs, pending events), in
/// the run folder: asked of its control socket, or cut out of its log when
/// it captured them itself (a KVM failure, an unexpected reset).
pub const VCPU_STATE_FILE: &str = "vcpu-state.txt";

/// Asks perfbed-vmm on `control_socket` for its vCPUs' state now and saves
/// it as `out`.
pub fn request_vcpu_state(control_socket: &Path, out: &Path) -> Result<PathBuf> {
    let text = ControlClient::connect(control_socket)
        .and_then(|mut c| c.cpu_state())
        .map_err(|e| {
            anyhow!(
                "asking {} for the vCPUs' state: {e}",
                control_socket.display()
            )
        })?;
    fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
    Ok(out.to_path_buf())
}

/// The last capture perfbed-vmm printed itself (between its markers) in
/// the run's host log, saved as [`VCPU_STATE_FILE`], with the reason it
/// gave; `None` when it printed none.
pub fn save_logged_vcpu_state(run_dir: &Path) -> Option<(PathBuf, String)> {
    let log = ["box.log", "vmm.log"]
        .iter()
        .find_map(|name| fs::read_to_string(run_dir.join(name)).ok())?;
    let (why, text) = logged_vcpu_state(&log)?;
    let path = run_dir.join(VCPU_STATE_FILE);
    fs::write(&path, text).ok()?;
    Some((path, why))
}

/// The reason and text of the last capture in `log` (lines as the console
/// gave them, `\r` and all).
fn logged_vcpu_state(log: &str) -> Option<(String, String)> {
    let begin = log.rfind(BEGIN_MARKER)?;
    let rest = &log[begin + BEGIN_MARKER.len()..];
    let (why, body) = rest.split_once('\n')?;
    let body = &body[..body.find(END_MARKER)?];
    let text: String = body
        .lines()
        .map(|l| format!("{}\n", l.trim_end_matches('\r')))
        .collect();
    Some((why.trim_start_matches(':').trim().to_string(), text))
}

/// perfbed-vmm's `vcpus_joined=J` and `vcpus=N` figures from its report:
/// how many vCPU threads it stopped out of KVM and joined before reporting,
/// of how many.
pub fn vcpus_joined(report: &[String]) -> Option<(u32, u32)> {
    let figure = |key| stat(report, key).and_then(|n| u32::try_from(n).ok());
    Some((figure("vcpus_joined")?, figure("vcpus")?))
}

/// One `perfbed-vmm: stat key=N` figure of its report.
pub fn stat(report: &[String], key: &str) -> Option<u64> {
    report.iter().find_map(|l| {
        l.split_once("perfbed-vmm: stat ")?
            .1
            .strip_prefix(key)?
            .strip_prefix('=')?
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::config;

    #[test]
    fn the_joined_vcpus_are_read_from_the_report() {
        let report = [
            "perfbed-vmm: stat io_exits=3",
            "[ 1.0] perfbed-vmm: stat vcpus_joined=3",
            "perfbed-vmm: stat vcpus=4",
        ];
        let report: Vec<String> = report.iter().map(|l| l.to_string()).collect();
        assert_eq!(vcpus_joined(&report), Some((3, 4)));
        assert_eq!(vcpus_joined(&report[..2]), None, "no total, no figure");
    }

    #[test]
    fn the_vmms_own_capture_is_cut_out_of_its_log() {
        let taken = perfbed_vmm::vcpu::snapshot::VcpuSnapshot {
            index: 1,
            ..Default::default()
        };
        let capture = perfbed_vmm::vcpu::snapshot::render(&[Ok(taken)]);
        let log = format!(
            "[ 1.0] booting\r\n{BEGIN_MARKER}: a reset\r\n{}{END_MARKER}\r\nperfbed-vmm: stat vcpus=2\n",
            capture.replace('\n', "\r\n")
        );
        let (why, text) = logged_vcpu_state(&log).expect("a capture");
        assert_eq!((why.as_str(), text.as_str()), ("a reset", capture.as_str()));
        assert_eq!(super::super::cpu_state::parse(&text).len(), 1);
        assert_eq!(logged_vcpu_state("no capture\n"), None);
        assert_eq!(
            logged_vcpu_state(&format!("{BEGIN_MARKER}: cut short\nCPU#0\n")),
            None,
            "no end marker"
        );
    }

    #[test]
    fn every_exit_status_is_named_and_others_are_not_taken_for_one() {
        let named: Vec<String> = VmmExit::ALL
            .iter()
            .map(|s| describe_code(i32::from(s.code())))
            .collect();
        for (status, text) in VmmExit::ALL.iter().zip(&named) {
            assert!(text.contains(&format!("({})", status.name())), "{text}");
        }
        assert!(
            named[0].contains("powered-off") && named[3].contains("panicked"),
            "{named:?}"
        );
        assert!(named[5].contains("triple fault"), "{}", named[5]);
        assert!(describe_code(42).contains("not one of its own"));
        assert!(describe_code(-1).contains("not one of its own"));
    }

    #[test]
    fn gdb_is_a_port_natively_and_the_boxs_socket_in_the_box() {
        let mut config = config::example();
        assert!(!vmm_args(&config, &[])
            .iter()
            .any(|a| a.starts_with("--gdb")));
        config.gdb = Some(config::GdbStub {
            port: 4321,
            stopped: true,
            hint: String::new(),
        });
        config.host = Host::VmmNative {
            vmm: "perfbed-vmm".into(),
        };
        let joined = vmm_args(&config, &[]).join(" ");
        assert!(
            joined.ends_with("--gdb-port 4321 --gdb-stopped")
                || joined.contains("--gdb-port 4321 --gdb-stopped "),
            "{joined}"
        );
        config.host = Host::VmmBox(crate::build::box_image::BoxImages {
            kernel: "bzImage".into(),
            initramfs: "l1.cpio".into(),
            kernel_package: String::new(),
            system_map: "System.map".into(),
        });
        config.gdb.as_mut().unwrap().stopped = false;
        let args = vmm_args(&config, &[]);
        assert!(perfbed_box_init::wants_gdb(&args), "{args:?}");
        assert!(
            !args
                .iter()
                .any(|a| a == "--gdb-port" || a == "--gdb-stopped"),
            "{args:?}"
        );
    }

    #[test]
    fn the_vmm_gets_the_guests_shape_and_device() {
        let args = vmm_args(
            &config::example(),
            &["console=ttyS0".into(), "panic=-1".into()],
        );
        let joined = args.join(" ");
        assert!(
            joined.contains("--cpus 4 --memory 512 --cmdline console=ttyS0 panic=-1"),
            "{joined}"
        );
        assert!(
            joined.ends_with("--pmu-domain cpus=0-1 --pmu-domain cpus=2-3"),
            "{joined}"
        );
        assert!(
            joined.contains("--pmu-rmids 8 --pmu-slots 4 --pmu-counter-width 24"),
            "{joined}"
        );
        assert!(
            joined.contains(&format!(
                "--pmu-trace-capacity {}",
                perfbed_device::TRACE_CAPACITY
            )),
            "{joined}"
        );
    }
}
