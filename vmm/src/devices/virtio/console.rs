//! virtio-console with `MULTIPORT` and one generic port, id 1: the guest's
//! `/dev/vport0p1`, perfbed's agent channel (the same device node as QEMU's
//! `virtserialport` gives).
//!
//! Why a generic port and not port 0 as a console (`/dev/hvc0`): Linux's
//! console port writes through `put_chars()`, which spins with interrupts
//! off until the device has used the buffer (`__send_to_port(..,
//! nonblock = false)`), so any back-pressure from the host would stop that
//! vCPU for IPIs (CPU hotplug's `stop_machine`, TLB shootdowns, RCU). A
//! generic port's writer sleeps while the transmit queue is full and is
//! woken by the used-buffer interrupt.
//!
//! Output (port 1's transmitq) goes through a bounded buffer that the host
//! side takes from ([`Console::peek_output`], [`Console::consume_output`]):
//! the device never writes to the host itself, so whoever holds the
//! transport's lock never waits on host I/O. A chain is taken from the
//! queue only while the buffer has room (a chain larger than the room is
//! taken in parts and used once all of it is buffered), so while the host
//! does not read, the guest's writers wait and nothing is dropped. One
//! [`VirtioDevice::process`] call moves at most [`OUTPUT_CAPACITY`] bytes and
//! [`MAX_CHAINS_PER_CALL`] chains per queue. With no host connected the port
//! is closed for the guest (`PORT_OPEN` 0, so its writes wait and its reads
//! see end of file), and buffers already queued are used without being
//! copied (counted as dropped).
//!
//! Against a hostile driver:
//! - the messages owed to the driver are two pending flags (the port's
//!   add, its latest open state), not a queue: a driver that repeats
//!   DEVICE_READY or PORT_READY and never posts control receive buffers
//!   costs nothing ([`MAX_PENDING_CONTROL`]);
//! - a transmit buffer that cannot be read (its address is not guest RAM)
//!   is counted as dropped and the resume point moves past it, so a chain
//!   taken in parts sends each byte at most once; the resume point holds
//!   only for the chain it was taken in ([`ChainPlace`]), so another chain
//!   at that place in the queue is not cut short;
//! - guest addresses are added with checked arithmetic: a descriptor
//!   rewritten between two passes to wrap the address space is a bad
//!   address (its bytes dropped and counted), never an overflow;
//! - a chain is read to at most as many descriptors as its queue has
//!   ([`descriptors`]): only an indirect table, which this device does not
//!   offer, makes one longer.
//!
//! Input is queued here by the event loop and copied into port 1's receive
//! buffers; past [`MAX_PENDING_INPUT`] the event loop stops reading the
//! socket until the guest has taken half of it ([`Console::input_paused`]).

use std::collections::VecDeque;

use virtio_queue::desc::split::Descriptor;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{Address, Bytes, GuestMemoryMmap};

use super::{Progress, VirtioDevice};

pub const VIRTIO_ID_CONSOLE: u32 = 3;
/// `VIRTIO_CONSOLE_F_MULTIPORT`.
pub const FEATURE_MULTIPORT: u64 = 1 << 1;
/// The queues: port 0's receiveq (0, never used: port 0 is never added)
/// and transmitq, the control queues, then port 1's.
const PORT0_TRANSMIT: usize = 1;
const CONTROL_RECEIVE: usize = 2;
const CONTROL_TRANSMIT: usize = 3;
const RECEIVE: usize = 4;
const TRANSMIT: usize = 5;
const QUEUE_SIZES: [u16; 6] = [64, 64, 32, 32, 256, 256];
/// The agent's port.
pub const AGENT_PORT: u32 = 1;
/// Ports the configuration space announces (0 and the agent's).
const MAX_NR_PORTS: u32 = 2;

/// Control events (virtio 1.x §5.3.6.2).
const DEVICE_READY: u16 = 0;
const DEVICE_ADD: u16 = 1;
const PORT_READY: u16 = 3;
const PORT_OPEN: u16 = 6;

/// Guest output held for the host.
pub const OUTPUT_CAPACITY: usize = 64 * 1024;
/// Input held for the guest before the socket is paused.
pub const MAX_PENDING_INPUT: usize = 64 * 1024;
/// Chains handled per queue and call.
pub const MAX_CHAINS_PER_CALL: usize = 256;
/// Largest chunk copied through the VMM at once.
const CHUNK: usize = 4096;
/// Control messages ever owed to the driver at once: the port's add and
/// its open state.
pub const MAX_PENDING_CONTROL: usize = 2;

/// `struct virtio_console_control`: little-endian id, event, value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ControlMessage {
    id: u32,
    event: u16,
    value: u16,
}

impl ControlMessage {
    fn to_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&self.id.to_le_bytes());
        b[4..6].copy_from_slice(&self.event.to_le_bytes());
        b[6..].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    fn from_bytes(b: [u8; 8]) -> ControlMessage {
        ControlMessage {
            id: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            event: u16::from_le_bytes([b[4], b[5]]),
            value: u16::from_le_bytes([b[6], b[7]]),
        }
    }
}

/// The control messages owed to the driver, as flags: repeating a request
/// sets a flag already set. The add goes first (the port must exist before
/// it opens).
#[derive(Debug, Default)]
struct ToDriver {
    add: bool,
    /// The port's latest open state not yet told.
    open: Option<u16>,
}

impl ToDriver {
    fn front(&self) -> Option<ControlMessage> {
        let (event, value) = if self.add {
            (DEVICE_ADD, 0)
        } else {
            (PORT_OPEN, self.open?)
        };
        Some(ControlMessage {
            id: AGENT_PORT,
            event,
            value,
        })
    }

    fn pop_front(&mut self) {
        if self.add {
            self.add = false;
        } else {
            self.open = None;
        }
    }

    fn len(&self) -> usize {
        usize::from(self.add) + usize::from(self.open.is_some())
    }

    fn clear(&mut self) {
        *self = ToDriver::default();
    }
}

/// Which chain a transmit chain taken in parts is: its place in the
/// available ring, its head and the queue's rings. A different chain at
/// the queue's next position (the driver set the queue up anew, or
/// rewrote the entry) starts from its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ChainPlace {
    position: u16,
    head: u16,
    desc_table: u64,
    avail_ring: u64,
}

pub struct Console {
    /// A host takes the output.
    connected: bool,
    /// Guest output not yet taken by the host, at most [`OUTPUT_CAPACITY`].
    buffered: VecDeque<u8>,
    /// The transmit chain taken in parts, and how many of its bytes are
    /// already gone past (buffered, or dropped as unreadable): it resumes
    /// there.
    resume: Option<(ChainPlace, u64)>,
    input: VecDeque<u8>,
    paused: bool,
    /// Control messages waiting for the driver's control receive buffers.
    to_driver: ToDriver,
    port_ready: bool,
    dropped_output: u64,
}

impl Default for Console {
    fn default() -> Self {
        Console::new()
    }
}

impl Console {
    /// A console whose output goes nowhere until [`Console::connect`].
    pub fn new() -> Console {
        Console {
            connected: false,
            buffered: VecDeque::new(),
            resume: None,
            input: VecDeque::new(),
            paused: false,
            to_driver: ToDriver::default(),
            port_ready: false,
            dropped_output: 0,
        }
    }

    /// A host takes the guest's output from now on
    /// ([`Console::peek_output`]).
    pub fn connect(&mut self) {
        self.connected = true;
        if self.port_ready {
            self.tell_driver(PORT_OPEN, 1);
        }
    }

    /// The host side went away: the port is closed for the guest.
    pub fn disconnect(&mut self) {
        if std::mem::take(&mut self.connected) {
            self.dropped_output += self.buffered.len() as u64;
            self.buffered.clear();
            if self.port_ready {
                self.tell_driver(PORT_OPEN, 0);
            }
        }
    }

    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// Queues host input; says whether the event loop should stop reading
    /// (see [`Console::input_paused`]).
    pub fn push_input(&mut self, bytes: &[u8]) -> bool {
        self.input.extend(bytes);
        if self.input.len() >= MAX_PENDING_INPUT {
            self.paused = true;
        }
        self.paused
    }

    /// Whether too much input waits for the guest to read more.
    pub fn input_paused(&self) -> bool {
        self.paused
    }

    /// Whether guest output waits for the host (watch it for writability).
    pub fn output_pending(&self) -> bool {
        self.connected && !self.buffered.is_empty()
    }

    /// Copies the oldest buffered output into `out` without taking it;
    /// returns how many bytes. The host writes them with no lock held, then
    /// says how many it wrote ([`Console::consume_output`]).
    pub fn peek_output(&self, out: &mut [u8]) -> usize {
        let (front, back) = self.buffered.as_slices();
        let n = front.len().min(out.len());
        out[..n].copy_from_slice(&front[..n]);
        let m = back.len().min(out.len() - n);
        out[n..n + m].copy_from_slice(&back[..m]);
        n + m
    }

    /// The host wrote the oldest `n` bytes of the output (at most what
    /// [`Console::peek_output`] gave); they leave the buffer and make room
    /// for more of the guest's chains.
    pub fn consume_output(&mut self, n: usize) {
        let n = n.min(self.buffered.len());
        self.buffered.drain(..n);
    }

    /// Control messages waiting for the driver's buffers (at most
    /// [`MAX_PENDING_CONTROL`]).
    pub fn pending_control(&self) -> usize {
        self.to_driver.len()
    }

    /// Guest output held for the writer (at most [`OUTPUT_CAPACITY`]).
    pub fn buffered_output(&self) -> usize {
        self.buffered.len()
    }

    /// Bytes of guest output dropped for want of a host.
    pub fn dropped_output(&self) -> u64 {
        self.dropped_output
    }

    fn tell_driver(&mut self, event: u16, value: u16) {
        match event {
            DEVICE_ADD => self.to_driver.add = true,
            _ => self.to_driver.open = Some(value),
        }
    }

    /// Moves port 1's output into the buffer within the per-call bounds;
    /// true if it stopped at a bound with more queued and room to take it.
    fn transmit(&mut self, queue: &mut Queue, memory: &GuestMemoryMmap, used: &mut bool) -> bool {
        let mut budget = OUTPUT_CAPACITY;
        let size = queue.size();
        for _ in 0..MAX_CHAINS_PER_CALL {
            let room = OUTPUT_CAPACITY - self.buffered.len();
            if self.connected && (room == 0 || budget == 0) {
                // Full: the host taking output brings us back. Out of budget
                // with room: the caller calls again.
                return room > 0;
            }
            let Some(chain) = queue.pop_descriptor_chain(memory) else {
                return false;
            };
            let head = chain.head_index();
            let place = ChainPlace {
                position: queue.next_avail().wrapping_sub(1),
                head,
                desc_table: queue.desc_table(),
                avail_ring: queue.avail_ring(),
            };
            let taken = match self.resume.take() {
                Some((at, taken)) if at == place => taken,
                _ => 0,
            };
            if !self.connected {
                let len: u64 = descriptors(chain, size, false)
                    .map(|d| u64::from(d.len()))
                    .sum();
                self.dropped_output += len.saturating_sub(taken);
                let _ = queue.add_used(memory, head, 0);
                *used = true;
                continue;
            }
            let limit = room.min(budget);
            let mut copied = 0usize;
            // How far into the chain this pass went: bytes copied and bytes
            // dropped as unreadable alike.
            let mut passed = 0u64;
            let mut skip = taken;
            let mut complete = true;
            let mut chunk = [0u8; CHUNK];
            'descriptors: for desc in descriptors(chain, size, false) {
                let len = u64::from(desc.len());
                if skip >= len {
                    skip -= len;
                    continue;
                }
                let mut left = len - skip;
                let mut addr = desc.addr().checked_add(skip);
                skip = 0;
                while left > 0 {
                    if copied == limit {
                        complete = false;
                        break 'descriptors;
                    }
                    let n = (left as usize).min(CHUNK).min(limit - copied);
                    let read = addr.and_then(|a| memory.read_slice(&mut chunk[..n], a).ok());
                    if read.is_none() {
                        // A bad address (or one that wraps): the rest of
                        // this buffer is dropped, and passed.
                        self.dropped_output += left;
                        passed += left;
                        break;
                    }
                    self.buffered.extend(&chunk[..n]);
                    copied += n;
                    passed += n as u64;
                    addr = addr.and_then(|a| a.checked_add(n as u64));
                    left -= n as u64;
                }
            }
            budget -= copied;
            if complete {
                let _ = queue.add_used(memory, head, 0);
                *used = true;
            } else {
                // The rest stays in the queue: the guest sees back-pressure.
                self.resume = Some((place, taken + passed));
                queue.go_to_previous_position();
            }
        }
        true
    }

    /// Buffers on port 0's transmit queue (the guest has no reason to use
    /// them: port 0 is never added) are used unread.
    fn discard(queue: &mut Queue, memory: &GuestMemoryMmap, used: &mut bool) -> bool {
        for _ in 0..MAX_CHAINS_PER_CALL {
            let Some(chain) = queue.pop_descriptor_chain(memory) else {
                return false;
            };
            let _ = queue.add_used(memory, chain.head_index(), 0);
            *used = true;
        }
        true
    }

    /// Reads the driver's control messages.
    fn read_control(
        &mut self,
        queue: &mut Queue,
        memory: &GuestMemoryMmap,
        used: &mut bool,
    ) -> bool {
        let size = queue.size();
        for _ in 0..MAX_CHAINS_PER_CALL {
            let Some(chain) = queue.pop_descriptor_chain(memory) else {
                return false;
            };
            let head = chain.head_index();
            let mut bytes = [0u8; 8];
            let mut got = 0;
            for desc in descriptors(chain, size, false) {
                let n = (desc.len() as usize).min(8 - got);
                if memory
                    .read_slice(&mut bytes[got..got + n], desc.addr())
                    .is_err()
                {
                    break;
                }
                got += n;
                if got == 8 {
                    break;
                }
            }
            let _ = queue.add_used(memory, head, 0);
            *used = true;
            if got == 8 {
                self.handle_control(ControlMessage::from_bytes(bytes));
            }
        }
        true
    }

    fn handle_control(&mut self, message: ControlMessage) {
        match message.event {
            DEVICE_READY if message.value == 1 => {
                self.tell_driver(DEVICE_ADD, 0);
                // In the same batch as the add: Linux handles both in one
                // work item, so no reader of the new port can see it closed
                // (its read() is end of file until PORT_OPEN 1).
                if self.connected {
                    self.tell_driver(PORT_OPEN, 1);
                }
            }
            PORT_READY if message.id == AGENT_PORT && message.value == 1 => {
                self.port_ready = true;
                if self.connected {
                    self.tell_driver(PORT_OPEN, 1);
                }
            }
            // The guest opening or closing the port, resizes, names,
            // failures and unknown ports: nothing to do.
            _ => {}
        }
    }

    /// Writes waiting control messages into the driver's buffers.
    fn write_control(&mut self, queue: &mut Queue, memory: &GuestMemoryMmap, used: &mut bool) {
        let size = queue.size();
        while let Some(message) = self.to_driver.front() {
            let Some(chain) = queue.pop_descriptor_chain(memory) else {
                return;
            };
            let head = chain.head_index();
            let written = match descriptors(chain, size, true).next() {
                Some(desc)
                    if desc.len() >= 8
                        && memory.write_slice(&message.to_bytes(), desc.addr()).is_ok() =>
                {
                    8
                }
                _ => 0,
            };
            let _ = queue.add_used(memory, head, written);
            *used = true;
            if written == 8 {
                self.to_driver.pop_front();
            }
        }
    }

    /// Copies waiting input into port 1's receive buffers.
    fn receive(&mut self, queue: &mut Queue, memory: &GuestMemoryMmap, used: &mut bool) -> bool {
        let mut chains = 0;
        let size = queue.size();
        while !self.input.is_empty() {
            if chains == MAX_CHAINS_PER_CALL {
                return true;
            }
            let Some(chain) = queue.pop_descriptor_chain(memory) else {
                break;
            };
            chains += 1;
            let head = chain.head_index();
            let mut written = 0u32;
            for desc in descriptors(chain, size, true) {
                let (mut addr, mut room) = (Some(desc.addr()), desc.len() as usize);
                while room > 0 && !self.input.is_empty() {
                    let n = room.min(self.input.len()).min(CHUNK);
                    let (front, _) = self.input.as_slices();
                    let n = n.min(front.len());
                    // A bad address (or one that wraps): skip this buffer.
                    let Some(at) = addr.filter(|a| memory.write_slice(&front[..n], *a).is_ok())
                    else {
                        break;
                    };
                    self.input.drain(..n);
                    addr = at.checked_add(n as u64);
                    room -= n;
                    written += n as u32;
                }
            }
            let _ = queue.add_used(memory, head, written);
            *used = true;
        }
        if self.paused && self.input.len() < MAX_PENDING_INPUT / 2 {
            self.paused = false;
        }
        false
    }
}

/// The descriptors of `chain` the device reads (`write` false) or writes,
/// among its first `queue_size`. No chain of the queue's own table is
/// longer (virtio-queue's walk ends there); only an indirect table is,
/// which this device does not offer (`VIRTIO_F_INDIRECT_DESC`, so the
/// driver must not use one, §2.7.5.3.1) and virtio-queue follows anyway,
/// up to 65535 descriptors: 256 such chains a call would be 16.7 million
/// descriptor reads under the lock the vCPUs take. The rest of such a
/// chain is not read.
fn descriptors(
    chain: DescriptorChain<&GuestMemoryMmap>,
    queue_size: u16,
    write: bool,
) -> impl Iterator<Item = Descriptor> + '_ {
    chain
        .take(usize::from(queue_size))
        .filter(move |d| d.is_write_only() == write)
}

/// The queue at `index` if the driver made it ready and valid.
fn ready_queue<'q>(
    queues: &'q mut [Queue],
    index: usize,
    memory: &GuestMemoryMmap,
) -> Option<&'q mut Queue> {
    queues
        .get_mut(index)
        .filter(|q| q.ready() && q.is_valid(memory))
}

impl VirtioDevice for Console {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_CONSOLE
    }

    fn features(&self) -> u64 {
        FEATURE_MULTIPORT
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // cols (u16), rows (u16), max_nr_ports (u32), emerg_wr (u32).
        let mut config = [0u8; 12];
        config[4..8].copy_from_slice(&MAX_NR_PORTS.to_le_bytes());
        for (i, out) in data.iter_mut().enumerate() {
            *out = usize::try_from(offset)
                .ok()
                .and_then(|o| config.get(o.checked_add(i)?))
                .copied()
                .unwrap_or(0);
        }
    }

    fn process(&mut self, queues: &mut [Queue], memory: &GuestMemoryMmap) -> Progress {
        let mut progress = Progress::default();
        let mut step = |index: usize, work: &mut dyn FnMut(&mut Queue, &mut bool) -> bool| {
            if let Some(q) = ready_queue(queues, index, memory) {
                let mut used = false;
                progress.more |= work(q, &mut used);
                if used {
                    progress.used |= 1 << index;
                }
            }
        };
        step(CONTROL_TRANSMIT, &mut |q, used| {
            self.read_control(q, memory, used)
        });
        step(CONTROL_RECEIVE, &mut |q, used| {
            self.write_control(q, memory, used);
            false
        });
        step(TRANSMIT, &mut |q, used| self.transmit(q, memory, used));
        step(PORT0_TRANSMIT, &mut |q, used| {
            Console::discard(q, memory, used)
        });
        step(RECEIVE, &mut |q, used| self.receive(q, memory, used));
        progress
    }

    fn reset(&mut self) {
        self.input.clear();
        self.paused = false;
        self.to_driver.clear();
        self.port_ready = false;
        self.resume = None;
    }
}

#[cfg(test)]
mod tests;
