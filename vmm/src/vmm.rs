//! [`Vmm`]: a VM assembled from a [`VmmConfig`] in one readable function,
//! then run until the guest resets.

use std::fs::File;
use std::io::BufWriter;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;

use event_manager::{EventManager, EventOps, EventSet, EventSubscriber, Events, SubscriberOps};
use kvm_bindings::{kvm_pit_config, kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{Cap, IoEventAddress, Kvm, VmFd};
use perfbed_device::host::Ticker;
use perfbed_device::SharedDevice;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::agent_channel::{accept_one, AgentChannel};
use crate::boot::cmdline::{self, CmdlineError, VirtioMmioSlot};
use crate::boot::{self, BootEntry, LoadError};
use crate::config::{ConfigurationError, VmmConfig};
use crate::devices::bus::{Bus, BusError};
use crate::devices::perfbed::{PerfbedLines, PerfbedMmio};
use crate::devices::serial::{ConsoleSink, SerialConsole, COM1_BASE, COM1_IRQ, COM1_LEN};
use crate::devices::virtio::console::Console;
use crate::devices::virtio::mmio::{MmioTransport, TransportError, QUEUE_NOTIFY_OFFSET};
use crate::devices::virtio::Interrupt;
use crate::memory::{
    create_guest_memory, MemoryError, GDT_ADDR, IDT_ADDR, KVM_IDENTITY_MAP_ADDR, KVM_TSS_ADDR, PERFBED_DEVICE_BASE,
    VIRTIO_MMIO_BASE, VIRTIO_MMIO_SIZE,
};
use crate::stats::{rss_beyond, Stats};
use crate::vcpu::{regs, Vcpu, VcpuEnd, VcpuError};

/// The virtio console's interrupt (the first after COM1's, as Firecracker's).
pub const VIRTIO_CONSOLE_IRQ: u32 = 5;
/// The monitoring device's interrupt lines, domain `d`'s on
/// `PERFBED_GSIS[d]`: the GSIs the QEMU host gives it (xtask's
/// `host::config::DEVICE_GSIS`), so the guest sees one machine on either
/// host. Domains beyond have no line; the driver polls them.
pub const PERFBED_GSIS: [u32; 3] = [13, 14, 15];
/// How often the device's ticker lets time pass while an overflow
/// interrupt is enabled.
const PERFBED_TICK: std::time::Duration = std::time::Duration::from_millis(2);

/// Why the VMM could not be built or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    #[error(transparent)]
    Config(#[from] ConfigurationError),
    #[error("KVM: {what}: {source}")]
    Kvm {
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("KVM lacks {0:?}, which the VMM needs")]
    MissingCapability(Cap),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Boot(#[from] LoadError),
    #[error(transparent)]
    Cmdline(#[from] CmdlineError),
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    #[error("placing a device: {0}")]
    Bus(#[from] BusError),
    #[error("the monitoring device: {0}")]
    Device(#[from] perfbed_device::ConfigError),
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the GDT: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
    #[error("the event loop: {0}")]
    EventLoop(String),
    #[error("{0}")]
    VcpuFailed(String),
}

fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> VmmError {
    let what = what.into();
    move |source| VmmError::Io { what, source }
}

fn kvm_error(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmmError {
    move |source| VmmError::Kvm { what, source }
}

/// How the guest ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestEnd {
    /// It rebooted or powered off (the agent's power-off is a reboot).
    Reset,
    /// It panicked (the serial console showed the panic banner) and reset.
    Panicked,
}

/// A built VM, ready to run.
pub struct Vmm {
    config: VmmConfig,
    memory: GuestMemoryMmap,
    vcpus: Vec<Vcpu>,
    io_bus: Arc<Bus>,
    mmio_bus: Arc<Bus>,
    serial: Arc<SerialConsole>,
    panicked: Arc<AtomicBool>,
    console: Arc<MmioTransport<Console>>,
    device: SharedDevice,
    perfbed: Arc<PerfbedMmio>,
    /// Lets time pass for the device's interrupts; stopped with the VM.
    _perfbed_ticker: Ticker,
    stats: Arc<Stats>,
    // Kept for the VM's lifetime: dropping them would close the VM.
    _vm: VmFd,
    _kvm: Kvm,
}

/// KVM, a VM with the in-kernel irqchip and PIT, and `memory_mib` of RAM.
pub(crate) fn create_vm(memory_mib: u32) -> Result<(Kvm, VmFd, GuestMemoryMmap), VmmError> {
    let kvm = Kvm::new().map_err(kvm_error("opening /dev/kvm"))?;
    for cap in [Cap::Irqchip, Cap::Pit2, Cap::UserMemory, Cap::Irqfd, Cap::Ioeventfd, Cap::ExtCpuid] {
        if !kvm.check_extension(cap) {
            return Err(VmmError::MissingCapability(cap));
        }
    }
    let vm = kvm.create_vm().map_err(kvm_error("creating the VM"))?;
    vm.set_tss_address(KVM_TSS_ADDR as usize).map_err(kvm_error("setting the TSS address"))?;
    vm.set_identity_map_address(KVM_IDENTITY_MAP_ADDR).map_err(kvm_error("setting the identity map address"))?;
    vm.create_irq_chip().map_err(kvm_error("creating the in-kernel irqchip"))?;
    let pit = kvm_pit_config { flags: KVM_PIT_SPEAKER_DUMMY, ..Default::default() };
    vm.create_pit2(pit).map_err(kvm_error("creating the in-kernel PIT"))?;
    let memory = create_guest_memory(memory_mib)?;
    for (slot, region) in memory.iter().enumerate() {
        let host = memory.get_host_address(region.start_addr())?;
        let region = kvm_userspace_memory_region {
            slot: slot as u32,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
            flags: 0,
        };
        // SAFETY: the range is our own mapping of guest memory, which lives
        // (in the Vmm) as long as the VM does.
        unsafe { vm.set_user_memory_region(region) }.map_err(kvm_error("registering guest memory"))?;
    }
    Ok((kvm, vm, memory))
}

/// The GDT (and an empty IDT) the boot CPU's segments come from.
pub(crate) fn write_gdt(memory: &GuestMemoryMmap, long_mode: bool) -> Result<(), VmmError> {
    for (i, entry) in regs::gdt(long_mode).iter().enumerate() {
        memory.write_obj(*entry, GuestAddress(GDT_ADDR + 8 * i as u64))?;
    }
    memory.write_obj(0u64, GuestAddress(IDT_ADDR))?;
    Ok(())
}

/// Host address ranges of the guest's RAM.
pub(crate) fn guest_ram_ranges(memory: &GuestMemoryMmap) -> Vec<(u64, u64)> {
    memory
        .iter()
        .filter_map(|r| memory.get_host_address(r.start_addr()).ok().map(|h| (h as u64, r.len())))
        .collect()
}

impl Vmm {
    /// Builds the VM: KVM objects, memory, devices, the loaded guest and its
    /// vCPUs, the boot vCPU at the kernel's entry. `start` is when the VMM
    /// started (for the time to the first guest instruction).
    pub fn new(config: VmmConfig, start: Instant) -> Result<Vmm, VmmError> {
        config.validate()?;
        let machine = config.machine;
        let (kvm, vm, memory) = create_vm(machine.memory_mib)?;
        let irqfd = |gsi: u32| -> Result<EventFd, VmmError> {
            let evt = EventFd::new(libc::EFD_NONBLOCK).map_err(io_error("creating an eventfd"))?;
            vm.register_irqfd(&evt, gsi).map_err(kvm_error("registering an irqfd"))?;
            Ok(evt)
        };

        let panicked = Arc::new(AtomicBool::new(false));
        let serial_out: Option<Box<dyn std::io::Write + Send>> = match &config.endpoints.serial_log {
            Some(path) => {
                let file = File::create(path).map_err(io_error(format!("creating the serial log {}", path.display())))?;
                Some(Box::new(BufWriter::new(file)))
            }
            None => None,
        };
        let serial = Arc::new(SerialConsole::new(irqfd(COM1_IRQ)?, ConsoleSink::new(serial_out, panicked.clone())));
        let interrupt = Interrupt::new(irqfd(VIRTIO_CONSOLE_IRQ)?);
        let console = Arc::new(MmioTransport::new(Console::new(), memory.clone(), interrupt)?);
        // The guest's queue notifies signal the event loop inside KVM: no
        // exit to a vCPU thread, which then never touches the device.
        let notify = IoEventAddress::Mmio(VIRTIO_MMIO_BASE + QUEUE_NOTIFY_OFFSET);
        for (queue, evt) in console.notifiers().map_err(io_error("cloning an eventfd"))?.iter().enumerate() {
            vm.register_ioevent(evt, &notify, queue as u32).map_err(kvm_error("registering an ioeventfd"))?;
        }
        let device = SharedDevice::new(config.device.clone())?;
        let perfbed = Arc::new(PerfbedMmio::new(device.clone()));
        let gsis = &PERFBED_GSIS[..config.device.domains.len().min(PERFBED_GSIS.len())];
        let lines = gsis.iter().map(|&gsi| irqfd(gsi)).collect::<Result<Vec<_>, _>>()?;
        device.connect_lines(Arc::new(PerfbedLines::new(lines)));
        let perfbed_ticker = device.start_ticker(PERFBED_TICK).map_err(io_error("starting the device's ticker"))?;

        let mut io_bus = Bus::new("port");
        io_bus.insert("COM1", COM1_BASE, COM1_LEN, serial.clone())?;
        let mut mmio_bus = Bus::new("MMIO");
        mmio_bus.insert("perfbed device", PERFBED_DEVICE_BASE, device.size(), perfbed.clone())?;
        mmio_bus.insert("virtio console", VIRTIO_MMIO_BASE, VIRTIO_MMIO_SIZE, console.clone())?;

        let slot = VirtioMmioSlot { base: VIRTIO_MMIO_BASE, size: VIRTIO_MMIO_SIZE, irq: VIRTIO_CONSOLE_IRQ };
        let cmdline = cmdline::build(&config.kernel.cmdline, Some((device.size(), PERFBED_DEVICE_BASE, gsis)), &[slot])?;
        let entry = boot::load(
            &memory,
            machine.memory_mib,
            machine.vcpus,
            &config.kernel.path,
            config.kernel.initramfs.as_deref(),
            &cmdline,
        )?;
        write_gdt(&memory, matches!(entry, BootEntry::Linux64 { .. }))?;

        let supported = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).map_err(kvm_error("reading supported CPUID"))?;
        let vcpus = (0..machine.vcpus)
            .map(|index| Vcpu::new(&vm, &supported, index, machine.vcpus, machine.hide_xsave))
            .collect::<Result<Vec<_>, _>>()?;
        vcpus[0].set_boot_state(&entry)?;

        Ok(Vmm {
            config,
            memory,
            vcpus,
            io_bus: Arc::new(io_bus),
            mmio_bus: Arc::new(mmio_bus),
            serial,
            panicked,
            console,
            device,
            perfbed,
            _perfbed_ticker: perfbed_ticker,
            stats: Arc::new(Stats::new(start)),
            _vm: vm,
            _kvm: kvm,
        })
    }

    /// Serves the control socket, waits for the agent socket's client (if
    /// any), runs the vCPUs and the event loop until the guest resets.
    /// The vCPU threads are left blocked in the guest: the caller exits the
    /// process, which ends them.
    pub fn run(self) -> Result<GuestEnd, VmmError> {
        let _control = match &self.config.endpoints.control_socket {
            Some(path) => Some(
                self.device
                    .serve_control(path)
                    .map_err(io_error(format!("serving the control socket {}", path.display())))?,
            ),
            None => None,
        };
        let mut events: EventManager<Arc<dyn EventSubscriber + Send + Sync>> =
            EventManager::new().map_err(|e| VmmError::EventLoop(format!("{e:?}")))?;
        let stream = match &self.config.endpoints.agent_socket {
            Some(path) => {
                eprintln!("perfbed-vmm: waiting for a client on the agent socket {}", path.display());
                Some(accept_one(path).map_err(io_error(format!("accepting on the agent socket {}", path.display())))?)
            }
            None => None,
        };
        let channel =
            AgentChannel::new(stream, self.console.clone()).map_err(io_error("joining the agent socket to the console"))?;
        events.add_subscriber(Arc::new(channel));

        let on_panic = (
            self.serial.clone(),
            self.stats.clone(),
            self.io_bus.clone(),
            self.mmio_bus.clone(),
            self.perfbed.clone(),
            self.console.clone(),
            self.memory.clone(),
        );
        crate::panic_report::install(Arc::new(move || {
            let (serial, stats, io, mmio, perfbed, console, memory) = &on_panic;
            serial.flush();
            report(stats, io, mmio, perfbed, console, memory);
        }));

        let ended: Arc<Mutex<Option<VcpuEnd>>> = Arc::new(Mutex::new(None));
        let ended_evt = EventFd::new(libc::EFD_NONBLOCK).map_err(io_error("creating an eventfd"))?;
        events.add_subscriber(Arc::new(EndNotice(ended_evt.try_clone().map_err(io_error("cloning an eventfd"))?)));
        for vcpu in self.vcpus {
            let (io, mmio, stats) = (self.io_bus.clone(), self.mmio_bus.clone(), self.stats.clone());
            let (ended, evt) = (ended.clone(), ended_evt.try_clone().map_err(io_error("cloning an eventfd"))?);
            thread::Builder::new()
                .name(format!("vcpu{}", vcpu.index()))
                .spawn(move || {
                    let end = vcpu.run(io, mmio, stats);
                    ended.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(end);
                    let _ = evt.write(1);
                })
                .map_err(io_error("starting a vCPU thread"))?;
        }

        let end = loop {
            events.run_with_timeout(500).map_err(|e| VmmError::EventLoop(format!("{e:?}")))?;
            if let Some(end) = ended.lock().unwrap_or_else(|p| p.into_inner()).take() {
                break end;
            }
        };
        self.serial.flush();
        report(&self.stats, &self.io_bus, &self.mmio_bus, &self.perfbed, &self.console, &self.memory);
        match end {
            VcpuEnd::Reset if self.panicked.load(Ordering::SeqCst) => Ok(GuestEnd::Panicked),
            VcpuEnd::Reset => Ok(GuestEnd::Reset),
            VcpuEnd::Failed(why) => Err(VmmError::VcpuFailed(why)),
        }
    }
}

/// Wakes the event loop when a vCPU has ended the run.
struct EndNotice(EventFd);

impl EventSubscriber for EndNotice {
    fn init(&self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.0, EventSet::IN)) {
            eprintln!("perfbed-vmm: watching for the end of the run: {e:?}");
        }
    }

    fn process(&self, _events: Events, _ops: &mut EventOps) {
        let _ = self.0.read();
    }
}

/// The run's figures, one `perfbed-vmm: stat key=value` line each.
fn report(
    stats: &Stats,
    io: &Bus,
    mmio: &Bus,
    perfbed: &PerfbedMmio,
    console: &MmioTransport<Console>,
    memory: &GuestMemoryMmap,
) {
    let (first_run, first_exit) = stats.boot_times();
    let (accesses, handler_ns) = perfbed.handler_time();
    let dropped = console.with_device(|c| c.dropped_output());
    let mut lines = vec![
        format!("start_to_first_kvm_run_us={}", first_run / 1000),
        format!("start_to_first_exit_us={}", first_exit / 1000),
        format!("io_exits={}", stats.io_exits.load(Ordering::Relaxed)),
        format!("mmio_exits={}", stats.mmio_exits.load(Ordering::Relaxed)),
        format!("unhandled_port_accesses={}", io.unknown_accesses()),
        format!("unhandled_mmio_accesses={}", mmio.unknown_accesses()),
        format!("device_accesses={accesses}"),
        format!("device_handler_mean_ns={}", handler_ns.checked_div(accesses).unwrap_or(0)),
        format!("console_output_dropped_bytes={dropped}"),
    ];
    for (bus, kind) in [(io, "port"), (mmio, "mmio")] {
        for (addr, count) in bus.top_unknown(3) {
            lines.push(format!("unhandled_{kind}_{addr:#x}={count}"));
        }
    }
    if let Some(rss) = rss_beyond(&guest_ram_ranges(memory)) {
        lines.push(format!("rss_beyond_guest_ram_kib={}", rss / 1024));
    }
    for line in lines {
        eprintln!("perfbed-vmm: stat {line}");
    }
}
