//! Seeds from a real run: perfbed-vmm's record of the guest's first accesses
//! to each bus (`--record-accesses N`, the `perfbed-vmm: access` lines of
//! its report; `PERFBED_VMM_RECORD_ACCESSES=N cargo xtask run --host vmm`
//! puts them in the run's box.log or vmm.log) made into inputs of
//! `vmm_bus` and `vmm_console`, encoded as the bytes libFuzzer's
//! `arbitrary` decodes back into those inputs (the tests check the round
//! trip, so a change of the inputs' shape shows here).
//!
//! - `vmm_bus`: every MMIO access, in order, on its vCPU, at its offset in
//!   the monitoring device or the virtio-mmio transport (else at its
//!   address), with a poll of the event loop after each write to the
//!   transport; in chunks of the target's 512 operations.
//! - `vmm_console`: the bytes the guest wrote to COM1's transmit register,
//!   one `outb` each as the kernel's 8250 driver writes them, the event
//!   loop draining the ring after each line; in chunks of the target's 256
//!   operations.
//!
//! What the record cannot carry: the queue notifies (they reach the event
//! loop through ioeventfds, not the bus), guest memory (rings and buffers),
//! and the agent channel's bytes.

use perfbed_vmm::devices::serial::COM1_BASE;
use perfbed_vmm::memory::{PERFBED_DEVICE_BASE, VIRTIO_MMIO_BASE};

use crate::{vmm_bus, vmm_console};

/// One recorded access.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub mmio: bool,
    pub write: bool,
    pub vcpu: u32,
    pub addr: u64,
    pub size: u32,
    pub value: u64,
}

/// The accesses in a log: every line holding `perfbed-vmm: access `.
pub fn parse(log: &str) -> Vec<Access> {
    log.lines()
        .filter_map(|l| parse_line(l.split_once("perfbed-vmm: access ")?.1))
        .collect()
}

fn parse_line(rest: &str) -> Option<Access> {
    let f: Vec<&str> = rest.split_whitespace().collect();
    let [bus, dir, vcpu, addr, size, value] = f[..] else { return None };
    let hex = |s: &str| u64::from_str_radix(s.strip_prefix("0x")?, 16).ok();
    Some(Access {
        mmio: match bus {
            "mmio" => true,
            "port" => false,
            _ => return None,
        },
        write: match dir {
            "w" => true,
            "r" => false,
            _ => return None,
        },
        vcpu: vcpu.parse().ok()?,
        addr: hex(addr)?,
        size: size.parse().ok()?,
        value: hex(value)?,
    })
}

/// The bytes `arbitrary` turns back into a value: the inverse of its
/// decoding for the shapes the two inputs use.
#[derive(Default)]
struct Encoder(Vec<u8>);

impl Encoder {
    /// Variant `index` of an enum of `count`: `arbitrary` takes a `u32` and
    /// picks `(u32 * count) >> 32`.
    fn variant(&mut self, index: u32, count: u32) {
        let tag = (u64::from(index) << 32).div_ceil(u64::from(count));
        self.0.extend_from_slice(&(tag as u32).to_le_bytes());
    }
    fn bool(&mut self, b: bool) {
        self.0.push(u8::from(b));
    }
    /// A collection: a "one more" byte before each element, a 0 after.
    fn seq<T>(&mut self, items: &[T], mut each: impl FnMut(&mut Encoder, &T)) {
        for item in items {
            self.bool(true);
            each(self, item);
        }
        self.bool(false);
    }
}

const BUS_OPS: usize = 512;
const CONSOLE_OPS: usize = 256;
/// The monitoring device's MMIO range as the fuzz target offsets into it.
const PERFBED_WINDOW: u64 = 0x1_0000;
const VIRTIO_WINDOW: u64 = 0x200;

fn bus_ops(accesses: &[Access]) -> Vec<vmm_bus::Op> {
    let mut ops = Vec::new();
    for a in accesses.iter().filter(|a| a.mmio) {
        let (region, offset) = if (PERFBED_DEVICE_BASE..PERFBED_DEVICE_BASE + PERFBED_WINDOW).contains(&a.addr) {
            (vmm_bus::Region::Perfbed, (a.addr - PERFBED_DEVICE_BASE) as u16)
        } else if (VIRTIO_MMIO_BASE..VIRTIO_MMIO_BASE + VIRTIO_WINDOW).contains(&a.addr) {
            (vmm_bus::Region::Virtio, (a.addr - VIRTIO_MMIO_BASE) as u16)
        } else {
            (vmm_bus::Region::Far(a.addr), 0)
        };
        let size = match a.size {
            4 => vmm_bus::Size::Four,
            8 => vmm_bus::Size::Eight,
            n => vmm_bus::Size::Any(n as u8),
        };
        let virtio_write = a.write && matches!(region, vmm_bus::Region::Virtio);
        ops.push(vmm_bus::Op::Mmio { vcpu: a.vcpu, region, offset, size, write: a.write, value: a.value });
        if virtio_write {
            ops.push(vmm_bus::Op::Poll);
        }
    }
    ops
}

fn encode_bus(ops: &[vmm_bus::Op]) -> Vec<u8> {
    let mut e = Encoder::default();
    e.bool(false); // not started live: the recorded driver sets the device up
    e.seq(ops, |e, op| match op {
        vmm_bus::Op::Mmio { vcpu, region, offset, size, write, value } => {
            e.variant(0, 10);
            e.0.extend_from_slice(&vcpu.to_le_bytes());
            match region {
                vmm_bus::Region::Perfbed => e.variant(0, 3),
                vmm_bus::Region::Virtio => e.variant(1, 3),
                vmm_bus::Region::Far(a) => {
                    e.variant(2, 3);
                    e.0.extend_from_slice(&a.to_le_bytes());
                }
            }
            e.0.extend_from_slice(&offset.to_le_bytes());
            match size {
                vmm_bus::Size::Four => e.variant(0, 3),
                vmm_bus::Size::Eight => e.variant(1, 3),
                vmm_bus::Size::Any(n) => {
                    e.variant(2, 3);
                    e.0.push(*n);
                }
            }
            e.bool(*write);
            e.0.extend_from_slice(&value.to_le_bytes());
        }
        vmm_bus::Op::Poll => e.variant(5, 10),
        other => unreachable!("a recording makes no {other:?}"),
    });
    e.0
}

fn console_ops(accesses: &[Access]) -> Vec<vmm_console::Op> {
    let mut ops = Vec::new();
    let mut line = Vec::new();
    for a in accesses.iter().filter(|a| !a.mmio && a.write && a.addr == COM1_BASE && a.size == 1) {
        let byte = a.value as u8;
        line.push(byte);
        if byte == b'\n' || line.len() == 4096 {
            ops.push(vmm_console::Op::Serial { bytes: std::mem::take(&mut line), string: false });
            ops.push(vmm_console::Op::SerialDrain);
        }
    }
    if !line.is_empty() {
        ops.push(vmm_console::Op::Serial { bytes: line, string: false });
    }
    ops
}

fn encode_console(ops: &[vmm_console::Op]) -> Vec<u8> {
    let mut e = Encoder::default();
    e.seq(ops, |e, op| match op {
        vmm_console::Op::Serial { bytes, string } => {
            e.variant(5, 7);
            e.seq(bytes, |e, b| e.0.push(*b));
            e.bool(*string);
        }
        vmm_console::Op::SerialDrain => e.variant(6, 7),
        other => unreachable!("a recording makes no {other:?}"),
    });
    e.0
}

/// The seeds of one target from a record: (target, encoded inputs).
pub fn seeds(accesses: &[Access]) -> Vec<(&'static str, Vec<Vec<u8>>)> {
    vec![
        ("vmm_bus", bus_ops(accesses).chunks(BUS_OPS).map(encode_bus).collect()),
        ("vmm_console", console_ops(accesses).chunks(CONSOLE_OPS).map(encode_console).collect()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbitrary::{Arbitrary, Unstructured};

    const LOG: &str = "\
[  1.0] perfbed-vmm: stat vcpus=2
perfbed-vmm: access port w 0 0x3f8 1 0x68
perfbed-vmm: access port w 0 0x3f8 1 0xa
perfbed-vmm: access port r 0 0x3fd 1 0x60
perfbed-vmm: access port w 1 0x3f8 1 0x21
perfbed-vmm: access mmio r 0 0xfeb00000 4 0x74726976
perfbed-vmm: access mmio w 1 0xfeb00070 4 0xf
perfbed-vmm: access mmio r 0 0xfe000010 8 0x123456789
perfbed-vmm: access mmio w 0 0xfee00000 2 0xffff
perfbed-vmm: access mmio bogus
";

    #[test]
    fn a_record_becomes_inputs_that_arbitrary_decodes_back() {
        let accesses = parse(LOG);
        assert_eq!(accesses.len(), 8, "the malformed line is skipped");
        let bus = bus_ops(&accesses);
        let decoded = vmm_bus::Input::arbitrary_take_rest(Unstructured::new(&encode_bus(&bus))).unwrap();
        let expected = vmm_bus::Input { live: None, ops: bus.clone() };
        assert_eq!(format!("{decoded:?}"), format!("{expected:?}"));
        assert_eq!(bus.len(), 5, "four accesses and a poll after the transport's write");
        assert!(format!("{:?}", bus[4]).contains("Far(4276092928)"), "{:?}", bus[4]);

        let console = console_ops(&accesses);
        let decoded = vmm_console::Input::arbitrary_take_rest(Unstructured::new(&encode_console(&console))).unwrap();
        let expected = vmm_console::Input { ops: console.clone() };
        assert_eq!(format!("{decoded:?}"), format!("{expected:?}"));
        assert_eq!(format!("{console:?}"), "[Serial { bytes: [104, 10], string: false }, SerialDrain, Serial { bytes: [33], string: false }]");
    }

    #[test]
    fn long_records_are_cut_to_the_targets_lengths() {
        let log: String =
            (0..1200).map(|i| format!("perfbed-vmm: access mmio r 0 {:#x} 4 0x0\n", 0xfe00_0000u64 + 4 * (i % 64))).collect();
        let seeds = seeds(&parse(&log));
        assert_eq!(seeds[0].1.len(), 3, "1200 operations in chunks of 512");
        assert!(seeds[1].1.is_empty(), "no serial output, no console seed");
        for seed in &seeds[0].1 {
            vmm_bus::run(&vmm_bus::Input::arbitrary_take_rest(Unstructured::new(seed)).unwrap());
        }
    }
}
