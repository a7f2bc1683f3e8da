//! The virtio-mmio transport, version 2 (virtio 1.x, "modern" only).
//!
//! What it enforces of the driver's side (virtio 1.x §2.1, §3.1, §4.2.2),
//! each rule a unit test below:
//! - the status only grows (bits are cleared by writing 0, the reset; a
//!   write that clears a bit is refused), FAILED is taken at any time;
//! - FEATURES_OK is kept only with ACKNOWLEDGE and DRIVER set and
//!   `VIRTIO_F_VERSION_1` among the driver's features (no legacy
//!   interface); the driver reads it back to see (§3.1.1 step 6); after it,
//!   the driver's features no longer change;
//! - DRIVER_OK is taken only once FEATURES_OK is set;
//! - a queue's QueueNum and addresses change only while its QueueReady is
//!   0; QueueNum must be a power of two no larger than QueueNumMax, and a
//!   misaligned address is not taken either;
//! - making a queue ready whose configuration was refused, or whose rings
//!   are not in guest memory, leaves it not ready and sets
//!   DEVICE_NEEDS_RESET (with a configuration interrupt once DRIVER_OK is
//!   set, §2.1.2);
//! - after the device used a queue, the driver is interrupted unless its
//!   available ring's flags say `VRING_AVAIL_F_NO_INTERRUPT` (§2.7.10;
//!   `EVENT_IDX` is not offered);
//! - there is no shared memory region: SHMLenLow/High read -1 (§4.2.2).
//!
//! Register accesses come from vCPU threads; the device's backend (the event
//! loop) gets in through [`MmioTransport::poll`]. One mutex covers both, so
//! queue state is only ever touched by one thread at a time.
//!
//! A vCPU never runs the device: a `QueueNotify` write signals that queue's
//! notifier eventfd (the VMM registers the same eventfds with KVM as
//! ioeventfds, so the usual notify does not even leave the kernel), and the
//! event loop, watching them, calls [`MmioTransport::poll`]. So a register
//! access only ever waits for the event loop's bounded, non-blocking device
//! work, never for the host's I/O: the event loop copies the device's
//! output out under the lock and writes it to the host after dropping it.

use std::sync::{Mutex, MutexGuard};

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::{Interrupt, Progress, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::devices::bus::BusDevice;

const MAGIC: u32 = 0x7472_6976; // "virt"
const VERSION: u32 = 2;
const VENDOR: u32 = 0x5045_5246; // "PERF"

const REG_MAGIC: u64 = 0x000;
const REG_VERSION: u64 = 0x004;
const REG_DEVICE_ID: u64 = 0x008;
const REG_VENDOR_ID: u64 = 0x00c;
const REG_DEVICE_FEATURES: u64 = 0x010;
const REG_DEVICE_FEATURES_SEL: u64 = 0x014;
const REG_DRIVER_FEATURES: u64 = 0x020;
const REG_DRIVER_FEATURES_SEL: u64 = 0x024;
const REG_QUEUE_SEL: u64 = 0x030;
const REG_QUEUE_NUM_MAX: u64 = 0x034;
const REG_QUEUE_NUM: u64 = 0x038;
const REG_QUEUE_READY: u64 = 0x044;
const REG_QUEUE_NOTIFY: u64 = 0x050;
const REG_INTERRUPT_STATUS: u64 = 0x060;
const REG_INTERRUPT_ACK: u64 = 0x064;
const REG_STATUS: u64 = 0x070;
const REG_QUEUE_DESC_LOW: u64 = 0x080;
const REG_QUEUE_DESC_HIGH: u64 = 0x084;
const REG_QUEUE_DRIVER_LOW: u64 = 0x090;
const REG_QUEUE_DRIVER_HIGH: u64 = 0x094;
const REG_QUEUE_DEVICE_LOW: u64 = 0x0a0;
const REG_QUEUE_DEVICE_HIGH: u64 = 0x0a4;
const REG_SHM_LEN_LOW: u64 = 0x0b0;
const REG_SHM_LEN_HIGH: u64 = 0x0b4;
const REG_CONFIG_GENERATION: u64 = 0x0fc;
const CONFIG_SPACE: u64 = 0x100;

/// The `QueueNotify` register's offset (for registering ioeventfds on it).
pub const QUEUE_NOTIFY_OFFSET: u64 = REG_QUEUE_NOTIFY;

/// Device status bits.
const STATUS_ACKNOWLEDGE: u32 = 1;
const STATUS_DRIVER: u32 = 2;
const STATUS_DRIVER_OK: u32 = 4;
const STATUS_FEATURES_OK: u32 = 8;
const STATUS_NEEDS_RESET: u32 = 0x40;
const STATUS_FAILED: u32 = 0x80;

/// `VRING_AVAIL_F_NO_INTERRUPT`: the driver asks not to be interrupted.
const AVAIL_F_NO_INTERRUPT: u16 = 1;

struct State<D> {
    device: D,
    queues: Vec<Queue>,
    memory: GuestMemoryMmap,
    interrupt: Interrupt,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    queue_sel: u32,
    status: u32,
    /// One per queue: signalled on a notify, watched by the event loop.
    notifiers: Vec<EventFd>,
    /// Per queue: a configuration write was refused since the last reset.
    refused: Vec<bool>,
}

impl<D: VirtioDevice> State<D> {
    fn live(&self) -> bool {
        self.status & STATUS_DRIVER_OK != 0 && self.status & STATUS_FAILED == 0
    }

    fn offered_features(&self) -> u64 {
        self.device.features() | VIRTIO_F_VERSION_1
    }

    /// Runs the device once (on the event loop) and interrupts the driver
    /// for the queues it used; true if it has more to do.
    fn process(&mut self) -> bool {
        if !self.live() {
            return false;
        }
        let Progress { used, more } = self.device.process(&mut self.queues, &self.memory);
        // The used entries are written before the flags are read.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let wanted = self
            .queues
            .iter()
            .enumerate()
            .filter(|(i, _)| *i < 32 && used & (1 << i) != 0)
            .any(|(_, q)| {
                let flags = self
                    .memory
                    .read_obj::<u16>(GuestAddress(q.avail_ring()))
                    .map(u16::from_le);
                // Unreadable flags: interrupt, the safe side.
                flags.map_or(true, |f| f & AVAIL_F_NO_INTERRUPT == 0)
            });
        if wanted {
            self.interrupt.signal_used();
        }
        more
    }

    /// The device cannot go on until the driver resets it (§2.1.2).
    fn needs_reset(&mut self) {
        self.status |= STATUS_NEEDS_RESET;
        if self.status & STATUS_DRIVER_OK != 0 {
            self.interrupt.signal_config();
        }
    }

    /// A status write other than the reset: see the module's rules.
    fn write_status(&mut self, value: u32) {
        let kept = self.status & !STATUS_NEEDS_RESET;
        if value & kept != kept {
            return; // clears a bit: refused
        }
        let mut new = value & !self.status & !STATUS_NEEDS_RESET;
        let driver = STATUS_ACKNOWLEDGE | STATUS_DRIVER;
        if new & STATUS_FEATURES_OK != 0
            && (value & driver != driver || self.driver_features & VIRTIO_F_VERSION_1 == 0)
        {
            new &= !STATUS_FEATURES_OK;
        }
        if new & STATUS_DRIVER_OK != 0 && (self.status | new) & STATUS_FEATURES_OK == 0 {
            new &= !STATUS_DRIVER_OK;
        }
        self.status |= new;
        if new & STATUS_DRIVER_OK != 0 {
            // Input may have waited for the driver.
            self.notify_all();
        }
    }

    /// A write to the selected queue's configuration, taken only while the
    /// queue is not ready; `set` says whether the value was valid.
    fn configure_queue(&mut self, set: impl FnOnce(&mut Queue) -> bool) {
        let index = self.queue_sel as usize;
        let Some(q) = self.queues.get_mut(index) else {
            return;
        };
        if q.ready() {
            return;
        }
        if !set(q) {
            self.refused[index] = true;
        }
    }

    fn set_queue_ready(&mut self, ready: bool) {
        let index = self.queue_sel as usize;
        let Some(q) = self.queues.get_mut(index) else {
            return;
        };
        if !ready {
            q.set_ready(false);
            return;
        }
        if q.ready() {
            return;
        }
        q.set_ready(true);
        if self.refused[index] || !q.is_valid(&self.memory) {
            q.set_ready(false);
            self.needs_reset();
        }
    }

    /// Hands the device's work to the event loop (from a vCPU).
    fn notify(&self, queue: u32) {
        if let Some(evt) = self.notifiers.get(queue as usize) {
            // Fails only when the counter would overflow: a wake-up is
            // pending anyway.
            let _ = evt.write(1);
        }
    }

    fn notify_all(&self) {
        for queue in 0..self.notifiers.len() {
            self.notify(queue as u32);
        }
    }

    fn reset(&mut self) {
        for queue in &mut self.queues {
            queue.reset();
        }
        self.refused.fill(false);
        self.device.reset();
        self.status = 0;
        self.driver_features = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.queue_sel = 0;
        self.interrupt.acknowledge(u32::MAX);
    }

    fn read32(&self, offset: u64) -> u32 {
        let queue = self.queues.get(self.queue_sel as usize);
        match offset {
            REG_MAGIC => MAGIC,
            REG_VERSION => VERSION,
            REG_DEVICE_ID => self.device.device_type(),
            REG_VENDOR_ID => VENDOR,
            REG_DEVICE_FEATURES => match self.device_features_sel {
                0 => self.offered_features() as u32,
                1 => (self.offered_features() >> 32) as u32,
                _ => 0,
            },
            REG_QUEUE_NUM_MAX => queue.map_or(0, |q| u32::from(q.max_size())),
            REG_QUEUE_READY => queue.map_or(0, |q| u32::from(q.ready())),
            REG_INTERRUPT_STATUS => self.interrupt.status(),
            REG_STATUS => self.status,
            REG_CONFIG_GENERATION => 0,
            // No shared memory region: whatever SHMSel says, its length
            // reads as -1 (§4.2.2), which Linux takes for "none".
            REG_SHM_LEN_LOW | REG_SHM_LEN_HIGH => u32::MAX,
            _ => 0,
        }
    }

    fn write32(&mut self, offset: u64, value: u32) {
        match offset {
            REG_DEVICE_FEATURES_SEL => self.device_features_sel = value,
            REG_DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            // Fixed once FEATURES_OK is set.
            REG_DRIVER_FEATURES if self.status & STATUS_FEATURES_OK != 0 => {}
            REG_DRIVER_FEATURES => {
                // Only features offered can be taken.
                let offered = self.offered_features();
                match self.driver_features_sel {
                    0 => {
                        self.driver_features =
                            (self.driver_features & !0xffff_ffff) | u64::from(value)
                    }
                    1 => {
                        self.driver_features =
                            (self.driver_features & 0xffff_ffff) | (u64::from(value) << 32)
                    }
                    _ => {}
                }
                self.driver_features &= offered;
            }
            REG_QUEUE_SEL => self.queue_sel = value,
            REG_QUEUE_NUM => self
                .configure_queue(|q| u16::try_from(value).is_ok_and(|n| q.try_set_size(n).is_ok())),
            REG_QUEUE_READY => self.set_queue_ready(value == 1),
            REG_QUEUE_NOTIFY => self.notify(value),
            REG_INTERRUPT_ACK => self.interrupt.acknowledge(value),
            REG_STATUS => {
                if value == 0 {
                    self.reset();
                } else {
                    self.write_status(value);
                }
            }
            REG_QUEUE_DESC_LOW | REG_QUEUE_DESC_HIGH => self.configure_queue(|q| {
                let address = with_half(q.desc_table(), offset == REG_QUEUE_DESC_HIGH, value);
                q.try_set_desc_table_address(address).is_ok()
            }),
            REG_QUEUE_DRIVER_LOW | REG_QUEUE_DRIVER_HIGH => self.configure_queue(|q| {
                let address = with_half(q.avail_ring(), offset == REG_QUEUE_DRIVER_HIGH, value);
                q.try_set_avail_ring_address(address).is_ok()
            }),
            REG_QUEUE_DEVICE_LOW | REG_QUEUE_DEVICE_HIGH => self.configure_queue(|q| {
                let address = with_half(q.used_ring(), offset == REG_QUEUE_DEVICE_HIGH, value);
                q.try_set_used_ring_address(address).is_ok()
            }),
            // Read-only registers and unknown offsets: ignored.
            _ => {}
        }
    }
}

/// `address` with its high or low 32 bits replaced by `value`.
fn with_half(address: u64, high: bool, value: u32) -> GuestAddress {
    GuestAddress(if high {
        (address & 0xffff_ffff) | (u64::from(value) << 32)
    } else {
        (address & !0xffff_ffff) | u64::from(value)
    })
}

/// Why a transport could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("virtio queue of size {0}: {1:?}")]
    Queue(u16, virtio_queue::Error),
    #[error("creating a queue notifier eventfd: {0}")]
    Notifier(std::io::Error),
}

/// A virtio device on the MMIO bus.
pub struct MmioTransport<D> {
    state: Mutex<State<D>>,
}

impl<D: VirtioDevice> MmioTransport<D> {
    pub fn new(
        device: D,
        memory: GuestMemoryMmap,
        interrupt: Interrupt,
    ) -> Result<MmioTransport<D>, TransportError> {
        let queues = device
            .queue_max_sizes()
            .iter()
            .map(|&size| Queue::new(size).map_err(|e| TransportError::Queue(size, e)))
            .collect::<Result<Vec<_>, _>>()?;
        let notifiers = (0..queues.len())
            .map(|_| EventFd::new(libc::EFD_NONBLOCK).map_err(TransportError::Notifier))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MmioTransport {
            state: Mutex::new(State {
                device,
                queues,
                memory,
                interrupt,
                device_features_sel: 0,
                driver_features_sel: 0,
                driver_features: 0,
                queue_sel: 0,
                status: 0,
                refused: vec![false; notifiers.len()],
                notifiers,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State<D>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the device (to hand it backend input), then lets it move
    /// data if the driver has made it live; returns `f`'s result and whether
    /// the device has more to do (call again after other events). For the
    /// event loop only.
    pub fn poll<R>(&self, f: impl FnOnce(&mut D) -> R) -> (R, bool) {
        let mut state = self.lock();
        let result = f(&mut state.device);
        let more = state.process();
        (result, more)
    }

    /// Runs `f` on the device without letting it move data (to read its
    /// state or hand it something the next [`MmioTransport::poll`] uses).
    pub fn with_device<R>(&self, f: impl FnOnce(&mut D) -> R) -> R {
        f(&mut self.lock().device)
    }

    /// Clones of the queues' notifier eventfds, in queue order: for the
    /// event loop to watch and for KVM to signal (ioeventfds with the queue
    /// index as datamatch on [`QUEUE_NOTIFY_OFFSET`]).
    pub fn notifiers(&self) -> std::io::Result<Vec<EventFd>> {
        self.lock()
            .notifiers
            .iter()
            .map(EventFd::try_clone)
            .collect()
    }

    /// The features the driver accepted.
    pub fn driver_features(&self) -> u64 {
        self.lock().driver_features
    }
}

impl<D: VirtioDevice> BusDevice for MmioTransport<D> {
    fn read(&self, _vcpu: u32, offset: u64, data: &mut [u8]) {
        let state = self.lock();
        if offset >= CONFIG_SPACE {
            state.device.read_config(offset - CONFIG_SPACE, data);
            return;
        }
        let value = if data.len() == 4 && offset.is_multiple_of(4) {
            state.read32(offset)
        } else {
            0
        };
        for (out, byte) in data
            .iter_mut()
            .zip(value.to_le_bytes().iter().chain(std::iter::repeat(&0)))
        {
            *out = *byte;
        }
    }

    fn write(&self, _vcpu: u32, offset: u64, data: &[u8]) {
        // The registers are 32-bit; other widths are ignored, as are config
        // space writes (the console's configuration is read-only).
        if offset >= CONFIG_SPACE || data.len() != 4 || !offset.is_multiple_of(4) {
            return;
        }
        let value = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        self.lock().write32(offset, value);
    }
}

#[cfg(test)]
mod tests;
