//! The 8250 serial console (vm-superio) on COM1, its output to a log file.
//!
//! A vCPU's write to the transmit register never touches the file: the byte
//! goes into [`OutputRing`], a bounded single-producer single-consumer ring
//! of atomics, and the event loop drains it into the log
//! ([`SerialConsole::drain`], woken by an eventfd at each line's end and at
//! half full, and at every turn of its loop). A full ring drops the byte
//! and counts it ([`SerialConsole::dropped_output`]); the vCPU never waits.
//! The only lock a vCPU takes is the UART's own, which nothing holds across
//! I/O (the producer's side of the ring is used under it, so there is one
//! producer at a time; the consumer's side is under the log's lock, which
//! no vCPU takes).
//!
//! Nor does the event loop wait for the log: the builder opens it
//! non-blocking, and a write that would block (in the box the log is a
//! virtio-serial port the host may stop reading) leaves the rest in the
//! ring, and at most one chunk of [`CHUNK`] bytes beside it, for the next
//! wake-up or turn. So a stalled log fills the ring and then drops the
//! guest's bytes, counted, while the agent channel on the same loop goes
//! on. At the run's end [`SerialConsole::flush`] waits for a stalled log
//! at most [`FLUSH_PATIENCE`], and counts what it could not write as
//! dropped.
//!
//! The output is also watched for the kernel's panic banner (on the vCPU,
//! in memory): a panicking guest (`panic=-1`) and a rebooting one both end
//! in a reset, and this is how the VMM tells them apart for its exit status.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use event_manager::{EventOps, EventSet, EventSubscriber, Events};
use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use super::bus::BusDevice;

/// COM1's ports and interrupt.
pub const COM1_BASE: u64 = 0x3f8;
pub const COM1_LEN: u64 = 8;
pub const COM1_IRQ: u32 = 4;

/// Serial output held for the event loop.
pub const OUTPUT_RING: usize = 256 * 1024;
/// What the kernel prints when it panics.
const PANIC_BANNER: &[u8] = b"Kernel panic - not syncing";
/// Longest line kept for the banner search.
const MAX_LINE: usize = 512;
/// What one write to the log takes from the ring.
const CHUNK: usize = 4096;
/// How long the exit and panic paths wait for a log that will not take
/// its bytes (or stays locked) before they give up.
pub const FLUSH_PATIENCE: Duration = Duration::from_secs(1);
/// At most one warning of dropped output this often: while the log stalls
/// the event loop drains at every line the guest ends, and each would
/// find more dropped.
const DROP_WARNING_PERIOD: Duration = Duration::from_secs(5);

/// Raises the serial interrupt through an irqfd.
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = io::Error;
    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// A bounded ring of bytes for one producer and one consumer at a time,
/// atomics only. `head` (the consumer's) and `tail` (the producer's) count
/// bytes ever taken and given; a byte's slot is its count modulo the
/// capacity. The producer publishes a byte with a release store of `tail`
/// after writing its slot; the consumer frees slots with a release store of
/// `head` after reading them; each acquires the other's index, so neither
/// reads a slot the other is writing.
pub struct OutputRing {
    slots: Box<[AtomicU8]>,
    head: AtomicUsize,
    tail: AtomicUsize,
    dropped: AtomicU64,
}

impl OutputRing {
    pub fn new(capacity: usize) -> OutputRing {
        OutputRing {
            slots: (0..capacity.max(1)).map(|_| AtomicU8::new(0)).collect(),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Adds `byte` (the producer); a full ring drops and counts it. Returns
    /// the bytes held after.
    fn push(&self, byte: u8) -> usize {
        let tail = self.tail.load(Ordering::Relaxed);
        let held = tail.wrapping_sub(self.head.load(Ordering::Acquire));
        if held == self.slots.len() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return held;
        }
        self.slots[tail % self.slots.len()].store(byte, Ordering::Relaxed);
        self.tail.store(tail.wrapping_add(1), Ordering::Release);
        held + 1
    }

    /// Moves the oldest bytes into `out` (the consumer); returns how many.
    fn pop(&self, out: &mut [u8]) -> usize {
        let head = self.head.load(Ordering::Relaxed);
        let held = self.tail.load(Ordering::Acquire).wrapping_sub(head);
        let n = held.min(out.len());
        for (i, byte) in out[..n].iter_mut().enumerate() {
            *byte = self.slots[head.wrapping_add(i) % self.slots.len()].load(Ordering::Relaxed);
        }
        self.head.store(head.wrapping_add(n), Ordering::Release);
        n
    }

    /// Bytes held now.
    pub fn len(&self) -> usize {
        self.tail
            .load(Ordering::Acquire)
            .wrapping_sub(self.head.load(Ordering::Acquire))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Bytes dropped because the ring was full (or, at the run's end,
    /// because the log would not take them).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn count_dropped(&self, bytes: usize) {
        self.dropped.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Bytes ever given to the ring, kept or dropped.
    pub fn given(&self) -> u64 {
        self.tail.load(Ordering::Acquire) as u64 + self.dropped()
    }
}

/// The UART's output side, on the vCPU: into the ring, watched line by
/// line for the panic banner.
pub struct ConsoleSink {
    ring: Arc<OutputRing>,
    wake: EventFd,
    line: Vec<u8>,
    panicked: Arc<AtomicBool>,
}

impl Write for ConsoleSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        for &byte in buf {
            let held = self.ring.push(byte);
            if byte == b'\n' {
                if self
                    .line
                    .windows(PANIC_BANNER.len())
                    .any(|w| w == PANIC_BANNER)
                {
                    self.panicked.store(true, Ordering::SeqCst);
                }
                self.line.clear();
            } else if self.line.len() < MAX_LINE {
                self.line.push(byte);
            }
            // Whole lines reach the log soon (a panic's last words must be
            // there even if the VMM is killed); an eventfd write never
            // waits (a full counter means a wake-up is pending).
            if byte == b'\n' || held == self.ring.capacity() / 2 {
                let _ = self.wake.write(1);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The log and the bytes taken from the ring that it has not taken yet.
struct Log {
    /// `None` once it failed (or if there is none): the output is counted
    /// and discarded.
    out: Option<Box<dyn Write + Send>>,
    /// At most [`CHUNK`] bytes, the oldest output, waiting for the log.
    pending: Vec<u8>,
    /// When the last warning of dropped output was given.
    warned_at: Option<Instant>,
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drained {
    /// The ring and the pending chunk are empty.
    All,
    /// The log would block: the rest waits in the ring.
    Stalled,
}

/// COM1 on the port bus, and its log.
pub struct SerialConsole {
    serial: Mutex<Serial<IrqTrigger, NoEvents, ConsoleSink>>,
    ring: Arc<OutputRing>,
    /// The log, written by the event loop (and the exit path) only.
    log: Mutex<Log>,
    wake: EventFd,
    dropped_reported: AtomicU64,
}

impl SerialConsole {
    /// COM1 raising `irq`, its output to `log` (or nowhere) through a ring
    /// of `capacity` bytes ([`OUTPUT_RING`]). A `log` that says
    /// [`io::ErrorKind::WouldBlock`] is stalled, not failed (open it
    /// non-blocking: the event loop must not wait in it).
    pub fn new(
        irq: EventFd,
        log: Option<Box<dyn Write + Send>>,
        panicked: Arc<AtomicBool>,
        capacity: usize,
    ) -> io::Result<SerialConsole> {
        let ring = Arc::new(OutputRing::new(capacity));
        let wake = EventFd::new(libc::EFD_NONBLOCK)?;
        let sink = ConsoleSink {
            ring: ring.clone(),
            wake: wake.try_clone()?,
            line: Vec::new(),
            panicked,
        };
        Ok(SerialConsole {
            serial: Mutex::new(Serial::new(IrqTrigger(irq), sink)),
            ring,
            log: Mutex::new(Log {
                out: log,
                pending: Vec::with_capacity(CHUNK),
                warned_at: None,
            }),
            wake,
            dropped_reported: AtomicU64::new(0),
        })
    }

    /// Writes what the ring holds to the log and flushes it (the event
    /// loop, the exit and panic paths; never a vCPU), until the log would
    /// block. A failing log (a full disk) is dropped: the guest's output is
    /// lost, not the guest.
    pub fn drain(&self) {
        self.drain_into(self.log.lock().unwrap_or_else(|p| p.into_inner()));
    }

    fn drain_into(&self, mut log: MutexGuard<'_, Log>) -> Drained {
        let log = &mut *log;
        let mut buf = [0u8; CHUNK];
        let mut wrote = false;
        let mut drained = Drained::All;
        loop {
            if log.pending.is_empty() {
                let n = self.ring.pop(&mut buf);
                if n == 0 {
                    break;
                }
                log.pending.extend_from_slice(&buf[..n]);
            }
            let Some(out) = log.out.as_mut() else {
                log.pending.clear();
                continue;
            };
            match out.write(&log.pending) {
                Ok(0) => log.out = None,
                Ok(n) => {
                    log.pending.drain(..n);
                    wrote = true;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    drained = Drained::Stalled;
                    break;
                }
                Err(_) => log.out = None,
            }
        }
        if let Some(out) = log.out.as_mut() {
            if wrote && out.flush().is_err() {
                log.out = None;
            }
        }
        let dropped = self.ring.dropped();
        let due = log
            .warned_at
            .is_none_or(|at| at.elapsed() >= DROP_WARNING_PERIOD);
        if due && dropped > self.dropped_reported.load(Ordering::Relaxed) {
            self.dropped_reported.store(dropped, Ordering::Relaxed);
            log.warned_at = Some(Instant::now());
            log::warn!("the serial log lost {dropped} bytes so far: the guest printed faster than the log was written");
        }
        drained
    }

    /// Writes out the log at exit and from the panic hook: a
    /// [`SerialConsole::drain`] that waits at most [`FLUSH_PATIENCE`] for
    /// a log that stays locked (the panic came from inside a drain on this
    /// very thread) or will not take its bytes, then counts what is left as
    /// dropped.
    pub fn flush(&self) {
        let deadline = Instant::now() + FLUSH_PATIENCE;
        while Instant::now() < deadline {
            let log = match self.log.try_lock() {
                Ok(log) => log,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
            };
            if self.drain_into(log) == Drained::All {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Ok(mut log) = self.log.try_lock() {
            let left = log.pending.len() + self.ring.len();
            log.pending.clear();
            let mut buf = [0u8; CHUNK];
            while self.ring.pop(&mut buf) > 0 {}
            self.ring.count_dropped(left);
            if left > 0 {
                log::warn!("the serial log would not take the last {left} bytes within {FLUSH_PATIENCE:?}; counted as dropped");
            }
        }
    }

    /// Bytes of serial output dropped because the ring was full.
    pub fn dropped_output(&self) -> u64 {
        self.ring.dropped()
    }

    /// Bytes the guest wrote to the transmit register, kept or dropped.
    pub fn output_bytes(&self) -> u64 {
        self.ring.given()
    }

    /// Bytes waiting in the ring for the event loop.
    pub fn pending_output(&self) -> usize {
        self.ring.len()
    }
}

/// The event loop's side: the wake-up eventfd drains the ring.
impl EventSubscriber for SerialConsole {
    fn init(&self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.wake, EventSet::IN)) {
            log::error!("watching the serial log's eventfd: {e:?}");
        }
    }

    fn process(&self, _events: Events, _ops: &mut EventOps) {
        let _ = self.wake.read();
        self.drain();
    }
}

impl BusDevice for SerialConsole {
    fn read(&self, _vcpu: u32, offset: u64, data: &mut [u8]) {
        let mut serial = self.serial.lock().unwrap_or_else(|p| p.into_inner());
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = serial.read((offset + i as u64) as u8);
        }
    }

    fn write(&self, _vcpu: u32, offset: u64, data: &[u8]) {
        let mut serial = self.serial.lock().unwrap_or_else(|p| p.into_inner());
        for (i, byte) in data.iter().enumerate() {
            // Only a failing interrupt trigger errs; the byte is kept anyway.
            let _ = serial.write((offset + i as u64) as u8, *byte);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn console_with(capacity: usize) -> (SerialConsole, Shared, Arc<AtomicBool>) {
        let log = Shared::default();
        let panicked = Arc::new(AtomicBool::new(false));
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let com1 = SerialConsole::new(irq, Some(Box::new(log.clone())), panicked.clone(), capacity)
            .unwrap();
        (com1, log, panicked)
    }

    fn console() -> (SerialConsole, Shared, Arc<AtomicBool>) {
        console_with(OUTPUT_RING)
    }

    #[test]
    fn transmitted_bytes_reach_the_log() {
        let (com1, log, panicked) = console();
        for b in b"hello\n" {
            com1.write(0, 0, &[*b]); // THR
        }
        assert!(
            log.0.lock().unwrap().is_empty(),
            "the vCPU's write reaches the ring, not the log"
        );
        assert_eq!(
            com1.wake.read().unwrap(),
            1,
            "the line's end wakes the event loop"
        );
        com1.drain();
        assert_eq!(log.0.lock().unwrap().as_slice(), b"hello\n");
        assert!(!panicked.load(Ordering::SeqCst));
        let mut lsr = [0u8];
        com1.read(0, 5, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0, "transmitter empty");
    }

    #[test]
    fn the_panic_banner_is_noticed_across_writes() {
        let (com1, _log, panicked) = console();
        let text = b"[ 1.0] Kernel panic - not sync";
        for b in text {
            com1.write(0, 0, &[*b]);
        }
        assert!(!panicked.load(Ordering::SeqCst), "not before the line ends");
        for b in b"ing: VFS\n" {
            com1.write(0, 0, &[*b]);
        }
        assert!(panicked.load(Ordering::SeqCst));
    }

    #[test]
    fn a_failing_log_is_dropped_not_fatal() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::other("disk full"))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let com1 = SerialConsole::new(irq, Some(Box::new(Broken)), Arc::default(), 64).unwrap();
        com1.write(0, 0, b"a");
        com1.drain();
        assert!(com1.log.lock().unwrap().out.is_none());
        com1.write(0, 0, b"b");
        com1.drain();
        assert!(com1.ring.is_empty());
    }

    /// A log that blocks until told to go on: the vCPU's writes must not.
    #[test]
    fn a_stalled_log_never_stops_the_vcpu_and_an_overflow_is_counted() {
        let (com1, log, _) = console_with(100);
        let com1 = Arc::new(com1);
        let held = log.0.lock().unwrap();
        let drainer = {
            let com1 = com1.clone();
            std::thread::spawn(move || {
                com1.write(0, 0, b"x");
                com1.drain() // blocks on the log's lock, held above
            })
        };
        // The vCPU writes 1000 bytes while the drain is stuck in the log.
        let start = std::time::Instant::now();
        for _ in 0..1000 {
            com1.write(0, 0, b"y");
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "the vCPU waited"
        );
        drop(held);
        drainer.join().unwrap();
        com1.drain();
        let got = log.0.lock().unwrap().len() as u64;
        assert_eq!(
            got + com1.dropped_output(),
            1001,
            "every byte logged or counted"
        );
        assert_eq!(com1.output_bytes(), 1001, "every byte the guest wrote");
        assert!(
            com1.dropped_output() >= 1001 - 200,
            "the ring holds 100: {} dropped",
            com1.dropped_output()
        );
    }

    /// A non-blocking pipe of one page: the log as the box has it (a
    /// virtio-serial port the host may stop reading), and its reader.
    fn pipe_log() -> (std::fs::File, std::fs::File) {
        use std::os::fd::FromRawFd;
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two new descriptors into `fds`.
        assert_eq!(
            unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) },
            0
        );
        // SAFETY: both are fresh descriptors this test owns alone.
        let (reader, writer) = unsafe {
            (
                std::fs::File::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        };
        // SAFETY: F_SETPIPE_SZ on a pipe this test owns.
        unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, 4096) };
        (reader, writer)
    }

    /// Output the guest writes byte by byte to THR, as the UART sees it.
    fn transmit(com1: &SerialConsole, text: &[u8]) {
        for b in text {
            com1.write(0, 0, &[*b]);
        }
    }

    fn read_some(reader: &mut std::fs::File, into: &mut Vec<u8>) {
        use std::io::Read;
        let mut buf = [0u8; 8192];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            into.extend_from_slice(&buf[..n]);
        }
    }

    /// A log that would block (nobody reads the pipe): the event loop's
    /// drain returns at once, the rest waits in the ring, and once the
    /// reader goes on every byte arrives, in order, once. (Before, the
    /// drain waited in a blocking log, holding up the agent channel on the
    /// same loop; given a non-blocking one it dropped the log.)
    #[test]
    fn a_log_that_would_block_does_not_hold_the_drain_and_loses_nothing() {
        let (mut reader, writer) = pipe_log();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let com1 =
            SerialConsole::new(irq, Some(Box::new(writer)), Arc::default(), OUTPUT_RING).unwrap();
        let text: Vec<u8> = (0..100_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        transmit(&com1, &text);
        let start = Instant::now();
        com1.drain();
        assert!(start.elapsed() < Duration::from_secs(2), "the drain waited");
        assert!(
            com1.pending_output() > 50_000,
            "the rest waits in the ring: {} bytes",
            com1.pending_output()
        );
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < text.len() && Instant::now() < deadline {
            read_some(&mut reader, &mut got);
            com1.drain();
        }
        assert_eq!(got.len(), text.len());
        assert!(got == text, "the bytes came out of order or twice");
        assert_eq!(com1.dropped_output(), 0);
        assert!(com1.log.lock().unwrap().out.is_some(), "the log was kept");
    }

    /// At the run's end a log that stays stalled is waited for a bounded
    /// time, and what it did not take is counted as dropped.
    #[test]
    fn the_exit_flush_counts_what_a_stalled_log_did_not_take() {
        let (mut reader, writer) = pipe_log();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let com1 =
            SerialConsole::new(irq, Some(Box::new(writer)), Arc::default(), OUTPUT_RING).unwrap();
        transmit(&com1, &[b'q'; 20_000]);
        let start = Instant::now();
        com1.flush();
        let took = start.elapsed();
        assert!(
            took >= FLUSH_PATIENCE && took < FLUSH_PATIENCE + Duration::from_secs(2),
            "the flush took {took:?}"
        );
        let mut got = Vec::new();
        read_some(&mut reader, &mut got);
        assert!(
            !got.is_empty() && got.len() < 20_000,
            "{} written",
            got.len()
        );
        assert_eq!(got.len() as u64 + com1.dropped_output(), 20_000);
        assert_eq!(com1.pending_output(), 0);
    }

    #[test]
    fn the_exit_flush_gives_up_on_a_log_locked_for_good() {
        let (com1, log, _) = console();
        com1.write(0, 0, b"z");
        let held = com1.log.lock().unwrap(); // as a panic inside a drain leaves it
        com1.flush();
        drop(held);
        assert!(log.0.lock().unwrap().is_empty());
        com1.flush();
        assert_eq!(log.0.lock().unwrap().as_slice(), b"z");
    }

    #[test]
    fn the_ring_keeps_order_across_its_wrap() {
        let ring = OutputRing::new(7);
        let mut got = Vec::new();
        let mut buf = [0u8; 5];
        for i in 0..100u8 {
            assert_eq!(ring.push(i), usize::from(i % 3) + 1);
            if i % 3 == 2 {
                let n = ring.pop(&mut buf);
                got.extend_from_slice(&buf[..n]);
            }
        }
        let n = ring.pop(&mut buf);
        got.extend_from_slice(&buf[..n]);
        assert_eq!(got, (0..100).collect::<Vec<u8>>());
        assert_eq!(ring.dropped(), 0);
    }

    #[test]
    fn only_transmit_register_writes_reach_the_log_whatever_the_guest_sets() {
        // Through the port bus, as a guest's `out`s and `rep ins`s come.
        let (com1, log, _) = console_with(1024);
        let mut bus = crate::devices::bus::Bus::new("port");
        let com1 = Arc::new(com1);
        bus.insert("COM1", COM1_BASE, COM1_LEN, com1.clone())
            .unwrap();
        let (thr, lcr, mcr) = (COM1_BASE, COM1_BASE + 3, COM1_BASE + 4);
        bus.write(0, thr, b"a");
        // The divisor latch: offsets 0 and 1 are the divisor, not THR.
        bus.write(0, lcr, &[0x80]);
        bus.write_string(0, thr, 1, &[0x55; 300]);
        let mut divisor = [0u8; 2];
        bus.read(0, thr, &mut divisor);
        assert_eq!(divisor, [0x55, 0], "the divisor, not received data");
        bus.write(0, lcr, &[0x03]);
        // Loopback: THR feeds the receive FIFO, which holds 64 bytes.
        bus.write(0, mcr, &[0x10]);
        bus.write_string(0, thr, 1, &[b'L'; 1000]);
        let mut looped = [0u8; 1000];
        bus.read_string(0, thr, 1, &mut looped);
        assert_eq!(looped.iter().filter(|&&b| b == b'L').count(), 64);
        bus.write(0, mcr, &[0x08]);
        // A 16-bit `out` is THR then IER, as an ISA bus splits it; a 32-bit
        // one at offset 6 straddles the end and reaches nothing.
        bus.write(0, thr, &[b'b', 0]);
        bus.write(0, COM1_BASE + 6, b"wxyz");
        assert_eq!(bus.unknown_accesses(), 1);
        bus.write_string(0, thr, 1, b"c\n");
        com1.drain();
        assert_eq!(log.0.lock().unwrap().as_slice(), b"abc\n");
        assert_eq!(com1.output_bytes(), 4, "only THR's bytes are output");
        assert_eq!(com1.dropped_output(), 0);
        assert_eq!(com1.pending_output(), 0);
    }

    #[test]
    fn string_output_reaches_the_log_whole() {
        // `rep outsb` of a line to THR, through the port bus.
        let (com1, log, _) = console();
        let mut bus = crate::devices::bus::Bus::new("port");
        let com1 = Arc::new(com1);
        bus.insert("COM1", COM1_BASE, COM1_LEN, com1.clone())
            .unwrap();
        bus.write_string(0, COM1_BASE, 1, b"rep outsb\n");
        com1.drain();
        assert_eq!(log.0.lock().unwrap().as_slice(), b"rep outsb\n");
    }
}
