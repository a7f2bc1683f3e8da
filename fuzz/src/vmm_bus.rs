//! perfbed-vmm's guest-facing code under any sequence of MMIO accesses from
//! any vCPU: the MMIO bus with the monitoring device and the virtio-mmio
//! transport (the console behind it) at their real addresses, over guest
//! memory whose rings, descriptor chains and buffers the input writes, with
//! the event loop's part interleaved (polls, host input, a host that reads
//! slowly, goes away, comes back).
//!
//! Besides "no panic, no hang", checked after every step:
//! - the transport's interrupt status holds only the used-ring and
//!   configuration bits, QueueReady reads 0 or 1;
//! - the device status only grows between two resets (the driver's writes
//!   cannot clear a bit) and reads 0 after one;
//! - DRIVER_OK is never set without FEATURES_OK;
//! - the console's buffered output never exceeds its bound.
//!
//! The harness drives the rings the way a driver would when asked
//! ([`Op::SetUpQueue`], [`Op::AddChain`]), and lets raw accesses and
//! memory writes break that at will.

use std::io::{ErrorKind, Write};
use std::sync::{Arc, Mutex};

use arbitrary::Arbitrary;
use perfbed_device::{DeviceConfig, SharedDevice};
use perfbed_vmm::devices::bus::Bus;
use perfbed_vmm::devices::perfbed::PerfbedMmio;
use perfbed_vmm::devices::virtio::console::{Console, OUTPUT_CAPACITY};
use perfbed_vmm::devices::virtio::mmio::MmioTransport;
use perfbed_vmm::devices::virtio::Interrupt;
use perfbed_vmm::memory::{PERFBED_DEVICE_BASE, VIRTIO_MMIO_BASE, VIRTIO_MMIO_SIZE};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

const MEMORY: u64 = 1 << 20;
/// Queue `q`'s rings (as [`Op::SetUpQueue`] places them).
const RINGS: u64 = 0x1_0000;
const RING_STEP: u64 = 0x8000;
const QUEUES: u8 = 6;

const REG_QUEUE_SEL: u64 = 0x30;
const REG_QUEUE_NUM: u64 = 0x38;
const REG_QUEUE_READY: u64 = 0x44;
const REG_QUEUE_NOTIFY: u64 = 0x50;
const REG_INTERRUPT_STATUS: u64 = 0x60;
const REG_STATUS: u64 = 0x70;
const REG_QUEUE_DESC_LOW: u64 = 0x80;
const REG_QUEUE_DRIVER_LOW: u64 = 0x90;
const REG_QUEUE_DEVICE_LOW: u64 = 0xa0;
const REG_DRIVER_FEATURES: u64 = 0x20;
const REG_DRIVER_FEATURES_SEL: u64 = 0x24;
const STATUS_DRIVER_OK: u32 = 4;
const STATUS_FEATURES_OK: u32 = 8;

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Region {
    Perfbed,
    Virtio,
    /// Anywhere on the bus.
    Far(u64),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Size {
    Four,
    Eight,
    Any(u8),
}

#[derive(Arbitrary, Debug, Clone)]
pub struct Descriptor {
    addr: u32,
    len: u32,
    write: bool,
}

#[derive(Arbitrary, Debug, Clone)]
pub enum Op {
    /// A raw access.
    Mmio { vcpu: u32, region: Region, offset: u16, size: Size, write: bool, value: u64 },
    /// The driver's negotiation (ACKNOWLEDGE, DRIVER, features, FEATURES_OK),
    /// then DRIVER_OK if asked.
    Negotiate { features_high: u32, features_low: u32, driver_ok: bool },
    /// Queue `queue` of `size` entries at its rings' place, made ready.
    SetUpQueue { queue: u8, size: u16 },
    /// A chain on queue `queue` at descriptor `head`, made available and
    /// notified.
    AddChain { queue: u8, head: u16, descriptors: Vec<Descriptor> },
    /// Raw guest memory.
    Fill { addr: u32, bytes: Vec<u8> },
    /// The event loop runs the device.
    Poll,
    /// Host input arrives.
    HostInput(Vec<u8>),
    /// The host reads up to this many bytes, then blocks again.
    HostReads(u16),
    Disconnect,
    Connect,
}

#[derive(Arbitrary, Debug)]
pub struct Input {
    /// Start from a live device, as Linux leaves it: every queue of
    /// `1 << (n % 9)` entries (the console's maxima cap some), DRIVER_OK.
    live: Option<u8>,
    ops: Vec<Op>,
}

/// A host that takes what it is allowed to, and says WouldBlock after.
#[derive(Clone, Default)]
struct Host {
    allowed: Arc<Mutex<usize>>,
}

impl Write for Host {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut allowed = self.allowed.lock().unwrap();
        if *allowed == 0 {
            return Err(ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(*allowed);
        *allowed -= n;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Rig {
    memory: GuestMemoryMmap,
    bus: Bus,
    console: Arc<MmioTransport<Console>>,
    host: Host,
    last_status: u32,
}

impl Rig {
    fn new() -> Rig {
        let memory = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEMORY as usize)]).unwrap();
        let interrupt = Interrupt::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
        let console = Arc::new(MmioTransport::new(Console::new(), memory.clone(), interrupt).unwrap());
        let config = DeviceConfig { trace_capacity: 64, ..DeviceConfig::default() };
        let device = SharedDevice::new(config).unwrap();
        let mut bus = Bus::new("MMIO");
        bus.insert("perfbed device", PERFBED_DEVICE_BASE, device.size(), Arc::new(PerfbedMmio::new(device))).unwrap();
        bus.insert("virtio console", VIRTIO_MMIO_BASE, VIRTIO_MMIO_SIZE, console.clone()).unwrap();
        let host = Host::default();
        console.with_device(|c| c.connect(Box::new(host.clone())));
        Rig { memory, bus, console, host, last_status: 0 }
    }

    fn read32(&self, offset: u64) -> u32 {
        let mut data = [0u8; 4];
        self.bus.read(0, VIRTIO_MMIO_BASE + offset, &mut data);
        u32::from_le_bytes(data)
    }

    fn write32(&mut self, offset: u64, value: u32) {
        self.bus.write(0, VIRTIO_MMIO_BASE + offset, &value.to_le_bytes());
        if offset == REG_STATUS && value == 0 {
            self.last_status = 0;
        }
    }

    fn rings(queue: u8) -> u64 {
        RINGS + u64::from(queue % QUEUES) * RING_STEP
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Mmio { vcpu, region, offset, size, write, value } => {
                let addr = match region {
                    Region::Perfbed => PERFBED_DEVICE_BASE + u64::from(*offset),
                    Region::Virtio => VIRTIO_MMIO_BASE + u64::from(*offset % 0x200),
                    Region::Far(a) => *a,
                };
                let len = match size {
                    Size::Four => 4,
                    Size::Eight => 8,
                    Size::Any(n) => usize::from(*n % 17),
                };
                let mut data = vec![0u8; len];
                if *write {
                    for (d, b) in data.iter_mut().zip(value.to_le_bytes().iter().cycle()) {
                        *d = *b;
                    }
                    self.bus.write(*vcpu, addr, &data);
                    if addr == VIRTIO_MMIO_BASE + REG_STATUS && data.iter().all(|b| *b == 0) && len == 4 {
                        self.last_status = 0;
                    }
                } else {
                    self.bus.read(*vcpu, addr, &mut data);
                }
            }
            Op::Negotiate { features_high, features_low, driver_ok } => {
                self.write32(REG_STATUS, 1);
                self.write32(REG_STATUS, 3);
                self.write32(REG_DRIVER_FEATURES_SEL, 1);
                self.write32(REG_DRIVER_FEATURES, *features_high);
                self.write32(REG_DRIVER_FEATURES_SEL, 0);
                self.write32(REG_DRIVER_FEATURES, *features_low);
                self.write32(REG_STATUS, 3 | STATUS_FEATURES_OK);
                if *driver_ok {
                    self.write32(REG_STATUS, 3 | STATUS_FEATURES_OK | STATUS_DRIVER_OK);
                }
            }
            Op::SetUpQueue { queue, size } => {
                let base = Rig::rings(*queue);
                self.write32(REG_QUEUE_SEL, u32::from(*queue));
                self.write32(REG_QUEUE_NUM, u32::from(*size));
                self.write32(REG_QUEUE_DESC_LOW, base as u32);
                self.write32(REG_QUEUE_DRIVER_LOW, (base + 0x1000) as u32);
                self.write32(REG_QUEUE_DEVICE_LOW, (base + 0x2000) as u32);
                self.write32(REG_QUEUE_READY, 1);
            }
            Op::AddChain { queue, head, descriptors } => self.add_chain(*queue, *head, descriptors),
            Op::Fill { addr, bytes } => {
                let _ = self.memory.write_slice(bytes, GuestAddress(u64::from(*addr) % MEMORY));
            }
            Op::Poll => {
                self.console.poll(|_| ());
            }
            Op::HostInput(bytes) => {
                self.console.poll(|c| c.push_input(bytes));
            }
            Op::HostReads(n) => {
                *self.host.allowed.lock().unwrap() = usize::from(*n);
                self.console.poll(|_| ());
            }
            Op::Disconnect => self.console.with_device(|c| c.disconnect()),
            Op::Connect => {
                let host = self.host.clone();
                self.console.with_device(|c| c.connect(Box::new(host)));
            }
        }
    }

    /// Writes the chain's descriptors from `head` on (wrapping at 256),
    /// puts `head` in the available ring and notifies.
    fn add_chain(&mut self, queue: u8, head: u16, descriptors: &[Descriptor]) {
        let queue = queue % QUEUES;
        let base = Rig::rings(queue);
        let count = descriptors.len().min(16);
        for (i, d) in descriptors.iter().take(count).enumerate() {
            let index = (usize::from(head) + i) % 256;
            let next = ((usize::from(head) + i + 1) % 256) as u16;
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
        let idx: u16 = self.memory.read_obj(GuestAddress(avail + 2)).map(u16::from_le).unwrap_or(0);
        let slot = avail + 4 + 2 * u64::from(idx % 256);
        let _ = self.memory.write_obj(head.to_le(), GuestAddress(slot));
        let _ = self.memory.write_obj(idx.wrapping_add(1).to_le(), GuestAddress(avail + 2));
        self.write32(REG_QUEUE_NOTIFY, u32::from(queue));
    }

    fn check(&mut self, step: usize, op: &Op) {
        let interrupt = self.read32(REG_INTERRUPT_STATUS);
        assert_eq!(interrupt & !3, 0, "step {step} ({op:?}): interrupt status {interrupt:#x}");
        let status = self.read32(REG_STATUS);
        assert_eq!(
            status & self.last_status,
            self.last_status,
            "step {step} ({op:?}): status went from {:#x} to {status:#x} without a reset",
            self.last_status
        );
        assert!(
            status & STATUS_DRIVER_OK == 0 || status & STATUS_FEATURES_OK != 0,
            "step {step} ({op:?}): DRIVER_OK without FEATURES_OK ({status:#x})"
        );
        self.last_status = status;
        let ready = self.read32(REG_QUEUE_READY);
        assert!(ready <= 1, "step {step}: QueueReady {ready}");
        let buffered = self.console.with_device(|c| c.buffered_output());
        assert!(buffered <= OUTPUT_CAPACITY, "step {step}: {buffered} bytes buffered");
    }
}

pub fn run(input: &Input) {
    let mut rig = Rig::new();
    if let Some(n) = input.live {
        let size = 1u16 << (n % 9);
        rig.apply(&Op::Negotiate { features_high: 1, features_low: 1 << 1, driver_ok: false });
        for queue in 0..QUEUES {
            rig.apply(&Op::SetUpQueue { queue, size });
        }
        rig.write32(REG_STATUS, 3 | STATUS_FEATURES_OK | STATUS_DRIVER_OK);
        rig.check(0, &Op::Poll);
    }
    for (step, op) in input.ops.iter().take(512).enumerate() {
        rig.apply(op);
        rig.check(step, op);
    }
}
