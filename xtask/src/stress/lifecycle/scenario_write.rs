//! Journal steps written as a scenario file (scenarios/README.md), the
//! inverse of [`super::scenario::parse`]: what the shrinker writes a
//! failing run down as. An event is named for its journal handle (`e7`);
//! an open the run saw refused gets its `want eN ERRNO`.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::checks::pmu::context::EVENT_FILES;
use crate::model::Handle;

use super::generate::RMID_RATE;
use super::journal::{Condition, IoctlName, Request, Step};

/// One line to write: a journal step, with the errno its open was refused
/// with and the values its read must show (`want` lines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub step: Step,
    pub refused: Option<String>,
    pub wants: Vec<(Handle, u64)>,
}

impl Line {
    pub fn new(step: Step) -> Line {
        Line {
            step,
            refused: None,
            wants: vec![],
        }
    }
}

/// Whether a scenario can say `step` (the lifecycle's `OthersOpen` and
/// `perf stat` steps have no line).
pub fn writable(step: &Step) -> bool {
    !matches!(
        step,
        Step::OthersOpen { .. } | Step::PerfStat { .. } | Step::Seen { .. }
    )
}

/// `lines` (each with a tag, such as its journal index) as a scenario can
/// say them on a guest of `domains` whose CPUs all start online, with each
/// PMU on `owners` (a domain's first CPU where `None` or not given):
/// - a PMU that starts on another CPU than its domain's first is put there
///   first (`allowed d CPU`, then `allowed d default`, tagged `start`), as
///   a scenario starts with each PMU on its domain's first CPU;
/// - a move the parser cannot say (of CPU 0's domain, which a scenario
///   cannot name for a move, or of a domain with one CPU online: the
///   lifecycle moves such a PMU too) becomes its owner's `offline` and
///   `online`, which is what a move does, both with the move's tag.
pub fn sayable<T: Clone>(
    lines: Vec<(Line, T)>,
    domains: &[Vec<u32>],
    owners: &[Option<u32>],
    start: T,
) -> Vec<(Line, T)> {
    let mut online: BTreeSet<u32> = domains.iter().flatten().copied().collect();
    let mut owner: Vec<Option<u32>> = domains.iter().map(|c| c.first().copied()).collect();
    let mut out = Vec::new();
    for (d, cpus) in domains.iter().enumerate() {
        if let Some(&Some(cpu)) = owners.get(d) {
            if Some(cpu) != owner[d] {
                for set in [vec![cpu], cpus.clone()] {
                    let step = Step::Allowed {
                        domain: d as u32,
                        cpus: set,
                        nowait: false,
                    };
                    out.push((Line::new(step), start.clone()));
                }
                owner[d] = Some(cpu);
            }
        }
    }
    // The first online CPU of domain `d` but `not`.
    let first_up = |online: &BTreeSet<u32>, d: usize, not: Option<u32>| {
        domains[d]
            .iter()
            .copied()
            .find(|c| online.contains(c) && Some(*c) != not)
    };
    for (line, tag) in lines {
        match line.step {
            Step::Park { domain } => {
                for c in &domains[domain as usize] {
                    online.remove(c);
                }
                owner[domain as usize] = None;
            }
            Step::Unpark { domain, cpu } => {
                online.insert(cpu);
                owner[domain as usize] = Some(cpu);
            }
            Step::Online { cpu } => {
                online.insert(cpu);
            }
            Step::Offline { cpu } => {
                online.remove(&cpu);
                for (d, o) in owner.iter_mut().enumerate() {
                    if *o == Some(cpu) {
                        *o = first_up(&online, d, None);
                    }
                }
            }
            Step::Allowed {
                domain, ref cpus, ..
            } => {
                owner[domain as usize] = cpus.iter().copied().find(|c| online.contains(c));
            }
            Step::Move { domain } => {
                let d = domain as usize;
                let other = first_up(&online, d, owner[d]);
                match owner[d] {
                    Some(cpu) if cpu != 0 && (domains[d].contains(&0) || other.is_none()) => {
                        out.push((Line::new(Step::Offline { cpu }), tag.clone()));
                        let back = if other.is_none() {
                            Step::Unpark { domain, cpu }
                        } else {
                            Step::Online { cpu }
                        };
                        out.push((Line::new(back), tag));
                        owner[d] = other.or(Some(cpu));
                        continue;
                    }
                    _ => owner[d] = other.or(owner[d]),
                }
            }
            _ => {}
        }
        out.push((line, tag));
    }
    out
}

/// The scenario text of `lines` (each [`writable`]; others are left out),
/// headed by `comments` (each a `#` line) and `# check: NAME` if given.
/// A cpu-clock event in a group with a device event is opened on that
/// domain's owner (`cpu=owner(d)`), whatever CPU the journal shows, so
/// that the group stays valid when the steps before it change.
pub fn write(check: Option<&str>, comments: &[String], lines: &[Line]) -> String {
    let mut out = String::new();
    if let Some(name) = check {
        let _ = writeln!(out, "# check: {name}");
    }
    for c in comments {
        let _ = writeln!(out, "# {c}");
    }
    for line in lines {
        if !writable(&line.step) {
            continue;
        }
        out += &step_text(&line.step, lines);
        out.push('\n');
        if let (Step::Open { expect, .. }, Some(errno)) = (&line.step, &line.refused) {
            let _ = writeln!(out, "want e{expect} {errno}");
        }
        for (handle, bytes) in &line.wants {
            let _ = writeln!(out, "want e{handle} {bytes}");
        }
    }
    out
}

/// One step's line; `all` are the scenario's (a cpu-clock event's group).
fn step_text(step: &Step, all: &[Line]) -> String {
    match step {
        Step::Open { event, expect } => {
            let mut text = match event.pmu {
                Some(d) => format!(
                    "e{expect} = open {d} {} rmid={}",
                    event_name(event.event),
                    event.rmid
                ),
                None => {
                    // The domain of a device event in its group: its leader's
                    // (a sibling) or a sibling's (a leader).
                    let leader = event.group.unwrap_or(*expect);
                    // (A refused open's handle is the next open's.)
                    let opened = all.iter().filter(|l| l.refused.is_none());
                    let domain = opened.map(|l| &l.step).find_map(|s| match s {
                        Step::Open {
                            event: o,
                            expect: h,
                        } if o.pmu.is_some() && (*h == leader || o.group == Some(leader)) => o.pmu,
                        _ => None,
                    });
                    match domain {
                        Some(d) => format!("e{expect} = open cpu-clock cpu=owner({d})"),
                        None => format!("e{expect} = open cpu-clock cpu={}", event.cpu),
                    }
                }
            };
            for (on, word) in [
                (event.disabled, "disabled"),
                (event.pinned, "pinned"),
                (event.exclusive, "exclusive"),
            ] {
                if on {
                    text += " ";
                    text += word;
                }
            }
            if let Some(leader) = event.group {
                let _ = write!(text, " group=e{leader}");
            }
            let f = event.read_format;
            let formats: Vec<&str> = [
                (f.times, "times"),
                (f.id, "id"),
                (f.group, "group"),
                (f.lost, "lost"),
            ]
            .into_iter()
            .filter_map(|(on, w)| on.then_some(w))
            .collect();
            if !formats.is_empty() {
                let _ = write!(text, " read={}", formats.join(","));
            }
            text
        }
        Step::Ioctl {
            handle,
            ioctl,
            group,
        } => {
            let op = match ioctl {
                IoctlName::Enable => "enable",
                IoctlName::Disable => "disable",
                IoctlName::Reset => "reset",
            };
            format!("{op} e{handle}{}", if *group { " group" } else { "" })
        }
        Step::Request {
            handle,
            request,
            refused,
        } => {
            let what = match request {
                Request::Refresh { count } => format!("refresh {count}"),
                Request::Period { period } => format!("period {period}"),
                Request::SetFilter { filter } => format!("set-filter {filter}"),
                Request::SetOutput { target: None } => "set-output none".into(),
                Request::SetOutput {
                    target: Some(target),
                } => format!("set-output e{target}"),
                Request::Id => "id".into(),
                Request::PauseOutput { pause } => {
                    format!("pause-output {}", if *pause { "on" } else { "off" })
                }
                Request::SetBpf => "set-bpf none".into(),
                Request::QueryBpf => "query-bpf".into(),
                Request::ModifyAttributes { .. } => "modify-attributes".into(),
            };
            let answer = refused.as_deref().unwrap_or("ok");
            format!("ioctl e{handle} {what} {answer}")
        }
        Step::Read { handle } => format!("read e{handle}"),
        Step::Close { handle } => format!("close e{handle}"),
        Step::Burst {
            domain,
            event,
            rmid,
            bytes,
        } => format!(
            "burst {domain} {} rmid={rmid} {}",
            event_name(*event),
            bytes_text(*bytes)
        ),
        Step::Occupancy {
            domain,
            rmid,
            bytes,
        } => format!("occupancy {domain} rmid={rmid} {}", bytes_text(*bytes)),
        Step::Rate {
            domain,
            rmid: RMID_RATE,
            bytes_per_sec,
            ..
        } => format!("rate {domain} {}/s", bytes_text(*bytes_per_sec)),
        Step::Rate {
            domain,
            rmid,
            event,
            bytes_per_sec,
        } => format!(
            "rate {domain} {} rmid={rmid} {}/s",
            event_name(*event),
            bytes_text(*bytes_per_sec)
        ),
        Step::Move { domain } => format!("move {domain}"),
        Step::MovesStart { domain, .. } => format!("moves {domain} start"),
        Step::MovesStop { domain, .. } => format!("moves {domain} stop"),
        Step::Park { domain } => format!("park {domain}"),
        Step::Unpark { domain, cpu } => format!("unpark {domain} {cpu}"),
        Step::Online { cpu } => format!("online {cpu}"),
        Step::Offline { cpu } => format!("offline {cpu}"),
        Step::FailAt {
            cpu,
            online,
            state,
            completes,
        } => format!(
            "{} {cpu} {} {state}",
            if *online { "online" } else { "offline" },
            if *completes {
                "completes past"
            } else {
                "fails at"
            }
        ),
        Step::Allowed {
            domain,
            cpus,
            nowait,
        } => {
            let list: Vec<String> = cpus.iter().map(u32::to_string).collect();
            let list = if cpus.is_empty() {
                "none".to_string()
            } else {
                list.join(",")
            };
            let nowait = if *nowait { " nowait" } else { "" };
            format!("allowed {domain} {list}{nowait}")
        }
        Step::Reload { allowed: None } => "reload".into(),
        Step::Reload {
            allowed: Some((domain, cpus)),
        } => {
            let list = perfbed_device::cpus::format_cpu_list(cpus);
            let list = if list.is_empty() { "none".into() } else { list };
            format!("reload {domain} {list}")
        }
        Step::StatStart { domain, rmid } => format!("stat {domain} rmid={rmid} start"),
        Step::StatStop { domain, .. } => format!("stat {domain} stop"),
        Step::AllowedRefused {
            domain,
            cpus,
            error,
        } => {
            let list = perfbed_device::cpus::format_cpu_list(cpus);
            let list = if list.is_empty() { "none".into() } else { list };
            format!("allowed {domain} {list} refused {}", error.name())
        }
        Step::Wait { ms } => format!("wait {ms}ms"),
        Step::Until {
            handle,
            condition: Condition::Running,
            within_ms,
        } => format!("until e{handle} running within {within_ms}ms"),
        Step::MuxInterval { domain, ms } => format!("mux {domain} {ms}ms"),
        Step::Violations => "violations".into(),
        Step::DriverCount {
            domain,
            count,
            grown,
        } => match grown {
            None => format!("{} {domain}", count.file()),
            Some(g) => format!("{} {domain} {}", count.file(), g.written()),
        },
        Step::Cpumask { domain, cpus } => match cpus.as_slice() {
            [] => format!("cpumask {domain} none"),
            cpus => {
                let list: Vec<String> = cpus.iter().map(u32::to_string).collect();
                format!("cpumask {domain} {}", list.join(","))
            }
        },
        Step::OthersOpen { .. } | Step::PerfStat { .. } | Step::Seen { .. } => {
            unreachable!("not writable: {step:?}")
        }
    }
}

/// A device event's sysfs name by its id.
fn event_name(id: u32) -> &'static str {
    EVENT_FILES
        .iter()
        .find(|(_, e)| *e as u32 == id)
        .map_or("mbm_total_bytes", |(name, _)| name)
}

/// Bytes in the largest unit that says them exactly.
pub(super) fn bytes_text(bytes: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes != 0 && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::model::{DeviceShape, Model};
    use crate::stress::lifecycle::generate::Generator;
    use crate::stress::lifecycle::scenario::{parse, wants_against_model, Layout};

    const SHAPE: DeviceShape = DeviceShape::DEFAULT_RUN;

    /// The generator's steps, each open the model refuses with its errno.
    fn generated(seed: u64, draws: usize, owners: &[Option<u32>]) -> Vec<Line> {
        let domains = vec![vec![0, 1], vec![2, 3]];
        let mut g = Generator::new(seed, SHAPE, domains, 4, owners.to_vec(), 1);
        let mut model = Model::new(SHAPE);
        let mut lines = Vec::new();
        // Where each PMU is, as a run's moves would show it to the generator.
        let mut owner = owners.to_vec();
        let mut online: BTreeSet<u32> = (0..4).collect();
        for _ in 0..draws {
            for step in g.next() {
                match step {
                    Step::Move { domain } => {
                        let d = domain as usize;
                        let cpus = [[0, 1], [2, 3]][d];
                        let other = cpus
                            .into_iter()
                            .find(|c| online.contains(c) && Some(*c) != owner[d]);
                        owner[d] = other.or(owner[d]);
                        let words = owner[d].into_iter().map(u64::from).collect();
                        g.observe(&crate::stress::lifecycle::journal::Entry::untimed(
                            step.clone(),
                            Ok(words),
                        ));
                    }
                    Step::Park { domain } => {
                        for c in [[0, 1], [2, 3]][domain as usize] {
                            online.remove(&c);
                        }
                        owner[domain as usize] = None;
                    }
                    Step::Unpark { domain, cpu } => {
                        online.insert(cpu);
                        owner[domain as usize] = Some(cpu);
                    }
                    Step::Online { cpu } => {
                        online.insert(cpu);
                    }
                    _ => {}
                }
                let mut line = Line::new(step.clone());
                match &step {
                    Step::Open { event, expect } => match model.predict_open(&event.spec()) {
                        Ok(()) => model.open(*expect, event.spec()),
                        Err(r) => line.refused = Some(r.errno().to_string()),
                    },
                    Step::Ioctl {
                        handle,
                        ioctl,
                        group,
                    } => model.ioctl(*handle, ioctl.model(), *group),
                    Step::Close { handle } => model.close(*handle),
                    Step::Park { domain } => model.park(*domain),
                    Step::Unpark { domain, .. } => model.unpark(*domain),
                    _ => {}
                }
                lines.push(line);
            }
        }
        lines
    }

    #[test]
    fn generated_journals_read_back_as_written() {
        let layout = Layout {
            cpus: 4,
            domains: vec![vec![0, 1], vec![2, 3]],
            rmids: 8,
            unit_bytes: 64,
            arch: crate::build::image::arch::Arch::X86_64,
        };
        for seed in 1..=6 {
            // Odd seeds start with CPU 0's domain on CPU 1, where its moves
            // take CPU 1 offline.
            let owners = vec![Some(seed as u32 % 2), Some(2)];
            let lines: Vec<Line> = sayable(
                generated(seed, 1500, &owners)
                    .into_iter()
                    .map(|l| (l, ()))
                    .collect(),
                &layout.domains,
                &owners,
                (),
            )
            .into_iter()
            .map(|(l, ())| l)
            .collect();
            let text = write(Some("round trip"), &["a comment".into()], &lines);
            let s = parse(Path::new("w.scn"), &text, &layout, 1)
                .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
            assert_eq!(s.check.as_deref(), Some("round trip"));
            assert_eq!(wants_against_model(&s, SHAPE), vec![], "seed {seed}");
            let written: Vec<&Line> = lines.iter().filter(|l| writable(&l.step)).collect();
            assert_eq!(s.ops.len(), written.len(), "seed {seed}");
            let mut owners = 0;
            let mut device_leaders = std::collections::BTreeSet::new();
            for (op, line) in s.ops.iter().zip(written) {
                // A cpu-clock sibling of a device leader is on its owner.
                let opens = line.refused.is_none();
                if let (Step::Open { event, expect }, true) = (&op.step, opens) {
                    if event.pmu.is_some() && event.group.is_none() {
                        device_leaders.insert(*expect);
                    }
                    if event.group.is_some_and(|l| device_leaders.contains(&l)) {
                        assert!(
                            event.pmu.is_some() || op.on_owner.is_some(),
                            "seed {seed}, line {}",
                            op.line
                        );
                    }
                }
                let mut step = op.step.clone();
                // An owner's cpu-clock: the CPU is the run's, from the
                // domain's cpumask; the journal's is one of its CPUs.
                if let (Some(d), Step::Open { event, .. }, Step::Open { event: was, .. }) =
                    (op.on_owner, &mut step, &line.step)
                {
                    assert!(layout.domains[d as usize].contains(&(was.cpu as u32)));
                    event.cpu = was.cpu;
                    owners += 1;
                }
                assert_eq!(step, line.step, "seed {seed}, line {}", op.line);
                let refused = op.wants.iter().find_map(|w| match w {
                    crate::stress::lifecycle::scenario::Want::Refused { errno, .. } => {
                        Some(errno.clone())
                    }
                    _ => None,
                });
                assert_eq!(refused, line.refused, "seed {seed}, line {}", op.line);
            }
            assert!(owners > 0, "seed {seed}: no mixed group");
        }
    }

    #[test]
    fn bytes_take_the_largest_exact_unit() {
        assert_eq!(bytes_text(0), "0");
        assert_eq!(bytes_text(3 << 20), "3MiB");
        assert_eq!(bytes_text(1536), "1536");
        assert_eq!(bytes_text(64 << 10), "64KiB");
        assert_eq!(bytes_text(100), "100");
    }
}
