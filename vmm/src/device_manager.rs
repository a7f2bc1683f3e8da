//! The device manager: owns the port and MMIO buses and the devices on
//! them, from the build to the end of the run; hands devices their MMIO
//! ranges and GSIs, and writes the kernel command line's announcements of
//! what it placed (the guest has no ACPI or device tree to find them).
//!
//! While the VM runs, the vCPUs dispatch through its buses (shared
//! read-only: a lookup takes no lock), the event loop drains what the
//! devices left for the host ([`DeviceManager::drain`]), and the exit
//! report reads their figures ([`DeviceManager::figures`]). A device added
//! once the vCPUs hold the buses is refused ([`DeviceManagerError::Running`]):
//! hotplugging a device needs a bus whose table can be swapped under them.
//!
//! It knows nothing of KVM, like the devices: the builder
//! ([`crate::builder`]) asks it for a range and a GSI, wires the GSI's irqfd
//! and the notify ioeventfds into KVM itself, then attaches the device here.
//! That keeps the whole placement policy testable without `/dev/kvm`.
//!
//! The layout it places into (see [`crate::memory`]) is the QEMU host's, so
//! that the guest sees one machine on either host: the monitoring device at
//! the start of the platform window (0xfe00_0000) with its domains' lines
//! pinned at [`PERFBED_GSIS`], the virtio-mmio transports packed in 0x200
//! slots from 0xfeb0_0000 on the lowest free GSIs (5 first, as Firecracker
//! and QEMU's microvm).
//!
//! The buses are perfbed's own [`Bus`] rather than vm-device's: every
//! access must carry the vCPU index (the monitoring device's placement
//! checks need it), which vm-device's traits do not.

use std::sync::Arc;

use linux_loader::cmdline::Cmdline;

use crate::allocator::{AllocationError, GsiAllocator, MmioWindow};
use crate::boot::cmdline::{self, CmdlineError, VirtioMmioSlot};
use crate::boot::mptable::IOAPIC_PINS;
use crate::devices::access_record::AccessRecord;
use crate::devices::bus::{Bus, BusDevice, BusError};
use crate::devices::perfbed::PerfbedMmio;
use crate::devices::power_off::{PowerOff, POWER_OFF_SIZE};
use crate::devices::serial::{SerialConsole, COM1_BASE, COM1_LEN};
use crate::devices::virtio::console::Console;
use crate::devices::virtio::mmio::MmioTransport;
use crate::memory::{PERFBED_DEVICE_BASE, VIRTIO_MMIO_BASE, VIRTIO_MMIO_SIZE};

/// The monitoring device's interrupt lines, domain `d`'s on
/// `PERFBED_GSIS[d]`: the GSIs the QEMU host gives it (xtask's
/// `host::config::DEVICE_GSIS`). Domains beyond have no line; the driver
/// polls them.
pub const PERFBED_GSIS: [u32; 3] = [13, 14, 15];
/// The first GSI devices are given: below it are the legacy lines (timer,
/// keyboard, cascade, COM2, COM1).
pub const FIRST_DEVICE_GSI: u32 = 5;

/// Why a device could not be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceManagerError {
    #[error("placing {device}: {source}")]
    Allocation {
        device: &'static str,
        #[source]
        source: AllocationError,
    },
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error("a second monitoring device ({0}); the guest's driver takes one")]
    SecondMonitoringDevice(&'static str),
    #[error("{0} placed before the monitoring device, which must be first in its window")]
    BeforeMonitoringDevice(&'static str),
    #[error("adding {0} while the vCPUs run: the buses cannot change under them yet")]
    Running(&'static str),
}

/// The monitoring device as placed: where and on which lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitoringPlacement {
    pub base: u64,
    pub size: u64,
    /// One GSI per domain that has a line, domain order.
    pub gsis: Vec<u32>,
}

/// The buses and what sits on them.
pub struct DeviceManager {
    io_bus: Arc<Bus>,
    mmio_bus: Arc<Bus>,
    platform: MmioWindow,
    virtio: MmioWindow,
    gsis: GsiAllocator,
    monitoring: Option<MonitoringPlacement>,
    virtio_slots: Vec<VirtioMmioSlot>,
    /// The agent's power-off register's address, announced on the command
    /// line.
    power_off: Option<u64>,
    /// The devices the host side talks to besides dispatching to them.
    serial: Option<Arc<SerialConsole>>,
    console: Option<Arc<MmioTransport<Console>>>,
    perfbed: Option<Arc<PerfbedMmio>>,
    power_off_register: Option<Arc<PowerOff>>,
}

impl Default for DeviceManager {
    fn default() -> Self {
        DeviceManager::new()
    }
}

impl DeviceManager {
    /// Empty buses over perfbed's layout.
    pub fn new() -> DeviceManager {
        DeviceManager {
            io_bus: Arc::new(Bus::new("port")),
            mmio_bus: Arc::new(Bus::new("MMIO")),
            platform: MmioWindow::new(
                "platform device",
                PERFBED_DEVICE_BASE,
                VIRTIO_MMIO_BASE,
                0x1000,
            ),
            virtio: MmioWindow::new(
                "virtio-mmio",
                VIRTIO_MMIO_BASE,
                crate::memory::IOAPIC_ADDR,
                VIRTIO_MMIO_SIZE,
            ),
            gsis: GsiAllocator::new(FIRST_DEVICE_GSI, u32::from(IOAPIC_PINS) - 1, &[]),
            monitoring: None,
            virtio_slots: Vec::new(),
            power_off: None,
            serial: None,
            console: None,
            perfbed: None,
            power_off_register: None,
        }
    }

    /// A bus to insert into: only before the vCPUs hold it.
    fn bus_mut<'a>(
        bus: &'a mut Arc<Bus>,
        name: &'static str,
    ) -> Result<&'a mut Bus, DeviceManagerError> {
        Arc::get_mut(bus).ok_or(DeviceManagerError::Running(name))
    }

    /// A legacy port device at its architectural address (COM1 at 0x3f8).
    pub fn add_legacy_port(
        &mut self,
        name: &'static str,
        base: u64,
        len: u64,
        device: Arc<dyn BusDevice>,
    ) -> Result<(), DeviceManagerError> {
        Ok(Self::bus_mut(&mut self.io_bus, name)?.insert(name, base, len, device)?)
    }

    /// COM1, the serial console.
    pub fn add_serial(&mut self, serial: Arc<SerialConsole>) -> Result<(), DeviceManagerError> {
        self.add_legacy_port("COM1", COM1_BASE, COM1_LEN, serial.clone())?;
        self.serial = Some(serial);
        Ok(())
    }

    /// The agent's power-off register: a page of the platform window after
    /// the monitoring device (which must be placed first: it sits at the
    /// window's start on both hosts), announced to the agent on the kernel
    /// command line. Returns its address.
    pub fn add_power_off(&mut self, device: Arc<PowerOff>) -> Result<u64, DeviceManagerError> {
        const NAME: &str = "the power-off register";
        if self.monitoring.is_none() {
            return Err(DeviceManagerError::BeforeMonitoringDevice(NAME));
        }
        let bus = Self::bus_mut(&mut self.mmio_bus, NAME)?;
        let base = self.platform.allocate(POWER_OFF_SIZE).map_err(|source| {
            DeviceManagerError::Allocation {
                device: NAME,
                source,
            }
        })?;
        bus.insert("power-off", base, POWER_OFF_SIZE, device.clone())?;
        self.power_off = Some(base);
        self.power_off_register = Some(device);
        Ok(base)
    }

    /// Places the monitoring device of `size` bytes with a line for each of
    /// its first `domains` domains (as many as have a pinned GSI). Returns
    /// its placement, for the builder to wire the lines.
    pub fn reserve_monitoring_device(
        &mut self,
        size: u64,
        domains: usize,
    ) -> Result<MonitoringPlacement, DeviceManagerError> {
        const NAME: &str = "the monitoring device";
        if self.monitoring.is_some() {
            return Err(DeviceManagerError::SecondMonitoringDevice(NAME));
        }
        let placing = |source| DeviceManagerError::Allocation {
            device: NAME,
            source,
        };
        let base = self.platform.allocate(size).map_err(placing)?;
        let gsis = PERFBED_GSIS[..domains.min(PERFBED_GSIS.len())]
            .iter()
            .map(|&gsi| self.gsis.pin(gsi))
            .collect::<Result<Vec<_>, _>>()
            .map_err(placing)?;
        let placement = MonitoringPlacement { base, size, gsis };
        self.monitoring = Some(placement.clone());
        Ok(placement)
    }

    /// Puts the monitoring device at the range [`Self::reserve_monitoring_device`]
    /// gave it.
    pub fn attach_monitoring_device(
        &mut self,
        device: Arc<PerfbedMmio>,
    ) -> Result<(), DeviceManagerError> {
        self.place_monitoring_device(device.clone())?;
        self.perfbed = Some(device);
        Ok(())
    }

    fn place_monitoring_device(
        &mut self,
        device: Arc<dyn BusDevice>,
    ) -> Result<(), DeviceManagerError> {
        let Some(placement) = &self.monitoring else {
            return Err(DeviceManagerError::Allocation {
                device: "the monitoring device",
                source: AllocationError::EmptyRange {
                    window: "platform device",
                },
            });
        };
        let (base, size) = (placement.base, placement.size);
        let bus = Self::bus_mut(&mut self.mmio_bus, "the monitoring device")?;
        Ok(bus.insert("perfbed device", base, size, device)?)
    }

    /// The next virtio-mmio slot and a GSI for it.
    pub fn reserve_virtio_slot(
        &mut self,
        device: &'static str,
    ) -> Result<VirtioMmioSlot, DeviceManagerError> {
        let placing = |source| DeviceManagerError::Allocation { device, source };
        let base = self.virtio.allocate(VIRTIO_MMIO_SIZE).map_err(placing)?;
        let irq = self.gsis.allocate().map_err(placing)?;
        Ok(VirtioMmioSlot {
            base,
            size: VIRTIO_MMIO_SIZE,
            irq,
        })
    }

    /// Puts a virtio-mmio transport in `slot` and announces it.
    pub fn attach_virtio(
        &mut self,
        name: &'static str,
        slot: VirtioMmioSlot,
        transport: Arc<dyn BusDevice>,
    ) -> Result<(), DeviceManagerError> {
        Self::bus_mut(&mut self.mmio_bus, name)?.insert(name, slot.base, slot.size, transport)?;
        self.virtio_slots.push(slot);
        Ok(())
    }

    /// The virtio console (the agent channel) in `slot`.
    pub fn attach_console(
        &mut self,
        name: &'static str,
        slot: VirtioMmioSlot,
        console: Arc<MmioTransport<Console>>,
    ) -> Result<(), DeviceManagerError> {
        self.attach_virtio(name, slot, console.clone())?;
        self.console = Some(console);
        Ok(())
    }

    /// The kernel command line: `user`, then every device placed.
    pub fn kernel_cmdline(&self, user: &str) -> Result<Cmdline, CmdlineError> {
        let monitoring = self
            .monitoring
            .as_ref()
            .map(|m| (m.size, m.base, m.gsis.as_slice()));
        let user = match self.power_off {
            Some(base) => format!("{user} {}{base:#x}", perfbed_agent::POWER_OFF_PARAM),
            None => user.to_string(),
        };
        cmdline::build(&user, monitoring, &self.virtio_slots)
    }

    /// Keeps each bus's first `capacity` accesses for [`Self::recorded_accesses`].
    pub fn record_accesses(&mut self, capacity: usize) -> Result<(), DeviceManagerError> {
        for bus in [&mut self.io_bus, &mut self.mmio_bus] {
            Self::bus_mut(bus, "an access record")?
                .record_into(Arc::new(AccessRecord::new(capacity)));
        }
        Ok(())
    }

    /// The recorded accesses, `port ...` lines then `mmio ...` lines (see
    /// [`AccessRecord::lines`]).
    pub fn recorded_accesses(&self) -> Vec<String> {
        [(&self.io_bus, "port"), (&self.mmio_bus, "mmio")]
            .iter()
            .filter_map(|(bus, kind)| Some(bus.record()?.lines(kind)))
            .flatten()
            .collect()
    }

    /// The port bus, for the vCPUs to dispatch to.
    pub fn io_bus(&self) -> &Arc<Bus> {
        &self.io_bus
    }

    /// The MMIO bus, for the vCPUs to dispatch to.
    pub fn mmio_bus(&self) -> &Arc<Bus> {
        &self.mmio_bus
    }

    pub fn serial(&self) -> Option<&Arc<SerialConsole>> {
        self.serial.as_ref()
    }

    pub fn console(&self) -> Option<&Arc<MmioTransport<Console>>> {
        self.console.as_ref()
    }

    /// Whether the agent wrote its power-off register.
    pub fn powered_off(&self) -> bool {
        self.power_off_register
            .as_ref()
            .is_some_and(|r| r.requested())
    }

    /// The event loop's turn: what the vCPUs left for the host (serial
    /// output, the first accesses to an unhandled address) goes out.
    pub fn drain(&self) {
        if let Some(serial) = &self.serial {
            serial.drain();
        }
        self.io_bus.log_new_unknown();
        self.mmio_bus.log_new_unknown();
    }

    /// At the run's end: the serial log written out whole.
    pub fn flush(&self) {
        if let Some(serial) = &self.serial {
            serial.flush();
        }
    }

    /// The devices' part of the exit report, `key=value` each.
    pub fn figures(&self) -> Vec<String> {
        let (accesses, handler_ns) = self.perfbed.as_ref().map_or((0, 0), |p| p.handler_time());
        let dropped = self
            .console
            .as_ref()
            .map_or(0, |c| c.with_device(|c| c.dropped_output()));
        let (serial_written, serial_dropped) = self
            .serial
            .as_ref()
            .map_or((0, 0), |s| (s.output_bytes(), s.dropped_output()));
        let mut lines = vec![
            format!("unhandled_port_accesses={}", self.io_bus.unknown_accesses()),
            format!(
                "unhandled_mmio_accesses={}",
                self.mmio_bus.unknown_accesses()
            ),
            format!("device_accesses={accesses}"),
            format!(
                "device_handler_mean_ns={}",
                handler_ns.checked_div(accesses).unwrap_or(0)
            ),
            format!("console_output_dropped_bytes={dropped}"),
            format!("serial_output_bytes={serial_written}"),
            format!("serial_output_dropped_bytes={serial_dropped}"),
        ];
        for (bus, kind) in [(&self.io_bus, "port"), (&self.mmio_bus, "mmio")] {
            for (addr, count) in bus.top_unknown(3) {
                lines.push(format!("unhandled_{kind}_{addr:#x}={count}"));
            }
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo;
    impl BusDevice for Echo {
        fn read(&self, _vcpu: u32, offset: u64, data: &mut [u8]) {
            data.fill((offset as u8).wrapping_add(1));
        }
        fn write(&self, _vcpu: u32, _offset: u64, _data: &[u8]) {}
    }

    fn text(c: &Cmdline) -> String {
        c.as_cstring().unwrap().into_string().unwrap()
    }

    #[test]
    fn the_machine_is_the_qemu_hosts() {
        let mut dm = DeviceManager::new();
        dm.add_legacy_port("COM1", 0x3f8, 8, Arc::new(Echo))
            .unwrap();
        let slot = dm.reserve_virtio_slot("virtio console").unwrap();
        assert_eq!(
            slot,
            VirtioMmioSlot {
                base: 0xfeb0_0000,
                size: 0x200,
                irq: 5
            }
        );
        dm.attach_virtio("virtio console", slot, Arc::new(Echo))
            .unwrap();
        let placement = dm.reserve_monitoring_device(0x3000, 2).unwrap();
        assert_eq!(
            placement,
            MonitoringPlacement {
                base: 0xfe00_0000,
                size: 0x3000,
                gsis: vec![13, 14]
            }
        );
        dm.place_monitoring_device(Arc::new(Echo)).unwrap();
        assert_eq!(
            text(&dm.kernel_cmdline("console=ttyS0").unwrap()),
            "console=ttyS0 perfbed.device=0x3000@0xfe000000:13,14 virtio_mmio.device=512@0xfeb00000:5"
        );
        let (io, mmio) = (dm.io_bus(), dm.mmio_bus());
        let mut byte = [0u8];
        io.read(0, 0x3f9, &mut byte);
        assert_eq!(byte, [2]);
        mmio.read(0, 0xfe00_2ffe, &mut byte);
        assert_eq!(byte, [0xff]);
        mmio.read(0, 0xfe00_3000, &mut byte);
        assert_eq!(mmio.unknown_accesses(), 1, "the device ends at its size");
        mmio.read(0, 0xfeb0_0001, &mut byte);
        assert_eq!(byte, [2]);
    }

    #[test]
    fn more_virtio_slots_get_their_own_range_and_line_and_skip_pinned_lines() {
        let mut dm = DeviceManager::new();
        dm.reserve_monitoring_device(0x1000, 8).unwrap();
        let slots: Vec<_> = (0..12)
            .map(|_| dm.reserve_virtio_slot("v").unwrap())
            .collect();
        assert_eq!(slots[1].base, 0xfeb0_0200);
        let irqs: Vec<u32> = slots.iter().map(|s| s.irq).collect();
        assert_eq!(irqs, [5, 6, 7, 8, 9, 10, 11, 12, 16, 17, 18, 19]);
        // 24 pins: 5..=23 minus the three pinned leaves 16 lines.
        for _ in 0..4 {
            dm.reserve_virtio_slot("v").unwrap();
        }
        assert!(matches!(
            dm.reserve_virtio_slot("last"),
            Err(DeviceManagerError::Allocation {
                device: "last",
                source: AllocationError::NoFreeGsi { .. }
            })
        ));
    }

    #[test]
    fn a_device_too_large_or_doubled_is_refused() {
        let mut dm = DeviceManager::new();
        let room = VIRTIO_MMIO_BASE - PERFBED_DEVICE_BASE;
        assert!(matches!(
            dm.reserve_monitoring_device(room + 1, 1),
            Err(DeviceManagerError::Allocation {
                source: AllocationError::WindowFull { .. },
                ..
            })
        ));
        let mut dm = DeviceManager::new();
        assert!(
            dm.place_monitoring_device(Arc::new(Echo)).is_err(),
            "attached before placed"
        );
        dm.reserve_monitoring_device(room, 1).unwrap();
        assert!(matches!(
            dm.reserve_monitoring_device(0x1000, 1),
            Err(DeviceManagerError::SecondMonitoringDevice(_))
        ));
    }

    #[test]
    fn the_power_off_register_follows_the_monitoring_device_and_is_announced_to_the_agent() {
        let mut dm = DeviceManager::new();
        let register = Arc::new(PowerOff::default());
        assert!(matches!(
            dm.add_power_off(register.clone()),
            Err(DeviceManagerError::BeforeMonitoringDevice(_))
        ));
        assert_eq!(
            text(&dm.kernel_cmdline("console=ttyS0").unwrap()),
            "console=ttyS0",
            "none announced before"
        );
        dm.reserve_monitoring_device(0x3000, 1).unwrap();
        dm.place_monitoring_device(Arc::new(Echo)).unwrap();
        let base = dm.add_power_off(register.clone()).unwrap();
        assert_eq!(base, 0xfe00_3000, "the page after the monitoring device");
        let cmdline = text(&dm.kernel_cmdline("console=ttyS0").unwrap());
        assert_eq!(
            perfbed_agent::power_off_address(&cmdline),
            Some(base),
            "{cmdline}"
        );
        assert!(
            cmdline.contains("perfbed.device=0x3000@0xfe000000"),
            "{cmdline}"
        );
        assert!(!dm.powered_off());
        dm.mmio_bus().write(0, base, &[0; 8]);
        assert!(register.requested() && dm.powered_off());
        assert_eq!(dm.mmio_bus().unknown_accesses(), 0);
    }

    #[test]
    fn the_devices_stay_while_the_vcpus_hold_the_buses_and_none_is_added_under_them() {
        let mut dm = DeviceManager::new();
        dm.add_legacy_port("COM1", 0x3f8, 8, Arc::new(Echo))
            .unwrap();
        let vcpu_io = dm.io_bus().clone();
        let vcpu_mmio = dm.mmio_bus().clone();
        assert_eq!(
            dm.add_legacy_port("COM2", 0x2f8, 8, Arc::new(Echo)),
            Err(DeviceManagerError::Running("COM2"))
        );
        let slot = dm.reserve_virtio_slot("late").unwrap();
        assert_eq!(
            dm.attach_virtio("late", slot, Arc::new(Echo)),
            Err(DeviceManagerError::Running("late"))
        );
        assert!(
            !text(&dm.kernel_cmdline("").unwrap()).contains("virtio_mmio"),
            "a device refused is not announced"
        );
        let mut byte = [0u8];
        vcpu_io.read(0, 0x3f8, &mut byte);
        assert_eq!(
            byte,
            [1],
            "the vCPUs' bus still reaches the manager's device"
        );
        vcpu_mmio.read(0, 0xfeb0_0000, &mut byte);
        assert_eq!(
            dm.mmio_bus().unknown_accesses(),
            1,
            "one bus, seen from both sides"
        );
        assert!(dm
            .figures()
            .contains(&"unhandled_mmio_accesses=1".to_string()));
        drop((vcpu_io, vcpu_mmio));
        dm.add_legacy_port("COM2", 0x2f8, 8, Arc::new(Echo))
            .unwrap();
    }
}
