//! Stays in Rust: it fails hotplug operations at chosen kernel states and
//! judges where the rollback leaves the PMU, which no scenario line makes.
//!
//! Hotplug fail injection (`CONFIG_CPU_HOTPLUG_STATE_CONTROL`, the debug
//! kernel): a CPU offline or online that fails at a chosen hotplug state and
//! rolls back through perf's callbacks, on the owner CPU of a device-scope
//! PMU and on a non-owner, with an event open and traffic flowing.
//!
//! The kernel fails the operation with `EAGAIN` when it reaches the state
//! armed in `/sys/devices/system/cpu/cpuN/hotplug/fail` and disarms it; an
//! offline rolls back up to `online`, an online back down below the state
//! (on the 6.12 debug kernel, seen at every state tried: to `offline`). A state
//! with no callback in the operation's direction is never reached: the
//! operation completes, the row says so, and the agent undoes it.
//!
//! Each operation is the agent's [`HotplugOp::FailAt`] (arm, operate, read
//! the fail file back, disarm or undo), the same one `stress
//! --fail-injection` deals.

use std::fmt::Write as _;

use anyhow::{bail, Context, Result};
use perfbed_agent::{AgentMessage, HostRequest, HotplugOp};
use perfbed_device::regs::{whole_units, Event};

use super::context::Ctx;
use super::moves::{movable_domain, MOVING_RATE};
use crate::checks::Check;
use crate::guest::{pmu_name, Guest};
use crate::host::console::kernel_log_problems;

const CPU_SYSFS: &str = "/sys/devices/system/cpu";
/// perf's own hotplug state, where the perf core moves device-scope PMUs.
pub const PERF_STATE: &str = "perf:online";
/// What names the driver's own dynamic state, if it registers one.
const DRIVER_STATE: &str = "perfbed";
/// `CPUHP_INVALID`: a CPU's fail injection disarmed.
const DISARMED: i64 = -1;
/// The failable states taken on each side of perf's when the driver has no
/// state of its own: below, the first whose teardown runs after perf moved
/// the PMU; above, those torn down before perf's.
const AROUND_PERF: usize = 2;
/// The RMID the check's event counts (no other check leaves traffic on it
/// flowing).
const RMID: u32 = 5;

/// One hotplug state, as `/sys/devices/system/cpu/hotplug/states` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotplugState {
    pub number: i64,
    pub name: String,
}

/// The `N: name` lines of the states file.
pub fn parse_states(text: &str) -> Result<Vec<HotplugState>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (number, name) = line
                .split_once(':')
                .with_context(|| format!("hotplug state line {line:?}"))?;
            Ok(HotplugState {
                number: number
                    .trim()
                    .parse()
                    .with_context(|| format!("hotplug state line {line:?}"))?,
                name: name.trim().to_string(),
            })
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Offline,
    Online,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Offline: the PMU's CPU. Online: the first of a parked domain's CPUs
    /// to come back, which the PMU would be placed on.
    Owner,
    /// A CPU of the domain that the PMU is not on, the owner staying online.
    NonOwner,
}

/// What became of the armed operation.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// Failed at the armed state, which the kernel disarmed.
    Injected,
    /// Completed without reaching the state (no callback that way).
    NotReached,
    /// Anything else: the agent's answer and the fail file after.
    Other(String),
}

/// Where the placement rule puts the PMU after the operation.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Placement {
    On(u32),
    /// On one allowed CPU other than this one (perf picks which).
    OffOf(u32),
    Parked,
}

impl Placement {
    fn holds(&self, mask: &[u32], allowed: &[u32]) -> bool {
        match *self {
            Placement::On(cpu) => mask == [cpu],
            Placement::OffOf(cpu) => {
                mask.len() == 1 && mask[0] != cpu && allowed.contains(&mask[0])
            }
            Placement::Parked => mask.is_empty(),
        }
    }

    fn describe(&self) -> String {
        match self {
            Placement::On(cpu) => format!("{{{cpu}}}"),
            Placement::OffOf(cpu) => format!("moved off {cpu}"),
            Placement::Parked => "parked".into(),
        }
    }
}

/// Where the PMU must end: an offline of the owner moves it once perf's
/// teardown ran (a state below perf's failed, or the offline completed and
/// was undone), and the rollback's (or the undo's) online of perf does not
/// move it back; an online of the owner leaves a parked PMU parked (perf's
/// rollback, or the undo's offline, parks it again if it had been placed);
/// a non-owner never moves it.
fn expected(
    direction: Direction,
    role: Role,
    outcome: &Outcome,
    state: i64,
    perf: i64,
    target: u32,
    owner: u32,
) -> Placement {
    let completed = *outcome == Outcome::NotReached;
    match (direction, role) {
        (Direction::Offline, Role::Owner) if completed || state < perf => Placement::OffOf(target),
        (Direction::Online, Role::Owner) => Placement::Parked,
        _ => Placement::On(owner),
    }
}

struct Row {
    state: HotplugState,
    direction: Direction,
    role: Role,
    cpu: u32,
    outcome: Outcome,
    /// The CPU's `online` and `hotplug/state` right after.
    after: (String, i64),
    mask: Vec<u32>,
    want: Placement,
    count: u64,
    truth: u64,
    new_splats: Vec<String>,
    problems: Vec<String>,
}

fn write(g: &mut Guest, path: &str, value: &str) -> Result<std::result::Result<(), String>> {
    let (status, _, stderr) = g.run(&[
        "/bin/busybox",
        "sh",
        "-c",
        &format!("echo {value} > {path}"),
    ])?;
    Ok(if status == Some(0) {
        Ok(())
    } else {
        Err(stderr.trim().to_string())
    })
}

fn fail_file(cpu: u32) -> String {
    format!("{CPU_SYSFS}/cpu{cpu}/hotplug/fail")
}

fn read_number(g: &mut Guest, path: &str) -> Result<i64> {
    let text = g.read_file(path)?;
    text.parse().with_context(|| format!("{path}: {text:?}"))
}

/// The states to fail at: from the driver's own (if it has one) or the
/// [`AROUND_PERF`] failable states above perf's, down to perf's and the
/// [`AROUND_PERF`] failable states below it. A state is failable when the
/// kernel takes it in the fail file (it has a callback and is not atomic).
pub fn chosen_states(
    g: &mut Guest,
    states: &[HotplugState],
    cpu: u32,
) -> Result<Vec<HotplugState>> {
    let Some(perf) = states.iter().position(|s| s.name == PERF_STATE) else {
        bail!("no {PERF_STATE:?} among the hotplug states");
    };
    let failable = |g: &mut Guest, s: &HotplugState| -> Result<bool> {
        let taken = write(g, &fail_file(cpu), &s.number.to_string())?.is_ok();
        if taken {
            write(g, &fail_file(cpu), &DISARMED.to_string())?
                .map_err(|e| anyhow::anyhow!("disarming CPU {cpu}'s fail injection: {e}"))?;
        }
        Ok(taken)
    };
    let mut chosen = vec![states[perf].clone()];
    for s in states[..perf].iter().rev() {
        if chosen.len() > AROUND_PERF {
            break;
        }
        if failable(g, s)? {
            chosen.insert(0, s.clone());
        }
    }
    let driver = states.iter().rposition(|s| s.name.contains(DRIVER_STATE));
    let mut above = 0;
    for (i, s) in states.iter().enumerate().skip(perf + 1) {
        let within = match driver {
            Some(d) => i <= d,
            None => above < AROUND_PERF,
        };
        if !within {
            break;
        }
        if failable(g, s)? {
            chosen.push(s.clone());
            above += 1;
        }
    }
    Ok(chosen)
}

/// Fails an offline and an online of the owner and of a non-owner at each
/// chosen state, with an event open and traffic flowing; checks the
/// rollback, the PMU's placement, the count against the truth, and the
/// kernel log, and prints the table.
pub fn fail_injection(ctx: &mut Ctx) -> Result<Check> {
    let (d, allowed) = movable_domain(ctx)?;
    let pmu = pmu_name(d);
    let states = parse_states(&ctx.g.read_file(&format!("{CPU_SYSFS}/hotplug/states"))?)?;
    let online_state = match states.iter().rfind(|s| s.name == "online") {
        Some(s) => s.number,
        None => bail!("no \"online\" hotplug state"),
    };
    let perf = states
        .iter()
        .find(|s| s.name == PERF_STATE)
        .map_or(-1, |s| s.number);
    let chosen = chosen_states(ctx.g, &states, allowed[0])?;
    let h = ctx.open(d, Event::MbmTotalBytes, RMID)?;
    let start = Ctx::truth(&ctx.control.state()?, d, RMID, Event::MbmTotalBytes);
    let mut rows = Vec::new();
    for state in &chosen {
        for direction in [Direction::Offline, Direction::Online] {
            for role in [Role::Owner, Role::NonOwner] {
                rows.push(one(
                    ctx,
                    d,
                    &allowed,
                    state,
                    (perf, online_state),
                    direction,
                    role,
                    (h, start),
                )?);
            }
        }
    }
    ctx.g.close(h)?;

    let mut problems: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            r.problems.iter().map(move |p| {
                format!(
                    "{} {:?} {:?} of CPU {}: {p}",
                    r.state.name, r.role, r.direction, r.cpu
                )
            })
        })
        .collect();
    let injected = |dir: Direction, below_perf: bool| {
        rows.iter().any(|r| {
            r.direction == dir
                && r.outcome == Outcome::Injected
                && (r.state.number < perf) == below_perf
        })
    };
    // The point of the check: perf's own callbacks rolled back.
    if !injected(Direction::Offline, true) {
        problems.push(format!(
            "no offline failed below {PERF_STATE}: perf's teardown was never rolled back"
        ));
    }
    if !injected(Direction::Online, false) {
        problems.push(format!(
            "no online failed above {PERF_STATE}: perf's startup was never rolled back"
        ));
    }
    let mut detail = format!(
        "{pmu} (CPUs {allowed:?}), event rmid={RMID} open under {} MiB/s; states {}:",
        MOVING_RATE >> 20,
        chosen
            .iter()
            .map(|s| format!("{} {}", s.number, s.name))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = write!(
        detail,
        "\n      {:<28} {:<9} {:<8} {:>3}  {:<12} {:<13} {:<16} {:<16} count = truth",
        "state", "role", "op", "cpu", "outcome", "after", "PMU on", "placement rule"
    );
    for r in &rows {
        let outcome = match &r.outcome {
            Outcome::Injected => "failed, back".to_string(),
            Outcome::NotReached => "not reached".to_string(),
            Outcome::Other(what) => what.chars().take(30).collect(),
        };
        let _ = write!(
            detail,
            "\n      {:<28} {:<9} {:<8} {:>3}  {:<12} {:<13} {:<16} {:<16} {} {} {}{}",
            format!("{} {}", r.state.number, r.state.name),
            format!("{:?}", r.role).to_lowercase(),
            format!("{:?}", r.direction).to_lowercase(),
            r.cpu,
            outcome,
            format!("online={} st={}", r.after.0, r.after.1),
            format!("{:?}", r.mask),
            r.want.describe(),
            r.count,
            if r.count == r.truth { "=" } else { "≠" },
            r.truth,
            if r.new_splats.is_empty() {
                ""
            } else {
                "  SPLAT"
            },
        );
    }
    let passed = problems.is_empty();
    Ok(Check {
        name: "hotplug fail injection",
        passed,
        detail: if passed {
            detail
        } else {
            format!("{}\n      {detail}", problems.join("; "))
        },
    })
}

/// One row: arm, operate with traffic flowing, look, restore every CPU of
/// the domain online and disarmed, and compare the count with the truth.
#[allow(clippy::too_many_arguments)]
fn one(
    ctx: &mut Ctx,
    d: usize,
    allowed: &[u32],
    state: &HotplugState,
    (perf, online_state): (i64, i64),
    direction: Direction,
    role: Role,
    (h, start): (u32, u64),
) -> Result<Row> {
    let pmu = pmu_name(d);
    let splats_before = splats(ctx)?.len();
    let owner = match ctx.g.cpumask(&pmu)?.first() {
        Some(&cpu) => cpu,
        None => bail!("{pmu} is parked with CPUs {allowed:?} online"),
    };
    let Some(&other) = allowed.iter().find(|&&c| c != owner) else {
        bail!("{pmu}'s domain {allowed:?} has no CPU besides its owner {owner}");
    };
    let target = if role == Role::Owner { owner } else { other };
    if direction == Direction::Online {
        // Owner: the whole domain goes (parked); non-owner: that CPU alone.
        let going: Vec<u32> = match role {
            Role::Owner => allowed
                .iter()
                .copied()
                .filter(|&c| c != owner)
                .chain([owner])
                .collect(),
            Role::NonOwner => vec![other],
        };
        for cpu in going {
            ctx.g.set_online(cpu, false)?;
        }
    }
    let mut problems = Vec::new();
    ctx.control
        .set_rate(d as u32, RMID, Event::MbmTotalBytes, MOVING_RATE)?;
    let answer = ctx.g.ask(HostRequest::HotplugBatch {
        ops: vec![HotplugOp::FailAt {
            cpu: target,
            online: direction == Direction::Online,
            state: state.number,
        }],
        watch_pmus: vec![],
        read_handles: vec![],
    });
    ctx.control
        .set_rate(d as u32, RMID, Event::MbmTotalBytes, 0)?;
    let done = match answer? {
        AgentMessage::HotplugBatch(mut result) if result.ops.len() == 1 => result.ops.remove(0),
        other => bail!("a fail-injected operation of CPU {target}: {other:?}"),
    };
    let after = (
        ctx.g
            .read_file(&format!("{CPU_SYSFS}/cpu{target}/online"))?,
        read_number(ctx.g, &format!("{CPU_SYSFS}/cpu{target}/hotplug/state"))?,
    );
    let mask = ctx.g.cpumask(&pmu)?;
    let outcome = match (done.injected, done.error) {
        (Some(true), None) => Outcome::Injected,
        (Some(false), None) => Outcome::NotReached,
        (injected, error) => Outcome::Other(format!("injected {injected:?}: {error:?}")),
    };
    problems.extend(rollback_problem(
        &outcome,
        direction,
        &after,
        online_state,
        state.number,
    ));
    let want = expected(direction, role, &outcome, state.number, perf, target, owner);
    if !want.holds(&mask, allowed) {
        problems.push(format!(
            "{pmu}'s cpumask is {mask:?}, the placement rule says {}",
            want.describe()
        ));
    }
    // Back to every CPU of the domain online (FailAt left nothing armed).
    for &cpu in allowed {
        if ctx.g.read_file(&format!("{CPU_SYSFS}/cpu{cpu}/online"))? != "1" {
            ctx.g.set_online(cpu, true)?;
        }
    }
    ctx.inject_and_land(&[(d, RMID, Event::MbmTotalBytes, 1 << 20)])?;
    let count = ctx.count(h)?;
    let truth = whole_units(
        Ctx::truth(&ctx.control.state()?, d, RMID, Event::MbmTotalBytes) - start,
        ctx.device.unit_bytes,
    );
    if count != truth {
        problems.push(format!("counted {count}, the device's truth is {truth}"));
    }
    let new_splats: Vec<String> = splats(ctx)?.into_iter().skip(splats_before).collect();
    if !new_splats.is_empty() {
        problems.push(format!("the kernel log reports: {}", new_splats.join("; ")));
    }
    Ok(Row {
        state: state.clone(),
        direction,
        role,
        cpu: target,
        outcome,
        after,
        mask,
        want,
        count,
        truth,
        new_splats,
        problems,
    })
}

/// What is wrong with where the operation left its CPU (`after`: its
/// `online` and `hotplug/state`): a failed offline must have rolled back
/// up to `online`, a failed online back down below the armed state, and
/// one that completed was undone (the CPU as it was before).
fn rollback_problem(
    outcome: &Outcome,
    direction: Direction,
    after: &(String, i64),
    online_state: i64,
    state: i64,
) -> Option<String> {
    let (online, at) = (after.0.as_str(), after.1);
    match (outcome, direction) {
        (Outcome::Injected, Direction::Offline) if (online, at) != ("1", online_state) => Some(
            format!("the failed offline left online={online} state={at} (want 1, {online_state})"),
        ),
        (Outcome::Injected, Direction::Online) if online != "0" || at >= state => Some(format!(
            "the failed online left online={online} state={at} (want 0, below {state})"
        )),
        (Outcome::NotReached, Direction::Offline) if online != "1" => Some(format!(
            "the completed offline was not undone: online={online}"
        )),
        (Outcome::NotReached, Direction::Online) if online != "0" => Some(format!(
            "the completed online was not undone: online={online}"
        )),
        (Outcome::Other(what), _) => {
            Some(format!("neither failed at the state nor completed: {what}"))
        }
        _ => None,
    }
}

/// The kernel log's reports so far.
fn splats(ctx: &Ctx) -> Result<Vec<String>> {
    let log = std::fs::read_to_string(&ctx.g.vm.serial_log)
        .with_context(|| format!("reading {}", ctx.g.vm.serial_log.display()))?;
    Ok(kernel_log_problems(&log))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_parse_and_bad_lines_are_errors() {
        let states = parse_states("  0: offline\n 93: perf:online\n235: online\n").unwrap();
        assert_eq!(states.len(), 3);
        assert_eq!(
            states[1],
            HotplugState {
                number: 93,
                name: "perf:online".into()
            }
        );
        assert!(parse_states("perf online\n").is_err());
        assert!(parse_states("x: perf:online\n").is_err());
    }

    #[test]
    fn the_placement_rule_after_a_failed_operation() {
        let (perf, owner, other) = (100, 2, 3);
        let injected = Outcome::Injected;
        // Below perf's state the offline ran perf's teardown: the PMU moved.
        assert_eq!(
            expected(
                Direction::Offline,
                Role::Owner,
                &injected,
                99,
                perf,
                owner,
                owner
            ),
            Placement::OffOf(owner)
        );
        // At or above it, perf's teardown never ran.
        assert_eq!(
            expected(
                Direction::Offline,
                Role::Owner,
                &injected,
                100,
                perf,
                owner,
                owner
            ),
            Placement::On(owner)
        );
        assert_eq!(
            expected(
                Direction::Offline,
                Role::NonOwner,
                &injected,
                99,
                perf,
                other,
                owner
            ),
            Placement::On(owner)
        );
        assert_eq!(
            expected(
                Direction::Online,
                Role::Owner,
                &injected,
                120,
                perf,
                owner,
                owner
            ),
            Placement::Parked
        );
        assert_eq!(
            expected(
                Direction::Online,
                Role::Owner,
                &Outcome::NotReached,
                120,
                perf,
                owner,
                owner
            ),
            Placement::Parked
        );
        assert!(Placement::OffOf(2).holds(&[3], &[2, 3]));
        assert!(!Placement::OffOf(2).holds(&[2], &[2, 3]));
        assert!(!Placement::OffOf(2).holds(&[1], &[2, 3]));
        assert!(Placement::Parked.holds(&[], &[2, 3]));
        assert!(!Placement::On(2).holds(&[], &[2, 3]));
    }

    #[test]
    fn a_wrong_rollback_is_a_problem() {
        let (online_state, armed) = (235, 120);
        let at = |online: &str, state: i64| (online.to_string(), state);
        let judge = |outcome: &Outcome, direction, after: (String, i64)| {
            rollback_problem(outcome, direction, &after, online_state, armed)
        };
        let injected = Outcome::Injected;
        // As the kernel rolls back: an offline up to online, an online down.
        assert_eq!(
            judge(&injected, Direction::Offline, at("1", online_state)),
            None
        );
        assert_eq!(judge(&injected, Direction::Online, at("0", 0)), None);
        // A failed offline that stayed down, or stopped short of online.
        assert!(judge(&injected, Direction::Offline, at("0", 0)).is_some());
        assert!(judge(&injected, Direction::Offline, at("1", armed)).is_some());
        // A failed online that came up, or stayed at the armed state.
        assert!(judge(&injected, Direction::Online, at("1", online_state)).is_some());
        assert!(judge(&injected, Direction::Online, at("0", armed)).is_some());
        // A completed operation the agent did not undo.
        assert!(judge(&Outcome::NotReached, Direction::Offline, at("0", 0)).is_some());
        assert_eq!(
            judge(&Outcome::NotReached, Direction::Online, at("0", 0)),
            None
        );
        assert!(judge(&Outcome::Other("EIO".into()), Direction::Online, at("0", 0)).is_some());
    }
}
