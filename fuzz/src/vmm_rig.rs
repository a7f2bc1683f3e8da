//! A guest and a host around perfbed-vmm's devices, for the `vmm_*`
//! targets: the MMIO bus with the monitoring device and the virtio-mmio
//! transport (the console behind it) at their real addresses, COM1 on a
//! port bus, guest memory whose rings and chains the guest side writes as a
//! driver would, and a host side that takes the console's output the way
//! the agent channel does (copy out, write, consume) and drains the serial
//! ring the way the event loop does.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use perfbed_device::{DeviceConfig, SharedDevice};
use perfbed_vmm::devices::bus::Bus;
use perfbed_vmm::devices::perfbed::PerfbedMmio;
use perfbed_vmm::devices::serial::{SerialConsole, COM1_BASE, COM1_LEN};
use perfbed_vmm::devices::virtio::console::Console;
use perfbed_vmm::devices::virtio::mmio::MmioTransport;
use perfbed_vmm::devices::virtio::Interrupt;
use perfbed_vmm::memory::{PERFBED_DEVICE_BASE, VIRTIO_MMIO_BASE, VIRTIO_MMIO_SIZE};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

pub const MEMORY: u64 = 1 << 20;
/// Queue `q`'s rings (as [`Rig::set_up_queue`] places them).
const RINGS: u64 = 0x1_0000;
const RING_STEP: u64 = 0x8000;
pub const QUEUES: u8 = 6;
/// The console's queue maxima (`console.rs`'s `QUEUE_SIZES`).
pub const QUEUE_MAX: [u16; 6] = [64, 64, 32, 32, 256, 256];

pub const REG_QUEUE_SEL: u64 = 0x30;
pub const REG_QUEUE_NUM: u64 = 0x38;
pub const REG_QUEUE_READY: u64 = 0x44;
pub const REG_QUEUE_NOTIFY: u64 = 0x50;
pub const REG_INTERRUPT_STATUS: u64 = 0x60;
pub const REG_STATUS: u64 = 0x70;
pub const REG_QUEUE_DESC_LOW: u64 = 0x80;
pub const REG_QUEUE_DRIVER_LOW: u64 = 0x90;
pub const REG_QUEUE_DEVICE_LOW: u64 = 0xa0;
pub const REG_DRIVER_FEATURES: u64 = 0x20;
pub const REG_DRIVER_FEATURES_SEL: u64 = 0x24;
pub const STATUS_DRIVER_OK: u32 = 4;
pub const STATUS_FEATURES_OK: u32 = 8;

/// One descriptor of a chain the guest side writes.
#[derive(arbitrary::Arbitrary, Debug, Clone)]
pub struct Descriptor {
    pub addr: u32,
    pub len: u32,
    pub write: bool,
}

pub struct Rig {
    pub memory: GuestMemoryMmap,
    pub bus: Bus,
    pub ports: Bus,
    pub console: Arc<MmioTransport<Console>>,
    pub serial: Arc<SerialConsole>,
    /// What the serial port's log got.
    pub serial_log: SerialLog,
    /// How many more bytes the host takes before it blocks.
    pub host_allowed: usize,
    /// What the host took of the console's output, in order.
    pub host_got: Vec<u8>,
    /// Each queue's size as last set up (the available ring wraps there).
    pub sizes: [u16; QUEUES as usize],
    pub last_status: u32,
}

/// The serial log: a shared buffer.
#[derive(Clone, Default)]
pub struct SerialLog(pub Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for SerialLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Rig {
    /// The devices, with a connected host that takes nothing yet and a
    /// serial ring of `serial_ring` bytes.
    pub fn new(serial_ring: usize) -> Rig {
        let memory = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEMORY as usize)]).unwrap();
        let interrupt = Interrupt::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
        let console = Arc::new(MmioTransport::new(Console::new(), memory.clone(), interrupt).unwrap());
        let config = DeviceConfig { trace_capacity: 64, ..DeviceConfig::default() };
        let device = SharedDevice::new(config).unwrap();
        let mut bus = Bus::new("MMIO");
        bus.insert("perfbed device", PERFBED_DEVICE_BASE, device.size(), Arc::new(PerfbedMmio::new(device))).unwrap();
        bus.insert("virtio console", VIRTIO_MMIO_BASE, VIRTIO_MMIO_SIZE, console.clone()).unwrap();
        let serial_log = SerialLog::default();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let panicked = Arc::new(AtomicBool::new(false));
        let serial =
            Arc::new(SerialConsole::new(irq, Some(Box::new(serial_log.clone())), panicked, serial_ring).unwrap());
        let mut ports = Bus::new("port");
        ports.insert("COM1", COM1_BASE, COM1_LEN, serial.clone()).unwrap();
        console.with_device(|c| c.connect());
        Rig {
            memory,
            bus,
            ports,
            console,
            serial,
            serial_log,
            host_allowed: 0,
            host_got: Vec::new(),
            sizes: [256; QUEUES as usize],
            last_status: 0,
        }
    }

    pub fn read32(&self, offset: u64) -> u32 {
        let mut data = [0u8; 4];
        self.bus.read(0, VIRTIO_MMIO_BASE + offset, &mut data);
        u32::from_le_bytes(data)
    }

    pub fn write32(&mut self, offset: u64, value: u32) {
        self.bus.write(0, VIRTIO_MMIO_BASE + offset, &value.to_le_bytes());
        if offset == REG_STATUS && value == 0 {
            self.last_status = 0;
        }
    }

    pub fn rings(queue: u8) -> u64 {
        RINGS + u64::from(queue % QUEUES) * RING_STEP
    }

    /// The driver's negotiation (ACKNOWLEDGE, DRIVER, features,
    /// FEATURES_OK), then DRIVER_OK if asked.
    pub fn negotiate(&mut self, features_high: u32, features_low: u32, driver_ok: bool) {
        self.write32(REG_STATUS, 1);
        self.write32(REG_STATUS, 3);
        self.write32(REG_DRIVER_FEATURES_SEL, 1);
        self.write32(REG_DRIVER_FEATURES, features_high);
        self.write32(REG_DRIVER_FEATURES_SEL, 0);
        self.write32(REG_DRIVER_FEATURES, features_low);
        self.write32(REG_STATUS, 3 | STATUS_FEATURES_OK);
        if driver_ok {
            self.write32(REG_STATUS, 3 | STATUS_FEATURES_OK | STATUS_DRIVER_OK);
        }
    }

    /// Queue `queue` of `size` entries at its rings' place, made ready.
    pub fn set_up_queue(&mut self, queue: u8, size: u16) {
        let base = Rig::rings(queue);
        self.write32(REG_QUEUE_SEL, u32::from(queue));
        self.write32(REG_QUEUE_NUM, u32::from(size));
        self.write32(REG_QUEUE_DESC_LOW, base as u32);
        self.write32(REG_QUEUE_DRIVER_LOW, (base + 0x1000) as u32);
        self.write32(REG_QUEUE_DEVICE_LOW, (base + 0x2000) as u32);
        self.write32(REG_QUEUE_READY, 1);
        if size.is_power_of_two() && size <= QUEUE_MAX[usize::from(queue % QUEUES)] {
            self.sizes[usize::from(queue % QUEUES)] = size;
        }
    }

    /// A live console as Linux leaves it: every queue of `size` entries
    /// (capped at its maximum), DRIVER_OK.
    pub fn make_live(&mut self, size: impl Fn(u8) -> u16) {
        self.negotiate(1, 1 << 1, false);
        for queue in 0..QUEUES {
            self.set_up_queue(queue, size(queue).min(QUEUE_MAX[usize::from(queue)]));
        }
        self.write32(REG_STATUS, 3 | STATUS_FEATURES_OK | STATUS_DRIVER_OK);
    }

    /// Writes the chain's descriptors from `head` on (wrapping at the
    /// queue's size), puts `head` in the available ring and notifies.
    pub fn add_chain(&mut self, queue: u8, head: u16, descriptors: &[Descriptor]) {
        let queue = queue % QUEUES;
        let size = usize::from(self.sizes[usize::from(queue)]);
        let base = Rig::rings(queue);
        let count = descriptors.len().min(16);
        for (i, d) in descriptors.iter().take(count).enumerate() {
            let index = (usize::from(head) + i) % size;
            let next = ((usize::from(head) + i + 1) % size) as u16;
            let mut flags = if d.write { 2u16 } else { 0 };
            if i + 1 < count {
                flags |= 1;
            }
            let at = base + 16 * index as u64;
            let _ = self.memory.write_obj(u64::from(d.addr).to_le(), GuestAddress(at));
            let _ = self.memory.write_obj(d.len.to_le(), GuestAddress(at + 8));
            let _ = self.memory.write_obj(flags.to_le(), GuestAddress(at + 12));
            let _ = self.memory.write_obj(next.to_le(), GuestAddress(at + 14));
        }
        let avail = base + 0x1000;
        let idx = self.avail_idx(queue);
        let slot = avail + 4 + 2 * (usize::from(idx) % size) as u64;
        let _ = self.memory.write_obj(head.to_le(), GuestAddress(slot));
        let _ = self.memory.write_obj(idx.wrapping_add(1).to_le(), GuestAddress(avail + 2));
        self.write32(REG_QUEUE_NOTIFY, u32::from(queue));
    }

    /// The available ring's index: chains made available so far.
    pub fn avail_idx(&self, queue: u8) -> u16 {
        let at = GuestAddress(Rig::rings(queue) + 0x1000 + 2);
        self.memory.read_obj(at).map(u16::from_le).unwrap_or(0)
    }

    /// The used ring's index: chains the device used so far.
    pub fn used_idx(&self, queue: u8) -> u16 {
        let at = GuestAddress(Rig::rings(queue) + 0x2000 + 2);
        self.memory.read_obj(at).map(u16::from_le).unwrap_or(0)
    }

    /// The event loop's turn: the device runs, then the host takes what it
    /// may of the output (copied out, "written", consumed).
    pub fn poll(&mut self) {
        self.console.poll(|_| ());
        let mut buf = vec![0u8; self.host_allowed.min(1 << 16)];
        let n = self.console.with_device(|c| c.peek_output(&mut buf));
        self.host_got.extend_from_slice(&buf[..n]);
        self.console.with_device(|c| c.consume_output(n));
        self.host_allowed -= n;
    }
}
