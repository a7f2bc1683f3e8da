//! What the device records of guest accesses: the access trace and the
//! counts of bad accesses.

use serde::{Deserialize, Serialize};

/// Number of register accesses the trace keeps.
pub const TRACE_CAPACITY: usize = 4096;

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

/// One recorded register access.
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
