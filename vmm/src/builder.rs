//! [`VmmBuilder`]: assembles a [`Vmm`] from a [`VmmConfig`], step by step,
//! as vmm-reference and Firecracker's builder do: KVM and memory, the
//! devices through the [`DeviceManager`] (which places them; the builder
//! wires their interrupts and notifies into KVM), the guest image, the
//! vCPUs.

use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use kvm_bindings::{
    kvm_pit_config, kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Cap, IoEventAddress, Kvm, VmFd};
use perfbed_device::cpus::format_cpu_list;
use perfbed_device::{l3_topology, SharedDevice};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::boot::{self, BootEntry};
use crate::config::VmmConfig;
use crate::device_manager::DeviceManager;
use crate::devices::perfbed::{PerfbedLines, PerfbedMmio};
use crate::devices::power_off::PowerOff;
use crate::devices::serial::{SerialConsole, COM1_IRQ, OUTPUT_RING};
use crate::devices::virtio::console::Console;
use crate::devices::virtio::mmio::{MmioTransport, QUEUE_NOTIFY_OFFSET};
use crate::devices::virtio::Interrupt;
use crate::memory::{create_guest_memory, GDT_ADDR, IDT_ADDR, KVM_IDENTITY_MAP_ADDR, KVM_TSS_ADDR};
use crate::stats::Stats;
use crate::vcpu::cpuid::Placement;
use crate::vcpu::{regs, Vcpu};
use crate::vmm::{io_error, kvm_error, Vmm, VmmError};

/// How often the device's ticker lets time pass while an overflow
/// interrupt is enabled.
const PERFBED_TICK: std::time::Duration = std::time::Duration::from_millis(2);

/// Builds a [`Vmm`].
pub struct VmmBuilder {
    config: VmmConfig,
    start: Instant,
}

impl VmmBuilder {
    /// A builder for `config`; `start` is when the VMM started (for the
    /// time to the first guest instruction).
    pub fn new(config: VmmConfig, start: Instant) -> VmmBuilder {
        VmmBuilder { config, start }
    }

    /// Checks the configuration, then builds the VM: KVM objects, memory,
    /// devices, the loaded guest and its vCPUs, the boot vCPU at the
    /// kernel's entry.
    pub fn build(self) -> Result<Vmm, VmmError> {
        let VmmBuilder { config, start } = self;
        config.validate()?;
        let machine = config.machine;
        let (kvm, vm, memory) = create_vm(machine.memory_mib)?;
        let mut devices = DeviceManager::new();
        if config.endpoints.record_accesses > 0 {
            devices.record_accesses(config.endpoints.record_accesses)?;
        }

        let panicked = Arc::new(AtomicBool::new(false));
        attach_serial(&vm, &mut devices, &config, panicked.clone())?;
        attach_console(&vm, &mut devices, &memory)?;
        let device = SharedDevice::new(config.device.clone())?;
        let placement =
            devices.reserve_monitoring_device(device.size(), config.device.domains.len())?;
        let lines = placement
            .gsis
            .iter()
            .map(|&gsi| irqfd(&vm, gsi))
            .collect::<Result<Vec<_>, _>>()?;
        device.connect_lines(Arc::new(PerfbedLines::new(lines)));
        devices.attach_monitoring_device(Arc::new(PerfbedMmio::new(device.clone())))?;
        devices.add_power_off(Arc::new(PowerOff::default()))?;
        let perfbed_ticker = device
            .start_ticker(PERFBED_TICK)
            .map_err(io_error("starting the device's ticker"))?;

        let cmdline = devices.kernel_cmdline(&config.kernel.cmdline)?;
        let entry = boot::load(
            &memory,
            machine.memory_mib,
            machine.vcpus,
            &config.kernel.path,
            config.kernel.initramfs.as_deref(),
            &cmdline,
        )?;
        write_gdt(&memory, matches!(entry, BootEntry::Linux64 { .. }))?;

        let supported = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(kvm_error("reading supported CPUID"))?;
        // Each domain one die and one L3 (see vcpu::cpuid), when they can be.
        let cpus = u32::from(machine.vcpus);
        let llc_bits = l3_topology::l3_sharing_bits(cpus, &config.device.domains);
        for (domain, l3) in l3_topology::mismatches(cpus, &config.device.domains) {
            log::warn!(
                "domain {domain} ({}) is not an aligned power-of-two block of CPUs: its CPUs' L3 in the guest is {}",
                format_cpu_list(&config.device.domains[domain]),
                format_cpu_list(&l3)
            );
        }
        let vcpus = (0..machine.vcpus)
            .map(|index| {
                let placement = Placement {
                    index,
                    vcpus: machine.vcpus,
                    llc_bits,
                };
                Vcpu::new(&vm, &supported, placement, machine.hide_xsave)
            })
            .collect::<Result<Vec<_>, _>>()?;
        vcpus[0].set_boot_state(&entry)?;

        Ok(Vmm {
            config,
            memory,
            vcpus,
            devices,
            panicked,
            device,
            _perfbed_ticker: perfbed_ticker,
            stats: Arc::new(Stats::new(start)),
            _vm: vm,
            _kvm: kvm,
        })
    }
}

/// An eventfd that raises `gsi` through KVM's irqfd.
fn irqfd(vm: &VmFd, gsi: u32) -> Result<EventFd, VmmError> {
    let evt = EventFd::new(libc::EFD_NONBLOCK).map_err(io_error("creating an eventfd"))?;
    vm.register_irqfd(&evt, gsi)
        .map_err(kvm_error("registering an irqfd"))?;
    Ok(evt)
}

/// COM1, its output to the serial log (if any).
fn attach_serial(
    vm: &VmFd,
    devices: &mut DeviceManager,
    config: &VmmConfig,
    panicked: Arc<AtomicBool>,
) -> Result<(), VmmError> {
    let out: Option<Box<dyn std::io::Write + Send>> = match &config.endpoints.serial_log {
        Some(path) => {
            // Non-blocking: the event loop writes it and must never wait
            // in it (in the box it is a virtio-serial port the host may
            // stop reading); the console keeps what it does not take.
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(path)
                .map_err(io_error(format!(
                    "creating the serial log {}",
                    path.display()
                )))?;
            Some(Box::new(file))
        }
        None => None,
    };
    let ring = config.endpoints.serial_ring.unwrap_or(OUTPUT_RING);
    let serial = SerialConsole::new(irqfd(vm, COM1_IRQ)?, out, panicked, ring)
        .map_err(io_error("creating the serial log's eventfd"))?;
    devices.add_serial(Arc::new(serial))?;
    Ok(())
}

/// The virtio console in the next virtio-mmio slot, its queue notifies on
/// ioeventfds: the guest's notify signals the event loop inside KVM, with
/// no exit to a vCPU thread, which then never touches the device.
fn attach_console(
    vm: &VmFd,
    devices: &mut DeviceManager,
    memory: &GuestMemoryMmap,
) -> Result<(), VmmError> {
    const NAME: &str = "virtio console";
    let slot = devices.reserve_virtio_slot(NAME)?;
    let interrupt = Interrupt::new(irqfd(vm, slot.irq)?);
    let console = Arc::new(MmioTransport::new(
        Console::new(),
        memory.clone(),
        interrupt,
    )?);
    let notify = IoEventAddress::Mmio(slot.base + QUEUE_NOTIFY_OFFSET);
    for (queue, evt) in console
        .notifiers()
        .map_err(io_error("cloning an eventfd"))?
        .iter()
        .enumerate()
    {
        vm.register_ioevent(evt, &notify, queue as u32)
            .map_err(kvm_error("registering an ioeventfd"))?;
    }
    devices.attach_console(NAME, slot, console)?;
    Ok(())
}

/// KVM, a VM with the in-kernel irqchip and PIT, and `memory_mib` of RAM.
pub(crate) fn create_vm(memory_mib: u32) -> Result<(Kvm, VmFd, GuestMemoryMmap), VmmError> {
    let kvm = Kvm::new().map_err(kvm_error("opening /dev/kvm"))?;
    for cap in [
        Cap::Irqchip,
        Cap::Pit2,
        Cap::UserMemory,
        Cap::Irqfd,
        Cap::Ioeventfd,
        Cap::ExtCpuid,
    ] {
        if !kvm.check_extension(cap) {
            return Err(VmmError::MissingCapability(cap));
        }
    }
    let vm = kvm.create_vm().map_err(kvm_error("creating the VM"))?;
    vm.set_tss_address(KVM_TSS_ADDR as usize)
        .map_err(kvm_error("setting the TSS address"))?;
    vm.set_identity_map_address(KVM_IDENTITY_MAP_ADDR)
        .map_err(kvm_error("setting the identity map address"))?;
    vm.create_irq_chip()
        .map_err(kvm_error("creating the in-kernel irqchip"))?;
    let pit = kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    vm.create_pit2(pit)
        .map_err(kvm_error("creating the in-kernel PIT"))?;
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
        unsafe { vm.set_user_memory_region(region) }
            .map_err(kvm_error("registering guest memory"))?;
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
