//! The checker: replays a journal through the model of perf's counting
//! semantics and names every step whose result differs from it. The first
//! finding is the one to look at: later ones may follow from it.

use std::collections::BTreeMap;

use crate::checks::counting::{DeviceShape, Handle, Kind, Model, Observed, OpenSpec};

use super::journal::{Entry, ReadFormat, StatHow, Step, PARKED};
use super::reads;

/// A step whose result the model does not allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The step's index in the journal.
    pub index: usize,
    pub text: String,
}

/// The handle the model gives a perf stat's event (the agent's are small).
const PERF_STAT_HANDLE: Handle = u32::MAX;

/// What the replay found.
#[derive(Debug, Default)]
pub struct Replay {
    pub findings: Vec<Finding>,
    /// Opens the kernel refused with EBUSY.
    pub ebusy: u64,
    /// The longest open, in ns.
    pub longest_open_ns: u64,
    /// Reads checked, member values compared.
    pub reads: u64,
    pub values: u64,
}

/// Replays `journal` on a device of `shape`.
pub fn replay(shape: DeviceShape, journal: &[Entry]) -> Replay {
    let mut model = Model::new(shape);
    let mut formats: BTreeMap<Handle, ReadFormat> = BTreeMap::new();
    let mut ids: BTreeMap<Handle, u64> = BTreeMap::new();
    // When each parked domain was parked (the journal's host clock).
    let mut parked_at: BTreeMap<u32, u64> = BTreeMap::new();
    let mut out = Replay::default();
    for (index, entry) in journal.iter().enumerate() {
        let mut find = |text: String| out.findings.push(Finding { index, text });
        match (&entry.step, &entry.result) {
            (Step::Open { event, expect }, result) => {
                out.longest_open_ns = out.longest_open_ns.max(entry.took_ns);
                let spec = event.spec();
                let predicted = model.predict_open(&spec);
                match (predicted, result) {
                    (Ok(()), Ok(words)) if words.as_slice() == [u64::from(*expect)] => {
                        model.open(*expect, spec);
                        formats.insert(*expect, event.read_format);
                    }
                    (Ok(()), Ok(words)) => find(format!(
                        "the open gave handle {words:?}, the stress expected {expect}"
                    )),
                    (Err(r), Err(errno)) if r.errno() == errno => {}
                    (Ok(()), Err(errno)) => {
                        if errno == "EBUSY" {
                            out.ebusy += 1;
                        }
                        find(format!(
                            "the open failed with {errno}, the model expected it to open"
                        ))
                    }
                    (Err(r), got) => find(format!(
                        "the open gave {got:?}, the model expected {} ({r:?})",
                        r.errno()
                    )),
                }
            }
            (
                Step::Ioctl {
                    handle,
                    ioctl,
                    group,
                },
                result,
            ) => match (model.is_open(*handle), result) {
                (true, Ok(_)) => model.ioctl(*handle, ioctl.model(), *group),
                (false, Err(errno)) if errno == "EBADF" => {}
                (open, got) => find(format!(
                    "{ioctl:?} (group {group}) on event {handle} (open: {open}) gave {got:?}"
                )),
            },
            (Step::Read { handle }, result) => {
                let Some(&format) = formats.get(handle).filter(|_| model.is_open(*handle)) else {
                    if !matches!(result, Err(e) if e == "EBADF") {
                        find(format!("reading closed event {handle} gave {result:?}"));
                    }
                    continue;
                };
                let words = match result {
                    Ok(words) => words,
                    Err(errno) => {
                        find(format!("reading event {handle} failed: {errno}"));
                        continue;
                    }
                };
                let members = if format.group {
                    model.group(model.leader(*handle).unwrap_or(*handle))
                } else {
                    vec![*handle]
                };
                let members = match reads::parse(words, format, *handle, &members) {
                    Ok(m) => m,
                    Err(e) => {
                        find(format!("reading event {handle}: {e}"));
                        continue;
                    }
                };
                out.reads += 1;
                for m in members {
                    out.values += 1;
                    for mismatch in model.read(m.handle, m.observed) {
                        find(format!("read of event {handle}: {mismatch}"));
                    }
                    if let Some(id) = m.id {
                        let first = *ids.entry(m.handle).or_insert(id);
                        if first != id {
                            find(format!(
                                "event {}'s PERF_FORMAT_ID changed from {first} to {id}",
                                m.handle
                            ));
                        } else if let Some((other, _)) =
                            ids.iter().find(|&(&h, &i)| i == id && h != m.handle)
                        {
                            find(format!(
                                "events {} and {other} read the same id {id}",
                                m.handle
                            ));
                        }
                    }
                }
            }
            (Step::Close { handle }, result) => {
                if model.is_open(*handle) != result.is_ok() {
                    find(format!("closing event {handle} gave {result:?}"));
                }
                model.close(*handle);
                formats.remove(handle);
                ids.remove(handle);
            }
            (_, Err(e)) => find(format!("{:?} failed: {e}", entry.step)),
            (
                &Step::Burst {
                    domain,
                    event,
                    rmid,
                    bytes,
                },
                Ok(_),
            ) => model.burst(domain, event, rmid, bytes),
            (
                &Step::Occupancy {
                    domain,
                    rmid,
                    bytes,
                },
                Ok(_),
            ) => model.occupancy(domain, rmid, bytes),
            (Step::Rate { .. } | Step::Online { .. } | Step::Wait { .. }, Ok(_)) => {}
            (Step::Offline { .. }, Ok(owners)) => {
                for (domain, &owner) in (0u32..).zip(owners) {
                    placed(
                        &mut model,
                        &mut parked_at,
                        domain,
                        owner != PARKED,
                        entry.at_ns,
                    );
                }
            }
            (&Step::Allowed { domain, .. }, Ok(mask)) => {
                placed(
                    &mut model,
                    &mut parked_at,
                    domain,
                    !mask.is_empty(),
                    entry.at_ns,
                );
            }
            (&Step::Move { domain }, Ok(_)) => model.moved(domain),
            (&Step::OthersOpen { domain }, Ok(_)) => model.others_may_open(domain),
            (&Step::Park { domain }, Ok(_)) => {
                parked_at.insert(domain, entry.at_ns);
                model.park(domain);
            }
            (&Step::Unpark { domain, .. }, Ok(_)) => {
                let since = parked_at.remove(&domain).unwrap_or(entry.at_ns);
                model.unpark(domain, entry.at_ns.saturating_sub(since));
            }
            (
                Step::PerfStat {
                    domain,
                    rmid,
                    how,
                    bursts,
                },
                Ok(words),
            ) => {
                let kind = Kind::Counter {
                    pmu: *domain,
                    event: 2,
                    rmid: *rmid,
                };
                let disabled = *how == StatHow::Control;
                model.open(
                    PERF_STAT_HANDLE,
                    OpenSpec {
                        kind,
                        disabled,
                        pinned: false,
                        exclusive: false,
                        group: None,
                    },
                );
                for &(bytes, counted) in bursts {
                    if *how == StatHow::Control && counted != model.is_enabled(PERF_STAT_HANDLE) {
                        let ioctl = if counted {
                            crate::checks::counting::Ioctl::Enable
                        } else {
                            crate::checks::counting::Ioctl::Disable
                        };
                        model.ioctl(PERF_STAT_HANDLE, ioctl, false);
                    }
                    model.burst(*domain, 2, *rmid, bytes);
                }
                let value = words.first().copied().unwrap_or(0);
                for mismatch in model.read(
                    PERF_STAT_HANDLE,
                    Observed {
                        value,
                        enabled: None,
                        running: None,
                    },
                ) {
                    find(format!("perf stat ({how:?}): {mismatch}"));
                }
                model.close(PERF_STAT_HANDLE);
            }
        }
    }
    out
}

/// A domain after a step that may have parked it or placed it again (an
/// offline, an allowed set): the model parks it, places it after the time
/// it was parked, or sees a move.
fn placed(
    model: &mut Model,
    parked_at: &mut BTreeMap<u32, u64>,
    domain: u32,
    placed: bool,
    at_ns: u64,
) {
    match (model.is_parked(domain), placed) {
        (false, false) => {
            parked_at.insert(domain, at_ns);
            model.park(domain);
        }
        (true, true) => {
            let since = parked_at.remove(&domain).unwrap_or(at_ns);
            model.unpark(domain, at_ns.saturating_sub(since));
        }
        (true, false) => {}
        (false, true) => model.moved(domain),
    }
}

#[cfg(test)]
mod tests {
    use super::super::journal::{IoctlName, Opened};
    use super::*;

    const SHAPE: DeviceShape = DeviceShape {
        pmus: 2,
        slots: 4,
        unit_bytes: 64,
        counter_width: 24,
        max_rate: 2 << 30,
    };
    const TIMED: ReadFormat = ReadFormat {
        times: true,
        id: false,
        group: false,
    };

    fn open(expect: Handle, disabled: bool) -> Entry {
        let event = Opened {
            pmu: Some(1),
            event: 2,
            rmid: 3,
            disabled,
            pinned: false,
            exclusive: false,
            group: None,
            read_format: TIMED,
            cpu: 0,
        };
        ok(Step::Open { event, expect }, vec![u64::from(expect)])
    }

    fn ok(step: Step, words: Vec<u64>) -> Entry {
        Entry {
            step,
            result: Ok(words),
            took_ns: 1000,
            at_ns: 0,
        }
    }

    #[test]
    fn the_first_differing_step_is_named() {
        let journal = vec![
            open(1, false),
            ok(
                Step::Burst {
                    domain: 1,
                    event: 2,
                    rmid: 3,
                    bytes: 640,
                },
                vec![],
            ),
            ok(Step::Read { handle: 1 }, vec![640, 10, 10]),
            ok(
                Step::Ioctl {
                    handle: 1,
                    ioctl: IoctlName::Disable,
                    group: false,
                },
                vec![0],
            ),
            ok(
                Step::Burst {
                    domain: 1,
                    event: 2,
                    rmid: 3,
                    bytes: 6400,
                },
                vec![],
            ),
            ok(Step::Move { domain: 1 }, vec![]),
            ok(
                Step::Ioctl {
                    handle: 1,
                    ioctl: IoctlName::Enable,
                    group: false,
                },
                vec![0],
            ),
            // The disabled window counted: the bug the model is for.
            ok(Step::Read { handle: 1 }, vec![640 + 6400, 30, 30]),
            ok(Step::Close { handle: 1 }, vec![]),
        ];
        let r = replay(SHAPE, &journal);
        assert_eq!(r.findings.len(), 1, "{:?}", r.findings);
        assert_eq!(r.findings[0].index, 7);
        assert!(r.findings[0].text.contains("value"), "{:?}", r.findings);
        let mut right = journal.clone();
        right[7] = ok(Step::Read { handle: 1 }, vec![640, 30, 30]);
        assert_eq!(replay(SHAPE, &right).findings, vec![]);
    }

    #[test]
    fn refusals_and_handles_are_checked() {
        let journal = vec![
            ok(Step::Park { domain: 1 }, vec![]),
            Entry {
                step: open(1, false).step,
                result: Err("ENODEV".into()),
                took_ns: 5,
                at_ns: 0,
            },
            Entry {
                step: open(1, false).step,
                result: Err("EBUSY".into()),
                took_ns: 7,
                at_ns: 0,
            },
            ok(Step::Unpark { domain: 1, cpu: 2 }, vec![]),
            ok(open(1, true).step, vec![2]),
        ];
        let r = replay(SHAPE, &journal);
        assert_eq!(
            r.findings.iter().map(|f| f.index).collect::<Vec<_>>(),
            vec![2, 4]
        );
        assert_eq!((r.ebusy, r.longest_open_ns), (0, 1000));
    }

    #[test]
    fn perf_stat_through_its_control_fifo_counts_only_enabled_bursts() {
        let stat = |value| {
            let bursts = vec![(64, false), (128, true), (256, false), (512, true)];
            ok(
                Step::PerfStat {
                    domain: 0,
                    rmid: 5,
                    how: StatHow::Control,
                    bursts,
                },
                vec![value],
            )
        };
        assert_eq!(replay(SHAPE, &[stat(640)]).findings, vec![]);
        assert_eq!(replay(SHAPE, &[stat(960)]).findings.len(), 1);
    }
}
