//! The end-to-end checks of perfbed.ko: device-scope PMUs `perfbed_l3_<d>`
//! opened from the guest with perf_event_open (and the real perf tool),
//! traffic injected through the device's control socket, every count
//! compared with the device's ground truth while CPUs come and go.

pub mod accesses;
pub mod bpf_reads;
pub mod context;
pub mod counts;
pub mod groups;
pub mod moves;
pub mod multiplexing;
pub mod opens_racing_moves;
pub mod perf_matrix;
pub mod registration;
pub mod semantics;

use anyhow::{bail, Result};
use perfbed_device::{ControlClient, DeviceConfig};

use crate::build::image::arch::Arch;
use crate::checks::log::CheckLog;
use crate::checks::{Check, Select};
use crate::guest::{pmu_name, Guest};
use crate::stress::lifecycle::scenario_guest::{self, library, Written};
use context::Ctx;

/// A check that needs nothing but the context, and leaves the PMUs as it
/// found them: one `cargo xtask run` check that can also run on its own.
pub type CtxCheck = fn(&mut Ctx) -> Result<Check>;

/// Opens and BPF reads racing moves, in `run`'s order, each by the name
/// its `Check` carries.
const AROUND_MOVES: &[(&str, CtxCheck)] = &[
    ("opens racing moves", opens_racing_moves::opens_racing_moves),
    (
        "software siblings racing moves",
        opens_racing_moves::software_siblings_racing_moves,
    ),
    ("BPF reads while moving", bpf_reads::while_moving),
];

/// perf's counting semantics under multiplexing, DISABLE, parks and groups,
/// in `run`'s order.
const SEMANTICS: &[(&str, CtxCheck)] = &[
    ("multiplexing", multiplexing::multiplexing),
    ("multiplexing through a park", semantics::multiplexed_park),
    ("mux timer of a parked PMU", semantics::parked_mux_timer),
    ("bad attributes", groups::bad_attributes),
];

/// Every `perf_event_attr` field, flag and bit against the errno it must get.
const ATTRIBUTES: &[(&str, CtxCheck)] = &[("perf_event_open matrix", perf_matrix::check)];

/// Whether the check called `name` is one `run_named` runs: a check of
/// the tables below or a scenario of the library.
pub fn can_run_alone(name: &str) -> Result<bool> {
    Ok(alone().any(|(n, _)| *n == name) || library()?.iter().any(|s| s.check == name))
}

/// The checks that can run on their own.
fn alone() -> impl Iterator<Item = &'static (&'static str, CtxCheck)> {
    AROUND_MOVES.iter().chain(SEMANTICS).chain(ATTRIBUTES)
}

/// Runs the check called `name` among those that can run on their own
/// (what a mutant names as the check that must catch it).
pub fn run_named(ctx: &mut Ctx, name: &str) -> Result<Check> {
    if let Some(s) = library()?.iter().find(|s| s.check == name) {
        return run_scenario(ctx, s);
    }
    match alone().find(|(n, _)| *n == name) {
        Some(&(name, check)) => run_one(ctx, name, check),
        None => {
            let mut names: Vec<&str> = alone().map(|(n, _)| *n).collect();
            names.extend(library()?.iter().map(|s| s.check));
            bail!(
                "no check {name:?} runs on its own; these do: {}",
                names.join(", ")
            )
        }
    }
}

/// One check of the tables; its `Check` must carry the table's name, or
/// `run_named` would look it up under a name no report shows.
fn run_one(ctx: &mut Ctx, name: &str, check: CtxCheck) -> Result<Check> {
    let done = check(ctx)?;
    if done.name != name {
        bail!(
            "the check listed as {name:?} reports itself as {:?}",
            done.name
        );
    }
    Ok(done)
}

/// A scenario of the library, its journal saved beside the serial log.
fn run_scenario(ctx: &mut Ctx, s: &Written) -> Result<Check> {
    let dir = ctx
        .g
        .vm
        .serial_log
        .parent()
        .map_or_else(std::path::PathBuf::new, std::path::Path::to_path_buf);
    scenario_guest::carry_out_file(ctx, &s.file, &s.text, &dir, None)
}

/// One entry of `run`'s plan: the check's printed name and how it runs.
type Planned = (&'static str, Box<dyn Fn(&mut Ctx) -> Result<Vec<Check>>>);

/// Runs the checks `select` asks for, in order, into `checks` (each entry
/// of the plan one span of the trace's bands); the driver must be loaded.
/// With `known_bugs`, the checks of known, open bugs run too
/// (they fail until the bug is fixed). With `fail_injection` (a kernel with
/// `CONFIG_CPU_HOTPLUG_STATE_CONTROL`: the debug one), the scenarios that
/// fail hotplug operations at perf's states too (`scenarios/hotplug-failures`).
pub fn run(
    g: &mut Guest,
    control: ControlClient,
    device: &DeviceConfig,
    known_bugs: bool,
    fail_injection: bool,
    select: &Select,
    checks: &mut CheckLog,
) -> Result<()> {
    let mut types = Vec::new();
    for d in 0..device.domains.len() {
        types.push(g.pmu_type(&pmu_name(d))?);
    }
    let mut ctx = Ctx {
        g,
        control,
        device: device.clone(),
        types,
    };
    ctx.control.reset_stats()?;
    let arch = ctx.g.vm.arch;
    for (name, check) in plan(known_bugs, fail_injection, arch)? {
        if select.wants(name) {
            checks.extend(check(&mut ctx)?);
        }
    }
    Ok(())
}

/// The printed names of the checks `run` runs on a guest of `arch`, in order.
pub fn names(known_bugs: bool, fail_injection: bool, arch: Arch) -> Result<Vec<&'static str>> {
    Ok(plan(known_bugs, fail_injection, arch)?
        .into_iter()
        .map(|(name, _)| name)
        .collect())
}

/// Every check of `run` on a guest of `arch`, in order, by its printed
/// name: the checks in Rust, and the scenario library (`scenarios/`, its
/// files of that architecture or of none, and those that fail hotplug
/// operations only with `fail_injection`) before the allowed-set attacks.
fn plan(known_bugs: bool, fail_injection: bool, arch: Arch) -> Result<Vec<Planned>> {
    let one = |check: CtxCheck| move |ctx: &mut Ctx| Ok(vec![check(ctx)?]);
    let named = |&(name, check): &'static (&'static str, CtxCheck)| -> Planned {
        (
            name,
            Box::new(move |ctx: &mut Ctx| Ok(vec![run_one(ctx, name, check)?])),
        )
    };
    let mut plan: Vec<Planned> = vec![("PMUs and sysfs", Box::new(one(registration::sysfs)))];
    plan.extend(AROUND_MOVES.iter().map(named));
    plan.extend(SEMANTICS.iter().map(named));
    plan.extend(ATTRIBUTES.iter().map(named));
    plan.push(("perf stat", Box::new(one(counts::perf_stat))));
    // The library, the scenarios that reload the module last: the others
    // have never been run after a reload (see docs/counting-semantics.md,
    // "Known violations": an allowed-set change after two reloads that the
    // driver did not follow).
    let library = library()?
        .iter()
        .filter(|s| (known_bugs || !s.known) && s.runs_on(arch))
        .filter(|s| fail_injection || !s.fails_hotplug);
    let (reloading, rest): (Vec<&Written>, Vec<&Written>) = library.partition(|s| s.reloads);
    for s in rest.into_iter().chain(reloading) {
        plan.push((
            s.check,
            Box::new(move |ctx: &mut Ctx| Ok(vec![run_scenario(ctx, s)?])),
        ));
    }
    plan.push(("module unload", Box::new(one(registration::unload))));
    plan.push(("driver's accesses", Box::new(one(accesses::check))));
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use crate::build::image::arch::Arch;

    /// A check in Rust and a scenario of the library (or two scenarios)
    /// under one name would run twice, and `--check` and a mutant's named
    /// check could not tell them apart.
    #[test]
    fn no_two_checks_share_a_name() {
        let names = super::names(true, true, Arch::Arm64).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for name in &names {
            assert!(seen.insert(name), "{name:?} names two checks");
        }
        assert!(names.len() > 50, "{} checks", names.len());
    }

    /// The scenario that fails hotplug operations at kernel states needs
    /// the debug kernel (`CONFIG_CPU_HOTPLUG_STATE_CONTROL`): a check of its
    /// runs only, under the name the Rust check had.
    #[test]
    fn hotplug_fail_injection_runs_on_the_debug_kernel_only() {
        let name = "hotplug fail injection";
        assert!(super::names(false, true, Arch::X86_64)
            .unwrap()
            .contains(&name));
        assert!(!super::names(false, false, Arch::X86_64)
            .unwrap()
            .contains(&name));
    }

    /// The two long-park scenarios were known violations, run only with
    /// `--known-bugs` until the core stopped a parked PMU's events before
    /// a wrap (patch 0018): they run by default now.
    #[test]
    fn the_long_park_checks_run_by_default() {
        for name in [
            "hold-attack: long park read while parked on holding cpu",
            "hold-attack: long park read while held on cpu 0",
        ] {
            assert!(super::names(false, false, Arch::X86_64)
                .unwrap()
                .contains(&name));
        }
        assert!(super::names(false, false, Arch::X86_64)
            .unwrap()
            .contains(&"redteam: odd ioctls"));
    }
}
