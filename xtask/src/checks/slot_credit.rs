//! What a counting driver can have credited to each slot assignment,
//! replayed from the device's own record: its slot-level truth (the
//! `assignments` answer) and its register accesses (`trace_accesses`).
//!
//! The rule is the device's contract for a reader (`regs::COUNTER_OVERFLOW`,
//! docs/counting-semantics.md): a slot counts from zero when it is assigned;
//! a reader adds up the deltas of its reads of the slot's counter modulo the
//! counter's width (a read flagged `COUNTER_OVERFLOW` adds nothing, one
//! flagged with an error or as unavailable is no reading); what it can know
//! of an assignment is that sum at its **last read** of the slot during the
//! assignment. perfbed.ko reads a slot in `read`, in `del` (the fold before
//! the slot is given up) and in its wrap poll, and credits the event on
//! `read` and `del`. In perf's rotation the outgoing `del` and the incoming
//! slot write run in one interrupts-off section on the owner CPU, which is
//! also the only CPU that reads, so no poll comes between them: for an
//! assignment that a rotation or a close ends, the last read is the `del`'s
//! fold, and for one that lasts, a read after the traffic stopped reads the
//! same as the fold before it. So a multiplexed event's raw value is
//! exactly the sum of its assignments' credits, however unevenly the guest
//! ran. What a slot counted after its last read (the rotation gap, which a
//! guest stall inside a rotation stretches to seconds) is in the
//! assignment's `counted_bytes` but in nobody's count.

use std::collections::BTreeMap;

use perfbed_device::regs;
use perfbed_device::{AccessKind, AssignmentRecord, TraceEntry};
use thiserror::Error;

/// The device shape the replay needs to decode offsets and counter values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub domains: u64,
    pub slots: u64,
    /// Bytes per counter unit.
    pub unit_bytes: u64,
    /// Counter width in bits.
    pub width: u64,
}

/// One assignment with what a reader of its slot could have known of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credit {
    pub record: AssignmentRecord,
    /// Bytes the reads of the slot during the assignment add up to (0 if
    /// it was never read).
    pub read_bytes: u64,
    /// Reads of the slot's counter during the assignment.
    pub reads: u32,
}

impl Credit {
    /// Bytes the slot counted after its last read: counted by the device,
    /// in no reader's count.
    pub fn unread_bytes(&self) -> u64 {
        self.record.counted_bytes.saturating_sub(self.read_bytes)
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ReplayError {
    #[error("assignment {seq} (domain {domain} slot {slot}, from {assigned_ns} ns) has no SLOT_CTL write in the trace: the trace does not reach back to it")]
    NoWrite {
        seq: u64,
        domain: u32,
        slot: u32,
        assigned_ns: u64,
    },
    #[error(
        "assignment {seq}: its reads add up to {read_bytes} bytes, more than the {counted_bytes} its slot counted"
    )]
    ReadMoreThanCounted {
        seq: u64,
        read_bytes: u64,
        counted_bytes: u64,
    },
}

/// Replays `accesses` (in trace order) against `assignments`: the credit of
/// every assignment. Every assignment must begin inside the trace.
pub fn replay(
    shape: Shape,
    assignments: &[AssignmentRecord],
    accesses: &[TraceEntry],
) -> Result<Vec<Credit>, ReplayError> {
    let mask = regs::counter_mask(shape.width);
    // An assignment begins with the SLOT_CTL write at its `assigned_ns`.
    let by_start: BTreeMap<(u32, u32, u64), usize> = assignments
        .iter()
        .enumerate()
        .map(|(i, a)| ((a.domain, a.slot, a.assigned_ns), i))
        .collect();
    let mut credits: Vec<Credit> = assignments
        .iter()
        .map(|&record| Credit {
            record,
            read_bytes: 0,
            reads: 0,
        })
        .collect();
    let mut begun = vec![false; assignments.len()];
    // Per (domain, slot): the assignment being replayed and the reader's
    // last counter value and sum, in units.
    let mut current: BTreeMap<(u32, u32), (Option<usize>, u64, u64)> = BTreeMap::new();
    for a in accesses.iter().filter(|a| a.bad.is_none() && !a.violation) {
        let Some((d, s, is_ctl)) = slot_register(shape, a.offset) else {
            continue;
        };
        match (a.kind, is_ctl) {
            (AccessKind::Write, true) => {
                let index = by_start.get(&(d, s, a.time_ns)).copied();
                if let Some(i) = index {
                    begun[i] = true;
                }
                current.insert((d, s), (index, 0, 0));
            }
            (AccessKind::Read, false) => {
                let Some((Some(i), last, sum)) = current.get_mut(&(d, s)) else {
                    continue;
                };
                if a.value & (regs::COUNTER_ERROR | regs::COUNTER_UNAVAILABLE) != 0 {
                    continue;
                }
                let now = a.value & mask;
                if a.value & regs::COUNTER_OVERFLOW == 0 {
                    *sum = sum.wrapping_add(now.wrapping_sub(*last) & mask);
                }
                *last = now;
                credits[*i].read_bytes = sum.wrapping_mul(shape.unit_bytes);
                credits[*i].reads += 1;
            }
            _ => {}
        }
    }
    for (c, begun) in credits.iter().zip(begun) {
        let r = c.record;
        if !begun {
            return Err(ReplayError::NoWrite {
                seq: r.seq,
                domain: r.domain,
                slot: r.slot,
                assigned_ns: r.assigned_ns,
            });
        }
        if c.read_bytes > r.counted_bytes {
            return Err(ReplayError::ReadMoreThanCounted {
                seq: r.seq,
                read_bytes: c.read_bytes,
                counted_bytes: r.counted_bytes,
            });
        }
    }
    Ok(credits)
}

/// The (domain, slot) of a slot register and whether it is `SLOT_CTL`
/// (else `SLOT_COUNT`); `None` for any other offset.
fn slot_register(shape: Shape, offset: u64) -> Option<(u32, u32, bool)> {
    (0..shape.domains).find_map(|d| {
        (0..shape.slots).find_map(|s| {
            let hit = if offset == regs::slot_ctl(d, s) {
                Some(true)
            } else if offset == regs::slot_count(d, s) {
                Some(false)
            } else {
                None
            };
            hit.map(|ctl| (d as u32, s as u32, ctl))
        })
    })
}

/// The domain whose counter (a slot register or an `OCCUPANCY`) `offset`
/// is; `None` for any other register.
fn counter_domain(shape: Shape, offset: u64) -> Option<u32> {
    slot_register(shape, offset).map(|(d, _, _)| d).or_else(|| {
        (0..shape.domains)
            .find(|&d| {
                (regs::occupancy(d, 0)..regs::occupancy(d, regs::MAX_RMIDS)).contains(&offset)
            })
            .map(|d| d as u32)
    })
}

/// How far perf's time_running of each RMID's event is from the device time
/// its slots counted and were read, from the rotations inside
/// `[from_ns, to_ns]` (device time, ns; positive: counted more than perf
/// says it ran).
///
/// perf's rotation stamps the context's time once, before its first `del`,
/// and accounts every event from that stamp: the outgoing ones stop running
/// there, the incoming ones run from there, the staying ones run on. The
/// device sees the rotation as the `del` reads of every held slot, then the
/// `SLOT_CTL` writes of the incoming events; the stamp is taken as the
/// earliest of the slots' last reads before a write (the first `del`).
/// For each write the assignment it ends was credited up to its slot's last
/// read, past the stamp (+), and the one it begins counts from the write,
/// after the stamp (−). An event that stays but loses its slot to an
/// incoming one gets both, which nets to the time from its `del` read to
/// its new slot's write. Evenly running, a rotation takes a few register
/// accesses and these are small; a guest stopped inside one (perf's
/// rotation runs with interrupts off, every access an exit) moves the whole
/// stop into one event's estimate.
///
/// A write of the domain's `OWNER` (a move or a park) starts the domain
/// afresh: perf accounts a migrated context from the move, so only reads
/// after it can stamp a rotation. Nor do all of those: the move's install
/// on the new owner (patch 0008: one cross call that freezes the context
/// time, then adds every event) has no `del` reads, the `del`s ran on the
/// CPU left, and reads only the slot an incoming event takes from a moved
/// one that waits, just before its write. The held slots' last reads before
/// it are the new owner's own (its catch-up in `migrate_cpu`, a poll), from
/// before an RCU grace period and a cross call that a loaded guest can
/// stretch past 100 ms. So the stamp is also no earlier than the first
/// access of the write's operation: a perf operation runs on one CPU with
/// interrupts off, and perfbed.ko's callbacks reach the device only through
/// the domain's counters (slots, and a gauge's `OCCUPANCY`), so it is one
/// unbroken run of the writing vCPU's accesses to those, and it begins
/// after that vCPU's last access of any other register (a poll's
/// `DOM_IRQ_STATUS`, a `DOM_IRQ_CTL` or `OWNER` write).
pub fn rotation_bias(
    shape: Shape,
    assignments: &[AssignmentRecord],
    accesses: &[TraceEntry],
    from_ns: u64,
    to_ns: u64,
) -> BTreeMap<(u32, u32), i64> {
    let by_start: BTreeMap<(u32, u32, u64), &AssignmentRecord> = assignments
        .iter()
        .map(|a| ((a.domain, a.slot, a.assigned_ns), a))
        .collect();
    // Per (domain, slot): the RMID it counts for (if an assignment of
    // interest) and the time of its last counter read.
    let mut holder: BTreeMap<(u32, u32), u32> = BTreeMap::new();
    let mut last_read: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    let mut bias: BTreeMap<(u32, u32), i64> = BTreeMap::new();
    // Per vCPU: the domain and start of its current run of counter accesses.
    let mut run: BTreeMap<u32, (u32, u64)> = BTreeMap::new();
    for a in accesses.iter().filter(|a| a.bad.is_none() && !a.violation) {
        if a.kind == AccessKind::Write {
            if let Some(d) =
                (0..shape.domains).find(|&d| a.offset == regs::domain_reg(d, regs::DOM_OWNER))
            {
                last_read.retain(|k, _| u64::from(k.0) != d);
            }
        }
        match (counter_domain(shape, a.offset), run.get(&a.vcpu)) {
            (Some(d), Some(&(domain, _))) if domain == d => {}
            (Some(d), _) => {
                run.insert(a.vcpu, (d, a.time_ns));
            }
            (None, _) => {
                run.remove(&a.vcpu);
            }
        }
        let Some((d, s, is_ctl)) = slot_register(shape, a.offset) else {
            continue;
        };
        let run_start = run.get(&a.vcpu).map_or(a.time_ns, |&(_, start)| start);
        match (a.kind, is_ctl) {
            (AccessKind::Read, false) => {
                last_read.insert((d, s), a.time_ns);
            }
            (AccessKind::Write, true) => {
                let starts = by_start.get(&(d, s, a.time_ns)).map(|r| r.rmid);
                let ends = holder.remove(&(d, s));
                if let Some(rmid) = starts {
                    holder.insert((d, s), rmid);
                }
                if !(from_ns..=to_ns).contains(&a.time_ns) {
                    continue;
                }
                let held = |slot: &&(u32, u32)| {
                    slot.0 == d && (holder.contains_key(slot) || **slot == (d, s))
                };
                let Some(stamp) = last_read
                    .iter()
                    .filter(|(k, _)| held(k))
                    .map(|(_, &t)| t)
                    .min()
                else {
                    continue;
                };
                let stamp = stamp.max(run_start);
                if let (Some(rmid), Some(&read)) = (ends, last_read.get(&(d, s))) {
                    *bias.entry((d, rmid)).or_default() += read.saturating_sub(stamp) as i64;
                }
                if let Some(rmid) = starts {
                    *bias.entry((d, rmid)).or_default() -= a.time_ns.saturating_sub(stamp) as i64;
                }
            }
            _ => {}
        }
    }
    bias
}

/// The longest stretch of device time between consecutive accesses (from
/// any vCPU) inside `[from_ns, to_ns]`, with where it began; the window's
/// ends count as accesses.
pub fn longest_silence(accesses: &[TraceEntry], from_ns: u64, to_ns: u64) -> (u64, u64) {
    let mut last = from_ns;
    let mut longest = (0, from_ns);
    let times = accesses
        .iter()
        .map(|a| a.time_ns)
        .filter(|&t| t > from_ns && t < to_ns)
        .chain([to_ns]);
    for t in times {
        if t.saturating_sub(last) > longest.0 {
            longest = (t - last, last);
        }
        last = last.max(t);
    }
    longest
}

#[cfg(test)]
mod tests {
    use perfbed_device::regs::Event;

    use super::*;

    const SHAPE: Shape = Shape {
        domains: 2,
        slots: 4,
        unit_bytes: 64,
        width: 8,
    };

    fn write(t: u64, d: u64, s: u64, value: u64) -> TraceEntry {
        TraceEntry {
            time_ns: t,
            vcpu: 0,
            offset: regs::slot_ctl(d, s),
            size: 8,
            kind: AccessKind::Write,
            value,
            bad: None,
            violation: false,
        }
    }

    fn read(t: u64, d: u64, s: u64, value: u64) -> TraceEntry {
        TraceEntry {
            time_ns: t,
            vcpu: 0,
            offset: regs::slot_count(d, s),
            size: 8,
            kind: AccessKind::Read,
            value,
            bad: None,
            violation: false,
        }
    }

    fn record(
        seq: u64,
        d: u32,
        s: u32,
        from: u64,
        to: Option<u64>,
        counted: u64,
    ) -> AssignmentRecord {
        AssignmentRecord {
            seq,
            domain: d,
            slot: s,
            event: Event::MbmTotalBytes,
            rmid: seq as u32,
            assigned_ns: from,
            released_ns: to,
            counted_bytes: counted,
        }
    }

    #[test]
    fn an_assignment_is_credited_with_its_reads_up_to_the_last_one() {
        let ctl = regs::slot_ctl_value(Event::MbmTotalBytes, 1);
        // Slot 0 of domain 1: assigned at 10, read 3 units at 20 and 5 at
        // 30, reassigned at 40 after 7 units landed: 2 units unread.
        let trace = [
            write(10, 1, 0, ctl),
            read(20, 1, 0, 3),
            read(30, 1, 0, 5),
            write(40, 1, 0, ctl),
            read(50, 1, 0, 1),
        ];
        let records = [
            record(0, 1, 0, 10, Some(40), 7 * 64),
            record(1, 1, 0, 40, None, 64),
        ];
        let credits = replay(SHAPE, &records, &trace).unwrap();
        assert_eq!(
            (
                credits[0].read_bytes,
                credits[0].reads,
                credits[0].unread_bytes()
            ),
            (5 * 64, 2, 2 * 64)
        );
        assert_eq!((credits[1].read_bytes, credits[1].unread_bytes()), (64, 0));
    }

    #[test]
    fn wraps_are_added_up_and_an_overflowed_read_adds_nothing() {
        let ctl = regs::slot_ctl_value(Event::MbmTotalBytes, 1);
        // 8-bit counter: 250, then 4 (10 more), then an overflow flag at 9.
        let trace = [
            write(1, 0, 2, ctl),
            read(2, 0, 2, 250),
            read(3, 0, 2, 4),
            read(4, 0, 2, 9 | regs::COUNTER_OVERFLOW),
            read(5, 0, 2, 10),
        ];
        let records = [record(0, 0, 2, 1, None, 1000 * 64)];
        let credits = replay(SHAPE, &records, &trace).unwrap();
        assert_eq!(credits[0].read_bytes, (260 + 1) * 64);
        assert_eq!(credits[0].reads, 4);
    }

    #[test]
    fn error_reads_and_other_registers_are_no_reading() {
        let ctl = regs::slot_ctl_value(Event::MbmTotalBytes, 1);
        let mut violation = read(3, 0, 0, regs::COUNTER_ERROR);
        violation.violation = true;
        let trace = [
            write(1, 0, 0, ctl),
            read(2, 0, 1, 77),
            violation,
            read(4, 0, 0, regs::COUNTER_UNAVAILABLE),
            read(5, 0, 0, 6),
        ];
        let records = [record(0, 0, 0, 1, None, 6 * 64)];
        assert_eq!(
            replay(SHAPE, &records, &trace).unwrap()[0].read_bytes,
            6 * 64
        );
    }

    #[test]
    fn an_assignment_the_trace_does_not_reach_or_reads_above_the_truth_are_errors() {
        let ctl = regs::slot_ctl_value(Event::MbmTotalBytes, 1);
        let records = [record(4, 0, 0, 1, None, 64)];
        assert!(matches!(
            replay(SHAPE, &records, &[read(2, 0, 0, 1)]),
            Err(ReplayError::NoWrite { seq: 4, .. })
        ));
        let trace = [write(1, 0, 0, ctl), read(2, 0, 0, 2)];
        assert!(matches!(
            replay(SHAPE, &records, &trace),
            Err(ReplayError::ReadMoreThanCounted { seq: 4, .. })
        ));
    }

    #[test]
    fn a_rotation_moves_its_span_from_the_incoming_event_and_credits_the_outgoing_one() {
        let ctl = |rmid| regs::slot_ctl_value(Event::MbmTotalBytes, rmid);
        // Slots 0 and 1 hold RMIDs 0 and 1. A rotation reads slot 1 at 100
        // (the stamp), stops, reads slot 0 at 400 and gives slot 0 to RMID 2
        // at 600: RMID 0 was credited 300 past the stamp, RMID 2 counts 600
        // after it, RMID 1 stays.
        let trace = [
            write(1, 0, 0, ctl(0)),
            write(2, 0, 1, ctl(1)),
            read(100, 0, 1, 0),
            read(400, 0, 0, 0),
            write(600, 0, 0, ctl(2)),
        ];
        let mut records = [
            record(0, 0, 0, 1, Some(600), 0),
            record(1, 0, 1, 2, None, 0),
            record(2, 0, 0, 600, None, 0),
        ];
        records[1].rmid = 1;
        let bias = rotation_bias(SHAPE, &records, &trace, 50, 1000);
        assert_eq!(bias, BTreeMap::from([((0, 0), 300), ((0, 2), -500)]));
        // Outside the window, no rotation is weighed.
        assert!(rotation_bias(SHAPE, &records, &trace, 700, 1000).is_empty());
        // A move between the reads and the write: only slot 0's read after
        // it stamps the rotation.
        let mut moved = trace.to_vec();
        let owner = TraceEntry {
            offset: regs::domain_reg(0, regs::DOM_OWNER),
            kind: AccessKind::Write,
            ..trace[0]
        };
        moved.insert(
            3,
            TraceEntry {
                time_ns: 300,
                ..owner
            },
        );
        let bias = rotation_bias(SHAPE, &records, &moved, 50, 1000);
        assert_eq!(bias, BTreeMap::from([((0, 0), 0), ((0, 2), -200)]));
    }

    #[test]
    fn a_move_install_is_stamped_at_its_own_first_access_not_at_a_poll_before_it() {
        let ctl = |rmid| regs::slot_ctl_value(Event::MbmTotalBytes, rmid);
        let on = |vcpu, entry: TraceEntry| TraceEntry { vcpu, ..entry };
        let reg = |t, vcpu, reg, kind| TraceEntry {
            time_ns: t,
            vcpu,
            offset: regs::domain_reg(0, reg),
            size: 8,
            kind,
            value: 0,
            bad: None,
            violation: false,
        };
        // Slots 0-2 hold RMIDs 0, 1 and 4 on vCPU 2; RMIDs 2 and 3 wait. The
        // domain moves to vCPU 3 (the OWNER write), whose poll reads the
        // slots at 100-102 and acks at 103. The move's install comes after a
        // stall, as in the box's run where the rotations were put at -9.4 %
        // against -2.1 % measured: its context time is frozen just before it
        // takes slot 0 from RMID 0 (read at 400, RMID 2 written at 401) and
        // slot 1 from RMID 1 (read at 403, RMID 3 at 405). The poll's reads
        // are no stamp of it: each taken slot was credited past the stamp
        // by its own read, each incoming RMID counts from its write.
        let trace = [
            on(2, write(1, 0, 0, ctl(0))),
            on(2, write(2, 0, 1, ctl(1))),
            on(2, write(3, 0, 2, ctl(4))),
            reg(50, 2, regs::DOM_OWNER, AccessKind::Write),
            on(3, read(100, 0, 0, 0)),
            on(3, read(101, 0, 1, 0)),
            on(3, read(102, 0, 2, 0)),
            reg(103, 3, regs::DOM_IRQ_STATUS, AccessKind::Read),
            // Another vCPU's access does not split vCPU 3's run.
            reg(399, 0, regs::DOM_CONFIG_STATUS, AccessKind::Read),
            on(3, read(400, 0, 0, 0)),
            on(3, write(401, 0, 0, ctl(2))),
            on(3, read(403, 0, 1, 0)),
            on(3, write(405, 0, 1, ctl(3))),
        ];
        let mut records = [
            record(0, 0, 0, 1, Some(401), 0),
            record(1, 0, 1, 2, Some(405), 0),
            record(4, 0, 2, 3, None, 0),
            record(2, 0, 0, 401, None, 0),
            record(3, 0, 1, 405, None, 0),
        ];
        for (i, r) in records.iter_mut().enumerate() {
            r.seq = i as u64;
        }
        let bias = rotation_bias(SHAPE, &records, &trace, 10, 1000);
        assert_eq!(
            bias,
            BTreeMap::from([((0, 0), 0), ((0, 2), -1), ((0, 1), 3), ((0, 3), -5)])
        );
        // A rotation right after the install, with no other register
        // between: its own del reads (every held slot) stamp it, and a
        // gauge's del reading its occupancy does not split it.
        let mut rotated = trace.to_vec();
        let occupancy = TraceEntry {
            offset: regs::occupancy(0, 7),
            ..read(550, 0, 0, 0)
        };
        rotated.extend([
            on(3, read(500, 0, 2, 0)),
            on(3, occupancy),
            on(3, read(600, 0, 0, 0)),
            on(3, read(601, 0, 1, 0)),
            on(3, write(602, 0, 2, ctl(0))),
        ]);
        records[2].released_ns = Some(602);
        let mut records = records.to_vec();
        records.push(AssignmentRecord {
            seq: 5,
            rmid: 0,
            ..record(5, 0, 2, 602, None, 0)
        });
        let bias = rotation_bias(SHAPE, &records, &rotated, 450, 1000);
        assert_eq!(bias, BTreeMap::from([((0, 4), 0), ((0, 0), -102)]));
    }

    #[test]
    fn the_longest_silence_counts_the_window_ends() {
        let trace = [
            read(150, 0, 0, 0),
            read(200, 0, 0, 0),
            read(900, 0, 0, 0),
            read(5000, 0, 0, 0),
        ];
        assert_eq!(longest_silence(&trace, 100, 1000), (700, 200));
        assert_eq!(longest_silence(&trace, 100, 120), (20, 100));
        assert_eq!(longest_silence(&[], 0, 300), (300, 0));
    }
}
