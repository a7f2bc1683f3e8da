//! The reference model of perf's counting semantics for perfbed's
//! device-scope events: what every read of an event must show, given the
//! operations issued since it was opened. The lifecycle stress replays its
//! journal through this model; `docs/counting-semantics.md` is the same
//! contract in prose, with where it differs from upstream's scoped PMUs and
//! from the seed design (001).
//!
//! # What the model knows
//!
//! Operations, in the order they were issued, with time passing between any
//! two of them: opens (single events and group members, `attr.disabled`,
//! pinned, exclusive), closes, `ENABLE`/`DISABLE`/`RESET` with or without
//! `PERF_IOC_FLAG_GROUP`, PMU moves, parks and unparks, traffic bursts and
//! occupancy changes. A burst is instantaneous here: the stress lands it
//! while nothing changes state (it waits for the device to report it landed
//! before the next operation), so every burst falls in one *epoch*, the time
//! between two operations, in which every event's state is constant.
//!
//! # Enabled, counting, and the four numbers
//!
//! An event is **enabled** while its own state is on (perf's
//! `state >= INACTIVE`): from an open without `attr.disabled` or an `ENABLE`
//! to a `DISABLE`. `PERF_IOC_FLAG_GROUP` applies an ioctl to the whole group
//! of the event it is issued on (its leader and every sibling), as
//! `perf_event_for_each()` does, also when issued on a sibling. Moves, parks
//! and rescheduling never change whether an event is enabled.
//!
//! An event is **counting** (scheduled, perf's `ACTIVE`) in an epoch when it
//! is enabled, its group leader is enabled, and its group is on its PMU:
//! - a group of software events only is always on;
//! - a device PMU is *uncontended* when its groups with an enabled leader
//!   fit together: the counter slots their enabled `mbm_*` members need sum
//!   to at most the domain's slots, and no exclusive group shares the PMU
//!   with another group. Then every such group is on. Gauges
//!   (`llc_occupancy`) take no slot, and a non-exclusive group that needs no
//!   slot is on whenever no exclusive group shares the PMU with it
//!   (`takes_counter`: perf never multiplexes it for slots);
//! - a pinned group is on whenever the pinned groups alone fit;
//! - otherwise the group is **maybe** on: perf multiplexes, and which group
//!   runs when is perf's rotation, which the model does not predict.
//!   Uncontended holds from the operation that ends the contention (a
//!   `DISABLE`, a close; patch 0010 reschedules the PMU then), and a group
//!   left with gauges only by a sibling's close is on from that close
//!   (patch 0009).
//!
//! Closing a leader promotes each sibling to a leader of its own, keeping its
//! state (perf's `perf_group_detach`): a sibling that was enabled under a
//! disabled leader starts counting, none of the time its leader was off in
//! its `time_enabled` (kernel patch 0003).
//!
//! From these, for each event over a *window* (from its open, or its previous
//! read, to this read):
//! - `time_enabled` grows exactly while the event is enabled, by perf's
//!   effective state (a sibling whose leader is disabled counts as
//!   disabled): a window
//!   disabled throughout leaves it unchanged, to the nanosecond, and one in
//!   which time passed (an operation, a burst) while it was enabled moves
//!   it, as time passed while counting for sure moves `time_running`
//!   (from a read that showed times; not for a detached event's
//!   `time_enabled` nor a lossy park's running);
//! - `time_running` grows exactly while it is counting: counting throughout
//!   (or whenever it was enabled: neither clock grows while it is not)
//!   means `Δrunning == Δenabled`, never counting means `Δrunning == 0`,
//!   otherwise `Δrunning <= Δenabled`;
//! - the raw value of an `mbm_*` event grows by exactly the bytes of the
//!   bursts of its (domain, event, RMID) that landed while it was counting;
//!   while it was maybe counting, by at most those bytes; perf's own times
//!   then settle it: `Δrunning == 0` means nothing was counted, and counting
//!   for the whole enabled window means every burst was (only for a window
//!   the times cover: a read while parked resets the times, not the value's
//!   window). `RESET` sets the
//!   value to 0 and leaves the times alone;
//! - an `llc_occupancy` gauge reads the occupancy of its (domain, RMID) at
//!   the last moment it was counting (rounded down to the device's unit,
//!   saturated at its width), 0 if it never counted since its open or reset;
//!   taking turns, one of those it may have seen last, or its last fold;
//! - a cpu-clock event's value is time, which the model does not predict; its
//!   times follow the rules above.
//!
//! Bursts are whole multiples of the device's counter unit, so that values
//! in bytes are exact.
//!
//! # Steady traffic
//!
//! Traffic that flows into a watched counter while operations go on is
//! measured around each operation (the device's truth just before and just
//! after it): what landed between two operations is a burst of that epoch
//! ([`Model::flowed`]); what landed during one ([`Model::flowed_during`])
//! counts for sure for an event that counted for sure before it and after
//! it (a move or a park loses nothing), and may show in part, beyond the
//! multiplexing's bounds, where the operation started, stopped, reset or
//! read the count (a read may show some of what lands while it runs, and
//! the next one the rest: [`Model::flowing_into_read`]). Such a count is in
//! whole units of a traffic that is not: it may lag the truth by less than
//! one unit at either end of a window.
//!
//! # Parks and lost wraps
//!
//! A parked PMU's events stay enabled and keep their times running; bursts
//! that land while it is parked are counted when it is placed again. If a
//! park lets one (event, RMID) of a domain gain a whole counter wrap or more
//! (`2^width` units), the driver cannot tell how many wraps it lost: the
//! model then accepts either the exact count with `Δrunning == Δenabled`, or
//! `Δrunning < Δenabled` (perf shows less than 100 % running and scales),
//! never an inexact count claimed as fully running. A park long enough that
//! a wrap *could* have landed (half a wrap's time at the device's maximum
//! rate: the driver sees time, not traffic) may show less running too, but
//! its count stays exact; `time_running` never goes down.
//!
//! An event DISABLEd while its PMU is parked has its slot frozen
//! (`SLOT_CTL_FROZEN`): its count is exact, nothing after the DISABLE
//! reaches it, and its own ENABLE thaws the slot, counting on for sure. The
//! frozen slot keeps its place (counts against the domain's slots for the
//! rest of the park) until that ENABLE or the placement. An event *put on*
//! its PMU while parked in any other way (enabled, its leader enabled, or
//! promoted by its leader's close) is *maybe* counting until the PMU is
//! placed again.
//!
//! A parked PMU whose slot events do not all fit at some moment of a park
//! keeps the extra ones scheduled without a slot, not counting (patch 0008),
//! and a parked PMU is neither rotated (patch 0010) nor rescheduled when the
//! contention ends: from that
//! moment until the PMU is placed again its slot events are *maybe*
//! counting. If the contention is an exclusive group sharing the PMU with
//! another group, the groups that were on when the park began stay on,
//! whichever they were, so every event of the PMU, gauges too, is *maybe*
//! counting until the placement. A gauge read while parked shows exactly
//! what its last fold left (0 after a RESET while parked); it takes no
//! slot, so short of such a clash its clocks run on alike.
//!
//! # Rules across events, and clocks that never go back
//!
//! Neither clock of an event ever goes back, across all its reads, nor does
//! its count but by a `RESET` (a count a read while parked showed too). Over the
//! window between two moments at which several events of one PMU were read
//! (reads one after the other), for those enabled with an enabled leader
//! throughout, allowing [`READ_SKEW_NS`] per read and how far apart the two
//! moments' reads lay on the guest's clock ([`Model::read_took`]; a wait
//! before an event is read again begins the next moment and is in neither
//! one's spread): at most `slots` counters
//! run at once (`Σ Δrunning <= slots × Δenabled`), an exclusive group runs
//! alone (beside pinned groups only, as perf schedules it; a mixed group
//! is a flexible group of its device PMU, also after moves), and a group's `mbm_*` members run together (equal `Δrunning`,
//! in a window without a park or a placement); and each one's
//! `time_enabled` grew as the others' (its clock is the context's).
//!
//! # CPUs going offline
//!
//! A group of software events only lives in its CPU's context; when that
//! CPU goes offline perf takes every event out of it with `DETACH_GROUP`
//! (`__perf_event_exit_context()`): single events, `OFF`, never scheduled
//! again, also once the CPU is back ([`Model::cpu_offline`]).
//!
//! # Foreseeing reads
//!
//! [`Model::expect`] says what the next read of an event must show;
//! [`Model::predict`] also takes such a read as the baseline, so that a
//! journal's reads can be foreseen on the host.
//!
//! # Rules
//!
//! Each rule above has a name ([`rules::Rule`]), asked where the model
//! applies it; [`rules`] keeps, for tests, the unit tests that pin each
//! rule and a test that each of them fails once its rule is taken out
//! (the table is in `docs/counting-semantics.md` too).
//!
//! # Mismatches
//!
//! [`Model::read`] compares one observed read with the model and returns
//! every difference; the model then takes the observed values as its new
//! baseline, so one wrong count is reported once, at the first read that
//! shows it, and later reads are judged on what happened after it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

pub mod rules;

use rules::{holds, Rule};

/// An event's handle (the agent's).
pub type Handle = u32;

/// What an event counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `mbm_total_bytes` (event 2) or `mbm_local_bytes` (3) of `rmid` in
    /// domain `pmu`: needs a counter slot.
    Counter { pmu: u32, event: u32, rmid: u32 },
    /// `llc_occupancy` of `rmid` in domain `pmu`: a gauge, no slot.
    Gauge { pmu: u32, rmid: u32 },
    /// A software event (cpu-clock): counts time on its CPU.
    Software,
}

impl Kind {
    fn pmu(self) -> Option<u32> {
        match self {
            Kind::Counter { pmu, .. } | Kind::Gauge { pmu, .. } => Some(pmu),
            Kind::Software => None,
        }
    }

    fn needs_slot(self) -> bool {
        matches!(self, Kind::Counter { .. })
    }
}

/// How an event is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenSpec {
    pub kind: Kind,
    /// `attr.disabled`.
    pub disabled: bool,
    pub pinned: bool,
    pub exclusive: bool,
    /// The leader's handle, for a sibling.
    pub group: Option<Handle>,
}

/// Why the model expects an open to be refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `ENODEV`: the PMU is parked (none of its allowed CPUs is online).
    Parked,
    /// `EINVAL`: the group would need more slots than the domain has,
    /// mixes two device PMUs, a sibling is pinned or exclusive, or a
    /// device event joins a software group on another CPU than its PMU's.
    BadGroup,
    /// `EBADF`: the leader is not open.
    NoLeader,
}

impl Refusal {
    /// The errno's name the kernel answers with.
    pub fn errno(self) -> &'static str {
        match self {
            Refusal::Parked => "ENODEV",
            Refusal::BadGroup => "EINVAL",
            Refusal::NoLeader => "EBADF",
        }
    }
}

/// The ioctls that change counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ioctl {
    Enable,
    Disable,
    Reset,
}

/// One event's numbers as a read showed them (bytes for device events).
/// `enabled`/`running` are `None` when the read format left them out (and
/// for the siblings of a group read, whose times are the leader's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Observed {
    pub value: u64,
    pub enabled: Option<u64>,
    pub running: Option<u64>,
}

/// Which number of a read differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Value,
    Enabled,
    Running,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::Value => "value",
            Field::Enabled => "time_enabled",
            Field::Running => "time_running",
        })
    }
}

/// One difference between a read and the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub handle: Handle,
    pub field: Field,
    /// What the model allows, in words ("== 4096", "unchanged at 1200", ...).
    pub expected: String,
    /// What the read showed (the delta over the window for times and counts).
    pub got: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "event {}: {} {}, expected {}",
            self.handle, self.field, self.got, self.expected
        )
    }
}

/// Whether each event counted at one moment, and which PMUs were parked
/// (see [`Model::snapshot`]).
#[derive(Debug, Clone)]
pub struct Snapshot {
    counting: BTreeMap<Handle, Counting>,
    parked: Vec<bool>,
    /// The moment it was taken in.
    moment: u64,
}

/// Whether an event counted in an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counting {
    Yes,
    No,
    Maybe,
}

/// How far apart two reads issued one after the other may be, in ns (a
/// read's system call on a loaded guest): the slack of the rules that
/// compare several events' clocks.
pub const READ_SKEW_NS: u64 = 2_000_000;

/// What the model requires of one time field of the next read, over the
/// window since the event's last read that showed times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeRule {
    /// Unchanged: disabled (`time_enabled`) or not counting
    /// (`time_running`) throughout.
    Unchanged,
    /// `time_enabled` grows by any amount (never goes back).
    Grows,
    /// `time_running` grows exactly as `time_enabled`: counting throughout.
    AsEnabled,
    /// `time_running` grows by at most `time_enabled`'s growth.
    AtMostEnabled,
}

/// What the model requires of the value of the next read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueRule {
    /// An `mbm_*` count grows by `lo..=hi` bytes from `base` (exact when
    /// equal), give or take steady traffic the model cannot place: up to
    /// `short` less, `over` more. Where the window was multiplexed perf's
    /// times settle it: `Δrunning == 0` ⇒ `+lo` (`settle_zero`), running for
    /// the whole enabled window ⇒ `+hi` (`settle_full`). `lossy`: a park let
    /// a whole wrap land, so a short count is right when `Δrunning <
    /// Δenabled`.
    Bytes {
        base: u64,
        lo: u64,
        hi: u64,
        short: u64,
        over: u64,
        settle_zero: bool,
        settle_full: bool,
        lossy: bool,
    },
    /// The PMU is parked: at least `base` (the last fold), at most `hi`
    /// more; the window stays open until a read after the placement.
    Parked { base: u64, hi: u64 },
    /// An `llc_occupancy` gauge reads exactly this many bytes.
    Gauge(u64),
    /// A gauge's read that races a move: what its last read showed (0
    /// after a RESET since), or the occupancy now.
    GaugeEither { shown: u64, now: u64 },
    /// A cpu-clock grows by at least its own `Δrunning`, less
    /// [`CLOCK_SLACK_NS`] and a tenth of it, from `base`; and less
    /// [`CLOCK_TURN_SLACK_NS`] for each turn in it may have taken, at most
    /// one per `turn_ns` it ran, when its group took turns (`turn_ns` 0:
    /// it did not).
    Clock { base: u64, turn_ns: u64 },
    /// Not predicted (a cpu-clock read after a RESET or a read without
    /// times; a gauge whose fold is unknown).
    Any,
}

/// perf's mux interval for a PMU that sets none, `PERF_CPU_HRTIMER`: 1000 /
/// `HZ` ms, and the guest kernel has `HZ=250` (tinyconfig's default).
pub const DEFAULT_MUX_INTERVAL_NS: u64 = 4_000_000;

/// How much more a cpu-clock may fall short of its `Δrunning` for each
/// turn in its group takes on a contended PMU. A rotation
/// (`perf_rotate_context()`) updates the context time once, schedules out
/// the groups taking turns (each device member's `del` a trapped register
/// read), then schedules groups in: their times start at that context time,
/// the clock's counter at its own `add`, after the sched-out of what it
/// replaces. A tenth of a 4 ms turn was 0.15 ms short of that on the KCSAN
/// kernel under TCG; one register access in the box (0.3 ms) covers it
/// twice.
pub const CLOCK_TURN_SLACK_NS: u64 = 300_000;

/// How far a cpu-clock's growth may fall short of its `Δrunning` over a
/// window, besides a tenth of it: its counter starts at its `add`
/// (`local_clock()`), its running time at the context time of the
/// operation that schedules it, frozen from the operation's start, and the
/// device members added before it take register accesses of up to 0.3 ms
/// each in the box. (It may count more than its `Δrunning` by as much
/// the other way, at a `del` after its device members': not judged.)
pub const CLOCK_SLACK_NS: u64 = 5_000_000;

/// What the model requires of the next read of one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub value: ValueRule,
    pub enabled: TimeRule,
    pub running: TimeRule,
    /// The times of the last read that showed them (the rules' baseline).
    pub enabled_ns: u64,
    pub running_ns: u64,
}

/// What the model knows about one number's change since its baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    /// Enabled in no epoch.
    enabled_none: bool,
    /// Counting in every epoch it was enabled in (neither clock grows in
    /// the others, so both grow alike) / in none (`Maybe` breaks both).
    counting_all: bool,
    counting_none: bool,
    /// Some epoch was `Maybe`.
    any_maybe: bool,
    /// Burst bytes that landed while counting (`sure`) or maybe counting.
    sure_bytes: u64,
    maybe_bytes: u64,
    /// Steady traffic that landed at a moment of an operation the model
    /// cannot place against it (see [`Model::flowed_during`]): a read may
    /// show any part of it, beyond the multiplexing's `maybe`.
    over: u64,
    /// A park let a whole wrap land: the count may be short if perf shows it.
    lossy: bool,
    /// Its group's leader may have been in ERROR, where both clocks stop
    /// together: `Δrunning == Δenabled` no longer says it counted all.
    erred: bool,
    /// A read while the PMU was parked showed times but left the value
    /// window open (nobody could read the counter): perf's times since
    /// cover only the end of this window, so they cannot settle a
    /// multiplexed value in it.
    times_younger: bool,
    /// Time passed (an operation or a burst) while the event was enabled /
    /// counting for sure: its clock cannot have stood still.
    enabled_passed: bool,
    counted_passed: bool,
    /// A software member of a device group whose PMU moved, parked or was
    /// placed in the window: its counter stood still in the transit,
    /// which perf credits as enabled but not as running.
    transited: bool,
}

impl Window {
    const FRESH: Window = Window {
        enabled_none: true,
        counting_all: true,
        counting_none: true,
        any_maybe: false,
        sure_bytes: 0,
        maybe_bytes: 0,
        over: 0,
        lossy: false,
        erred: false,
        times_younger: false,
        enabled_passed: false,
        counted_passed: false,
        transited: false,
    };

    fn epoch(&mut self, enabled: bool, counting: Counting) {
        self.enabled_none &= !enabled;
        self.counting_all &= !enabled || counting == Counting::Yes;
        self.counting_none &= counting == Counting::No;
        self.any_maybe |= counting == Counting::Maybe;
    }

    /// Time passed in the current epoch (an operation ends it, or a burst
    /// lands in it).
    fn passed(&mut self, s: Status) {
        self.enabled_passed |= s.enabled && !s.erred;
        self.counted_passed |= s.counting == Counting::Yes;
    }

    fn burst(&mut self, counting: Counting, bytes: u64) {
        match counting {
            Counting::Yes => self.sure_bytes = self.sure_bytes.wrapping_add(bytes),
            Counting::Maybe => self.maybe_bytes = self.maybe_bytes.wrapping_add(bytes),
            Counting::No => {}
        }
    }
}

#[derive(Debug, Clone)]
struct EventState {
    spec: OpenSpec,
    leader: Handle,
    /// The device PMU whose context holds the event's group: the first
    /// device PMU of a member it ever had. It stays when the device members
    /// close (perf does not move a group back to its software context),
    /// and a promoted sibling keeps its old group's.
    group_pmu: Option<u32>,
    /// The CPU whose context holds a group of software events only (the
    /// CPU its leader was opened on), if the model was told.
    cpu: Option<u32>,
    enabled: bool,
    /// Taken out of its CPU's context when that CPU went offline (perf's
    /// `__perf_event_exit_context()`): never scheduled again.
    detached: bool,
    /// On its PMU after the last operation, as perf schedules it (enabled,
    /// leader enabled, the group not kept off).
    on: bool,
    /// Put on its PMU while the PMU was parked, other than by an ENABLE
    /// that thaws its own frozen slot: maybe counting until placed.
    parked_on: bool,
    /// Taken off its PMU while parked: its slot is frozen and stays its
    /// own (keeps its place) until an ENABLE thaws it or the placement
    /// reads it.
    frozen: bool,
    /// Frozen by its own DISABLE (not its leader's): its ENABLE thaws the
    /// slot and it counts on from there.
    frozen_own: bool,
    /// A software event promoted by its disabled leader's close in a CPU's
    /// context: upstream leaves it to that context's next schedule-in,
    /// which the model does not see (maybe counting from then on).
    waits_schedule_in: bool,
    /// Of a pinned group that did not fit beside the PMU's other pinned
    /// groups at some moment since its last ENABLE: perf may have put it in
    /// ERROR, where it stays until enabled again and a read returns
    /// nothing (`perf_read()`'s end of file).
    may_be_in_error: bool,
    /// The last moment it was not enabled with an enabled leader, or was
    /// opened, detached or promoted: the rules across events hold for a
    /// window after it.
    steady_since: u64,
    /// The last moment it did not count for sure (opened in it, or not
    /// `Counting::Yes`): an operation that passed through such a moment
    /// (a step of several, such as perf stat's open, bursts and close) did
    /// not count its flow for sure, whatever it counted before and after.
    unsure_at: u64,
    /// The value baseline and what happened since.
    value: u64,
    /// The most a read while parked showed since the baseline (it leaves
    /// the window open): a count shown is never taken back but by RESET.
    shown: u64,
    value_window: Window,
    /// Gauge: the value the last fold left (None: unknown).
    gauge: Option<u64>,
    /// Gauge, its fold unknown (multiplexed): the values it may show, the
    /// last fold and each occupancy while it was maybe counting.
    gauge_maybe: BTreeSet<u64>,
    /// A gauge's value as its last read showed it (0 after a RESET since,
    /// and before any read).
    gauge_shown: u64,
    /// A cpu-clock's value when its times were last read with it (0 at the
    /// open), the base of [`ValueRule::Clock`]; `None` once a RESET or a
    /// read without times parted the value's baseline from the times'.
    clock_base: Option<u64>,
    /// perf's times (`time_enabled`, `time_running`) at the value's
    /// baseline: the open's zeros, or the read that began the value window
    /// and showed them; `None` once a RESET or a read without times parted
    /// the value's baseline from the times'. Reads while parked leave the
    /// value window open and reset the times' baseline: the shortfall of a
    /// park stopped at its limit shows over the whole value window.
    value_times: Option<(u64, u64)>,
    /// Steady traffic landed on its counter since the open: the count, in
    /// whole units, may lag the truth by the part of a unit not counted.
    flowed: bool,
    /// The time baseline (the last read that showed times) and what happened since.
    /// `times_read`: a read showed them (not the open's zeros).
    times_read: bool,
    enabled_ns: u64,
    running_ns: u64,
    time_window: Window,
}

/// The times of a PMU's events read at one moment (reads one after the
/// other, no other operation between them).
#[derive(Debug, Clone, Default)]
struct Batch {
    moment: u64,
    times: BTreeMap<Handle, (u64, u64)>,
    /// How far apart these reads lay (see [`Model::read_took`]).
    reads: MomentReads,
}

#[derive(Debug, Clone, Default)]
struct PmuState {
    parked: bool,
    /// While parked: the CPU whose context keeps its events, the core's
    /// holding CPU (`perf_device_hold_cpu()`: the first one online when it
    /// parked). When that CPU goes offline in turn (arm64's CPU 0 can) the
    /// core hands the events to the first CPU still online
    /// (`perf_device_rehold()`): a transit as in a move.
    held_on: Option<u32>,
    /// The moment of its last park or placement.
    placed_moment: u64,
    /// Events the model does not know of may be open on the PMU (another
    /// process's): an exclusive group may then have to give way.
    others: bool,
    /// Bytes landed per (event, rmid) since the park began.
    parked_bytes: BTreeMap<(u32, u32), u64>,
    /// The perf core may have stopped its events in the current park
    /// (patch 0018): one counter gained enough for the driver's threshold
    /// interrupt to ask for it (`HeavyParkMayCountShort`), or the PMU has
    /// no line and its park may have outlasted the driver's time limit
    /// (`PolledParkMayCountShort`). From some moment of the park on, what
    /// lands is not counted, shown as time not running.
    stopped_in_park: bool,
    /// Its slot events did not all fit at some moment of the current park:
    /// the driver may then have scheduled some without a slot (not
    /// counting), and perf does not reschedule them when the contention
    /// ends, so until the PMU is placed again none of its slot events is
    /// sure to count.
    contended_in_park: bool,
    /// An exclusive group with an enabled leader shared the PMU with
    /// another group at some moment of the current park: the groups that
    /// were on when the park began stay on, the exclusive one or the
    /// others, and perf puts none on when the clash ends, so until the PMU
    /// is placed again none of its events, gauges too, is sure to count.
    clashed_in_park: bool,
    occupancy: BTreeMap<u32, u64>,
    /// CPUs went offline or online behind the model's back (rcutorture's
    /// onoff): the PMU may have parked and been placed again any number of
    /// times since the last observation, so its events may or may not be
    /// counting and a read may show a parked PMU's value, until the
    /// placement is observed (see [`Model::placement_unknown`]).
    unknown: bool,
    /// A thread of the guest moves the PMU at moments the model is not
    /// told (see [`Model::moves_unseen`]): a read may race a move.
    moving: bool,
    /// The reads of the current moment and of the one before.
    batch: Batch,
    prev_batch: Batch,
}

impl PmuState {
    /// `bytes` of (`event`, `rmid`) may have landed in this park: toward a
    /// lost wrap at the placement.
    fn landed_in_park(&mut self, event: u32, rmid: u32, bytes: u64, stop_bytes: u64) {
        let b = self.parked_bytes.entry((event, rmid)).or_insert(0);
        *b = b.saturating_add(bytes);
        if *b >= stop_bytes && holds(Rule::HeavyParkMayCountShort) {
            self.stopped_in_park = true;
        }
    }
}

/// The device's shape as the model needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceShape {
    pub pmus: u32,
    pub slots: u32,
    pub unit_bytes: u64,
    pub counter_width: u32,
    /// A domain's bandwidth in bytes/s: how fast a counter can wrap.
    pub max_rate: u64,
    /// How many PMUs, the first ones, have an interrupt line; the rest are
    /// polled (the hosts have lines for the first domains only).
    pub lined_pmus: u32,
}

impl DeviceShape {
    /// The default run's device (2 domains of 4 slots, 24-bit counters of
    /// 64 bytes, 2 GiB/s), for the lifecycle's unit tests.
    #[cfg(test)]
    pub const DEFAULT_RUN: DeviceShape = DeviceShape {
        pmus: 2,
        slots: 4,
        unit_bytes: 64,
        counter_width: 24,
        max_rate: 2 << 30,
        lined_pmus: 2,
    };

    /// Bytes landed on one counter in a park from which the driver may have
    /// had the perf core stop the park's events: its parked threshold
    /// interrupt comes at half a wrap unread, and a counter may hold up to an
    /// eighth of one (the placed threshold) unread when the park begins, more
    /// if the owner's handler comes late: a quarter of a wrap leaves that
    /// an eighth more.
    fn park_stop_bytes(&self) -> u64 {
        self.wrap_bytes() / 4
    }

    /// Whether `pmu`'s driver stops a park only when a counter's threshold
    /// interrupt says so: a PMU without a line has the perf core stop its
    /// park after a time limit instead (a quarter of a wrap's time at the
    /// maximum rate), which the model, keeping no time, cannot place.
    fn park_stops_by_traffic(&self, pmu: u32) -> bool {
        pmu < self.lined_pmus
    }

    fn wrap_bytes(&self) -> u64 {
        (1u64 << self.counter_width.min(61)).saturating_mul(self.unit_bytes)
    }

    fn gauge_bytes(&self, bytes: u64) -> u64 {
        if !holds(Rule::GaugeRounded) {
            return bytes;
        }
        let max_units = (1u64 << self.counter_width.min(61)) - 1;
        (bytes / self.unit_bytes.max(1)).min(max_units) * self.unit_bytes
    }
}

/// Whether a PMU's groups fit at a moment.
#[derive(Debug, Clone, Copy)]
struct Fit {
    /// All of them can be on together.
    all: bool,
    /// An exclusive group with an enabled leader shares the PMU with
    /// another group.
    clash: bool,
}

/// One event's state in an epoch, as perf schedules it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Status {
    /// Enabled by perf's effective state (its own and its leader's).
    enabled: bool,
    /// On its PMU (scheduled, or in a parked PMU's keeping).
    on: bool,
    counting: Counting,
    /// Of an enabled pinned group that does not fit beside the other
    /// pinned groups now (see [`EventState::may_be_in_error`]).
    pinned_left_out: bool,
    /// Its leader may be in ERROR: the group neither runs nor (the
    /// leader's) `time_enabled` grows until the leader's own ENABLE.
    erred: bool,
}

/// The model: every open event and PMU.
#[derive(Debug, Clone)]
pub struct Model {
    shape: DeviceShape,
    pmus: Vec<PmuState>,
    events: BTreeMap<Handle, EventState>,
    /// CPUs offline now (of those the model was told about).
    offline: BTreeSet<u32>,
    /// Counts operations: reads at one moment are reads one after the
    /// other.
    moment: u64,
    /// How the last read was timed, and at which moment (see
    /// [`Model::read_took`]): its PMU's batch takes it.
    last_read: Option<(u64, ReadTiming)>,
    /// The shortest mux interval any PMU has had (perf's default until a
    /// `mux` step): a group takes at most one turn in per interval it runs.
    shortest_mux_ns: u64,
}

/// One read as the agent timed it: what its system call took, and when it
/// returned on the guest's clock (0: not known).
#[derive(Debug, Clone, Copy)]
struct ReadTiming {
    took_ns: u64,
    returned_ns: u64,
}

/// The reads of one PMU's batch as the agent timed them: what their
/// system calls took, and when the first began and the last returned on
/// the guest's clock.
#[derive(Debug, Clone, Copy, Default)]
struct MomentReads {
    took_ns: u64,
    /// The earliest start and the latest return among reads whose return
    /// is known (0: none is).
    first_ns: u64,
    last_ns: u64,
}

impl MomentReads {
    /// How far apart the moment's reads lie: from the first one's start to
    /// the last one's return, where the guest's clock says (which counts
    /// the agent preempted between two reads too), and never less than
    /// their system calls took.
    fn spread_ns(&self) -> u64 {
        let took = self.took_ns * u64::from(holds(Rule::ReadsTook));
        let spread =
            self.last_ns.saturating_sub(self.first_ns) * u64::from(holds(Rule::ReadsSpread));
        took.max(spread)
    }

    fn add(&mut self, read: ReadTiming) {
        self.took_ns = self.took_ns.saturating_add(read.took_ns);
        if read.returned_ns != 0 {
            let began = read.returned_ns.saturating_sub(read.took_ns);
            self.first_ns = if self.first_ns == 0 {
                began
            } else {
                self.first_ns.min(began)
            };
            self.last_ns = self.last_ns.max(read.returned_ns);
        }
    }
}

impl Model {
    pub fn new(shape: DeviceShape) -> Model {
        Model {
            shape,
            pmus: vec![PmuState::default(); shape.pmus as usize],
            events: BTreeMap::new(),
            offline: BTreeSet::new(),
            moment: 1,
            last_read: None,
            shortest_mux_ns: DEFAULT_MUX_INTERVAL_NS,
        }
    }

    /// A PMU's mux interval was set to `ms` (a scenario's `mux`).
    pub fn mux_interval(&mut self, ms: u64) {
        self.shortest_mux_ns = self.shortest_mux_ns.min(ms.max(1) * 1_000_000);
    }

    /// The next read's system call took `took_ns` and returned at
    /// `returned_ns` on the guest's clock (0: not known), the journal's
    /// measures: a PMU's reads one after the other lie as far apart as the
    /// first one's start from the last one's return (a guest that ran
    /// something else between two reads, or a vCPU its host did not run,
    /// spreads them), beyond [`READ_SKEW_NS`] each, which the rules across
    /// events allow for. A wait before an event is read again begins the
    /// next batch of reads: it is not in either one's spread.
    pub fn read_took(&mut self, took_ns: u64, returned_ns: u64) {
        let read = ReadTiming {
            took_ns,
            returned_ns,
        };
        self.last_read = Some((self.moment, read));
    }

    /// Whether perf may hold the event in ERROR (a pinned group left out),
    /// where a read returns nothing.
    pub fn may_be_in_error(&self, handle: Handle) -> bool {
        self.events.get(&handle).is_some_and(|e| e.may_be_in_error)
    }

    pub fn is_open(&self, handle: Handle) -> bool {
        self.events.contains_key(&handle)
    }

    pub fn is_parked(&self, pmu: u32) -> bool {
        self.pmus.get(pmu as usize).is_some_and(|p| p.parked)
    }

    /// Whether the PMU's placement is unknown (see [`Model::placement_unknown`]).
    pub fn placement_is_unknown(&self, pmu: u32) -> bool {
        self.pmus.get(pmu as usize).is_some_and(|p| p.unknown)
    }

    /// Parked, or maybe parked: a read shows at least the last fold and at
    /// most what landed since, and leaves the window open.
    fn maybe_parked(&self, pmu: u32) -> bool {
        self.pmus
            .get(pmu as usize)
            .is_some_and(|p| p.parked || (p.unknown && holds(Rule::UnknownPlacementMaybeParked)))
    }

    /// The leader of the event's group (itself for a leader).
    pub fn leader(&self, handle: Handle) -> Option<Handle> {
        self.events.get(&handle).map(|e| e.leader)
    }

    /// The members of the group led by `leader`, leader first, then the
    /// siblings in the order they were opened (perf's group read order).
    pub fn group(&self, leader: Handle) -> Vec<Handle> {
        let mut members: Vec<Handle> = self
            .events
            .iter()
            .filter(|(_, e)| e.leader == leader)
            .map(|(&h, _)| h)
            .collect();
        members.sort_by_key(|&h| (h != leader, h));
        members
    }

    /// Whether the event is enabled (its own state).
    pub fn is_enabled(&self, handle: Handle) -> bool {
        self.events.get(&handle).is_some_and(|e| e.enabled)
    }

    /// What an open of `spec` should give: `Ok` or the refusal.
    pub fn predict_open(&self, spec: &OpenSpec) -> Result<(), Refusal> {
        self.predict_open_on(spec, None)
    }

    /// [`Model::predict_open`] where the caller knows the CPU the device
    /// PMU of `spec` counts on now (`pmu_cpu`; `None`: not known). The
    /// model is told of moves, not of the CPUs they pick; a replay that
    /// follows the owners knows. perf binds a device event to its PMU's
    /// CPU, and refuses a sibling of a group on another CPU: a device
    /// event opened into a group of software events joins it only on the
    /// CPU the group was opened on.
    pub fn predict_open_on(&self, spec: &OpenSpec, pmu_cpu: Option<u32>) -> Result<(), Refusal> {
        if let Some(pmu) = spec.kind.pmu() {
            if self.is_parked(pmu) && holds(Rule::ParkedRefusesOpens) {
                return Err(Refusal::Parked);
            }
        }
        let Some(leader) = spec.group else {
            return Ok(());
        };
        let Some(l) = self.events.get(&leader) else {
            return match holds(Rule::GroupNeedsLeader) {
                true => Err(Refusal::NoLeader),
                false => Ok(()),
            };
        };
        if l.leader != leader && holds(Rule::SiblingCannotLead) {
            // A sibling cannot lead: perf refuses with EINVAL.
            return Err(Refusal::BadGroup);
        }
        // Checked before the group's CPU is known to be online: the device
        // event is bound to its PMU's CPU, which is.
        if let (Some(p), Some(at), None, Some(group_cpu)) =
            (spec.kind.pmu(), pmu_cpu, l.group_pmu, l.cpu)
        {
            let placed = !self.placement_is_unknown(p)
                && !self.pmus.get(p as usize).is_some_and(|s| s.moving);
            if placed && at != group_cpu && holds(Rule::DeviceJoinsSoftwareGroupOnItsCpu) {
                return Err(Refusal::BadGroup);
            }
        }
        // A group of software events lives in its CPU's context, which
        // takes no opens while that CPU is offline.
        if l.group_pmu.is_none()
            && l.cpu.is_some_and(|c| self.offline.contains(&c))
            && holds(Rule::OfflineCpuRefusesGroupOpens)
        {
            return Err(Refusal::Parked);
        }
        if (spec.pinned || spec.exclusive) && holds(Rule::OnlyLeadersPinOrExclude) {
            return Err(Refusal::BadGroup);
        }
        let members = self.group(leader);
        let mut pmu = spec.kind.pmu();
        let mut slots = u32::from(spec.kind.needs_slot());
        for h in &members {
            let k = self.events[h].spec.kind;
            match (pmu, k.pmu()) {
                (Some(a), Some(b)) if a != b && holds(Rule::GroupOnOnePmu) => {
                    return Err(Refusal::BadGroup)
                }
                (None, Some(b)) => pmu = Some(b),
                _ => {}
            }
            slots += u32::from(k.needs_slot());
        }
        // The device PMU refuses its own events; a software sibling joins
        // the group where it waits (patch 0006).
        if let Some(p) = spec.kind.pmu() {
            if self.is_parked(p) && holds(Rule::ParkedRefusesOpens) {
                return Err(Refusal::Parked);
            }
        }
        if slots > self.shape.slots && holds(Rule::GroupFitsSlots) {
            return Err(Refusal::BadGroup);
        }
        Ok(())
    }

    /// An open that succeeded under `handle`, on no CPU the model follows.
    pub fn open(&mut self, handle: Handle, spec: OpenSpec) {
        self.open_on(handle, spec, None);
    }

    /// An open that succeeded under `handle`, its `cpu` argument `cpu`
    /// (what a group of software events is bound to; see
    /// [`Model::cpu_offline`]).
    pub fn open_on(&mut self, handle: Handle, spec: OpenSpec, cpu: Option<u32>) {
        self.epoch();
        let leader = spec.group.unwrap_or(handle);
        // A device member takes its group to its device PMU's context.
        let brings = leader == handle || holds(Rule::MixedGroupOnItsDevicePmu);
        let had_pmu = self.events.get(&leader).and_then(|l| l.group_pmu);
        let group_pmu = had_pmu.or(spec.kind.pmu().filter(|_| brings));
        // perf's `move_group`: the members out, the siblings in before the
        // leader, which they cannot run without.
        let moved = had_pmu.is_none() && group_pmu.is_some() && leader != handle;
        let moment = self.moment;
        let restarts = moved && holds(Rule::MovedGroupStartsAsOpened);
        for (&h, e) in self.events.iter_mut().filter(|(_, e)| e.leader == leader) {
            e.group_pmu = group_pmu;
            if moved {
                e.steady_since = moment - 1;
                if h != leader && holds(Rule::MovedSiblingsWaitForTheirLeader) {
                    e.time_window.counting_all = false;
                }
            }
            // perf_event__state_init() on each member it installs again.
            if restarts {
                e.enabled = !e.spec.disabled;
                e.detached = false;
                e.may_be_in_error = false;
            }
        }
        let (cpu, detached) = match self.events.get(&leader) {
            Some(l) if leader != handle => (l.cpu, l.detached && !restarts),
            _ => (cpu, false),
        };
        self.events.insert(
            handle,
            EventState {
                spec,
                leader,
                group_pmu,
                cpu,
                enabled: !spec.disabled,
                detached,
                on: false,
                parked_on: false,
                frozen: false,
                frozen_own: false,
                waits_schedule_in: false,
                may_be_in_error: false,
                // Opened at the operation that began this moment.
                steady_since: self.moment - 1,
                unsure_at: self.moment,
                value: 0,
                shown: 0,
                value_window: Window::FRESH,
                gauge: Some(0),
                gauge_maybe: BTreeSet::new(),
                gauge_shown: 0,
                clock_base: Some(0),
                value_times: Some((0, 0)),
                flowed: false,
                times_read: false,
                enabled_ns: 0,
                running_ns: 0,
                time_window: Window::FRESH,
            },
        );
        // A software sibling opened into a parked group: put on while
        // parked, as an ENABLE there would.
        let parked_group = group_pmu.is_some_and(|p| self.maybe_parked(p));
        if let Some(e) = self.events.get_mut(&handle).filter(|_| parked_group) {
            e.parked_on = spec.kind.pmu().is_none();
        }
        self.note_scheduled();
    }

    /// A close; a leader's siblings become leaders of their own.
    pub fn close(&mut self, handle: Handle) {
        self.epoch();
        let Some(closed) = self.events.remove(&handle) else {
            return;
        };
        let moment = self.moment;
        for (&h, e) in self.events.iter_mut() {
            if e.leader == handle && holds(Rule::LeaderClosePromotes) {
                // Patch 0054 reschedules a device PMU at the close; a CPU's
                // context of software events is upstream's.
                let in_cpu_context =
                    e.group_pmu.is_none() || !holds(Rule::CloseReschedulesDevicePmu);
                e.waits_schedule_in |=
                    in_cpu_context && !closed.enabled && holds(Rule::PromotedSoftwareWaits);
                e.leader = h;
                e.steady_since = moment - 1;
            }
        }
        for p in &mut self.pmus {
            p.batch.times.remove(&handle);
            p.prev_batch.times.remove(&handle);
        }
        self.note_scheduled();
    }

    /// An ioctl that succeeded on `handle` (`group`: `PERF_IOC_FLAG_GROUP`).
    pub fn ioctl(&mut self, handle: Handle, ioctl: Ioctl, group: bool) {
        self.epoch();
        let Some(e) = self.events.get(&handle) else {
            return;
        };
        let targets = if group && holds(Rule::GroupIoctl) {
            self.group(e.leader)
        } else {
            vec![handle]
        };
        for h in targets {
            let Some(e) = self.events.get_mut(&h) else {
                continue;
            };
            // perf enables and disables a detached event through a call on
            // its CPU, which does nothing while that CPU is offline.
            let unreachable = e.detached
                && e.cpu.is_some_and(|c| self.offline.contains(&c))
                && holds(Rule::DetachedUnreachableWhileOffline);
            match ioctl {
                Ioctl::Enable | Ioctl::Disable if unreachable => {}
                Ioctl::Enable => {
                    e.enabled = true;
                    e.may_be_in_error = false;
                }
                // Exact also while parked: the driver freezes the slot at
                // the DISABLE (`SLOT_CTL_FROZEN`), see `note_scheduled`.
                Ioctl::Disable => e.enabled = false,
                // Exact also while parked (patch 0008's pmu::reset: the
                // driver restarts the slot nobody can read).
                Ioctl::Reset if !holds(Rule::Reset) => {}
                Ioctl::Reset => {
                    e.value = 0;
                    e.shown = 0;
                    e.value_window = Window::FRESH;
                    e.gauge = Some(0);
                    e.gauge_maybe.clear();
                    e.gauge_shown = 0;
                    e.clock_base = None;
                    e.value_times = None;
                }
            }
        }
        self.note_scheduled();
    }

    /// Events the model does not see (another process's, needing no slot)
    /// may be open on `pmu` from now on: an exclusive group there may be
    /// kept off by them.
    pub fn others_may_open(&mut self, pmu: u32) {
        self.epoch();
        if let Some(p) = self.pmus.get_mut(pmu as usize) {
            p.others = true;
        }
    }

    /// The PMU moved to another CPU: the epoch ends (a move is where the
    /// bugs live), and its groups' software members stood still in the
    /// transit.
    pub fn moved(&mut self, pmu: u32) {
        self.epoch();
        self.note_transit(pmu);
    }

    /// The PMU's events are moved (a move, a park, a placement): its
    /// groups' software members stand still in the transit.
    fn note_transit(&mut self, pmu: u32) {
        for e in self.events.values_mut() {
            if e.group_pmu == Some(pmu) && e.spec.kind == Kind::Software {
                e.time_window.transited = true;
            }
        }
    }

    /// From now on (`on`), or no more, the PMU moves at moments the model
    /// is not told, never parking (a thread of the guest takes its CPUs
    /// offline and back). A move changes nothing the model judges but
    /// one: a read that races it may lag. The driver reads a slot on the
    /// owner only, and from the new owner's `migrate_cpu` to the event's
    /// `add` there, a read runs on the CPU the event is leaving and shows
    /// the count as last folded; the slot counts on, and the first read
    /// after the `add` catches up. So while the PMU moves unseen, a
    /// counter's read is never below what it showed before nor above what
    /// landed since, and its window stays open (as for a read while
    /// parked) until a read once the moves are over; a gauge shows its
    /// last fold (what its last read showed, 0 after a RESET) or the
    /// occupancy now. And as in a park, perf does not reschedule the PMU
    /// when contention ends while it moves (patch 0010 waits for the
    /// move), so once its slot events did not all fit (or an exclusive
    /// group clashed), they are only maybe counting until the moves end.
    pub fn moves_unseen(&mut self, pmu: u32, on: bool) {
        self.epoch();
        self.note_transit(pmu);
        if let Some(p) = self.pmus.get_mut(pmu as usize) {
            p.moving = on;
            if !on && !p.parked {
                // The last move placed it: every event added on the owner.
                p.contended_in_park = false;
                p.clashed_in_park = false;
            }
        }
        self.note_scheduled();
    }

    /// `cpu` went offline. perf's `__perf_event_exit_context()` takes
    /// every event out of the CPU's context with `DETACH_GROUP`: each group
    /// of software events only that was opened on `cpu` (see
    /// [`Model::open_on`]) falls apart into single events, each `OFF`
    /// (disabled, its clocks and count still), and they stay out of the
    /// context when the CPU comes back: never scheduled again, an ENABLE
    /// makes them `INACTIVE` at most. Device events are not in a CPU's
    /// context: their PMU moves or parks (see [`Model::moved`],
    /// [`Model::park`]).
    ///
    /// A parked PMU whose events `cpu` held hands them to the first CPU
    /// still online: its groups' software members stand still in the
    /// transit (see [`PmuState::held_on`]).
    pub fn cpu_offline(&mut self, cpu: u32) {
        self.epoch();
        self.offline.insert(cpu);
        let to = self.first_online();
        for pmu in 0..self.pmus.len() as u32 {
            let p = &mut self.pmus[pmu as usize];
            if p.parked && p.held_on == Some(cpu) {
                p.held_on = Some(to);
                self.note_transit(pmu);
            }
        }
        let moment = self.moment;
        for (&h, e) in self.events.iter_mut() {
            // One detached already is in no context's list: untouched.
            if e.group_pmu.is_none()
                && e.cpu == Some(cpu)
                && !(e.detached && holds(Rule::DetachedStaysDetached))
                && holds(Rule::OfflineDetaches)
            {
                e.detached = true;
                e.enabled = false;
                e.leader = h;
                e.steady_since = moment - 1;
            }
        }
        self.note_scheduled();
    }

    /// `cpu` is online again: its detached events stay detached.
    pub fn cpu_online(&mut self, cpu: u32) {
        self.epoch();
        self.offline.remove(&cpu);
    }

    /// Whether `cpu` is offline, as the model was told.
    pub fn is_offline(&self, cpu: u32) -> bool {
        self.offline.contains(&cpu)
    }

    /// The first CPU online, of those the model was told about: where the
    /// core keeps a parked PMU's events.
    fn first_online(&self) -> u32 {
        (0u32..)
            .find(|c| !self.offline.contains(c))
            .unwrap_or_default()
    }

    /// None of the PMU's allowed CPUs is online any more: its events wait
    /// on the first CPU online.
    pub fn park(&mut self, pmu: u32) {
        self.epoch();
        self.note_transit(pmu);
        let moment = self.moment;
        let holding = self.first_online();
        let by_traffic = self.shape.park_stops_by_traffic(pmu);
        if let Some(p) = self.pmus.get_mut(pmu as usize) {
            p.parked = true;
            p.held_on = Some(holding);
            p.placed_moment = moment;
            p.parked_bytes.clear();
            // Without a line, any park may outlast the driver's time limit.
            p.stopped_in_park = !by_traffic && holds(Rule::PolledParkMayCountShort);
            p.contended_in_park = false;
            p.clashed_in_park = false;
        }
        self.note_scheduled();
    }

    /// Before each step: the counters of a parked PMU whose events the
    /// perf core may have stopped (`HeavyParkMayCountShort`) may miss what
    /// lands from then on, and a read while parked may show their
    /// `time_running` standing still.
    pub fn parks_checked(&mut self) {
        for (pmu, p) in (0u32..).zip(&self.pmus) {
            if !(p.parked && p.stopped_in_park) {
                continue;
            }
            for e in self.events.values_mut() {
                if matches!(e.spec.kind, Kind::Counter { pmu: q, .. } if q == pmu) {
                    e.value_window.lossy = true;
                    e.time_window.lossy = true;
                }
            }
        }
    }

    /// An allowed CPU of the PMU is back: it is placed again.
    pub fn unpark(&mut self, pmu: u32) {
        self.epoch();
        self.note_transit(pmu);
        let moment = self.moment;
        let Some(p) = self.pmus.get_mut(pmu as usize) else {
            return;
        };
        p.parked = false;
        p.held_on = None;
        p.placed_moment = moment;
        p.contended_in_park = false;
        p.clashed_in_park = false;
        let stopped = std::mem::take(&mut p.stopped_in_park);
        p.parked_bytes.clear();
        for e in self.events.values_mut() {
            if let Kind::Counter { pmu: q, .. } = e.spec.kind {
                // The perf core may have stopped the event and its running
                // time somewhere in the park (patch 0018): what landed after
                // that is not counted, shown as time not running.
                if q == pmu && stopped {
                    e.value_window.lossy = true;
                    e.time_window.lossy = true;
                }
            }
            // Placed: every event is added on the owner, and the
            // placement reads the frozen slots.
            if e.group_pmu == Some(pmu) && holds(Rule::PlacementEndsDoubt) {
                e.parked_on = false;
                e.frozen = false;
                e.frozen_own = false;
            }
        }
        self.note_scheduled();
    }

    /// The host did something between two operations that the model need
    /// not know of (read the CPUs and placements): reads either side of it
    /// are not at one moment.
    pub fn time_passes(&mut self) {
        self.epoch();
    }

    /// From now on, until [`Model::placement_seen`], the PMU may park and be
    /// placed again without the model being told (CPUs going offline and
    /// online behind the host's back, as rcutorture's onoff does). What the
    /// contract still guarantees across an unknown placement: a counter's
    /// read is never below what it showed before nor above what landed
    /// since (its window stays open, as in a park, and perf's times settle
    /// nothing in it); what a park may do to an event it may have done
    /// (put on while maybe parked, contended or clashed in a maybe-park:
    /// maybe counting until placed); a gauge shows one of the occupancies
    /// it may have seen; the stretch's traffic counts towards a wrap. What
    /// is counting either way (its groups fit) counts throughout, parked
    /// or placed, so it is exact again at the first read once the
    /// placement is seen.
    pub fn placement_unknown(&mut self, pmu: u32) {
        self.epoch();
        self.note_transit(pmu);
        let moment = self.moment;
        if let Some(p) = self.pmus.get_mut(pmu as usize) {
            p.unknown = true;
            p.placed_moment = moment;
        }
        self.note_scheduled();
    }

    /// The PMU's placement is observed again after an unknown stretch:
    /// parked, or placed. Placed, it is as after an unpark (every event
    /// added on the owner, the frozen slots read, a stop the stretch's
    /// traffic may have caused taken into account), so that the reads after
    /// it are exact again; parked, a park begins here.
    pub fn placement_seen(&mut self, pmu: u32, parked: bool) {
        // The stretch's last epoch folds as unknown.
        self.epoch();
        self.note_transit(pmu);
        let moment = self.moment;
        let Some(p) = self.pmus.get_mut(pmu as usize) else {
            return;
        };
        p.unknown = false;
        if parked {
            // Parked now, and maybe placed in between: no epoch of its own
            // (it would fold a placement nobody saw); what the stretch put
            // on, contended or landed stays with the park.
            if !p.parked {
                p.parked = true;
                p.placed_moment = moment;
            }
            self.note_scheduled();
        } else {
            p.parked = true;
            self.unpark(pmu);
        }
    }

    /// `bytes` of `event` for `rmid` landed in domain `pmu`, all within the
    /// current epoch.
    pub fn burst(&mut self, pmu: u32, event: u32, rmid: u32, bytes: u64) {
        let stop_bytes = self.shape.park_stop_bytes();
        self.moment += 1;
        let status = self.statuses();
        let want = Kind::Counter { pmu, event, rmid };
        for (h, e) in self.events.iter_mut() {
            e.time_window.passed(status[h]);
            if e.spec.kind == want {
                e.value_window.burst(counts_a_burst(e, status[h]), bytes);
            }
        }
        if let Some(p) = self.pmus.get_mut(pmu as usize) {
            if p.parked || p.unknown {
                p.landed_in_park(event, rmid, bytes, stop_bytes);
            }
        }
    }

    /// `bytes` of a steady flow of `event` for `rmid` landed in domain
    /// `pmu` between two operations (all within the current epoch): as a
    /// burst, counted in whole units.
    pub fn flowed(&mut self, pmu: u32, event: u32, rmid: u32, bytes: u64) {
        self.note_flowed(pmu, event, rmid);
        self.burst(pmu, event, rmid, bytes);
    }

    /// Whether each event counts a burst now: what [`Model::flowed_during`]
    /// compares across an operation.
    pub fn snapshot(&self) -> Snapshot {
        let status = self.statuses();
        Snapshot {
            counting: self
                .events
                .iter()
                .map(|(h, e)| (*h, counts_a_burst(e, status[h])))
                .collect(),
            parked: self.pmus.iter().map(|p| p.parked || p.unknown).collect(),
            moment: self.moment,
        }
    }

    /// `bytes` of a steady flow of `event` for `rmid` in domain `pmu`
    /// landed while one operation was carried out, `before` it taken just
    /// before: at some moment of the operation that the model cannot place.
    /// An event counting for sure before it and after it counts them all (a
    /// move or a park loses nothing); one that the operation started or
    /// stopped counting, or whose count it restarted (`restarted`: a RESET,
    /// a read, whose window begins at the operation), may show any part of
    /// them.
    pub fn flowed_during(
        &mut self,
        before: &Snapshot,
        (pmu, event, rmid): (u32, u32, u32),
        bytes: u64,
        restarted: &[Handle],
    ) {
        self.note_flowed(pmu, event, rmid);
        let status = self.statuses();
        let want = Kind::Counter { pmu, event, rmid };
        for (h, e) in self.events.iter_mut() {
            if e.spec.kind != want {
                continue;
            }
            let then = before.counting.get(h).copied().unwrap_or(Counting::No);
            let now = counts_a_burst(e, status[h]);
            // Not counting for sure at a moment inside the operation.
            let dipped = now == Counting::Yes
                && e.unsure_at >= before.moment
                && holds(Rule::FlowThroughAnUnsureMomentMayShow);
            let w = &mut e.value_window;
            if !holds(Rule::FlowDuringAnOperationMayShow) {
                // Taken as landed before the operation.
                w.burst(then, bytes);
            } else if then == now && !restarted.contains(h) && !dipped {
                w.burst(now, bytes);
            } else if then != Counting::No || now != Counting::No {
                w.over = w.over.wrapping_add(bytes);
            }
        }
        // Parked by it: they may have landed in the park, where they count
        // toward a lost wrap (parked before it: [`Model::flowing_in_park`]).
        let was_parked = before.parked.get(pmu as usize).copied().unwrap_or(false);
        let stop_bytes = self.shape.park_stop_bytes();
        if let Some(p) = self.pmus.get_mut(pmu as usize) {
            if !was_parked && (p.parked || p.unknown) {
                p.landed_in_park(event, rmid, bytes, stop_bytes);
            }
        }
    }

    /// `bytes` of a steady flow will land while the next operation is
    /// carried out: if the PMU is parked now, they may land in the park,
    /// before the operation places it, and count toward a lost wrap there.
    pub fn flowing_in_park(&mut self, (pmu, event, rmid): (u32, u32, u32), bytes: u64) {
        let stop_bytes = self.shape.park_stop_bytes();
        if let Some(p) = self.pmus.get_mut(pmu as usize) {
            if p.parked || p.unknown {
                p.landed_in_park(event, rmid, bytes, stop_bytes);
            }
        }
    }

    /// A read of `shown` begins while steady traffic flows: what lands
    /// while it runs, `bytes`, may show in it (and what it does not show,
    /// in the next read: [`Model::flowed_during`] with `shown` restarted).
    pub fn flowing_into_read(
        &mut self,
        shown: &[Handle],
        (pmu, event, rmid): (u32, u32, u32),
        bytes: u64,
    ) {
        let want = Kind::Counter { pmu, event, rmid };
        for h in shown {
            if let Some(e) = self.events.get_mut(h).filter(|e| e.spec.kind == want) {
                e.flowed = true;
                if holds(Rule::FlowDuringAnOperationMayShow) {
                    e.value_window.over = e.value_window.over.wrapping_add(bytes);
                }
            }
        }
    }

    fn note_flowed(&mut self, pmu: u32, event: u32, rmid: u32) {
        let want = Kind::Counter { pmu, event, rmid };
        for e in self.events.values_mut().filter(|e| e.spec.kind == want) {
            e.flowed = true;
        }
    }

    /// The occupancy of (`pmu`, `rmid`) is now `bytes`.
    pub fn occupancy(&mut self, pmu: u32, rmid: u32, bytes: u64) {
        self.epoch();
        if let Some(p) = self.pmus.get_mut(pmu as usize) {
            p.occupancy.insert(rmid, bytes);
        }
        self.note_scheduled();
    }

    /// What the next read of `handle` must show (`None`: not open).
    pub fn expect(&self, handle: Handle) -> Option<Expected> {
        let mut now = self.clone();
        now.fold();
        now.expect_folded(handle)
    }

    /// [`Model::expect`] once the current epoch is folded in.
    fn expect_folded(&self, handle: Handle) -> Option<Expected> {
        let e = self.events.get(&handle)?;
        let parked = e.spec.kind.pmu().is_some_and(|p| self.maybe_parked(p));
        let racing = e.spec.kind.pmu().is_some_and(|p| {
            self.pmus.get(p as usize).is_some_and(|p| p.moving) && holds(Rule::ReadRacingMoveMayLag)
        });
        let t = e.time_window;
        let enabled = if t.enabled_none {
            TimeRule::Unchanged
        } else {
            TimeRule::Grows
        };
        // A software member of a moving device group stands still in each
        // transit, perf's time_enabled does not.
        let transited = e.spec.kind == Kind::Software
            && (t.transited || e.group_pmu.is_some_and(|p| self.pmus[p as usize].moving))
            && holds(Rule::SoftwareStillInTransit);
        let running = if t.counting_none {
            TimeRule::Unchanged
        } else if t.counting_all && !t.lossy && !transited {
            TimeRule::AsEnabled
        } else {
            TimeRule::AtMostEnabled
        };
        let w = e.value_window;
        let hi = w.sure_bytes.wrapping_add(w.maybe_bytes);
        // What a count fed steady traffic lacks of a whole unit, at either
        // end of the window.
        let part_unit = match e.flowed && holds(Rule::CountInWholeUnits) {
            true => self.shape.unit_bytes.saturating_sub(1),
            false => 0,
        };
        let value = match e.spec.kind {
            // Nobody can read the counter while the PMU is parked: the
            // value is what the last fold left, and what landed since
            // shows once it is placed again.
            Kind::Counter { .. } if parked || racing => ValueRule::Parked {
                base: e.value,
                hi: hi.wrapping_add(w.over).wrapping_add(part_unit),
            },
            Kind::Counter { .. } => ValueRule::Bytes {
                base: e.value,
                lo: w.sure_bytes,
                hi,
                short: part_unit,
                over: w.over.wrapping_add(part_unit),
                settle_zero: !(w.times_younger && holds(Rule::ParkedReadSettlesNothing)),
                // Running whenever enabled: counting whenever enabled, also
                // across a DISABLE (no burst lands for it while disabled).
                settle_full: !(w.erred || w.times_younger && holds(Rule::ParkedReadSettlesNothing)),
                lossy: w.lossy,
            },
            // A gauge reads its register on the owner only: parked, it
            // shows what the last fold left.
            Kind::Gauge { .. } if parked && !holds(Rule::ParkedGaugeKeepsLastFold) => {
                ValueRule::Any
            }
            // Racing a move: the driver's last fold, as the last read
            // showed it, or now.
            Kind::Gauge { .. } if racing => match self.gauge_now(handle).or(e.gauge) {
                Some(now) if now != e.gauge_shown => ValueRule::GaugeEither {
                    shown: e.gauge_shown,
                    now,
                },
                Some(now) => ValueRule::Gauge(now),
                None => ValueRule::Any,
            },
            Kind::Gauge { .. } => match self.gauge_now(handle).filter(|_| !parked).or(e.gauge) {
                Some(bytes) => ValueRule::Gauge(bytes),
                None => ValueRule::Any,
            },
            Kind::Software => match e.clock_base {
                Some(base) => ValueRule::Clock {
                    base,
                    turn_ns: match t.any_maybe && holds(Rule::ClockTurnsMissTheirSchedule) {
                        true => self.shortest_mux_ns,
                        false => 0,
                    },
                },
                None => ValueRule::Any,
            },
        };
        Some(Expected {
            value,
            enabled,
            running,
            enabled_ns: e.enabled_ns,
            running_ns: e.running_ns,
        })
    }

    /// What the next read of `handle` must show, as [`Model::expect`];
    /// the model then takes a read that shows it (the least count, the
    /// clocks grown by 1 ms where they grow) as its baseline, so that a
    /// journal's reads can be foreseen without a guest.
    pub fn predict(&mut self, handle: Handle) -> Option<Expected> {
        let want = self.expect(handle)?;
        let value = match want.value {
            ValueRule::Bytes { base, lo, .. } => base.wrapping_add(lo),
            ValueRule::Parked { base, .. } => base,
            ValueRule::Gauge(bytes) | ValueRule::GaugeEither { now: bytes, .. } => bytes,
            ValueRule::Clock { base, .. } => base.wrapping_add(match want.running {
                TimeRule::Unchanged => 0,
                TimeRule::AsEnabled | TimeRule::Grows => 1_000_000,
                TimeRule::AtMostEnabled => 500_000,
            }),
            ValueRule::Any => {
                let e = &self.events[&handle];
                e.gauge_maybe.first().copied().unwrap_or(e.value)
            }
        };
        let d_en = if want.enabled == TimeRule::Unchanged {
            0
        } else {
            1_000_000
        };
        let d_run = match want.running {
            TimeRule::Unchanged => 0,
            TimeRule::AsEnabled | TimeRule::Grows => d_en,
            TimeRule::AtMostEnabled => d_en / 2,
        };
        let _ = self.read(
            handle,
            Observed {
                value,
                enabled: Some(want.enabled_ns + d_en),
                running: Some(want.running_ns + d_run),
            },
        );
        Some(want)
    }

    /// Checks one read of `handle` and takes it as the new baseline.
    pub fn read(&mut self, handle: Handle, seen: Observed) -> Vec<Mismatch> {
        self.fold();
        let Some(want) = self.expect_folded(handle) else {
            if !holds(Rule::ClosedUnreadable) {
                return vec![];
            }
            return vec![Mismatch {
                handle,
                field: Field::Value,
                expected: "a closed event to be unreadable".into(),
                got: "a read".into(),
            }];
        };
        let mut out = Vec::new();
        let mut mismatch = |field, expected: String, got: String| {
            out.push(Mismatch {
                handle,
                field,
                expected,
                got,
            })
        };
        // Times first: the value's derived checks use them.
        let times = seen.enabled.zip(seen.running);
        // Time passed while it was enabled (counting for sure) since a read
        // showed its times: perf's clock moved (a detached event's
        // time_enabled may stand still, a lossy park's running too).
        let (must_grow, must_run) = {
            let e = &self.events[&handle];
            let t = e.time_window;
            let since_read =
                e.times_read && !(e.detached && holds(Rule::DetachedClockMayStandStill));
            (
                since_read && t.enabled_passed && holds(Rule::EnabledMovesWhileEnabled),
                since_read
                    && t.counted_passed
                    && !t.lossy
                    && holds(Rule::RunningMovesWhileCounting),
            )
        };
        if let Some((en, run)) = times {
            let d_en = en.wrapping_sub(want.enabled_ns);
            let d_run = run.wrapping_sub(want.running_ns);
            if en < want.enabled_ns && holds(Rule::EnabledNeverBack) {
                mismatch(
                    Field::Enabled,
                    format!(">= {} (never decreases)", want.enabled_ns),
                    en.to_string(),
                );
            } else if want.enabled == TimeRule::Unchanged
                && d_en != 0
                && holds(Rule::EnabledStillWhileDisabled)
            {
                mismatch(
                    Field::Enabled,
                    format!("unchanged at {} (disabled since)", want.enabled_ns),
                    format!("+{d_en}"),
                );
            } else if must_grow && d_en == 0 {
                mismatch(
                    Field::Enabled,
                    format!("> {} (enabled while time passed)", want.enabled_ns),
                    "+0".into(),
                );
            }
            if run < want.running_ns && holds(Rule::RunningNeverBack) {
                mismatch(
                    Field::Running,
                    format!(">= {} (never decreases)", want.running_ns),
                    run.to_string(),
                );
            } else if want.running == TimeRule::Unchanged
                && d_run != 0
                && holds(Rule::RunningStillWhileNotCounting)
            {
                mismatch(
                    Field::Running,
                    format!("unchanged at {} (not counting since)", want.running_ns),
                    format!("+{d_run}"),
                );
            } else if want.running == TimeRule::AsEnabled
                && d_run != d_en
                && holds(Rule::RunningAsEnabledWhileCounting)
            {
                mismatch(
                    Field::Running,
                    format!("+{d_en}, as time_enabled (counting throughout)"),
                    format!("+{d_run}"),
                );
            } else if d_run > d_en && holds(Rule::RunningAtMostEnabled) {
                mismatch(
                    Field::Running,
                    format!("<= +{d_en} (time_enabled's growth)"),
                    format!("+{d_run}"),
                );
            } else if must_run && d_run == 0 {
                mismatch(
                    Field::Running,
                    format!("> {} (counting while time passed)", want.running_ns),
                    "+0".into(),
                );
            }
        }
        let deltas = times.map(|(en, run)| {
            (
                en.wrapping_sub(want.enabled_ns),
                run.wrapping_sub(want.running_ns),
            )
        });
        let mut keep_window = false;
        // The growth of the count from `base`: a count below it wraps to
        // more than ever landed (a model without the rule that counts never
        // go back takes it as no growth).
        let back = |base: u64| match holds(Rule::CountNeverBack) {
            true => seen.value.wrapping_sub(base),
            false => seen.value.saturating_sub(base),
        };
        let shown = self.events[&handle].shown;
        // perf's times since the value's baseline, where both are known:
        // they show a park's shortfall also when reads while parked reset
        // the times' baseline since.
        let value_deltas = match self.events[&handle].value_times {
            Some((en0, run0)) if holds(Rule::ShortfallSinceTheValueBaseline) => {
                times.map(|(en, run)| (en.wrapping_sub(en0), run.wrapping_sub(run0)))
            }
            _ => deltas,
        };
        let gauge_maybe = &self.events[&handle].gauge_maybe;
        match want.value {
            ValueRule::Parked { base, hi } => {
                let got = back(base);
                let floor = match holds(Rule::ShownNeverTakenBack) {
                    true => base.max(shown),
                    false => base,
                };
                if seen.value < floor && holds(Rule::CountNeverBack) {
                    mismatch(
                        Field::Value,
                        format!(">= {floor} (counts never go back)"),
                        seen.value.to_string(),
                    );
                } else if got > hi && holds(Rule::ParkedAtMostLanded) {
                    mismatch(
                        Field::Value,
                        format!("<= +{hi} (parked or racing a move: at most what landed)"),
                        format!("+{got}"),
                    );
                }
                keep_window = true;
            }
            ValueRule::Bytes {
                base,
                lo,
                hi,
                short,
                over,
                settle_zero,
                settle_full,
                lossy,
            } => {
                let got = back(base);
                let short_ok = lossy && value_deltas.is_some_and(|(en, run)| run < en);
                // A read without times claims no running: it may show the
                // count of a park stopped at its limit short, as perf's
                // times, had it asked, would show.
                let short_unshown_ok =
                    lossy && times.is_none() && holds(Rule::ShortfallUnshownWithoutTimes);
                // `target` give or take the steady traffic not placed.
                let near = |target: u64| {
                    (target.saturating_sub(short)..=target.saturating_add(over)).contains(&got)
                };
                let mut range = if lo == hi {
                    format!("+{lo}")
                } else {
                    format!("+{lo}..=+{hi} (multiplexed)")
                };
                if short > 0 || over > 0 {
                    range += &format!(" -{short}/+{over} (steady traffic)");
                }
                if seen.value < base && !short_ok && holds(Rule::CountNeverBack) {
                    mismatch(
                        Field::Value,
                        format!(">= {base} (counts never go back without RESET)"),
                        seen.value.to_string(),
                    );
                } else if seen.value < shown && !short_ok && holds(Rule::ShownNeverTakenBack) {
                    mismatch(
                        Field::Value,
                        format!(
                            ">= {shown} (shown while parked; counts never go back without RESET)"
                        ),
                        seen.value.to_string(),
                    );
                } else if (got > hi.saturating_add(over) && holds(Rule::CountAtMostLanded))
                    || (got < lo.saturating_sub(short)
                        && !short_ok
                        && !short_unshown_ok
                        && holds(Rule::CountAtLeastSure))
                {
                    mismatch(Field::Value, range, format!("+{got}"));
                } else if let (Some((d_en, d_run)), true) = (deltas, lo < hi) {
                    // perf's own times settle a multiplexed window. The
                    // time window holds the value window (a read without
                    // times resets only the latter), so what they say of
                    // the longer one holds for the shorter; unless a parked
                    // read reset the times and not the value.
                    if settle_zero
                        && d_run == 0
                        && !near(lo)
                        && holds(Rule::ZeroRunningCountedNothing)
                    {
                        mismatch(
                            Field::Value,
                            format!("+{lo} (time_running did not grow)"),
                            format!("+{got}"),
                        );
                    } else if settle_full
                        && d_run == d_en
                        && !near(hi)
                        && !short_ok
                        && holds(Rule::FullRunningCountedAll)
                    {
                        mismatch(
                            Field::Value,
                            format!("+{hi} (time_running grew as time_enabled)"),
                            format!("+{got}"),
                        );
                    }
                }
            }
            ValueRule::GaugeEither { shown, now } => {
                if seen.value != shown
                    && seen.value != now
                    && holds(Rule::RacingGaugeShowsLastOrNow)
                {
                    mismatch(
                        Field::Value,
                        format!(
                            "{shown} or {now} (racing a move: its last read, or the occupancy now)"
                        ),
                        seen.value.to_string(),
                    );
                }
            }
            ValueRule::Gauge(want) => {
                if seen.value != want && holds(Rule::GaugeReadsOccupancy) {
                    mismatch(
                        Field::Value,
                        format!("{want} (the occupancy when it last counted)"),
                        seen.value.to_string(),
                    );
                }
            }
            ValueRule::Clock { base, turn_ns } => {
                if let Some((_, d_run)) = deltas {
                    let got = seen.value.wrapping_sub(base);
                    let turns = d_run.checked_div(turn_ns).map_or(0, |n| n + 1);
                    let slack = CLOCK_SLACK_NS + d_run / 10 + turns * CLOCK_TURN_SLACK_NS;
                    if d_run.saturating_sub(got) > slack && holds(Rule::ClockCountsItsRunning) {
                        mismatch(
                            Field::Value,
                            format!(
                                "at least +{d_run} less {slack} (a cpu-clock counts its own \
                                 running time)"
                            ),
                            format!("+{got}"),
                        );
                    }
                }
            }
            ValueRule::Any
                if !gauge_maybe.is_empty()
                    && !gauge_maybe.contains(&seen.value)
                    && holds(Rule::MultiplexedGaugeSawOne) =>
            {
                mismatch(
                    Field::Value,
                    format!("one of {gauge_maybe:?} (an occupancy it may have seen last)"),
                    seen.value.to_string(),
                );
            }
            ValueRule::Any => {}
        }
        let e = self.events.get_mut(&handle).expect("expect() found it");
        if matches!(e.spec.kind, Kind::Gauge { .. }) {
            e.gauge_shown = seen.value;
        }
        if let Some((en, run)) = times {
            e.times_read = true;
            e.enabled_ns = en;
            e.running_ns = run;
            e.time_window = Window::FRESH;
        }
        if matches!(e.spec.kind, Kind::Software) && !keep_window {
            e.clock_base = times.map(|_| seen.value);
        }
        if keep_window {
            e.value_window.times_younger |= times.is_some();
            e.shown = e.shown.max(seen.value);
        } else {
            e.value = seen.value;
            e.shown = 0;
            e.value_window = Window::FRESH;
            e.value_times = times;
            if matches!(e.spec.kind, Kind::Gauge { .. }) {
                e.gauge = Some(seen.value);
                e.gauge_maybe.clear();
            }
        }
        if let Some((en, run)) = times {
            out.extend(self.across_events(handle, en, run));
        }
        out
    }

    /// The rules across the events of one device PMU, over the window
    /// between two moments at which they were all read, for the events
    /// enabled with an enabled leader throughout it (the skew of reads
    /// issued one after the other allowed for):
    /// - at most `slots` counters run at once: `Σ Δrunning <= slots ×
    ///   Δenabled` over its `mbm_*` events;
    /// - an exclusive group runs alone: its `Δrunning` plus any other
    ///   flexible group's is at most `Δenabled` (pinned ones may run beside it);
    /// - a group's members run together: equal `Δrunning` for its `mbm_*`
    ///   members, in a window without a park or a placement;
    /// - each grew `time_enabled` as the others did (reported once, at the
    ///   read of the one that differs from an event read before it).
    fn across_events(&mut self, handle: Handle, en: u64, run: u64) -> Vec<Mismatch> {
        let Some(p) = self.events.get(&handle).and_then(|e| e.group_pmu) else {
            return vec![];
        };
        let moment = self.moment;
        let pmu = &mut self.pmus[p as usize];
        // An event read again with nothing but time between (a scenario's
        // `wait`) begins the next moment's reads: the window is the time
        // between its two reads, not the one before both, and the time
        // waited is not how far apart the reads of either moment lay.
        let again = pmu.batch.moment == moment && pmu.batch.times.contains_key(&handle);
        if pmu.batch.moment != moment || (again && holds(Rule::TimeAloneIsAMoment)) {
            let reads = match again && !holds(Rule::WaitNotInTheSpread) {
                true => pmu.batch.reads,
                false => MomentReads::default(),
            };
            if !pmu.batch.times.is_empty() {
                pmu.prev_batch = std::mem::take(&mut pmu.batch);
            }
            pmu.batch = Batch {
                moment,
                times: BTreeMap::new(),
                reads,
            };
        }
        pmu.batch.times.insert(handle, (en, run));
        // A group read's members are one read: its timing counts once.
        if let Some((_, read)) = self.last_read.take().filter(|&(m, _)| m == moment) {
            pmu.batch.reads.add(read);
        }
        let read_skew = if holds(Rule::ReadSkew) {
            READ_SKEW_NS
        } else {
            0
        };
        let pmu = &self.pmus[p as usize];
        let since = pmu.prev_batch.moment;
        // (handle, leader, mbm_*, Δenabled, Δrunning)
        let common: Vec<(Handle, Handle, bool, u64, u64)> = pmu
            .batch
            .times
            .iter()
            .filter_map(|(h, &(en, run))| {
                let &(en0, run0) = pmu.prev_batch.times.get(h)?;
                let e = self.events.get(h)?;
                let steady = e.steady_since < since || !holds(Rule::SteadyEventsOnly);
                (e.group_pmu == Some(p) && steady).then_some((
                    *h,
                    e.leader,
                    e.spec.kind.needs_slot(),
                    en.saturating_sub(en0),
                    run.saturating_sub(run0),
                ))
            })
            .collect();
        if common.len() < 2 {
            return vec![];
        }
        let mut out = Vec::new();
        let mut mismatch = |expected: String, got: String| {
            out.push(Mismatch {
                handle,
                field: Field::Running,
                expected,
                got,
            })
        };
        let names = |set: &mut dyn Iterator<Item = Handle>| {
            set.map(|h| h.to_string()).collect::<Vec<_>>().join(", ")
        };
        let wall = common.iter().map(|c| c.3).max().unwrap_or(0);
        let counters: Vec<_> = common.iter().filter(|c| c.2).collect();
        let sum: u64 = counters.iter().map(|c| c.4).sum();
        // Each read's skew, and how far apart the two moments' reads
        // measurably lay beyond it (a read's system call on a loaded
        // guest, a vCPU preempted between two reads).
        let took = pmu.prev_batch.reads.spread_ns() + pmu.batch.reads.spread_ns();
        let skew = common.len() as u64 * read_skew + took;
        if sum > u64::from(self.shape.slots) * wall + skew && holds(Rule::SlotsBound) {
            mismatch(
                format!(
                    "<= {} × +{wall} (at most {} counters run at once)",
                    self.shape.slots, self.shape.slots
                ),
                format!(
                    "Σ +{sum} over events {}",
                    names(&mut counters.iter().map(|c| c.0))
                ),
            );
        }
        let mut groups: BTreeMap<Handle, (u64, u64)> = BTreeMap::new();
        for c in &common {
            let g = groups.entry(c.1).or_insert((u64::MAX, 0));
            if c.2 {
                *g = (g.0.min(c.4), g.1.max(c.4));
            } else {
                g.1 = g.1.max(c.4);
            }
        }
        for (&x, &(_, rx)) in &groups {
            if !self.events.get(&x).is_some_and(|e| e.spec.exclusive) {
                continue;
            }
            // perf keeps an exclusive group from sharing the PMU with
            // flexible groups only (`group_can_go_on()` looks at the list
            // of its own kind): pinned ones go on first and stay beside it.
            let flexible = |g: Handle| {
                !self.events.get(&g).is_some_and(|e| e.spec.pinned)
                    || !holds(Rule::PinnedBesideExclusive)
            };
            if let Some((&g, &(_, rg))) = groups
                .iter()
                .filter(|(&g, _)| g != x && flexible(g))
                .max_by_key(|(_, r)| r.1)
            {
                if rx + rg > wall + 2 * read_skew + took && holds(Rule::ExclusiveRunsAlone) {
                    mismatch(
                        format!("+{rx} and +{rg} to add up to <= +{wall} (an exclusive group runs alone)"),
                        format!("exclusive group {x} +{rx}, group {g} +{rg}"),
                    );
                }
            }
        }
        let placed =
            (!pmu.parked && pmu.placed_moment < since) || !holds(Rule::MembersApartAcrossParks);
        for (&g, &(lo, hi)) in &groups {
            if placed
                && lo != u64::MAX
                && hi - lo > read_skew + took
                && holds(Rule::MembersRunTogether)
            {
                mismatch(
                    format!("equal time_running for group {g}'s counters (members run together)"),
                    format!("+{lo} to +{hi}"),
                );
            }
        }
        // Enabled throughout the same window: the same growth of
        // time_enabled (the context's clock), each read's skew allowed for
        // at both ends.
        // Not for pinned groups: perf puts one that does not fit in ERROR,
        // where its clock stops, a state the model does not know (it keeps
        // such a group enabled, maybe counting).
        let unpinned = |c: &&(Handle, Handle, bool, u64, u64)| {
            !self.events.get(&c.1).is_some_and(|l| l.spec.pinned)
                || !holds(Rule::PinnedClockMayStop)
        };
        let mut unpinned_common = common.iter().filter(unpinned);
        if let Some(&(_, _, _, mine, _)) = unpinned_common.clone().find(|c| c.0 == handle) {
            let other = unpinned_common.find(|c| c.3.abs_diff(mine) > 2 * skew);
            if let Some(other) = other.filter(|_| holds(Rule::EqualEnabledGrowth)) {
                out.push(Mismatch {
                    handle,
                    field: Field::Enabled,
                    expected: format!(
                        "+{} as event {} (both enabled throughout the window)",
                        other.3, other.0
                    ),
                    got: format!("+{mine}"),
                });
            }
        }
        out
    }

    /// What a gauge that is counting now reads.
    fn gauge_now(&self, handle: Handle) -> Option<u64> {
        let e = self.events.get(&handle)?;
        let Kind::Gauge { pmu, rmid } = e.spec.kind else {
            return None;
        };
        match self.statuses().get(&handle)?.counting {
            Counting::Yes => Some(self.occupancy_now(pmu, rmid)),
            _ => None,
        }
    }

    fn occupancy_now(&self, pmu: u32, rmid: u32) -> u64 {
        self.shape.gauge_bytes(
            self.pmus[pmu as usize]
                .occupancy
                .get(&rmid)
                .copied()
                .unwrap_or(0),
        )
    }

    /// Ends the current epoch at an operation.
    fn epoch(&mut self) {
        self.fold();
        let status = self.statuses();
        for (h, e) in self.events.iter_mut() {
            e.time_window.passed(status[h]);
        }
        self.moment += 1;
    }

    /// Folds every event's state in the current epoch into its windows.
    fn fold(&mut self) {
        let status = self.statuses();
        let moment = self.moment;
        let parked: Vec<bool> = self.pmus.iter().map(|p| p.parked).collect();
        let unknown: Vec<bool> = self
            .pmus
            .iter()
            .map(|p| p.unknown && holds(Rule::UnknownGaugeMaybeFolded))
            .collect();
        for (h, e) in self.events.iter_mut() {
            let s = status[h];
            e.value_window.epoch(s.enabled, s.counting);
            e.time_window.epoch(s.enabled, s.counting);
            e.value_window.erred |= s.erred;
            if !s.enabled {
                e.steady_since = moment;
            }
            if counts_a_burst(e, s) != Counting::Yes {
                e.unsure_at = moment;
            }
        }
        // A gauge that counts takes the occupancy at its next fold; the
        // occupancy only changes at an operation, so the epoch's is the one.
        // One that may have been folded or not: unknown, one of its last
        // fold and the occupancies it may have seen. A gauge reads its
        // register on the owner only: parked, nobody folds it; parked
        // when its placement became unknown, it may have been placed and
        // folded since.
        let gauges: Vec<(Handle, Counting, u64)> = self
            .events
            .iter()
            .filter_map(|(&h, e)| match (e.spec.kind, status[&h].counting) {
                // Maybe parked, or maybe placed: maybe folded.
                (Kind::Gauge { pmu, rmid }, c)
                    if c != Counting::No && (!parked[pmu as usize] || unknown[pmu as usize]) =>
                {
                    let c = if unknown[pmu as usize] {
                        Counting::Maybe
                    } else {
                        c
                    };
                    Some((h, c, self.occupancy_now(pmu, rmid)))
                }
                _ => None,
            })
            .collect();
        for (h, c, v) in gauges {
            let Some(e) = self.events.get_mut(&h) else {
                continue;
            };
            if c == Counting::Yes {
                e.gauge = Some(v);
                e.gauge_maybe.clear();
            } else {
                e.gauge_maybe.extend(e.gauge.take());
                e.gauge_maybe.insert(v);
            }
        }
    }

    /// After an operation: which events it put on or took off a parked
    /// PMU (see `EventState::parked_on` and `frozen`), and which parked
    /// PMUs are contended.
    fn note_scheduled(&mut self) {
        let status = self.statuses();
        let parked: Vec<bool> = self.pmus.iter().map(|p| p.parked || p.unknown).collect();
        for (h, e) in self.events.iter_mut() {
            let on = status[h].on;
            let in_park = e.spec.kind.pmu().is_some_and(|p| parked[p as usize]);
            if in_park && on && !e.on && !(e.frozen_own && e.enabled && holds(Rule::OwnEnableThaws))
            {
                e.parked_on = true;
            }
            if in_park && !on && e.on && e.spec.kind.needs_slot() {
                e.frozen = true;
                e.frozen_own = !e.enabled;
            }
            if on {
                e.frozen = false;
                e.frozen_own = false;
            }
            e.on = on;
            e.may_be_in_error |= status[h].pinned_left_out && holds(Rule::PinnedLeftOutMayErr);
        }
        let fit = self.schedule().1;
        for (p, f) in self.pmus.iter_mut().zip(fit) {
            // A moving PMU is not rescheduled when contention ends either
            // (patch 0010 waits for the move): as in a park.
            let moving = p.moving && holds(Rule::MovingContentionIsMaybe);
            p.contended_in_park |= (p.parked || p.unknown || moving) && !f.all;
            p.clashed_in_park |= (p.parked || p.unknown || moving) && f.clash;
        }
    }

    /// Per event: its status in the current epoch.
    fn statuses(&self) -> BTreeMap<Handle, Status> {
        self.schedule().0
    }

    /// [`Model::statuses`], and per PMU whether all its groups fit now.
    fn schedule(&self) -> (BTreeMap<Handle, Status>, Vec<Fit>) {
        // The groups on each device PMU (a mixed group is on its device PMU).
        let group_pmu: BTreeMap<Handle, Option<u32>> = self
            .events
            .values()
            .map(|e| (e.leader, e.group_pmu))
            .collect();
        // Gauges only, as the group is now: perf never multiplexes it (patch
        // 0009's PERF_EV_CAP_NO_COUNTER: "a group made only of such events
        // always goes on"), also when it became so by closes. A software
        // member takes that away (and a device member takes
        // PERF_EV_CAP_SOFTWARE away from a software group, for good).
        let gauges_only = |l: Handle| {
            self.events
                .values()
                .filter(|e| e.leader == l)
                .all(|e| matches!(e.spec.kind, Kind::Gauge { .. }))
        };
        let leader_on = |l: Handle| self.events.get(&l).is_some_and(|e| e.enabled);
        // Perf's effective state: a sibling is off with its leader.
        let effective = |l: Handle| leader_on(l) || !holds(Rule::EffectiveEnabled);
        // Slots each group with an enabled leader needs now.
        let need = |l: Handle| -> u32 {
            self.events
                .values()
                .filter(|e| e.leader == l && e.enabled && e.spec.kind.needs_slot())
                .count() as u32
        };
        // Slots frozen in a park: they keep their place.
        let frozen = |pmu: u32| -> u32 {
            let held = self
                .events
                .values()
                .filter(|e| e.frozen && e.spec.kind.pmu() == Some(pmu))
                .count() as u32;
            held * u32::from(holds(Rule::FrozenSlotKeepsItsPlace))
        };
        let mut on: BTreeMap<Handle, Counting> = BTreeMap::new();
        // Leaders of pinned groups that do not all fit together now.
        let mut left_out: BTreeSet<Handle> = BTreeSet::new();
        let mut fit = Vec::new();
        for pmu in 0..self.shape.pmus {
            let groups: Vec<Handle> = group_pmu
                .iter()
                .filter(|(&l, &p)| p == Some(pmu) && leader_on(l))
                .map(|(&l, _)| l)
                .collect();
            let excl = |l: Handle| {
                self.events[&l].spec.exclusive && holds(Rule::ExclusiveSharesWithNobody)
            };
            let pinned = |l: Handle| self.events[&l].spec.pinned;
            let held = frozen(pmu);
            // Whether a set of groups can all be on together.
            let fits = |set: &[Handle]| {
                let slots: u32 = set.iter().map(|&l| need(l)).sum();
                slots + held <= self.shape.slots && !(set.len() > 1 && set.iter().any(|&l| excl(l)))
            };
            let others = usize::from(
                self.pmus[pmu as usize].others && holds(Rule::UnseenEventsMayKeepExclusiveOff),
            );
            let clash = groups.len() + others > 1 && groups.iter().any(|&l| excl(l));
            let all_fit = fits(&groups) && !clash;
            fit.push(Fit {
                all: all_fit,
                clash,
            });
            let pinned_set: Vec<Handle> = groups.iter().copied().filter(|&l| pinned(l)).collect();
            let pinned_fit = fits(&pinned_set);
            if !pinned_fit {
                left_out.extend(pinned_set.iter().copied());
            }
            for &l in &groups {
                let c = if (all_fit && holds(Rule::UncontendedCounts))
                    || (!clash && gauges_only(l) && holds(Rule::GaugesOnlyAlwaysOn))
                    || (pinned(l) && pinned_fit && holds(Rule::PinnedThatFitRun))
                {
                    Counting::Yes
                } else {
                    Counting::Maybe
                };
                on.insert(l, c);
            }
        }
        let status = self
            .events
            .iter()
            .map(|(&h, e)| {
                let group_on = match group_pmu.get(&e.leader).copied().flatten() {
                    None if e.detached && holds(Rule::DetachedNeverScheduled) => Counting::No,
                    None if holds(Rule::SoftwareAlwaysOn) => Counting::Yes,
                    None => Counting::Maybe,
                    Some(_) => on.get(&e.leader).copied().unwrap_or(Counting::No),
                };
                let enabled = e.enabled && effective(e.leader);
                let mut counting = if enabled { group_on } else { Counting::No };
                // perf's ERROR is the leader's state; it lasts past the
                // clash, until the leader's own ENABLE.
                let erred = enabled
                    && self
                        .events
                        .get(&e.leader)
                        .is_some_and(|l| l.may_be_in_error)
                    && holds(Rule::ErrorStopsTheWholeGroup);
                if erred && counting == Counting::Yes {
                    counting = Counting::Maybe;
                }
                let is_on = counting != Counting::No;
                // Put on while parked: not added for sure until placed. A
                // parked gauge counts on (its clocks run, it needs no
                // slot), but `fold` leaves its value at the last fold.
                // Maybe parked counts as parked: what a park may have
                // done to it, it may have.
                let parked = e.spec.kind.pmu().is_some_and(|p| self.maybe_parked(p));
                let parked_on = e.parked_on && holds(Rule::PutOnWhileParkedIsMaybe);
                if counting == Counting::Yes && (parked_on || e.waits_schedule_in) {
                    counting = Counting::Maybe;
                }
                // A parked PMU contended during this park: see
                // `PmuState::contended_in_park` (its slot events) and
                // `clashed_in_park` (all its events).
                let pmu_state = e
                    .spec
                    .kind
                    .pmu()
                    .and_then(|p| Some((self.pmus.get(p as usize)?, *fit.get(p as usize)?)));
                let moving = pmu_state
                    .is_some_and(|(state, _)| state.moving && holds(Rule::MovingContentionIsMaybe));
                if let (Some((state, now)), true) = (pmu_state, parked || moving) {
                    let clashed =
                        (state.clashed_in_park || now.clash) && holds(Rule::ClashedParkIsMaybe);
                    let contended =
                        (state.contended_in_park || !now.all) && holds(Rule::ContendedParkIsMaybe);
                    let spared =
                        !e.spec.kind.needs_slot() && holds(Rule::SlotContentionSparesGauges);
                    if counting == Counting::Yes && (clashed || (contended && !spared)) {
                        counting = Counting::Maybe;
                    }
                }
                (
                    h,
                    Status {
                        enabled,
                        on: is_on,
                        counting,
                        pinned_left_out: enabled && left_out.contains(&e.leader),
                        erred,
                    },
                )
            })
            .collect();
        (status, fit)
    }
}

/// Whether `e`, of status `s`, counts a burst on its counter: a slot a
/// DISABLE froze while parked counts on in a model without that rule.
fn counts_a_burst(e: &EventState, s: Status) -> Counting {
    match s.counting {
        Counting::No if e.frozen && !holds(Rule::FrozenSlotStops) => Counting::Maybe,
        c => c,
    }
}

#[cfg(test)]
mod tests;
