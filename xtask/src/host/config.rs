//! The guest a host boots: its shape, kernel, initramfs, device and logs
//! ([`VmConfig`]), checked before anything is built or started for it.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use perfbed_device::DeviceConfig;

use super::Host;

/// The guest kernel's CONFIG_NR_CPUS, perfbed-vmm's limit too.
pub const MAX_CPUS: u8 = perfbed_device::cpus::GUEST_MAX_CPUS;
/// Where the monitoring device's registers sit in guest physical memory: a
/// hole below microvm's virtio-mmio (0xfeb00000) and IOAPIC windows.
pub const DEVICE_BASE: u64 = 0xfe00_0000;
/// The GSIs of the device's interrupt lines, domain `d`'s on
/// `DEVICE_GSIS[d]`: the ISA IRQs that microvm with `acpi=off` leaves free
/// after its eight virtio-mmio transports (GSIs 5-12), which its firmware's
/// MP table announces like every ISA IRQ. A domain beyond the third has no
/// line; its driver polls. perfbed-vmm uses the same ones.
pub const DEVICE_GSIS: [u32; 3] = [13, 14, 15];

/// The GSIs of a device with `domains` domains, one per domain while they
/// last.
pub fn device_gsis(domains: usize) -> &'static [u32] {
    &DEVICE_GSIS[..domains.min(DEVICE_GSIS.len())]
}

/// `perfbed.device=<size>@<base>[:<gsi>,...]`: the device announced the way
/// virtio-mmio devices are, with each domain's GSI (perfbed-vmm writes the
/// same for its guests).
pub fn device_param(size: u64, gsis: &[u32]) -> String {
    let mut param = format!("perfbed.device={size:#x}@{DEVICE_BASE:#x}");
    if !gsis.is_empty() {
        let list: Vec<String> = gsis.iter().map(u32::to_string).collect();
        param += &format!(":{}", list.join(","));
    }
    param
}
pub const MIN_MEMORY_MIB: u32 = 128;
pub const MAX_MEMORY_MIB: u32 = 16384;

#[derive(Debug, Clone)]
pub struct VmConfig {
    pub qemu: PathBuf,
    /// Firmware search path (`-L`), in order.
    pub firmware_dirs: Vec<PathBuf>,
    pub vmlinux: PathBuf,
    pub initramfs: PathBuf,
    pub cpus: u8,
    pub memory_mib: u32,
    /// Appended to perfbed's own kernel command line.
    pub extra_cmdline: Vec<String>,
    /// Where the serial log, QEMU's own output and the agent transcript go.
    pub run_dir: PathBuf,
    /// How long the guest may take to greet us.
    pub boot_timeout: Duration,
    /// The monitoring device the guest gets.
    pub device: DeviceConfig,
    /// A gdb stub (QEMU's, or perfbed-vmm's), if wanted.
    pub gdb: Option<GdbStub>,
    /// Show the serial log and the agent transcript live on stderr, each
    /// line prefixed (`serial|`, `agent>`, `agent<`).
    pub verbose: bool,
    /// Which VMM runs the guest.
    pub host: Host,
    /// perfbed-vmm's serial output ring (`--serial-ring`), in bytes; `None`
    /// its default. QEMU has none.
    pub serial_ring: Option<usize>,
    /// The guest's clock counts the instructions its vCPUs execute, one
    /// nanosecond each (QEMU's `-icount shift=0,sleep=off`), instead of the
    /// host's time: a measurement of a code path's length that the host's
    /// load does not move. QEMU on TCG only.
    pub instruction_clock: bool,
}

/// The host's gdb stub for the guest (QEMU's gdbstub, or perfbed-vmm's,
/// whose port the box relays to L1).
#[derive(Debug, Clone)]
pub struct GdbStub {
    /// TCP port on 127.0.0.1.
    pub port: u16,
    /// Start with the vCPUs stopped until gdb continues them.
    pub stopped: bool,
    /// Printed once the host waits for gdb: how to attach.
    pub hint: String,
}

impl VmConfig {
    /// The device's control socket: `control.sock` in the run folder, on
    /// every host (it exists once the host has started).
    pub fn control_socket(&self) -> PathBuf {
        self.run_dir.join("control.sock")
    }

    pub fn validate(&self) -> Result<()> {
        check_size(self.cpus, self.memory_mib)?;
        self.device
            .validate()
            .map_err(|e| anyhow!("the device: {e}"))?;
        for (d, cpus) in self.device.domains.iter().enumerate() {
            if let Some(cpu) = cpus.iter().find(|&&c| c >= u32::from(self.cpus)) {
                bail!(
                    "domain {d} allows CPU {cpu}, but the guest has CPUs 0-{}",
                    self.cpus - 1
                );
            }
        }
        // arm64's `virt` boots an `Image`, which is no ELF file.
        if !matches!(self.host, Host::QemuVirt) {
            check_elf_kernel(&self.vmlinux)?;
        }
        if self.instruction_clock && !matches!(self.host, Host::Qemu) {
            bail!(
                "an instruction clock needs perfbed's QEMU on TCG, not {}",
                self.host.name()
            );
        }
        if !self.initramfs.is_file() {
            bail!(
                "initramfs {} is missing; `cargo xtask image` builds it",
                self.initramfs.display()
            );
        }
        Ok(())
    }
}

/// The VM's shape, checked before anything is built for it.
pub fn check_size(cpus: u8, memory_mib: u32) -> Result<()> {
    if !(1..=MAX_CPUS).contains(&cpus) {
        bail!("--cpus {cpus}: the guest kernel supports 1 to {MAX_CPUS} CPUs");
    }
    if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&memory_mib) {
        bail!("--memory {memory_mib}: give the guest {MIN_MEMORY_MIB} to {MAX_MEMORY_MIB} MiB");
    }
    Ok(())
}

/// The guest boots through PVH, which needs an ELF `vmlinux`: catch a wrong
/// or truncated file here rather than in QEMU's terser words.
pub fn check_elf_kernel(path: &Path) -> Result<()> {
    let mut magic = [0u8; 4];
    let mut file = File::open(path)
        .with_context(|| format!("kernel image {} cannot be opened", path.display()))?;
    if file.read_exact(&mut magic).is_err() || magic != *b"\x7fELF" {
        bail!(
            "kernel image {} is not an ELF vmlinux (perfbed boots a PVH vmlinux, not a bzImage)",
            path.display()
        );
    }
    Ok(())
}

/// A fresh folder for one boot's logs: `target/perfbed/runs/<time>-<name>`
/// (with the process id, so that two runs started in the same millisecond
/// never share one).
pub fn new_run_dir(workspace: &Path, name: &str) -> PathBuf {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let pid = std::process::id();
    workspace.join("target/perfbed/runs").join(format!(
        "{}-{:03}-{pid}-{name}",
        now.as_secs(),
        now.subsec_millis()
    ))
}

/// A valid configuration for tests of what is built from one (nothing is
/// checked to exist).
#[cfg(test)]
pub fn example() -> VmConfig {
    VmConfig {
        qemu: "qemu".into(),
        firmware_dirs: vec![],
        vmlinux: "vmlinux".into(),
        initramfs: "initramfs".into(),
        cpus: 4,
        memory_mib: 512,
        extra_cmdline: vec![],
        run_dir: "run".into(),
        boot_timeout: Duration::from_secs(1),
        device: DeviceConfig::default(),
        host: Host::Qemu,
        serial_ring: None,
        instruction_clock: false,
        gdb: None,
        verbose: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn the_cpu_limit_is_the_guest_kernels_nr_cpus() {
        for name in ["config.fragment", "arm64.fragment"] {
            let fragment = format!("{}/../images/kernel/{name}", env!("CARGO_MANIFEST_DIR"));
            let text = fs::read_to_string(&fragment).unwrap();
            let nr: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("CONFIG_NR_CPUS="))
                .collect();
            assert_eq!(nr, vec![MAX_CPUS.to_string()], "{fragment}");
        }
    }

    #[test]
    fn bad_vm_configs_are_refused_with_the_reason() {
        let dir = std::env::temp_dir().join(format!("perfbed-vmcfg-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let elf = dir.join("vmlinux");
        fs::write(&elf, b"\x7fELF and the rest").unwrap();
        let initramfs = dir.join("initramfs.cpio");
        fs::write(&initramfs, b"").unwrap();
        let good = VmConfig {
            qemu: "qemu-system-x86_64".into(),
            firmware_dirs: vec![],
            device: DeviceConfig::default(),
            vmlinux: elf,
            initramfs,
            cpus: 4,
            memory_mib: 512,
            extra_cmdline: vec![],
            run_dir: dir.join("run"),
            boot_timeout: Duration::from_secs(1),
            gdb: None,
            verbose: false,
            host: Host::Qemu,
            serial_ring: None,
            instruction_clock: false,
        };
        good.validate().unwrap();
        let err = |c: VmConfig| c.validate().unwrap_err().to_string();
        assert!(err(VmConfig {
            cpus: 0,
            ..good.clone()
        })
        .contains("--cpus 0"));
        assert!(err(VmConfig {
            cpus: 65,
            ..good.clone()
        })
        .contains("1 to 64"));
        assert!(err(VmConfig {
            memory_mib: 1,
            ..good.clone()
        })
        .contains("--memory 1"));
        assert!(err(VmConfig {
            cpus: 2,
            ..good.clone()
        })
        .contains("domain 1 allows CPU 2"));
        assert!(err(VmConfig {
            vmlinux: dir.join("absent"),
            ..good.clone()
        })
        .contains("cannot be opened"));
        let bz = dir.join("bzImage");
        fs::write(&bz, b"MZ\0\0not elf").unwrap();
        assert!(err(VmConfig {
            vmlinux: bz,
            ..good.clone()
        })
        .contains("not an ELF vmlinux"));
        assert!(err(VmConfig {
            instruction_clock: true,
            host: Host::QemuVirt,
            ..good.clone()
        })
        .contains("an instruction clock needs perfbed's QEMU on TCG"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
