//! `perfbed-vmm`: the command line over [`perfbed_vmm::Vmm`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use perfbed_device::DeviceConfig;
use perfbed_vmm::config::{
    default_domains, parse_domain_spec, EndpointsConfig, GdbConfig, GdbListen, KernelConfig,
    MachineConfig,
};
use perfbed_vmm::devices::serial::OUTPUT_RING;
use perfbed_vmm::{bench, ExitStatus, GuestEnd, Vmm, VmmBuilder, VmmConfig};

const AFTER_HELP: &str = "\
The VMM adds to the kernel command line the monitoring device
(perfbed.device=<size>@0xfe000000) and the virtio console
(virtio_mmio.device=512@0xfeb00000:5), as perfbed's QEMU host does.

Exit status: 0 the agent powered the guest off (it writes an MMIO page
announced as perfbed_agent.power_off=<address> before its reboot);
1 the VMM failed; 2 bad arguments; 3 the guest kernel panicked;
4 SIGTERM or SIGINT; 5 the guest reset without the agent's power-off
or a panic (a triple fault); 6 KVM could not run the guest (failed
entry, internal error). Every vCPU is out of KVM and joined before the
exit report (`perfbed-vmm: stat vcpus_joined=N`), which ends with
`perfbed-vmm: exit status N (name): meaning`.

Example:
  perfbed-vmm --kernel vmlinux --initramfs initramfs.cpio.gz \\
    --cmdline 'console=ttyS0 panic=-1 reboot=t' --cpus 4 --memory 512 \\
    --pmu-domain cpus=0-1 --pmu-domain cpus=2-3 \\
    --control-socket ctl.sock --agent-socket agent.sock --serial-log serial.log";

/// perfbed's rust-vmm VMM: boots a Linux guest on KVM with the monitoring
/// device on its MMIO bus.
#[derive(Debug, Parser)]
#[command(name = "perfbed-vmm", version, after_help = AFTER_HELP)]
struct Cli {
    /// Guest kernel: an ELF vmlinux with a PVH entry, or a bzImage.
    #[arg(long, value_name = "PATH", required_unless_present = "bench_exits")]
    kernel: Option<PathBuf>,
    /// Initramfs (cpio, possibly compressed).
    #[arg(long, value_name = "PATH")]
    initramfs: Option<PathBuf>,
    /// Kernel command line (the VMM appends its device announcements).
    #[arg(long, value_name = "TEXT", default_value = "console=ttyS0")]
    cmdline: String,
    /// Number of vCPUs (1-64).
    #[arg(long, value_name = "N", default_value_t = 1)]
    cpus: u8,
    /// Guest RAM in MiB (64-65536).
    #[arg(long, value_name = "MIB", default_value_t = 512)]
    memory: u32,
    /// A monitoring-device domain and the vCPUs allowed to read it, as
    /// `cpus=0-1`; repeat for each domain. Default: the vCPUs in two halves.
    #[arg(long = "pmu-domain", value_name = "cpus=LIST", value_parser = parse_domain)]
    pmu_domains: Vec<Vec<u32>>,
    /// RMIDs (monitoring groups) of the device.
    #[arg(long, value_name = "N", default_value_t = DeviceConfig::default().rmids)]
    pmu_rmids: u32,
    /// Counter slots per domain.
    #[arg(long, value_name = "N", default_value_t = DeviceConfig::default().slots)]
    pmu_slots: u32,
    /// Counter width in bits.
    #[arg(long, value_name = "BITS", default_value_t = DeviceConfig::default().counter_width)]
    pmu_counter_width: u32,
    /// Each domain's maximum bandwidth, bytes per second.
    #[arg(long, value_name = "BYTES", default_value_t = DeviceConfig::default().max_rate)]
    pmu_max_rate: u64,
    /// Records the device's trace keeps (0 records nothing).
    #[arg(long, value_name = "N", default_value_t = DeviceConfig::default().trace_capacity)]
    pmu_trace_capacity: usize,
    /// Hide XSAVE and AVX from the guest (FPU state kept with FXSAVE): for
    /// KVM nested under QEMU's TCG, which does not make XSETBV exit.
    #[arg(long)]
    no_xsave: bool,
    /// Serve the device's control socket here (JSON lines, as the QEMU host).
    #[arg(long, value_name = "PATH")]
    control_socket: Option<PathBuf>,
    /// Carry the guest's virtio-console port (/dev/vport0p1) on a Unix socket here;
    /// the guest starts once a client connects.
    #[arg(long, value_name = "PATH")]
    agent_socket: Option<PathBuf>,
    /// Write the serial console (ttyS0) here.
    #[arg(long, value_name = "PATH")]
    serial_log: Option<PathBuf>,
    /// Hold at most this many bytes of serial output for a log that does
    /// not keep up (1024 to 67108864); the UART drops, and counts, what does
    /// not fit.
    #[arg(long, value_name = "BYTES", default_value_t = OUTPUT_RING)]
    serial_ring: usize,
    /// Serve gdb's remote protocol on this TCP port of 127.0.0.1 (one gdb at
    /// a time; every vCPU is a thread).
    #[arg(long, value_name = "PORT", conflicts_with = "gdb_socket")]
    gdb_port: Option<u16>,
    /// Serve gdb's remote protocol on this Unix socket instead.
    #[arg(long, value_name = "PATH")]
    gdb_socket: Option<PathBuf>,
    /// With --gdb-port or --gdb-socket: start with every vCPU stopped before
    /// the first instruction, until gdb continues (QEMU's -S).
    #[arg(long)]
    gdb_stopped: bool,
    /// Keep each bus's first N guest accesses and print them at the end as
    /// `perfbed-vmm: access` lines (seeds for the fuzz targets).
    #[arg(long, value_name = "N", default_value_t = 0)]
    record_accesses: usize,
    /// Instead of booting, measure N device MMIO exits against N bare exits
    /// on one vCPU and print the figures.
    #[arg(long, value_name = "N", conflicts_with = "kernel")]
    bench_exits: Option<u32>,
}

fn parse_domain(spec: &str) -> Result<Vec<u32>, String> {
    parse_domain_spec(spec).map_err(|e| e.to_string())
}

impl Cli {
    fn config(self, kernel: PathBuf) -> VmmConfig {
        let domains = if self.pmu_domains.is_empty() {
            default_domains(self.cpus)
        } else {
            self.pmu_domains
        };
        VmmConfig {
            kernel: KernelConfig {
                path: kernel,
                initramfs: self.initramfs,
                cmdline: self.cmdline,
            },
            machine: MachineConfig {
                vcpus: self.cpus,
                memory_mib: self.memory,
                hide_xsave: self.no_xsave,
            },
            device: DeviceConfig {
                domains,
                rmids: self.pmu_rmids,
                slots: self.pmu_slots,
                counter_width: self.pmu_counter_width,
                max_rate: self.pmu_max_rate,
                trace_capacity: self.pmu_trace_capacity,
                ..DeviceConfig::default()
            },
            endpoints: EndpointsConfig {
                control_socket: self.control_socket,
                agent_socket: self.agent_socket,
                serial_log: self.serial_log,
                serial_ring: Some(self.serial_ring),
                gdb: match (self.gdb_port, self.gdb_socket) {
                    (Some(port), _) => Some(GdbConfig {
                        listen: GdbListen::Tcp(port),
                        stopped: self.gdb_stopped,
                    }),
                    (None, Some(path)) => Some(GdbConfig {
                        listen: GdbListen::Unix(path),
                        stopped: self.gdb_stopped,
                    }),
                    (None, None) => None,
                },
                record_accesses: self.record_accesses,
            },
        }
    }
}

fn main() -> ExitCode {
    let start = Instant::now();
    perfbed_vmm::logger::init();
    let cli = Cli::parse();
    if let Some(iterations) = cli.bench_exits {
        return match bench::exit_costs(iterations) {
            Ok(c) => {
                println!("iterations={}", c.iterations);
                println!("device_mmio_round_trip_ns={:.0}", c.device_round_trip_ns);
                println!("device_mmio_handler_ns={:.0}", c.device_handler_ns);
                println!("bare_mmio_round_trip_ns={:.0}", c.bare_round_trip_ns);
                println!(
                    "device_vs_bare_ratio={:.3}",
                    c.device_round_trip_ns / c.bare_round_trip_ns
                );
                ExitCode::SUCCESS
            }
            Err(e) => fail(ExitStatus::HostError, e.into()),
        };
    }
    let Some(kernel) = cli.kernel.clone() else {
        return fail(ExitStatus::Usage, anyhow::anyhow!("--kernel is required"));
    };
    if cli.gdb_stopped && cli.gdb_port.is_none() && cli.gdb_socket.is_none() {
        return fail(
            ExitStatus::Usage,
            anyhow::anyhow!("--gdb-stopped needs --gdb-port or --gdb-socket"),
        );
    }
    let config = cli.config(kernel);
    if let Err(e) = config.validate() {
        return fail(ExitStatus::Usage, e.into());
    }
    let outcome = VmmBuilder::new(config, start).build().and_then(Vmm::run);
    match &outcome {
        Ok(GuestEnd::KvmFailure(why)) => log::error!("{why}"),
        Err(e) => log::error!("{e}"),
        Ok(_) => {}
    }
    let status = ExitStatus::of(&outcome);
    // The report's last line, at any log level.
    eprintln!("{}", status.report_line());
    // The vCPU threads have ended; the event loop's helpers (the device's
    // ticker, the control socket's threads) end with the process.
    std::process::exit(i32::from(status.code()));
}

fn fail(status: ExitStatus, error: anyhow::Error) -> ExitCode {
    // Every error's message already carries its cause.
    log::error!("{error}");
    ExitCode::from(status.code())
}
