use super::*;
use std::sync::{Arc, Mutex};
use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::GuestAddress;

/// The host side: takes at most `accept` more bytes of output when it
/// pumps, as the agent channel does (copy out, write, consume).
#[derive(Clone)]
struct Sink {
    got: Arc<Mutex<Vec<u8>>>,
    accept: Arc<Mutex<usize>>,
}

impl Sink {
    fn new(accept: usize) -> Sink {
        Sink {
            got: Arc::default(),
            accept: Arc::new(Mutex::new(accept)),
        }
    }
    fn allow(&self, n: usize) {
        *self.accept.lock().unwrap() = n;
    }
    fn got(&self) -> Vec<u8> {
        self.got.lock().unwrap().clone()
    }
    /// Takes what it may of `console`'s output.
    fn pump(&self, console: &mut Console) {
        let mut accept = self.accept.lock().unwrap();
        let mut buf = vec![0u8; (*accept).min(OUTPUT_CAPACITY)];
        let n = console.peek_output(&mut buf);
        self.got.lock().unwrap().extend_from_slice(&buf[..n]);
        console.consume_output(n);
        *accept -= n;
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
            .map(|(i, &size)| {
                MockSplitQueue::create(memory, GuestAddress(0x10_0000 * (i as u64 + 1)), size)
            })
            .collect();
        let queues = mocks
            .iter()
            .map(|m| m.create_queue::<Queue>().unwrap())
            .collect();
        Rig {
            memory,
            mocks,
            queues,
        }
    }

    fn process(&mut self, console: &mut Console) -> bool {
        console.process(&mut self.queues, self.memory).more
    }

    /// The event loop's round: the device runs, the host takes output.
    fn round(&mut self, console: &mut Console, sink: &Sink) -> bool {
        let more = self.process(console);
        sink.pump(console);
        more
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

    /// A connected console that took the first [`OUTPUT_CAPACITY`] bytes
    /// of one chain on port 1 in a round, the rest left in the queue;
    /// returns it, its host and the chain's bytes.
    fn half_taken_chain(&mut self) -> (Console, Sink, Vec<u8>) {
        let data = pattern(OUTPUT_CAPACITY + 5000);
        self.memory.write_slice(&data, GuestAddress(DATA)).unwrap();
        self.add_chain(TRANSMIT, 0, &[(DATA, data.len() as u32)], false);
        let sink = Sink::new(usize::MAX);
        let mut console = Console::new();
        console.connect();
        self.round(&mut console, &sink);
        assert_eq!(sink.got().len(), OUTPUT_CAPACITY, "the first part");
        assert_eq!(self.used(TRANSMIT), 0, "the rest in the queue");
        (console, sink, data)
    }

    /// Makes descriptor 0 of `queue` an indirect table at `table` of `parts`
    /// (readable) and offers it `times` over, as a driver that ignores
    /// that `VIRTIO_F_INDIRECT_DESC` is not offered.
    fn add_indirect_chain(&self, queue: usize, table: u64, parts: &[(u64, u32)], times: u16) {
        for (i, &(addr, len)) in parts.iter().enumerate() {
            let flags = if i + 1 < parts.len() {
                VRING_DESC_F_NEXT as u16
            } else {
                0
            };
            let desc = SplitDescriptor::new(addr, len, flags, i as u16 + 1);
            self.memory
                .write_obj(
                    RawDescriptor::from(desc),
                    GuestAddress(table + 16 * i as u64),
                )
                .unwrap();
        }
        let len = 16 * parts.len() as u32;
        let head = SplitDescriptor::new(table, len, VRING_DESC_F_INDIRECT as u16, 0);
        let mock = &self.mocks[queue];
        mock.desc_table()
            .store(0, RawDescriptor::from(head))
            .unwrap();
        for i in 0..times {
            mock.avail().ring().ref_at(usize::from(i)).unwrap().store(0);
        }
        mock.avail().idx().store(times);
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
    memory
        .write_slice(b"hello host", GuestAddress(DATA))
        .unwrap();
    rig.add_chain(TRANSMIT, 0, &[(DATA, 6), (DATA + 6, 4)], false);
    rig.add_chain(RECEIVE, 0, &[(DATA + 0x1000, 4)], true);
    let sink = Sink::new(usize::MAX);
    let mut console = Console::new();
    console.connect();
    assert!(!console.push_input(b"hi guest"));
    let progress = console.process(&mut rig.queues, &memory);
    sink.pump(&mut console);
    assert_eq!(
        progress,
        Progress {
            used: (1 << TRANSMIT) | (1 << RECEIVE),
            more: false
        }
    );
    assert_eq!(sink.got(), b"hello host");
    let mut got = [0u8; 4];
    memory
        .read_slice(&mut got, GuestAddress(DATA + 0x1000))
        .unwrap();
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
    rig.add_chain(
        TRANSMIT,
        0,
        &[(DATA, 5000), (DATA + 5000, (len - 5000) as u32)],
        false,
    );
    memory
        .write_slice(b"tail", GuestAddress(DATA + 0x40_0000))
        .unwrap();
    rig.add_chain(TRANSMIT, 2, &[(DATA + 0x40_0000, 4)], false);
    let sink = Sink::new(0);
    let mut console = Console::new();
    console.connect();

    assert!(
        !rig.round(&mut console, &sink),
        "full: the host taking output brings it back, not a retry"
    );
    assert_eq!(
        rig.used(TRANSMIT),
        0,
        "a chain not all buffered must stay in the queue"
    );
    assert_eq!(
        console.buffered.len(),
        OUTPUT_CAPACITY,
        "the buffer is bounded"
    );
    assert!(console.output_pending());
    // The host reads in small steps; every step moves the output on.
    let mut rounds = 0;
    while sink.got().len() < len + 4 {
        sink.allow(3000);
        sink.pump(&mut console);
        rig.round(&mut console, &sink);
        rounds += 1;
        assert!(
            rounds < 1000,
            "no progress: {} of {} bytes",
            sink.got().len(),
            len + 4
        );
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
    console.connect();
    rig.round(&mut console, &sink);
    assert_eq!(rig.used(TRANSMIT), 64, "64 KiB per call");
    let mut calls = 1;
    while rig.used(TRANSMIT) < chains {
        rig.round(&mut console, &sink);
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
        rig.add_chain(
            CONTROL_RECEIVE,
            i,
            &[(DATA + 0x100 * u64::from(i), 8)],
            true,
        );
    }
    let ready = ControlMessage {
        id: 0,
        event: DEVICE_READY,
        value: 1,
    };
    memory
        .write_slice(&ready.to_bytes(), GuestAddress(DATA + 0x1000))
        .unwrap();
    rig.add_chain(CONTROL_TRANSMIT, 0, &[(DATA + 0x1000, 8)], false);
    let mut console = Console::new();
    console.connect();
    rig.process(&mut console);
    let message = |i: u64| {
        let mut b = [0u8; 8];
        memory
            .read_slice(&mut b, GuestAddress(DATA + 0x100 * i))
            .unwrap();
        ControlMessage::from_bytes(b)
    };
    assert_eq!(
        message(0),
        ControlMessage {
            id: AGENT_PORT,
            event: DEVICE_ADD,
            value: 0
        }
    );
    assert_eq!(
        message(1),
        ControlMessage {
            id: AGENT_PORT,
            event: PORT_OPEN,
            value: 1
        },
        "open in the same batch"
    );
    assert_eq!(rig.used(CONTROL_RECEIVE), 2);
    // The host going away closes the port for the guest.
    let port_ready = ControlMessage {
        id: AGENT_PORT,
        event: PORT_READY,
        value: 1,
    };
    memory
        .write_slice(&port_ready.to_bytes(), GuestAddress(DATA + 0x1000))
        .unwrap();
    rig.add_chain(CONTROL_TRANSMIT, 1, &[(DATA + 0x1000, 8)], false);
    rig.process(&mut console);
    console.disconnect();
    rig.process(&mut console);
    assert_eq!(
        message(2),
        ControlMessage {
            id: AGENT_PORT,
            event: PORT_OPEN,
            value: 1
        }
    );
    assert_eq!(
        message(3),
        ControlMessage {
            id: AGENT_PORT,
            event: PORT_OPEN,
            value: 0
        }
    );
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

/// Sends `message` on the control transmit queue `times` times, processing
/// after each batch of the queue's size.
fn flood_control(rig: &mut Rig, console: &mut Console, message: ControlMessage, times: usize) {
    let size = QUEUE_SIZES[CONTROL_TRANSMIT] as usize;
    rig.memory
        .write_slice(&message.to_bytes(), GuestAddress(DATA + 0x2000))
        .unwrap();
    let desc = RawDescriptor::from(SplitDescriptor::new(DATA + 0x2000, 8, 0, 0));
    rig.mocks[CONTROL_TRANSMIT]
        .desc_table()
        .store(0, desc)
        .unwrap();
    // The mock neither wraps its available ring nor keeps it clear of the
    // used ring: one of the test's own.
    let avail = GuestAddress(DATA + 0x3000);
    let start = rig.used(CONTROL_TRANSMIT);
    let queue = &mut rig.queues[CONTROL_TRANSMIT];
    if queue.avail_ring() != avail.0 {
        queue.set_ready(false);
        queue.try_set_avail_ring_address(avail).unwrap();
        queue.set_ready(true);
    }
    for batch in 0..times / size {
        let idx: u16 = rig.memory.read_obj(avail.unchecked_add(2)).unwrap();
        for i in 0..size as u16 {
            rig.memory
                .write_obj(
                    0u16,
                    avail.unchecked_add(4 + 2 * u64::from((idx + i) % size as u16)),
                )
                .unwrap();
        }
        rig.memory
            .write_obj(idx.wrapping_add(size as u16), avail.unchecked_add(2))
            .unwrap();
        rig.process(console);
        let read = rig.used(CONTROL_TRANSMIT).wrapping_sub(start);
        assert_eq!(usize::from(read), (batch + 1) * size, "all read");
    }
}

#[test]
fn a_driver_that_floods_the_control_queue_without_receive_buffers_costs_nothing() {
    let memory = memory();
    let mut rig = Rig::new(&memory);
    let mut console = Console::new();
    console.connect();
    flood_control(
        &mut rig,
        &mut console,
        ControlMessage {
            id: 0,
            event: DEVICE_READY,
            value: 1,
        },
        3200,
    );
    flood_control(
        &mut rig,
        &mut console,
        ControlMessage {
            id: AGENT_PORT,
            event: PORT_READY,
            value: 1,
        },
        3200,
    );
    console.disconnect();
    console.connect();
    assert!(
        console.to_driver.len() <= 2,
        "{} messages held for the driver",
        console.to_driver.len()
    );
    // Once the driver posts buffers it gets the add, then the open: the
    // latest state, once each.
    for i in 0..4u16 {
        rig.add_chain(
            CONTROL_RECEIVE,
            i,
            &[(DATA + 0x100 * u64::from(i), 8)],
            true,
        );
    }
    rig.process(&mut console);
    assert_eq!(rig.used(CONTROL_RECEIVE), 2);
    let message = |i: u64| {
        let mut b = [0u8; 8];
        memory
            .read_slice(&mut b, GuestAddress(DATA + 0x100 * i))
            .unwrap();
        ControlMessage::from_bytes(b)
    };
    assert_eq!(
        message(0),
        ControlMessage {
            id: AGENT_PORT,
            event: DEVICE_ADD,
            value: 0
        }
    );
    assert_eq!(
        message(1),
        ControlMessage {
            id: AGENT_PORT,
            event: PORT_OPEN,
            value: 1
        }
    );
}

#[test]
fn an_unreadable_buffer_in_a_chain_taken_in_parts_is_passed_once() {
    let memory = memory();
    let mut rig = Rig::new(&memory);
    let len = OUTPUT_CAPACITY + 5000;
    let data = pattern(len);
    memory.write_slice(&data, GuestAddress(DATA)).unwrap();
    // 100 bytes at an address outside guest memory, then more than the
    // buffer holds: the chain is taken in two parts.
    rig.add_chain(
        TRANSMIT,
        0,
        &[(0x4000_0000_0000, 100), (DATA, len as u32)],
        false,
    );
    let sink = Sink::new(usize::MAX);
    let mut console = Console::new();
    console.connect();
    let mut rounds = 0;
    while rig.used(TRANSMIT) == 0 {
        rig.round(&mut console, &sink);
        rounds += 1;
        assert!(rounds < 10);
    }
    assert!(rounds > 1, "taken in parts");
    assert!(
        sink.got() == data,
        "{} bytes reached the host, {} were readable",
        sink.got().len(),
        len
    );
    assert_eq!(console.dropped_output(), 100);
}

#[test]
fn a_descriptor_rewritten_to_wrap_the_address_space_is_a_bad_address() {
    let memory = memory();
    let mut rig = Rig::new(&memory);
    let (mut console, sink, _) = rig.half_taken_chain();
    // Between the passes, the driver moves the descriptor to the end of
    // the address space: resuming 64 KiB into it wraps.
    let table = rig.mocks[TRANSMIT].desc_table_addr();
    memory.write_obj((u64::MAX - 100).to_le(), table).unwrap();
    rig.round(&mut console, &sink);
    assert_eq!(rig.used(TRANSMIT), 1, "used");
    assert_eq!(sink.got().len(), OUTPUT_CAPACITY);
    assert_eq!(console.dropped_output(), 5000);
}

#[test]
fn a_reset_in_the_middle_of_a_chain_sends_no_byte_twice() {
    let memory = memory();
    let mut rig = Rig::new(&memory);
    let (mut console, sink, data) = rig.half_taken_chain();
    // The driver resets the device and sets its queues up again; its
    // first chain starts where the old one was.
    console.reset();
    let mut rig = Rig::new(&memory);
    memory
        .write_slice(b"after reset", GuestAddress(DATA + 0x40_0000))
        .unwrap();
    rig.add_chain(TRANSMIT, 0, &[(DATA + 0x40_0000, 11)], false);
    rig.round(&mut console, &sink);
    assert_eq!(rig.used(TRANSMIT), 1);
    let mut want = data[..OUTPUT_CAPACITY].to_vec();
    want.extend_from_slice(b"after reset");
    assert!(
        sink.got() == want,
        "{} bytes reached the host, want the old chain's first part and the new chain",
        sink.got().len()
    );
}

#[test]
fn a_chain_through_an_indirect_table_is_read_no_further_than_the_queue_size() {
    let memory = memory();
    let mut rig = Rig::new(&memory);
    // 65535 one-byte buffers, the most an indirect table holds, in each of
    // 4 chains; without a host every readable byte is counted, so the
    // count says how many descriptors the device read.
    let parts = vec![(DATA, 1); usize::from(u16::MAX)];
    rig.add_indirect_chain(TRANSMIT, 0x200_0000, &parts, 4);
    let mut console = Console::new();
    assert!(!rig.process(&mut console));
    assert_eq!(rig.used(TRANSMIT), 4);
    let size = u64::from(QUEUE_SIZES[TRANSMIT]);
    assert_eq!(
        console.dropped_output(),
        4 * size,
        "each chain read to at most the queue's {size} descriptors"
    );

    // On the control queue: DEVICE_READY behind more empty descriptors
    // than the queue has is not reached.
    let ready = ControlMessage {
        id: 0,
        event: DEVICE_READY,
        value: 1,
    };
    memory
        .write_slice(&ready.to_bytes(), GuestAddress(DATA))
        .unwrap();
    let mut parts = vec![(DATA, 0); usize::from(QUEUE_SIZES[CONTROL_TRANSMIT])];
    parts.push((DATA, 8));
    rig.add_indirect_chain(CONTROL_TRANSMIT, 0x300_0000, &parts, 1);
    rig.process(&mut console);
    assert_eq!(rig.used(CONTROL_TRANSMIT), 1, "the chain is used");
    assert_eq!(console.pending_control(), 0, "its message was past the cut");
}

#[test]
fn a_driver_with_bad_ring_indices_is_not_logged() {
    let memory = memory();
    let mut rig = Rig::new(&memory);
    // Port 1's transmit queue: an available index more than the queue's
    // size ahead. The receive queue: a head past the table.
    rig.mocks[TRANSMIT].avail().idx().store(1000);
    let receive = &rig.mocks[RECEIVE];
    receive.avail().ring().ref_at(0).unwrap().store(300);
    receive.avail().idx().store(1);
    let sink = Sink::new(usize::MAX);
    let mut console = Console::new();
    console.connect();
    console.push_input(b"input");
    let shown = crate::logger::capture::shown_during(|| {
        for _ in 0..100 {
            rig.round(&mut console, &sink);
        }
    });
    assert_eq!((rig.used(TRANSMIT), rig.used(RECEIVE)), (0, 0));
    assert!(sink.got().is_empty());
    assert!(
        shown.is_empty(),
        "the event loop wrote {} log lines under the transport's lock, the first {:?}",
        shown.len(),
        shown.first()
    );
}

#[test]
fn a_queue_set_up_anew_in_the_middle_of_a_chain_takes_its_next_chain_whole() {
    let memory = memory();
    let mut rig = Rig::new(&memory);
    let (mut console, sink, _) = rig.half_taken_chain();
    // The driver sets QueueReady 0, moves the queue's rings (the transport
    // keeps its position), sets it ready and offers another chain there.
    let moved = MockSplitQueue::create(&memory, GuestAddress(0x300_0000), 256);
    let mut queue: Queue = moved.create_queue().unwrap();
    queue.set_next_avail(rig.queues[TRANSMIT].next_avail());
    rig.queues[TRANSMIT] = queue;
    memory
        .write_slice(b"new chain", GuestAddress(DATA + 0x40_0000))
        .unwrap();
    let desc = SplitDescriptor::new(DATA + 0x40_0000, 9, 0, 0);
    moved
        .desc_table()
        .store(0, RawDescriptor::from(desc))
        .unwrap();
    moved.avail().ring().ref_at(0).unwrap().store(0);
    moved.avail().idx().store(1);
    rig.round(&mut console, &sink);
    assert_eq!(moved.used().idx().load(), 1, "the new chain is used");
    assert_eq!(
        &sink.got()[OUTPUT_CAPACITY..],
        b"new chain",
        "the old chain's resume point cut the new one ({} dropped)",
        console.dropped_output()
    );
    assert_eq!(console.dropped_output(), 0);
}

#[test]
fn buffers_across_the_end_of_guest_memory_move_each_byte_once() {
    let memory = memory();
    let mut rig = Rig::new(&memory);
    let end = 64 << 20; // [`memory`]'s 64 MiB
    let data = pattern(CHUNK + 1000);
    // Output: one buffer whose last 700 bytes are past the end.
    let at = end - data.len() as u64 + 700;
    memory
        .write_slice(&data[..data.len() - 700], GuestAddress(at))
        .unwrap();
    rig.add_chain(TRANSMIT, 0, &[(at, data.len() as u32)], false);
    // Input: a buffer across the end, then one inside.
    rig.add_chain(RECEIVE, 0, &[(end - 100, 1000)], true);
    rig.add_chain(RECEIVE, 1, &[(DATA, 1000)], true);
    let sink = Sink::new(usize::MAX);
    let mut console = Console::new();
    console.connect();
    console.push_input(&data[..300]);
    rig.round(&mut console, &sink);
    let got = sink.got();
    assert_eq!(rig.used(TRANSMIT), 1);
    assert_eq!(
        got.len() as u64 + console.dropped_output(),
        data.len() as u64,
        "each byte of the buffer sent or counted as dropped, once"
    );
    assert!(
        got == data[..got.len()],
        "what was sent is the buffer's start"
    );
    let used = rig.mocks[RECEIVE].used();
    let lens: Vec<u32> = (0..2)
        .map(|i| used.ring().ref_at(i).unwrap().load().len())
        .collect();
    assert_eq!(lens, [0, 300], "the input skips the buffer it cannot fill");
    let mut took = [0u8; 300];
    memory.read_slice(&mut took, GuestAddress(DATA)).unwrap();
    assert!(took == data[..300]);
}
