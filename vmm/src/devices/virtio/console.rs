//! virtio-console with one port (no `MULTIPORT`): the guest's `/dev/hvc0`,
//! perfbed's agent channel.
//!
//! Guest output (transmitq) goes to the backend writer at once. Host input
//! is queued here by the event loop and copied into the guest's receive
//! buffers as they become available. When too much input waits, the event
//! loop stops reading the socket until the guest catches up and the device
//! signals `resume`.

use std::collections::VecDeque;
use std::io::Write;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::{Interrupt, VirtioDevice};

pub const VIRTIO_ID_CONSOLE: u32 = 3;
const RECEIVE_QUEUE: usize = 0;
const TRANSMIT_QUEUE: usize = 1;
const QUEUE_SIZE: u16 = 256;
/// Input held for the guest before the socket is paused.
pub const MAX_PENDING_INPUT: usize = 64 * 1024;
/// Largest chunk copied through the VMM at once.
const CHUNK: usize = 4096;

pub struct Console {
    output: Option<Box<dyn Write + Send>>,
    input: VecDeque<u8>,
    paused: bool,
    resume: EventFd,
    dropped_output: u64,
}

impl Console {
    /// A console whose output goes nowhere until [`Console::connect`];
    /// `resume` is written when paused input can flow again.
    pub fn new(resume: EventFd) -> Console {
        Console { output: None, input: VecDeque::new(), paused: false, resume, dropped_output: 0 }
    }

    /// Where the guest's output goes from now on.
    pub fn connect(&mut self, output: Box<dyn Write + Send>) {
        self.output = Some(output);
    }

    /// The host side went away: guest output is dropped from now on.
    pub fn disconnect(&mut self) {
        self.output = None;
    }

    /// Queues host input; says whether the event loop should stop reading
    /// until `resume` fires.
    pub fn push_input(&mut self, bytes: &[u8]) -> bool {
        self.input.extend(bytes);
        if self.input.len() >= MAX_PENDING_INPUT {
            self.paused = true;
        }
        self.paused
    }

    /// Bytes of guest output dropped for want of a host.
    pub fn dropped_output(&self) -> u64 {
        self.dropped_output
    }

    fn transmit(&mut self, queue: &mut Queue, memory: &GuestMemoryMmap) -> bool {
        let mut used = false;
        let mut chunk = [0u8; CHUNK];
        while let Some(chain) = queue.pop_descriptor_chain(memory) {
            let head = chain.head_index();
            for desc in chain.readable() {
                let (mut addr, mut left) = (desc.addr().0, desc.len() as usize);
                while left > 0 {
                    let n = left.min(CHUNK);
                    if memory.read_slice(&mut chunk[..n], GuestAddress(addr)).is_err() {
                        break; // a bad address: skip the rest of the buffer
                    }
                    self.emit(&chunk[..n]);
                    addr += n as u64;
                    left -= n;
                }
            }
            let _ = queue.add_used(memory, head, 0);
            used = true;
        }
        if let Some(out) = &mut self.output {
            if out.flush().is_err() {
                self.output = None;
            }
        }
        used
    }

    fn emit(&mut self, bytes: &[u8]) {
        let written = match &mut self.output {
            Some(out) => out.write_all(bytes).is_ok(),
            None => false,
        };
        if !written {
            self.output = None;
            self.dropped_output += bytes.len() as u64;
        }
    }

    fn receive(&mut self, queue: &mut Queue, memory: &GuestMemoryMmap) -> bool {
        let mut used = false;
        while !self.input.is_empty() {
            let Some(chain) = queue.pop_descriptor_chain(memory) else { break };
            let head = chain.head_index();
            let mut written = 0u32;
            for desc in chain.writable() {
                let (mut addr, mut room) = (desc.addr().0, desc.len() as usize);
                while room > 0 && !self.input.is_empty() {
                    let n = room.min(self.input.len()).min(CHUNK);
                    let bytes: Vec<u8> = self.input.iter().take(n).copied().collect();
                    if memory.write_slice(&bytes, GuestAddress(addr)).is_err() {
                        break; // a bad address: skip this buffer
                    }
                    self.input.drain(..n);
                    addr += n as u64;
                    room -= n;
                    written += n as u32;
                }
            }
            let _ = queue.add_used(memory, head, written);
            used = true;
        }
        if self.paused && self.input.len() < MAX_PENDING_INPUT / 2 {
            self.paused = false;
            let _ = self.resume.write(1);
        }
        used
    }
}

impl VirtioDevice for Console {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_CONSOLE
    }

    fn features(&self) -> u64 {
        0
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE]
    }

    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        // cols, rows, max_nr_ports, emerg_wr: none offered.
        data.fill(0);
    }

    fn process(&mut self, queues: &mut [Queue], memory: &GuestMemoryMmap, interrupt: &Interrupt) {
        let mut used = false;
        if let Some(tx) = queues.get_mut(TRANSMIT_QUEUE).filter(|q| q.ready() && q.is_valid(memory)) {
            used |= self.transmit(tx, memory);
        }
        if let Some(rx) = queues.get_mut(RECEIVE_QUEUE).filter(|q| q.ready() && q.is_valid(memory)) {
            used |= self.receive(rx, memory);
        }
        if used {
            interrupt.signal_used();
        }
    }

    fn reset(&mut self) {
        self.input.clear();
        if self.paused {
            self.paused = false;
            let _ = self.resume.write(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn interrupt() -> Interrupt {
        Interrupt::new(EventFd::new(libc::EFD_NONBLOCK).unwrap())
    }

    #[test]
    fn guest_output_reaches_the_host_and_input_the_guest() {
        let memory = crate::memory::create_guest_memory(64).unwrap();
        let rx_mock = MockSplitQueue::create(&memory, GuestAddress(0x10_0000), 16);
        let tx_mock = MockSplitQueue::create(&memory, GuestAddress(0x20_0000), 16);
        memory.write_slice(b"hello host", GuestAddress(0x30_0000)).unwrap();
        tx_mock
            .add_desc_chains(&[RawDescriptor::from(SplitDescriptor::new(0x30_0000, 10, 0, 0))], 0)
            .unwrap();
        rx_mock
            .add_desc_chains(
                &[RawDescriptor::from(SplitDescriptor::new(0x40_0000, 4, VRING_DESC_F_WRITE as u16, 0))],
                0,
            )
            .unwrap();
        let mut queues = vec![rx_mock.create_queue::<Queue>().unwrap(), tx_mock.create_queue::<Queue>().unwrap()];

        let sink = Sink::default();
        let resume = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut console = Console::new(resume.try_clone().unwrap());
        console.connect(Box::new(sink.clone()));
        assert!(!console.push_input(b"hi guest"));
        let irq = interrupt();
        console.process(&mut queues, &memory, &irq);

        assert_eq!(sink.0.lock().unwrap().as_slice(), b"hello host");
        let mut got = [0u8; 4];
        memory.read_slice(&mut got, GuestAddress(0x40_0000)).unwrap();
        assert_eq!(&got, b"hi g", "only the buffer's 4 bytes");
        assert_eq!(console.input.len(), 4, "the rest waits for more buffers");
        assert_eq!(irq.status(), 1);
    }

    #[test]
    fn too_much_input_pauses_until_the_guest_drains_it() {
        let resume = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut console = Console::new(resume.try_clone().unwrap());
        assert!(console.push_input(&vec![b'x'; MAX_PENDING_INPUT]));
        assert!(resume.read().is_err(), "no resume yet");
        console.reset();
        assert_eq!(resume.read().unwrap(), 1);
        assert!(console.input.is_empty());
    }

    #[test]
    fn output_without_a_host_is_counted() {
        let mut console = Console::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
        console.emit(b"lost");
        assert_eq!(console.dropped_output(), 4);
    }
}
