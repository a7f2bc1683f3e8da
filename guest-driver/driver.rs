// SPDX-License-Identifier: GPL-2.0

//! perfbed: device-scope perf PMUs for the perfbed monitoring device.
//!
//! The device (see `device/README.md`; its register map is `regs.rs`, copied from
//! `device/src/regs.rs` by the build) counts memory bandwidth and LLC occupancy per RMID in a few
//! domains. This module registers one counting-only perf PMU per domain, `perfbed_l3_<d>`, with
//! `PERF_PMU_SCOPE_DEVICE`: the perf core counts each PMU's events on one CPU of the domain's
//! allowed set and moves them when that CPU goes away.
//!
//! - `llc_occupancy` (event 1) is a gauge read from `OCCUPANCY[rmid]`; it needs no slot, so
//!   (alone or in a group of gauges) it is never multiplexed and its value never scaled.
//! - `mbm_total_bytes` and `mbm_local_bytes` (events 2, 3) need one of the domain's counter slots
//!   while scheduled in; when none is free `add` fails and perf multiplexes. Slot counters are
//!   `width` bits wide and wrap: each slot keeps a 64-bit total that a poll, on the owner CPU,
//!   brings up to date often enough that a counter never wraps twice between two reads.
//!
//! Counts are in bytes (counter units times the device's unit); sysfs gives perf the scale to
//! MB.
//!
//! At registration each domain's allowed set is compared with the kernel's cacheinfo (the L3
//! its CPUs share, `topology.rs`) and the log says whether they agree; the PMU is placed by the
//! device's set either way.
//!
//! **Counting semantics** (DESIGN.md, "Counting semantics"; the model xtask's checks and stress
//! compare against). An event counts exactly the traffic that landed in its slot while it was
//! enabled and scheduled, whatever happened meanwhile; `time_running` is the time it was
//! scheduled and counted:
//!
//! - A `del` on the owner CPU reads the event's slot one last time. If the next `add` comes in
//!   the same reschedule (an install or a rotation that takes it back at once: perf's context
//!   time has not moved, so perf credits the time between as running), the event takes its slot
//!   back as it is and counts what landed between. Otherwise (a disable, a rotation out for a
//!   mux interval, an exclusive group's turn) the slot is assigned afresh (the device zeroes it)
//!   at the `add`: nothing that landed while the event was off is counted for it.
//! - The counters live in the device; only the CPU that reads them moves. The perf core tells
//!   the driver the new owner (`migrate_cpu`) before it moves the events, and marks a moving
//!   event ([`Event::in_transit`]). A moving event keeps its slot counting: it is still enabled
//!   and scheduled, the core credits the transit as running, and its `add` on the new CPU takes
//!   the slot back, the first read there catching up. The same holds for a park (no owner):
//!   the events wait, scheduled, on another CPU with their slots counting, and catch up when an
//!   allowed CPU returns.
//! - A move may install an event without scheduling it (it waits for its turn there, or its
//!   leader does). The core says so once the move's installs are done
//!   ([`Pmu::moved_unscheduled`], patch 0008): its slot is read and folded as at a `del` on
//!   the owner (or, when the move was a park, kept as at a `del` there), so it counts nothing
//!   while the event is off and others may take it.
//! - A slot whose holder is moving or parked has counts nobody has read: no other event takes
//!   it while nobody can read it. On the owner, an event short of a slot may take one from an
//!   event still moving (between the new owner's `migrate_cpu` and the end of the move); the
//!   slot is read first and what it counted is kept for that event, which gets it at its next
//!   `add`, read or fold. Exact both ways.
//! - While parked, an event that holds no slot and finds none free is scheduled without one
//!   (nobody could count it anyway, and failing it would stop the holders behind it from
//!   scheduling): it counts nothing, and perf is told so ([`ScheduledEvent::set_counting`]),
//!   so its `time_running` stands still until its `del` and perf scales its count as for
//!   multiplexing. A slot freed meanwhile (a close) is not handed to it before its next `add`:
//!   perf does not reschedule a parked PMU's events when the contention ends (only when a
//!   leader's close promotes its siblings, patch 0010: a reschedule like any other).
//! - A `del` off the owner that is not part of a move runs where nobody can read the slot: while
//!   parked, on the CPU that keeps the events; while placed, on the CPU the domain is leaving,
//!   between the new owner's `migrate_cpu` and the move. It cannot tell a reschedule (whose `add`
//!   follows in the same operation, and whose gap perf credits as running) from the event going
//!   off (a `DISABLE`). So the slot counts on through the operation, and at its end
//!   ([`Pmu::pmu_enable`], on that CPU, still inside the operation) the driver freezes it in the
//!   device (`SLOT_CTL_FROZEN`, a write any CPU may make) unless the event is back: the counter
//!   keeps exactly what the event counted up to the end of the operation that took it off, and
//!   nothing after. The event's next `add` thaws it and counts on from there (an `ENABLE` after
//!   a `DISABLE`); a move that places the PMU reads it exactly on the owner. Nothing is taken off
//!   `time_running`. A parked PMU is never rotated (patch 0010), so only a `DISABLE` takes an
//!   event off there: an exclusive group's turn no longer does.
//! - A `RESET` (the perf core's `pmu::reset`) restarts the event's slot where nobody can read
//!   it (parked, or frozen for an event that went off while parked): the slot is assigned again
//!   (frozen still, if it was), which zeroes it in the device, so that what landed before the reset, unread, is never
//!   counted after it, and what lands after it is, exactly. On the owner the core's read folds
//!   the count first and the baseline moves to it.
//! - A park must not outlast a counter's wrap: nobody reads a parked domain's slots. While
//!   parked, the device's threshold interrupt stays on at half a wrap since a slot's last read
//!   (`irq.rs`), and when it comes the driver asks the perf core to stop the park's events
//!   ([`Registration::stop_parked`]); a domain without a line gives the core a time limit instead
//!   ([`Device::unread_limit_ns`]). The core stops each event that holds a slot ([`Pmu::stop`]:
//!   the slot is frozen in the device, and keeps exactly what it counted) and its `time_running`
//!   with it, and adds one put on later in the park without `START` (its slot frozen from the
//!   start). The placement adds them with `START`, which thaws the slots, and reads them on the
//!   owner: the count is exact up to the stop, and the rest of the park shows as time not running
//!   (patch 0018). Should a counter still wrap more than once unread (the stop, or a placed domain's
//!   poll, came too late: `COUNTER_OVERFLOW`), the interval since the slot's last good read is
//!   not counted: neither its traffic (unknowable) nor its time (taken off `time_running` at the
//!   next `add` or `del`), so `perf stat` shows less than 100 % and scales, never an
//!   exact-looking wrong count. Each such loss is counted in the PMU's sysfs file `lost_wraps`
//!   and said once in the kernel log. A slot left counting for nobody (its holder disabled on
//!   the owner) loses nothing when it wraps.
//! - Cgroup and task events are refused (the PMU has no task context, so the perf core refuses
//!   both with `EINVAL`), and so is every attribute a counting device PMU cannot honour:
//!   sampling, `sigtrap` and `precise_ip` (`EOPNOTSUPP`, as for perf's PMUs without the
//!   feature), `exclude_*`, a branch stack (`PERF_SAMPLE_BRANCH_STACK`, whatever its
//!   `branch_sample_type`), `config1`-`config3` and unknown `config` bits (`EINVAL`).
//!   docs/attributes.md goes through every bit of `sample_type` and `branch_sample_type`.
//!
//! The domain's state is behind a raw spinlock (the PMU callbacks run under the perf context's
//! raw lock), always taken with interrupts off; `read` may run in NMI context and then only tries
//! the lock, leaving the catching up to the next read or poll.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kernel::c_str;
use kernel::perf::{
    self, Capabilities, CpuMask, Event, EventAttr, Flags, FormatAttr, Group, HwState, LockedEvent,
    Options, Pmu, Registration, ScheduledEvent, Scope, TaskContext,
};
use kernel::prelude::*;
use kernel::str::CString;
use kernel::sync::{new_raw_spinlock, Arc, RawSpinLock};

mod allowed;
mod hw;
mod irq;
#[cfg(CONFIG_OF)]
mod of;
mod topology;
// The device's register map, shared with the device model: not all of it is used here.
#[allow(unreachable_pub)]
mod regs;

use hw::warn_ratelimited;
use regs::Event as EventId;

module! {
    type: Perfbed,
    name: "perfbed",
    author: "perfbed developers",
    description: "Device-scope perf PMUs for the perfbed monitoring device",
    license: "GPL",
}

// ---------------------------------------------------------------------------
// The perf interface: config layout and sysfs files
// ---------------------------------------------------------------------------

/// `attr.config` bits 0-7: the event id (`format/event`).
const CONFIG_EVENT_MASK: u64 = 0xff;
/// `attr.config` bits 8-23: the RMID (`format/rmid`).
const CONFIG_RMID_SHIFT: u64 = 8;
const CONFIG_RMID_MASK: u64 = 0xffff;
/// The `attr.config` bits that mean something; any other set bit is refused.
const CONFIG_KNOWN: u64 = CONFIG_EVENT_MASK | (CONFIG_RMID_MASK << CONFIG_RMID_SHIFT);

static FORMATS: [FormatAttr<'static>; 2] = [
    FormatAttr::new(c_str!("event"), c_str!("config:0-7")),
    FormatAttr::new(c_str!("rmid"), c_str!("config:8-23")),
];

/// Counts are bytes; perf shows them in MB (2^20 bytes, as resctrl and the old intel_cqm did).
const EVENT_UNIT: &CStr = c_str!("MB");
const EVENT_SCALE: &CStr = c_str!("9.5367431640625e-07");

/// The `events/` files, for the events the device supports (its `REG_EVENTS`).
const EVENT_FILES: [(EventId, &CStr, &CStr); 3] = [
    (EventId::LlcOccupancy, c_str!("llc_occupancy"), c_str!("event=0x01")),
    (EventId::MbmTotalBytes, c_str!("mbm_total_bytes"), c_str!("event=0x02")),
    (EventId::MbmLocalBytes, c_str!("mbm_local_bytes"), c_str!("event=0x03")),
];

/// The PMU's counter files (`DomainPmu::counter`): wraps lost, interrupts taken on the owner and
/// elsewhere (`irq.rs`), and `read`s that found the domain's lock held (all of them, and those in
/// NMI context that therefore left the count as it was).
const COUNTER_FILES: [&CStr; 5] = [
    c_str!("lost_wraps"),
    c_str!("irqs_on_owner"),
    c_str!("irqs_off_owner"),
    c_str!("reads_contended"),
    c_str!("reads_skipped_nmi"),
];

/// How often wrap polling runs at most, and its period when the device gives no maximum rate.
const MAX_POLL_MS: u32 = 1000;
const DEFAULT_POLL_MS: u32 = 100;
/// Polls per wrap time at the maximum rate: a poll that runs late still comes long before a
/// counter could wrap twice.
const POLLS_PER_WRAP: u64 = 5;

/// The event an `attr.config` selects.
#[derive(Clone, Copy)]
struct Config {
    id: EventId,
    rmid: u64,
}

impl Config {
    /// Decodes `config` without checking it against the device; for configs that passed
    /// [`Device::check_config`].
    fn decode(config: u64) -> Option<Config> {
        Some(Config {
            id: EventId::from_u64(config & CONFIG_EVENT_MASK)?,
            rmid: (config >> CONFIG_RMID_SHIFT) & CONFIG_RMID_MASK,
        })
    }

    /// Whether the event needs a counter slot.
    fn needs_slot(self) -> bool {
        self.id.is_cumulative()
    }

    /// The `SLOT_CTL` value that counts this event.
    fn slot_ctl(self) -> u64 {
        regs::slot_ctl_value(self.id, self.rmid)
    }
}

// ---------------------------------------------------------------------------
// The device
// ---------------------------------------------------------------------------

/// The mapped device and its self-description.
struct Device {
    mmio: hw::Mmio,
    base: u64,
    domains: u32,
    rmids: u64,
    slots: usize,
    width: u64,
    /// Mask of the counter field, `2^width - 1`.
    mask: u64,
    /// Bytes per counter unit.
    unit: u64,
    /// Maximum bandwidth of a domain, bytes/s (0: not given).
    max_rate: u64,
    /// Bitmask of the supported event ids.
    events: u64,
    /// Wrap polling period.
    poll_ms: u32,
    /// For a domain without a line, how long into a park the counters can go unread (the perf
    /// core then stops the events): a quarter of a wrap's time at the maximum rate, 0 when the
    /// device gives none. The last read before a park can be up to half a wrap's traffic old (a
    /// read on the owner as the park begins, a poll five times a wrap): a quarter leaves a
    /// quarter of a wrap's time for the stop to come late. A domain with a line is stopped by
    /// its parked threshold interrupt instead (`irq.rs`).
    unread_limit_ns: u64,
    /// Set once every PMU is registered: until then `event_init` refuses events, so that a
    /// failing `init` drops only registrations that cannot have any (see `Perfbed::init`).
    ready: AtomicBool,
}

impl Device {
    /// Reads and checks the self-description of the device mapped by `mmio` at `base`.
    fn probe(mmio: hw::Mmio, base: u64, size: u64) -> Result<Device> {
        let magic = mmio.read(regs::REG_MAGIC);
        if magic != regs::MAGIC_VALUE {
            pr_err!(
                "no perfbed device at {:#x}: magic {:#x}, expected {:#x}\n",
                base,
                magic,
                regs::MAGIC_VALUE
            );
            return Err(ENODEV);
        }
        let version = mmio.read(regs::REG_VERSION);
        if version != regs::VERSION_VALUE {
            pr_err!(
                "device at {:#x} has version {}, this driver knows version {}\n",
                base,
                version,
                regs::VERSION_VALUE
            );
            return Err(ENODEV);
        }

        let domains = mmio.read(regs::REG_NUM_DOMAINS);
        let rmids = mmio.read(regs::REG_NUM_RMIDS);
        let slots = mmio.read(regs::REG_NUM_SLOTS);
        let width = mmio.read(regs::REG_COUNTER_WIDTH);
        let unit = mmio.read(regs::REG_COUNTER_UNIT);
        let max_rate = mmio.read(regs::REG_MAX_RATE);
        let events = mmio.read(regs::REG_EVENTS) & regs::EVENTS_MASK;
        let shape_ok = (1..=regs::MAX_DOMAINS).contains(&domains)
            && (1..=regs::MAX_RMIDS).contains(&rmids)
            && (1..=regs::MAX_SLOTS).contains(&slots)
            && (regs::MIN_COUNTER_WIDTH..=regs::MAX_COUNTER_WIDTH).contains(&width)
            && unit.is_power_of_two();
        if !shape_ok {
            pr_err!(
                "device at {:#x}: unsupported self-description: {} domains, {} RMIDs, {} slots, \
                 {}-bit counters, unit {}\n",
                base,
                domains,
                rmids,
                slots,
                width,
                unit
            );
            return Err(ENODEV);
        }

        // The driver finds registers with the `regs` offset functions: the device must agree.
        let layout = [
            (regs::REG_DOMAIN_BASE, regs::DOMAIN_BASE),
            (regs::REG_DOMAIN_STRIDE, regs::DOMAIN_STRIDE),
            (regs::REG_SLOT_BASE, regs::DOM_SLOTS),
            (regs::REG_SLOT_STRIDE, regs::SLOT_STRIDE),
            (regs::REG_OCCUPANCY_BASE, regs::DOM_OCCUPANCY),
        ];
        for (reg, expected) in layout {
            let value = mmio.read(reg);
            if value != expected {
                pr_err!(
                    "device at {:#x}: register {:#x} is {:#x}, expected {:#x}\n",
                    base,
                    reg,
                    value,
                    expected
                );
                return Err(ENODEV);
            }
        }
        let needed = regs::device_size(domains, rmids, slots);
        if needed > size {
            pr_err!(
                "device at {:#x} needs {:#x} bytes of registers, the parameter gives {:#x}\n",
                base,
                needed,
                size
            );
            return Err(ENODEV);
        }
        if events == 0 {
            pr_err!("device at {:#x} supports no known event\n", base);
            return Err(ENODEV);
        }

        let poll_ms = poll_period_ms(width, unit, max_rate);
        let unread_limit_ns = wrap_ns(width, unit, max_rate).map_or(0, |ns| ns / 4);

        Ok(Device {
            mmio,
            base,
            // CAST: checked above to be at most `MAX_DOMAINS`/`MAX_SLOTS`.
            domains: domains as u32,
            rmids,
            slots: slots as usize,
            width,
            mask: regs::counter_mask(width),
            unit,
            max_rate,
            events,
            poll_ms,
            unread_limit_ns,
            ready: AtomicBool::new(false),
        })
    }

    /// Checks `attr.config*` of `event`; returns what it selects.
    fn check_config(&self, event: &Event) -> Result<Config> {
        if !self.ready.load(Ordering::Acquire) {
            return Err(ENODEV);
        }
        let config = event.config();
        if config & !CONFIG_KNOWN != 0
            || event.config1() != 0
            || event.config2() != 0
            || event.config3() != 0
        {
            return Err(EINVAL);
        }
        let config = Config::decode(config).ok_or(EINVAL)?;
        if self.events & (1 << config.id as u64) == 0 || config.rmid >= self.rmids {
            return Err(EINVAL);
        }
        Ok(config)
    }
}

/// The wrap polling period for counters of `width` bits of `unit` bytes that count at most
/// `max_rate` bytes/s (0: unknown).
fn poll_period_ms(width: u64, unit: u64, max_rate: u64) -> u32 {
    if max_rate == 0 {
        return DEFAULT_POLL_MS;
    }
    // A counter wraps after 2^width units; at the maximum rate that takes `wrap_ms`.
    let wrap_ms = wrap_ns(width, unit, max_rate).map_or(u64::MAX, |ns| ns / 1_000_000);
    if wrap_ms < 50 {
        pr_warn!(
            "counters can wrap every {} ms: wrap polling may not keep counts exact\n",
            wrap_ms
        );
    }
    // CAST: clamped to at most `MAX_POLL_MS`.
    (wrap_ms / POLLS_PER_WRAP).clamp(1, u64::from(MAX_POLL_MS)) as u32
}

/// How long a counter of `width` bits of `unit` bytes takes to wrap at `max_rate` bytes/s, in ns;
/// `None` when the device gives no maximum rate.
fn wrap_ns(width: u64, unit: u64, max_rate: u64) -> Option<u64> {
    const NS_PER_S: u64 = 1_000_000_000;
    if max_rate == 0 {
        return None;
    }
    // In 64 bits (the kernel has no 128-bit division); a remainder too big to scale is left out,
    // which only shortens the time.
    let bytes = 1u64
        .checked_shl(width as u32)
        .and_then(|units| units.checked_mul(unit))
        .unwrap_or(u64::MAX);
    let whole = (bytes / max_rate).saturating_mul(NS_PER_S);
    let part = (bytes % max_rate)
        .checked_mul(NS_PER_S)
        .map_or(0, |scaled| scaled / max_rate);
    Some(whole.saturating_add(part))
}

/// Where the device is: the `device` parameter, or with a device tree and no parameter, the
/// device's node there (`of.rs`: arm64).
fn device_location() -> Result<(u64, u64, irq::Gsis)> {
    let param = hw::device_param();
    #[cfg(CONFIG_OF)]
    if param.as_bytes().trim_ascii().is_empty() {
        return of::find();
    }
    parse_device_param(param)
}

/// Parses the `device=<size>@<base>[:<gsi>,...]` parameter (size and base in hex, `0x`
/// optional; the GSIs in decimal, see [`irq::Gsis`]).
fn parse_device_param(param: &CStr) -> Result<(u64, u64, irq::Gsis)> {
    let text = param.as_bytes().trim_ascii();
    let (text, gsis) = match text.iter().position(|&c| c == b':') {
        Some(colon) => (&text[..colon], irq::Gsis::parse(&text[colon + 1..])),
        None => (text, Some(irq::Gsis::NONE)),
    };
    if text.is_empty() {
        pr_err!("missing parameter device=<size>@<base> (e.g. device=0x3000@0xfe000000)\n");
        return Err(EINVAL);
    }
    let parsed = text
        .iter()
        .position(|&c| c == b'@')
        .and_then(|at| Some((parse_hex(&text[..at])?, parse_hex(&text[at + 1..])?)));
    match (parsed, gsis) {
        (Some((size, base)), Some(gsis))
            if size >= regs::DOMAIN_BASE
                && size % 0x1000 == 0
                && base % 0x1000 == 0
                && base.checked_add(size).is_some() =>
        {
            Ok((size, base, gsis))
        }
        _ => {
            pr_err!(
                "malformed parameter device={}: expected <size>@<base>[:<gsi>,...], size and base \
                 in hex, page-aligned, e.g. 0x3000@0xfe000000:13,14\n",
                param
            );
            Err(EINVAL)
        }
    }
}

/// Parses a hex number with an optional `0x` prefix.
fn parse_hex(text: &[u8]) -> Option<u64> {
    let digits = text
        .strip_prefix(b"0x")
        .or_else(|| text.strip_prefix(b"0X"))
        .unwrap_or(text);
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |value, &c| {
        let digit = (c as char).to_digit(16)?;
        value.checked_mul(16)?.checked_add(u64::from(digit))
    })
}

// ---------------------------------------------------------------------------
// A domain: its counter slots and owner
// ---------------------------------------------------------------------------

/// What a slot's holder is doing.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Holder {
    /// No event holds the slot (`ctl` is 0).
    Free,
    /// The holder is scheduled (between its `add` and its `del`), on the owner or, while the
    /// domain is parked, on the CPU that keeps its events.
    Scheduled,
    /// The holder was deleted on the owner, its count folded then, at context time `idle_time`.
    /// The slot goes on counting: if the holder's next `add` sees the same context time, the
    /// `del` and `add` were one reschedule, whose time perf credits as running, and it takes the
    /// slot back as it is; otherwise (disabled, rotated out for a while) the slot is assigned
    /// afresh. Another event may take it: nothing in it is unread.
    Idle,
    /// The holder went off outside a move where nobody could read the slot (see
    /// [`Holder::LeftOff`]), so the driver froze it (`SLOT_CTL_FROZEN`, a write any CPU may
    /// make). Its counter holds exactly what the holder counted up to the operation that took it
    /// off, unread. The holder's next `add` thaws it and counts on from there (the event was off
    /// for a while: disabled; a parked PMU is not rotated, patch 0010): what landed while it was
    /// off never reached the slot.
    ParkedIdle,
    /// The holder is moving to another CPU: its `del` ran off the owner as part of a move and its
    /// `add` on the next CPU has not come yet. The slot counts on for it, unread.
    Moving,
    /// The holder was deleted off the owner outside a move, on CPU `left_on`: while parked, on
    /// the CPU that keeps the events, or, while placed, on the CPU the domain is leaving, between
    /// the new owner's `migrate_cpu` and the move (a `DISABLE`, a rotation, a reschedule there).
    /// Nobody can read the slot, and nothing tells a reschedule (whose `add` follows in the same
    /// operation, at the same context time: perf credits the gap as running, so the slot must
    /// count it) from the event going off (nothing after the `del` is its). So the slot counts
    /// on, and at the end of the operation ([`Pmu::pmu_enable`] on that CPU) the driver freezes
    /// it ([`Holder::ParkedIdle`]) unless the holder is back.
    LeftOff,
}

/// A counter slot as the driver sees it.
#[derive(Clone, Copy)]
struct Slot {
    /// The `SLOT_CTL` value that assigned it (without `SLOT_CTL_FROZEN`), 0 when free.
    ctl: u64,
    /// [`Event::key`] of the event that holds the slot (0 when free).
    holder: usize,
    state: Holder,
    /// The counter field at the last read.
    last: u64,
    /// Counter units since the slot was assigned, as a 64-bit count that does not wrap.
    total: u64,
    /// `total` at the holder's last fold: what of it the holder's count has. (The job of perf's
    /// `hw.prev_count`, kept here, under the lock the read path holds anyway, rather than in the
    /// event, where each access is a call into the kernel crate: a slot and its holder's baseline
    /// live and die together.)
    folded: u64,
    /// `folded` when the holder started moving: what of `total` it has counted.
    moved_at: u64,
    /// [`LockedEvent::ctx_time`] at the holder's `del`, for [`Holder::Idle`] and
    /// [`Holder::ParkedIdle`].
    idle_time: u64,
    /// The CPU of the holder's `del`, for [`Holder::LeftOff`].
    left_on: u32,
    /// [`perf::clock_ns`] at the last good read (or the assignment): counts since then are
    /// unread.
    read_ns: u64,
    /// Time the holder was credited as running but whose counts were lost, not yet taken off its
    /// `time_running`.
    lost_ns: u64,
    /// Whether the counter is frozen in the device (`SLOT_CTL_FROZEN`): its holder is off since
    /// an operation nobody could read the slot in ([`Holder::ParkedIdle`]), or stopped
    /// ([`Pmu::stop`], a park that outlasted [`Device::unread_limit_ns`]).
    frozen: bool,
}

impl Slot {
    const FREE: Slot = Slot {
        ctl: 0,
        holder: 0,
        state: Holder::Free,
        last: 0,
        total: 0,
        folded: 0,
        moved_at: 0,
        idle_time: 0,
        left_on: 0,
        read_ns: 0,
        lost_ns: 0,
        frozen: false,
    };
}

/// What a slot counted for an event that lost the slot while it was moving: the event gets it at
/// its next `add`, fold or `del`.
#[derive(Clone, Copy)]
struct Owed {
    /// [`Event::key`] of the event, 0 for an unused entry.
    key: usize,
    units: u64,
    lost_ns: u64,
}

impl Owed {
    const UNUSED: Owed = Owed { key: 0, units: 0, lost_ns: 0 };
}

/// How many events can be owed counts at once; when all are in use, a moving event's slot is not
/// taken (the event short of a slot waits for a rotation).
const MAX_OWED: usize = 2 * regs::MAX_SLOTS as usize;

/// The counts owed to events, with how many entries are in use. Every fold on the owner looks its
/// event up here, and almost always nothing is owed (only a slot taken from a moving event puts an
/// entry here): with the count, that look-up is one comparison instead of a scan of `MAX_OWED`
/// entries under the domain's lock on every `read()`.
struct OwedTable {
    entries: [Owed; MAX_OWED],
    /// Entries whose key is not 0.
    used: usize,
}

impl OwedTable {
    const EMPTY: OwedTable = OwedTable { entries: [Owed::UNUSED; MAX_OWED], used: 0 };

    /// An unused entry, for [`OwedTable::insert`].
    fn free_entry(&self) -> Option<usize> {
        self.entries.iter().position(|o| o.key == 0)
    }

    /// Fills the unused entry `entry` (from [`OwedTable::free_entry`]).
    fn insert(&mut self, entry: usize, owed: Owed) {
        if self.entries[entry].key == 0 && owed.key != 0 {
            self.used += 1;
        }
        self.entries[entry] = owed;
    }

    /// The first entry of `event`; its key is not even asked for when nothing is owed.
    #[inline]
    fn find(&self, event: &Event) -> Option<usize> {
        if self.used == 0 {
            return None;
        }
        let key = event.key();
        self.entries.iter().position(|o| o.key == key)
    }

    /// Makes entry `entry` unused.
    fn remove(&mut self, entry: usize) {
        if self.entries[entry].key != 0 {
            self.used -= 1;
        }
        self.entries[entry] = Owed::UNUSED;
    }

    /// Drops the counts owed to the event with key `key`, keeping its entries (and the time they
    /// lost) for its next `add` or `del`.
    fn drop_units(&mut self, key: usize) {
        if self.used == 0 {
            return;
        }
        for owed in self.entries.iter_mut().filter(|o| o.key == key) {
            owed.units = 0;
        }
    }

    /// Makes every entry of the event with key `key` unused.
    fn forget(&mut self, key: usize) {
        if self.used == 0 {
            return;
        }
        for entry in 0..MAX_OWED {
            if self.entries[entry].key == key {
                self.remove(entry);
            }
        }
    }
}

/// `hw.idx` of an event that holds no slot.
const NO_SLOT: i32 = -1;
/// `hw.idx` of an event scheduled without a slot while its domain is parked, and marked as not
/// counting ([`ScheduledEvent::set_counting`]) until its `del`.
const PARKED_NO_SLOT: i32 = -2;

/// The state of a domain shared by its PMU callbacks and its poll.
struct DomainHw {
    /// The CPU that reads the domain's counters, as written to the device's `OWNER` register;
    /// `None` while the domain is parked.
    owner: Option<u32>,
    slots: [Slot; regs::MAX_SLOTS as usize],
    /// Number of slots held by an event.
    held: u32,
    owed: OwedTable,
}

/// One monitoring domain of the device.
///
/// `hw` is only locked with interrupts off: in the perf callbacks (which the perf core calls
/// that way), in the poll's cross-CPU call, and through [`hw::with_irqs_off`] elsewhere.
#[pin_data(PinnedDrop)]
struct Domain {
    index: u32,
    /// The `ALLOWED_CPUS` mask as last read: at probe, then whenever the device says it changed
    /// (`allowed.rs`). Read by `filter_allowed_cpus` under the perf core's PMU lock.
    allowed: AtomicU64,
    /// The generation of `allowed` (`DOM_ALLOWED_GEN`), which the driver acknowledged to the
    /// device (`DOM_ALLOWED_ACK`). Written under `hw`.
    allowed_gen: AtomicU64,
    /// Places the PMU again after the allowed set changed (`allowed.rs`), and asks the perf
    /// core to stop a park's events when [`Domain::park_stop`] is set.
    replacement: hw::Poller<allowed::Replacement>,
    /// Set by the interrupt handler when a counter gained half a wrap unread while parked
    /// (`irq.rs`), for the work to ask the perf core to stop the park's events.
    park_stop: AtomicBool,
    dev: Arc<Device>,
    #[pin]
    hw: RawSpinLock<DomainHw>,
    /// How many times a slot was found to have wrapped more than once unread (sysfs
    /// `lost_wraps`): each time, at least one wrap of counts was lost.
    lost_wraps: AtomicU64,
    /// `read`s whose `try_lock` found the lock held (sysfs `reads_contended`), and of those the
    /// ones in NMI context, which did not wait and left the count as it was (`reads_skipped_nmi`).
    reads_contended: AtomicU64,
    reads_skipped_nmi: AtomicU64,
    /// The interrupt line's state and statistics (`irq.rs`).
    irq: irq::DomainIrq,
}

impl Domain {
    fn new(dev: &Arc<Device>, index: u32) -> impl PinInit<Self, Error> + '_ {
        // Nothing reads the domain yet: its set is acknowledged before anything does, whatever
        // generation the device is at (a driver loaded again after changes).
        // Should the host change it faster than it can be read, the domain starts parked (an
        // empty set) with a generation no change has, so the first look reads it again.
        let (allowed_gen, allowed) = match allowed::generation(&dev.mmio, index, 1000) {
            Some((gen, set)) => {
                dev.mmio.write(regs::domain_reg(index.into(), regs::DOM_ALLOWED_ACK), gen);
                (gen, set)
            }
            None => (u64::MAX, 0),
        };
        try_pin_init!(Domain {
            index,
            allowed: AtomicU64::new(allowed),
            allowed_gen: AtomicU64::new(allowed_gen),
            replacement: allowed::Replacement::new_work()?,
            park_stop: AtomicBool::new(false),
            dev: dev.clone(),
            hw <- new_raw_spinlock!(
                DomainHw {
                    owner: None,
                    slots: [Slot::FREE; regs::MAX_SLOTS as usize],
                    held: 0,
                    owed: OwedTable::EMPTY,
                },
                "perfbed_domain"
            ),
            lost_wraps: AtomicU64::new(0),
            reads_contended: AtomicU64::new(0),
            reads_skipped_nmi: AtomicU64::new(0),
            irq: irq::DomainIrq::new(),
        }? Error)
    }

    fn is_allowed(&self, cpu: u32) -> bool {
        cpu < 64 && self.allowed() & (1u64 << cpu) != 0
    }

    /// The allowed set the driver places the domain by (`DOM_ALLOWED_CPUS` as last read).
    fn allowed(&self) -> u64 {
        self.allowed.load(Ordering::Relaxed)
    }

    fn reg(&self, reg: u64) -> u64 {
        regs::domain_reg(self.index.into(), reg)
    }

    fn slot_ctl_reg(&self, slot: usize) -> u64 {
        // CAST: slot numbers are below `MAX_SLOTS`.
        regs::slot_ctl(self.index.into(), slot as u64)
    }

    fn slot_count_reg(&self, slot: usize) -> u64 {
        // CAST: slot numbers are below `MAX_SLOTS`.
        regs::slot_count(self.index.into(), slot as u64)
    }

    /// Tells the device that `owner` now reads this domain (`None`: nobody).
    fn set_owner(&self, hw: &mut DomainHw, owner: Option<u32>) {
        if hw.owner != owner {
            let value = owner.map_or(regs::NO_OWNER, u64::from);
            self.dev.mmio.write(self.reg(regs::DOM_OWNER), value);
            hw.owner = owner;
        }
    }

    /// Whether this CPU may read the domain's counters now: it is the owner and, as far as the
    /// driver knows, still allowed (after an allowed-set change that dropped the owner, nobody
    /// reads until the perf core has moved or parked the PMU; see `allowed.rs`).
    #[inline]
    fn reads_here(&self, hw: &DomainHw) -> bool {
        hw.owner.is_some_and(|cpu| cpu == perf::current_cpu() && self.is_allowed(cpu))
    }

    /// Reads a counter register; `None` (and a warning) if the device flags the value as
    /// unusable. The value keeps its `COUNTER_OVERFLOW` bit. Inlined, with [`Domain::sync_slot`],
    /// into the read path: see [`hw::Mmio::read`].
    #[inline]
    fn read_counter(&self, offset: u64) -> Option<u64> {
        let value = self.dev.mmio.read(offset);
        if value & (regs::COUNTER_ERROR | regs::COUNTER_UNAVAILABLE) != 0 {
            self.warn_unusable(offset, value);
            return None;
        }
        Some(value)
    }

    /// The warning of [`Domain::read_counter`] for a counter `value` read at `offset` that the
    /// device flagged as unusable.
    #[cold]
    fn warn_unusable(&self, offset: u64, value: u64) {
        let what = if value & regs::COUNTER_ERROR != 0 {
            "placement error"
        } else {
            "counter unavailable"
        };
        warn_ratelimited!(
            "perfbed_l3_{}: {} reading register {:#x} on CPU {} (value {:#x}), ignored\n",
            self.index,
            what,
            offset,
            perf::current_cpu(),
            value
        );
    }

    /// Folds the hardware counter of `slot` into its 64-bit total. The caller owns the domain.
    #[inline]
    fn sync_slot(&self, hw: &mut DomainHw, slot: usize) -> bool {
        let Some(value) = self.read_counter(self.slot_count_reg(slot)) else {
            return false;
        };
        let now = value & self.dev.mask;
        let clock = perf::clock_ns();
        let s = &mut hw.slots[slot];
        if value & regs::COUNTER_OVERFLOW == 0 {
            // The poll period keeps this below one wrap, and the device flags it when it was not.
            let delta = now.wrapping_sub(s.last) & self.dev.mask;
            s.total = s.total.wrapping_add(delta);
        } else if s.state != Holder::Idle {
            // An `Idle` slot was left counting by a `del` on the owner, for nobody: its holder
            // takes it back as it is only within one reschedule, which no read splits, so what
            // wrapped since was no event's and nothing was lost.
            self.lose_wraps(s, slot, clock);
        }
        s.last = now;
        s.read_ns = clock;
        true
    }

    /// Whole wraps of `slot` went unread (a park longer than a wrap at the device's rate): how
    /// much landed since the last good read is unknowable. None of it is counted, and none of its
    /// time as running (up to `clock`), so that perf scales the count over the gap and shows it.
    #[cold]
    fn lose_wraps(&self, s: &mut Slot, slot: usize, clock: u64) {
        s.lost_ns += clock.saturating_sub(s.read_ns);
        self.lost_wraps.fetch_add(1, Ordering::Relaxed);
        warn_ratelimited!(
            "perfbed_l3_{}: slot {} wrapped more than once unread (parked too long?): {} ms \
             of counts lost, not counted as running\n",
            self.index,
            slot,
            clock.saturating_sub(s.read_ns) / 1_000_000
        );
    }

    /// The slot `event` holds, if any.
    #[inline]
    fn slot_of(&self, hw: &DomainHw, event: &Event) -> Option<usize> {
        usize::try_from(event.hw_idx())
            .ok()
            .filter(|&slot| slot < self.dev.slots && hw.slots[slot].holder == event.key())
    }

    /// Assigns the free `slot` to `event`, counting `config` from zero.
    fn assign(&self, hw: &mut DomainHw, slot: usize, event: &Event, config: Config) {
        if hw.slots[slot].ctl == 0 {
            hw.held += 1;
        }
        let ctl = config.slot_ctl();
        // A write, not a read: any CPU may assign.
        self.dev.mmio.write(self.slot_ctl_reg(slot), ctl);
        hw.slots[slot] = Slot {
            ctl,
            holder: event.key(),
            state: Holder::Scheduled,
            read_ns: perf::clock_ns(),
            ..Slot::FREE
        };
        // CAST: slot numbers are below `MAX_SLOTS`.
        event.set_hw_idx(slot as i32);
    }

    /// Schedules `event` on a slot counting `config`: the one it still holds (back from a move),
    /// else a free one, else, on the owner, one whose holder is moving (read first, its count
    /// kept for it). While the domain is parked an event that finds none is scheduled without a
    /// slot. `EAGAIN` otherwise: perf multiplexes.
    fn take_slot(&self, hw: &mut DomainHw, event: &ScheduledEvent, config: Config) -> Result {
        if let Some(slot) = self.slot_of(hw, event) {
            if hw.slots[slot].state == Holder::ParkedIdle {
                // Frozen since a `del` nobody could read: it counts on from what it holds once
                // started (`add` with `START`).
                hw.slots[slot].state = Holder::Scheduled;
                return Ok(());
            }
            let s = &mut hw.slots[slot];
            if s.state != Holder::Idle || s.idle_time == event.ctx_time() {
                // Its slot counted on while it moved, or through a reschedule perf credits as
                // running (on the owner, or off it within one operation: `LeftOff`); the next
                // read on the owner catches up.
                s.state = Holder::Scheduled;
                return Ok(());
            }
            // Off for a while (disabled, rotated out): count from now.
            self.assign(hw, slot, event, config);
            return Ok(());
        }
        let slots = &hw.slots[..self.dev.slots];
        let free = slots
            .iter()
            .position(|s| s.state == Holder::Free)
            .or_else(|| slots.iter().position(|s| s.state == Holder::Idle));
        if let Some(slot) = free {
            self.assign(hw, slot, event, config);
            return Ok(());
        }
        if self.reads_here(hw) {
            let moving = hw.slots[..self.dev.slots]
                .iter()
                .position(|s| s.state == Holder::Moving);
            let entry = hw.owed.free_entry();
            if let (Some(slot), Some(entry)) = (moving, entry) {
                self.take_from_mover(hw, slot, entry);
                self.assign(hw, slot, event, config);
                return Ok(());
            }
        }
        if hw.owner.is_none() {
            // Parked: nobody can count this event. Failing it would keep every group behind it
            // from scheduling (and so stop time for events whose slots go on counting); keep it
            // scheduled and tell perf it is not counted, so its `time_running` stands still
            // from now to its `del` (taking the time off afterwards could take back time a read
            // already showed).
            event.set_hw_idx(PARKED_NO_SLOT);
            event.set_counting(false);
            return Ok(());
        }
        Err(EAGAIN)
    }

    /// Reads `slot`, whose holder is moving, and keeps what it counted for the holder in owed
    /// entry `entry`, freeing the slot. On the owner only.
    fn take_from_mover(&self, hw: &mut DomainHw, slot: usize, entry: usize) {
        let now = perf::clock_ns();
        if !self.sync_slot(hw, slot) {
            // Unreadable: what landed since the last good read is lost, and so is its time.
            let s = &mut hw.slots[slot];
            s.lost_ns += now.saturating_sub(s.read_ns);
        }
        let s = hw.slots[slot];
        hw.owed.insert(
            entry,
            Owed {
                key: s.holder,
                units: s.total.wrapping_sub(s.moved_at),
                lost_ns: s.lost_ns,
            },
        );
        // End the holder's assignment in the device too: the next holder may count the same
        // event and RMID, and an assignment that differs from a frozen one only in the frozen
        // bit thaws it in place, counts kept (the holder's, counted twice).
        self.dev.mmio.write(self.slot_ctl_reg(slot), 0);
        hw.slots[slot] = Slot::FREE;
        hw.held -= 1;
    }

    /// Gives `event` the counts owed to it, if any: what its slot made while it moved, and was
    /// taken from it (see [`Domain::take_from_mover`]). Time owed stays for
    /// [`Domain::settle_owed`].
    #[inline]
    fn pay_owed(&self, hw: &mut DomainHw, event: &Event) {
        if let Some(entry) = hw.owed.find(event) {
            let owed = &mut hw.owed.entries[entry];
            event.count().add(owed.units.wrapping_mul(self.dev.unit));
            owed.units = 0;
            if owed.lost_ns == 0 {
                hw.owed.remove(entry);
            }
        }
    }

    /// Gives `event` all that is owed to it: the counts, and time to take off its `time_running`,
    /// its own slot's included. The time needs the perf context's lock (a [`LockedEvent`]: `add`,
    /// `del`, `moved_unscheduled`); `read` leaves it owed.
    #[inline]
    fn settle_owed(&self, hw: &mut DomainHw, event: &LockedEvent) {
        if let Some(entry) = hw.owed.find(event) {
            let owed = hw.owed.entries[entry];
            event.count().add(owed.units.wrapping_mul(self.dev.unit));
            if owed.lost_ns != 0 {
                event.discount_running(owed.lost_ns);
            }
            hw.owed.remove(entry);
        }
        if let Some(slot) = self.slot_of(hw, event) {
            let lost = hw.slots[slot].lost_ns;
            if lost != 0 {
                event.discount_running(lost);
                hw.slots[slot].lost_ns = 0;
            }
        }
    }

    /// Takes `event` off its slot at its `del`. In a move, the slot counts on for it, even on
    /// the owner (a placement on the CPU that holds the parked events moves them in place, patch
    /// 0008: perf credits the transit as running, so the slot must count it). Otherwise, on the
    /// owner the count was just folded: the slot is released. Any other `del` runs where nobody
    /// can read the slot, and outside a move: it is [`Holder::LeftOff`] until the end of the
    /// operation ([`Domain::freeze_left_off`]). Frozen at once, it would lose what lands in a
    /// reschedule's gap, which perf credits as running; left counting, it would give an event
    /// that went off what lands after its `del`.
    fn unschedule(&self, hw: &mut DomainHw, event: &LockedEvent) {
        if event.hw_idx() == PARKED_NO_SLOT {
            // Not counted since its `add`; perf's "not counting" ends with this `del`.
            event.set_hw_idx(NO_SLOT);
            return;
        }
        let Some(slot) = self.slot_of(hw, event) else {
            return;
        };
        let in_transit = event.in_transit();
        if self.reads_here(hw) && !in_transit {
            // Folded just now (by `stop`).
            let s = &mut hw.slots[slot];
            s.state = Holder::Idle;
            s.idle_time = event.ctx_time();
        } else if in_transit {
            let s = &mut hw.slots[slot];
            s.state = Holder::Moving;
            s.moved_at = s.folded;
        } else {
            let s = &mut hw.slots[slot];
            s.state = Holder::LeftOff;
            s.left_on = perf::current_cpu();
            s.idle_time = event.ctx_time();
        }
    }

    /// The end of a perf operation on `cpu` ([`Pmu::pmu_enable`]): freezes the slots it left
    /// [`Holder::LeftOff`] whose holder did not come back in it.
    fn freeze_left_off(&self, hw: &mut DomainHw, cpu: u32) {
        for slot in 0..self.dev.slots {
            let s = hw.slots[slot];
            if s.state == Holder::LeftOff && s.left_on == cpu {
                self.set_frozen(hw, slot, true);
                hw.slots[slot].state = Holder::ParkedIdle;
            }
        }
    }

    /// Keeps `slot` for `event`, off since now on a CPU that cannot read it: see
    /// [`Holder::ParkedIdle`].
    fn park_idle(&self, hw: &mut DomainHw, slot: usize, event: &LockedEvent) {
        self.set_frozen(hw, slot, true);
        let s = &mut hw.slots[slot];
        s.state = Holder::ParkedIdle;
        s.idle_time = event.ctx_time();
    }

    /// Freezes or thaws `slot` in place (`SLOT_CTL_FROZEN`): its count and assignment go on. A
    /// write, not a read: any CPU may, parked or not. Only a change is written: the device takes
    /// a write that does not flip the bit alone for a new assignment, which zeroes the counter.
    fn set_frozen(&self, hw: &mut DomainHw, slot: usize, frozen: bool) {
        if hw.slots[slot].frozen == frozen {
            return;
        }
        let ctl = hw.slots[slot].ctl;
        let value = if frozen { ctl | regs::SLOT_CTL_FROZEN } else { ctl };
        self.dev.mmio.write(self.slot_ctl_reg(slot), value);
        hw.slots[slot].frozen = frozen;
    }

    /// Freezes (`stopped`) or thaws the slot `event` holds, if it is not so already: perf's
    /// `stop` and `start` of the event. The frozen counter keeps exactly what it counted, and the
    /// next read on an owner counts it.
    fn set_stopped(&self, hw: &mut DomainHw, event: &Event, stopped: bool) {
        if let Some(slot) = self.slot_of(hw, event) {
            self.set_frozen(hw, slot, stopped);
        }
    }

    /// Lets go of the slot a move left to `event`, which the move installed on its new CPU but did
    /// not schedule (it waits for its turn, or was disabled since): the perf core says so once the
    /// move's installs are done ([`Pmu::moved_unscheduled`]). What the slot counted up to now
    /// landed while the event was scheduled or in transit, which perf credits as running: it is
    /// the event's. What lands from now until its next `add` is not, and others may need the
    /// slot meanwhile.
    ///
    /// - Moving, on the owner: the slot is read and its count folded, as a `del` on the owner
    ///   does, and the slot left [`Holder::Idle`] from now: another event may take it, and the
    ///   event's next `add` (at a later context time) assigns it afresh.
    /// - Moving, while parked (the move was the park): nobody can read the slot, as for a `del`
    ///   there: [`Holder::ParkedIdle`].
    /// - [`Holder::ParkedIdle`] (frozen since a `del` while parked), on the owner: the slot is
    ///   read and its count folded, exact (nothing landed in it after the `del`), then thawed and
    ///   left [`Holder::Idle`] as for a move.
    fn settle_moved(&self, hw: &mut DomainHw, event: &LockedEvent) {
        let Some(slot) = self.slot_of(hw, event) else {
            return;
        };
        let on_owner = self.reads_here(hw);
        match hw.slots[slot].state {
            Holder::Moving | Holder::ParkedIdle | Holder::LeftOff if on_owner => {
                if self.sync_slot(hw, slot) {
                    self.credit(hw, slot, event);
                }
                // A slot that could not be read: its unread time is lost (`lost_ns`), paid below.
                self.set_frozen(hw, slot, false);
            }
            Holder::Moving | Holder::LeftOff => {
                self.park_idle(hw, slot, event);
                return;
            }
            _ => return,
        }
        self.settle_owed(hw, event);
        let s = &mut hw.slots[slot];
        s.state = Holder::Idle;
        s.idle_time = event.ctx_time();
    }

    /// Restarts the count of `event` from zero at a `RESET` (the perf core zeroes the count
    /// itself after this): nothing that landed before may reach it afterwards. On the owner a
    /// scheduled event's slot is read and its baseline moved there. Where nobody can read the
    /// slot (parked), and for a slot frozen for an event that is off since a `del` nobody could
    /// read ([`Holder::ParkedIdle`]), the slot is assigned again, which zeroes it in the device
    /// (a write: any CPU may; a frozen slot stays frozen), so what lands from now on is counted
    /// exactly at the next read on an owner. An event that is off since a `del` on the owner was folded then and starts
    /// afresh at its next `add`. Counts owed to the event are dropped.
    fn restart(&self, hw: &mut DomainHw, event: &Event, config: Config) {
        hw.owed.drop_units(event.key());
        let Some(slot) = self.slot_of(hw, event) else {
            return;
        };
        let state = hw.slots[slot].state;
        if state == Holder::Idle {
            return;
        }
        if state != Holder::ParkedIdle && self.reads_here(hw) && self.sync_slot(hw, slot) {
            let s = &mut hw.slots[slot];
            s.folded = s.total;
            return;
        }
        let frozen = if hw.slots[slot].frozen { regs::SLOT_CTL_FROZEN } else { 0 };
        self.dev.mmio.write(self.slot_ctl_reg(slot), config.slot_ctl() | frozen);
        // The unread counts before the reset are not lost but reset. Time lost to a wrap before
        // stays lost (`lost_ns`).
        let s = &mut hw.slots[slot];
        s.last = 0;
        s.total = 0;
        s.folded = 0;
        s.moved_at = 0;
        s.read_ns = perf::clock_ns();
    }

    /// Frees the slot `event` holds, if any, and forgets what is owed to it.
    fn release_slot(&self, hw: &mut DomainHw, event: &Event) {
        if let Some(slot) = self.slot_of(hw, event) {
            self.dev.mmio.write(self.slot_ctl_reg(slot), 0);
            hw.slots[slot] = Slot::FREE;
            hw.held -= 1;
        }
        event.set_hw_idx(NO_SLOT);
    }

    /// Forgets what is owed to `event`, which is being freed.
    fn forget_owed(hw: &mut DomainHw, event: &Event) {
        hw.owed.forget(event.key());
    }

    /// Brings the count of `event` up to date, if this CPU reads the domain; elsewhere (in
    /// transit, parked) the device keeps counting and the next read on the owner catches up.
    ///
    /// The slot comes first: an event that holds one counts an `mbm_*` event (a gauge never
    /// holds a slot), so the common read needs neither the event's config nor a search, only its
    /// `hw.idx` checked against the slot's holder.
    fn fold(&self, hw: &mut DomainHw, event: &Event) {
        if !self.reads_here(hw) {
            return;
        }
        if let Some(slot) = self.slot_of(hw, event) {
            self.pay_owed(hw, event);
            if self.sync_slot(hw, slot) {
                self.credit(hw, slot, event);
            }
            return;
        }
        let Some(config) = DomainPmu::config_of(event) else {
            return;
        };
        if config.needs_slot() {
            // An `mbm_*` event without a slot has nothing to read, but what a slot counted for it
            // may be owed (it lost its own to another while it moved).
            self.pay_owed(hw, event);
            return;
        }
        // A gauge: the count is the current occupancy.
        let offset = regs::occupancy(self.index.into(), config.rmid);
        if let Some(value) = self.read_counter(offset) {
            let units = value & self.dev.mask;
            event.count().set(units.saturating_mul(self.dev.unit));
        }
    }

    /// Adds to the count of `event` what its `slot`, just read, counted since its last fold.
    #[inline]
    fn credit(&self, hw: &mut DomainHw, slot: usize, event: &Event) {
        let s = &mut hw.slots[slot];
        let units = s.total.wrapping_sub(s.folded);
        s.folded = s.total;
        // Nothing new (a read of a counter that saw no traffic since the last): the count is
        // not touched at all.
        if units != 0 {
            event.count().add(units.wrapping_mul(self.dev.unit));
        }
    }

    /// Reads every held slot, if this CPU reads the domain.
    fn sync_held(&self, hw: &mut DomainHw) {
        if !self.reads_here(hw) {
            return;
        }
        for slot in 0..self.dev.slots {
            if hw.slots[slot].ctl != 0 {
                self.sync_slot(hw, slot);
            }
        }
    }

    /// Polls the held slots; runs on the owner CPU with interrupts off. If the domain moved
    /// since the poll was aimed, it does nothing: the next poll goes to the new owner.
    fn poll_here(&self) {
        let mut hw = self.hw.lock();
        self.sync_held(&mut hw);
        if self.reads_here(&hw) {
            self.ack_in_poll();
        }
    }

    /// Makes `owner` the CPU that reads the domain (`None`: parked). The slots are read on the
    /// way out if this CPU was the owner (the CPU going offline, in a move or a park), and on
    /// the way in if it is the new one (an allowed CPU coming back runs this itself): a park's
    /// unread time is as short as it can be, so it outlasts a counter's wrap as rarely as it can.
    /// Returns whether the new owner still has to read them.
    fn change_owner(&self, owner: Option<u32>) -> bool {
        let mut later = false;
        hw::with_irqs_off(|| {
            let mut hw = self.hw.lock();
            self.sync_held(&mut hw);
            if owner.is_none() && self.reads_here(&hw) {
                // Every slot was just read: an overflow status still up would raise the parked
                // threshold interrupt at once and stop the park's events (`irq.rs`).
                self.ack_in_poll();
            }
            self.set_owner(&mut hw, owner);
            self.sync_held(&mut hw);
            later = owner.is_some() && !self.reads_here(&hw) && hw.held > 0;
        });
        later
    }
}

impl hw::Poll for Domain {
    fn poll(&self) -> bool {
        // An allowed-set change, in case its interrupt went missing or there is no line; before
        // the slots, so an owner no longer allowed does not read them (`allowed.rs`).
        hw::with_irqs_off(|| {
            self.check_config(&mut self.hw.lock());
        });
        let mut state = (None, false);
        hw::with_irqs_off(|| {
            let hw = self.hw.lock();
            state = (hw.owner, hw.held > 0);
        });
        let (owner, held) = state;
        if !held && !self.irq.ack_owed.load(Ordering::Relaxed) {
            // No slot to read, but the poll goes on: it is what sees a configuration change
            // without a line, and one whose interrupt went missing with a line (seen in a loaded
            // run: an allowed set never followed, with nothing open to keep the poll going).
            return true;
        }
        // With no slot held, the owner is polled only to ack an overflow status that an
        // interrupt taken off the owner left up (`irq.rs`). Left up, the line raises no edge
        // for any later interrupt, the parked threshold's included.
        if let Some(cpu) = owner {
            // An offline owner (`ENXIO`) is left alone: the perf core moves the domain away.
            let _ = hw::on_cpu(cpu, || self.poll_here());
        }
        true
    }
}

#[pinned_drop]
impl PinnedDrop for Domain {
    fn drop(self: Pin<&mut Self>) {
        // The PMU is unregistered and its poll stopped: leave the device as reset.
        for slot in 0..self.dev.slots {
            self.dev.mmio.write(self.slot_ctl_reg(slot), 0);
        }
        self.dev
            .mmio
            .write(self.reg(regs::DOM_OWNER), regs::NO_OWNER);
    }
}

// ---------------------------------------------------------------------------
// The PMU of a domain
// ---------------------------------------------------------------------------

/// The driver data of the PMU `perfbed_l3_<d>`.
struct DomainPmu {
    /// Polls the domain's held slots for wraps and its configuration for changes; stopped before
    /// the domain goes away.
    poller: hw::Poller<Domain>,
    /// The domain's interrupt line, if the device announced one (`irq.rs`); freed before the
    /// domain goes away.
    line: Option<irq::Line>,
}

impl DomainPmu {
    fn domain(&self) -> &Domain {
        self.poller.target()
    }

    /// The event's config, checked at `event_init` and kept in `hw.config`.
    fn config_of(event: &Event) -> Option<Config> {
        Config::decode(event.hw_config())
    }
}

#[vtable]
impl Pmu for DomainPmu {
    fn event_init(&self, event: &Event) -> Result {
        if event.attr_type() != event.pmu_type() {
            return Err(ENOENT);
        }
        if event.is_per_task() {
            return Err(EINVAL);
        }
        // What a counting PMU without an overflow interrupt cannot do, refused as perf's own
        // PMUs refuse a feature they lack: samples, a skid constraint on them (perf tries lower
        // `precise_ip` levels on `EOPNOTSUPP`), a signal on overflow. (The AUX actions on
        // overflow the core refuses itself, for an event in no AUX group.)
        if event.is_sampling() || event.precise_ip() != 0 || event.sigtrap() {
            return Err(EOPNOTSUPP);
        }
        // Filters it cannot apply (`PERF_PMU_CAP_NO_EXCLUDE` makes the core refuse these too),
        // and another PMU type's field.
        if event.has_exclude() || event.bp_type() != 0 {
            return Err(EINVAL);
        }
        // Of `sample_type`, the one bit perf's device PMUs refuse on a counting event too
        // (arm_dsu_pmu, arm-ccn): a branch stack, whose `branch_sample_type` filters branches by
        // privilege level and kind, as `exclude_*` would. Every other bit only shapes samples,
        // which a counting event never writes, or the ids of the core's side-band records.
        if event.has_branch_stack() {
            return Err(EINVAL);
        }
        self.domain().dev.check_config(event)?;
        event.set_hw_config(event.config());
        event.set_hw_idx(-1);
        event.set_hw_state(HwState::STOPPED | HwState::UPTODATE);
        Ok(())
    }

    /// The group may hold only this PMU's events and software events, and need no more slots
    /// than the domain has.
    fn check_group(&self, event: &Event, group: &Group<'_>) -> Result {
        let needs = |config: u64| Config::decode(config).is_some_and(Config::needs_slot);
        let mut slots = usize::from(needs(event.config()));
        for member in group.members() {
            if member.is_of_pmu(event) {
                slots += usize::from(needs(member.config()));
            } else if !member.is_software() {
                return Err(EINVAL);
            }
        }
        if slots > self.domain().dev.slots {
            return Err(EINVAL);
        }
        Ok(())
    }

    fn add(&self, event: &ScheduledEvent, flags: Flags) -> Result {
        let config = Self::config_of(event).ok_or(EINVAL)?;
        if config.needs_slot() {
            let domain = self.domain();
            let mut hw = domain.hw.lock();
            // No register read here but to take a moving event's slot. A slot the event still
            // holds counted on for it (back from a move or a park), and its next fold on the
            // owner (`read`, `del`) catches up, the poll keeping the slot's total from missing
            // wraps meanwhile; a slot just assigned starts from zero. `add` runs inside perf's
            // rotation, which accounts the incoming event as running from the rotation's start:
            // every access here delays the slot write of the event added after it, and under a
            // hypervisor each access is a VM exit (see `multiplexing` in xtask's pmu_checks).
            domain.take_slot(&mut hw, event, config)?;
            domain.settle_owed(&mut hw, event);
            // Without `START` (a park that outlasted the counters, patch 0008) the slot stands
            // still until `start`; a slot frozen for the event counts on from what it holds.
            domain.set_stopped(&mut hw, event, !flags.contains(Flags::START));
            drop(hw);
            self.poller.kick();
        }
        if flags.contains(Flags::START) {
            event.set_hw_state(HwState::empty());
        } else {
            event.set_hw_state(HwState::STOPPED | HwState::UPTODATE);
        }
        Ok(())
    }

    fn del(&self, event: &ScheduledEvent, _flags: Flags) {
        // On the owner this folds the count one last time. The slot is not stopped: in a move or
        // a reschedule it counts on for the event (see `unschedule`).
        if !event.hw_state().contains(HwState::STOPPED) {
            let domain = self.domain();
            let mut hw = domain.hw.lock();
            domain.fold(&mut hw, event);
        }
        event.set_hw_state(HwState::STOPPED | HwState::UPTODATE);
        if Self::config_of(event).is_some_and(Config::needs_slot) {
            let domain = self.domain();
            let mut hw = domain.hw.lock();
            domain.settle_owed(&mut hw, event);
            domain.unschedule(&mut hw, event);
        }
    }

    fn start(&self, event: &Event, _flags: Flags) {
        let domain = self.domain();
        domain.set_stopped(&mut domain.hw.lock(), event, false);
        event.set_hw_state(HwState::empty());
    }

    /// Stops the event's slot in the device: the perf core stops a parked PMU's events once
    /// their counters could lose counts unread (patch 0008), and their `time_running` with them.
    fn stop(&self, event: &Event, flags: Flags) {
        if !event.hw_state().contains(HwState::STOPPED) {
            let domain = self.domain();
            let mut hw = domain.hw.lock();
            if flags.contains(Flags::UPDATE) {
                domain.fold(&mut hw, event);
            }
            domain.set_stopped(&mut hw, event, true);
        }
        event.set_hw_state(HwState::STOPPED | HwState::UPTODATE);
    }

    fn read(&self, event: &Event) {
        if event.hw_state().contains(HwState::STOPPED) {
            return;
        }
        let domain = self.domain();
        // In NMI context this may have interrupted a holder of the lock on this very CPU: never
        // wait there. The count stays as it was; the next read catches up. The lock is tried
        // first: uncontended, the common case, it is taken without asking whether this is NMI
        // context at all.
        let hw = match domain.hw.try_lock() {
            Some(hw) => Some(hw),
            None => {
                domain.reads_contended.fetch_add(1, Ordering::Relaxed);
                if perf::in_nmi() {
                    domain.reads_skipped_nmi.fetch_add(1, Ordering::Relaxed);
                    None
                } else {
                    Some(domain.hw.lock())
                }
            }
        };
        if let Some(mut hw) = hw {
            domain.fold(&mut hw, event);
        }
    }

    /// A move installed `event` without scheduling it: see [`Domain::settle_moved`].
    fn moved_unscheduled(&self, event: &LockedEvent) {
        if !Self::config_of(event).is_some_and(Config::needs_slot) {
            return;
        }
        let domain = self.domain();
        let mut hw = domain.hw.lock();
        domain.settle_moved(&mut hw, event);
    }

    /// The end of a perf operation on this CPU: see [`Domain::freeze_left_off`].
    fn pmu_enable(&self) {
        let domain = self.domain();
        let mut hw = domain.hw.lock();
        domain.freeze_left_off(&mut hw, perf::current_cpu());
    }

    /// `PERF_EVENT_IOC_RESET`: see [`Domain::restart`]. A gauge's count is the occupancy at its
    /// last read, which the perf core zeroes; nothing is kept for it.
    fn reset(&self, event: &LockedEvent) {
        let Some(config) = Self::config_of(event).filter(|c| c.needs_slot()) else {
            return;
        };
        let domain = self.domain();
        let mut hw = domain.hw.lock();
        domain.restart(&mut hw, event, config);
    }

    fn event_destroy(&self, event: &Event) {
        // The slot goes back when its event is freed.
        let domain = self.domain();
        hw::with_irqs_off(|| {
            let mut hw = domain.hw.lock();
            domain.release_slot(&mut hw, event);
            Domain::forget_owed(&mut hw, event);
        });
    }

    /// `llc_occupancy` is a gauge read from a register and takes no slot: the perf core never
    /// multiplexes it, and never scales it, however many `mbm_*` events compete for slots.
    fn takes_counter(&self, event: &Event) -> bool {
        Self::config_of(event).map_or(true, Config::needs_slot)
    }

    /// The counter files, in the order of `COUNTER_FILES`.
    fn counter(&self, index: usize) -> u64 {
        let domain = self.domain();
        match index {
            0 => domain.lost_wraps.load(Ordering::Relaxed),
            1 => domain.irq.on_owner.load(Ordering::Relaxed),
            2 => domain.irq.off_owner.load(Ordering::Relaxed),
            3 => domain.reads_contended.load(Ordering::Relaxed),
            _ => domain.reads_skipped_nmi.load(Ordering::Relaxed),
        }
    }

    fn filter_allowed_cpus(&self, cpus: &mut CpuMask) -> Result {
        let domain = self.domain();
        cpus.retain(|cpu| domain.is_allowed(cpu));
        Ok(())
    }

    fn migrate_cpu(&self, cpu: Option<u32>) {
        let domain = self.domain();
        // The perf core only places the PMU on allowed CPUs; check anyway rather than make the
        // device report every read as a violation.
        let owner = cpu.filter(|&cpu| domain.is_allowed(cpu));
        if domain.change_owner(owner) {
            // Called off the new owner: have it read the slots now, not a poll period later.
            self.poller.kick_now();
        }
        // The poll reads the owner each time: it follows the domain without more ado. The
        // interrupt's affinity does not: point it at the new owner (or away, on a park).
        if let Some(line) = &self.line {
            if let Some(cpu) = owner {
                domain.ack_before_placement(cpu);
            }
            irq::follow(line, domain, owner);
        }
        match owner {
            Some(cpu) => pr_debug!("perfbed_l3_{}: counting on CPU {}\n", domain.index, cpu),
            None => pr_debug!("perfbed_l3_{}: parked\n", domain.index),
        }
    }
}

// ---------------------------------------------------------------------------
// The module
// ---------------------------------------------------------------------------

/// Registers the PMU of domain `index`.
///
/// # Safety
///
/// As for [`Registration::new`]: the registration must not be dropped while events of the PMU
/// can exist.
unsafe fn register(
    module: &'static ThisModule,
    dev: &Arc<Device>,
    index: u32,
    gsi: Option<u32>,
) -> Result<DomainRegistration> {
    let name = CString::try_from_fmt(kernel::fmt!("perfbed_l3_{}", index))?;
    let domain = Arc::pin_init(Domain::new(dev, index), GFP_KERNEL)?;
    let allowed = domain.allowed();
    topology::report(&name, allowed);
    // Requested before the PMU is registered: registering places it, and `migrate_cpu` then
    // points the line at its CPU. A line that cannot be had leaves the domain to the poll.
    let line = gsi.and_then(|gsi| match irq::Line::request(gsi, domain.clone(), &name) {
        Ok(line) => {
            irq::enable(&domain);
            Some(line)
        }
        Err(e) => {
            pr_warn!("{}: cannot request interrupt {}: {:?}; polling only\n", &*name, gsi, e);
            None
        }
    });
    // With a line the poll is the fallback, and slower (`irq::POLL_FACTOR`).
    let period = if line.is_some() { dev.poll_ms.saturating_mul(irq::POLL_FACTOR) } else { dev.poll_ms };
    let poller = hw::Poller::new(domain, period)?;

    let mut events = KVec::with_capacity(EVENT_FILES.len(), GFP_KERNEL)?;
    for (id, file, value) in EVENT_FILES {
        if dev.events & (1 << id as u64) != 0 {
            let attr = EventAttr::new(file, value).unit(EVENT_UNIT).scale(EVENT_SCALE);
            events.push(attr, GFP_KERNEL)?;
        }
    }
    let options = Options {
        name: &name,
        scope: Scope::Device,
        capabilities: Capabilities::NO_INTERRUPT | Capabilities::NO_EXCLUDE,
        task_context: TaskContext::Invalid,
        events: &events,
        formats: &FORMATS,
        counters: &COUNTER_FILES,
        // With a line, the parked threshold interrupt stops a park when its traffic asks for it
        // (`irq.rs`); without one, only the time limit can.
        unread_limit_ns: if line.is_some() { 0 } else { dev.unread_limit_ns },
    };
    let data = DomainPmu { poller, line };
    // SAFETY: The caller guarantees what `Registration::new` requires.
    let init = unsafe { Registration::new(module, &options, data) };
    let pmu = KBox::pin_init(init, GFP_KERNEL).inspect_err(|e| {
        pr_err!(
            "{}: cannot register the PMU (allowed CPUs {:#x}): {:?}\n",
            &*name,
            allowed,
            e
        )
    })?;

    // The perf core placed the PMU during registration, telling the domain its owner through
    // `migrate_cpu`. From now on an allowed-set change places it again (`allowed.rs`), and the
    // poll watches for one too (it never stops: with a line it is the fallback).
    let registered = DomainRegistration(pmu);
    let pmu = &registered.0;
    // SAFETY: The registration is pinned in its box, which `registered` owns from here on and
    // whose drop detaches it before unregistering.
    unsafe { pmu.data().domain().attach_pmu(pmu) };
    pmu.data().poller.kick();
    if let Some(line) = &pmu.data().line {
        pr_info!("{}: interrupt {}\n", &*name, line.irq());
    }
    match pmu.cpu() {
        Some(cpu) => pr_info!(
            "{}: type {}, allowed CPUs {:#x}, on CPU {}\n",
            &*name,
            pmu.pmu_type(),
            allowed,
            cpu
        ),
        None => pr_info!(
            "{}: type {}, allowed CPUs {:#x}, parked (no allowed CPU online)\n",
            &*name,
            pmu.pmu_type(),
            allowed
        ),
    }
    Ok(registered)
}

/// A domain's registered PMU. Dropping it stops the re-placement work from using the PMU
/// (`allowed.rs`) before the PMU is unregistered.
struct DomainRegistration(Pin<KBox<Registration<DomainPmu>>>);

impl Drop for DomainRegistration {
    fn drop(&mut self) {
        self.0.data().domain().detach_pmu();
    }
}

struct Perfbed {
    /// Dropped first: unregistering the PMUs stops their polls and releases their slots.
    _pmus: KVec<DomainRegistration>,
    /// Unmapped last, when the domains no longer use it.
    _dev: Arc<Device>,
}

impl kernel::Module for Perfbed {
    fn init(module: &'static ThisModule) -> Result<Self> {
        let (size, base, gsis) = device_location()?;
        let mmio = hw::Mmio::map(base, size).inspect_err(|_| {
            pr_err!("cannot map the registers at {:#x} ({:#x} bytes)\n", base, size)
        })?;
        let dev = Arc::new(Device::probe(mmio, base, size)?, GFP_KERNEL)?;

        // Start from a clean device: no slot assigned, no owner.
        for d in 0..dev.domains {
            for slot in 0..dev.slots {
                // CAST: slot numbers are below `MAX_SLOTS`.
                let offset = regs::slot_ctl(d.into(), slot as u64);
                dev.mmio.write(offset, 0);
            }
            dev.mmio
                .write(regs::domain_reg(d.into(), regs::DOM_OWNER), regs::NO_OWNER);
        }
        pr_info!(
            "device at {:#x}: {} domains, {} RMIDs, {} slots, {}-bit counters of {} bytes, \
             max {} bytes/s; wrap polling every {} ms\n",
            dev.base,
            dev.domains,
            dev.rmids,
            dev.slots,
            dev.width,
            dev.unit,
            dev.max_rate,
            dev.poll_ms
        );

        let mut pmus = KVec::with_capacity(dev.domains as usize, GFP_KERNEL)?;
        for d in 0..dev.domains {
            // SAFETY: Until `dev.ready` is set below, every PMU's `event_init` refuses events, so
            // if a later registration (or the push) fails and `pmus` is dropped, no event of any
            // of them exists. Once `init` has returned, the registrations live in the module's
            // data until its exit, and every event holds a reference on the module.
            pmus.push(unsafe { register(module, &dev, d, gsis.of(d)) }?, GFP_KERNEL)?;
        }
        dev.ready.store(true, Ordering::Release);
        Ok(Perfbed {
            _pmus: pmus,
            _dev: dev,
        })
    }
}
