//! Shrinking a failing run to the smallest scenario that still fails the
//! same way. The journal is cut at its first finding (the target: a read,
//! an open, ...). The first candidate is the cut journal as a scenario; the
//! second keeps only what the target depends on (its group's opens,
//! ioctls, reads and closes; the bursts and gauges of its keys; its
//! domain's placements; the other events of its PMU, which contend for its
//! slots); then delta debugging reduces the smallest of them that still
//! fails: Zeller and Hildebrandt's ddmin ("Simplifying and Isolating
//! Failure-Inducing Input", IEEE TSE 28(2), 2002), over the journal's
//! steps, in the guest that ran the journal, with the guest's state reset
//! between candidates (`scenario_guest::shrink_on_guest`).
//!
//! A candidate is a subset of the cut journal's steps, made replayable:
//! a step on a handle whose open is left out goes with it (a sibling's
//! open with its leader's). One the parser refuses (an unpark of a domain
//! that is not parked, a move with one CPU online) or whose refused opens
//! the model does not expect is not run: it does not fail. One that runs
//! fails only if its first finding is at the target, by the same rule
//! (the finding's text, numbers aside), and does so twice: a failure seen
//! once on a loaded machine is not taken for the bug.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::model::{DeviceShape, Handle};
use crate::progress::human;

use super::journal::{Entry, Opened, Step};
use super::replay::Finding;
use super::scenario::{parse, wants_against_model, Layout};
use super::scenario_write::{sayable, writable, write, Line};

/// How to shrink: how long it may take, how many candidate runs it may
/// make, and the command that runs a scenario on the run's guest (its
/// flags, its mutant), which the scenario written is to be run with.
#[derive(Debug, Clone)]
pub struct Shrinking {
    pub time: Duration,
    pub candidates: usize,
    pub command: String,
}

impl Shrinking {
    /// At most 400 candidate runs in `time`.
    pub fn new(time: Duration, command: String) -> Shrinking {
        Shrinking {
            time,
            candidates: 400,
            command,
        }
    }
}

/// Delta debugging (Zeller's ddmin): a subset of `items` for which `fails`
/// holds, 1-minimal (no single item can go) unless `more` said stop first.
/// `fails(items)` is assumed; each subset is tested at most once.
pub fn ddmin<T: Clone + Ord>(
    items: &[T],
    mut fails: impl FnMut(&[T]) -> bool,
    mut more: impl FnMut() -> bool,
) -> Vec<T> {
    let mut current = items.to_vec();
    let mut tested: BTreeMap<Vec<T>, bool> = BTreeMap::new();
    let mut test = |subset: Vec<T>, fails: &mut dyn FnMut(&[T]) -> bool| -> bool {
        *tested
            .entry(subset.clone())
            .or_insert_with(|| fails(&subset))
    };
    let mut n = 2;
    'outer: while current.len() >= 2 && more() {
        let chunk = current.len().div_ceil(n);
        let chunks: Vec<Vec<T>> = current.chunks(chunk).map(<[T]>::to_vec).collect();
        // Reduce to a subset.
        for c in &chunks {
            if !more() {
                break 'outer;
            }
            if test(c.clone(), &mut fails) {
                current = c.clone();
                n = 2;
                continue 'outer;
            }
        }
        // Reduce to a complement.
        if chunks.len() > 2 {
            for i in 0..chunks.len() {
                if !more() {
                    break 'outer;
                }
                let complement: Vec<T> = chunks
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != i)
                    .flat_map(|(_, c)| c.iter().cloned())
                    .collect();
                if test(complement.clone(), &mut fails) {
                    current = complement;
                    n = (n - 1).max(2);
                    continue 'outer;
                }
            }
        }
        // Finer.
        if n >= current.len() {
            break;
        }
        n = (2 * n).min(current.len());
    }
    current
}

/// A run's first finding, to shrink.
pub struct Failing<'a> {
    /// The run's journal.
    pub journal: &'a [Entry],
    /// Each domain's CPU at the run's start (`None` or none given: its
    /// first, where a scenario starts it).
    pub owners: Vec<Option<u32>>,
    pub first: Finding,
}

/// The rule a finding broke: its text with the numbers (handles, values)
/// left out.
pub fn rule(text: &str) -> String {
    text.chars().filter(|c| !c.is_ascii_digit()).collect()
}

/// The errnos a scenario's `want NAME ERRNO` can name.
const WANTED_ERRNOS: [&str; 3] = ["ENODEV", "EINVAL", "EBADF"];

/// The steps of `journal` at `keep` (sorted indices) made replayable: each
/// step with a handle whose open is left out goes too. Answers the lines
/// and the journal index of each.
pub fn candidate(
    journal: &[Entry],
    keep: &[usize],
    domains: &[Vec<u32>],
    owners: &[Option<u32>],
) -> (Vec<Line>, Vec<usize>) {
    let mut live: BTreeSet<Handle> = BTreeSet::new();
    let mut lines = Vec::new();
    for &i in keep {
        let entry = &journal[i];
        if !writable(&entry.step) {
            continue;
        }
        let mut line = Line::new(entry.step.clone());
        match (&entry.step, &entry.result) {
            (Step::Open { event, expect }, result) => {
                if event.group.is_some_and(|l| !live.contains(&l)) {
                    continue;
                }
                match result {
                    Ok(_) => {
                        live.insert(*expect);
                    }
                    Err(e) if WANTED_ERRNOS.contains(&e.as_str()) => line.refused = Some(e.clone()),
                    // Refused otherwise: the run's finding, at the target.
                    Err(_) => {}
                }
            }
            (
                Step::Ioctl { handle, .. }
                | Step::Request { handle, .. }
                | Step::Read { handle }
                | Step::Close { handle },
                _,
            ) => {
                if !live.contains(handle) {
                    continue;
                }
                if matches!(entry.step, Step::Close { .. }) {
                    live.remove(handle);
                }
            }
            _ => {}
        }
        lines.push((line, i));
    }
    // A moving thread still running after the last step kept (the target
    // came inside its stretch) stops after it: a scenario ends with every
    // thread stopped.
    let mut moving: BTreeSet<u32> = BTreeSet::new();
    for (line, _) in &lines {
        match line.step {
            Step::MovesStart { domain, .. } => {
                moving.insert(domain);
            }
            Step::MovesStop { domain, .. } => {
                moving.remove(&domain);
            }
            _ => {}
        }
    }
    if let Some(&last) = keep.last() {
        for domain in moving {
            lines.push((Line::new(Step::MovesStop { domain, job: 0 }), last));
        }
    }
    sayable(lines, domains, owners, usize::MAX)
        .into_iter()
        .unzip()
}

/// The steps the target at `target` depends on, besides itself: see the
/// module's comment. `cpus` are the domains' CPUs.
pub fn depends(journal: &[Entry], target: usize, domains: &[Vec<u32>]) -> BTreeSet<usize> {
    // The handles the target is about: its event's group, all who were in
    // it; then the domains and keys of those, and their CPUs.
    let about = match &journal[target].step {
        Step::Open { expect, event, .. } => Some((*expect, event.group)),
        Step::Ioctl { handle, .. }
        | Step::Request { handle, .. }
        | Step::Read { handle }
        | Step::Close { handle } => Some((*handle, None)),
        _ => None,
    };
    let mut opens: BTreeMap<Handle, Opened> = BTreeMap::new();
    for e in &journal[..=target] {
        if let (Step::Open { event, expect }, Ok(_)) = (&e.step, &e.result) {
            opens.insert(*expect, *event);
        }
    }
    let mut group: BTreeSet<Handle> = BTreeSet::new();
    if let Some((h, leader)) = about {
        let leader = leader
            .or_else(|| opens.get(&h).and_then(|o| o.group))
            .unwrap_or(h);
        group.insert(h);
        group.insert(leader);
        group.extend(
            opens
                .iter()
                .filter(|(_, o)| o.group == Some(leader))
                .map(|(&s, _)| s),
        );
    }
    let mut pmus = BTreeSet::new();
    let mut keys = BTreeSet::new();
    let mut cpus = BTreeSet::new();
    for h in &group {
        if let Some(o) = opens.get(h) {
            match o.pmu {
                Some(d) => {
                    pmus.insert(d);
                    keys.insert((d, o.event, o.rmid));
                }
                None => cpus.extend(u32::try_from(o.cpu).ok()),
            }
        }
    }
    for (d, dcpus) in domains.iter().enumerate() {
        if dcpus.iter().any(|c| cpus.contains(c)) {
            pmus.insert(d as u32);
        }
    }
    // A driver count's line (`lost_wraps`, `irqs_on_owner`, ...) is about
    // its domain: its placements, and the traffic into it that could wrap a
    // counter or raise its interrupt.
    let wraps = match journal[target].step {
        Step::DriverCount { domain, .. } => Some(domain),
        _ => None,
    };
    pmus.extend(wraps);
    let on_pmus = |h: &Handle| {
        opens
            .get(h)
            .is_some_and(|o| o.pmu.is_some_and(|d| pmus.contains(&d)) || group.contains(h))
    };
    let mut out = BTreeSet::new();
    for (i, e) in journal[..target].iter().enumerate() {
        let keep = match &e.step {
            // (A refused open's handle is the next open's.)
            Step::Open { expect, event } => {
                (e.result.is_ok() && on_pmus(expect))
                    || event.pmu.is_some_and(|d| pmus.contains(&d))
            }
            Step::Ioctl { handle, .. }
            | Step::Request { handle, .. }
            | Step::Read { handle }
            | Step::Until { handle, .. }
            | Step::Close { handle } => on_pmus(handle),
            Step::Burst { domain, .. } | Step::Rate { domain, .. } if wraps == Some(*domain) => {
                true
            }
            Step::Burst {
                domain,
                event,
                rmid,
                ..
            } => keys.contains(&(*domain, *event, *rmid)),
            Step::Occupancy { domain, rmid, .. } => keys.contains(&(*domain, 1, *rmid)),
            Step::Rate {
                domain,
                event,
                rmid,
                ..
            } if *rmid != super::generate::RMID_RATE => keys.contains(&(*domain, *event, *rmid)),
            Step::Rate { domain, .. }
            | Step::Move { domain }
            | Step::MovesStart { domain, .. }
            | Step::MovesStop { domain, .. }
            | Step::Park { domain }
            | Step::Unpark { domain, .. }
            | Step::Allowed { domain, .. }
            | Step::MuxInterval { domain, .. }
            | Step::DriverCount { domain, .. }
            | Step::Cpumask { domain, .. }
            | Step::StatStart { domain, .. }
            | Step::StatStop { domain, .. } => pmus.contains(domain),
            Step::Online { cpu } | Step::Offline { cpu } | Step::FailAt { cpu, .. } => {
                cpus.contains(cpu)
                    || pmus
                        .iter()
                        .any(|&d| domains.get(d as usize).is_some_and(|c| c.contains(cpu)))
            }
            Step::Wait { .. }
            | Step::Violations
            | Step::AllowedRefused { .. }
            | Step::Reload { .. } => true,
            Step::OthersOpen { .. } | Step::PerfStat { .. } | Step::Seen { .. } => false,
        };
        if keep {
            out.insert(i);
        }
    }
    out
}

/// What shrinking came to.
pub struct Shrunk {
    /// The scenario written, and how many operations it has.
    pub file: PathBuf,
    pub before: usize,
    pub after: usize,
    pub candidates: usize,
    pub time: Duration,
    /// The command that runs it.
    pub command: String,
    /// Why shrinking stopped before its budget ran out (the guest failed).
    pub stopped: Option<String>,
}

impl Shrunk {
    pub fn text(&self) -> String {
        let stopped = self
            .stopped
            .as_ref()
            .map_or(String::new(), |e| format!("; stopped early: {e}"));
        format!(
            "shrunk: {} operations to {} in {} ({} candidate runs{stopped}); run it with:\n    {} {}",
            self.before,
            self.after,
            human(self.time),
            self.candidates,
            self.command,
            self.file.display()
        )
    }
}

/// A candidate's scenario text run on the guest: its first finding, if
/// any, as the index of its step in the journal shrunk (the candidate's
/// steps' indices are given beside the text) and its text; `Err`: the
/// guest could not run it.
pub type Oracle<'a> = dyn FnMut(&str, &[usize]) -> Result<Option<(usize, String)>> + 'a;

/// Shrinks `failing` with `oracle`; writes the smallest scenario that
/// fails the same way to `file`. `Err(why)` inside when the target cannot
/// be written as a scenario, or the cut journal as one does not fail the
/// same way.
pub fn shrink(
    failing: &Failing,
    layout: &Layout,
    shape: DeviceShape,
    budget: &Shrinking,
    file: &Path,
    oracle: &mut Oracle,
) -> Result<Result<Shrunk, String>> {
    let start = Instant::now();
    let target = failing.first.index;
    if !writable(&failing.journal[target].step) {
        return Ok(Err(format!(
            "a scenario cannot say operation {target} ({:?})",
            failing.journal[target].step
        )));
    }
    let rule_of = rule(&failing.first.text);
    // What the first candidate run showed, when not the failure.
    let seen: std::cell::RefCell<Option<String>> = Default::default();
    let before = (0..=target)
        .filter(|&i| writable(&failing.journal[i].step))
        .count();
    let runs = std::cell::Cell::new(0usize);
    let error: std::cell::RefCell<Option<anyhow::Error>> = Default::default();
    let mut fails = |keep: &[usize]| -> bool {
        let mut keep = keep.to_vec();
        keep.push(target);
        keep.sort_unstable();
        keep.dedup();
        let (lines, at) = candidate(failing.journal, &keep, &layout.domains, &failing.owners);
        if at.last() != Some(&target) {
            return false;
        }
        let text = write(None, &[], &lines);
        match parse(file, &text, layout, 1) {
            Ok(s) if wants_against_model(&s, shape).is_empty() => {}
            Ok(s) => {
                let why = format!("the model refuses it: {:?}", wants_against_model(&s, shape));
                seen.borrow_mut().get_or_insert(why);
                return false;
            }
            Err(e) => {
                seen.borrow_mut()
                    .get_or_insert(format!("it does not parse: {e}"));
                return false;
            }
        }
        // Twice: a failure once only is not the bug's.
        for _ in 0..2 {
            runs.set(runs.get() + 1);
            match oracle(&text, &at) {
                Ok(Some((i, t))) if i == target && rule(&t) == rule_of => {}
                Ok(other) => {
                    seen.borrow_mut().get_or_insert(match other {
                        Some((i, t)) => format!("its first finding was at operation {i}: {t}"),
                        None => "it passed".into(),
                    });
                    return false;
                }
                Err(e) => {
                    error.borrow_mut().get_or_insert(e);
                    return false;
                }
            }
        }
        true
    };
    let all: Vec<usize> = (0..target).collect();
    if !fails(&all) {
        return match error.take() {
            Some(e) => Err(e.context("running the cut journal as a scenario")),
            None => Ok(Err(format!(
                "the journal cut at operation {target} does not fail the same way as a scenario: {}",
                seen.take().unwrap_or_default()
            ))),
        };
    }
    let sliced: Vec<usize> = depends(failing.journal, target, &layout.domains)
        .into_iter()
        .collect();
    let from = if sliced.len() < all.len() && fails(&sliced) {
        sliced
    } else {
        all
    };
    let deadline = start + budget.time;
    let kept = ddmin(&from, &mut fails, || {
        Instant::now() < deadline && runs.get() < budget.candidates && error.borrow().is_none()
    });
    let mut keep = kept;
    keep.push(target);
    keep.sort_unstable();
    let (lines, _) = candidate(failing.journal, &keep, &layout.domains, &failing.owners);
    let comments = vec![
        format!("shrunk from {before} operations: {}", failing.first.text),
        format!("run with: {} {}", budget.command, file.display()),
    ];
    std::fs::write(file, write(None, &comments, &lines))?;
    Ok(Ok(Shrunk {
        file: file.to_path_buf(),
        before,
        after: lines.len(),
        candidates: runs.get(),
        time: start.elapsed(),
        command: budget.command.clone(),
        stopped: error.take().map(|e| format!("{e:#}")),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ddmin_finds_the_items_a_failure_needs_and_tests_each_subset_once() {
        // Fails when 3, 17 and 42 are all in: ddmin finds exactly those.
        let items: Vec<usize> = (0..60).collect();
        let mut seen = BTreeSet::new();
        let mut repeats = 0;
        let kept = ddmin(
            &items,
            |s| {
                repeats += usize::from(!seen.insert(s.to_vec()));
                [3, 17, 42].iter().all(|x| s.contains(x))
            },
            || true,
        );
        assert_eq!(kept, vec![3, 17, 42]);
        assert_eq!(repeats, 0);
        // One item alone; and a budget that stops at once keeps everything.
        assert_eq!(ddmin(&items, |s| s.contains(&59), || true), vec![59]);
        assert_eq!(ddmin(&items, |s| s.contains(&59), || false), items);
    }

    #[test]
    fn ddmin_result_is_one_minimal_for_a_failure_of_pairs() {
        // Fails when some adjacent pair (2k, 2k+1) is in: any single item
        // taken from the result must make it pass.
        let items: Vec<usize> = (0..32).collect();
        let f = |s: &[usize]| s.windows(2).any(|w| w[0] % 2 == 0 && w[1] == w[0] + 1);
        let kept = ddmin(&items, f, || true);
        assert!(f(&kept));
        for i in 0..kept.len() {
            let mut less = kept.clone();
            less.remove(i);
            assert!(!f(&less), "{kept:?} without {}", kept[i]);
        }
    }

    fn open(expect: Handle, pmu: u32, rmid: u32, group: Option<Handle>) -> Entry {
        entry(
            Step::Open {
                event: Opened::counter(pmu, rmid, group),
                expect,
            },
            Ok(vec![u64::from(expect)]),
        )
    }

    fn entry(step: Step, result: Result<Vec<u64>, String>) -> Entry {
        Entry {
            step,
            result,
            took_ns: 1,
            at_ns: 0,
            returned_ns: 0,
            flowed: Vec::new(),
        }
    }

    fn ok(step: Step) -> Entry {
        entry(step, Ok(vec![]))
    }

    #[test]
    fn a_candidate_drops_what_names_an_open_it_left_out() {
        let journal = vec![
            open(1, 1, 1, None),
            open(2, 1, 2, Some(1)),
            ok(Step::Read { handle: 2 }),
            open(3, 0, 1, None),
            ok(Step::Close { handle: 1 }),
            ok(Step::Read { handle: 3 }),
        ];
        // Without 1's open: its sibling, the sibling's read and 1's close go.
        let (lines, at) = candidate(&journal, &[1, 2, 3, 4, 5], &[vec![0, 1], vec![2, 3]], &[]);
        assert_eq!(at, vec![3, 5]);
        assert_eq!(lines.len(), 2);
        let (_, at) = candidate(&journal, &[0, 1, 2, 4, 5], &[vec![0, 1], vec![2, 3]], &[]);
        assert_eq!(at, vec![0, 1, 2, 4], "3's read without its open");
    }

    #[test]
    fn a_candidate_cut_inside_a_stretch_stops_its_thread_after_the_target() {
        let start = ok(Step::MovesStart {
            domain: 1,
            cpus: vec![2, 3],
        });
        let stop = ok(Step::MovesStop { domain: 1, job: 0 });
        let journal = vec![
            open(1, 1, 1, None),
            start.clone(),
            ok(Step::Read { handle: 1 }),
            stop,
            start,
            ok(Step::Read { handle: 1 }),
        ];
        let domains = [vec![0, 1], vec![2, 3]];
        let (lines, at) = candidate(&journal, &[0, 1, 2, 3, 4, 5], &domains, &[]);
        assert_eq!(at, vec![0, 1, 2, 3, 4, 5, 5]);
        assert_eq!(lines[6].step, Step::MovesStop { domain: 1, job: 0 });
        let (lines, at) = candidate(&journal, &[0, 1, 2, 3], &domains, &[]);
        assert_eq!(at, vec![0, 1, 2, 3], "stopped already");
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn a_read_depends_on_its_group_its_keys_and_its_domain() {
        let burst = |domain, rmid| {
            ok(Step::Burst {
                domain,
                event: 2,
                rmid,
                bytes: 4096,
            })
        };
        let journal = vec![
            open(1, 1, 1, None),          // 0: the group's leader
            open(2, 1, 2, Some(1)),       // 1: its sibling
            open(3, 0, 1, None),          // 2: another domain's
            open(4, 1, 3, None),          // 3: contends for domain 1's slots
            burst(1, 2),                  // 4: the sibling's key
            burst(0, 1),                  // 5: domain 0's
            ok(Step::Move { domain: 0 }), // 6
            ok(Step::Move { domain: 1 }), // 7
            ok(Step::Read { handle: 3 }), // 8
            ok(Step::Read { handle: 1 }), // 9: the target
        ];
        let kept: Vec<usize> = depends(&journal, 9, &[vec![0, 1], vec![2, 3]])
            .into_iter()
            .collect();
        assert_eq!(kept, vec![0, 1, 3, 4, 7]);
    }

    #[test]
    fn a_rule_is_a_findings_text_without_its_numbers() {
        assert_eq!(
            rule("read of event 5: event 5: value +3145728, expected +0"),
            rule("read of event 2: event 2: value +1024, expected +7")
        );
        assert_ne!(
            rule("read of event 5: event 5: value +3145728, expected +0"),
            rule("read of event 5: event 5: time_running +3, expected +0")
        );
    }
}
