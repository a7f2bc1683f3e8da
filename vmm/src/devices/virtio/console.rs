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
//! Output (port 1's transmitq) goes through a bounded buffer to a
//! non-blocking writer: a chain is taken from the queue only while the
//! buffer has room (a chain larger than the room is taken in parts and
//! used once all of it is buffered), so while the host does not read, the
//! guest's writers wait and nothing is dropped. One [`VirtioDevice::process`]
//! call moves at most [`OUTPUT_CAPACITY`] bytes and [`MAX_CHAINS_PER_CALL`]
//! chains per queue. With no host connected the port is closed for the guest
//! (`PORT_OPEN` 0, so its writes wait and its reads see end of file), and
//! buffers already queued are used without being copied (counted as
//! dropped).
//!
//! Input is queued here by the event loop and copied into port 1's receive
//! buffers; past [`MAX_PENDING_INPUT`] the event loop stops reading the
//! socket until the guest has taken half of it ([`Console::input_paused`]).

use std::collections::VecDeque;
use std::io::{ErrorKind, Write};

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

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

pub struct Console {
    output: Option<Box<dyn Write + Send>>,
    /// Guest output not yet taken by the writer, at most [`OUTPUT_CAPACITY`].
    buffered: VecDeque<u8>,
    /// Bytes of the transmit chain at the queue's next position already in
    /// `buffered` (a chain taken in parts).
    taken_of_next: u64,
    input: VecDeque<u8>,
    paused: bool,
    /// Control messages waiting for the driver's control receive buffers.
    to_driver: VecDeque<ControlMessage>,
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
            output: None,
            buffered: VecDeque::new(),
            taken_of_next: 0,
            input: VecDeque::new(),
            paused: false,
            to_driver: VecDeque::new(),
            port_ready: false,
            dropped_output: 0,
        }
    }

    /// Where the guest's output goes from now on: a writer that never blocks
    /// (a non-blocking socket; `WouldBlock` means "later").
    pub fn connect(&mut self, output: Box<dyn Write + Send>) {
        self.output = Some(output);
        if self.port_ready {
            self.tell_driver(PORT_OPEN, 1);
        }
    }

    /// The host side went away: the port is closed for the guest.
    pub fn disconnect(&mut self) {
        if self.output.take().is_some() {
            self.dropped_output += self.buffered.len() as u64;
            self.buffered.clear();
            if self.port_ready {
                self.tell_driver(PORT_OPEN, 0);
            }
        }
    }

    pub fn is_connected(&self) -> bool {
        self.output.is_some()
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

    /// Whether guest output waits for the writer (watch it for writability).
    pub fn output_pending(&self) -> bool {
        self.output.is_some() && !self.buffered.is_empty()
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
        self.to_driver.push_back(ControlMessage { id: AGENT_PORT, event, value });
    }

    /// Writes what the writer takes now.
    fn flush_output(&mut self) {
        while !self.buffered.is_empty() {
            let Some(out) = &mut self.output else { return };
            let (front, _) = self.buffered.as_slices();
            match out.write(front) {
                Ok(0) => return self.disconnect(),
                Ok(n) => drop(self.buffered.drain(..n)),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return self.disconnect(),
            }
        }
    }

    /// Moves port 1's output into the buffer (and on to the writer) within
    /// the per-call bounds; true if it stopped at a bound with more queued.
    fn transmit(&mut self, queue: &mut Queue, memory: &GuestMemoryMmap, used: &mut bool) -> bool {
        let mut budget = OUTPUT_CAPACITY;
        for _ in 0..MAX_CHAINS_PER_CALL {
            self.flush_output();
            let room = OUTPUT_CAPACITY - self.buffered.len();
            if self.output.is_some() && (room == 0 || budget == 0) {
                // Full: the writer's readiness brings us back. Out of budget
                // with room: the caller calls again.
                return room > 0;
            }
            let Some(chain) = queue.pop_descriptor_chain(memory) else {
                return false;
            };
            let head = chain.head_index();
            if self.output.is_none() {
                let len: u64 = chain.readable().map(|d| u64::from(d.len())).sum();
                self.dropped_output += len.saturating_sub(self.taken_of_next);
                self.taken_of_next = 0;
                let _ = queue.add_used(memory, head, 0);
                *used = true;
                continue;
            }
            let limit = room.min(budget);
            let mut copied = 0usize;
            let mut skip = self.taken_of_next;
            let mut complete = true;
            let mut chunk = [0u8; CHUNK];
            'descriptors: for desc in chain.readable() {
                let len = u64::from(desc.len());
                if skip >= len {
                    skip -= len;
                    continue;
                }
                let (mut addr, mut left) = (desc.addr().0 + skip, len - skip);
                skip = 0;
                while left > 0 {
                    if copied == limit {
                        complete = false;
                        break 'descriptors;
                    }
                    let n = (left as usize).min(CHUNK).min(limit - copied);
                    if memory.read_slice(&mut chunk[..n], GuestAddress(addr)).is_err() {
                        // A bad address: the rest of this buffer is skipped.
                        self.dropped_output += left;
                        break;
                    }
                    self.buffered.extend(&chunk[..n]);
                    copied += n;
                    addr += n as u64;
                    left -= n as u64;
                }
            }
            budget -= copied;
            if complete {
                self.taken_of_next = 0;
                let _ = queue.add_used(memory, head, 0);
                *used = true;
            } else {
                // The rest stays in the queue: the guest sees back-pressure.
                self.taken_of_next += copied as u64;
                queue.go_to_previous_position();
            }
        }
        self.flush_output();
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
    fn read_control(&mut self, queue: &mut Queue, memory: &GuestMemoryMmap, used: &mut bool) -> bool {
        for _ in 0..MAX_CHAINS_PER_CALL {
            let Some(chain) = queue.pop_descriptor_chain(memory) else {
                return false;
            };
            let head = chain.head_index();
            let mut bytes = [0u8; 8];
            let mut got = 0;
            for desc in chain.readable() {
                let n = (desc.len() as usize).min(8 - got);
                if memory.read_slice(&mut bytes[got..got + n], desc.addr()).is_err() {
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
                self.to_driver.push_back(ControlMessage { id: AGENT_PORT, event: DEVICE_ADD, value: 0 });
                // In the same batch as the add: Linux handles both in one
                // work item, so no reader of the new port can see it closed
                // (its read() is end of file until PORT_OPEN 1).
                if self.output.is_some() {
                    self.tell_driver(PORT_OPEN, 1);
                }
            }
            PORT_READY if message.id == AGENT_PORT && message.value == 1 => {
                self.port_ready = true;
                if self.output.is_some() {
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
        while let Some(message) = self.to_driver.front().copied() {
            let Some(chain) = queue.pop_descriptor_chain(memory) else {
                return;
            };
            let head = chain.head_index();
            let written = match chain.writable().next() {
                Some(desc) if desc.len() >= 8 && memory.write_slice(&message.to_bytes(), desc.addr()).is_ok() => 8,
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
            for desc in chain.writable() {
                let (mut addr, mut room) = (desc.addr().0, desc.len() as usize);
                while room > 0 && !self.input.is_empty() {
                    let n = room.min(self.input.len()).min(CHUNK);
                    let (front, _) = self.input.as_slices();
                    let n = n.min(front.len());
                    if memory.write_slice(&front[..n], GuestAddress(addr)).is_err() {
                        break; // a bad address: skip this buffer
                    }
                    self.input.drain(..n);
                    addr += n as u64;
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

/// The queue at `index` if the driver made it ready and valid.
fn ready_queue<'q>(queues: &'q mut [Queue], index: usize, memory: &GuestMemoryMmap) -> Option<&'q mut Queue> {
    queues.get_mut(index).filter(|q| q.ready() && q.is_valid(memory))
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
            *out = usize::try_from(offset).ok().and_then(|o| config.get(o.checked_add(i)?)).copied().unwrap_or(0);
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
        step(CONTROL_TRANSMIT, &mut |q, used| self.read_control(q, memory, used));
        step(CONTROL_RECEIVE, &mut |q, used| {
            self.write_control(q, memory, used);
            false
        });
        step(TRANSMIT, &mut |q, used| self.transmit(q, memory, used));
        step(PORT0_TRANSMIT, &mut |q, used| Console::discard(q, memory, used));
        step(RECEIVE, &mut |q, used| self.receive(q, memory, used));
        progress
    }

    fn reset(&mut self) {
        self.input.clear();
        self.paused = false;
        self.to_driver.clear();
        self.port_ready = false;
        self.taken_of_next = 0;
    }
}

#[cfg(test)]
mod tests;
