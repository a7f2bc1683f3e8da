//! The monitoring device on the MMIO bus: every access goes to the shared
//! device model with the index of the vCPU that made it, the rule the
//! device's placement checks depend on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use perfbed_device::host::InterruptLines;
use perfbed_device::SharedDevice;
use vmm_sys_util::eventfd::EventFd;

use super::bus::BusDevice;

/// The bus side of [`SharedDevice`], with the time its handler takes.
pub struct PerfbedMmio {
    device: SharedDevice,
    accesses: AtomicU64,
    handler_ns: AtomicU64,
}

impl PerfbedMmio {
    pub fn new(device: SharedDevice) -> PerfbedMmio {
        PerfbedMmio {
            device,
            accesses: AtomicU64::new(0),
            handler_ns: AtomicU64::new(0),
        }
    }

    /// Accesses handled, and the time spent inside the device for them.
    pub fn handler_time(&self) -> (u64, u64) {
        (
            self.accesses.load(Ordering::Relaxed),
            self.handler_ns.load(Ordering::Relaxed),
        )
    }

    fn account(&self, started: Instant) {
        let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.accesses.fetch_add(1, Ordering::Relaxed);
        self.handler_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// The domains' interrupt lines as KVM irqfds, domain `d`'s the `d`-th
/// (the domains beyond have none). An irqfd is an edge: each rise of a line
/// is one write, one interrupt of its GSI; a fall needs nothing.
pub struct PerfbedLines {
    irqfds: Vec<EventFd>,
}

impl PerfbedLines {
    pub fn new(irqfds: Vec<EventFd>) -> PerfbedLines {
        PerfbedLines { irqfds }
    }
}

impl InterruptLines for PerfbedLines {
    fn set_level(&self, domain: u32, asserted: bool) {
        if let Some(irqfd) = self.irqfds.get(domain as usize).filter(|_| asserted) {
            // A full eventfd counter (2^64 - 2 writes unread) still means
            // "pending": nothing is lost by ignoring the error.
            let _ = irqfd.write(1);
        }
    }
}

impl BusDevice for PerfbedMmio {
    fn read(&self, vcpu: u32, offset: u64, data: &mut [u8]) {
        let started = Instant::now();
        // The device refuses (and counts) any size but its registers' own,
        // so pass the size through as it is.
        let value = self.device.mmio_read(vcpu, offset, data.len() as u32);
        let bytes = value.to_le_bytes();
        for (out, byte) in data
            .iter_mut()
            .zip(bytes.iter().chain(std::iter::repeat(&0)))
        {
            *out = *byte;
        }
        self.account(started);
    }

    fn write(&self, vcpu: u32, offset: u64, data: &[u8]) {
        let started = Instant::now();
        let mut bytes = [0u8; 8];
        for (slot, byte) in bytes.iter_mut().zip(data) {
            *slot = *byte;
        }
        self.device
            .mmio_write(vcpu, offset, data.len() as u32, u64::from_le_bytes(bytes));
        self.account(started);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use perfbed_device::{regs, DeviceConfig};

    #[test]
    fn accesses_carry_the_vcpu_and_little_endian_values() {
        let shared = SharedDevice::new(DeviceConfig::default()).unwrap();
        let mmio = PerfbedMmio::new(shared.clone());
        let mut data = [0u8; 8];
        mmio.read(0, regs::REG_MAGIC, &mut data);
        assert_eq!(u64::from_le_bytes(data), regs::MAGIC_VALUE);
        // Domain 1's owner written from vCPU 2 is seen by the device.
        let owner = regs::domain_reg(1, regs::DOM_OWNER);
        mmio.write(2, owner, &3u64.to_le_bytes());
        assert_eq!(shared.mmio_read(2, owner, 8), 3);
        assert_eq!(mmio.handler_time().0, 2);
        let trace = shared.with(|d, _| d.trace());
        assert!(
            trace.iter().any(|t| t.vcpu == 2 && t.offset == owner),
            "{trace:?}"
        );
    }

    #[test]
    fn a_rising_line_writes_its_irqfd() {
        let fds = vec![
            EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            EventFd::new(libc::EFD_NONBLOCK).unwrap(),
        ];
        let observers: Vec<EventFd> = fds.iter().map(|f| f.try_clone().unwrap()).collect();
        let lines = PerfbedLines::new(fds);
        lines.set_level(1, true);
        lines.set_level(1, false);
        lines.set_level(0, false);
        lines.set_level(7, true);
        assert_eq!(observers[1].read().unwrap(), 1);
        assert!(
            observers[0].read().is_err(),
            "a fall or no rise writes nothing"
        );
    }

    #[test]
    fn odd_sizes_are_the_devices_to_refuse() {
        let shared = SharedDevice::new(DeviceConfig::default()).unwrap();
        let mmio = PerfbedMmio::new(shared.clone());
        let mut data = [0xaau8; 3];
        mmio.read(0, regs::REG_MAGIC, &mut data);
        assert_eq!(data, [0; 3]);
        mmio.write(0, regs::REG_MAGIC, &[1; 16]);
        let state = shared.with(|d, now| d.state(now));
        assert_eq!(state.bad_accesses.bad_size, 2, "{:?}", state.bad_accesses);
    }
}
