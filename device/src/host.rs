//! [`SharedDevice`]: the device as both hosts hold it.
//!
//! A [`Device`] behind a mutex plus the clock that gives it `now_ns`. The
//! lock is held only for one device call at a time (never across I/O or a
//! wait), and a poisoned lock is recovered rather than turned into a panic.
//! It knows nothing of the control socket: `control` serves one for it
//! ([`SharedDevice::serve_control`]).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::device::{ConfigError, Device, DeviceConfig};

/// A device shared between vCPU threads and the control socket.
#[derive(Debug, Clone)]
pub struct SharedDevice {
    device: Arc<Mutex<Device>>,
    start: Instant,
    size: u64,
}

impl SharedDevice {
    /// A new device whose time 0 is now.
    pub fn new(config: DeviceConfig) -> Result<SharedDevice, ConfigError> {
        let device = Device::new(config)?;
        Ok(SharedDevice {
            size: device.size(),
            device: Arc::new(Mutex::new(device)),
            start: Instant::now(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Device> {
        self.device
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` on the device with the current time, under the lock. The
    /// time is taken after the lock is acquired, so the device sees time in
    /// lock order. Keep `f` short.
    pub fn with<R>(&self, f: impl FnOnce(&mut Device, u64) -> R) -> R {
        let mut device = self.lock();
        let now = self.now_ns();
        f(&mut device, now)
    }

    /// Nanoseconds since the device was created.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// A guest MMIO read (bad accesses return 0).
    pub fn mmio_read(&self, vcpu: u32, offset: u64, size: u32) -> u64 {
        self.with(|d, now| d.read(now, vcpu, offset, size))
    }

    /// A guest MMIO write (bad accesses are ignored).
    pub fn mmio_write(&self, vcpu: u32, offset: u64, size: u32, value: u64) {
        self.with(|d, now| d.write(now, vcpu, offset, size, value))
    }

    /// Size of the register region in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regs;

    #[test]
    fn forwards_accesses_and_survives_poison() {
        let shared = SharedDevice::new(DeviceConfig::default()).unwrap();
        assert_eq!(shared.mmio_read(0, regs::REG_MAGIC, 8), regs::MAGIC_VALUE);
        assert_eq!(shared.size(), 3 * 4096);
        let clone = shared.clone();
        let _ = std::thread::spawn(move || {
            clone.with(|_, _| panic!("poison the lock"));
        })
        .join();
        assert!(shared.device.is_poisoned());
        shared.mmio_write(0, regs::domain_reg(0, regs::DOM_OWNER), 8, 1);
        assert_eq!(
            shared.mmio_read(1, regs::domain_reg(0, regs::DOM_OWNER), 8),
            1
        );
    }
}
