//! [`SharedDevice`]: the device as both hosts hold it.
//!
//! A [`Device`] behind a mutex plus the clock that gives it `now_ns`. The
//! lock is held only for one device call at a time (never across I/O or a
//! wait), and a poisoned lock is recovered rather than turned into a panic.
//! It knows nothing of the control socket: `control` serves one for it
//! ([`SharedDevice::serve_control`]).
//!
//! **Interrupt lines.** A host that wires the domains' lines to its
//! interrupt controller gives an [`InterruptLines`]
//! ([`SharedDevice::connect_lines`]). After every device call that changed
//! a line, the new level is handed to it *after* the device's lock is
//! released, so a host may take its own locks there (QEMU's global lock)
//! without ever nesting them inside the device's. Since traffic lands with
//! no guest access to notice it, [`SharedDevice::start_ticker`] lets time
//! pass every few milliseconds while an overflow interrupt is enabled.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::device::{ConfigError, Device, DeviceConfig};

/// How a host delivers the device's interrupt lines, one per domain.
///
/// Calls come from whichever thread made the change (a vCPU's MMIO access,
/// the control socket, the ticker), never under the device's lock, and two
/// threads' calls may arrive in either order: a host that defers delivery
/// must apply [`SharedDevice::line_level`] when it does, not the level it
/// was passed. `set_level(d, true)` means the line rose at least once since
/// the previous call for `d`: an edge-triggered host raises one interrupt
/// per such call.
pub trait InterruptLines: Send + Sync {
    /// Domain `domain`'s line is now at `asserted`.
    fn set_level(&self, domain: u32, asserted: bool);
}

/// A device shared between vCPU threads and the control socket.
#[derive(Clone)]
pub struct SharedDevice {
    device: Arc<Mutex<Device>>,
    start: Instant,
    size: u64,
    lines: Arc<OnceLock<Arc<dyn InterruptLines>>>,
}

impl std::fmt::Debug for SharedDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedDevice")
            .field("size", &self.size)
            .field("lines", &self.lines.get().is_some())
            .finish_non_exhaustive()
    }
}

/// The thread that lets time pass for the interrupts
/// ([`SharedDevice::start_ticker`]); stopped and joined when dropped.
pub struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl SharedDevice {
    /// A new device whose time 0 is now.
    pub fn new(config: DeviceConfig) -> Result<SharedDevice, ConfigError> {
        let device = Device::new(config)?;
        Ok(SharedDevice {
            size: device.size(),
            device: Arc::new(Mutex::new(device)),
            start: Instant::now(),
            lines: Arc::new(OnceLock::new()),
        })
    }

    /// Wires the domains' interrupt lines to `lines` (once; a second call
    /// is refused and returns `false`). Every line is delivered at its
    /// current level at once.
    pub fn connect_lines(&self, lines: Arc<dyn InterruptLines>) -> bool {
        if self.lines.set(lines).is_err() {
            return false;
        }
        let domains = self.with(|d, _| d.config().domains.len() as u32);
        if let Some(lines) = self.lines.get() {
            for domain in 0..domains {
                lines.set_level(domain, self.line_level(domain));
            }
        }
        true
    }

    /// The level of domain `domain`'s line now.
    pub fn line_level(&self, domain: u32) -> bool {
        self.lock().line_level(domain)
    }

    /// Starts the thread that lets time pass every `period` while an
    /// overflow interrupt is enabled, so that traffic landing raises the
    /// line without a guest access.
    pub fn start_ticker(&self, period: Duration) -> std::io::Result<Ticker> {
        let stop = Arc::new(AtomicBool::new(false));
        let device = self.clone();
        let stopping = stop.clone();
        let thread = thread::Builder::new()
            .name("perfbed-ticker".into())
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    thread::sleep(period);
                    device.with(|d, now| {
                        if d.interrupts_enabled() {
                            d.tick(now);
                        }
                    });
                }
            })?;
        Ok(Ticker {
            stop,
            thread: Some(thread),
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
        let (result, changes, levels) = {
            let mut device = self.lock();
            let now = self.now_ns();
            let result = f(&mut device, now);
            let changes = if self.lines.get().is_some() {
                device.take_line_changes()
            } else {
                0
            };
            let mut levels = 0u64;
            for d in (0..64).filter(|d| changes & (1 << d) != 0) {
                if device.line_level(d) {
                    levels |= 1 << d;
                }
            }
            (result, changes, levels)
        };
        if let Some(lines) = self.lines.get() {
            for d in (0..64u32).filter(|d| changes & (1 << d) != 0) {
                lines.set_level(d, levels & (1 << d) != 0);
            }
        }
        result
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
    use std::sync::Mutex;

    /// Records every level the device hands over.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<(u32, bool)>>);

    impl InterruptLines for Recorder {
        fn set_level(&self, domain: u32, asserted: bool) {
            self.0.lock().unwrap().push((domain, asserted));
        }
    }

    #[test]
    fn lines_follow_the_status_and_the_ticker_raises_them() {
        let shared = SharedDevice::new(DeviceConfig::default()).unwrap();
        let recorder = Arc::new(Recorder::default());
        assert!(shared.connect_lines(recorder.clone()));
        assert!(!shared.connect_lines(recorder.clone()), "connected twice");
        assert_eq!(*recorder.0.lock().unwrap(), vec![(0, false), (1, false)]);
        recorder.0.lock().unwrap().clear();
        // Domain 1, owned by vCPU 2, one slot, an interrupt at 16 units.
        shared.mmio_write(2, regs::domain_reg(1, regs::DOM_OWNER), 8, 2);
        shared.mmio_write(
            2,
            regs::slot_ctl(1, 0),
            8,
            regs::slot_ctl_value(crate::Event::MbmTotalBytes, 1),
        );
        shared.mmio_write(2, regs::domain_reg(1, regs::DOM_IRQ_THRESHOLD), 8, 16);
        shared.mmio_write(
            2,
            regs::domain_reg(1, regs::DOM_IRQ_CTL),
            8,
            regs::IRQ_CTL_OVERFLOW,
        );
        assert!(recorder.0.lock().unwrap().is_empty(), "nothing landed yet");
        let _ticker = shared.start_ticker(Duration::from_millis(1)).unwrap();
        shared
            .with(|d, now| d.inject(now, 1, 1, crate::Event::MbmTotalBytes, 64 * 16))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !shared.line_level(1) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            *recorder.0.lock().unwrap(),
            vec![(1, true)],
            "the ticker raised the line"
        );
        // The owner acks: the line falls.
        assert_eq!(
            shared.mmio_read(2, regs::domain_reg(1, regs::DOM_IRQ_STATUS), 8),
            1
        );
        assert_eq!(*recorder.0.lock().unwrap(), vec![(1, true), (1, false)]);
    }

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
