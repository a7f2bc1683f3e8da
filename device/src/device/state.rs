//! A serializable snapshot of the device, as the control socket reports it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::config::DeviceConfig;
use super::trace::BadAccessCounts;
use crate::regs::Event;

/// A slot in a state snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotState {
    /// Slot index.
    pub slot: u32,
    /// The `SLOT_CTL` value.
    pub ctl: u64,
    /// Assigned event, if any.
    pub event: Option<Event>,
    /// Assigned RMID, if any.
    pub rmid: Option<u32>,
    /// Bytes counted since assignment (mod 2^64).
    pub counted_bytes: u64,
    /// What a correctly placed read of `SLOT_COUNT` returns now.
    pub register: u64,
    /// The current assignment's number (see the `assignments` request),
    /// `None` while the slot is free.
    #[serde(default)]
    pub assignment: Option<u64>,
}

/// Ground truth of one (RMID, event) in a domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TruthEntry {
    /// RMID.
    pub rmid: u32,
    /// Cumulative event.
    pub event: Event,
    /// All bytes landed so far (mod 2^64).
    pub bytes: u64,
}

/// A steady rate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateEntry {
    /// RMID.
    pub rmid: u32,
    /// Cumulative event.
    pub event: Event,
    /// Bytes per second.
    pub bytes_per_sec: u64,
}

/// Occupancy of one RMID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OccupancyEntry {
    /// RMID.
    pub rmid: u32,
    /// Bytes.
    pub bytes: u64,
}

/// One domain in a state snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainState {
    /// Domain index.
    pub domain: u32,
    /// vCPUs from which the counters may be read.
    pub allowed_cpus: Vec<u32>,
    /// The same as a kernel CPU list.
    pub allowed_cpu_list: String,
    /// The `ALLOWED_CPUS` register.
    pub allowed_mask: u64,
    /// The `OWNER` register, `None` for `NO_OWNER`.
    pub owner: Option<u32>,
    /// All slots.
    pub slots: Vec<SlotState>,
    /// Ground truth of every (RMID, event) with non-zero bytes.
    pub truth: Vec<TruthEntry>,
    /// Occupancy of every RMID with non-zero occupancy.
    pub occupancy: Vec<OccupancyEntry>,
    /// Injected bytes not landed yet.
    pub pending_bytes: u64,
    /// Non-zero steady rates.
    pub steady_rates: Vec<RateEntry>,
    /// Counter reads that broke the placement rule.
    pub violations: u64,
    /// The same by reading vCPU.
    pub violations_by_vcpu: BTreeMap<u32, u64>,
    /// All counter reads (`SLOT_COUNT`, `OCCUPANCY`) by reading vCPU.
    pub counter_reads_by_vcpu: BTreeMap<u32, u64>,
    /// The domain's interrupt line and its registers.
    #[serde(default)]
    pub irq: IrqState,
}

/// A domain's interrupt line in a state snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IrqState {
    /// `DOM_IRQ_CTL`.
    pub ctl: u64,
    /// `DOM_IRQ_THRESHOLD`.
    pub threshold: u64,
    /// `DOM_IRQ_STATUS` (not cleared by the snapshot).
    pub status: u64,
    /// `DOM_CONFIG_STATUS` (not cleared by the snapshot).
    pub config_status: u64,
    /// The line's level.
    pub line: bool,
    /// Rising edges of the line since the last reset: interrupts raised.
    pub raised: u64,
    /// Status reads that returned and cleared a non-zero
    /// `DOM_IRQ_STATUS`, by reading vCPU (each from the owner: a read
    /// elsewhere is a violation and clears nothing).
    pub acks_by_vcpu: BTreeMap<u32, u64>,
    /// Allowed-set changes the host made since the device was created.
    pub allowed_changes: u64,
}

/// A serializable snapshot of the whole device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceState {
    /// Device time of the snapshot.
    pub now_ns: u64,
    /// `REG_MAGIC`.
    pub magic: u64,
    /// `REG_VERSION`.
    pub version: u64,
    /// Size of the register region.
    pub size: u64,
    /// The configuration.
    pub config: DeviceConfig,
    /// Per domain.
    pub domains: Vec<DomainState>,
    /// Injected bytes not landed yet, all domains.
    pub pending_bytes: u64,
    /// Bad guest accesses.
    pub bad_accesses: BadAccessCounts,
    /// Records in the trace (accesses, owner changes, host actions).
    pub trace_len: usize,
    /// Records the trace lost to overflow since the last reset.
    #[serde(default)]
    pub trace_dropped: u64,
}

impl DeviceState {
    /// Truth of (domain, RMID, event), 0 when absent.
    pub fn truth(&self, domain: u32, rmid: u32, event: Event) -> u64 {
        self.domains
            .get(domain as usize)
            .and_then(|d| d.truth.iter().find(|t| t.rmid == rmid && t.event == event))
            .map_or(0, |t| t.bytes)
    }
}
