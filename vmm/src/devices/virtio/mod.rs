//! virtio over MMIO: the transport (`mmio`) and the one device perfbed's
//! guest needs, a console carrying the agent channel (`console`).

pub mod console;
pub mod mmio;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

/// `VIRTIO_F_VERSION_1`: the modern (1.0+) interface, the only one served.
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;
/// The interrupt status bit for "a queue was used".
pub const INTERRUPT_USED_RING: u32 = 1;
/// The interrupt status bit for "the configuration (here: the status's
/// DEVICE_NEEDS_RESET) changed".
pub const INTERRUPT_CONFIG: u32 = 2;

/// A device's interrupt: the status the driver reads and acknowledges, and
/// the irqfd that raises the line.
#[derive(Clone)]
pub struct Interrupt {
    status: Arc<AtomicU32>,
    irqfd: Arc<EventFd>,
}

impl Interrupt {
    pub fn new(irqfd: EventFd) -> Interrupt {
        Interrupt {
            status: Arc::new(AtomicU32::new(0)),
            irqfd: Arc::new(irqfd),
        }
    }

    /// Tells the driver a queue has new used entries.
    pub fn signal_used(&self) {
        self.status.fetch_or(INTERRUPT_USED_RING, Ordering::SeqCst);
        // An eventfd write fails only when its counter would overflow,
        // which means an interrupt is pending anyway.
        let _ = self.irqfd.write(1);
    }

    /// Tells the driver the device's configuration or status changed.
    pub fn signal_config(&self) {
        self.status.fetch_or(INTERRUPT_CONFIG, Ordering::SeqCst);
        let _ = self.irqfd.write(1);
    }

    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    pub fn acknowledge(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }
}

/// What one [`VirtioDevice::process`] call did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The queues (bit `i` for queue `i`) given new used entries: the
    /// transport decides whether the driver wants an interrupt for them.
    pub used: u32,
    /// It stopped at its bound with more to do: call again after the other
    /// events.
    pub more: bool,
}

/// A virtio device behind a transport.
pub trait VirtioDevice: Send {
    /// The virtio device ID (3: console).
    fn device_type(&self) -> u32;
    /// Feature bits offered (the transport adds [`VIRTIO_F_VERSION_1`]).
    fn features(&self) -> u64;
    /// Each queue's maximum size.
    fn queue_max_sizes(&self) -> &[u16];
    /// Reads the device-specific configuration space.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Moves whatever can move: called on the event loop when the driver
    /// notified a queue and when the device's backend has something. Only
    /// called on a live device. The work done per call is bounded (it runs
    /// under the lock the vCPUs' register accesses take) and never waits on
    /// I/O. It says which queues it used and whether it stopped at that
    /// bound; the transport sends the interrupts.
    fn process(&mut self, queues: &mut [Queue], memory: &GuestMemoryMmap) -> Progress;
    /// The driver reset the device.
    fn reset(&mut self);
}
