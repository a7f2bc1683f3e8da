//! The virtio-mmio transport, version 2 (virtio 1.x, "modern" only).
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
//! work, never for the host's I/O.

use std::sync::{Mutex, MutexGuard};

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::{Interrupt, VirtioDevice, VIRTIO_F_VERSION_1};
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
const REG_CONFIG_GENERATION: u64 = 0x0fc;
const CONFIG_SPACE: u64 = 0x100;

/// The `QueueNotify` register's offset (for registering ioeventfds on it).
pub const QUEUE_NOTIFY_OFFSET: u64 = REG_QUEUE_NOTIFY;

/// Device status bits.
const STATUS_DRIVER_OK: u32 = 4;
const STATUS_FAILED: u32 = 0x80;

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
}

impl<D: VirtioDevice> State<D> {
    fn live(&self) -> bool {
        self.status & STATUS_DRIVER_OK != 0 && self.status & STATUS_FAILED == 0
    }

    fn offered_features(&self) -> u64 {
        self.device.features() | VIRTIO_F_VERSION_1
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    /// Runs the device once (on the event loop); true if it has more to do.
    fn process(&mut self) -> bool {
        self.live() && self.device.process(&mut self.queues, &self.memory, &self.interrupt)
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
            _ => 0,
        }
    }

    fn write32(&mut self, offset: u64, value: u32) {
        match offset {
            REG_DEVICE_FEATURES_SEL => self.device_features_sel = value,
            REG_DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            REG_DRIVER_FEATURES => {
                // Only features offered can be taken.
                let offered = self.offered_features();
                match self.driver_features_sel {
                    0 => self.driver_features = (self.driver_features & !0xffff_ffff) | u64::from(value),
                    1 => self.driver_features = (self.driver_features & 0xffff_ffff) | (u64::from(value) << 32),
                    _ => {}
                }
                self.driver_features &= offered;
            }
            REG_QUEUE_SEL => self.queue_sel = value,
            REG_QUEUE_NUM => {
                if let Some(q) = self.selected_queue() {
                    q.set_size(value as u16);
                }
            }
            REG_QUEUE_READY => {
                if let Some(q) = self.selected_queue() {
                    q.set_ready(value == 1);
                }
            }
            REG_QUEUE_NOTIFY => self.notify(value),
            REG_INTERRUPT_ACK => self.interrupt.acknowledge(value),
            REG_STATUS => {
                if value == 0 {
                    self.reset();
                } else {
                    self.status = value;
                    // Input may have waited for the driver.
                    self.notify_all();
                }
            }
            REG_QUEUE_DESC_LOW => self.with_queue(|q| q.set_desc_table_address(Some(value), None)),
            REG_QUEUE_DESC_HIGH => self.with_queue(|q| q.set_desc_table_address(None, Some(value))),
            REG_QUEUE_DRIVER_LOW => self.with_queue(|q| q.set_avail_ring_address(Some(value), None)),
            REG_QUEUE_DRIVER_HIGH => self.with_queue(|q| q.set_avail_ring_address(None, Some(value))),
            REG_QUEUE_DEVICE_LOW => self.with_queue(|q| q.set_used_ring_address(Some(value), None)),
            REG_QUEUE_DEVICE_HIGH => self.with_queue(|q| q.set_used_ring_address(None, Some(value))),
            // Read-only registers and unknown offsets: ignored.
            _ => {}
        }
    }

    fn with_queue(&mut self, f: impl FnOnce(&mut Queue)) {
        if let Some(q) = self.selected_queue() {
            f(q);
        }
    }
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
    pub fn new(device: D, memory: GuestMemoryMmap, interrupt: Interrupt) -> Result<MmioTransport<D>, TransportError> {
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
        self.lock().notifiers.iter().map(EventFd::try_clone).collect()
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
        let value = if data.len() == 4 && offset.is_multiple_of(4) { state.read32(offset) } else { 0 };
        for (out, byte) in data.iter_mut().zip(value.to_le_bytes().iter().chain(std::iter::repeat(&0))) {
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
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use vmm_sys_util::eventfd::EventFd;

    struct Fake {
        processed: Arc<AtomicU32>,
        resets: Arc<AtomicU32>,
    }

    impl VirtioDevice for Fake {
        fn device_type(&self) -> u32 {
            3
        }
        fn features(&self) -> u64 {
            1 << 1
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &[16, 16]
        }
        fn read_config(&self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8 + 1);
        }
        fn process(&mut self, _: &mut [Queue], _: &GuestMemoryMmap, _: &Interrupt) -> bool {
            self.processed.fetch_add(1, Ordering::SeqCst);
            false
        }
        fn reset(&mut self) {
            self.resets.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn transport() -> (MmioTransport<Fake>, Arc<AtomicU32>, Arc<AtomicU32>) {
        let processed = Arc::new(AtomicU32::new(0));
        let resets = Arc::new(AtomicU32::new(0));
        let memory = crate::memory::create_guest_memory(64).unwrap();
        let interrupt = Interrupt::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
        let fake = Fake { processed: processed.clone(), resets: resets.clone() };
        (MmioTransport::new(fake, memory, interrupt).unwrap(), processed, resets)
    }

    fn read(t: &MmioTransport<Fake>, offset: u64) -> u32 {
        let mut data = [0u8; 4];
        t.read(0, offset, &mut data);
        u32::from_le_bytes(data)
    }

    fn write(t: &MmioTransport<Fake>, offset: u64, value: u32) {
        t.write(0, offset, &value.to_le_bytes());
    }

    #[test]
    fn identifies_itself() {
        let (t, _, _) = transport();
        assert_eq!(read(&t, REG_MAGIC), MAGIC);
        assert_eq!(read(&t, REG_VERSION), 2);
        assert_eq!(read(&t, REG_DEVICE_ID), 3);
        assert_eq!(read(&t, REG_DEVICE_FEATURES), 1 << 1);
        write(&t, REG_DEVICE_FEATURES_SEL, 1);
        assert_eq!(read(&t, REG_DEVICE_FEATURES), 1, "VERSION_1 is bit 32");
        write(&t, REG_QUEUE_SEL, 1);
        assert_eq!(read(&t, REG_QUEUE_NUM_MAX), 16);
        write(&t, REG_QUEUE_SEL, 2);
        assert_eq!(read(&t, REG_QUEUE_NUM_MAX), 0, "no third queue");
        let mut config = [0u8; 2];
        t.read(0, CONFIG_SPACE + 4, &mut config);
        assert_eq!(config, [5, 5]);
    }

    #[test]
    fn only_offered_features_are_taken() {
        let (t, _, _) = transport();
        write(&t, REG_DRIVER_FEATURES_SEL, 0);
        write(&t, REG_DRIVER_FEATURES, 0xffff_ffff);
        write(&t, REG_DRIVER_FEATURES_SEL, 1);
        write(&t, REG_DRIVER_FEATURES, 0xffff_ffff);
        assert_eq!(t.driver_features(), (1 << 1) | VIRTIO_F_VERSION_1);
    }

    #[test]
    fn a_notify_wakes_the_event_loop_and_never_runs_the_device() {
        let (t, processed, _) = transport();
        let notifiers = t.notifiers().unwrap();
        write(&t, REG_STATUS, 1 | 2 | 8 | STATUS_DRIVER_OK);
        for n in &notifiers {
            assert_eq!(n.read().unwrap(), 1, "DRIVER_OK wakes every queue");
        }
        write(&t, REG_QUEUE_NOTIFY, 1);
        write(&t, REG_QUEUE_NOTIFY, 7); // no such queue: nothing
        assert_eq!(processed.load(Ordering::SeqCst), 0, "the vCPU ran the device");
        assert_eq!(notifiers[1].read().unwrap(), 1);
        assert!(notifiers[0].read().is_err(), "queue 0 was not notified");
        t.poll(|_| {});
        assert_eq!(processed.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn the_device_runs_only_when_live_and_resets_on_zero() {
        let (t, processed, resets) = transport();
        t.poll(|_| {});
        assert_eq!(processed.load(Ordering::SeqCst), 0);
        write(&t, REG_STATUS, 1 | 2 | 8 | STATUS_DRIVER_OK);
        t.poll(|_| {});
        assert_eq!(processed.load(Ordering::SeqCst), 1);
        write(&t, REG_STATUS, 0);
        assert_eq!(resets.load(Ordering::SeqCst), 1);
        assert_eq!(read(&t, REG_STATUS), 0);
        t.poll(|_| {});
        assert_eq!(processed.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn odd_accesses_are_ignored() {
        let (t, _, _) = transport();
        t.write(0, REG_STATUS, &[4]);
        t.write(0, REG_STATUS + 1, &[4, 0, 0, 0]);
        assert_eq!(read(&t, REG_STATUS), 0);
        let mut byte = [0xaa];
        t.read(0, REG_MAGIC, &mut byte);
        assert_eq!(byte, [0]);
        t.write(0, 0xdead_0000, &[1, 2, 3, 4]);
    }
}
