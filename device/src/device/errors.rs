//! Why a host-side request (traffic, rates, occupancy) was refused.

use crate::regs::Event;

/// Why a host-side request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The domain does not exist.
    #[error("no domain {domain} (the device has {domains})")]
    NoSuchDomain {
        /// Requested domain.
        domain: u32,
        /// Number of domains.
        domains: usize,
    },
    /// The RMID does not exist.
    #[error("no RMID {rmid} (the device has {rmids})")]
    NoSuchRmid {
        /// Requested RMID.
        rmid: u32,
        /// Number of RMIDs.
        rmids: u32,
    },
    /// Traffic and rates apply to cumulative events only.
    #[error("{0} is not a cumulative event (use set_occupancy for llc_occupancy)")]
    NotCumulative(Event),
    /// The domain's total steady rate would exceed its max rate.
    #[error("domain {domain}: total steady rate {total} bytes/s would exceed the max rate {max}")]
    RateTooHigh {
        /// The domain.
        domain: u32,
        /// The total the request would give.
        total: u128,
        /// The domain's max rate.
        max: u64,
    },
    /// The domain's injection queue is full.
    #[error(
        "domain {domain}: {max} injections already queued; wait for them to land (wait_landed)"
    )]
    QueueFull {
        /// The domain.
        domain: u32,
        /// The queue's capacity.
        max: usize,
    },
    /// A CPU set names a vCPU the device cannot describe.
    #[error("vCPU {cpu} is out of range (vCPUs are below {max})")]
    NoSuchCpu {
        /// The vCPU.
        cpu: u32,
        /// The limit.
        max: u32,
    },
}
