use super::*;
use crate::regs::*;
use std::collections::BTreeMap;

const SEC: u64 = 1_000_000_000;

fn device(config: DeviceConfig) -> Device {
    Device::new(config).expect("valid config")
}

/// A device with one domain {0,1} owned by vCPU 0, the given counter shape
/// and max rate.
fn owned(width: u32, unit: u64, max_rate: u64) -> Device {
    let mut d = device(DeviceConfig {
        domains: vec![vec![0, 1]],
        counter_width: width,
        unit_bytes: unit,
        max_rate,
        ..DeviceConfig::default()
    });
    d.write(0, 0, domain_reg(0, DOM_OWNER), 8, 0);
    d
}

fn assign(d: &mut Device, now: u64, slot: u64, event: Event, rmid: u64) {
    d.write(now, 0, slot_ctl(0, slot), 8, slot_ctl_value(event, rmid));
}

#[test]
fn self_description() {
    let mut d = device(DeviceConfig::default());
    let r = |d: &mut Device, off| d.read(0, 3, off, 8);
    assert_eq!(r(&mut d, REG_MAGIC), MAGIC_VALUE);
    assert_eq!(MAGIC_VALUE.to_le_bytes(), *b"PERFBED\0");
    assert_eq!(r(&mut d, REG_VERSION), VERSION_VALUE);
    assert_eq!(r(&mut d, REG_NUM_DOMAINS), 2);
    assert_eq!(r(&mut d, REG_NUM_RMIDS), 8);
    assert_eq!(r(&mut d, REG_NUM_SLOTS), 4);
    assert_eq!(r(&mut d, REG_COUNTER_WIDTH), 24);
    assert_eq!(r(&mut d, REG_COUNTER_UNIT), 64);
    assert_eq!(r(&mut d, REG_MAX_RATE), 2 << 30);
    assert_eq!(r(&mut d, REG_DOMAIN_BASE), 0x1000);
    assert_eq!(r(&mut d, REG_DOMAIN_STRIDE), 0x1000);
    assert_eq!(r(&mut d, REG_SLOT_BASE), DOM_SLOTS);
    assert_eq!(r(&mut d, REG_SLOT_STRIDE), SLOT_STRIDE);
    assert_eq!(r(&mut d, REG_OCCUPANCY_BASE), DOM_OCCUPANCY);
    assert_eq!(r(&mut d, REG_DEVICE_SIZE), 0x3000);
    assert_eq!(r(&mut d, REG_EVENTS), 0b1110);
    assert_eq!(d.size(), 0x3000);
    assert_eq!(r(&mut d, domain_reg(0, DOM_ALLOWED_CPUS)), 0b0011);
    assert_eq!(r(&mut d, domain_reg(1, DOM_ALLOWED_CPUS)), 0b1100);
    assert_eq!(r(&mut d, domain_reg(1, DOM_OWNER)), NO_OWNER);
    assert_eq!(r(&mut d, slot_ctl(1, 3)), 0);
    assert_eq!(d.state(0).bad_accesses, BadAccessCounts::default());
    // Offsets of the helpers.
    assert_eq!(slot_ctl(1, 2), 0x2030);
    assert_eq!(slot_count(1, 2), 0x2038);
    assert_eq!(occupancy(1, 7), 0x2838);
    assert_eq!(device_size(16, 256, 32), 17 * 0x1000);
    assert_eq!(device_size(1, 1, 1), 0x2000);
}

#[test]
fn half_reads() {
    let mut d = owned(40, 1, 1 << 40);
    assert_eq!(d.read(0, 0, REG_MAGIC, 4), MAGIC_VALUE & 0xffff_ffff);
    assert_eq!(d.read(0, 0, REG_MAGIC + 4, 4), MAGIC_VALUE >> 32);
    assert_eq!(d.read(0, 0, domain_reg(0, DOM_OWNER) + 4, 4), 0);
    assert_eq!(d.read(0, 5, domain_reg(0, DOM_OWNER), 4), 0);
    assert_eq!(d.read(0, 5, domain_reg(0, DOM_ALLOWED_CPUS), 4), 3);
    assert_eq!(d.read(0, 5, domain_reg(0, DOM_ALLOWED_CPUS) + 4, 4), 0);
    assert_eq!(d.read(0, 0, REG_MAX_RATE + 4, 4), (1u64 << 40) >> 32);
    assert_eq!(
        d.read(0, 0, slot_count(0, 0) + 4, 4),
        COUNTER_UNAVAILABLE >> 32
    );
    assert_eq!(d.read(0, 0, slot_count(0, 0), 4), 0);
    assert_eq!(d.read(0, 1, slot_count(0, 0) + 4, 4), COUNTER_ERROR >> 32);
    assign(&mut d, 0, 0, Event::MbmTotalBytes, 2);
    d.inject(0, 0, 2, Event::MbmTotalBytes, 0x12_3456_789a)
        .unwrap();
    assert_eq!(d.read(SEC, 0, slot_count(0, 0), 4), 0x3456_789a);
    assert_eq!(d.read(SEC, 0, slot_count(0, 0) + 4, 4), 0x12);
    assert_eq!(d.read(SEC, 0, slot_count(0, 0), 8), 0x12_3456_789a);
    let ctl = slot_ctl_value(Event::MbmTotalBytes, 2);
    assert_eq!(d.read(SEC, 0, slot_ctl(0, 0) + 4, 4), ctl >> 32);
    assert_eq!(d.state(SEC).bad_accesses.total, 0);
}

#[test]
fn four_byte_writes_to_low_half() {
    let mut d = device(DeviceConfig::default());
    let owner = domain_reg(1, DOM_OWNER);
    // Upper bits of the value are dropped: the write zero-extends.
    d.write(0, 0, owner, 4, 0xffff_ffff_0000_0003);
    assert_eq!(d.read(0, 0, owner, 8), 3);
    d.write(
        0,
        3,
        slot_ctl(1, 0),
        8,
        slot_ctl_value(Event::MbmLocalBytes, 1),
    );
    // A 4-byte write cannot set ASSIGNED; writing 0 releases.
    d.write(0, 3, slot_ctl(1, 0), 4, 0);
    assert_eq!(d.read(0, 3, slot_ctl(1, 0), 8), 0);
    d.write(0, 3, owner + 4, 4, 0);
    assert_eq!(d.read(0, 0, owner, 8), 3);
    assert_eq!(d.state(0).bad_accesses.high_half_write, 1);
    assert_eq!(d.state(0).bad_accesses.total, 1);
}

#[test]
fn counting_is_exact_and_wraps() {
    for (width, unit) in [(8u32, 64u64), (24, 64), (12, 1), (61, 4096)] {
        let mut d = owned(width, unit, MAX_RATE_LIMIT);
        assign(&mut d, 0, 1, Event::MbmTotalBytes, 3);
        let wrap = (1u128 << width) * u128::from(unit);
        let mut total: u128 = 0;
        for (i, extra) in [(0u64, 0u64), (1, 7), (2, 64 * 5 + 63), (3, 1)] {
            let bytes =
                u64::try_from(wrap.min(1 << 50) * u128::from(i) + u128::from(extra)).unwrap();
            d.inject(i * SEC, 0, 3, Event::MbmTotalBytes, bytes)
                .unwrap();
            total += u128::from(bytes);
        }
        let now = 1000 * SEC;
        assert_eq!(d.pending_bytes(now), 0);
        let expect = (total / u128::from(unit)) % (1u128 << width);
        // Nobody read while it wrapped: the read says so, beside the count.
        let overflowed = total / u128::from(unit) >= 1u128 << width;
        let value = d.read(now, 0, slot_count(0, 1), 8);
        assert_eq!(value & COUNTER_OVERFLOW != 0, overflowed, "width {width}");
        assert_eq!(
            u128::from(value & !COUNTER_OVERFLOW),
            expect,
            "width {width}"
        );
        let state = d.state(now);
        assert_eq!(u128::from(state.domains[0].slots[1].counted_bytes), total);
        assert_eq!(u128::from(state.truth(0, 3, Event::MbmTotalBytes)), total);
        assert_eq!(state.truth(0, 3, Event::MbmLocalBytes), 0);
        assert_eq!(state.truth(0, 2, Event::MbmTotalBytes), 0);
    }
}

#[test]
fn wraps_several_times() {
    let mut d = owned(24, 64, 2 << 30);
    assign(&mut d, 0, 0, Event::MbmLocalBytes, 0);
    let wrap = (1u64 << 24) * 64;
    d.inject(0, 0, 0, Event::MbmLocalBytes, 3 * wrap + 123 * 64 + 5)
        .unwrap();
    let now = 10 * SEC;
    assert_eq!(d.read(now, 0, slot_count(0, 0), 8), 123 | COUNTER_OVERFLOW);
    // Reported once: the next read has seen no wrap since.
    assert_eq!(d.read(now, 0, slot_count(0, 0), 8), 123);
    assert_eq!(
        d.state(now).domains[0].slots[0].counted_bytes,
        3 * wrap + 123 * 64 + 5
    );
}

#[test]
fn overflow_is_flagged_only_when_a_wrap_went_unread() {
    let mut d = owned(8, 1, MAX_RATE_LIMIT);
    assign(&mut d, 0, 0, Event::MbmTotalBytes, 1);
    let read = |d: &mut Device, now| d.read(now, 0, slot_count(0, 0), 8);
    // Just under one wrap between reads, many times over: never flagged.
    for i in 1..=10u64 {
        d.inject(i * SEC, 0, 1, Event::MbmTotalBytes, 255).unwrap();
        assert_eq!(read(&mut d, i * SEC + SEC / 2), (255 * i) % 256);
    }
    // A read outside the placement rule does not count as a read.
    d.inject(20 * SEC, 0, 1, Event::MbmTotalBytes, 200).unwrap();
    assert_eq!(d.read(21 * SEC, 1, slot_count(0, 0), 8), COUNTER_ERROR);
    d.inject(22 * SEC, 0, 1, Event::MbmTotalBytes, 56).unwrap();
    assert_eq!(
        read(&mut d, 23 * SEC),
        ((2550 + 256) % 256) | COUNTER_OVERFLOW
    );
    // Reassigning starts afresh.
    d.inject(24 * SEC, 0, 1, Event::MbmTotalBytes, 300).unwrap();
    assign(&mut d, 25 * SEC, 0, Event::MbmTotalBytes, 1);
    assert_eq!(read(&mut d, 26 * SEC), 0);
}

#[test]
fn traffic_lands_at_max_rate() {
    let mut d = owned(24, 64, 1_000_000);
    let t0 = 1000;
    d.inject(t0, 0, 1, Event::MbmTotalBytes, 1_000_000).unwrap();
    assert_eq!(d.pending_bytes(t0), 1_000_000);
    assert_eq!(d.pending_bytes(t0 + 999), 1_000_000);
    assert_eq!(d.pending_bytes(t0 + 1000), 999_999);
    assert_eq!(d.pending_bytes(t0 + SEC / 2), 500_000);
    assert_eq!(
        d.state(t0 + SEC / 2).truth(0, 1, Event::MbmTotalBytes),
        500_000
    );
    assert_eq!(d.pending_bytes(t0 + SEC - 1), 1);
    assert_eq!(d.pending_bytes(t0 + SEC), 0);
    assert_eq!(
        d.state(t0 + SEC).truth(0, 1, Event::MbmTotalBytes),
        1_000_000
    );
}

#[test]
fn sub_byte_remainders_carry() {
    let mut d = owned(24, 64, 3);
    d.inject(0, 0, 0, Event::MbmTotalBytes, 100).unwrap();
    // 3 bytes/s in uneven steps: landed = floor(3 * t / 1e9) exactly.
    let mut now = 0;
    for step in [1u64, 333_333_332, 1, 7, 666_666_659, 1, SEC, 123_456_789] {
        now += step;
        let landed = 100 - d.pending_bytes(now);
        assert_eq!(
            u128::from(landed),
            3 * u128::from(now) / 1_000_000_000,
            "at {now}"
        );
    }
}

#[test]
fn queue_is_fifo_and_shares_with_steady_rates() {
    let mut d = owned(24, 64, 1_000_000);
    d.inject(0, 0, 1, Event::MbmTotalBytes, 300_000).unwrap();
    d.inject(0, 0, 2, Event::MbmLocalBytes, 300_000).unwrap();
    let s = d.state(SEC * 3 / 10);
    assert_eq!(s.truth(0, 1, Event::MbmTotalBytes), 300_000);
    assert_eq!(s.truth(0, 2, Event::MbmLocalBytes), 0);
    let s = d.state(SEC * 45 / 100);
    assert_eq!(s.truth(0, 2, Event::MbmLocalBytes), 150_000);
    // A steady rate of 250 kB/s leaves 750 kB/s for the queue.
    d.set_rate(SEC * 45 / 100, 0, 5, Event::MbmTotalBytes, 250_000)
        .unwrap();
    let s = d.state(SEC * 65 / 100);
    assert_eq!(s.truth(0, 2, Event::MbmLocalBytes), 300_000);
    assert_eq!(s.truth(0, 5, Event::MbmTotalBytes), 50_000);
    assert_eq!(s.domains[0].steady_rates.len(), 1);
    // Idle bandwidth is not banked: a new injection starts from now.
    d.inject(10 * SEC, 0, 1, Event::MbmTotalBytes, 750_000)
        .unwrap();
    assert_eq!(d.pending_bytes(10 * SEC), 750_000);
    assert_eq!(d.pending_bytes(10 * SEC + SEC / 2), 375_000);
    d.set_rate(11 * SEC, 0, 5, Event::MbmTotalBytes, 0).unwrap();
    let before = d.state(11 * SEC).truth(0, 5, Event::MbmTotalBytes);
    assert_eq!(before, 250_000 * 1055 / 100); // 0.45 s to 11 s
    assert_eq!(d.state(20 * SEC).truth(0, 5, Event::MbmTotalBytes), before);
    assert!(d.state(20 * SEC).domains[0].steady_rates.is_empty());
}

#[test]
fn steady_rate_limits() {
    let mut d = owned(24, 64, 1000);
    d.set_rate(0, 0, 0, Event::MbmTotalBytes, 600).unwrap();
    assert!(matches!(
        d.set_rate(0, 0, 1, Event::MbmTotalBytes, 401),
        Err(DeviceError::RateTooHigh {
            total: 1001,
            max: 1000,
            ..
        })
    ));
    // Replacing a rate counts only the new value.
    d.set_rate(0, 0, 0, Event::MbmTotalBytes, 1000).unwrap();
    assert_eq!(
        d.set_rate(0, 0, 0, Event::LlcOccupancy, 1),
        Err(DeviceError::NotCumulative(Event::LlcOccupancy))
    );
    // With all bandwidth taken by steady rates, injections wait.
    d.inject(0, 0, 1, Event::MbmLocalBytes, 10).unwrap();
    assert_eq!(d.pending_bytes(5 * SEC), 10);
    d.set_rate(5 * SEC, 0, 0, Event::MbmTotalBytes, 0).unwrap();
    assert_eq!(d.pending_bytes(5 * SEC + SEC / 100), 0);
}

#[test]
fn slots_count_only_while_assigned() {
    let mut d = owned(24, 1, 1 << 40);
    let count = |d: &mut Device, now, s| d.read(now, 0, slot_count(0, s), 8);
    d.inject(0, 0, 4, Event::MbmTotalBytes, 100).unwrap();
    assert_eq!(count(&mut d, SEC, 0), COUNTER_UNAVAILABLE);
    assign(&mut d, SEC, 0, Event::MbmTotalBytes, 4);
    assign(&mut d, SEC, 1, Event::MbmTotalBytes, 4);
    assign(&mut d, SEC, 2, Event::MbmLocalBytes, 4);
    assign(&mut d, SEC, 3, Event::MbmTotalBytes, 5);
    assert_eq!(count(&mut d, SEC, 0), 0);
    d.inject(SEC, 0, 4, Event::MbmTotalBytes, 7).unwrap();
    assert_eq!(count(&mut d, 2 * SEC, 0), 7);
    assert_eq!(count(&mut d, 2 * SEC, 1), 7);
    assert_eq!(count(&mut d, 2 * SEC, 2), 0);
    assert_eq!(count(&mut d, 2 * SEC, 3), 0);
    // Reassigning (even the same value) resets the count.
    assign(&mut d, 2 * SEC, 1, Event::MbmTotalBytes, 4);
    assert_eq!(count(&mut d, 2 * SEC, 1), 0);
    d.inject(2 * SEC, 0, 4, Event::MbmTotalBytes, 5).unwrap();
    assert_eq!(count(&mut d, 3 * SEC, 0), 12);
    assert_eq!(count(&mut d, 3 * SEC, 1), 5);
    // Releasing: unavailable, and traffic meanwhile is not counted.
    d.write(3 * SEC, 0, slot_ctl(0, 0), 8, 0);
    assert_eq!(d.read(3 * SEC, 0, slot_ctl(0, 0), 8), 0);
    d.inject(3 * SEC, 0, 4, Event::MbmTotalBytes, 9).unwrap();
    assert_eq!(count(&mut d, 4 * SEC, 0), COUNTER_UNAVAILABLE);
    assign(&mut d, 4 * SEC, 0, Event::MbmTotalBytes, 4);
    assert_eq!(count(&mut d, 4 * SEC, 0), 0);
    assert_eq!(count(&mut d, 4 * SEC, 1), 14);
    assert_eq!(d.state(4 * SEC).truth(0, 4, Event::MbmTotalBytes), 121);
    assert_eq!(
        d.read(4 * SEC, 0, slot_ctl(0, 3), 8),
        SLOT_CTL_ASSIGNED | 5 << 8 | 2
    );
    assert_eq!(d.state(4 * SEC).bad_accesses.total, 0);
}

/// `SLOT_CTL_FROZEN`: a frozen slot counts nothing and keeps its count and
/// its assignment; toggling only that bit is no new assignment, from any
/// vCPU (a write is never a placement violation); writing the frozen value
/// again resets, as repeating any value does.
#[test]
fn a_frozen_slot_keeps_its_count_and_its_assignment() {
    let mut d = owned(24, 1, 1 << 40);
    let count = |d: &mut Device, now| d.read(now, 0, slot_count(0, 0), 8);
    let ctl = slot_ctl_value(Event::MbmTotalBytes, 4);
    assign(&mut d, 0, 0, Event::MbmTotalBytes, 4);
    d.inject(0, 0, 4, Event::MbmTotalBytes, 7).unwrap();
    assert_eq!(count(&mut d, SEC), 7);
    // vCPU 3 is not in the domain: it may still freeze.
    d.write(SEC, 3, slot_ctl(0, 0), 8, ctl | SLOT_CTL_FROZEN);
    d.inject(SEC, 0, 4, Event::MbmTotalBytes, 5).unwrap();
    assert_eq!(count(&mut d, 2 * SEC), 7);
    let state = d.state(2 * SEC);
    assert_eq!(state.domains[0].slots[0].assignment, Some(0));
    assert_eq!(state.domains[0].slots[0].counted_bytes, 7);
    assert_eq!(state.truth(0, 4, Event::MbmTotalBytes), 12);
    d.write(2 * SEC, 3, slot_ctl(0, 0), 8, ctl);
    d.inject(2 * SEC, 0, 4, Event::MbmTotalBytes, 3).unwrap();
    assert_eq!(count(&mut d, 3 * SEC), 10);
    assert_eq!(d.state(3 * SEC).domains[0].slots[0].assignment, Some(0));
    // Frozen again, then the frozen value repeated: a reset, frozen.
    d.write(3 * SEC, 0, slot_ctl(0, 0), 8, ctl | SLOT_CTL_FROZEN);
    d.write(3 * SEC, 0, slot_ctl(0, 0), 8, ctl | SLOT_CTL_FROZEN);
    d.inject(3 * SEC, 0, 4, Event::MbmTotalBytes, 2).unwrap();
    assert_eq!(count(&mut d, 4 * SEC), 0);
    let a = d.assignments(4 * SEC, 0);
    let seqs: Vec<_> = a
        .records
        .iter()
        .map(|r| (r.seq, r.counted_bytes, r.released_ns.is_some()))
        .collect();
    assert_eq!(seqs, vec![(0, 10, true), (1, 0, false)]);
    // A free slot assigned frozen counts nothing until thawed.
    d.write(4 * SEC, 0, slot_ctl(0, 1), 8, ctl | SLOT_CTL_FROZEN);
    d.inject(4 * SEC, 0, 4, Event::MbmTotalBytes, 4).unwrap();
    assert_eq!(d.read(5 * SEC, 0, slot_count(0, 1), 8), 0);
    d.write(5 * SEC, 0, slot_ctl(0, 1), 8, ctl);
    d.inject(5 * SEC, 0, 4, Event::MbmTotalBytes, 6).unwrap();
    assert_eq!(d.read(6 * SEC, 0, slot_count(0, 1), 8), 6);
    let state = d.state(6 * SEC);
    assert_eq!(state.truth(0, 4, Event::MbmTotalBytes), 27);
    assert_eq!(state.bad_accesses.total, 0);
    assert_eq!(state.domains[0].violations, 0);
}

#[test]
fn traffic_landing_after_reassignment_goes_to_the_new_assignment() {
    let mut d = owned(24, 1, 1000);
    assign(&mut d, 0, 0, Event::MbmTotalBytes, 1);
    d.inject(0, 0, 1, Event::MbmTotalBytes, 1000).unwrap();
    assert_eq!(d.read(SEC / 2, 0, slot_count(0, 0), 8), 500);
    assign(&mut d, SEC / 2, 0, Event::MbmTotalBytes, 1);
    assert_eq!(d.read(SEC, 0, slot_count(0, 0), 8), 500);
}

#[test]
fn every_assignment_is_kept_with_what_it_counted() {
    let mut d = owned(24, 1, 1 << 40);
    let released = |d: &mut Device, now| {
        let a = d.assignments(now, 0);
        a.records
            .iter()
            .map(|r| (r.seq, r.slot, r.rmid, r.released_ns, r.counted_bytes))
            .collect::<Vec<_>>()
    };
    d.inject(0, 0, 4, Event::MbmTotalBytes, 100).unwrap();
    assign(&mut d, SEC, 0, Event::MbmTotalBytes, 4);
    assign(&mut d, SEC, 1, Event::MbmTotalBytes, 4);
    d.inject(SEC, 0, 4, Event::MbmTotalBytes, 7).unwrap();
    // Repeating the value is a new assignment; the old one keeps its 7.
    assign(&mut d, 2 * SEC, 1, Event::MbmTotalBytes, 4);
    d.inject(2 * SEC, 0, 4, Event::MbmTotalBytes, 5).unwrap();
    d.write(3 * SEC, 0, slot_ctl(0, 0), 8, 0);
    // Nothing holds the RMID now: this lands in the truth only.
    d.write(3 * SEC, 0, slot_ctl(0, 1), 8, 0);
    d.inject(3 * SEC, 0, 4, Event::MbmTotalBytes, 9).unwrap();
    assign(&mut d, 4 * SEC, 2, Event::MbmTotalBytes, 4);
    d.inject(4 * SEC, 0, 4, Event::MbmTotalBytes, 3).unwrap();
    assert_eq!(
        released(&mut d, 5 * SEC),
        vec![
            (0, 0, 4, Some(3 * SEC), 12),
            (1, 1, 4, Some(2 * SEC), 7),
            (2, 1, 4, Some(3 * SEC), 5),
            (3, 2, 4, None, 3),
        ]
    );
    let a = d.assignments(5 * SEC, 2);
    assert_eq!((a.next_seq, a.dropped, a.records.len()), (4, 0, 2));
    assert_eq!(a.records[0].assigned_ns, 2 * SEC);
    let state = d.state(5 * SEC);
    assert_eq!(state.domains[0].slots[2].assignment, Some(3));
    assert_eq!(state.domains[0].slots[0].assignment, None);
    assert_eq!(state.truth(0, 4, Event::MbmTotalBytes), 124);
}

#[test]
fn the_assignment_log_is_bounded() {
    let mut d = owned(24, 1, 1 << 40);
    let n = ASSIGNMENT_LOG_CAPACITY as u64 + 3;
    for i in 0..n {
        assign(&mut d, i, 0, Event::MbmTotalBytes, 1);
    }
    let a = d.assignments(n, 0);
    assert_eq!((a.next_seq, a.dropped), (n, 2));
    // The oldest two ended ones fell out; the ongoing one is always there.
    assert_eq!(a.records.first().map(|r| r.seq), Some(2));
    assert_eq!(
        a.records.last().map(|r| (r.seq, r.released_ns)),
        Some((n - 1, None))
    );
    assert_eq!(a.records.len(), ASSIGNMENT_LOG_CAPACITY + 1);
}

#[test]
fn placement_violations() {
    let mut d = device(DeviceConfig::default());
    let count = slot_count(0, 0);
    let occ = occupancy(0, 1);
    d.set_occupancy(0, 1, 64 * 10).unwrap();
    // No owner yet: even an allowed vCPU violates.
    assert_eq!(d.read(0, 0, count, 8), COUNTER_ERROR);
    d.write(0, 0, domain_reg(0, DOM_OWNER), 8, 1);
    assert_eq!(d.read(0, 0, occ, 8), COUNTER_ERROR); // allowed, not owner
    assert_eq!(d.read(0, 2, occ, 8), COUNTER_ERROR); // not allowed
    assert_eq!(d.read(0, 1, occ, 8), 10); // owner
    assert_eq!(d.read(0, 1, count, 8), COUNTER_UNAVAILABLE);
    assert_eq!(d.read(0, 1, count + 4, 4), COUNTER_UNAVAILABLE >> 32);
    // An owner outside the allowed set still violates.
    d.write(0, 0, domain_reg(0, DOM_OWNER), 8, 2);
    assert_eq!(d.read(0, 2, count, 8), COUNTER_ERROR);
    assert_eq!(d.read(0, 99, count + 4, 4), COUNTER_ERROR >> 32);
    // Non-counter registers are readable from anywhere.
    assert_eq!(d.read(0, 7, domain_reg(0, DOM_OWNER), 8), 2);
    // Domain 1 is unaffected.
    d.write(0, 3, domain_reg(1, DOM_OWNER), 8, 3);
    assert_eq!(d.read(0, 3, occupancy(1, 0), 8), 0);

    let s = d.state(0);
    let d0 = &s.domains[0];
    assert_eq!(d0.owner, Some(2));
    assert_eq!(d0.violations, 5);
    assert_eq!(
        d0.violations_by_vcpu,
        BTreeMap::from([(0, 2), (2, 2), (99, 1)])
    );
    assert_eq!(
        d0.counter_reads_by_vcpu,
        BTreeMap::from([(0, 2), (1, 3), (2, 2), (99, 1)])
    );
    assert_eq!(s.domains[1].violations, 0);
    assert_eq!(s.domains[1].counter_reads_by_vcpu, BTreeMap::from([(3, 1)]));
    assert_eq!(s.bad_accesses.total, 0);
    let trace = d.trace();
    assert_eq!(trace.iter().filter(|e| e.violation).count(), 5);

    // Giving up ownership makes reads violations again.
    d.write(0, 0, domain_reg(0, DOM_OWNER), 8, NO_OWNER);
    assert_eq!(d.state(0).domains[0].owner, None);
    assert_eq!(d.read(0, 2, count, 8), COUNTER_ERROR);
}

#[test]
fn occupancy_gauge() {
    let mut d = owned(8, 64, 1 << 30);
    d.set_occupancy(0, 7, 64 * 100 + 63).unwrap();
    assert_eq!(d.read(0, 0, occupancy(0, 7), 8), 100);
    d.set_occupancy(0, 7, u64::MAX).unwrap();
    assert_eq!(d.read(0, 0, occupancy(0, 7), 8), 255);
    d.set_occupancy(0, 7, 0).unwrap();
    assert_eq!(d.read(0, 0, occupancy(0, 7), 8), 0);
    assert_eq!(
        d.set_occupancy(1, 0, 1),
        Err(DeviceError::NoSuchDomain {
            domain: 1,
            domains: 1
        })
    );
    assert_eq!(
        d.set_occupancy(0, 8, 1),
        Err(DeviceError::NoSuchRmid { rmid: 8, rmids: 8 })
    );
}

#[test]
fn bad_accesses_are_ignored_and_counted() {
    let mut d = device(DeviceConfig::default());
    d.write(0, 0, domain_reg(0, DOM_OWNER), 8, 0);
    assign(&mut d, 0, 0, Event::MbmTotalBytes, 1);
    d.inject(0, 0, 1, Event::MbmTotalBytes, 640).unwrap();
    let now = SEC;
    let good_ctl = slot_ctl_value(Event::MbmTotalBytes, 1);

    // Unknown offsets.
    for off in [
        REG_GLOBAL_END,
        0x800,
        0xff8,
        domain_reg(0, DOM_SLOTS + 4 * SLOT_STRIDE), // slot 4 of 4
        domain_reg(0, 0x7f8),
        occupancy(0, 8),          // RMID 8 of 8
        domain_reg(2, DOM_OWNER), // domain 2 of 2
        d.size(),
        u64::MAX - 7,
    ] {
        assert_eq!(d.read(now, 0, off, 8), 0, "offset {off:#x}");
        d.write(now, 0, off, 8, 1);
    }
    // Bad sizes and alignment.
    assert_eq!(d.read(now, 0, REG_MAGIC, 2), 0);
    assert_eq!(d.read(now, 0, REG_MAGIC, 0), 0);
    assert_eq!(d.read(now, 0, REG_MAGIC, 16), 0);
    d.write(now, 0, slot_ctl(0, 0), 1, 0);
    assert_eq!(d.read(now, 0, REG_MAGIC + 4, 8), 0);
    assert_eq!(d.read(now, 0, REG_MAGIC + 2, 4), 0);
    d.write(now, 0, slot_ctl(0, 0) + 1, 8, 0);
    // Read-only registers.
    d.write(now, 0, REG_MAGIC, 8, 0);
    d.write(now, 0, REG_NUM_SLOTS, 4, 0);
    d.write(now, 0, domain_reg(0, DOM_ALLOWED_CPUS), 8, u64::MAX);
    d.write(now, 0, slot_count(0, 0), 8, 0);
    d.write(now, 0, occupancy(0, 1), 8, 0);
    // High half of a writable register.
    d.write(now, 0, slot_ctl(0, 0) + 4, 4, 0);
    // Bad values.
    d.write(now, 0, domain_reg(0, DOM_OWNER), 8, 64);
    d.write(now, 0, domain_reg(0, DOM_OWNER), 8, NO_OWNER - 1);
    for bad in [
        slot_ctl_value(Event::LlcOccupancy, 1),
        SLOT_CTL_ASSIGNED | 1 << 8,              // event 0
        SLOT_CTL_ASSIGNED | 1 << 8 | 4,          // event 4
        slot_ctl_value(Event::MbmTotalBytes, 8), // RMID 8 of 8
        good_ctl | 1 << 40,                      // reserved bit
        good_ctl & !SLOT_CTL_ASSIGNED,           // not assigned, not 0
    ] {
        d.write(now, 0, slot_ctl(0, 0), 8, bad);
    }

    let s = d.state(now);
    let bad = &s.bad_accesses;
    assert_eq!(bad.unknown_offset, 18);
    assert_eq!(bad.bad_size, 4);
    assert_eq!(bad.unaligned, 3);
    assert_eq!(bad.read_only, 5);
    assert_eq!(bad.high_half_write, 1);
    assert_eq!(bad.bad_value, 8);
    assert_eq!(bad.total, 18 + 4 + 3 + 5 + 1 + 8);
    // Nothing changed.
    assert_eq!(s.domains[0].owner, Some(0));
    assert_eq!(s.domains[0].allowed_mask, 0b11);
    assert_eq!(s.domains[0].slots[0].ctl, good_ctl);
    assert_eq!(s.domains[0].slots[0].counted_bytes, 640);
    assert_eq!(d.read(now, 0, slot_count(0, 0), 8), 10);
    assert_eq!(d.read(now, 0, REG_NUM_SLOTS, 8), 4);
    let trace = d.trace();
    assert_eq!(
        trace.iter().filter(|e| e.bad.is_some()).count() as u64,
        bad.total
    );
    assert_eq!(
        trace.iter().find(|e| e.size == 2).map(|e| e.bad),
        Some(Some(BadAccessKind::BadSize))
    );
}

#[test]
fn trace_is_bounded_and_reset_stats_keeps_counts() {
    let mut d = owned(24, 64, 1 << 30);
    assign(&mut d, 0, 0, Event::MbmTotalBytes, 0);
    d.inject(0, 0, 0, Event::MbmTotalBytes, 6400).unwrap();
    for i in 0..(TRACE_CAPACITY as u64 + 10) {
        d.read(SEC + i, 1, slot_count(0, 0), 8);
    }
    d.read(2 * SEC, 0, 0x1234_5678, 2);
    let trace = d.trace();
    assert_eq!(trace.len(), TRACE_CAPACITY);
    let last = trace.last().unwrap();
    assert_eq!(
        (
            last.time_ns,
            last.vcpu,
            last.offset,
            last.size,
            last.kind,
            last.value
        ),
        (2 * SEC, 0, 0x1234_5678, 2, AccessKind::Read, 0)
    );
    let first = &trace[0];
    assert_eq!(
        (first.time_ns, first.value, first.violation),
        (SEC + 11, COUNTER_ERROR, true)
    );

    let s = d.state(2 * SEC);
    assert_eq!(s.trace_len, TRACE_CAPACITY);
    assert_eq!(s.domains[0].violations, TRACE_CAPACITY as u64 + 10);
    // The set-up, the injection and the first reads fell out of the ring.
    assert_eq!(
        s.trace_dropped,
        d.trace_since(0).next_seq - TRACE_CAPACITY as u64
    );
    assert!(s.trace_dropped > 11);
    d.reset_stats();
    let s = d.state(2 * SEC);
    // Only the reset itself is left, and no access.
    assert_eq!((s.trace_len, s.trace_dropped), (1, 0));
    assert!(d.trace().is_empty());
    assert_eq!(s.domains[0].violations, 0);
    assert!(s.domains[0].violations_by_vcpu.is_empty());
    assert!(s.domains[0].counter_reads_by_vcpu.is_empty());
    assert_eq!(s.bad_accesses, BadAccessCounts::default());
    assert_eq!(s.truth(0, 0, Event::MbmTotalBytes), 6400);
    assert_eq!(s.domains[0].slots[0].register, 100);
    assert_eq!(d.read(2 * SEC, 0, slot_count(0, 0), 8), 100);
}

#[test]
fn host_inputs_are_validated() {
    let mut d = device(DeviceConfig::default());
    assert_eq!(
        d.inject(0, 2, 0, Event::MbmTotalBytes, 1),
        Err(DeviceError::NoSuchDomain {
            domain: 2,
            domains: 2
        })
    );
    assert_eq!(
        d.inject(0, 0, 8, Event::MbmTotalBytes, 1),
        Err(DeviceError::NoSuchRmid { rmid: 8, rmids: 8 })
    );
    assert_eq!(
        d.inject(0, 0, 0, Event::LlcOccupancy, 1),
        Err(DeviceError::NotCumulative(Event::LlcOccupancy))
    );
    assert!(d.set_rate(0, u32::MAX, 0, Event::MbmLocalBytes, 1).is_err());
    assert!(d
        .set_rate(0, 0, 0, Event::MbmLocalBytes, (2 << 30) + 1)
        .is_err());
    d.inject(0, 0, 0, Event::MbmTotalBytes, u64::MAX).unwrap();
    d.inject(0, 0, 0, Event::MbmTotalBytes, u64::MAX).unwrap();
    d.inject(0, 1, 0, Event::MbmTotalBytes, 1).unwrap();
    assert_eq!(d.pending_bytes(0), u64::MAX);
    assert_eq!(d.state(0).domains[1].pending_bytes, 1);
    assert_eq!(d.state(0).pending_bytes, u64::MAX);
    // Far future: nothing overflows.
    assert_eq!(d.pending_bytes(u64::MAX), 0);
    // The truth counts modulo 2^64.
    assert_eq!(
        d.state(u64::MAX).truth(0, 0, Event::MbmTotalBytes),
        u64::MAX - 1
    );
}

#[test]
fn the_injection_queue_is_bounded() {
    let mut d = device(DeviceConfig::default());
    // Alternating RMIDs cannot share a queue entry.
    for i in 0..MAX_QUEUED {
        d.inject(0, 0, (i % 2) as u32, Event::MbmTotalBytes, 1)
            .unwrap();
    }
    // The same (rmid, event) as the last entry still merges into it.
    d.inject(0, 0, ((MAX_QUEUED - 1) % 2) as u32, Event::MbmTotalBytes, 1)
        .unwrap();
    let before = d.state(0);
    assert_eq!(
        d.inject(0, 0, (MAX_QUEUED % 2) as u32, Event::MbmTotalBytes, 1),
        Err(DeviceError::QueueFull {
            domain: 0,
            max: MAX_QUEUED
        })
    );
    assert_eq!(d.state(0), before, "a refused injection changes nothing");
    // The other domain has its own queue; once landed, room again.
    d.inject(0, 1, 0, Event::MbmTotalBytes, 1).unwrap();
    assert_eq!(d.pending_bytes(SEC), 0);
    d.inject(SEC, 0, 0, Event::MbmTotalBytes, 1).unwrap();
}

#[test]
fn time_never_goes_backwards() {
    let mut d = owned(24, 1, 1000);
    assign(&mut d, 0, 0, Event::MbmTotalBytes, 0);
    d.inject(0, 0, 0, Event::MbmTotalBytes, 1000).unwrap();
    assert_eq!(d.read(SEC / 2, 0, slot_count(0, 0), 8), 500);
    assert_eq!(d.read(SEC / 4, 0, slot_count(0, 0), 8), 500);
    assert_eq!(d.state(0).now_ns, SEC / 2);
    assert_eq!(d.read(SEC, 0, slot_count(0, 0), 8), 1000);
}

#[test]
fn config_validation() {
    let ok = DeviceConfig::default();
    assert_eq!(ok.validate(), Ok(()));
    let with = |f: &dyn Fn(&mut DeviceConfig)| {
        let mut c = DeviceConfig::default();
        f(&mut c);
        c.validate().unwrap_err()
    };
    assert_eq!(with(&|c| c.domains.clear()), ConfigError::Domains(0));
    assert_eq!(
        with(&|c| c.domains = vec![vec![0]; 17]),
        ConfigError::Domains(17)
    );
    assert_eq!(with(&|c| c.domains[1].clear()), ConfigError::EmptyDomain(1));
    assert_eq!(
        with(&|c| c.domains[0].push(64)),
        ConfigError::Cpu { domain: 0, cpu: 64 }
    );
    assert_eq!(with(&|c| c.rmids = 0), ConfigError::Rmids(0));
    assert_eq!(with(&|c| c.rmids = 257), ConfigError::Rmids(257));
    assert_eq!(with(&|c| c.slots = 0), ConfigError::Slots(0));
    assert_eq!(with(&|c| c.slots = 33), ConfigError::Slots(33));
    assert_eq!(with(&|c| c.counter_width = 7), ConfigError::CounterWidth(7));
    assert_eq!(
        with(&|c| c.counter_width = 63),
        ConfigError::CounterWidth(63)
    );
    assert_eq!(with(&|c| c.unit_bytes = 0), ConfigError::Unit(0));
    assert_eq!(with(&|c| c.unit_bytes = 48), ConfigError::Unit(48));
    assert_eq!(with(&|c| c.max_rate = 0), ConfigError::MaxRate(0));
    assert!(Device::new(DeviceConfig {
        rmids: 0,
        ..ok.clone()
    })
    .is_err());
    let big = DeviceConfig {
        domains: (0..16).map(|i| vec![i * 4, i * 4 + 3]).collect(),
        rmids: 256,
        slots: 32,
        counter_width: 61,
        unit_bytes: 1,
        max_rate: MAX_RATE_LIMIT,
        trace_capacity: TRACE_CAPACITY,
    };
    let mut d = Device::new(big).unwrap();
    assert_eq!(d.size(), 17 * 4096);
    assert_eq!(d.read(0, 0, domain_reg(15, DOM_ALLOWED_CPUS), 8), 0x9 << 60);
    d.write(0, 63, domain_reg(15, DOM_OWNER), 8, 63);
    d.set_occupancy(15, 255, 42).unwrap();
    assert_eq!(d.read(0, 63, occupancy(15, 255), 8), 42);
    assert_eq!(d.read(0, 63, slot_count(15, 31), 8), COUNTER_UNAVAILABLE);
    assert_eq!(d.state(0).bad_accesses.total, 0);
}

#[test]
fn state_serializes_with_wire_event_names() {
    let mut d = owned(24, 64, 1 << 30);
    assign(&mut d, 0, 2, Event::MbmLocalBytes, 6);
    d.inject(0, 0, 6, Event::MbmLocalBytes, 128).unwrap();
    let state = d.state(SEC);
    let json = serde_json::to_string(&state).unwrap();
    assert!(json.contains(r#""event":"mbm_local_bytes""#), "{json}");
    assert!(json.contains(r#""allowed_cpu_list":"0-1""#), "{json}");
    let back: DeviceState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, state);
    assert_eq!(back.domains[0].slots[2].register, 2);
    assert_eq!(parse_event("llc_occupancy"), Some(Event::LlcOccupancy));
    assert_eq!(parse_event("bogus"), None);
    assert_eq!(
        serde_json::from_str::<Event>("3").unwrap(),
        Event::MbmLocalBytes
    );
    assert!(serde_json::from_str::<Event>("\"mbm\"").is_err());
}

#[test]
fn the_trace_records_owner_changes_host_actions_and_decodes_names_when_printed() {
    let mut d = Device::new(DeviceConfig::default()).unwrap();
    d.write(10, 0, domain_reg(1, DOM_OWNER), 8, 3);
    d.write(11, 0, domain_reg(1, DOM_OWNER), 8, 3); // unchanged: no owner record
    d.write(
        12,
        3,
        slot_ctl(1, 2),
        8,
        slot_ctl_value(Event::MbmLocalBytes, 5),
    );
    d.inject(20, 1, 5, Event::MbmLocalBytes, 4096).unwrap();
    d.set_rate(21, 0, 1, Event::MbmTotalBytes, 1000).unwrap();
    d.set_occupancy(1, 2, 640).unwrap();
    assert!(d.inject(22, 9, 0, Event::MbmTotalBytes, 1).is_err()); // refused: not an action
    d.read(30, 2, slot_count(1, 2), 8);
    d.read(31, 1, 0x78, 8);
    let snap = d.trace_since(0);
    assert_eq!((snap.first_seq, snap.next_seq, snap.dropped), (0, 9, 0));
    let lines = snap.lines();
    let words: Vec<Vec<&str>> = lines
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        words[0],
        [
            "10",
            "0",
            "write",
            "cpu=0",
            "dom=1",
            "reg=DOM_OWNER",
            "off=0x2008",
            "size=8",
            "value=0x3"
        ]
    );
    assert_eq!(
        words[1],
        ["10", "1", "owner", "dom=1", "from=none", "to=3", "cpu=0"]
    );
    assert_eq!(words[2][2], "write");
    assert_eq!(words[3][5], "reg=SLOT_CTL[2]");
    assert_eq!(
        words[4],
        [
            "20",
            "4",
            "inject",
            "dom=1",
            "rmid=5",
            "event=mbm_local_bytes",
            "bytes=4096"
        ]
    );
    assert_eq!(
        words[5],
        [
            "21",
            "5",
            "rate",
            "dom=0",
            "rmid=1",
            "event=mbm_total_bytes",
            "bytes_per_sec=1000"
        ]
    );
    assert_eq!(
        words[6],
        ["21", "6", "occupancy", "dom=1", "rmid=2", "bytes=640"]
    );
    assert_eq!(
        words[7][..6],
        ["30", "7", "read", "cpu=2", "dom=1", "reg=SLOT_COUNT[2]"]
    );
    assert_eq!(words[7].last(), Some(&"violation"));
    assert_eq!(words[8][3..6], ["cpu=1", "dom=-", "reg=UNKNOWN"]);
    assert_eq!(words[8].last(), Some(&"bad=unknown_offset"));
    assert!(snap.header().starts_with(TRACE_MAGIC) && snap.header().contains(" domains=0-1:2-3 "));
    // Asking from a record number on gives only the newer ones.
    assert_eq!(d.trace_since(7).records.len(), 2);
}

#[test]
fn a_small_trace_ring_keeps_the_newest_records_and_counts_the_rest() {
    let mut d = Device::new(DeviceConfig {
        trace_capacity: 3,
        ..DeviceConfig::default()
    })
    .unwrap();
    for t in 0..10 {
        d.read(t, 0, REG_MAGIC, 8);
    }
    let snap = d.trace_since(0);
    assert_eq!(
        (
            snap.first_seq,
            snap.next_seq,
            snap.dropped,
            snap.records.len()
        ),
        (7, 10, 7, 3)
    );
    let times: Vec<u64> = snap.records.iter().map(|(_, r)| r.time_ns).collect();
    assert_eq!(times, [7, 8, 9]);
    // From a record number on, across the ring's wrap point: older than the
    // oldest kept gives all, newer than the newest none.
    for (since, want) in [
        (0, vec![7, 8, 9]),
        (8, vec![8, 9]),
        (9, vec![9]),
        (10, vec![]),
        (99, vec![]),
    ] {
        let seqs: Vec<u64> = d
            .trace_since(since)
            .records
            .iter()
            .map(|(seq, _)| *seq)
            .collect();
        assert_eq!(seqs, want, "since {since}");
    }
    let file = trace_file(&snap.header(), snap.dropped, &snap.lines());
    assert_eq!(
        file.lines()
            .nth(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>()),
        Some(vec!["7", "-", "dropped", "count=7"])
    );
    // Capacity 0 records nothing and counts everything as dropped.
    let mut off = Device::new(DeviceConfig {
        trace_capacity: 0,
        ..DeviceConfig::default()
    })
    .unwrap();
    off.read(0, 0, REG_MAGIC, 8);
    assert_eq!(
        (off.trace_since(0).records.len(), off.trace_dropped()),
        (0, 1)
    );
    assert!(Device::new(DeviceConfig {
        trace_capacity: MAX_TRACE_CAPACITY + 1,
        ..DeviceConfig::default()
    })
    .is_err());
}

#[test]
fn a_trace_record_stays_small() {
    // Recording is a store of one of these into the ring: keep it a few words.
    assert!(
        std::mem::size_of::<TraceRecord>() <= 48,
        "{} bytes",
        std::mem::size_of::<TraceRecord>()
    );
}

/// Domain 0 of `owned(8, 1, ..)` (256-unit counters of 1 byte) with slot 0
/// counting (total, RMID 1) and `ctl` in `DOM_IRQ_CTL`.
fn with_irq(ctl: u64, threshold: u64) -> Device {
    let mut d = owned(8, 1, SEC);
    assign(&mut d, 0, 0, Event::MbmTotalBytes, 1);
    d.write(0, 0, domain_reg(0, DOM_IRQ_THRESHOLD), 8, threshold);
    d.write(0, 0, domain_reg(0, DOM_IRQ_CTL), 8, ctl);
    d
}

fn land(d: &mut Device, now: u64, bytes: u64) {
    d.inject(now, 0, 1, Event::MbmTotalBytes, bytes).unwrap();
    // 1 byte/ns: everything has landed 1 µs per KiB later.
    d.tick(now + bytes + 1);
}

#[test]
fn threshold_interrupt_is_raised_once_per_read_and_acked_on_the_owner() {
    let mut d = with_irq(IRQ_CTL_OVERFLOW, 100);
    let status = domain_reg(0, DOM_IRQ_STATUS);
    land(&mut d, 0, 99);
    assert!(!d.line_level(0), "below the threshold");
    land(&mut d, 1000, 1);
    assert!(d.line_level(0), "at the threshold");
    assert_eq!(d.take_line_changes(), 1);
    // Off the owner: a violation, nothing cleared, the line stays up.
    assert_eq!(d.read(2000, 1, status, 8), COUNTER_ERROR);
    assert!(d.line_level(0));
    let s = d.state(2000);
    assert_eq!((s.domains[0].violations, s.domains[0].irq.status), (1, 1));
    // The owner acks: cleared, the line falls.
    assert_eq!(d.read(2000, 0, status, 8), 1);
    assert!(!d.line_level(0));
    // No counter read since: more traffic raises nothing.
    land(&mut d, 3000, 200);
    assert!(!d.line_level(0), "raised once per read");
    // A counter read re-arms it.
    d.read(5000, 0, slot_count(0, 0), 8);
    land(&mut d, 6000, 100);
    assert!(d.line_level(0));
    let s = d.state(7000);
    assert_eq!(s.domains[0].irq.raised, 2);
    assert_eq!(s.domains[0].irq.acks_by_vcpu, BTreeMap::from([(0, 1)]));
    assert_eq!(
        s.domains[0].counter_reads_by_vcpu,
        BTreeMap::from([(0, 1)]),
        "status reads are not counter reads"
    );
}

#[test]
fn on_wrap_interrupt_is_raised_at_each_wrap() {
    let mut d = with_irq(IRQ_CTL_OVERFLOW | IRQ_CTL_ON_WRAP, 0);
    let status = domain_reg(0, DOM_IRQ_STATUS);
    land(&mut d, 0, 255);
    assert!(!d.line_level(0));
    land(&mut d, 1000, 1);
    assert!(d.line_level(0), "the 8-bit counter wrapped");
    assert_eq!(d.read(2000, 0, status, 8), 1);
    land(&mut d, 3000, 255);
    assert!(!d.line_level(0));
    land(&mut d, 4000, 1);
    assert!(d.line_level(0), "the second wrap");
    // Disabling the interrupt lowers the line and keeps the status.
    d.write(5000, 0, domain_reg(0, DOM_IRQ_CTL), 8, 0);
    assert!(!d.line_level(0));
    assert_eq!(d.read(5000, 0, status, 8), 1);
}

#[test]
fn allowed_set_changes_raise_the_configuration_interrupt() {
    let mut d = with_irq(IRQ_CTL_CONFIG, 0);
    let allowed = domain_reg(0, DOM_ALLOWED_CPUS);
    let config = domain_reg(0, DOM_CONFIG_STATUS);
    d.set_allowed(100, 0, &[1]).unwrap();
    assert_eq!(d.read(100, 3, allowed, 8), 0b10);
    assert!(d.line_level(0));
    let gen = domain_reg(0, DOM_ALLOWED_GEN);
    let ack = domain_reg(0, DOM_ALLOWED_ACK);
    assert_eq!(d.read(100, 3, gen, 8), 1);
    // Until the driver acknowledges the generation (from anywhere), the
    // placement rule keeps the set it was placed by: the owner, vCPU 0,
    // still reads its counter, also after the status was read.
    assert_eq!(d.read(150, 0, slot_count(0, 0), 8) & COUNTER_ERROR, 0);
    assert_eq!(d.read(200, 3, config, 8), CONFIG_STATUS_ALLOWED);
    assert!(!d.line_level(0));
    assert_eq!(d.read(200, 0, slot_count(0, 0), 8) & COUNTER_ERROR, 0);
    assert_eq!(d.read(200, 3, config, 8), 0, "read-and-clear");
    d.write(200, 3, ack, 8, 1);
    assert_eq!(d.read(200, 3, ack, 8), 1);
    // Acknowledged: vCPU 0 is no longer allowed, its reads are violations.
    assert_eq!(d.read(200, 0, slot_count(0, 0), 8), COUNTER_ERROR);
    // An empty set is a set; a vCPU the mask cannot hold is refused.
    d.set_allowed(300, 0, &[]).unwrap();
    assert_eq!(d.read(300, 0, allowed, 8), 0);
    assert!(matches!(
        d.set_allowed(300, 0, &[64]),
        Err(DeviceError::NoSuchCpu { cpu: 64, .. })
    ));
    assert!(matches!(
        d.set_allowed(300, 7, &[0]),
        Err(DeviceError::NoSuchDomain { domain: 7, .. })
    ));
    let s = d.state(400);
    assert_eq!(s.domains[0].irq.allowed_changes, 2);
    let lines: Vec<String> = d.trace_since(0).lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("allowed dom=0 from=0-1 to=1")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("allowed dom=0 from=1 to=none")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("irq dom=0 line=up status=0x0 config=0x1")),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("reg=DOM_CONFIG_STATUS")),
        "{lines:#?}"
    );
}

#[test]
fn an_acknowledged_generation_is_enforced_whatever_came_after() {
    let mut d = with_irq(IRQ_CTL_CONFIG, 0);
    let gen = domain_reg(0, DOM_ALLOWED_GEN);
    let ack = domain_reg(0, DOM_ALLOWED_ACK);
    // Generation 1 = {1}, 2 = {} (parked), 3 = {0}.
    d.set_allowed(100, 0, &[1]).unwrap();
    d.set_allowed(100, 0, &[]).unwrap();
    d.set_allowed(100, 0, &[0]).unwrap();
    assert_eq!(d.read(100, 3, gen, 8), 3);
    // The driver read generation 2's set and says so: {} is enforced though
    // {0} is current, so vCPU 0 is caught.
    d.write(200, 3, ack, 8, 2);
    assert_eq!(d.read(200, 0, slot_count(0, 0), 8), COUNTER_ERROR);
    d.write(300, 3, ack, 8, 3);
    assert_eq!(d.read(300, 0, slot_count(0, 0), 8) & COUNTER_ERROR, 0);
    // A generation to come, one older than the history, a half write: bad
    // values, nothing changes.
    let bad = d.state(300).bad_accesses.bad_value;
    d.write(400, 3, ack, 8, 4);
    d.write(400, 3, ack, 4, 1);
    for _ in 0..ALLOWED_HISTORY + 1 {
        d.set_allowed(500, 0, &[0]).unwrap();
    }
    d.write(600, 3, ack, 8, 0);
    assert_eq!(d.state(600).bad_accesses.bad_value, bad + 3);
    assert_eq!(d.read(600, 3, ack, 8), 3);
    // The oldest generation still remembered is accepted.
    d.write(700, 3, ack, 8, 4 + 1);
    assert_eq!(d.read(700, 3, ack, 8), 5);
}

#[test]
fn interrupt_registers_refuse_bad_values() {
    let mut d = with_irq(0, 0);
    d.write(0, 0, domain_reg(0, DOM_IRQ_CTL), 8, 1 << 3);
    d.write(0, 0, domain_reg(0, DOM_IRQ_THRESHOLD), 8, 256);
    d.write(0, 0, domain_reg(0, DOM_IRQ_STATUS), 8, 0);
    d.write(0, 0, domain_reg(0, DOM_IRQ_CTL) + 4, 4, 1);
    let s = d.state(0);
    assert_eq!(
        (
            s.bad_accesses.bad_value,
            s.bad_accesses.read_only,
            s.bad_accesses.high_half_write
        ),
        (2, 1, 1)
    );
    assert_eq!((s.domains[0].irq.ctl, s.domains[0].irq.threshold), (0, 0));
    d.write(0, 0, domain_reg(0, DOM_IRQ_THRESHOLD), 8, 255);
    assert_eq!(d.read(0, 3, domain_reg(0, DOM_IRQ_THRESHOLD), 8), 255);
}
