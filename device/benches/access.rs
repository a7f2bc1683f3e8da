//! Nanoseconds per guest register access in the device model, the figure
//! `cargo xtask bench` reports as "device: model ns/access" (goal: at most
//! 100 ns). Each access moves time forward, so traffic lands on every one,
//! as it does in a running guest.

use std::hint::black_box;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{criterion_group, criterion_main, Criterion};
use perfbed_device::regs::{self, Event};
use perfbed_device::{Device, DeviceConfig, SharedDevice};

/// A device as the scenario leaves it: owners set, every slot counting,
/// a steady rate and queued traffic in both domains.
fn busy_device() -> Device {
    let mut device = Device::new(DeviceConfig::default()).expect("the default config is valid");
    for d in 0..2u64 {
        device.write(
            0,
            (d * 2) as u32,
            regs::domain_reg(d, regs::DOM_OWNER),
            8,
            d * 2,
        );
        for s in 0..4u64 {
            let event = if s % 2 == 0 {
                Event::MbmTotalBytes
            } else {
                Event::MbmLocalBytes
            };
            device.write(
                0,
                (d * 2) as u32,
                regs::slot_ctl(d, s),
                8,
                regs::slot_ctl_value(event, s),
            );
        }
        device
            .set_rate(0, d as u32, 1, Event::MbmTotalBytes, 100 << 20)
            .expect("rate fits");
        device
            .inject(0, d as u32, 2, Event::MbmLocalBytes, u64::MAX / 4)
            .expect("valid injection");
    }
    device
}

/// The benchmark thread's CPU time, not wall time: on a shared 2-core
/// machine the wall clock mostly measures the other processes. Reading it is
/// a system call, which criterion's batching amortises.
struct ThreadCpuTime;

/// Only for its formatter: values are nanoseconds either way.
static NANOSECONDS: WallTime = WallTime;

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec for the kernel to fill; this clock always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, value: &u64) -> f64 {
        *value as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        NANOSECONDS.formatter()
    }
}

type Bench = Criterion<ThreadCpuTime>;

fn model(c: &mut Bench) {
    let mut group = c.benchmark_group("model");
    let mut device = busy_device();
    let mut now = 0u64;
    group.bench_function("owner_counter_read", |b| {
        b.iter(|| {
            now += 1000;
            black_box(device.read(now, 0, regs::slot_count(0, 1), 8))
        })
    });
    let mut device = busy_device();
    group.bench_function("violating_counter_read", |b| {
        b.iter(|| {
            now += 1000;
            black_box(device.read(now, 3, regs::slot_count(0, 1), 8))
        })
    });
    let mut device = busy_device();
    group.bench_function("global_read", |b| {
        b.iter(|| {
            now += 1000;
            black_box(device.read(now, 1, regs::REG_MAGIC, 8))
        })
    });
    let mut device = busy_device();
    group.bench_function("slot_ctl_write", |b| {
        b.iter(|| {
            now += 1000;
            device.write(
                now,
                0,
                regs::slot_ctl(0, 3),
                8,
                regs::slot_ctl_value(Event::MbmTotalBytes, 5),
            )
        })
    });
    group.finish();
}

/// What a host calls: the lock and the clock around one model access.
fn shared(c: &mut Bench) {
    let shared = SharedDevice::new(DeviceConfig::default()).expect("the default config is valid");
    shared.mmio_write(0, regs::domain_reg(0, regs::DOM_OWNER), 8, 0);
    shared.mmio_write(
        0,
        regs::slot_ctl(0, 0),
        8,
        regs::slot_ctl_value(Event::MbmTotalBytes, 1),
    );
    let mut group = c.benchmark_group("shared");
    group.bench_function("owner_counter_read", |b| {
        b.iter(|| black_box(shared.mmio_read(0, regs::slot_count(0, 0), 8)))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = model, shared
}
criterion_main!(benches);
