//! Stays in Rust: it judges scaled estimates over a rate window against
//! perf's rotations as the device's trace measured them, and the mux
//! timers of `/proc/timer_list`, which no scenario line reads.
//!
//! Counting semantics beyond open–enabled–close, each replaying a symptom a
//! user saw: multiplexed events losing counts through a park, and perf's
//! mux timer left armed on a parked PMU (docs/counting-semantics.md is the
//! contract). Perf's rotations are measured in the device's trace. (The
//! disabled window is `scenarios/ioctls/disable-window-under-a-rate.scn`; a
//! park longer than a wrap, `scenarios/parks/park-longer-than-a-wrap.scn`.)

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Result};
use perfbed_device::regs::Event;

use super::context::{open_with, Ctx, MIB, TIMES};
use super::moves::movable_domain;
use super::multiplexing::{
    open_multiplexed, read_window, rotation_effect, shape, with_mux_interval, RecordMark, Window,
    MUX_INTERVAL_MS,
};
use crate::checks::slot_credit;
use crate::checks::Check;
use crate::guest::perf_abi::FLAG_EXCLUSIVE;
use crate::guest::pmu_name;

/// The steady rate of the report: 8 MiB/s.
const RATE: u64 = 8 * MIB;

/// Six mbm_total_bytes events multiplexed on the domain's four slots,
///    with the domain parked in the middle: each scaled count within the
///    multiplexing check's 5 % of the truth. The user parked for
///    0.3 s and lost about 10 %: events took the slots of events whose
///    counts nobody had read, which lose what landed since their last read,
///    the park included. The check parks for 1 s, so that such a loss stands
///    well clear of the few percent TCG's timing costs a rotation. What
///    perf's rotations moved each estimate by is taken out first, measured
///    in the device's trace as the multiplexing check does.
pub fn multiplexed_park(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let events = ctx.device.slots as usize + 2;
    let (problems, per_event) = with_mux_interval(ctx, d, MUX_INTERVAL_MS, |ctx, _| {
        multiplexed_park_counts(ctx, d, &allowed, events)
    })?;
    Ok(Check::from_problems(
        "multiplexing through a park",
        problems,
        format!(
            "{events} events on {} slots at 8 MiB/s each, {} parked {:.1} s in the middle: scaled counts within 5 % of the truth once perf's rotations are taken out ({})",
            ctx.device.slots,
            pmu_name(d),
            PARK.as_secs_f64(),
            per_event.join(", ")
        ),
    ))
}

fn multiplexed_park_counts(
    ctx: &mut Ctx,
    d: usize,
    allowed: &[u32],
    events: usize,
) -> Result<(Vec<String>, Vec<String>)> {
    let mark = RecordMark::now(ctx)?;
    let handles = open_multiplexed(ctx, d, events)?;
    let ids: Vec<u32> = handles.iter().map(|&(_, h)| h).collect();
    for &(rmid, _) in &handles {
        ctx.control
            .set_rate(d as u32, rmid, Event::MbmTotalBytes, RATE)?;
    }
    // Inside the traffic, as the multiplexing check's window.
    let window = read_window(ctx, &ids, |ctx| {
        std::thread::sleep(Duration::from_millis(1500));
        for &cpu in allowed {
            ctx.g.set_online(cpu, false)?;
        }
        std::thread::sleep(PARK);
        ctx.g.set_online(allowed[0], true)?;
        std::thread::sleep(Duration::from_millis(1500));
        Ok(())
    })?;
    for &(rmid, _) in &handles {
        ctx.control
            .set_rate(d as u32, rmid, Event::MbmTotalBytes, 0)?;
    }
    ctx.control.wait_landed(ctx.g.timeout.as_millis() as u64)?;
    let (start, end) = (&window.start, &window.end);
    let (record, trace) = mark.since(ctx)?;
    let (from_ns, to_ns) = window.span();
    let bias =
        slot_credit::rotation_bias(shape(ctx), &record.records, &trace.accesses, from_ns, to_ns);
    let traffic_ns = to_ns.saturating_sub(from_ns).max(1) as f64;
    for &h in &ids {
        ctx.g.close(h)?;
    }
    for &cpu in &allowed[1..] {
        ctx.g.set_online(cpu, true)?;
    }
    let mut problems = Vec::new();
    let mut per_event = Vec::new();
    for ((&(rmid, _), s), e) in handles.iter().zip(start).zip(end) {
        let window = Window::between(s, e);
        // What landed for its RMID over its window: the rate, steady all
        // through it, times the window's length, which is the event's
        // time_enabled (enabled all along). The reads of one request come
        // one after another, each event's window its own.
        let truth = (RATE as f64 * window.enabled as f64 / 1e9) as u64;
        let scaled = window
            .scaled()
            .map_or(window.value as f64, |(scaled, _)| scaled);
        let error = scaled / truth.max(1) as f64 - 1.0;
        let rotations = rotation_effect(&bias, d, rmid, &window, traffic_ns);
        let ran = window.running as f64 / window.enabled.max(1) as f64;
        per_event.push(format!(
            "rmid {rmid} ran {:.1} %, {:+.1} % of which rotations {:+.1} %",
            100.0 * ran,
            100.0 * error,
            100.0 * rotations
        ));
        if (error - rotations).abs() > 0.05 {
            problems.push(format!(
                "rmid {rmid}: scaled {scaled:.0} vs truth {truth} ({:+.1} %, of which perf's rotations {:+.1} % by the device's trace; ran {:.1} %)",
                100.0 * error,
                100.0 * rotations,
                100.0 * ran
            ));
        }
    }
    Ok((problems, per_event))
}

/// How long [`multiplexed_park`] parks the domain.
const PARK: Duration = Duration::from_secs(1);

/// An exclusive event and another on the movable domain's PMU take turns
/// (perf's mux timer armed on the owner rotates them); parked, no mux
/// timer is armed on any CPU: perf does not rotate a parked PMU (patch
/// 0010), and a timer on the CPU that keeps its events would fire every
/// interval for nothing; placed again, the owner's timer is armed again
/// and both events run.
pub fn parked_mux_timer(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let exclusive = open_with(ctx, d, 1, TIMES, FLAG_EXCLUSIVE, None)?;
    let other = open_with(ctx, d, 2, TIMES, 0, None)?;
    let mut armed = Vec::new();
    // Each sample: when, the PMU's CPU (None: parked), and for each CPU
    // with an armed timer, in how many of `TIMER_READINGS` readings it was
    // seen. A timer whose handler is running is not queued, so
    // /proc/timer_list leaves it out; under TCG, and slower under KCSAN, a
    // vCPU can be inside that handler for a while.
    let mut sample = |ctx: &mut Ctx, when: &'static str| -> Result<()> {
        std::thread::sleep(Duration::from_millis(200));
        let on = ctx.g.cpumask(&pmu_name(d))?.first().copied();
        let mut seen = BTreeMap::<u32, usize>::new();
        for _ in 0..TIMER_READINGS {
            for cpu in armed_mux_timers(ctx)?.into_keys() {
                *seen.entry(cpu).or_default() += 1;
            }
            std::thread::sleep(Duration::from_millis(30));
        }
        armed.push((when, on, seen));
        Ok(())
    };
    let took = (|| {
        sample(ctx, "placed")?;
        for &cpu in &allowed {
            ctx.g.set_online(cpu, false)?;
        }
        sample(ctx, "parked")?;
        sample(ctx, "parked")?;
        ctx.g.set_online(allowed[0], true)?;
        sample(ctx, "placed again")?;
        let times = ctx.g.read_many(&[exclusive, other])?;
        for &cpu in &allowed[1..] {
            ctx.g.set_online(cpu, true)?;
        }
        Ok::<_, anyhow::Error>(times)
    })();
    ctx.g.close(exclusive)?;
    ctx.g.close(other)?;
    let times = took?;
    let mut problems = Vec::new();
    for (when, on, cpus) in &armed {
        let right = match on {
            Some(owner) => cpus.contains_key(owner),
            None => cpus.is_empty(),
        };
        if !right || on.is_none() != (*when == "parked") {
            problems.push(format!(
                "{when} (cpumask {on:?}): mux timers armed by CPU, in how many of \
                 {TIMER_READINGS} readings: {cpus:?} (want the owner's \
                 while placed, none parked)"
            ));
        }
    }
    for (name, t) in ["exclusive", "other"].iter().zip(&times) {
        if t[2] == 0 {
            problems.push(format!("the {name} event never ran: {t:?}"));
        }
    }
    Ok(Check::from_problems(
        "mux timer of a parked PMU",
        problems,
        format!(
            "an exclusive event and another on {}, mux timers armed by CPU (in how many of \
             {TIMER_READINGS} readings): {armed:?}",
            pmu_name(d)
        ),
    ))
}

/// How often [`parked_mux_timer`] reads the armed timers at each sample.
const TIMER_READINGS: usize = 5;

/// The guest's armed perf mux timers (`perf_mux_hrtimer_handler` in
/// `/proc/timer_list`), counted by CPU: while a PMU's groups rotate, its
/// CPU's timer is armed; no timer fires for a parked PMU (patch 0010).
fn armed_mux_timers(ctx: &mut Ctx) -> Result<BTreeMap<u32, usize>> {
    let text = ctx.g.read_file("/proc/timer_list")?;
    mux_timers_in(&text)
}

/// [`armed_mux_timers`] of a `/proc/timer_list` text: its `cpu: N`
/// sections, each timer a line `#k: <addr>, function, S:01`.
fn mux_timers_in(text: &str) -> Result<BTreeMap<u32, usize>> {
    let mut cpu = None;
    let mut armed = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if let Some(n) = line.strip_prefix("cpu: ") {
            cpu = Some(n.trim().parse::<u32>()?);
        } else if line.starts_with('#') && line.contains(", perf_mux_hrtimer_handler,") {
            let Some(cpu) = cpu else {
                bail!("/proc/timer_list names a timer before any CPU: {line:?}");
            };
            *armed.entry(cpu).or_insert(0) += 1;
        }
    }
    if cpu.is_none() {
        bail!("/proc/timer_list has no `cpu: N` section: {text:?}");
    }
    Ok(armed)
}

#[cfg(test)]
mod tests {
    use super::mux_timers_in;

    /// The shape of 6.12's `/proc/timer_list` (kernel/time/timer_list.c).
    const TIMER_LIST: &str = "Timer List Version: v0.9
HRTIMER_MAX_CLOCK_BASES: 8
now at 5231000000 nsecs

cpu: 0
 clock 0:
  .base:       000000003c1a55d2
  .index:      0
  .resolution: 1 nsecs
  .get_time:   ktime_get
active timers:
 #0: <00000000a2b1c3d4>, tick_nohz_handler, S:01
 # expires at 5232000000-5232000000 nsecs [in 1000000 to 1000000 nsecs]
cpu: 3
 clock 0:
active timers:
 #0: <00000000a2b1c3d5>, perf_mux_hrtimer_handler, S:01
 # expires at 5300000000-5300000000 nsecs [in 69000000 to 69000000 nsecs]
 #1: <00000000a2b1c3d6>, perf_mux_hrtimer_handler, S:01
 # expires at 5310000000-5310000000 nsecs [in 79000000 to 79000000 nsecs]

Tick Device: mode:     1
Per CPU device: 0
";

    #[test]
    fn mux_timers_are_counted_by_the_cpu_whose_section_lists_them() {
        let armed = mux_timers_in(TIMER_LIST).unwrap();
        assert_eq!(armed.into_iter().collect::<Vec<_>>(), vec![(3, 2)]);
        let none = TIMER_LIST.replace("perf_mux_hrtimer_handler", "tick_nohz_handler");
        assert!(mux_timers_in(&none).unwrap().is_empty());
    }

    #[test]
    fn a_text_without_cpu_sections_is_refused() {
        let err = mux_timers_in("active timers:\n #0: <0>, perf_mux_hrtimer_handler, S:01\n")
            .unwrap_err();
        assert!(err.to_string().contains("before any CPU"), "{err}");
        assert!(mux_timers_in("").is_err());
    }
}
