//! The device manager: owns the port and MMIO buses, hands devices their
//! MMIO ranges and GSIs, and writes the kernel command line's announcements
//! of what it placed (the guest has no ACPI or device tree to find them).
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
use crate::devices::bus::{Bus, BusDevice, BusError};
use crate::devices::power_off::{PowerOff, POWER_OFF_SIZE};
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
    io_bus: Bus,
    mmio_bus: Bus,
    platform: MmioWindow,
    virtio: MmioWindow,
    gsis: GsiAllocator,
    monitoring: Option<MonitoringPlacement>,
    virtio_slots: Vec<VirtioMmioSlot>,
    /// The agent's power-off register's address, announced on the command
    /// line.
    power_off: Option<u64>,
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
            io_bus: Bus::new("port"),
            mmio_bus: Bus::new("MMIO"),
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
        }
    }

    /// A legacy port device at its architectural address (COM1 at 0x3f8).
    pub fn add_legacy_port(
        &mut self,
        name: &'static str,
        base: u64,
        len: u64,
        device: Arc<dyn BusDevice>,
    ) -> Result<(), DeviceManagerError> {
        Ok(self.io_bus.insert(name, base, len, device)?)
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
        let base = self
            .platform
            .allocate(POWER_OFF_SIZE)
            .map_err(|source| DeviceManagerError::Allocation { device: NAME, source })?;
        self.mmio_bus.insert("power-off", base, POWER_OFF_SIZE, device)?;
        self.power_off = Some(base);
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
        Ok(self
            .mmio_bus
            .insert("perfbed device", placement.base, placement.size, device)?)
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
        self.mmio_bus
            .insert(name, slot.base, slot.size, transport)?;
        self.virtio_slots.push(slot);
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

    /// The buses, for the vCPUs to dispatch to.
    pub fn into_buses(self) -> (Bus, Bus) {
        (self.io_bus, self.mmio_bus)
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
        dm.attach_monitoring_device(Arc::new(Echo)).unwrap();
        assert_eq!(
            text(&dm.kernel_cmdline("console=ttyS0").unwrap()),
            "console=ttyS0 perfbed.device=0x3000@0xfe000000:13,14 virtio_mmio.device=512@0xfeb00000:5"
        );
        let (io, mmio) = dm.into_buses();
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
            dm.attach_monitoring_device(Arc::new(Echo)).is_err(),
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
        assert_eq!(text(&dm.kernel_cmdline("console=ttyS0").unwrap()), "console=ttyS0", "none announced before");
        dm.reserve_monitoring_device(0x3000, 1).unwrap();
        dm.attach_monitoring_device(Arc::new(Echo)).unwrap();
        let base = dm.add_power_off(register.clone()).unwrap();
        assert_eq!(base, 0xfe00_3000, "the page after the monitoring device");
        let cmdline = text(&dm.kernel_cmdline("console=ttyS0").unwrap());
        assert_eq!(perfbed_agent::power_off_address(&cmdline), Some(base), "{cmdline}");
        assert!(cmdline.contains("perfbed.device=0x3000@0xfe000000"), "{cmdline}");
        let (_, mmio) = dm.into_buses();
        mmio.write(0, base, &[0; 8]);
        assert!(register.requested());
        assert_eq!(mmio.unknown_accesses(), 0);
    }
}
