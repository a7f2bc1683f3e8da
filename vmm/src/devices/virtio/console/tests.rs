use super::*;
use std::sync::{Arc, Mutex};
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;

/// A writer that takes at most `accept` more bytes, then says WouldBlock.
#[derive(Clone)]
struct Sink {
    got: Arc<Mutex<Vec<u8>>>,
    accept: Arc<Mutex<usize>>,
}

impl Sink {
    fn new(accept: usize) -> Sink {
        Sink { got: Arc::default(), accept: Arc::new(Mutex::new(accept)) }
    }
    fn allow(&self, n: usize) {
        *self.accept.lock().unwrap() = n;
    }
    fn got(&self) -> Vec<u8> {
        self.got.lock().unwrap().clone()
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut accept = self.accept.lock().unwrap();
        if *accept == 0 {
            return Err(ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(*accept);
        *accept -= n;
        self.got.lock().unwrap().extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Guest memory with the six queues laid out, each at 1 MiB steps.
struct Rig<'m> {
    memory: &'m GuestMemoryMmap,
    mocks: Vec<MockSplitQueue<'m, GuestMemoryMmap>>,
    queues: Vec<Queue>,
}

fn memory() -> GuestMemoryMmap {
    crate::memory::create_guest_memory(64).unwrap()
}

impl<'m> Rig<'m> {
    fn new(memory: &'m GuestMemoryMmap) -> Rig<'m> {
        let mocks: Vec<_> = QUEUE_SIZES
            .iter()
            .enumerate()
            .map(|(i, &size)| MockSplitQueue::create(memory, GuestAddress(0x10_0000 * (i as u64 + 1)), size))
            .collect();
        let queues = mocks.iter().map(|m| m.create_queue::<Queue>().unwrap()).collect();
        Rig { memory, mocks, queues }
    }

    fn process(&mut self, console: &mut Console) -> bool {
        console.process(&mut self.queues, self.memory).more
    }

    fn used(&self, queue: usize) -> u16 {
        self.mocks[queue].used().idx().load()
    }

    /// Adds one chain of `parts` (readable, or writable with `write`) at
    /// descriptor `at`.
    fn add_chain(&self, queue: usize, at: u16, parts: &[(u64, u32)], write: bool) {
        let descs: Vec<RawDescriptor> = parts
            .iter()
            .enumerate()
            .map(|(i, &(addr, len))| {
                let mut flags = if write { VRING_DESC_F_WRITE as u16 } else { 0 };
                if i + 1 < parts.len() {
                    flags |= VRING_DESC_F_NEXT as u16;
                }
                RawDescriptor::from(SplitDescriptor::new(addr, len, flags, at + i as u16 + 1))
            })
            .collect();
        self.mocks[queue].add_desc_chains(&descs, at).unwrap();
    }
}

const DATA: u64 = 0x100_0000;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn output_reaches_the_host_and_input_the_guest() {
    let memory = memory();
    let mut rig = Rig::new(&memory);
    memory.write_slice(b"hello host", GuestAddress(DATA)).unwrap();
    rig.add_chain(TRANSMIT, 0, &[(DATA, 6), (DATA + 6, 4)], false);
    rig.add_chain(RECEIVE, 0, &[(DATA + 0x1000, 4)], true);
    let sink = Sink::new(usize::MAX);
    let mut console = Console::new();
    console.connect(Box::new(sink.clone()));
    assert!(!console.push_input(b"hi guest"));
    let progress = console.process(&mut rig.queues, &memory);
    assert_eq!(progress, Progress { used: (1 << TRANSMIT) | (1 << RECEIVE), more: false });
    assert_eq!(sink.got(), b"hello host");
    let mut got = [0u8; 4];
    memory.read_slice(&mut got, GuestAddress(DATA + 0x1000)).unwrap();
    assert_eq!(&got, b"hi g", "only the buffer's 4 bytes");
    assert_eq!(console.input.len(), 4, "the rest waits for more buffers");
    assert_eq!((rig.used(TRANSMIT), rig.used(RECEIVE)), (1, 1));
}

#[test]
fn a_full_buffer_leaves_the_chain_in_the_queue_and_loses_nothing() {
    let memory = memory();
    let mut rig = Rig::new(&memory);
    let len = OUTPUT_CAPACITY * 2 + 1000;
    let data = pattern(len);
    memory.write_slice(&data, GuestAddress(DATA)).unwrap();
    // One chain larger than the buffer, in two descriptors, then a small one.
    rig.add_chain(TRANSMIT, 0, &[(DATA, 5000), (DATA + 5000, (len - 5000) as u32)], false);
    memory.write_slice(b"tail", GuestAddress(DATA + 0x40_0000)).unwrap();
    rig.add_chain(TRANSMIT, 2, &[(DATA + 0x40_0000, 4)], false);
    let sink = Sink::new(0);
    let mut console = Console::new();
    console.connect(Box::new(sink.clone()));

    assert!(!rig.process(&mut console), "full: the writer's readiness brings it back, not a retry");
    assert_eq!(rig.used(TRANSMIT), 0, "a chain not all buffered must stay in the queue");
    assert_eq!(console.buffered.len(), OUTPUT_CAPACITY, "the buffer is bounded");
    assert!(console.output_pending());
    // The host reads in small steps; every step moves the output on.
    let mut rounds = 0;
    while sink.got().len() < len + 4 {
        sink.allow(3000);
        rig.process(&mut console);
        rounds += 1;
        assert!(rounds < 1000, "no progress: {} of {} bytes", sink.got().len(), len + 4);
        assert!(console.buffered.len() <= OUTPUT_CAPACITY);
    }
    let mut want = data.clone();
    want.extend_from_slice(b"tail");
    assert!(sink.got() == want, "bytes lost, repeated or reordered");
    assert_eq!(rig.used(TRANSMIT), 2, "each chain used once");
    assert_eq!(console.dropped_output(), 0);
    assert!(!console.output_pending());
}

#[test]
fn without_a_host_output_is_used_uncopied_and_counted() {
    let memory = memory();
    let mut rig = Rig::new(&memory);
    // An address outside guest memory: a copy would fail, counting cannot.
    rig.add_chain(TRANSMIT, 0, &[(0x4000_0000_0000, 3 << 30)], false);
    let mut console = Console::new();
    assert!(!rig.process(&mut console));
    assert_eq!(rig.used(TRANSMIT), 1);
    assert_eq!(console.dropped_output(), 3 << 30);
}

#[test]
fn the_work_per_call_is_bounded() {
    let memory = memory();
    let mut rig = Rig::new(&memory);
    let chains = MAX_CHAINS_PER_CALL as u16 - 6;
    for i in 0..chains {
        rig.add_chain(TRANSMIT, i, &[(DATA, 1024)], false);
    }
    let sink = Sink::new(usize::MAX);
    let mut console = Console::new();
    console.connect(Box::new(sink.clone()));
    assert!(rig.process(&mut console), "stopped at the byte bound with more queued");
    assert_eq!(rig.used(TRANSMIT), 64, "64 KiB per call");
    let mut calls = 1;
    while rig.process(&mut console) {
        calls += 1;
        assert!(calls < 10);
    }
    assert_eq!(rig.used(TRANSMIT), chains);
    assert_eq!(sink.got().len(), usize::from(chains) * 1024);
}

#[test]
fn the_driver_gets_the_port_added_and_open() {
    let memory = memory();
    let mut rig = Rig::new(&memory);
    for i in 0..4u16 {
        rig.add_chain(CONTROL_RECEIVE, i, &[(DATA + 0x100 * u64::from(i), 8)], true);
    }
    let ready = ControlMessage { id: 0, event: DEVICE_READY, value: 1 };
    memory.write_slice(&ready.to_bytes(), GuestAddress(DATA + 0x1000)).unwrap();
    rig.add_chain(CONTROL_TRANSMIT, 0, &[(DATA + 0x1000, 8)], false);
    let mut console = Console::new();
    console.connect(Box::new(Sink::new(usize::MAX)));
    rig.process(&mut console);
    let message = |i: u64| {
        let mut b = [0u8; 8];
        memory.read_slice(&mut b, GuestAddress(DATA + 0x100 * i)).unwrap();
        ControlMessage::from_bytes(b)
    };
    assert_eq!(message(0), ControlMessage { id: AGENT_PORT, event: DEVICE_ADD, value: 0 });
    assert_eq!(message(1), ControlMessage { id: AGENT_PORT, event: PORT_OPEN, value: 1 }, "open in the same batch");
    assert_eq!(rig.used(CONTROL_RECEIVE), 2);
    // The host going away closes the port for the guest.
    let port_ready = ControlMessage { id: AGENT_PORT, event: PORT_READY, value: 1 };
    memory.write_slice(&port_ready.to_bytes(), GuestAddress(DATA + 0x1000)).unwrap();
    rig.add_chain(CONTROL_TRANSMIT, 1, &[(DATA + 0x1000, 8)], false);
    rig.process(&mut console);
    console.disconnect();
    rig.process(&mut console);
    assert_eq!(message(2), ControlMessage { id: AGENT_PORT, event: PORT_OPEN, value: 1 });
    assert_eq!(message(3), ControlMessage { id: AGENT_PORT, event: PORT_OPEN, value: 0 });
    let mut config = [0u8; 4];
    console.read_config(4, &mut config);
    assert_eq!(u32::from_le_bytes(config), MAX_NR_PORTS);
}

#[test]
fn too_much_input_pauses_until_the_guest_drains_it() {
    let memory = memory();
    let mut rig = Rig::new(&memory);
    let mut console = Console::new();
    assert!(console.push_input(&vec![b'x'; MAX_PENDING_INPUT]));
    rig.add_chain(RECEIVE, 0, &[(DATA, (MAX_PENDING_INPUT / 4) as u32)], true);
    rig.process(&mut console);
    assert!(console.input_paused(), "3/4 still waiting");
    rig.add_chain(RECEIVE, 1, &[(DATA, (MAX_PENDING_INPUT / 2) as u32)], true);
    rig.process(&mut console);
    assert!(!console.input_paused());
    assert_eq!(console.input.len(), MAX_PENDING_INPUT / 4);
}
