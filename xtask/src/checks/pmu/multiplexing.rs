//! Stays in Rust: it judges scaled estimates over a rate window against the
//! device's slot-level record, which the model leaves to perf.
//!
//! More events than slots: perf multiplexes them; each raw count is exactly
//! what its slots counted up to their last reads (the device's slot-level
//! truth replayed against its trace), and each scaled count is within 5 %
//! of the truth once what perf's rotations moved (measured in the same
//! trace) is taken out.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Result};
use perfbed_device::regs::Event;
use perfbed_device::{Assignments, TraceAccesses};

use super::context::{Ctx, MIB, TIMES};
use crate::checks::slot_credit::{self, Shape};
use crate::checks::Check;
use crate::guest::{pmu_name, Guest};

/// 5. More events than slots under a steady rate: perf multiplexes, and
///    - each event's raw count is exactly the sum, over the slot
///      assignments that served it, of what its slot had counted at the
///      last read of it during the assignment (`checks::slot_credit`: the
///      device's `assignments` replayed against its trace). That holds
///      however unevenly the guest ran, and is what says the driver counts
///      right across rotations: a count not brought up to date before its
///      slot is taken, or an incoming event's first counts dropped, is off;
///    - each count scaled over the traffic window is within 5 % of the
///      truth once the rotations' effect is taken out. perf's scaling
///      assumes that an event's time_running is the time it counted, and
///      each rotation breaks that by its own length (from its first `del`
///      read to the incoming slot write, see below and
///      `slot_credit::rotation_bias`): negligible while the guest runs
///      evenly, but a guest stopped inside a rotation (in the box, 0.35 s
///      between two register accesses of one rotation was seen: L1's one
///      CPU or QEMU's TCG thread taken from the vCPU, which cannot be
///      interrupted there) hands the whole stop to the incoming event's
///      time_running while no slot counts for it (-16.6 % measured, -16.1 %
///      predicted from the trace). The device's trace says how long each
///      rotation took, so the check predicts each event's error from it and
///      judges what is left; a driver that miscounts has its raw count off,
///      one that misaccounts time has the rest off.
///
/// How the estimate is taken, and what it may be off by:
/// - It is scaled over a window, as `perf stat -I` scales an interval: from
///   the deltas of value, time_enabled and time_running between two reads,
///   both while the traffic flows, so that the rate is the same all through
///   the window as the estimate assumes (in the box the requests around the
///   traffic took 0.3-0.5 s, in which an event ran more or less than its
///   share: up to +11 % off). The truth is the rate times the event's
///   time_enabled over the window (its own: the reads of one request come
///   one after another, in the box up to 0.6 s apart). Scaling by an event's whole life (open to read) would assume it
///   ran the same share of the traffic window as of that life, and perf's
///   rotation does not share the slots evenly: some events run a larger
///   share than others, and which depends on where a window starts and ends.
/// - The rotation gap biases every estimate low. `perf_rotate_context()`
///   updates the context time once, before the sched-out, and the sched-in
///   stamps the incoming event with that time, so perf accounts it as
///   running from before the rotation began; the device counts for it only
///   from the slot write in its `add`, after every scheduled event's `del`
///   has read its counter. The outgoing event is credited up to its own
///   `del` read, the first of them. Each event comes in once a cycle and
///   stays in for `slots` intervals, so its estimate is low by about
///   gap / (slots x interval), the gap being the time from the outgoing
///   `del` read to the incoming slot write (4 register reads, then the
///   write). Measured from the device trace (`cargo xtask run --plot`), with
///   the figures predicting each event's error to within ~1 %: under QEMU
///   TCG an access takes ~5 us and the gap ~60 us (0.4 % at 4 ms); in the
///   box every access is a VM exit (150-250 us) and the guest's vCPU shares
///   one L1 CPU, so the gap is ~1 ms median, 1.7-2 ms mean, tens of ms at
///   worst (more under load): 4-8 % at perf's default 4 ms. That is a
///   property of multiplexing a device whose registers cost an exit each,
///   not of the driver's counting, which this check is for; so it sets the
///   PMU's mux interval (sysfs `perf_event_mux_interval_ms`, put back
///   afterwards) to [`MUX_INTERVAL_MS`], which brings the bias to ~0.5 % in
///   the box and keeps 5 whole cycles in the 3 s of traffic. A driver that
///   loses counts across a rotation (an event's count not brought up to date
///   before its slot is taken, an incoming event's first counts dropped)
///   still loses a share of every in-period and fails it.
pub fn multiplexing(ctx: &mut Ctx) -> Result<Check> {
    let d = 0;
    let events = ctx.device.slots as usize + 2;
    let rate = 32 * MIB;
    let Multiplexed {
        problems,
        per_event,
        worst,
        worst_rotation,
        silence_ns,
        unread_bytes,
        exact,
    } = with_mux_interval(ctx, d, MUX_INTERVAL_MS, |ctx, _| {
        multiplexed_counts(ctx, d, events, rate)
    })?;
    let scaled = format!(
        "scaled counts within {:.1} % of the truth once perf's rotations are taken out (the largest rotation effect {:+.1} %; longest pause between accesses {} ms; {unread_bytes} bytes counted after their slots' last reads)",
        worst * 100.0,
        worst_rotation * 100.0,
        silence_ns / 1_000_000
    );
    Ok(Check::from_problems(
        "multiplexing",
        problems,
        format!(
            "{events} events on {} slots at {} MiB/s each, mux interval {MUX_INTERVAL_MS} ms: all multiplexed, raw counts exact against {exact} slot assignments; {scaled} ({})",
            ctx.device.slots,
            rate / MIB,
            per_event.join(", ")
        ),
    ))
}

/// The multiplexing check's measurement.
pub struct Multiplexed {
    pub problems: Vec<String>,
    /// One summary per event.
    pub per_event: Vec<String>,
    /// The worst relative error of a scaled count, the rotations' predicted
    /// effect taken out.
    pub worst: f64,
    /// The largest predicted effect of the rotations on a scaled count.
    pub worst_rotation: f64,
    /// The longest device time in the traffic window with no access.
    pub silence_ns: u64,
    /// Bytes the events' slots counted after their last reads.
    pub unread_bytes: u64,
    /// Slot assignments the raw counts were checked against.
    pub exact: usize,
}

/// The mux interval of the multiplexing check (perf's default is 1000/HZ =
/// 4 ms); see [`multiplexing`] for the error model.
pub(super) const MUX_INTERVAL_MS: u32 = 100;

/// Two reads of every event, `length` apart, each between two device times.
pub(super) struct ReadWindow {
    pub(super) start: Vec<Vec<u64>>,
    pub(super) end: Vec<Vec<u64>>,
    /// Device time before and after the first read and the last.
    brackets: [u64; 4],
}

impl ReadWindow {
    /// The window in device time: from the middle of the first read's
    /// brackets to the middle of the last one's.
    pub(super) fn span(&self) -> (u64, u64) {
        let [a, b, c, d] = self.brackets;
        (a + (b - a) / 2, c + (d - c) / 2)
    }
}

/// Reads `ids` (in one request each time, so that none is closed or moved
/// between), then again after `during`, noting the device's time around
/// each read.
pub(super) fn read_window(
    ctx: &mut Ctx,
    ids: &[u32],
    during: impl FnOnce(&mut Ctx) -> Result<()>,
) -> Result<ReadWindow> {
    let a = ctx.control.state()?.now_ns;
    let start = ctx.g.read_many(ids)?;
    let b = ctx.control.state()?.now_ns;
    during(ctx)?;
    let c = ctx.control.state()?.now_ns;
    let end = ctx.g.read_many(ids)?;
    let d = ctx.control.state()?.now_ns;
    Ok(ReadWindow {
        start,
        end,
        brackets: [a, b, c, d],
    })
}

/// Where the device's record (trace and assignments) stood at a moment:
/// taken before a check's first open, every assignment of its events
/// begins after it.
pub(super) struct RecordMark {
    trace: u64,
    assignments: u64,
}

impl RecordMark {
    pub(super) fn now(ctx: &mut Ctx) -> Result<RecordMark> {
        let trace = ctx.control.trace_accesses(u64::MAX)?.next_seq;
        let assignments = ctx.control.assignments(u64::MAX)?.next_seq;
        Ok(RecordMark { trace, assignments })
    }

    /// The assignments and accesses since the mark; an error if the device
    /// lost any of them to its bounds.
    pub(super) fn since(&self, ctx: &mut Ctx) -> Result<(Assignments, TraceAccesses)> {
        let record = ctx.control.assignments(self.assignments)?;
        let trace = ctx.control.trace_accesses(self.trace)?;
        let kept = record.records.len() as u64 == record.next_seq - self.assignments;
        if trace.first_seq > self.trace || !kept {
            bail!(
                "the device's record does not reach back to the first open (trace from record {} of {}; {} of assignments {}..{} kept): raise --trace-capacity",
                trace.first_seq,
                self.trace,
                record.records.len(),
                self.assignments,
                record.next_seq
            );
        }
        Ok((record, trace))
    }
}

/// The device's shape as the replay needs it.
pub(super) fn shape(ctx: &Ctx) -> Shape {
    Shape {
        domains: ctx.device.domains.len() as u64,
        slots: u64::from(ctx.device.slots),
        unit_bytes: ctx.device.unit_bytes,
        width: u64::from(ctx.device.counter_width),
    }
}

/// What perf's rotations moved the scaled count of `rmid`'s event over
/// `window` by (relative), from their bias in device ns
/// (`slot_credit::rotation_bias` over `traffic_ns` of traffic): counted
/// time b beyond perf's running time scales to b x enabled / running.
pub(super) fn rotation_effect(
    bias: &BTreeMap<(u32, u32), i64>,
    d: usize,
    rmid: u32,
    window: &Window,
    traffic_ns: f64,
) -> f64 {
    let b = bias.get(&(d as u32, rmid)).copied().unwrap_or(0) as f64;
    b * window.enabled as f64 / (window.running.max(1) as f64 * traffic_ns)
}

/// What perf tells of an event over a window: the growth of its value,
/// time_enabled and time_running between two reads (read_format
/// `TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING`: value, enabled, running).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Window {
    pub(super) value: u64,
    pub(super) enabled: u64,
    pub(super) running: u64,
}

impl Window {
    pub(super) fn between(start: &[u64], end: &[u64]) -> Window {
        let word = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
        Window {
            value: word(end, 0).wrapping_sub(word(start, 0)),
            enabled: word(end, 1).saturating_sub(word(start, 1)),
            running: word(end, 2).saturating_sub(word(start, 2)),
        }
    }

    /// The count scaled to the whole window as perf tools scale it (value x
    /// enabled / running), and the share of the window the event ran; `None`
    /// unless it was multiplexed there (ran some of it, not all).
    pub(super) fn scaled(&self) -> Option<(f64, f64)> {
        if self.running == 0 || self.running >= self.enabled {
            return None;
        }
        let ran = self.running as f64 / self.enabled as f64;
        Some((self.value as f64 / ran, ran))
    }
}

/// The sysfs file of `pmu`'s mux interval.
pub(crate) fn mux_interval_file(pmu: &str) -> String {
    format!("/sys/bus/event_source/devices/{pmu}/perf_event_mux_interval_ms")
}

/// Runs `during` with domain `d`'s mux interval at `ms` (`during` is given
/// the interval's sysfs file, to change it meanwhile), then puts back the
/// interval the PMU had, whatever `during` came to; an error if it does
/// not read back.
pub(super) fn with_mux_interval<T>(
    ctx: &mut Ctx,
    d: usize,
    ms: u32,
    during: impl FnOnce(&mut Ctx, &str) -> Result<T>,
) -> Result<T> {
    let file = mux_interval_file(&pmu_name(d));
    let had = ctx.g.read_file(&file)?;
    set_sysfs(ctx.g, &file, &ms.to_string())?;
    let result = during(ctx, &file);
    set_sysfs(ctx.g, &file, had.trim())?;
    let now = ctx.g.read_file(&file)?;
    if now.trim() != had.trim() {
        bail!("{file} is {now:?} after it was put back to {had:?}");
    }
    result
}

/// Writes `value` to a sysfs file in the guest.
pub(crate) fn set_sysfs(g: &mut Guest, file: &str, value: &str) -> Result<()> {
    let script = format!("echo {value} > {file}");
    let (status, _, stderr) = g.run(&["/bin/busybox", "sh", "-c", &script])?;
    if status != Some(0) {
        bail!("{script}: exit {status:?}: {}", stderr.trim());
    }
    Ok(())
}

/// Opens `events` mbm_total_bytes events of domain `d`, one per RMID, read
/// with their times; returns (RMID, handle) of each.
pub(super) fn open_multiplexed(ctx: &mut Ctx, d: usize, events: usize) -> Result<Vec<(u32, u32)>> {
    let mut handles = Vec::new();
    for rmid in 0..events as u32 {
        let mut attr = ctx.attr(d, Event::MbmTotalBytes, rmid % ctx.device.rmids);
        attr.read_format = TIMES;
        match ctx.g.open(attr, None)? {
            Ok(h) => handles.push((rmid, h)),
            Err(errno) => bail!("opening multiplexed event {rmid}: {errno}"),
        }
    }
    Ok(handles)
}

/// The multiplexing check's measurement.
pub fn multiplexed_counts(
    ctx: &mut Ctx,
    d: usize,
    events: usize,
    rate: u64,
) -> Result<Multiplexed> {
    let mark = RecordMark::now(ctx)?;
    let handles = open_multiplexed(ctx, d, events)?;
    let ids: Vec<u32> = handles.iter().map(|&(_, h)| h).collect();
    for &(rmid, _) in &handles {
        ctx.control
            .set_rate(d as u32, rmid, Event::MbmTotalBytes, rate)?;
    }
    // The window lies inside the traffic, so the rate is the same all
    // through it, as the estimate assumes; the device times around each
    // read bracket where it began and ended.
    let window = read_window(ctx, &ids, |_| {
        std::thread::sleep(Duration::from_secs(3));
        Ok(())
    })?;
    for &(rmid, _) in &handles {
        ctx.control
            .set_rate(d as u32, rmid, Event::MbmTotalBytes, 0)?;
    }
    ctx.control.wait_landed(ctx.g.timeout.as_millis() as u64)?;
    let (start, end) = (&window.start, &window.end);
    // The raw counts once nothing lands any more: a later read of a slot
    // (a poll, a close) reads what this one did.
    let last = ctx.g.read_many(&ids)?;
    let (record, trace) = mark.since(ctx)?;
    for &h in &ids {
        ctx.g.close(h)?;
    }
    let mut problems = Vec::new();
    let shape = shape(ctx);
    let credits = slot_credit::replay(shape, &record.records, &trace.accesses)?;
    let (from_ns, to_ns) = window.span();
    let (silence_ns, _) = slot_credit::longest_silence(&trace.accesses, from_ns, to_ns);
    let bias = slot_credit::rotation_bias(shape, &record.records, &trace.accesses, from_ns, to_ns);
    let traffic_ns = to_ns.saturating_sub(from_ns).max(1) as f64;
    let mut worst_rotation = 0.0f64;
    let mut unread_bytes = 0;
    let mut exact = 0;
    let mut per_event = Vec::new();
    let mut worst = 0.0f64;
    for (((&(rmid, _), s), e), l) in handles.iter().zip(start).zip(end).zip(&last) {
        let served: Vec<_> = credits
            .iter()
            .filter(|c| {
                c.record.domain == d as u32
                    && c.record.event == Event::MbmTotalBytes
                    && c.record.rmid == rmid
            })
            .collect();
        let credited: u64 = served.iter().map(|c| c.read_bytes).sum();
        let counted: u64 = served.iter().map(|c| c.record.counted_bytes).sum();
        unread_bytes += served.iter().map(|c| c.unread_bytes()).sum::<u64>();
        exact += served.len();
        let value = l.first().copied().unwrap_or(0);
        if value != credited {
            problems.push(format!(
                "rmid {rmid}: count {value}, but its {} slot assignments read {credited} bytes ({counted} counted): {:+} bytes",
                served.len(),
                value as i128 - credited as i128
            ));
        }
        let window = Window::between(s, e);
        // What landed for its RMID over its window: the rate, steady all
        // through it, times the window's length, which is the event's
        // time_enabled (enabled all along). The reads of one request come
        // one after another, each event's window its own.
        let truth = (rate as f64 * window.enabled as f64 / 1e9) as u64;
        let (Some((scaled, ran)), true) = (window.scaled(), truth > 0) else {
            problems.push(format!(
                "rmid {rmid}: over the traffic ({truth} bytes) {window:?}: not multiplexed"
            ));
            continue;
        };
        let error = scaled / truth as f64 - 1.0;
        let rotations = rotation_effect(&bias, d, rmid, &window, traffic_ns);
        if rotations.abs() > worst_rotation.abs() {
            worst_rotation = rotations;
        }
        let left = error - rotations;
        worst = worst.max(left.abs());
        let seconds = window.enabled as f64 / 1e9;
        per_event.push(format!(
            "rmid {rmid} ran {:.1} % of {seconds:.2} s, {:+.1} % of which rotations {:+.1} %",
            100.0 * ran,
            100.0 * error,
            100.0 * rotations
        ));
        if left.abs() > 0.05 {
            problems.push(format!(
                "rmid {rmid}: scaled {scaled:.0} vs truth {truth} ({:+.1} %, of which perf's rotations {:+.1} % by the device's trace; ran {:.1} % of {seconds:.2} s; longest pause between accesses {} ms)",
                error * 100.0,
                rotations * 100.0,
                100.0 * ran,
                silence_ns / 1_000_000
            ));
        }
    }
    Ok(Multiplexed {
        problems,
        per_event,
        worst,
        worst_rotation,
        silence_ns,
        unread_bytes,
        exact,
    })
}

#[cfg(test)]
mod tests {
    use super::Window;

    #[test]
    fn a_window_is_scaled_by_what_happened_in_it_only() {
        // Before the window the event ran 400 of 1000 ns and counted 100;
        // in it, 1000 of 2000 ns for 1000 more: 2000 over the window.
        let window = Window::between(&[100, 1000, 400], &[1100, 3000, 1400]);
        assert_eq!(
            window,
            Window {
                value: 1000,
                enabled: 2000,
                running: 1000
            }
        );
        assert_eq!(window.scaled(), Some((2000.0, 0.5)));
        // Scaling the whole life instead would give 1100 x 3000 / 1400.
        assert!((1100.0 * 3000.0 / 1400.0 - 2000.0f64).abs() > 300.0);
    }

    #[test]
    fn a_window_not_multiplexed_has_no_scaled_count() {
        assert_eq!(
            Window::between(&[0, 0, 0], &[500, 1000, 1000]).scaled(),
            None
        );
        assert_eq!(
            Window::between(&[7, 100, 50], &[7, 1100, 50]).scaled(),
            None
        );
        assert_eq!(Window::between(&[], &[]).scaled(), None);
    }
}
