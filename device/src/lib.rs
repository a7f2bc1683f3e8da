//! perfbed's virtual memory-bandwidth / cache-occupancy monitoring device.
//!
//! The device models what Intel RDT (MBM/CMT) and AMD ABMC monitors do: per
//! domain, a few counter slots count the memory traffic of an (event, RMID),
//! counters are narrow and wrap, and counters may only be read from the
//! domain's allowed vCPUs (by the vCPU the driver declared as owner).
//!
//! - [`regs`]: the register map, shared with the guest kernel driver.
//! - [`Device`]: the pure state machine (no KVM, no I/O, time as an input).
//! - [`SharedDevice`]: what a VMM holds; forwards MMIO accesses and serves
//!   the control socket ([`control`]).
//! - [`cpus`]: kernel CPU lists (`"0-1,3"`).
//! - [`line`]: request lines read with a bounded buffer.
//!
//! `device/README.md` documents the register map and the control protocol.

pub mod control;
pub mod cpus;
mod device;
pub mod host;
pub mod l3_topology;
pub mod line;
pub mod regs;

pub use control::{
    ClientError, ControlClient, ControlServer, Request, Response, TraceAccesses, TraceLines,
};
pub use device::{
    dropped_line, event_name, format_record, parse_event, trace_file, AccessKind, AssignmentRecord,
    Assignments, BadAccessCounts, BadAccessKind, ConfigError, Device, DeviceConfig, DeviceError,
    DeviceState, DomainState, IrqState, OccupancyEntry, RateEntry, SlotState, TraceEntry,
    TraceEvent, TraceRecord, TraceRing, TraceSnapshot, TruthEntry, ASSIGNMENT_LOG_CAPACITY,
    MAX_QUEUED, MAX_RATE_LIMIT, MAX_TRACE_CAPACITY, TRACE_CAPACITY, TRACE_MAGIC,
};
pub use host::SharedDevice;
pub use regs::Event;
