//! The plain configuration a [`crate::Vmm`] is built from.
//!
//! Every limit a user can get wrong is checked here, before any KVM object
//! exists, so that a bad command line fails with a sentence and not with an
//! ioctl's errno.

use std::io::Read;
use std::path::PathBuf;

use perfbed_device::cpus::{format_cpu_list, parse_cpu_list, CpuListError};
use perfbed_device::{ConfigError, DeviceConfig};

use crate::boot::loader::detect_format;

/// Most vCPUs: the guest kernel's `CONFIG_NR_CPUS`, xtask's `--cpus` limit
/// as well (the MP table would fit 140).
pub const MAX_VCPUS: u8 = perfbed_device::cpus::GUEST_MAX_CPUS;
/// Least guest memory: the kernel, the initramfs and the boot structures
/// must fit below the MMIO hole with room to spare.
pub const MIN_MEMORY_MIB: u32 = 64;
/// Most guest memory.
pub const MAX_MEMORY_MIB: u32 = 64 * 1024;
/// The serial output ring's bounds: at least a line of the kernel's, at
/// most far more than a log that keeps up ever holds back.
pub const MIN_SERIAL_RING: usize = 1024;
pub const MAX_SERIAL_RING: usize = 64 << 20;

/// The guest kernel and what it boots with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelConfig {
    /// An ELF `vmlinux` with a PVH note, or a bzImage.
    pub path: PathBuf,
    /// An initramfs (cpio, possibly compressed), if any.
    pub initramfs: Option<PathBuf>,
    /// The user's part of the command line; the VMM appends the device
    /// announcements.
    pub cmdline: String,
}

/// The guest's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MachineConfig {
    /// Number of vCPUs.
    pub vcpus: u8,
    /// Guest RAM in MiB.
    pub memory_mib: u32,
    /// Hide XSAVE and AVX from the guest (see [`crate::vcpu::cpuid::hide_xsave`]).
    pub hide_xsave: bool,
}

/// Where the VMM's host-side endpoints go.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EndpointsConfig {
    /// The device's control socket (the same protocol as the QEMU host's).
    pub control_socket: Option<PathBuf>,
    /// The agent channel: the VMM listens here and starts the guest only
    /// once a client has connected, like QEMU's `server=on,wait=on`.
    pub agent_socket: Option<PathBuf>,
    /// The 8250 serial console's output; without it the output is dropped.
    pub serial_log: Option<PathBuf>,
    /// The bytes of serial output held for the log before the UART drops
    /// them ([`crate::devices::serial::OutputRing`]); `None`:
    /// [`crate::devices::serial::OUTPUT_RING`].
    pub serial_ring: Option<usize>,
    /// Keep each bus's first this many accesses and print them at the end
    /// (`perfbed-vmm: access` lines: the fuzz targets' seeds); 0: none.
    pub record_accesses: usize,
    /// gdb's remote protocol for the guest (`crate::gdb`).
    pub gdb: Option<GdbConfig>,
}

/// Where gdb connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GdbListen {
    /// A TCP port on 127.0.0.1 (as QEMU's `-gdb tcp::PORT`).
    Tcp(u16),
    /// A Unix socket (the box relays it to the host).
    Unix(PathBuf),
}

/// The gdb stub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GdbConfig {
    pub listen: GdbListen,
    /// The vCPUs start paused until gdb lets them run (QEMU's `-S`).
    pub stopped: bool,
}

/// Everything a [`crate::Vmm`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmmConfig {
    pub kernel: KernelConfig,
    pub machine: MachineConfig,
    /// The monitoring device (its domains' CPU sets included).
    pub device: DeviceConfig,
    pub endpoints: EndpointsConfig,
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigurationError {
    #[error("--cpus {0}: need 1 to {MAX_VCPUS} vCPUs")]
    Vcpus(u8),
    #[error("--memory {0}: need {MIN_MEMORY_MIB} to {MAX_MEMORY_MIB} MiB")]
    Memory(u32),
    #[error("kernel image {path}: {source}")]
    Kernel {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("initramfs {path}: {source}")]
    Initramfs {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--pmu-domain {index} ({cpus}) allows CPU {cpu}, but the guest has CPUs 0-{last}")]
    DomainCpuOutOfRange {
        index: usize,
        cpus: String,
        cpu: u32,
        last: u32,
    },
    #[error("--pmu-domain {first} and --pmu-domain {second} overlap on CPUs {cpus}")]
    DomainsOverlap {
        first: usize,
        second: usize,
        cpus: String,
    },
    #[error("the monitoring device: {0}")]
    Device(#[from] ConfigError),
    #[error("--serial-ring {0}: need {MIN_SERIAL_RING} to {MAX_SERIAL_RING} bytes")]
    SerialRing(usize),
    #[error("the kernel command line contains a NUL byte")]
    CmdlineNul,
    #[error("kernel image {0} is neither an ELF vmlinux nor a bzImage")]
    KernelFormat(PathBuf),
}

impl VmmConfig {
    /// Checks every limit and that the kernel and initramfs can be read.
    pub fn validate(&self) -> Result<(), ConfigurationError> {
        let vcpus = self.machine.vcpus;
        if vcpus == 0 || vcpus > MAX_VCPUS {
            return Err(ConfigurationError::Vcpus(vcpus));
        }
        let memory = self.machine.memory_mib;
        if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&memory) {
            return Err(ConfigurationError::Memory(memory));
        }
        if self.kernel.cmdline.contains('\0') {
            return Err(ConfigurationError::CmdlineNul);
        }
        if let Some(ring) = self.endpoints.serial_ring {
            if !(MIN_SERIAL_RING..=MAX_SERIAL_RING).contains(&ring) {
                return Err(ConfigurationError::SerialRing(ring));
            }
        }
        check_domains(&self.device.domains, vcpus)?;
        self.device.validate()?;
        let kernel_error = |source| ConfigurationError::Kernel {
            path: self.kernel.path.clone(),
            source,
        };
        let mut head = Vec::with_capacity(0x210);
        std::fs::File::open(&self.kernel.path)
            .and_then(|file| file.take(0x210).read_to_end(&mut head))
            .map_err(kernel_error)?;
        if detect_format(&head).is_none() {
            return Err(ConfigurationError::KernelFormat(self.kernel.path.clone()));
        }
        if let Some(path) = &self.kernel.initramfs {
            std::fs::File::open(path).map_err(|source| ConfigurationError::Initramfs {
                path: path.clone(),
                source,
            })?;
        }
        Ok(())
    }
}

/// Each domain inside the guest's CPUs, and no CPU in two domains: a CPU
/// belongs to one L3 cache, as on the hardware the device models.
pub fn check_domains(domains: &[Vec<u32>], vcpus: u8) -> Result<(), ConfigurationError> {
    let last = u32::from(vcpus).saturating_sub(1);
    for (index, cpus) in domains.iter().enumerate() {
        if let Some(&cpu) = cpus.iter().find(|&&c| c > last) {
            return Err(ConfigurationError::DomainCpuOutOfRange {
                index,
                cpus: format_cpu_list(cpus),
                cpu,
                last,
            });
        }
    }
    for (first, a) in domains.iter().enumerate() {
        for (second, b) in domains.iter().enumerate().skip(first + 1) {
            let common: Vec<u32> = a.iter().copied().filter(|c| b.contains(c)).collect();
            if !common.is_empty() {
                return Err(ConfigurationError::DomainsOverlap {
                    first,
                    second,
                    cpus: format_cpu_list(&common),
                });
            }
        }
    }
    Ok(())
}

/// Why a `--pmu-domain` value could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DomainSpecError {
    #[error("expected cpus=<list>, as in cpus=0-1, got {0:?}")]
    Syntax(String),
    #[error("unknown key {0:?} (the only key is cpus)")]
    UnknownKey(String),
    #[error(transparent)]
    CpuList(#[from] CpuListError),
    #[error("the CPU list is empty")]
    Empty,
}

/// Parses a `--pmu-domain` value: `cpus=0-1,3`.
pub fn parse_domain_spec(spec: &str) -> Result<Vec<u32>, DomainSpecError> {
    let (key, value) = spec
        .split_once('=')
        .ok_or_else(|| DomainSpecError::Syntax(spec.to_string()))?;
    if key.trim() != "cpus" {
        return Err(DomainSpecError::UnknownKey(key.trim().to_string()));
    }
    let cpus = parse_cpu_list(value)?;
    if cpus.is_empty() {
        return Err(DomainSpecError::Empty);
    }
    Ok(cpus)
}

/// The domains a guest gets when none are given: its CPUs in two halves
/// (one domain when it has one CPU), as the QEMU host's default.
pub fn default_domains(vcpus: u8) -> Vec<Vec<u32>> {
    let n = u32::from(vcpus.max(1));
    if n == 1 {
        return vec![vec![0]];
    }
    let half = n / 2;
    vec![(0..half).collect(), (half..n).collect()]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of its own for each call: tests run in parallel, and one that
    /// rewrote another's kernel file under it made validation flaky.
    fn temp_file(name: &str) -> PathBuf {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("perfbed-vmm-{}-{n}-{name}", std::process::id()));
        std::fs::write(&path, b"\x7fELF\x02\x01\x01").unwrap();
        path
    }

    fn config() -> VmmConfig {
        VmmConfig {
            kernel: KernelConfig {
                path: temp_file("kernel"),
                initramfs: None,
                cmdline: "console=ttyS0".into(),
            },
            machine: MachineConfig {
                vcpus: 4,
                memory_mib: 512,
                hide_xsave: false,
            },
            device: DeviceConfig::default(),
            endpoints: EndpointsConfig::default(),
        }
    }

    #[test]
    fn a_good_config_passes() {
        config().validate().unwrap();
    }

    #[test]
    fn bad_shapes_are_refused_with_the_flag() {
        let mut c = config();
        c.machine.vcpus = 0;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "--cpus 0: need 1 to 64 vCPUs"
        );
        let mut c = config();
        c.machine.vcpus = 65;
        assert!(matches!(c.validate(), Err(ConfigurationError::Vcpus(65))));
        c.machine.vcpus = 64;
        c.device.domains = default_domains(64);
        c.validate().unwrap();
        let mut c = config();
        c.machine.memory_mib = 8;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("--memory 8"));
        let mut c = config();
        c.kernel.cmdline.push('\0');
        assert!(matches!(c.validate(), Err(ConfigurationError::CmdlineNul)));
        let mut c = config();
        c.endpoints.serial_ring = Some(MIN_SERIAL_RING - 1);
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "--serial-ring 1023: need 1024 to 67108864 bytes"
        );
        c.endpoints.serial_ring = Some(MIN_SERIAL_RING);
        c.validate().unwrap();
    }

    #[test]
    fn missing_files_are_named() {
        let mut c = config();
        c.kernel.path = "/nonexistent/vmlinux".into();
        let message = c.validate().unwrap_err().to_string();
        assert!(message.contains("/nonexistent/vmlinux"), "{message}");
        let mut c = config();
        c.kernel.path = temp_file("text");
        std::fs::write(&c.kernel.path, b"not a kernel").unwrap();
        assert!(matches!(
            c.validate(),
            Err(ConfigurationError::KernelFormat(_))
        ));
        let mut c = config();
        c.kernel.initramfs = Some("/nonexistent/initramfs".into());
        assert!(matches!(
            c.validate(),
            Err(ConfigurationError::Initramfs { .. })
        ));
    }

    #[test]
    fn domains_must_fit_and_not_overlap() {
        let mut c = config();
        c.machine.vcpus = 2;
        let message = c.validate().unwrap_err().to_string();
        assert_eq!(
            message,
            "--pmu-domain 1 (2-3) allows CPU 2, but the guest has CPUs 0-1"
        );
        let mut c = config();
        c.device.domains = vec![vec![0, 1, 2], vec![2, 3]];
        let message = c.validate().unwrap_err().to_string();
        assert_eq!(
            message,
            "--pmu-domain 0 and --pmu-domain 1 overlap on CPUs 2"
        );
        let mut c = config();
        c.device.domains = vec![];
        assert!(matches!(c.validate(), Err(ConfigurationError::Device(_))));
    }

    #[test]
    fn domain_specs() {
        assert_eq!(parse_domain_spec("cpus=0-1,3").unwrap(), vec![0, 1, 3]);
        assert_eq!(
            parse_domain_spec("0-1"),
            Err(DomainSpecError::Syntax("0-1".into()))
        );
        assert_eq!(
            parse_domain_spec("cpu=0"),
            Err(DomainSpecError::UnknownKey("cpu".into()))
        );
        assert_eq!(parse_domain_spec("cpus="), Err(DomainSpecError::Empty));
        assert!(matches!(
            parse_domain_spec("cpus=x"),
            Err(DomainSpecError::CpuList(_))
        ));
    }

    #[test]
    fn default_domains_split_the_cpus() {
        assert_eq!(default_domains(1), vec![vec![0]]);
        assert_eq!(default_domains(4), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(default_domains(3), vec![vec![0], vec![1, 2]]);
        for n in 1..=8 {
            check_domains(&default_domains(n), n).unwrap();
        }
    }
}
