//! perfbed-vmm's console paths with an oracle: a live virtio console whose
//! port 1 the guest writes through chains of readable and unreadable
//! buffers, a host that reads slowly, a driver that sends any control
//! message any number of times and posts control buffers or not, and the
//! 8250's transmit register written byte by byte and by `rep outsb`
//! (through the port bus's string I/O), the serial ring drained at any
//! time.
//!
//! Checked after every step:
//! - what the host took of the agent channel is a prefix of the bytes the
//!   guest's readable buffers carried, in order; at the end, with the host
//!   reading freely, it is all of them, once, every chain is used, and the
//!   bytes dropped are exactly the unreadable buffers' lengths;
//! - the serial log is exactly what the guest wrote to the transmit
//!   register, less the bytes a full ring dropped, which a model of the
//!   ring predicts byte for byte (and the count says);
//! - the VMM holds bounded state: the console's output within its
//!   capacity, at most two control messages owed to the driver, the serial
//!   ring within its capacity.

use arbitrary::Arbitrary;
use perfbed_vmm::devices::serial::COM1_BASE;
use perfbed_vmm::devices::virtio::console::{MAX_PENDING_CONTROL, OUTPUT_CAPACITY};
use std::collections::VecDeque;
use vm_memory::{Bytes, GuestAddress};

use crate::vmm_rig::{Descriptor, Rig, MEMORY};

const CONTROL_RECEIVE: u8 = 2;
const CONTROL_TRANSMIT: u8 = 3;
const TRANSMIT: u8 = 5;
/// Where transmit data lives (a ring of its own, reused once used).
const DATA: u64 = 0x8_0000;
const DATA_LEN: u64 = MEMORY - DATA;
/// Control messages sent and control buffers posted.
const CONTROL_DATA: u64 = 0x6_0000;
const CONTROL_BUFFERS: u64 = 0x6_1000;
/// Unreadable: past the end of guest memory.
const NOWHERE: u64 = 0x4000_0000;
/// The serial ring in this rig: small, so that it fills.
const SERIAL_RING: usize = 1024;

#[derive(Arbitrary, Debug, Clone)]
pub struct Part {
    len: u16,
    unreadable: bool,
}

#[derive(Arbitrary, Debug, Clone)]
pub enum Op {
    /// The guest writes one chain of up to 4 buffers on port 1.
    Transmit(Vec<Part>),
    /// The host reads up to this many bytes, then blocks again.
    HostReads(u16),
    /// The event loop runs the device.
    Poll,
    /// The driver sends a control message `times` times.
    Control { id: u32, event: u16, value: u16, times: u8 },
    /// The driver posts control receive buffers.
    ControlBuffers(u8),
    /// The guest writes the transmit register: one `rep outsb`, or one
    /// `outb` a byte.
    Serial { bytes: Vec<u8>, string: bool },
    /// The event loop drains the serial ring.
    SerialDrain,
}

#[derive(Arbitrary, Debug)]
pub struct Input {
    pub ops: Vec<Op>,
}

/// A chain on the transmit queue not used yet.
struct InFlight {
    descriptors: u16,
    data: u64,
}

struct Harness {
    rig: Rig,
    /// The bytes the readable buffers carried, in order.
    expected: Vec<u8>,
    unreadable: u64,
    next_byte: u64,
    in_flight: VecDeque<InFlight>,
    used_seen: u16,
    next_desc: u16,
    /// Transmit data: next free offset and bytes in flight.
    data_at: u64,
    data_held: u64,
    /// The serial model: what the log should get, what the ring holds.
    serial_expected: Vec<u8>,
    serial_held: usize,
    serial_dropped: u64,
}

impl Harness {
    fn new() -> Harness {
        let mut rig = Rig::new(SERIAL_RING);
        rig.make_live(|_| 256);
        Harness {
            rig,
            expected: Vec::new(),
            unreadable: 0,
            next_byte: 0,
            in_flight: VecDeque::new(),
            used_seen: 0,
            next_desc: 0,
            data_at: 0,
            data_held: 0,
            serial_expected: Vec::new(),
            serial_held: 0,
            serial_dropped: 0,
        }
    }

    /// Frees what the device used (it uses transmit chains in order).
    fn reap(&mut self) {
        let used = self.rig.used_idx(TRANSMIT);
        while self.used_seen != used {
            let done = self.in_flight.pop_front().expect("the device used a chain never made available");
            self.data_held -= done.data;
            self.used_seen = self.used_seen.wrapping_add(1);
        }
    }

    fn transmit(&mut self, parts: &[Part]) {
        self.reap();
        let parts = &parts[..parts.len().min(4)];
        if parts.is_empty() {
            return;
        }
        let descs_held: u16 = self.in_flight.iter().map(|c| c.descriptors).sum();
        let size = self.rig.sizes[usize::from(TRANSMIT)];
        let len: u64 = parts.iter().filter(|p| !p.unreadable).map(|p| u64::from(p.len % 16384)).sum();
        if descs_held + parts.len() as u16 > size || self.data_held + len + 16384 > DATA_LEN {
            return; // the guest's writer would wait
        }
        let mut descriptors = Vec::new();
        let mut data = 0;
        for part in parts {
            let n = u64::from(part.len % 16384);
            if part.unreadable {
                descriptors.push(Descriptor { addr: (NOWHERE + n) as u32, len: n as u32, write: false });
                self.unreadable += n;
                continue;
            }
            if self.data_at + n > DATA_LEN {
                // Wrap the data ring (what is skipped counts as held).
                data += DATA_LEN - self.data_at;
                self.data_at = 0;
            }
            let bytes: Vec<u8> = (0..n).map(|i| pattern(self.next_byte + i)).collect();
            self.next_byte += n;
            self.rig.memory.write_slice(&bytes, GuestAddress(DATA + self.data_at)).unwrap();
            descriptors.push(Descriptor { addr: (DATA + self.data_at) as u32, len: n as u32, write: false });
            self.expected.extend_from_slice(&bytes);
            self.data_at += n;
            data += n;
        }
        let head = self.next_desc;
        self.rig.add_chain(TRANSMIT, head, &descriptors);
        self.next_desc = (head + descriptors.len() as u16) % size;
        self.data_held += data;
        self.in_flight.push_back(InFlight { descriptors: descriptors.len() as u16, data });
    }

    /// Chains on `queue` made available and not used yet.
    fn outstanding(&self, queue: u8) -> u16 {
        self.rig.avail_idx(queue).wrapping_sub(self.rig.used_idx(queue))
    }

    fn control(&mut self, id: u32, event: u16, value: u16, times: u8) {
        let mut message = [0u8; 8];
        message[..4].copy_from_slice(&id.to_le_bytes());
        message[4..6].copy_from_slice(&event.to_le_bytes());
        message[6..].copy_from_slice(&value.to_le_bytes());
        self.rig.memory.write_slice(&message, GuestAddress(CONTROL_DATA)).unwrap();
        let size = self.rig.sizes[usize::from(CONTROL_TRANSMIT)];
        for _ in 0..times {
            if self.outstanding(CONTROL_TRANSMIT) >= size {
                self.rig.poll();
            }
            // One descriptor a chain, at the slot the avail index names.
            let head = self.rig.avail_idx(CONTROL_TRANSMIT) % size;
            self.rig.add_chain(
                CONTROL_TRANSMIT,
                head,
                &[Descriptor { addr: CONTROL_DATA as u32, len: 8, write: false }],
            );
        }
    }

    fn control_buffers(&mut self, n: u8) {
        let size = self.rig.sizes[usize::from(CONTROL_RECEIVE)];
        for _ in 0..n {
            if self.outstanding(CONTROL_RECEIVE) >= size {
                return;
            }
            let head = self.rig.avail_idx(CONTROL_RECEIVE) % size;
            let addr = CONTROL_BUFFERS + 8 * u64::from(head);
            self.rig.add_chain(CONTROL_RECEIVE, head, &[Descriptor { addr: addr as u32, len: 8, write: true }]);
        }
    }

    fn serial(&mut self, bytes: &[u8], string: bool) {
        let bytes = &bytes[..bytes.len().min(4096)];
        if string {
            self.rig.ports.write_string(0, COM1_BASE, 1, bytes);
        } else {
            for b in bytes {
                self.rig.ports.write(0, COM1_BASE, &[*b]);
            }
        }
        for &b in bytes {
            if self.serial_held == SERIAL_RING {
                self.serial_dropped += 1;
            } else {
                self.serial_held += 1;
                self.serial_expected.push(b);
            }
        }
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Transmit(parts) => self.transmit(parts),
            Op::HostReads(n) => {
                self.rig.host_allowed = usize::from(*n);
                self.rig.poll();
            }
            Op::Poll => self.rig.poll(),
            Op::Control { id, event, value, times } => self.control(*id, *event, *value, *times),
            Op::ControlBuffers(n) => self.control_buffers(*n),
            Op::Serial { bytes, string } => self.serial(bytes, *string),
            Op::SerialDrain => {
                self.rig.serial.drain();
                self.serial_held = 0;
            }
        }
    }

    fn check(&mut self, step: usize, op: &Op) {
        let got = &self.rig.host_got;
        assert!(
            got.len() <= self.expected.len() && got[..] == self.expected[..got.len()],
            "step {step} ({op:?}): the host got {} bytes that are not the guest's first {}",
            got.len(),
            got.len()
        );
        let (buffered, control) = self.rig.console.with_device(|c| (c.buffered_output(), c.pending_control()));
        assert!(buffered <= OUTPUT_CAPACITY, "step {step}: {buffered} bytes buffered");
        assert!(control <= MAX_PENDING_CONTROL, "step {step}: {control} control messages held");
        assert!(self.rig.serial.pending_output() <= SERIAL_RING);
        assert_eq!(self.rig.serial.dropped_output(), self.serial_dropped, "step {step}: serial bytes dropped");
        let log = self.rig.serial_log.0.lock().unwrap();
        let logged = log.len();
        assert!(
            logged <= self.serial_expected.len() && log[..] == self.serial_expected[..logged],
            "step {step} ({op:?}): the serial log is not what the guest wrote"
        );
    }

    /// The host reads freely until every chain is used.
    fn finish(&mut self) {
        self.rig.host_allowed = usize::MAX;
        for _ in 0..64 {
            self.rig.poll();
            self.reap();
            if self.in_flight.is_empty() && self.rig.console.with_device(|c| c.buffered_output()) == 0 {
                break;
            }
        }
        assert!(self.in_flight.is_empty(), "{} chains never used", self.in_flight.len());
        assert!(
            self.rig.host_got == self.expected,
            "the host got {} bytes of {}",
            self.rig.host_got.len(),
            self.expected.len()
        );
        let dropped = self.rig.console.with_device(|c| c.dropped_output());
        assert_eq!(dropped, self.unreadable, "bytes dropped: only the unreadable buffers'");
        self.rig.serial.drain();
        assert!(*self.rig.serial_log.0.lock().unwrap() == self.serial_expected, "the serial log at the end");
    }
}

/// The `i`th byte the guest sends: not periodic in any small step, so a
/// byte sent twice or skipped shows.
fn pattern(i: u64) -> u8 {
    (i ^ (i >> 8) ^ (i >> 16)).wrapping_mul(131) as u8
}

pub fn run(input: &Input) {
    let mut harness = Harness::new();
    for (step, op) in input.ops.iter().take(256).enumerate() {
        harness.apply(op);
        harness.check(step, op);
    }
    harness.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-written session: chains with unreadable buffers that fill the
    /// console's buffer (so they are taken in parts) under a slow host,
    /// control floods without and then with receive buffers, and serial
    /// output past the ring's size between drains.
    fn session() -> Vec<Op> {
        let part = |len: u16, unreadable| Part { len, unreadable };
        let mut ops = Vec::new();
        for i in 0..12u16 {
            ops.push(Op::Transmit(vec![part(300 + i, true), part(14000 + i * 7, false), part(17, i % 3 == 0)]));
            ops.push(Op::Poll);
            ops.push(Op::HostReads(3000));
            ops.push(Op::Control { id: 0, event: 0, value: 1, times: 40 });
            ops.push(Op::Serial { bytes: vec![b'a' + i as u8; 300], string: i % 2 == 0 });
        }
        ops.push(Op::Control { id: 1, event: 3, value: 1, times: 200 });
        ops.push(Op::ControlBuffers(8));
        ops.push(Op::Poll);
        ops.push(Op::SerialDrain);
        ops.push(Op::Serial { bytes: b"after the drain\n".to_vec(), string: true });
        ops
    }

    #[test]
    fn a_hand_written_session_passes_the_oracle() {
        let ops = session();
        let mut harness = Harness::new();
        for (step, op) in ops.iter().enumerate() {
            harness.apply(op);
            harness.check(step, op);
        }
        assert!(harness.serial_dropped > 0, "the serial ring filled");
        assert!(harness.unreadable > 0);
        harness.finish();
        assert_eq!(harness.rig.used_idx(CONTROL_RECEIVE), 2, "the add and the open, once each");
    }
}
