//! What the device records: the trace (every guest register access, every
//! owner change, every host action) in a bounded ring, and the counts of bad
//! accesses. `print` turns records into text lines.

use serde::{Deserialize, Serialize};

use crate::regs::Event;

/// Number of records the trace keeps unless configured otherwise.
pub const TRACE_CAPACITY: usize = 4096;
/// Most records a trace may be configured to keep (about 200 MiB).
pub const MAX_TRACE_CAPACITY: usize = 1 << 22;

/// Kinds of bad guest access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BadAccessKind {
    /// No register at that offset.
    UnknownOffset,
    /// Access size other than 8 or 4.
    BadSize,
    /// Offset not aligned to the access size.
    Unaligned,
    /// Write to a read-only register.
    ReadOnly,
    /// 4-byte write to the high half of a writable register.
    HighHalfWrite,
    /// Value refused by a writable register (bad OWNER or SLOT_CTL value).
    BadValue,
}

/// Bad guest accesses, total and by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadAccessCounts {
    /// All bad accesses.
    pub total: u64,
    /// [`BadAccessKind::UnknownOffset`].
    pub unknown_offset: u64,
    /// [`BadAccessKind::BadSize`].
    pub bad_size: u64,
    /// [`BadAccessKind::Unaligned`].
    pub unaligned: u64,
    /// [`BadAccessKind::ReadOnly`].
    pub read_only: u64,
    /// [`BadAccessKind::HighHalfWrite`].
    pub high_half_write: u64,
    /// [`BadAccessKind::BadValue`].
    pub bad_value: u64,
}

impl BadAccessCounts {
    pub(super) fn count(&mut self, kind: BadAccessKind) {
        self.total = self.total.wrapping_add(1);
        let field = match kind {
            BadAccessKind::UnknownOffset => &mut self.unknown_offset,
            BadAccessKind::BadSize => &mut self.bad_size,
            BadAccessKind::Unaligned => &mut self.unaligned,
            BadAccessKind::ReadOnly => &mut self.read_only,
            BadAccessKind::HighHalfWrite => &mut self.high_half_write,
            BadAccessKind::BadValue => &mut self.bad_value,
        };
        *field = field.wrapping_add(1);
    }
}

/// Direction of a register access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessKind {
    /// Guest read.
    Read,
    /// Guest write.
    Write,
}

impl BadAccessKind {
    /// The kind's name, as the control protocol spells it.
    pub fn name(self) -> &'static str {
        match self {
            BadAccessKind::UnknownOffset => "unknown_offset",
            BadAccessKind::BadSize => "bad_size",
            BadAccessKind::Unaligned => "unaligned",
            BadAccessKind::ReadOnly => "read_only",
            BadAccessKind::HighHalfWrite => "high_half_write",
            BadAccessKind::BadValue => "bad_value",
        }
    }
}

/// One recorded register access, as the `trace` request reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEntry {
    /// Device time of the access.
    pub time_ns: u64,
    /// Accessing vCPU.
    pub vcpu: u32,
    /// Offset in the region.
    pub offset: u64,
    /// Access size in bytes.
    pub size: u32,
    /// Read or write.
    pub kind: AccessKind,
    /// Value returned (read) or written (write).
    pub value: u64,
    /// Set when the access was bad (and so ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bad: Option<BadAccessKind>,
    /// Set when the access was a counter read that broke the placement rule.
    #[serde(default)]
    pub violation: bool,
}

/// One thing the device did or was told, in the order it happened: a small
/// `Copy` value, so recording one costs a store into the ring and nothing
/// else. Register names are decoded only when a record is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceEvent {
    /// A guest register access.
    Access {
        /// Accessing vCPU.
        vcpu: u32,
        /// Offset in the region.
        offset: u64,
        /// Access size in bytes.
        size: u32,
        /// Read or write.
        kind: AccessKind,
        /// Value returned (read) or written (write).
        value: u64,
        /// Set when the access was bad (and so ignored).
        bad: Option<BadAccessKind>,
        /// A counter read that broke the placement rule.
        violation: bool,
    },
    /// A domain's `OWNER` changed (by a guest write from `vcpu`).
    Owner {
        /// Domain.
        domain: u32,
        /// Previous owner ([`crate::regs::NO_OWNER`] for none).
        from: u64,
        /// New owner.
        to: u64,
        /// The vCPU that wrote it.
        vcpu: u32,
    },
    /// The host queued traffic.
    Inject {
        /// Domain.
        domain: u32,
        /// RMID.
        rmid: u32,
        /// Cumulative event.
        event: Event,
        /// Bytes.
        bytes: u64,
    },
    /// The host set a steady rate.
    Rate {
        /// Domain.
        domain: u32,
        /// RMID.
        rmid: u32,
        /// Cumulative event.
        event: Event,
        /// Bytes per second (0: cleared).
        bytes_per_sec: u64,
    },
    /// The host set an occupancy.
    Occupancy {
        /// Domain.
        domain: u32,
        /// RMID.
        rmid: u32,
        /// Bytes.
        bytes: u64,
    },
    /// The host cleared the statistics and the trace (this record starts
    /// the new trace).
    Reset,
    /// A domain's interrupt line changed level.
    Line {
        /// Domain.
        domain: u32,
        /// The new level (true: asserted).
        level: bool,
        /// `DOM_IRQ_STATUS` then.
        status: u64,
        /// `DOM_CONFIG_STATUS` then.
        config_status: u64,
    },
    /// The host changed a domain's allowed CPUs.
    Allowed {
        /// Domain.
        domain: u32,
        /// The previous `DOM_ALLOWED_CPUS`.
        from: u64,
        /// The new one.
        to: u64,
    },
}

/// A [`TraceEvent`] and when it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRecord {
    /// Device time.
    pub time_ns: u64,
    /// What happened.
    pub event: TraceEvent,
}

/// A bounded ring of trace records. Records are numbered from 0 in the
/// order they were recorded (the numbering survives [`TraceRing::clear`]),
/// so a reader can ask for what came after the last record it saw.
#[derive(Debug, Clone)]
pub struct TraceRing {
    records: Vec<TraceRecord>,
    capacity: usize,
    /// Index in `records` of the oldest record once the ring is full.
    oldest: usize,
    /// Sequence number the next record gets.
    next_seq: u64,
    /// Records overwritten before anyone could keep them (since the last
    /// clear).
    dropped: u64,
}

impl TraceRing {
    /// An empty ring of `capacity` records (0: record nothing). The memory
    /// is taken now, so recording never allocates.
    pub fn new(capacity: usize) -> TraceRing {
        TraceRing {
            records: Vec::with_capacity(capacity),
            capacity,
            oldest: 0,
            next_seq: 0,
            dropped: 0,
        }
    }

    /// Records `record`, overwriting the oldest one when full.
    pub fn push(&mut self, record: TraceRecord) {
        self.next_seq = self.next_seq.wrapping_add(1);
        if self.capacity == 0 {
            self.dropped = self.dropped.wrapping_add(1);
        } else if self.records.len() < self.capacity {
            self.records.push(record);
        } else if let Some(slot) = self.records.get_mut(self.oldest) {
            *slot = record;
            self.oldest = (self.oldest + 1) % self.capacity;
            self.dropped = self.dropped.wrapping_add(1);
        }
    }

    /// Forgets every record (the numbering carries on).
    pub fn clear(&mut self) {
        self.records.clear();
        self.oldest = 0;
        self.dropped = 0;
    }

    /// Records kept.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no record is kept.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Most records kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Records lost to overflow since the last clear.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Sequence number of the next record.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Sequence number of the oldest record kept.
    pub fn first_seq(&self) -> u64 {
        self.next_seq.wrapping_sub(self.records.len() as u64)
    }

    /// The records kept, oldest first, with their sequence numbers.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &TraceRecord)> {
        let (newer, older) = self.records.split_at(self.oldest.min(self.records.len()));
        (self.first_seq()..).zip(older.iter().chain(newer))
    }

    /// The records kept from sequence number `since` on (all of them if
    /// `since` is older), oldest first. Goes straight to `since` rather
    /// than past every older record: a `trace --follow` poll asks for the
    /// few new records of a full ring under the device's lock.
    pub fn iter_since(&self, since: u64) -> impl Iterator<Item = (u64, &TraceRecord)> {
        let skip = since
            .saturating_sub(self.first_seq())
            .min(self.records.len() as u64);
        self.iter().skip(skip as usize)
    }
}
