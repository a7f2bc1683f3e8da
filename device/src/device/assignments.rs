//! Slot-level truth: every assignment of a counter slot, with the bytes the
//! slot counted while it held that assignment.
//!
//! A slot's assignment begins with a `SLOT_CTL` write of an assigned value
//! (also one that repeats the current value: it resets the count) and ends
//! with the next `SLOT_CTL` write that changes or releases it. While it
//! lasts, every byte of its (event, RMID) that lands in the domain is
//! counted in it. A checker that knows which assignments served an event
//! while it was scheduled can say exactly what the driver should have read
//! for it, multiplexed or not; one that only knows the event, by the
//! assignments of its (domain, event, RMID), can bound it.
//!
//! Ended assignments are kept in a bounded log (the newest
//! [`ASSIGNMENT_LOG_CAPACITY`]); current ones live in their slots.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::regs::Event;

/// Ended assignments the device keeps (older ones are dropped and counted).
pub const ASSIGNMENT_LOG_CAPACITY: usize = 1 << 16;

/// One assignment of one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignmentRecord {
    /// The assignment's number: device-wide, from 0, in the order the
    /// assignments began.
    pub seq: u64,
    pub domain: u32,
    pub slot: u32,
    pub event: Event,
    pub rmid: u32,
    /// Device time of the `SLOT_CTL` write that began it.
    pub assigned_ns: u64,
    /// Device time of the write that ended it; `None` while it lasts.
    pub released_ns: Option<u64>,
    /// Bytes the slot counted while assigned (mod 2^64).
    pub counted_bytes: u64,
}

/// The `assignments` answer: the records numbered `since` and later.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignments {
    /// Device time of the answer (ongoing records counted up to it).
    pub now_ns: u64,
    /// The number the next assignment will get.
    pub next_seq: u64,
    /// Ended assignments lost to the log's bound since the device started.
    pub dropped: u64,
    /// Ended and ongoing assignments, by `seq`.
    pub records: Vec<AssignmentRecord>,
}

/// The log of ended assignments and the next number.
#[derive(Debug, Clone, Default)]
pub(super) struct AssignmentLog {
    ended: VecDeque<AssignmentRecord>,
    next_seq: u64,
    dropped: u64,
}

impl AssignmentLog {
    /// A number for an assignment that begins now.
    pub(super) fn begin(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        seq
    }

    /// Keeps an assignment that just ended.
    pub(super) fn end(&mut self, record: AssignmentRecord) {
        if self.ended.len() >= ASSIGNMENT_LOG_CAPACITY {
            self.ended.pop_front();
            self.dropped = self.dropped.wrapping_add(1);
        }
        self.ended.push_back(record);
    }

    /// The ended records numbered `since` and later, with `ongoing` (the
    /// current ones) merged in, by number.
    pub(super) fn since(
        &self,
        since: u64,
        now_ns: u64,
        ongoing: impl Iterator<Item = AssignmentRecord>,
    ) -> Assignments {
        let mut records: Vec<AssignmentRecord> = self
            .ended
            .iter()
            .copied()
            .chain(ongoing)
            .filter(|r| r.seq >= since)
            .collect();
        records.sort_by_key(|r| r.seq);
        Assignments {
            now_ns,
            next_seq: self.next_seq,
            dropped: self.dropped,
            records,
        }
    }
}
