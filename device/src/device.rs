//! The device model: a pure, deterministic state machine.
//!
//! Hosts call [`Device::read`] and [`Device::write`] for every guest MMIO
//! access (with the accessing vCPU) and the traffic methods for host-side
//! input. Time is an input (`now_ns`, a monotonic clock chosen by the host);
//! a `now_ns` earlier than one already seen counts as no time passing. No
//! method panics on any input, and none blocks.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::cpus::{format_cpu_list, CpuSet};
use crate::regs::{self, Event};

/// Nanoseconds per second.
const NS_PER_SEC: u128 = 1_000_000_000;
/// Number of register accesses the trace keeps.
pub const TRACE_CAPACITY: usize = 4096;
/// Highest allowed `max_rate` (1 PiB/s): keeps every rate meaningful.
pub const MAX_RATE_LIMIT: u64 = 1 << 50;

// ---------------------------------------------------------------------------
// Events on the wire
// ---------------------------------------------------------------------------

/// The wire name of an event (`"mbm_total_bytes"`, ...).
pub fn event_name(event: Event) -> &'static str {
    match event {
        Event::LlcOccupancy => "llc_occupancy",
        Event::MbmTotalBytes => "mbm_total_bytes",
        Event::MbmLocalBytes => "mbm_local_bytes",
    }
}

/// The event with wire name `name`.
pub fn parse_event(name: &str) -> Option<Event> {
    [
        Event::LlcOccupancy,
        Event::MbmTotalBytes,
        Event::MbmLocalBytes,
    ]
    .into_iter()
    .find(|&e| event_name(e) == name)
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(event_name(*self))
    }
}

impl Serialize for Event {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(event_name(*self))
    }
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Event, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Event;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an event name (llc_occupancy, mbm_total_bytes, mbm_local_bytes) or id")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Event, E> {
                parse_event(v).ok_or_else(|| E::custom(format!("unknown event {v:?}")))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Event, E> {
                Event::from_u64(v).ok_or_else(|| E::custom(format!("unknown event id {v}")))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Index of a cumulative event in per-RMID arrays.
fn cumulative_index(event: Event) -> Option<usize> {
    match event {
        Event::MbmTotalBytes => Some(0),
        Event::MbmLocalBytes => Some(1),
        Event::LlcOccupancy => None,
    }
}

const CUMULATIVE: [Event; 2] = [Event::MbmTotalBytes, Event::MbmLocalBytes];

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Host-side errors
// ---------------------------------------------------------------------------

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
}

// ---------------------------------------------------------------------------
// Statistics, trace, state
// ---------------------------------------------------------------------------

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
    fn count(&mut self, kind: BadAccessKind) {
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
    /// Entries in the trace.
    pub trace_len: usize,
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

// ---------------------------------------------------------------------------
// The device
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Assignment {
    event: Event,
    rmid: u32,
}

#[derive(Debug, Clone, Default)]
struct Slot {
    ctl: u64,
    assigned: Option<Assignment>,
    counted: u64,
}

#[derive(Debug, Clone)]
struct Pending {
    rmid: u32,
    event: Event,
    bytes: u64,
}

#[derive(Debug, Clone, Default)]
struct Rate {
    bytes_per_sec: u64,
    /// Sub-byte remainder in byte·ns (always below 1e9).
    carry: u128,
}

#[derive(Debug, Clone)]
struct Domain {
    allowed: CpuSet,
    owner: u64,
    slots: Vec<Slot>,
    /// Per RMID, per cumulative event (total, local).
    truth: Vec<[u64; 2]>,
    occupancy: Vec<u64>,
    queue: VecDeque<Pending>,
    /// Sub-byte remainder of the queue's bandwidth in byte·ns (below 1e9).
    queue_carry: u128,
    rates: BTreeMap<(u32, Event), Rate>,
    violations: u64,
    violations_by_vcpu: BTreeMap<u32, u64>,
    reads_by_vcpu: BTreeMap<u32, u64>,
}

impl Domain {
    fn steady_total(&self) -> u128 {
        self.rates
            .values()
            .map(|r| u128::from(r.bytes_per_sec))
            .sum()
    }

    fn pending(&self) -> u64 {
        self.queue
            .iter()
            .fold(0u64, |acc, p| acc.saturating_add(p.bytes))
    }

    /// Lands `bytes` of (rmid, event): into the truth and every matching slot.
    fn land(&mut self, rmid: u32, event: Event, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let Some(idx) = cumulative_index(event) else {
            return;
        };
        if let Some(t) = self
            .truth
            .get_mut(rmid as usize)
            .and_then(|t| t.get_mut(idx))
        {
            *t = t.wrapping_add(bytes);
        }
        let want = Assignment { event, rmid };
        for slot in &mut self.slots {
            if slot.assigned == Some(want) {
                slot.counted = slot.counted.wrapping_add(bytes);
            }
        }
    }

    /// Lets `dt` ns of traffic land.
    fn advance(&mut self, dt: u64, max_rate: u64) {
        let dt = u128::from(dt);
        // Steady rates.
        let mut landed = Vec::new();
        for (&(rmid, event), rate) in &mut self.rates {
            let budget = rate
                .carry
                .saturating_add(u128::from(rate.bytes_per_sec).saturating_mul(dt));
            rate.carry = budget % NS_PER_SEC;
            let bytes = u64::try_from(budget / NS_PER_SEC).unwrap_or(u64::MAX);
            landed.push((rmid, event, bytes));
        }
        for (rmid, event, bytes) in landed {
            self.land(rmid, event, bytes);
        }
        // Queued injections, FIFO, with what the steady rates leave.
        let queue_rate = u128::from(max_rate).saturating_sub(self.steady_total());
        let mut budget = self
            .queue_carry
            .saturating_add(queue_rate.saturating_mul(dt));
        while let Some(front) = self.queue.front_mut() {
            let can = u64::try_from(budget / NS_PER_SEC).unwrap_or(u64::MAX);
            let take = can.min(front.bytes);
            front.bytes -= take;
            budget = budget.saturating_sub(u128::from(take).saturating_mul(NS_PER_SEC));
            let (rmid, event, done) = (front.rmid, front.event, front.bytes == 0);
            self.land(rmid, event, take);
            if done {
                self.queue.pop_front();
            } else {
                break;
            }
        }
        // Bandwidth is not banked while the queue is empty.
        self.queue_carry = if self.queue.is_empty() {
            0
        } else {
            budget % NS_PER_SEC
        };
    }
}

/// The decoded register behind an 8-byte aligned offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reg {
    Global(u64),
    AllowedCpus(usize),
    Owner(usize),
    SlotCtl(usize, usize),
    SlotCount(usize, usize),
    Occupancy(usize, usize),
}

/// Which part of a register an access covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Full,
    Low,
    High,
}

/// The virtual monitoring device.
#[derive(Debug, Clone)]
pub struct Device {
    config: DeviceConfig,
    size: u64,
    now_ns: u64,
    domains: Vec<Domain>,
    bad: BadAccessCounts,
    trace: VecDeque<TraceEntry>,
}

impl Device {
    /// A device at time 0 with empty counters and no owners.
    pub fn new(config: DeviceConfig) -> Result<Device, ConfigError> {
        config.validate()?;
        let rmids = config.rmids as usize;
        let domains = config
            .domains
            .iter()
            .map(|cpus| Domain {
                allowed: CpuSet::from_cpus(cpus).unwrap_or_default(),
                owner: regs::NO_OWNER,
                slots: vec![Slot::default(); config.slots as usize],
                truth: vec![[0; 2]; rmids],
                occupancy: vec![0; rmids],
                queue: VecDeque::new(),
                queue_carry: 0,
                rates: BTreeMap::new(),
                violations: 0,
                violations_by_vcpu: BTreeMap::new(),
                reads_by_vcpu: BTreeMap::new(),
            })
            .collect();
        Ok(Device {
            size: config.size(),
            config,
            now_ns: 0,
            domains,
            bad: BadAccessCounts::default(),
            trace: VecDeque::with_capacity(TRACE_CAPACITY),
        })
    }

    /// Size of the register region in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The configuration.
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// The latest time seen.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// Moves time to `now_ns` (never backwards), landing traffic.
    fn advance(&mut self, now_ns: u64) {
        if now_ns <= self.now_ns {
            return;
        }
        let dt = now_ns - self.now_ns;
        self.now_ns = now_ns;
        let max_rate = self.config.max_rate;
        for d in &mut self.domains {
            d.advance(dt, max_rate);
        }
    }

    fn record(&mut self, entry: TraceEntry) {
        if let Some(kind) = entry.bad {
            self.bad.count(kind);
        }
        if self.trace.len() >= TRACE_CAPACITY {
            self.trace.pop_front();
        }
        self.trace.push_back(entry);
    }

    /// Splits an access into (8-byte aligned offset, part).
    fn decode(offset: u64, size: u32) -> Result<(u64, Part), BadAccessKind> {
        match size {
            8 if offset & 7 == 0 => Ok((offset, Part::Full)),
            4 if offset & 7 == 0 => Ok((offset, Part::Low)),
            4 if offset & 7 == 4 => Ok((offset - 4, Part::High)),
            8 | 4 => Err(BadAccessKind::Unaligned),
            _ => Err(BadAccessKind::BadSize),
        }
    }

    /// The register at 8-byte aligned offset `off`, if any.
    fn lookup(&self, off: u64) -> Option<Reg> {
        if off < regs::REG_GLOBAL_END {
            return Some(Reg::Global(off));
        }
        let rel = off.checked_sub(regs::DOMAIN_BASE)?;
        let d = usize::try_from(rel / regs::DOMAIN_STRIDE).ok()?;
        if d >= self.domains.len() {
            return None;
        }
        let r = rel % regs::DOMAIN_STRIDE;
        let slots_end = regs::DOM_SLOTS + u64::from(self.config.slots) * regs::SLOT_STRIDE;
        let occ_end = regs::DOM_OCCUPANCY + u64::from(self.config.rmids) * 8;
        match r {
            regs::DOM_ALLOWED_CPUS => Some(Reg::AllowedCpus(d)),
            regs::DOM_OWNER => Some(Reg::Owner(d)),
            _ if (regs::DOM_SLOTS..slots_end).contains(&r) => {
                let s = ((r - regs::DOM_SLOTS) / regs::SLOT_STRIDE) as usize;
                match (r - regs::DOM_SLOTS) % regs::SLOT_STRIDE {
                    regs::SLOT_CTL_OFF => Some(Reg::SlotCtl(d, s)),
                    regs::SLOT_COUNT_OFF => Some(Reg::SlotCount(d, s)),
                    _ => None,
                }
            }
            _ if (regs::DOM_OCCUPANCY..occ_end).contains(&r) => {
                Some(Reg::Occupancy(d, ((r - regs::DOM_OCCUPANCY) / 8) as usize))
            }
            _ => None,
        }
    }

    fn global_value(&self, off: u64) -> Option<u64> {
        let c = &self.config;
        Some(match off {
            regs::REG_MAGIC => regs::MAGIC_VALUE,
            regs::REG_VERSION => regs::VERSION_VALUE,
            regs::REG_NUM_DOMAINS => c.domains.len() as u64,
            regs::REG_NUM_RMIDS => u64::from(c.rmids),
            regs::REG_NUM_SLOTS => u64::from(c.slots),
            regs::REG_COUNTER_WIDTH => u64::from(c.counter_width),
            regs::REG_COUNTER_UNIT => c.unit_bytes,
            regs::REG_MAX_RATE => c.max_rate,
            regs::REG_DOMAIN_BASE => regs::DOMAIN_BASE,
            regs::REG_DOMAIN_STRIDE => regs::DOMAIN_STRIDE,
            regs::REG_SLOT_BASE => regs::DOM_SLOTS,
            regs::REG_SLOT_STRIDE => regs::SLOT_STRIDE,
            regs::REG_OCCUPANCY_BASE => regs::DOM_OCCUPANCY,
            regs::REG_DEVICE_SIZE => self.size,
            regs::REG_EVENTS => regs::EVENTS_MASK,
            _ => return None,
        })
    }

    fn mask(&self) -> u64 {
        regs::counter_mask(u64::from(self.config.counter_width))
    }

    /// Counter value of a slot as a correctly placed read sees it.
    fn slot_register(&self, slot: &Slot) -> u64 {
        match slot.assigned {
            None => regs::COUNTER_UNAVAILABLE,
            Some(_) => (slot.counted / self.config.unit_bytes.max(1)) & self.mask(),
        }
    }

    /// Occupancy register value: units, saturated to the counter width.
    fn occupancy_register(&self, bytes: u64) -> u64 {
        (bytes / self.config.unit_bytes.max(1)).min(self.mask())
    }

    /// Counts a counter read of domain `d` by `vcpu`; returns whether it broke
    /// the placement rule.
    fn placement_check(&mut self, d: usize, vcpu: u32) -> bool {
        let Some(dom) = self.domains.get_mut(d) else {
            return true;
        };
        let reads = dom.reads_by_vcpu.entry(vcpu).or_insert(0);
        *reads = reads.wrapping_add(1);
        let ok = dom.allowed.contains(vcpu) && dom.owner == u64::from(vcpu);
        if !ok {
            dom.violations = dom.violations.wrapping_add(1);
            let v = dom.violations_by_vcpu.entry(vcpu).or_insert(0);
            *v = v.wrapping_add(1);
        }
        !ok
    }

    /// A guest read of `size` bytes at `offset` from `vcpu` at `now_ns`.
    /// Bad accesses return 0 and are counted.
    pub fn read(&mut self, now_ns: u64, vcpu: u32, offset: u64, size: u32) -> u64 {
        self.advance(now_ns);
        let mut violation = false;
        let result = Self::decode(offset, size).and_then(|(off, part)| {
            let reg = self.lookup(off).ok_or(BadAccessKind::UnknownOffset)?;
            let full = match reg {
                Reg::Global(g) => self.global_value(g).ok_or(BadAccessKind::UnknownOffset)?,
                Reg::AllowedCpus(d) => self.domains.get(d).map_or(0, |x| x.allowed.0),
                Reg::Owner(d) => self.domains.get(d).map_or(0, |x| x.owner),
                Reg::SlotCtl(d, s) => self
                    .domains
                    .get(d)
                    .and_then(|x| x.slots.get(s))
                    .map_or(0, |x| x.ctl),
                Reg::SlotCount(d, s) => {
                    violation = self.placement_check(d, vcpu);
                    if violation {
                        regs::COUNTER_ERROR
                    } else {
                        self.domains
                            .get(d)
                            .and_then(|x| x.slots.get(s))
                            .map_or(regs::COUNTER_UNAVAILABLE, |x| self.slot_register(x))
                    }
                }
                Reg::Occupancy(d, r) => {
                    violation = self.placement_check(d, vcpu);
                    if violation {
                        regs::COUNTER_ERROR
                    } else {
                        let bytes = self
                            .domains
                            .get(d)
                            .and_then(|x| x.occupancy.get(r))
                            .copied()
                            .unwrap_or(0);
                        self.occupancy_register(bytes)
                    }
                }
            };
            Ok(match part {
                Part::Full => full,
                Part::Low => full & 0xffff_ffff,
                Part::High => full >> 32,
            })
        });
        let (value, bad) = match result {
            Ok(v) => (v, None),
            Err(kind) => (0, Some(kind)),
        };
        self.record(TraceEntry {
            time_ns: self.now_ns,
            vcpu,
            offset,
            size,
            kind: AccessKind::Read,
            value,
            bad,
            violation,
        });
        value
    }

    /// A guest write of `value` (`size` bytes) at `offset` from `vcpu` at
    /// `now_ns`. Bad accesses are ignored and counted.
    pub fn write(&mut self, now_ns: u64, vcpu: u32, offset: u64, size: u32, value: u64) {
        self.advance(now_ns);
        let result = self.do_write(offset, size, value);
        self.record(TraceEntry {
            time_ns: self.now_ns,
            vcpu,
            offset,
            size,
            kind: AccessKind::Write,
            value,
            bad: result.err(),
            violation: false,
        });
    }

    fn do_write(&mut self, offset: u64, size: u32, value: u64) -> Result<(), BadAccessKind> {
        let (off, part) = Self::decode(offset, size)?;
        let reg = self.lookup(off).ok_or(BadAccessKind::UnknownOffset)?;
        if let Reg::Global(g) = reg {
            // Reserved global offsets are unknown, defined ones read-only.
            self.global_value(g).ok_or(BadAccessKind::UnknownOffset)?;
        }
        let (d, slot) = match reg {
            Reg::Owner(d) => (d, None),
            Reg::SlotCtl(d, s) => (d, Some(s)),
            _ => return Err(BadAccessKind::ReadOnly),
        };
        let value = match part {
            Part::Full => value,
            Part::Low => value & 0xffff_ffff,
            Part::High => return Err(BadAccessKind::HighHalfWrite),
        };
        let rmids = self.config.rmids;
        let dom = self
            .domains
            .get_mut(d)
            .ok_or(BadAccessKind::UnknownOffset)?;
        match slot {
            None => {
                if value != regs::NO_OWNER && value >= regs::MAX_CPUS {
                    return Err(BadAccessKind::BadValue);
                }
                dom.owner = value;
            }
            Some(s) => {
                let slot = dom.slots.get_mut(s).ok_or(BadAccessKind::UnknownOffset)?;
                if value == 0 {
                    *slot = Slot::default();
                    return Ok(());
                }
                if value & regs::SLOT_CTL_ASSIGNED == 0 || value & regs::SLOT_CTL_RESERVED != 0 {
                    return Err(BadAccessKind::BadValue);
                }
                let event = Event::from_u64(regs::slot_ctl_event(value))
                    .filter(|e| e.is_cumulative())
                    .ok_or(BadAccessKind::BadValue)?;
                let rmid = regs::slot_ctl_rmid(value);
                if rmid >= u64::from(rmids) {
                    return Err(BadAccessKind::BadValue);
                }
                *slot = Slot {
                    ctl: value,
                    assigned: Some(Assignment {
                        event,
                        rmid: rmid as u32,
                    }),
                    counted: 0,
                };
            }
        }
        Ok(())
    }

    fn check(&self, domain: u32, rmid: u32) -> Result<usize, DeviceError> {
        let d = domain as usize;
        if d >= self.domains.len() {
            return Err(DeviceError::NoSuchDomain {
                domain,
                domains: self.domains.len(),
            });
        }
        if rmid >= self.config.rmids {
            return Err(DeviceError::NoSuchRmid {
                rmid,
                rmids: self.config.rmids,
            });
        }
        Ok(d)
    }

    fn check_cumulative(&self, domain: u32, rmid: u32, event: Event) -> Result<usize, DeviceError> {
        let d = self.check(domain, rmid)?;
        if !event.is_cumulative() {
            return Err(DeviceError::NotCumulative(event));
        }
        Ok(d)
    }

    /// Queues `bytes` of `event` for (`domain`, `rmid`); they land over time
    /// at the domain's max rate minus its steady rates, after the traffic
    /// already queued in that domain.
    pub fn inject(
        &mut self,
        now_ns: u64,
        domain: u32,
        rmid: u32,
        event: Event,
        bytes: u64,
    ) -> Result<(), DeviceError> {
        let d = self.check_cumulative(domain, rmid, event)?;
        self.advance(now_ns);
        if bytes == 0 {
            return Ok(());
        }
        let Some(dom) = self.domains.get_mut(d) else {
            return Ok(());
        };
        if let Some(back) = dom.queue.back_mut() {
            if back.rmid == rmid && back.event == event {
                if let Some(sum) = back.bytes.checked_add(bytes) {
                    back.bytes = sum;
                    return Ok(());
                }
            }
        }
        dom.queue.push_back(Pending { rmid, event, bytes });
        Ok(())
    }

    /// Sets the steady rate of (`domain`, `rmid`, `event`), 0 to clear it.
    /// Refused if the domain's total steady rate would exceed its max rate.
    pub fn set_rate(
        &mut self,
        now_ns: u64,
        domain: u32,
        rmid: u32,
        event: Event,
        bytes_per_sec: u64,
    ) -> Result<(), DeviceError> {
        let d = self.check_cumulative(domain, rmid, event)?;
        let max = self.config.max_rate;
        let Some(dom) = self.domains.get(d) else {
            return Ok(());
        };
        let others: u128 = dom
            .rates
            .iter()
            .filter(|(&k, _)| k != (rmid, event))
            .map(|(_, r)| u128::from(r.bytes_per_sec))
            .sum();
        let total = others + u128::from(bytes_per_sec);
        if total > u128::from(max) {
            return Err(DeviceError::RateTooHigh { domain, total, max });
        }
        self.advance(now_ns);
        if let Some(dom) = self.domains.get_mut(d) {
            if bytes_per_sec == 0 {
                dom.rates.remove(&(rmid, event));
            } else {
                dom.rates.entry((rmid, event)).or_default().bytes_per_sec = bytes_per_sec;
            }
        }
        Ok(())
    }

    /// Sets the LLC occupancy of (`domain`, `rmid`) in bytes.
    pub fn set_occupancy(&mut self, domain: u32, rmid: u32, bytes: u64) -> Result<(), DeviceError> {
        let d = self.check(domain, rmid)?;
        if let Some(o) = self
            .domains
            .get_mut(d)
            .and_then(|x| x.occupancy.get_mut(rmid as usize))
        {
            *o = bytes;
        }
        Ok(())
    }

    /// Injected bytes not landed yet at `now_ns` (0 = all landed).
    pub fn pending_bytes(&mut self, now_ns: u64) -> u64 {
        self.advance(now_ns);
        self.domains
            .iter()
            .fold(0u64, |acc, d| acc.saturating_add(d.pending()))
    }

    /// Clears violations, read counts, bad-access counts and the trace (not
    /// the truth, not the counters).
    pub fn reset_stats(&mut self) {
        for d in &mut self.domains {
            d.violations = 0;
            d.violations_by_vcpu.clear();
            d.reads_by_vcpu.clear();
        }
        self.bad = BadAccessCounts::default();
        self.trace.clear();
    }

    /// The recorded register accesses, oldest first (at most
    /// [`TRACE_CAPACITY`]).
    pub fn trace(&self) -> Vec<TraceEntry> {
        self.trace.iter().cloned().collect()
    }

    /// A snapshot of the device at `now_ns`.
    pub fn state(&mut self, now_ns: u64) -> DeviceState {
        self.advance(now_ns);
        let domains = self
            .domains
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let slots = d
                    .slots
                    .iter()
                    .enumerate()
                    .map(|(s, slot)| SlotState {
                        slot: s as u32,
                        ctl: slot.ctl,
                        event: slot.assigned.map(|a| a.event),
                        rmid: slot.assigned.map(|a| a.rmid),
                        counted_bytes: slot.counted,
                        register: self.slot_register(slot),
                    })
                    .collect();
                let truth = d
                    .truth
                    .iter()
                    .enumerate()
                    .flat_map(|(rmid, t)| {
                        CUMULATIVE
                            .iter()
                            .zip(t.iter())
                            .filter(|(_, &b)| b != 0)
                            .map(move |(&event, &bytes)| TruthEntry {
                                rmid: rmid as u32,
                                event,
                                bytes,
                            })
                    })
                    .collect();
                let occupancy = d
                    .occupancy
                    .iter()
                    .enumerate()
                    .filter(|(_, &b)| b != 0)
                    .map(|(rmid, &bytes)| OccupancyEntry {
                        rmid: rmid as u32,
                        bytes,
                    })
                    .collect();
                let steady_rates = d
                    .rates
                    .iter()
                    .map(|(&(rmid, event), r)| RateEntry {
                        rmid,
                        event,
                        bytes_per_sec: r.bytes_per_sec,
                    })
                    .collect();
                let allowed_cpus = d.allowed.cpus();
                DomainState {
                    domain: i as u32,
                    allowed_cpu_list: format_cpu_list(&allowed_cpus),
                    allowed_cpus,
                    allowed_mask: d.allowed.0,
                    owner: u32::try_from(d.owner)
                        .ok()
                        .filter(|&o| u64::from(o) < regs::MAX_CPUS),
                    slots,
                    truth,
                    occupancy,
                    pending_bytes: d.pending(),
                    steady_rates,
                    violations: d.violations,
                    violations_by_vcpu: d.violations_by_vcpu.clone(),
                    counter_reads_by_vcpu: d.reads_by_vcpu.clone(),
                }
            })
            .collect::<Vec<_>>();
        DeviceState {
            now_ns: self.now_ns,
            magic: regs::MAGIC_VALUE,
            version: regs::VERSION_VALUE,
            size: self.size,
            config: self.config.clone(),
            pending_bytes: domains
                .iter()
                .fold(0u64, |acc, d| acc.saturating_add(d.pending_bytes)),
            domains,
            bad_accesses: self.bad.clone(),
            trace_len: self.trace.len(),
        }
    }
}

#[cfg(test)]
mod tests;
