//! The shape of a device, and the limits it is checked against.

use serde::{Deserialize, Serialize};

use super::trace::{MAX_TRACE_CAPACITY, TRACE_CAPACITY};
use crate::cpus::CpuSet;
use crate::regs;

/// Highest allowed `max_rate` (1 PiB/s): keeps every rate meaningful.
pub const MAX_RATE_LIMIT: u64 = 1 << 50;

/// The shape of a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceConfig {
    /// Per domain, the vCPUs from which its counters may be read.
    pub domains: Vec<Vec<u32>>,
    /// Number of RMIDs.
    pub rmids: u32,
    /// Counter slots per domain.
    pub slots: u32,
    /// Counter width in bits.
    pub counter_width: u32,
    /// Bytes per counter unit (a power of two).
    pub unit_bytes: u64,
    /// Maximum bandwidth of each domain in bytes per second.
    pub max_rate: u64,
    /// Records the trace keeps (0: none); older ones are dropped and
    /// counted.
    #[serde(default = "default_trace_capacity")]
    pub trace_capacity: usize,
}

fn default_trace_capacity() -> usize {
    TRACE_CAPACITY
}

impl Default for DeviceConfig {
    /// Two domains, vCPUs {0,1} and {2,3}; 8 RMIDs, 4 slots, 24-bit counters
    /// of 64-byte units, 2 GiB/s per domain.
    fn default() -> Self {
        DeviceConfig {
            domains: vec![vec![0, 1], vec![2, 3]],
            rmids: 8,
            slots: 4,
            counter_width: 24,
            unit_bytes: 64,
            max_rate: 2 << 30,
            trace_capacity: TRACE_CAPACITY,
        }
    }
}

/// Why a [`DeviceConfig`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not 1..=16 domains.
    #[error("{0} domains: need 1..={max}", max = regs::MAX_DOMAINS)]
    Domains(usize),
    /// A domain has no allowed CPU.
    #[error("domain {0} has no allowed CPU")]
    EmptyDomain(usize),
    /// A domain allows a CPU outside 0..64.
    #[error("domain {domain} allows CPU {cpu}: CPUs must be below {max}", max = regs::MAX_CPUS)]
    Cpu {
        /// The domain.
        domain: usize,
        /// The CPU.
        cpu: u32,
    },
    /// Not 1..=256 RMIDs.
    #[error("{0} RMIDs: need 1..={max}", max = regs::MAX_RMIDS)]
    Rmids(u32),
    /// Not 1..=32 slots.
    #[error("{0} slots: need 1..={max}", max = regs::MAX_SLOTS)]
    Slots(u32),
    /// Counter width not in 8..=62.
    #[error("counter width {0}: need {min}..={max} bits", min = regs::MIN_COUNTER_WIDTH, max = regs::MAX_COUNTER_WIDTH)]
    CounterWidth(u32),
    /// Unit not a power of two.
    #[error("counter unit {0} bytes: need a power of two")]
    Unit(u64),
    /// Max rate zero or above [`MAX_RATE_LIMIT`].
    #[error("max rate {0} bytes/s: need 1..={MAX_RATE_LIMIT}")]
    MaxRate(u64),
    /// Trace capacity above [`MAX_TRACE_CAPACITY`].
    #[error("trace capacity {0} records: need 0..={MAX_TRACE_CAPACITY}")]
    TraceCapacity(usize),
}

impl DeviceConfig {
    /// Checks the configuration's limits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let n = self.domains.len();
        if n == 0 || n as u64 > regs::MAX_DOMAINS {
            return Err(ConfigError::Domains(n));
        }
        for (domain, cpus) in self.domains.iter().enumerate() {
            if cpus.is_empty() {
                return Err(ConfigError::EmptyDomain(domain));
            }
            if let Err(cpu) = CpuSet::from_cpus(cpus) {
                return Err(ConfigError::Cpu { domain, cpu });
            }
        }
        if self.rmids == 0 || u64::from(self.rmids) > regs::MAX_RMIDS {
            return Err(ConfigError::Rmids(self.rmids));
        }
        if self.slots == 0 || u64::from(self.slots) > regs::MAX_SLOTS {
            return Err(ConfigError::Slots(self.slots));
        }
        let width = u64::from(self.counter_width);
        if !(regs::MIN_COUNTER_WIDTH..=regs::MAX_COUNTER_WIDTH).contains(&width) {
            return Err(ConfigError::CounterWidth(self.counter_width));
        }
        if !self.unit_bytes.is_power_of_two() {
            return Err(ConfigError::Unit(self.unit_bytes));
        }
        if self.max_rate == 0 || self.max_rate > MAX_RATE_LIMIT {
            return Err(ConfigError::MaxRate(self.max_rate));
        }
        if self.trace_capacity > MAX_TRACE_CAPACITY {
            return Err(ConfigError::TraceCapacity(self.trace_capacity));
        }
        Ok(())
    }

    /// Size of the register region for this configuration.
    pub fn size(&self) -> u64 {
        regs::device_size(
            self.domains.len() as u64,
            u64::from(self.rmids),
            u64::from(self.slots),
        )
    }
}
