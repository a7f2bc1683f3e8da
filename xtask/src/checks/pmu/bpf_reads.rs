//! Stays in Rust: its reads come from a BPF program on the tick, which no
//! scenario line can run, and are judged against the truth drain by drain.
//!
//! BPF's read path into a device-scope PMU: the agent's BPF reader (see
//! `images/agent/src/bpf_reader.rs`) reads an open event with
//! `bpf_perf_event_read_value()` from the timer tick's tracepoint on every
//! CPU, while traffic flows, the PMU's CPU goes and the domain parks and
//! returns. That is `perf_event_read_local()` and, on the CPU the event
//! counts on, the driver's `read` (its `try_lock` path) in interrupt
//! context. Every value read must be no more than the device's truth at the
//! next drain (the reads before it) and no less than the value read before;
//! the reads off the event's CPU are counted by their errno, the driver's
//! contended reads by its sysfs counters.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Result};
use perfbed_agent::{
    errno_name, AgentMessage, BpfRead, HostRequest, HotplugOp, JobResult, JobSpec,
};
use perfbed_device::regs::{whole_units, Event};

use super::context::{Ctx, MIB, TIMES};
use super::moves::{movable_domain, MOVING_RATE};
use crate::build::image::arch::Arch;
use crate::checks::Check;
use crate::guest::pmu_name;

/// The raw tracepoints the reader hangs on on a guest of `arch`: the timer
/// tick of every online CPU, at HZ (250), idle or not (`HZ_PERIODIC`).
///
/// On x86 a CPU's tick is its local APIC timer's interrupt
/// (`local_timer_entry`), also where the APIC timer is off (`noapictimer`,
/// under TCG) and the PIT's tick is broadcast to the other CPUs on that
/// vector; the PIT's own interrupt, on CPU 0, is an `irq_handler_entry`.
/// (The tick is no hrtimer there: the guest cannot switch to high
/// resolution without the APIC timer.)
///
/// On arm64 the tick is an hrtimer on each CPU's architected timer, whose
/// interrupt is a per-CPU PPI: `handle_percpu_devid_irq()` traces it as an
/// `irq_handler_entry` on every CPU (x86's `local_timer_entry` is an x86
/// tracepoint, `irq_vectors`, which arm64 has not).
pub fn tracepoints(arch: Arch) -> &'static [&'static str] {
    match arch {
        Arch::X86_64 => &["local_timer_entry", "irq_handler_entry"],
        Arch::Arm64 => &["irq_handler_entry"],
    }
}
const RMID: u32 = 5;
/// The RMID of the events an open-close loop opens and closes meanwhile on
/// another CPU: each close takes the domain's lock there, which a BPF read
/// on the owner may find held.
const RMID_LOOP: u32 = 6;
/// How long each step's traffic flows before its reads are judged: about
/// 60 ticks of the owner.
const STEP: Duration = Duration::from_millis(250);
/// Problems of one kind shown at most (all are counted).
const SHOWN: usize = 3;

/// What the reader's reads came to, judged drain by drain.
#[derive(Debug, Default)]
struct Tally {
    reads: u64,
    /// Reads that succeeded, by CPU.
    read_on: BTreeMap<u32, u64>,
    /// Failed reads by errno name.
    errors: BTreeMap<String, u64>,
    /// Changes of the CPU that read successfully: the event's CPU moved.
    moves: u64,
    /// Successful reads on a CPU outside the domain (the PMU parked, its
    /// events waiting there), and how many times such a run began.
    parked_reads: u64,
    parks: u64,
    /// The last successful read.
    last: Option<BpfRead>,
    ahead: Vec<String>,
    backwards: Vec<String>,
    ahead_count: u64,
    backwards_count: u64,
}

impl Tally {
    /// Judges one drain's `reads`: each successful value at most `bound`
    /// (the count the device's truth allowed after them), and never below
    /// the one read before it.
    fn add(&mut self, mut reads: Vec<BpfRead>, bound: u64, allowed: &[u32]) {
        // The queue is in push order; the times order the reads themselves
        // (those that succeed are made on one CPU at a time: the event's).
        reads.sort_by_key(|r| r.time_ns);
        for r in reads {
            self.reads += 1;
            if r.ret != 0 {
                *self.errors.entry(errno_name(-r.ret)).or_default() += 1;
                continue;
            }
            *self.read_on.entry(r.cpu).or_default() += 1;
            let parked = !allowed.contains(&r.cpu);
            if parked {
                self.parked_reads += 1;
            }
            if let Some(last) = &self.last {
                if last.cpu != r.cpu {
                    self.moves += 1;
                    if parked && allowed.contains(&last.cpu) {
                        self.parks += 1;
                    }
                }
                if r.value < last.value {
                    self.backwards_count += 1;
                    if self.backwards.len() < SHOWN {
                        self.backwards.push(format!(
                            "{} on CPU {} at {} ns after {} on CPU {} at {} ns",
                            r.value, r.cpu, r.time_ns, last.value, last.cpu, last.time_ns
                        ));
                    }
                }
            }
            if r.value > bound {
                self.ahead_count += 1;
                if self.ahead.len() < SHOWN {
                    self.ahead.push(format!(
                        "{} on CPU {} at {} ns, the truth after it {bound}",
                        r.value, r.cpu, r.time_ns
                    ));
                }
            }
            self.last = Some(r);
        }
    }

    fn ok(&self) -> u64 {
        self.read_on.values().sum()
    }

    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.ahead_count > 0 {
            problems.push(format!(
                "{} values ahead of the device's truth: {}",
                self.ahead_count,
                self.ahead.join(", ")
            ));
        }
        if self.backwards_count > 0 {
            problems.push(format!(
                "{} values below one read before: {}",
                self.backwards_count,
                self.backwards.join(", ")
            ));
        }
        // Off the event's CPU perf_event_read_local() says EINVAL; any other
        // refusal is a read path that does not work.
        let other: Vec<String> = self
            .errors
            .iter()
            .filter(|(name, _)| name.as_str() != "EINVAL")
            .map(|(name, n)| format!("{name} ×{n}"))
            .collect();
        if !other.is_empty() {
            problems.push(format!("reads refused: {}", other.join(", ")));
        }
        if self.ok() == 0 {
            problems.push(format!("no read succeeded in {} reads", self.reads));
        } else if self.moves == 0 {
            problems.push(format!(
                "every read that succeeded was on CPU {:?}: the reader never saw the event move",
                self.read_on.keys().collect::<Vec<_>>()
            ));
        }
        problems
    }

    fn errors(&self) -> String {
        if self.errors.is_empty() {
            return "none".into();
        }
        let each: Vec<String> = self
            .errors
            .iter()
            .map(|(name, n)| format!("{name} ×{n}"))
            .collect();
        each.join(", ")
    }
}

/// The steps: the owner flaps twice, the domain parks, returns, the owner
/// flaps again.
fn steps(pmu: &str, allowed: &[u32]) -> Vec<Vec<HotplugOp>> {
    let flap = || vec![HotplugOp::FlapOwner { pmu: pmu.into() }];
    let set = |online: bool| -> Vec<HotplugOp> {
        let mut cpus = allowed.to_vec();
        if online {
            cpus.reverse();
        }
        cpus.into_iter()
            .map(|cpu| HotplugOp::Set { cpu, online })
            .collect()
    };
    vec![flap(), flap(), set(false), set(true), flap()]
}

/// `cargo xtask run`'s "BPF reads while moving".
pub fn while_moving(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let pmu = pmu_name(d);
    let key = (d as u32, RMID, Event::MbmTotalBytes);
    let mut attr = ctx.attr(d, key.2, RMID);
    attr.read_format = TIMES;
    let h = match ctx.g.open(attr, None)? {
        Ok(h) => h,
        Err(errno) => bail!("opening {pmu}/mbm_total_bytes,rmid={RMID}/: {errno}"),
    };
    let state = ctx.control.state()?;
    let start = Ctx::truth(&state, d, RMID, key.2);
    let violations_before: u64 = state.domains.iter().map(|dom| dom.violations).sum();
    let contended_before = ctx.g.pmu_count(&pmu, "reads_contended")?;
    let skipped_before = ctx.g.pmu_count(&pmu, "reads_skipped_nmi")?;
    let unit = ctx.device.unit_bytes;
    let mut loop_attr = ctx.attr(d, Event::MbmLocalBytes, RMID_LOOP);
    loop_attr.read_format = TIMES;
    let job = match ctx.g.ask(HostRequest::StartJob {
        spec: JobSpec::OpenCloseLoop {
            attrs: vec![loop_attr],
            pause_us: 200,
        },
    })? {
        AgentMessage::JobStarted { job } => job,
        other => bail!("starting the open-close loop: {other:?}"),
    };
    let tracepoints = tracepoints(ctx.g.vm.arch);
    ctx.g.bpf_reader_start(h, tracepoints)?;
    ctx.control.set_rate(key.0, key.1, key.2, MOVING_RATE)?;

    let mut tally = Tally::default();
    let mut masks = Vec::new();
    let mut problems = Vec::new();
    for ops in steps(&pmu, &allowed) {
        let request = HostRequest::HotplugBatch {
            ops,
            watch_pmus: vec![pmu.clone()],
            read_handles: vec![],
        };
        match ctx.g.ask(request)? {
            AgentMessage::HotplugBatch(result) => {
                problems.extend(result.ops.iter().filter_map(|op| op.error.clone()));
                masks.extend(
                    result
                        .ops
                        .iter()
                        .flat_map(|op| op.between.iter().chain(&op.masks))
                        .map(|m| if m.is_empty() { "parked" } else { m }.to_string()),
                );
            }
            other => bail!("hotplug batch: {other:?}"),
        }
        std::thread::sleep(STEP);
        ctx.control.inject(key.0, key.1, key.2, MIB)?;
        let (reads, _) = ctx.g.bpf_reader_drain(false)?;
        let truth = Ctx::truth(&ctx.control.state()?, d, RMID, key.2) - start;
        tally.add(reads, whole_units(truth, unit), &allowed);
    }
    ctx.control.set_rate(key.0, key.1, key.2, 0)?;
    ctx.control.wait_landed(ctx.g.timeout.as_millis() as u64)?;
    let (reads, dropped) = ctx.g.bpf_reader_drain(true)?;
    let opens = match ctx.g.ask(HostRequest::StopJob {
        job,
        signal: 0,
        timeout_ms: 20_000,
    })? {
        AgentMessage::JobDone(JobResult::OpenCloseLoop { opened, .. }) => opened,
        other => bail!("stopping the open-close loop: {other:?}"),
    };
    let v = ctx.g.read(h)?;
    ctx.g.close(h)?;
    let state = ctx.control.state()?;
    let truth = whole_units(Ctx::truth(&state, d, RMID, key.2) - start, unit);
    // After the traffic stopped the truth is final, and so is the count.
    tally.add(reads, truth, &allowed);
    let contended = ctx.g.pmu_count(&pmu, "reads_contended")? - contended_before;
    let skipped = ctx.g.pmu_count(&pmu, "reads_skipped_nmi")? - skipped_before;
    let violations =
        state.domains.iter().map(|dom| dom.violations).sum::<u64>() - violations_before;

    problems.extend(tally.problems());
    if v[0] != truth {
        problems.push(format!(
            "read() at the end gave {}, the device's truth is {truth} (in whole units)",
            v[0]
        ));
    }
    if dropped != 0 {
        problems.push(format!("{dropped} reads the reader could not record"));
    }
    if !masks.iter().any(|m| m == "parked") {
        problems.push(format!("{pmu} never parked: {masks:?}"));
    }
    if violations != 0 {
        problems.push(format!(
            "the device counted {violations} placement violations"
        ));
    }
    let on: Vec<String> = tally
        .read_on
        .iter()
        .map(|(cpu, n)| format!("CPU {cpu} ×{n}"))
        .collect();
    // What was seen, shown whether the check passes or not.
    let seen = format!(
        "{pmu} at {} MiB/s, {} on every CPU: {} reads, {} succeeded ({}), refused {}; the event's CPU changed {} times under the reader, {} parks ({} reads while parked); placements {}; final read() {}; driver: {contended} contended reads, {skipped} skipped in NMI, beside {opens} opens and closes of another event",
        MOVING_RATE / MIB,
        tracepoints.join(" and "),
        tally.reads,
        tally.ok(),
        on.join(", "),
        tally.errors(),
        tally.moves,
        tally.parks,
        tally.parked_reads,
        masks.join("→"),
        v[0],
    );
    if !problems.is_empty() {
        problems.push(format!("seen: {seen}"));
    }
    Ok(Check::from_problems(
        "BPF reads while moving",
        problems,
        format!("{seen}; 0 values ahead of the truth, 0 going back, the final count = truth"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(time_ns: u64, cpu: u32, ret: i32, value: u64) -> BpfRead {
        BpfRead {
            time_ns,
            cpu,
            ret,
            value,
            enabled: time_ns,
            running: time_ns,
        }
    }

    #[test]
    fn reads_that_move_park_and_grow_pass() {
        let mut t = Tally::default();
        t.add(
            vec![
                read(3, 2, 0, 200),
                read(1, 2, 0, 100),
                read(2, 3, -22, 0),
                read(4, 3, 0, 200),
                read(5, 0, 0, 200),
            ],
            300,
            &[2, 3],
        );
        assert_eq!(t.problems(), Vec::<String>::new());
        assert_eq!(
            (t.reads, t.ok(), t.moves, t.parks, t.parked_reads),
            (5, 4, 2, 1, 1)
        );
        assert_eq!(t.errors(), "EINVAL ×1");
    }

    #[test]
    fn a_value_ahead_of_the_truth_or_going_back_fails() {
        let mut t = Tally::default();
        t.add(vec![read(1, 2, 0, 100), read(2, 3, 0, 400)], 300, &[2, 3]);
        assert_eq!(t.ahead_count, 1, "{:?}", t.problems());
        t.add(vec![read(3, 3, 0, 350)], 500, &[2, 3]);
        assert_eq!(t.backwards_count, 1);
        assert_eq!(t.problems().len(), 2, "{:?}", t.problems());
    }

    #[test]
    fn reads_that_never_move_or_fail_otherwise_fail() {
        let mut t = Tally::default();
        t.add(vec![read(1, 2, 0, 1), read(2, 2, -95, 0)], 10, &[2, 3]);
        let problems = t.problems();
        assert!(
            problems.iter().any(|p| p.contains("EOPNOTSUPP ×1")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("never saw the event move")),
            "{problems:?}"
        );
        assert!(Tally::default().problems()[0].contains("no read succeeded"));
    }
}
