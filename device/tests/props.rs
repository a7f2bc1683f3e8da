//! Property tests: no guest or host input panics the device, and counting is
//! exact.

use perfbed_device::regs::{self, Event};
use perfbed_device::{Device, DeviceConfig};
use proptest::prelude::*;

const SEC: u64 = 1_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    Read {
        dt: u64,
        vcpu: u32,
        offset: u64,
        size: u32,
    },
    Write {
        dt: u64,
        vcpu: u32,
        offset: u64,
        size: u32,
        value: u64,
    },
    Inject {
        dt: u64,
        domain: u32,
        rmid: u32,
        event: u64,
        bytes: u64,
    },
    Rate {
        dt: u64,
        domain: u32,
        rmid: u32,
        event: u64,
        rate: u64,
    },
    Occupancy {
        domain: u32,
        rmid: u32,
        bytes: u64,
    },
    Pending {
        dt: u64,
    },
    State {
        dt: u64,
    },
    Reset,
}

fn dt() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 0..1000u64, 0..10 * SEC, any::<u64>()]
}

fn vcpu() -> impl Strategy<Value = u32> {
    prop_oneof![0..5u32, any::<u32>()]
}

/// Offsets near real registers, plus anything at all.
fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        0..0x100u64,
        (0..3u64, 0..0x1000u64).prop_map(|(d, o)| regs::domain_reg(d, o)),
        (0..3u64, 0..6u64).prop_map(|(d, s)| regs::slot_ctl(d, s)),
        (0..3u64, 0..6u64).prop_map(|(d, s)| regs::slot_count(d, s)),
        (0..3u64, 0..10u64).prop_map(|(d, r)| regs::occupancy(d, r)),
        any::<u64>(),
    ]
}

fn size() -> impl Strategy<Value = u32> {
    prop_oneof![Just(8u32), Just(4), 0..17u32, any::<u32>()]
}

fn value() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        (0..5u64, 0..12u64).prop_map(|(e, r)| regs::SLOT_CTL_ASSIGNED | r << 8 | e),
        0..70u64,
        Just(regs::NO_OWNER),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (dt(), vcpu(), offset(), size()).prop_map(|(dt, vcpu, offset, size)| Op::Read { dt, vcpu, offset, size }),
        4 => (dt(), vcpu(), offset(), size(), value())
            .prop_map(|(dt, vcpu, offset, size, value)| Op::Write { dt, vcpu, offset, size, value }),
        2 => (dt(), 0..4u32, 0..10u32, 0..5u64, any::<u64>())
            .prop_map(|(dt, domain, rmid, event, bytes)| Op::Inject { dt, domain, rmid, event, bytes }),
        1 => (dt(), 0..4u32, 0..10u32, 0..5u64, prop_oneof![Just(0u64), 0..(4u64 << 30), any::<u64>()])
            .prop_map(|(dt, domain, rmid, event, rate)| Op::Rate { dt, domain, rmid, event, rate }),
        1 => (0..4u32, 0..10u32, any::<u64>()).prop_map(|(domain, rmid, bytes)| Op::Occupancy { domain, rmid, bytes }),
        1 => dt().prop_map(|dt| Op::Pending { dt }),
        1 => dt().prop_map(|dt| Op::State { dt }),
        1 => Just(Op::Reset),
    ]
}

fn config() -> impl Strategy<Value = DeviceConfig> {
    (
        1..4usize,
        1..10u32,
        1..6u32,
        8..=61u32,
        0..13u32,
        1..(1u64 << 40),
    )
        .prop_map(
            |(domains, rmids, slots, counter_width, unit_log, max_rate)| DeviceConfig {
                domains: (0..domains as u32)
                    .map(|d| vec![2 * d, 2 * d + 1])
                    .collect(),
                rmids,
                slots,
                counter_width,
                unit_bytes: 1 << unit_log,
                max_rate,
                trace_capacity: perfbed_device::TRACE_CAPACITY,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Arbitrary sequences of accesses and host inputs never panic, and the
    /// device's bookkeeping stays consistent.
    #[test]
    fn never_panics(config in config(), ops in prop::collection::vec(op(), 1..80)) {
        let mut d = Device::new(config).unwrap();
        let mut now = 0u64;
        let mut accesses = 0u64;
        for op in ops {
            match op {
                Op::Read { dt, vcpu, offset, size } => {
                    now = now.saturating_add(dt);
                    let v = d.read(now, vcpu, offset, size);
                    if size == 4 { prop_assert!(v <= u64::from(u32::MAX)); }
                    accesses += 1;
                }
                Op::Write { dt, vcpu, offset, size, value } => {
                    now = now.saturating_add(dt);
                    d.write(now, vcpu, offset, size, value);
                    accesses += 1;
                }
                Op::Inject { dt, domain, rmid, event, bytes } => {
                    now = now.saturating_add(dt);
                    if let Some(e) = Event::from_u64(event) {
                        let _ = d.inject(now, domain, rmid, e, bytes);
                    }
                }
                Op::Rate { dt, domain, rmid, event, rate } => {
                    now = now.saturating_add(dt);
                    if let Some(e) = Event::from_u64(event) {
                        let _ = d.set_rate(now, domain, rmid, e, rate);
                    }
                }
                Op::Occupancy { domain, rmid, bytes } => { let _ = d.set_occupancy(domain, rmid, bytes); }
                Op::Pending { dt } => { now = now.saturating_add(dt); d.pending_bytes(now); }
                Op::State { dt } => { now = now.saturating_add(dt); d.state(now); }
                Op::Reset => { d.reset_stats(); accesses = 0; }
            }
        }
        let state = d.state(now);
        // The ring also holds owner changes and host actions: when nothing
        // was dropped it holds every access, otherwise a full ring.
        let trace = d.trace();
        prop_assert!(state.trace_len <= perfbed_device::TRACE_CAPACITY);
        if state.trace_dropped == 0 {
            prop_assert_eq!(trace.len() as u64, accesses);
            let bad = trace.iter().filter(|e| e.bad.is_some()).count() as u64;
            prop_assert_eq!(bad, state.bad_accesses.total);
        } else {
            prop_assert_eq!(state.trace_len, perfbed_device::TRACE_CAPACITY);
        }
        for dom in &state.domains {
            prop_assert_eq!(dom.violations, dom.violations_by_vcpu.values().sum::<u64>());
            for slot in &dom.slots {
                prop_assert!(slot.register == regs::COUNTER_UNAVAILABLE
                    || slot.register <= regs::counter_mask(u64::from(state.config.counter_width)));
            }
        }
        let json = serde_json::to_string(&state).unwrap();
        prop_assert!(json.contains("\"magic\""));
    }

    /// Once nothing is pending, the truth is the sum of the injections, and a
    /// slot assigned for the whole run reads (truth / unit) mod 2^width
    /// (checked at every read along the way as well).
    #[test]
    fn counting_is_exact(
        width in 8..=30u32,
        unit_log in 0..8u32,
        max_rate in 1_000u64..(1u64 << 34),
        steps in prop::collection::vec(
            (0..2u32, 0..4u32, any::<bool>(), 0..(1u64 << 26), 0..(SEC / 4), any::<bool>()), 1..60),
    ) {
        let unit = 1u64 << unit_log;
        let mut d = Device::new(DeviceConfig {
            domains: vec![vec![0, 1], vec![2, 3]],
            rmids: 4,
            slots: 2,
            counter_width: width,
            unit_bytes: unit,
            max_rate,
            trace_capacity: perfbed_device::TRACE_CAPACITY,
        }).unwrap();
        let mask = (1u128 << width) - 1;
        // Domain 0, read from vCPU 1: slot 0 counts (total, rmid 2), slot 1 (local, rmid 3).
        d.write(0, 1, regs::domain_reg(0, regs::DOM_OWNER), 8, 1);
        d.write(0, 1, regs::slot_ctl(0, 0), 8, regs::slot_ctl_value(Event::MbmTotalBytes, 2));
        d.write(0, 1, regs::slot_ctl(0, 1), 8, regs::slot_ctl_value(Event::MbmLocalBytes, 3));
        let mut sums = [[[0u128; 2]; 4]; 2];
        let mut now = 0u64;
        // Units of each slot at its previous read: a read one wrap or more
        // past it carries COUNTER_OVERFLOW.
        let mut units_at_read = [0u128; 2];
        let mut expect = |slot: usize, truth: u128| {
            let units = truth / u128::from(unit);
            let overflow = units - units_at_read[slot] > mask;
            units_at_read[slot] = units;
            (units & mask) | if overflow { u128::from(regs::COUNTER_OVERFLOW) } else { 0 }
        };
        for (domain, rmid, local, bytes, dt, read) in steps {
            let event = if local { Event::MbmLocalBytes } else { Event::MbmTotalBytes };
            d.inject(now, domain, rmid, event, bytes).unwrap();
            sums[domain as usize][rmid as usize][usize::from(local)] += u128::from(bytes);
            now += dt;
            if read {
                let v0 = d.read(now, 1, regs::slot_count(0, 0), 8);
                let v1 = d.read(now, 1, regs::slot_count(0, 1), 8);
                let s = d.state(now);
                let t0 = u128::from(s.truth(0, 2, Event::MbmTotalBytes));
                let t1 = u128::from(s.truth(0, 3, Event::MbmLocalBytes));
                prop_assert_eq!(u128::from(v0), expect(0, t0));
                prop_assert_eq!(u128::from(v1), expect(1, t1));
            }
        }
        // Long enough for everything to land.
        let total: u128 = sums.iter().flatten().flatten().sum();
        let end = now + u64::try_from(total * 1_000_000_000 / u128::from(max_rate)).unwrap() + SEC;
        prop_assert_eq!(d.pending_bytes(end), 0);
        let s = d.state(end);
        for (domain, per_rmid) in sums.iter().enumerate() {
            for (rmid, per_event) in per_rmid.iter().enumerate() {
                for (i, event) in [Event::MbmTotalBytes, Event::MbmLocalBytes].into_iter().enumerate() {
                    prop_assert_eq!(
                        u128::from(s.truth(domain as u32, rmid as u32, event)), per_event[i],
                        "domain {} rmid {} {}", domain, rmid, event);
                }
            }
        }
        let v0 = d.read(end, 1, regs::slot_count(0, 0), 8);
        prop_assert_eq!(u128::from(v0), expect(0, sums[0][2][0]));
        let v1 = d.read(end, 1, regs::slot_count(0, 1), 8);
        prop_assert_eq!(u128::from(v1), expect(1, sums[0][3][1]));
        prop_assert_eq!(u128::from(s.domains[0].slots[0].counted_bytes), sums[0][2][0]);
        prop_assert_eq!(s.bad_accesses.total, 0);
        prop_assert_eq!(s.domains[0].violations, 0);
    }

    /// Landing is exact: after t ns, a queue at rate R has landed
    /// min(injected, floor(R * t / 1e9)) bytes, however time is sliced.
    #[test]
    fn landing_is_exact(
        max_rate in 1u64..(1u64 << 40),
        bytes in 1u64..(1u64 << 40),
        slices in prop::collection::vec(0..(2 * SEC), 1..30),
    ) {
        let mut d = Device::new(DeviceConfig { max_rate, ..DeviceConfig::default() }).unwrap();
        let t0 = 12345;
        d.inject(t0, 1, 7, Event::MbmLocalBytes, bytes).unwrap();
        let mut now = t0;
        for s in slices {
            now += s;
            let landed = bytes - d.pending_bytes(now);
            let expect = (u128::from(max_rate) * u128::from(now - t0) / 1_000_000_000).min(u128::from(bytes));
            prop_assert_eq!(u128::from(landed), expect);
            prop_assert_eq!(d.state(now).truth(1, 7, Event::MbmLocalBytes), landed);
        }
    }
}
