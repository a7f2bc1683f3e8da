//! The transport's rules (see the module's doc), one test each.

use super::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use vmm_sys_util::eventfd::EventFd;

/// A device whose `process` says it used the queues in `uses`.
struct Fake {
    processed: Arc<AtomicU32>,
    resets: Arc<AtomicU32>,
    uses: u32,
}

impl VirtioDevice for Fake {
    fn device_type(&self) -> u32 {
        3
    }
    fn features(&self) -> u64 {
        1 << 1
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &[16, 16]
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        data.fill(offset as u8 + 1);
    }
    fn process(&mut self, _: &mut [Queue], _: &GuestMemoryMmap) -> Progress {
        self.processed.fetch_add(1, Ordering::SeqCst);
        Progress {
            used: self.uses,
            more: false,
        }
    }
    fn reset(&mut self) {
        self.resets.fetch_add(1, Ordering::SeqCst);
    }
}

struct Rig {
    t: MmioTransport<Fake>,
    memory: GuestMemoryMmap,
    processed: Arc<AtomicU32>,
    resets: Arc<AtomicU32>,
    irq: EventFd,
}

fn rig_using(uses: u32) -> Rig {
    let processed = Arc::new(AtomicU32::new(0));
    let resets = Arc::new(AtomicU32::new(0));
    let memory = crate::memory::create_guest_memory(64).unwrap();
    let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let interrupt = Interrupt::new(irq.try_clone().unwrap());
    let fake = Fake {
        processed: processed.clone(),
        resets: resets.clone(),
        uses,
    };
    Rig {
        t: MmioTransport::new(fake, memory.clone(), interrupt).unwrap(),
        memory,
        processed,
        resets,
        irq,
    }
}

fn rig() -> Rig {
    rig_using(0)
}

const ACK_DRIVER: u32 = STATUS_ACKNOWLEDGE | STATUS_DRIVER;

impl Rig {
    fn read(&self, offset: u64) -> u32 {
        let mut data = [0u8; 4];
        self.t.read(0, offset, &mut data);
        u32::from_le_bytes(data)
    }

    fn write(&self, offset: u64, value: u32) {
        self.t.write(0, offset, &value.to_le_bytes());
    }

    fn status(&self) -> u32 {
        self.read(REG_STATUS)
    }

    /// The driver's side of §3.1.1 up to FEATURES_OK, with `features`.
    fn negotiate(&self, features: u64) {
        self.write(REG_STATUS, STATUS_ACKNOWLEDGE);
        self.write(REG_STATUS, ACK_DRIVER);
        for sel in 0..2 {
            self.write(REG_DRIVER_FEATURES_SEL, sel);
            self.write(REG_DRIVER_FEATURES, (features >> (32 * sel)) as u32);
        }
        self.write(REG_STATUS, ACK_DRIVER | STATUS_FEATURES_OK);
    }

    /// Places queue `queue` (size 16) at `base` and makes it ready.
    fn set_up_queue(&self, queue: u32, base: u64) {
        self.write(REG_QUEUE_SEL, queue);
        self.write(REG_QUEUE_NUM, 16);
        for (low, value) in [
            (REG_QUEUE_DESC_LOW, base),
            (REG_QUEUE_DRIVER_LOW, base + 0x1000),
            (REG_QUEUE_DEVICE_LOW, base + 0x2000),
        ] {
            self.write(low, value as u32);
            self.write(low + 4, (value >> 32) as u32);
        }
        self.write(REG_QUEUE_READY, 1);
    }

    fn live(&self) {
        self.negotiate(VIRTIO_F_VERSION_1);
        self.set_up_queue(0, 0x10_0000);
        self.set_up_queue(1, 0x20_0000);
        self.write(
            REG_STATUS,
            ACK_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK,
        );
        assert_eq!(self.status() & STATUS_DRIVER_OK, STATUS_DRIVER_OK);
    }

    fn queue<R>(&self, index: usize, f: impl FnOnce(&Queue) -> R) -> R {
        f(&self.t.lock().queues[index])
    }

    fn interrupted(&self) -> bool {
        self.irq.read().is_ok()
    }
}

#[test]
fn identifies_itself() {
    let r = rig();
    assert_eq!(r.read(REG_MAGIC), MAGIC);
    assert_eq!(r.read(REG_VERSION), 2);
    assert_eq!(r.read(REG_DEVICE_ID), 3);
    assert_eq!(r.read(REG_DEVICE_FEATURES), 1 << 1);
    r.write(REG_DEVICE_FEATURES_SEL, 1);
    assert_eq!(r.read(REG_DEVICE_FEATURES), 1, "VERSION_1 is bit 32");
    r.write(REG_QUEUE_SEL, 1);
    assert_eq!(r.read(REG_QUEUE_NUM_MAX), 16);
    r.write(REG_QUEUE_SEL, 2);
    assert_eq!(r.read(REG_QUEUE_NUM_MAX), 0, "no third queue");
    let mut config = [0u8; 2];
    r.t.read(0, CONFIG_SPACE + 4, &mut config);
    assert_eq!(config, [5, 5]);
}

#[test]
fn there_is_no_shared_memory_region() {
    let r = rig();
    // SHMSel (0xac), SHMLenLow (0xb0), SHMLenHigh (0xb4): -1 for any
    // region (virtio 1.2 §4.2.2), which Linux's vm_get_shm_region takes for
    // "none"; 0 would be a region of length 0.
    for region in [0, 1, u32::MAX] {
        r.write(0xac, region);
        assert_eq!(
            (r.read(0xb0), r.read(0xb4)),
            (u32::MAX, u32::MAX),
            "region {region}"
        );
    }
}

#[test]
fn only_offered_features_are_taken() {
    let r = rig();
    r.negotiate(u64::MAX);
    assert_eq!(r.t.driver_features(), (1 << 1) | VIRTIO_F_VERSION_1);
}

#[test]
fn features_ok_needs_version_1() {
    let r = rig();
    r.negotiate(1 << 1);
    assert_eq!(
        r.status(),
        ACK_DRIVER,
        "a legacy driver's FEATURES_OK must not stick"
    );
    r.write(REG_STATUS, 0);
    r.negotiate(VIRTIO_F_VERSION_1);
    assert_eq!(r.status(), ACK_DRIVER | STATUS_FEATURES_OK);
}

#[test]
fn features_ok_needs_acknowledge_and_driver() {
    let r = rig();
    r.write(REG_DRIVER_FEATURES_SEL, 1);
    r.write(REG_DRIVER_FEATURES, 1);
    r.write(REG_STATUS, STATUS_FEATURES_OK);
    assert_eq!(r.status(), 0);
}

#[test]
fn driver_features_are_fixed_after_features_ok() {
    let r = rig();
    r.negotiate(VIRTIO_F_VERSION_1);
    r.write(REG_DRIVER_FEATURES_SEL, 0);
    r.write(REG_DRIVER_FEATURES, 1 << 1);
    assert_eq!(r.t.driver_features(), VIRTIO_F_VERSION_1);
}

#[test]
fn driver_ok_needs_features_ok() {
    let r = rig();
    r.write(REG_STATUS, ACK_DRIVER);
    r.write(REG_STATUS, ACK_DRIVER | STATUS_DRIVER_OK);
    assert_eq!(r.status(), ACK_DRIVER, "DRIVER_OK without FEATURES_OK");
    r.t.poll(|_| {});
    assert_eq!(r.processed.load(Ordering::SeqCst), 0, "the device ran");
    // Refused too when FEATURES_OK was itself refused in the same write.
    r.write(
        REG_STATUS,
        ACK_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK,
    );
    assert_eq!(r.status(), ACK_DRIVER);
}

#[test]
fn status_bits_are_cleared_only_by_a_reset() {
    let r = rig();
    r.negotiate(VIRTIO_F_VERSION_1);
    r.write(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_FEATURES_OK);
    assert_eq!(
        r.status(),
        ACK_DRIVER | STATUS_FEATURES_OK,
        "a write clearing DRIVER was taken"
    );
    r.write(REG_STATUS, ACK_DRIVER | STATUS_FEATURES_OK | STATUS_FAILED);
    assert_eq!(
        r.status() & STATUS_FAILED,
        STATUS_FAILED,
        "FAILED is taken at any time"
    );
    r.write(REG_STATUS, 0);
    assert_eq!(r.status(), 0);
    assert_eq!(r.resets.load(Ordering::SeqCst), 1);
}

#[test]
fn a_notify_wakes_the_event_loop_and_never_runs_the_device() {
    let r = rig();
    let notifiers = r.t.notifiers().unwrap();
    r.live();
    for n in &notifiers {
        assert_eq!(n.read().unwrap(), 1, "DRIVER_OK wakes every queue");
    }
    r.write(REG_QUEUE_NOTIFY, 1);
    r.write(REG_QUEUE_NOTIFY, 7); // no such queue: nothing
    assert_eq!(
        r.processed.load(Ordering::SeqCst),
        0,
        "the vCPU ran the device"
    );
    assert_eq!(notifiers[1].read().unwrap(), 1);
    assert!(notifiers[0].read().is_err(), "queue 0 was not notified");
    r.t.poll(|_| {});
    assert_eq!(r.processed.load(Ordering::SeqCst), 1);
}

#[test]
fn the_device_runs_only_when_live_and_resets_on_zero() {
    let r = rig();
    r.t.poll(|_| {});
    assert_eq!(r.processed.load(Ordering::SeqCst), 0);
    r.live();
    r.t.poll(|_| {});
    assert_eq!(r.processed.load(Ordering::SeqCst), 1);
    r.write(REG_STATUS, 0);
    assert_eq!(r.resets.load(Ordering::SeqCst), 1);
    assert_eq!(r.status(), 0);
    assert!(
        !r.queue(0, |q| q.ready()),
        "a reset makes the queues not ready"
    );
    r.t.poll(|_| {});
    assert_eq!(r.processed.load(Ordering::SeqCst), 1);
}

#[test]
fn queue_registers_are_fixed_while_the_queue_is_ready() {
    let r = rig();
    r.live();
    r.write(REG_QUEUE_SEL, 0);
    r.write(REG_QUEUE_NUM, 8);
    r.write(REG_QUEUE_DESC_LOW, 0x30_0000);
    r.write(REG_QUEUE_DRIVER_LOW, 0x30_1000);
    r.write(REG_QUEUE_DEVICE_HIGH, 1);
    let (size, desc, avail, used) = r.queue(0, |q| {
        (q.size(), q.desc_table(), q.avail_ring(), q.used_ring())
    });
    assert_eq!(
        (size, desc, avail, used),
        (16, 0x10_0000, 0x10_1000, 0x10_2000)
    );
    assert_eq!(r.status() & STATUS_NEEDS_RESET, 0, "ignored, not an error");
    // Once the driver stops the queue it may change it.
    r.write(REG_QUEUE_READY, 0);
    assert_eq!(r.read(REG_QUEUE_READY), 0);
    r.write(REG_QUEUE_NUM, 8);
    assert_eq!(r.queue(0, |q| q.size()), 8);
}

#[test]
fn queue_num_must_be_a_power_of_two_within_the_maximum() {
    for bad in [0u32, 12, 32, 0x1_0010] {
        let r = rig();
        r.negotiate(VIRTIO_F_VERSION_1);
        r.write(REG_QUEUE_SEL, 0);
        r.write(REG_QUEUE_NUM, 8);
        r.write(REG_QUEUE_NUM, bad);
        assert_eq!(r.queue(0, |q| q.size()), 8, "QueueNum {bad} was taken");
        // The queue cannot be made ready with a refused configuration.
        r.write(REG_QUEUE_DESC_LOW, 0x10_0000);
        r.write(REG_QUEUE_DRIVER_LOW, 0x10_1000);
        r.write(REG_QUEUE_DEVICE_LOW, 0x10_2000);
        r.write(REG_QUEUE_READY, 1);
        assert_eq!(r.read(REG_QUEUE_READY), 0, "QueueNum {bad}");
        assert_eq!(
            r.status() & STATUS_NEEDS_RESET,
            STATUS_NEEDS_RESET,
            "QueueNum {bad}"
        );
        // A reset clears it all.
        r.write(REG_STATUS, 0);
        assert_eq!(r.status(), 0);
        r.negotiate(VIRTIO_F_VERSION_1);
        r.set_up_queue(0, 0x10_0000);
        assert_eq!(r.read(REG_QUEUE_READY), 1, "after a reset, QueueNum {bad}");
    }
}

#[test]
fn misaligned_or_absent_rings_need_a_reset() {
    // A descriptor table must be 16-byte aligned.
    let r = rig();
    r.negotiate(VIRTIO_F_VERSION_1);
    r.set_up_queue(0, 0x10_0008);
    assert_eq!(r.read(REG_QUEUE_READY), 0);
    assert_eq!(r.status() & STATUS_NEEDS_RESET, STATUS_NEEDS_RESET);
    // Rings beyond guest memory; once live, the driver is told.
    let r = rig();
    r.live();
    let _ = r.irq.read(); // start from no interrupt
    r.write(REG_QUEUE_SEL, 0);
    r.write(REG_QUEUE_READY, 0);
    r.write(REG_QUEUE_DESC_HIGH, 0x10);
    r.write(REG_QUEUE_READY, 1);
    assert_eq!(r.read(REG_QUEUE_READY), 0);
    assert_eq!(r.status() & STATUS_NEEDS_RESET, STATUS_NEEDS_RESET);
    assert_eq!(
        r.read(REG_INTERRUPT_STATUS) & super::super::INTERRUPT_CONFIG,
        super::super::INTERRUPT_CONFIG
    );
    assert!(r.interrupted(), "no configuration interrupt");
}

#[test]
fn no_interrupt_is_honoured() {
    let r = rig_using(1 << 1);
    r.live();
    let avail_flags = GuestAddress(0x20_1000);
    r.memory
        .write_obj(AVAIL_F_NO_INTERRUPT.to_le(), avail_flags)
        .unwrap();
    r.t.poll(|_| {});
    assert!(
        !r.interrupted(),
        "interrupted although the driver said NO_INTERRUPT"
    );
    assert_eq!(r.read(REG_INTERRUPT_STATUS), 0);
    r.memory.write_obj(0u16, avail_flags).unwrap();
    r.t.poll(|_| {});
    assert!(r.interrupted());
    assert_eq!(
        r.read(REG_INTERRUPT_STATUS),
        super::super::INTERRUPT_USED_RING
    );
    // Flags of a queue the device did not use do not matter.
    r.write(REG_INTERRUPT_ACK, 1);
    r.memory
        .write_obj(AVAIL_F_NO_INTERRUPT.to_le(), GuestAddress(0x10_1000))
        .unwrap();
    r.t.poll(|_| {});
    assert!(r.interrupted());
}

#[test]
fn odd_accesses_are_ignored() {
    let r = rig();
    r.t.write(0, REG_STATUS, &[4]);
    r.t.write(0, REG_STATUS + 1, &[4, 0, 0, 0]);
    assert_eq!(r.status(), 0);
    let mut byte = [0xaa];
    r.t.read(0, REG_MAGIC, &mut byte);
    assert_eq!(byte, [0]);
    r.t.write(0, 0xdead_0000, &[1, 2, 3, 4]);
}

#[test]
fn a_driver_retrying_rings_outside_memory_is_not_logged() {
    let r = rig();
    r.negotiate(VIRTIO_F_VERSION_1);
    // Aligned, so taken, but far past the 64 MiB of guest memory; each
    // QueueReady write is a vCPU's exit.
    let shown = crate::logger::capture::shown_during(|| {
        for _ in 0..100 {
            r.set_up_queue(0, 0x10_0000_0000);
        }
    });
    assert_eq!(r.read(REG_QUEUE_READY), 0);
    assert_ne!(r.status() & STATUS_NEEDS_RESET, 0);
    assert!(
        shown.is_empty(),
        "a vCPU wrote {} log lines, the first {:?}",
        shown.len(),
        shown.first()
    );
}
