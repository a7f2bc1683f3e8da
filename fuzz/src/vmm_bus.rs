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

use arbitrary::Arbitrary;
use perfbed_vmm::devices::virtio::console::OUTPUT_CAPACITY;
use perfbed_vmm::memory::{PERFBED_DEVICE_BASE, VIRTIO_MMIO_BASE};
use vm_memory::{Bytes, GuestAddress};

use crate::vmm_rig::*;

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
    pub live: Option<u8>,
    pub ops: Vec<Op>,
}

fn apply(rig: &mut Rig, op: &Op) {
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
                rig.bus.write(*vcpu, addr, &data);
                if addr == VIRTIO_MMIO_BASE + REG_STATUS && data.iter().all(|b| *b == 0) && len == 4 {
                    rig.last_status = 0;
                }
            } else {
                rig.bus.read(*vcpu, addr, &mut data);
            }
        }
        Op::Negotiate { features_high, features_low, driver_ok } => {
            rig.negotiate(*features_high, *features_low, *driver_ok)
        }
        Op::SetUpQueue { queue, size } => rig.set_up_queue(*queue, *size),
        Op::AddChain { queue, head, descriptors } => rig.add_chain(*queue, *head, descriptors),
        Op::Fill { addr, bytes } => {
            let _ = rig.memory.write_slice(bytes, GuestAddress(u64::from(*addr) % MEMORY));
        }
        Op::Poll => rig.poll(),
        Op::HostInput(bytes) => {
            rig.console.poll(|c| c.push_input(bytes));
        }
        Op::HostReads(n) => {
            rig.host_allowed = usize::from(*n);
            rig.poll();
        }
        Op::Disconnect => rig.console.with_device(|c| c.disconnect()),
        Op::Connect => rig.console.with_device(|c| c.connect()),
    }
}

fn check(rig: &mut Rig, step: usize, op: &Op) {
    let interrupt = rig.read32(REG_INTERRUPT_STATUS);
    assert_eq!(interrupt & !3, 0, "step {step} ({op:?}): interrupt status {interrupt:#x}");
    let status = rig.read32(REG_STATUS);
    assert_eq!(
        status & rig.last_status,
        rig.last_status,
        "step {step} ({op:?}): status went from {:#x} to {status:#x} without a reset",
        rig.last_status
    );
    assert!(
        status & STATUS_DRIVER_OK == 0 || status & STATUS_FEATURES_OK != 0,
        "step {step} ({op:?}): DRIVER_OK without FEATURES_OK ({status:#x})"
    );
    rig.last_status = status;
    let ready = rig.read32(REG_QUEUE_READY);
    assert!(ready <= 1, "step {step}: QueueReady {ready}");
    let buffered = rig.console.with_device(|c| c.buffered_output());
    assert!(buffered <= OUTPUT_CAPACITY, "step {step}: {buffered} bytes buffered");
}

pub fn run(input: &Input) {
    // No serial output here: a small ring.
    let mut rig = Rig::new(1024);
    if let Some(n) = input.live {
        rig.make_live(|_| 1u16 << (n % 9));
        check(&mut rig, 0, &Op::Poll);
    }
    for (step, op) in input.ops.iter().take(512).enumerate() {
        apply(&mut rig, op);
        check(&mut rig, step, op);
    }
}
