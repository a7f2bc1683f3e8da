//! The end-to-end checks of perfbed.ko: device-scope PMUs `perfbed_l3_<d>`
//! opened from the guest with perf_event_open (and the real perf tool),
//! traffic injected through the device's control socket, every count
//! compared with the device's ground truth while CPUs come and go.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Result};
use perfbed_agent::{AgentMessage, HostRequest, PerfAttr};
use perfbed_device::regs::whole_units;
use perfbed_device::regs::Event;
use perfbed_device::{ControlClient, DeviceConfig, DeviceState};

use crate::guest::{Guest, Opened};
use crate::scenario::Check;

/// The driver's event encoding: `format/event` = config:0-7,
/// `format/rmid` = config:8-23. Counts are in bytes.
fn config(event: Event, rmid: u32) -> u64 {
    event as u64 | u64::from(rmid) << 8
}

const EVENT_FILES: [(&str, Event); 3] = [
    ("llc_occupancy", Event::LlcOccupancy),
    ("mbm_total_bytes", Event::MbmTotalBytes),
    ("mbm_local_bytes", Event::MbmLocalBytes),
];
const UNIT: &str = "MB";
const SCALE: &str = "9.5367431640625e-07";

use crate::perf_abi::{FLAG_EXCLUDE_USER, FORMAT_GROUP, FORMAT_TOTAL_TIME_ENABLED, FORMAT_TOTAL_TIME_RUNNING, PERF_COUNT_SW_CPU_CLOCK, PERF_TYPE_SOFTWARE};

const MIB: u64 = 1 << 20;

/// The driver's module name.
pub const MODULE: &str = "perfbed";

pub fn pmu_name(domain: usize) -> String {
    format!("perfbed_l3_{domain}")
}

struct Ctx<'a, 'b> {
    g: &'a mut Guest<'b>,
    control: ControlClient,
    device: DeviceConfig,
    /// Each domain's PMU type.
    types: Vec<u32>,
}

impl Ctx<'_, '_> {
    fn attr(&self, domain: usize, event: Event, rmid: u32) -> PerfAttr {
        PerfAttr { type_: self.types[domain], config: config(event, rmid), ..PerfAttr::default() }
    }

    /// Opens an event that must open.
    fn open(&mut self, domain: usize, event: Event, rmid: u32) -> Result<u32> {
        let attr = self.attr(domain, event, rmid);
        match self.g.open(attr, None)? {
            Ok(handle) => Ok(handle),
            Err(errno) => bail!("opening {}/{event:?},rmid={rmid}/: {errno}", pmu_name(domain)),
        }
    }

    fn count(&mut self, handle: u32) -> Result<u64> {
        Ok(self.g.read(handle)?[0])
    }

    fn truth(state: &DeviceState, domain: usize, rmid: u32, event: Event) -> u64 {
        state.domains[domain].truth.iter().find(|t| t.rmid == rmid && t.event == event).map_or(0, |t| t.bytes)
    }

    fn inject_and_land(&mut self, injections: &[(usize, u32, Event, u64)]) -> Result<()> {
        for &(d, rmid, event, bytes) in injections {
            self.control.inject(d as u32, rmid, event, bytes)?;
        }
        self.control.wait_landed(self.g.timeout.as_millis() as u64)?;
        Ok(())
    }
}

/// Runs every check; the driver must be loaded. `control_socket` is the
/// device's, for checks that inject from a thread of their own.
pub fn run(g: &mut Guest, control: ControlClient, control_socket: &std::path::Path, device: &DeviceConfig) -> Result<Vec<Check>> {
    let mut types = Vec::new();
    for d in 0..device.domains.len() {
        types.push(g.pmu_type(&pmu_name(d))?);
    }
    let mut ctx = Ctx { g, control, device: device.clone(), types };
    ctx.control.reset_stats()?;
    let mut checks = vec![sysfs(&mut ctx)?, exact_counts(&mut ctx)?];
    checks.push(migration(&mut ctx)?);
    checks.push(parking(&mut ctx)?);
    checks.push(crate::moving_traffic::check(ctx.g, &mut ctx.control, control_socket, &ctx.device, &ctx.types)?);
    checks.push(multiplexing(&mut ctx)?);
    checks.push(groups(&mut ctx)?);
    checks.push(bad_attributes(&mut ctx)?);
    checks.push(crate::perf_matrix::run(ctx.g, &mut ctx.control, &ctx.device, &ctx.types)?);
    checks.push(perf_stat(&mut ctx)?);
    checks.push(unload(&mut ctx)?);
    Ok(checks)
}

/// rmmod is refused while an event is open, then unregisters cleanly (and
/// the driver loads again, leaving the device as it found it).
fn unload(ctx: &mut Ctx) -> Result<Check> {
    let h = ctx.open(0, Event::MbmTotalBytes, 1)?;
    let busy = ctx.g.ask(HostRequest::UnloadModule { name: MODULE.into() })?;
    ctx.g.close(h)?;
    let unloaded = ctx.g.ask(HostRequest::UnloadModule { name: MODULE.into() })?;
    let gone = ctx.g.read_file(&format!("/sys/bus/event_source/devices/{}/type", pmu_name(0))).is_err();
    let state = ctx.control.state()?;
    let left: Vec<String> = state
        .domains
        .iter()
        .filter(|d| d.owner.is_some() || d.slots.iter().any(|s| s.event.is_some()))
        .map(|d| format!("domain {}: owner {:?}, slots {:?}", d.domain, d.owner, d.slots.iter().filter_map(|s| s.event).collect::<Vec<_>>()))
        .collect();
    let reloaded = ctx.g.ask(HostRequest::LoadModule { name: MODULE.into() })?;
    let mut problems = Vec::new();
    if busy == AgentMessage::Done {
        problems.push("rmmod with an open event succeeded".into());
    }
    if unloaded != AgentMessage::Done || !gone {
        problems.push(format!("rmmod without events: {unloaded:?}, PMU gone: {gone}"));
    }
    if !left.is_empty() {
        problems.push(format!("after unload the device still has {}", left.join("; ")));
    }
    if reloaded != AgentMessage::Done {
        problems.push(format!("loading again: {reloaded:?}"));
    }
    Ok(Check::from_problems("module unload", problems, format!("refused with an event open ({}); clean without: PMUs gone, no owner or slot left on the device; loads again", describe(&busy))))
}

fn describe(message: &AgentMessage) -> String {
    match message {
        AgentMessage::Error { error } => error.clone(),
        other => format!("{other:?}"),
    }
}

/// 1. The PMUs, their events/format files, a cpumask inside each domain's
///    allowed set, and `perf list` showing the events.
fn sysfs(ctx: &mut Ctx) -> Result<Check> {
    let mut problems = Vec::new();
    let mut placed = Vec::new();
    for (d, allowed) in ctx.device.domains.clone().iter().enumerate() {
        let dir = format!("/sys/bus/event_source/devices/{}", pmu_name(d));
        let mask = ctx.g.cpumask(&pmu_name(d))?;
        if mask.len() != 1 || !allowed.contains(&mask[0]) {
            problems.push(format!("{} cpumask {mask:?}, allowed {allowed:?}", pmu_name(d)));
        }
        placed.push(format!("{}→{mask:?}", pmu_name(d)));
        let mut expected: Vec<(String, String)> = vec![
            ("format/event".into(), "config:0-7".into()),
            ("format/rmid".into(), "config:8-23".into()),
        ];
        for (name, event) in EVENT_FILES {
            expected.push((format!("events/{name}"), format!("event=0x{:02x}", event as u64)));
            expected.push((format!("events/{name}.unit"), UNIT.into()));
            expected.push((format!("events/{name}.scale"), SCALE.into()));
        }
        for (file, want) in expected {
            let got = ctx.g.read_file(&format!("{dir}/{file}"))?;
            if got != want {
                problems.push(format!("{}/{file} is {got:?}, expected {want:?}", pmu_name(d)));
            }
        }
    }
    let (status, stdout, stderr) = ctx.g.run(&["/usr/bin/perf", "list", "pmu"])?;
    for d in 0..ctx.device.domains.len() {
        for (name, _) in EVENT_FILES {
            let entry = format!("{}/{name}/", pmu_name(d));
            if !stdout.contains(&entry) {
                problems.push(format!("`perf list` (exit {status:?}) lacks {entry}: {}", stderr.trim()));
            }
        }
    }
    Ok(Check::from_problems("PMUs and sysfs", problems, format!("events/ with unit and scale, format/, {}; perf list shows all events", placed.join(", "))))
}

/// 2. Exact counts for every event and several RMIDs in both domains,
///    including a total that wraps the hardware counter three times.
fn exact_counts(ctx: &mut Ctx) -> Result<Check> {
    let wrap = (1u64 << ctx.device.counter_width) * ctx.device.unit_bytes;
    let mut plan = Vec::new(); // (domain, event, rmid, bytes)
    for d in 0..ctx.device.domains.len() {
        let d64 = d as u64;
        plan.push((d, Event::MbmTotalBytes, 1, 3 * wrap + 4096 * (d64 + 1) + 640));
        plan.push((d, Event::MbmTotalBytes, 3, 10 * MIB + 128 * (d64 + 1)));
        plan.push((d, Event::MbmLocalBytes, 3, 5 * MIB + 64));
    }
    let mut handles = Vec::new();
    for &(d, event, rmid, _) in &plan {
        handles.push(ctx.open(d, event, rmid)?);
    }
    let occupancy: Vec<(usize, u64)> = (0..ctx.device.domains.len()).map(|d| (d, (12_345 + d as u64) * ctx.device.unit_bytes)).collect();
    let mut occ_handles = Vec::new();
    for &(d, bytes) in &occupancy {
        ctx.control.set_occupancy(d as u32, 5, bytes)?;
        occ_handles.push(ctx.open(d, Event::LlcOccupancy, 5)?);
    }
    let injections: Vec<_> = plan.iter().map(|&(d, e, r, b)| (d, r, e, b)).collect();
    ctx.inject_and_land(&injections)?;
    let mut problems = Vec::new();
    for (&(d, event, rmid, bytes), &h) in plan.iter().zip(&handles) {
        let got = ctx.count(h)?;
        if got != bytes {
            problems.push(format!("{}/{event:?},rmid={rmid}/ counted {got}, injected {bytes}", pmu_name(d)));
        }
    }
    for (&(d, bytes), &h) in occupancy.iter().zip(&occ_handles) {
        let got = ctx.count(h)?;
        if got != bytes {
            problems.push(format!("{}/llc_occupancy,rmid=5/ reads {got}, set {bytes}", pmu_name(d)));
        }
    }
    for h in handles.into_iter().chain(occ_handles) {
        ctx.g.close(h)?;
    }
    Ok(Check::from_problems("exact counts",
        problems,
        format!("{} cumulative events and {} occupancy gauges exact, incl. {} bytes = 3 wraps of the {}-bit counter", plan.len(), occupancy.len(), 3 * wrap, ctx.device.counter_width),
    ))
}

/// The domain whose CPUs can all go offline (CPU 0 cannot) and its set.
fn movable_domain(ctx: &Ctx) -> Result<(usize, Vec<u32>)> {
    match ctx.device.domains.iter().enumerate().find(|(_, cpus)| cpus.len() >= 2 && !cpus.contains(&0)) {
        Some((d, cpus)) => Ok((d, cpus.clone())),
        None => bail!("no domain with two CPUs besides CPU 0 to take offline (domains {:?})", ctx.device.domains),
    }
}

/// Steady traffic that flows while CPUs move: 64 MiB/s, so that a move
/// (tens of milliseconds under TCG) always has some land while it is under way.
const MOVING_RATE: u64 = 64 * MIB;

/// 3. The owner CPU goes while traffic flows: `cpumask` moves inside the
///    set, the count is exactly the traffic that landed while the event was
///    open, and the device saw no placement violation.
fn migration(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let h = ctx.open(d, Event::MbmTotalBytes, 2)?;
    let start = Ctx::truth(&ctx.control.state()?, d, 2, Event::MbmTotalBytes);
    ctx.inject_and_land(&[(d, 2, Event::MbmTotalBytes, 3 * MIB)])?;
    let before = ctx.g.cpumask(&pmu_name(d))?;
    let owner = *before.first().unwrap_or(&allowed[0]);
    ctx.control.set_rate(d as u32, 2, Event::MbmTotalBytes, MOVING_RATE)?;
    ctx.g.set_online(owner, false)?;
    let after = ctx.g.cpumask(&pmu_name(d))?;
    ctx.g.set_online(owner, true)?;
    ctx.control.set_rate(d as u32, 2, Event::MbmTotalBytes, 0)?;
    ctx.inject_and_land(&[(d, 2, Event::MbmTotalBytes, 7 * MIB + 64)])?;
    let got = ctx.count(h)?;
    ctx.g.close(h)?;
    let state = ctx.control.state()?;
    let truth = whole_units(Ctx::truth(&state, d, 2, Event::MbmTotalBytes) - start, ctx.device.unit_bytes);
    let violations: u64 = state.domains.iter().map(|dom| dom.violations).sum();
    let mut problems = Vec::new();
    if after.len() != 1 || after == before || !allowed.contains(&after[0]) {
        problems.push(format!("cpumask {before:?} → {after:?} after CPU {owner} went offline (allowed {allowed:?})"));
    }
    if got != truth {
        problems.push(format!("counted {got} across the move and back, the device's truth is {truth} (in whole units)"));
    }
    if violations != 0 {
        let by: BTreeMap<usize, &BTreeMap<u32, u64>> = state.domains.iter().enumerate().map(|(i, dom)| (i, &dom.violations_by_vcpu)).collect();
        problems.push(format!("the device counted {violations} placement violations: {by:?}"));
    }
    Ok(Check::from_problems(
        "migration",
        problems,
        format!(
            "{}: CPU {owner} offline and back under {} MiB/s moved it {before:?} → {after:?}; counted {got} = the truth; 0 placement violations",
            pmu_name(d),
            MOVING_RATE / MIB
        ),
    ))
}

/// 4. A domain's CPUs all go: new opens get ENODEV, an open event stays
///    open and counts on in the device; one CPU comes back: opens work
///    again, and the open event has caught up with what landed meanwhile.
fn parking(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let kept = ctx.open(d, Event::MbmTotalBytes, 4)?;
    let start = Ctx::truth(&ctx.control.state()?, d, 4, Event::MbmTotalBytes);
    ctx.inject_and_land(&[(d, 4, Event::MbmTotalBytes, MIB)])?;
    ctx.control.set_rate(d as u32, 4, Event::MbmTotalBytes, MOVING_RATE)?;
    for &cpu in &allowed {
        ctx.g.set_online(cpu, false)?;
    }
    ctx.control.set_rate(d as u32, 4, Event::MbmTotalBytes, 0)?;
    let mask = ctx.g.cpumask(&pmu_name(d))?;
    let refused = ctx.g.open(ctx.attr(d, Event::MbmTotalBytes, 4), None)?;
    let parked_value = ctx.count(kept)?;
    ctx.inject_and_land(&[(d, 4, Event::MbmTotalBytes, 5 * MIB)])?;
    let parked_state = ctx.control.state()?;
    let parked_truth = whole_units(Ctx::truth(&parked_state, d, 4, Event::MbmTotalBytes) - start, ctx.device.unit_bytes);
    ctx.g.set_online(allowed[0], true)?;
    let back = ctx.g.cpumask(&pmu_name(d))?;
    let returned_value = ctx.count(kept)?;
    let reopened: Opened = ctx.g.open(ctx.attr(d, Event::MbmTotalBytes, 4), None)?;
    let mut fresh = None;
    if let Ok(h) = reopened {
        ctx.inject_and_land(&[(d, 4, Event::MbmTotalBytes, 2 * MIB)])?;
        fresh = Some(ctx.count(h)?);
        ctx.g.close(h)?;
    }
    for &cpu in &allowed[1..] {
        ctx.g.set_online(cpu, true)?;
    }
    let final_value = ctx.count(kept)?;
    ctx.g.close(kept)?;
    let final_state = ctx.control.state()?;
    let final_truth = whole_units(Ctx::truth(&final_state, d, 4, Event::MbmTotalBytes) - start, ctx.device.unit_bytes);
    let mut problems = Vec::new();
    if !mask.is_empty() || refused != Err("ENODEV".into()) {
        problems.push(format!("with CPUs {allowed:?} offline: cpumask {mask:?}, open gave {refused:?} (want empty, ENODEV)"));
    }
    // While parked nobody can read the device: the count may lag, never lead.
    if parked_value > parked_truth {
        problems.push(format!("the open event read {parked_value} while parked, more than the {parked_truth} that landed"));
    }
    if back != [allowed[0]] || fresh != Some(2 * MIB) {
        problems.push(format!("after CPU {} returned: cpumask {back:?}, a new event counted {fresh:?} of {}", allowed[0], 2 * MIB));
    }
    if returned_value != parked_truth || final_value != final_truth {
        problems.push(format!(
            "the event open across the park read {returned_value} on return (truth {parked_truth}) and {final_value} at the end (truth {final_truth})"
        ));
    }
    Ok(Check::from_problems(
        "parking",
        problems,
        format!(
            "{} parked with CPUs {allowed:?} offline (open: ENODEV); the event open across it caught up on return ({returned_value} = truth, traffic landed while parked included) and ended at {final_value} = truth",
            pmu_name(d)
        ),
    ))
}

/// 5. More events than slots under a steady rate: perf multiplexes, and each
///    event's count scaled over the traffic window is within 5 % of the
///    truth. An `llc_occupancy` opened after them takes no slot: it runs all
///    the time and reads the occupancy unscaled (patch 0008), though the
///    groups before it do not fit.
///
/// How the estimate is taken, and what it may be off by:
/// - It is scaled over the traffic window, as `perf stat -I` scales an
///   interval: from the deltas of value, time_enabled and time_running
///   between a read just before the traffic starts and one just after it
///   stops. Scaling by an event's whole life (open to read) would assume it
///   ran the same share of the traffic window as of that life, and perf's
///   rotation does not share the slots evenly: with the gauge in the same
///   context, two of the six events run ~57 % of the time and four ~71 %,
///   and which two depends on where a window starts and ends.
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
fn multiplexing(ctx: &mut Ctx) -> Result<Check> {
    let d = 0;
    let events = ctx.device.slots as usize + 2;
    let rate = 32 * MIB;
    let interval_file = format!("/sys/bus/event_source/devices/{}/perf_event_mux_interval_ms", pmu_name(d));
    let default_interval = ctx.g.read_file(&interval_file)?;
    set_sysfs(ctx.g, &interval_file, &MUX_INTERVAL_MS.to_string())?;
    let result = multiplexed_counts(ctx, d, events, rate);
    set_sysfs(ctx.g, &interval_file, default_interval.trim())?;
    let (mut problems, per_event, worst) = result?;
    let interval = ctx.g.read_file(&interval_file)?;
    if interval.trim() != default_interval.trim() {
        problems.push(format!("{interval_file} is {interval:?} after the check, was {default_interval:?}"));
    }
    Ok(Check::from_problems(
        "multiplexing",
        problems,
        format!(
            "{events} events on {} slots at {} MiB/s each, mux interval {MUX_INTERVAL_MS} ms: all multiplexed, scaled counts within {:.1} % of the truth ({}); llc_occupancy beside them ran all the time, exact",
            ctx.device.slots,
            rate / MIB,
            worst * 100.0,
            per_event.join(", ")
        ),
    ))
}

/// The mux interval of the multiplexing check (perf's default is 1000/HZ =
/// 4 ms); see [`multiplexing`] for the error model.
const MUX_INTERVAL_MS: u32 = 100;

/// What perf tells of an event over a window: the growth of its value,
/// time_enabled and time_running between two reads (read_format
/// `TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING`: value, enabled, running).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    value: u64,
    enabled: u64,
    running: u64,
}

impl Window {
    fn between(start: &[u64], end: &[u64]) -> Window {
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
    fn scaled(&self) -> Option<(f64, f64)> {
        if self.running == 0 || self.running >= self.enabled {
            return None;
        }
        let ran = self.running as f64 / self.enabled as f64;
        Some((self.value as f64 / ran, ran))
    }
}

/// Writes `value` to a sysfs file in the guest.
fn set_sysfs(g: &mut Guest, file: &str, value: &str) -> Result<()> {
    let script = format!("echo {value} > {file}");
    let (status, _, stderr) = g.run(&["/bin/busybox", "sh", "-c", &script])?;
    if status != Some(0) {
        bail!("{script}: exit {status:?}: {}", stderr.trim());
    }
    Ok(())
}

/// The multiplexing check's measurement: its problems, one summary per
/// event, and the worst relative error of a scaled count.
fn multiplexed_counts(ctx: &mut Ctx, d: usize, events: usize, rate: u64) -> Result<(Vec<String>, Vec<String>, f64)> {
    let mut handles = Vec::new();
    for rmid in 0..events as u32 {
        let mut attr = ctx.attr(d, Event::MbmTotalBytes, rmid % ctx.device.rmids);
        attr.read_format = FORMAT_TOTAL_TIME_ENABLED | FORMAT_TOTAL_TIME_RUNNING;
        match ctx.g.open(attr, None)? {
            Ok(h) => handles.push((rmid, h)),
            Err(errno) => bail!("opening multiplexed event {rmid}: {errno}"),
        }
    }
    let gauge_rmid = ctx.device.rmids - 1;
    let occupancy = 3_000 * ctx.device.unit_bytes;
    ctx.control.set_occupancy(d as u32, gauge_rmid, occupancy)?;
    let mut attr = ctx.attr(d, Event::LlcOccupancy, gauge_rmid);
    attr.read_format = FORMAT_TOTAL_TIME_ENABLED | FORMAT_TOTAL_TIME_RUNNING;
    let gauge = match ctx.g.open(attr, None)? {
        Ok(h) => h,
        Err(errno) => bail!("opening llc_occupancy beside the multiplexed events: {errno}"),
    };
    let ids: Vec<u32> = handles.iter().map(|&(_, h)| h).collect();
    let before = ctx.control.state()?;
    let start = ctx.g.read_many(&ids)?;
    for &(rmid, _) in &handles {
        ctx.control.set_rate(d as u32, rmid, Event::MbmTotalBytes, rate)?;
    }
    std::thread::sleep(Duration::from_secs(3));
    for &(rmid, _) in &handles {
        ctx.control.set_rate(d as u32, rmid, Event::MbmTotalBytes, 0)?;
    }
    ctx.control.wait_landed(ctx.g.timeout.as_millis() as u64)?;
    // All in one request, before any is closed: a close frees a slot.
    let end = ctx.g.read_many(&ids)?;
    let after = ctx.control.state()?;
    let gauge_read = ctx.g.read(gauge)?;
    for &h in &ids {
        ctx.g.close(h)?;
    }
    ctx.g.close(gauge)?;
    let mut problems = Vec::new();
    let mut per_event = Vec::new();
    let mut worst = 0.0f64;
    for ((&(rmid, _), s), e) in handles.iter().zip(&start).zip(&end) {
        let window = Window::between(s, e);
        let truth = Ctx::truth(&after, d, rmid, Event::MbmTotalBytes) - Ctx::truth(&before, d, rmid, Event::MbmTotalBytes);
        let (Some((scaled, ran)), true) = (window.scaled(), truth > 0) else {
            problems.push(format!("rmid {rmid}: over the traffic ({truth} bytes) {window:?}: not multiplexed"));
            continue;
        };
        let error = scaled / truth as f64 - 1.0;
        worst = worst.max(error.abs());
        let seconds = window.enabled as f64 / 1e9;
        per_event.push(format!("rmid {rmid} ran {:.1} % of {seconds:.2} s, {:+.1} %", 100.0 * ran, 100.0 * error));
        if error.abs() > 0.05 {
            problems.push(format!("rmid {rmid}: scaled {scaled:.0} vs truth {truth} ({:+.1} %; ran {:.1} % of {seconds:.2} s)", error * 100.0, 100.0 * ran));
        }
    }
    // Its whole life: from nothing to its one read.
    let Window { value, enabled, running } = Window::between(&[], &gauge_read);
    if enabled == 0 || running != enabled {
        problems.push(format!("llc_occupancy: time_running {running} vs time_enabled {enabled}: a gauge was multiplexed"));
    }
    if value != occupancy {
        problems.push(format!("llc_occupancy: {value} bytes, the device's occupancy {occupancy}"));
    }
    Ok((problems, per_event, worst))
}

/// 6. A group read of a domain's three events; the groups that must be refused.
fn groups(ctx: &mut Ctx) -> Result<Check> {
    let d = 0;
    let rmid = 6;
    let mut problems = Vec::new();
    let mut leader_attr = ctx.attr(d, Event::MbmTotalBytes, rmid);
    leader_attr.read_format = FORMAT_GROUP | FORMAT_TOTAL_TIME_ENABLED | FORMAT_TOTAL_TIME_RUNNING;
    let leader = match ctx.g.open(leader_attr, None)? {
        Ok(h) => h,
        Err(errno) => bail!("opening the group leader: {errno}"),
    };
    let mut members = vec![leader];
    for event in [Event::MbmLocalBytes, Event::LlcOccupancy] {
        match ctx.g.open(ctx.attr(d, event, rmid), Some(leader))? {
            Ok(h) => members.push(h),
            Err(errno) => problems.push(format!("a {event:?} sibling was refused: {errno}")),
        }
    }
    ctx.control.set_occupancy(d as u32, rmid, 4096 * ctx.device.unit_bytes)?;
    ctx.inject_and_land(&[(d, rmid, Event::MbmTotalBytes, 2 * MIB), (d, rmid, Event::MbmLocalBytes, MIB)])?;
    let v = ctx.g.read(leader)?;
    let want = [3, 2 * MIB, MIB, 4096 * ctx.device.unit_bytes];
    // GROUP|TOTAL_TIME_ENABLED|TOTAL_TIME_RUNNING: nr, enabled, running, values...
    if v.len() < 6 || v[0] != want[0] || v[3..6] != want[1..] || v[1] != v[2] {
        problems.push(format!("group read {v:?}, expected nr 3, enabled == running, values {:?}", &want[1..]));
    }

    // A software event may join, on the group's CPU.
    let cpu = ctx.g.cpumask(&pmu_name(d))?.first().copied().unwrap_or(0) as i32;
    let sw = PerfAttr { type_: PERF_TYPE_SOFTWARE, config: PERF_COUNT_SW_CPU_CLOCK, ..PerfAttr::default() };
    match ctx.g.open_as(sw, -1, cpu, Some(leader))? {
        Ok(h) => members.push(h),
        Err(errno) => problems.push(format!("a software sibling was refused: {errno}")),
    }
    for h in members.into_iter().rev() {
        ctx.g.close(h)?;
    }

    // More slot events than the domain has slots: refused at open.
    let big = match ctx.g.open(ctx.attr(d, Event::MbmTotalBytes, 0), None)? {
        Ok(h) => h,
        Err(errno) => bail!("opening a leader: {errno}"),
    };
    let mut big_members = vec![big];
    let mut refused_big = None;
    for i in 1..=ctx.device.slots {
        match ctx.g.open(ctx.attr(d, Event::MbmTotalBytes, i % ctx.device.rmids), Some(big))? {
            Ok(h) => big_members.push(h),
            Err(errno) => {
                refused_big = Some((i + 1, errno));
                break;
            }
        }
    }
    for h in big_members.into_iter().rev() {
        ctx.g.close(h)?;
    }
    let slots = ctx.device.slots;
    if refused_big != Some((slots + 1, "EINVAL".into())) {
        problems.push(format!("a group of {} slot events: refusal {refused_big:?}, expected the event {} refused with EINVAL", slots + 1, slots + 1));
    }

    // Another hardware PMU in the group: refused.
    let mut mixed = None;
    if ctx.types.len() > 1 {
        let leader = match ctx.g.open(ctx.attr(0, Event::MbmTotalBytes, 1), None)? {
            Ok(h) => h,
            Err(errno) => bail!("opening a leader: {errno}"),
        };
        mixed = Some(ctx.g.open(ctx.attr(1, Event::MbmTotalBytes, 1), Some(leader))?);
        if let Some(Ok(h)) = mixed {
            ctx.g.close(h)?;
        }
        ctx.g.close(leader)?;
        if mixed != Some(Err("EINVAL".into())) {
            problems.push(format!("a {} event in a {} group gave {mixed:?}, expected EINVAL", pmu_name(1), pmu_name(0)));
        }
    }
    Ok(Check::from_problems("groups", problems, format!("group read of 3 events exact and co-scheduled; software sibling joins; {}-event group refused (EINVAL); cross-PMU group refused ({mixed:?})", slots + 1)))
}

/// 7. The bad-attribute matrix, each with its errno.
fn bad_attributes(ctx: &mut Ctx) -> Result<Check> {
    let d = 0;
    let good = ctx.attr(d, Event::MbmTotalBytes, 1);
    let cases: Vec<(&str, PerfAttr, i32, i32, &str)> = vec![
        ("wrong type", PerfAttr { type_: good.type_ + 1000, ..good.clone() }, -1, 0, "ENOENT"),
        ("unknown event", PerfAttr { config: 0x09, ..good.clone() }, -1, 0, "EINVAL"),
        ("unknown config bits", PerfAttr { config: good.config | 1 << 40, ..good.clone() }, -1, 0, "EINVAL"),
        ("RMID out of range", PerfAttr { config: config(Event::MbmTotalBytes, ctx.device.rmids + 100), ..good.clone() }, -1, 0, "EINVAL"),
        ("exclude_user", PerfAttr { flags: FLAG_EXCLUDE_USER, ..good.clone() }, -1, 0, "EINVAL"),
        ("per-task", good.clone(), 0, -1, "EINVAL"),
        ("sampling", PerfAttr { sample_period: 1000, ..good.clone() }, -1, 0, "EOPNOTSUPP"),
    ];
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    for (name, attr, pid, cpu, want) in cases {
        let got = ctx.g.open_as(attr, pid, cpu, None)?;
        if let Ok(h) = got {
            ctx.g.close(h)?;
        }
        seen.push(format!("{name}: {}", got.as_ref().err().map_or("opened", |e| e.as_str())));
        if got != Err(want.into()) {
            problems.push(format!("{name}: {got:?}, expected {want}"));
        }
    }
    Ok(Check::from_problems("bad attributes", problems, seen.join(", ")))
}

/// 8. `perf stat -a` from the real perf tool agrees with the device's truth
///    under a steady rate.
fn perf_stat(ctx: &mut Ctx) -> Result<Check> {
    let (d, rmid, rate) = (0usize, 3u32, 64 * MIB);
    ctx.control.set_rate(d as u32, rmid, Event::MbmTotalBytes, rate)?;
    let spec = format!("{}/mbm_total_bytes,rmid={rmid}/", pmu_name(d));
    let result = ctx.g.run(&["/usr/bin/perf", "stat", "-a", "-x,", "-e", &spec, "/bin/busybox", "sleep", "2"]);
    ctx.control.set_rate(d as u32, rmid, Event::MbmTotalBytes, 0)?;
    let (status, _, stderr) = result?;
    // CSV: value,unit,event,run time (ns),percentage running,... where the
    // event is printed as given, commas included.
    let line = stderr.lines().find(|l| l.contains(&spec)).unwrap_or("");
    let (head, tail) = line.split_once(&format!(",{spec},")).unwrap_or(("", ""));
    let (value, unit) = head.split_once(',').unwrap_or(("", ""));
    let run_ns = tail.split(',').next().unwrap_or("");
    let parsed = (value.parse::<f64>().ok(), run_ns.parse::<f64>().ok());
    let mut problems = Vec::new();
    let mut detail = String::new();
    match parsed {
        (Some(mb), Some(run_ns)) if status == Some(0) => {
            let expected_mb = rate as f64 * run_ns / 1e9 / MIB as f64;
            let error = (mb - expected_mb).abs() / expected_mb;
            detail = format!("perf stat -a -e {spec}: {mb:.1} {unit} over {:.2} s; the device's rate gives {expected_mb:.1} ({:.1} %)", run_ns / 1e9, error * 100.0);
            if error > 0.05 || unit != UNIT {
                problems.push(detail.clone());
            }
        }
        _ => problems.push(format!("perf stat exited {status:?}: {}", stderr.trim())),
    }
    Ok(Check::from_problems("perf stat", problems, detail))
}

#[cfg(test)]
mod tests {
    use super::Window;

    #[test]
    fn a_window_is_scaled_by_what_happened_in_it_only() {
        // Before the window the event ran 400 of 1000 ns and counted 100;
        // in it, 1000 of 2000 ns for 1000 more: 2000 over the window.
        let window = Window::between(&[100, 1000, 400], &[1100, 3000, 1400]);
        assert_eq!(window, Window { value: 1000, enabled: 2000, running: 1000 });
        assert_eq!(window.scaled(), Some((2000.0, 0.5)));
        // Scaling the whole life instead would give 1100 x 3000 / 1400.
        assert!((1100.0 * 3000.0 / 1400.0 - 2000.0f64).abs() > 300.0);
    }

    #[test]
    fn a_window_not_multiplexed_has_no_scaled_count() {
        assert_eq!(Window::between(&[0, 0, 0], &[500, 1000, 1000]).scaled(), None);
        assert_eq!(Window::between(&[7, 100, 50], &[7, 1100, 50]).scaled(), None);
        assert_eq!(Window::between(&[], &[]).scaled(), None);
    }
}
