//! The trace as text: one line per record, `key=value` fields, documented in
//! `device/README.md` ("Trace"). Register names are decoded here, when a
//! record is printed, from the register map (`crate::regs` via `decode`),
//! never when it is recorded.
//!
//! ```text
//! # perfbed-trace v1 domains=0-1:2-3 rmids=8 slots=4 width=24 unit=64 capacity=4096 first_seq=0 next_seq=7 dropped=0
//!     1503220 0 write cpu=0 dom=0 reg=DOM_OWNER off=0x1008 size=8 value=0x1
//!     1503220 1 owner dom=0 from=none to=1 cpu=0
//!     2000000 2 inject dom=0 rmid=1 event=mbm_total_bytes bytes=3146368
//!     2500000 3 read cpu=0 dom=0 reg=SLOT_COUNT[0] off=0x1018 size=8 value=0x8000000000000000 violation
//! ```

use std::fmt::Write as _;

use super::config::DeviceConfig;
use super::decode;
use super::events::event_name;
use super::trace::{AccessKind, TraceEntry, TraceEvent, TraceRecord};
use crate::cpus::{format_cpu_list, CpuSet};
use crate::regs;

/// The first word of a trace file's header line.
pub const TRACE_MAGIC: &str = "# perfbed-trace v1";

/// A copy of (part of) the trace, taken under the device's lock and printed
/// outside it.
#[derive(Debug, Clone)]
pub struct TraceSnapshot {
    /// The device's shape, to decode offsets.
    pub config: DeviceConfig,
    /// Most records the ring keeps.
    pub capacity: usize,
    /// Sequence number of the oldest record the ring still had.
    pub first_seq: u64,
    /// Sequence number the next record will get.
    pub next_seq: u64,
    /// Records lost to overflow since the last reset.
    pub dropped: u64,
    /// The records asked for, oldest first, with their sequence numbers.
    pub records: Vec<(u64, TraceRecord)>,
}

impl TraceSnapshot {
    /// The header line: the device's shape and how much of the trace is
    /// here.
    pub fn header(&self) -> String {
        let c = &self.config;
        let domains: Vec<String> = c.domains.iter().map(|d| format_cpu_list(d)).collect();
        format!(
            "{TRACE_MAGIC} domains={} rmids={} slots={} width={} unit={} capacity={} first_seq={} next_seq={} dropped={}",
            domains.join(":"),
            c.rmids,
            c.slots,
            c.counter_width,
            c.unit_bytes,
            self.capacity,
            self.first_seq,
            self.next_seq,
            self.dropped
        )
    }

    /// One line per record.
    pub fn lines(&self) -> Vec<String> {
        self.records
            .iter()
            .map(|(seq, r)| format_record(&self.config, *seq, r))
            .collect()
    }

    /// The register accesses among the records, oldest first (the `trace`
    /// request's answer).
    pub fn accesses(&self) -> Vec<TraceEntry> {
        self.records
            .iter()
            .filter_map(|(_, r)| match r.event {
                TraceEvent::Access {
                    vcpu,
                    offset,
                    size,
                    kind,
                    value,
                    bad,
                    violation,
                } => Some(TraceEntry {
                    time_ns: r.time_ns,
                    vcpu,
                    offset,
                    size,
                    kind,
                    value,
                    bad,
                    violation,
                }),
                _ => None,
            })
            .collect()
    }
}

/// A trace file's text: the header, a `dropped` line when the ring lost
/// records (at the time of the first one kept), then the record lines.
pub fn trace_file(header: &str, dropped: u64, lines: &[String]) -> String {
    let mut out = format!("{header}\n");
    if dropped > 0 {
        out += &dropped_line(lines.first().map(String::as_str), dropped);
    }
    for line in lines {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The line that says `count` records were lost before `next` (the first
/// line after the gap), stamped with `next`'s time.
pub fn dropped_line(next: Option<&str>, count: u64) -> String {
    let time = next
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or("0");
    format!("{time:>12} - dropped count={count}\n")
}

/// A CPU set as a kernel CPU list, `none` when empty.
fn cpu_list_or_none(set: CpuSet) -> String {
    if set.is_empty() {
        "none".into()
    } else {
        format_cpu_list(&set.cpus())
    }
}

fn owner_text(owner: u64) -> String {
    if owner == regs::NO_OWNER {
        "none".into()
    } else {
        owner.to_string()
    }
}

/// The line of record number `seq` of a device of shape `config`.
pub fn format_record(config: &DeviceConfig, seq: u64, record: &TraceRecord) -> String {
    let mut line = format!("{:>12} {seq} ", record.time_ns);
    let _ = match record.event {
        TraceEvent::Access {
            vcpu,
            offset,
            size,
            kind,
            value,
            bad,
            violation,
        } => {
            let word = match kind {
                AccessKind::Read => "read",
                AccessKind::Write => "write",
            };
            let reg = decode::lookup(
                offset & !7,
                config.domains.len(),
                config.slots,
                config.rmids,
            );
            let dom = reg
                .and_then(|r| r.domain())
                .map_or("-".to_string(), |d| d.to_string());
            let name = reg.map_or("UNKNOWN".to_string(), |r| r.name());
            let _ = write!(line, "{word} cpu={vcpu} dom={dom} reg={name} off={offset:#x} size={size} value={value:#x}");
            if violation {
                line.push_str(" violation");
            }
            match bad {
                Some(kind) => write!(line, " bad={}", kind.name()),
                None => Ok(()),
            }
        }
        TraceEvent::Owner {
            domain,
            from,
            to,
            vcpu,
        } => {
            write!(
                line,
                "owner dom={domain} from={} to={} cpu={vcpu}",
                owner_text(from),
                owner_text(to)
            )
        }
        TraceEvent::Inject {
            domain,
            rmid,
            event,
            bytes,
        } => {
            write!(
                line,
                "inject dom={domain} rmid={rmid} event={} bytes={bytes}",
                event_name(event)
            )
        }
        TraceEvent::Rate {
            domain,
            rmid,
            event,
            bytes_per_sec,
        } => {
            write!(
                line,
                "rate dom={domain} rmid={rmid} event={} bytes_per_sec={bytes_per_sec}",
                event_name(event)
            )
        }
        TraceEvent::Occupancy {
            domain,
            rmid,
            bytes,
        } => write!(line, "occupancy dom={domain} rmid={rmid} bytes={bytes}"),
        TraceEvent::Reset => write!(line, "reset"),
        TraceEvent::Line {
            domain,
            level,
            status,
            config_status,
        } => write!(
            line,
            "irq dom={domain} line={} status={status:#x} config={config_status:#x}",
            if level { "up" } else { "down" }
        ),
        TraceEvent::Allowed { domain, from, to } => write!(
            line,
            "allowed dom={domain} from={} to={}",
            cpu_list_or_none(CpuSet(from)),
            cpu_list_or_none(CpuSet(to))
        ),
    };
    line
}
