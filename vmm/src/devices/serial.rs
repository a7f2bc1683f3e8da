//! The 8250 serial console (vm-superio) on COM1, its output to a log file.
//!
//! The output is also watched for the kernel's panic banner: a panicking
//! guest (`panic=-1`) and a rebooting one both end in a reset, and this is
//! how the VMM tells them apart for its exit status.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use super::bus::BusDevice;

/// COM1's ports and interrupt.
pub const COM1_BASE: u64 = 0x3f8;
pub const COM1_LEN: u64 = 8;
pub const COM1_IRQ: u32 = 4;

/// What the kernel prints when it panics.
const PANIC_BANNER: &[u8] = b"Kernel panic - not syncing";
/// Longest line kept for the banner search.
const MAX_LINE: usize = 512;

/// Raises the serial interrupt through an irqfd.
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = io::Error;
    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// The console's output: a log (or nothing), watched line by line.
pub struct ConsoleSink {
    out: Option<Box<dyn Write + Send>>,
    line: Vec<u8>,
    panicked: Arc<AtomicBool>,
}

impl ConsoleSink {
    pub fn new(out: Option<Box<dyn Write + Send>>, panicked: Arc<AtomicBool>) -> ConsoleSink {
        ConsoleSink { out, line: Vec::new(), panicked }
    }
}

impl Write for ConsoleSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        for &byte in buf {
            if byte == b'\n' {
                if self.line.windows(PANIC_BANNER.len()).any(|w| w == PANIC_BANNER) {
                    self.panicked.store(true, Ordering::SeqCst);
                }
                self.line.clear();
            } else if self.line.len() < MAX_LINE {
                self.line.push(byte);
            }
        }
        if let Some(out) = &mut self.out {
            // Whole lines reach the log at once (a panic's last words must
            // be there even if the VMM is killed); a full disk must not stop
            // the guest: the log loses bytes.
            let flush = buf.contains(&b'\n');
            if out.write_all(buf).is_err() || (flush && out.flush().is_err()) {
                self.out = None;
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.out {
            Some(out) => out.flush(),
            None => Ok(()),
        }
    }
}

/// COM1 on the port bus.
pub struct SerialConsole {
    serial: Mutex<Serial<IrqTrigger, NoEvents, ConsoleSink>>,
}

impl SerialConsole {
    pub fn new(irq: EventFd, sink: ConsoleSink) -> SerialConsole {
        SerialConsole { serial: Mutex::new(Serial::new(IrqTrigger(irq), sink)) }
    }

    /// Flushes the log (at exit).
    pub fn flush(&self) {
        let mut serial = self.serial.lock().unwrap_or_else(|p| p.into_inner());
        let _ = serial.writer_mut().flush();
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
            // Only a failing interrupt trigger errs; the byte is logged anyway.
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

    fn console() -> (SerialConsole, Shared, Arc<AtomicBool>) {
        let log = Shared::default();
        let panicked = Arc::new(AtomicBool::new(false));
        let sink = ConsoleSink::new(Some(Box::new(log.clone())), panicked.clone());
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        (SerialConsole::new(irq, sink), log, panicked)
    }

    #[test]
    fn transmitted_bytes_reach_the_log() {
        let (com1, log, panicked) = console();
        for b in b"hello\n" {
            com1.write(0, 0, &[*b]); // THR
        }
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
        let mut sink = ConsoleSink::new(Some(Box::new(Broken)), Arc::new(AtomicBool::new(false)));
        assert_eq!(sink.write(b"abc").unwrap(), 3);
        assert!(sink.out.is_none());
        assert_eq!(sink.write(b"def").unwrap(), 3);
    }
}
