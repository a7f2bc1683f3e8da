//! A scenario on a booted guest: its steps carried out in order (perf
//! steps through the agent, host steps one by one), the guest put back as
//! it found it after (its events closed, every CPU online, the default
//! allowed sets, no rate, each PMU on its domain's first CPU), and a
//! failing run shrunk there (`shrink`), candidate after candidate. Used by
//! `cargo xtask scenario` (`scenario_run`) and by the lifecycle stress.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use perfbed_device::{ControlClient, DeviceConfig};

use crate::checks::counting::Handle;
use crate::guest::Guest;
use crate::host::config::VmConfig;
use crate::progress::human;

use super::journal::{self, perf_op, Entry, Opened, Step};
use super::replay::{replay, Finding};
use super::run::{attr_of, flush, host_step, probe_next_handle, shape};
use super::scenario::{parse, Layout, Scenario, Want};
use super::shrink::{self, Shrinking};

/// What carrying out a step needs besides the guest.
pub struct Env<'a> {
    pub pmus: &'a [String],
    pub types: &'a [u32],
    pub device: &'a DeviceConfig,
    pub timeout: Duration,
}

/// Carries out the scenario's steps in order, one journal entry each:
/// perf steps in batches through the agent, host steps one by one (an
/// `owner(d)` open is sent alone, with the CPU domain `d`'s cpumask shows).
pub fn carry_out(
    g: &mut Guest,
    control: &mut ControlClient,
    env: &Env,
    scenario: &Scenario,
) -> Result<Vec<Entry>> {
    let attr = |o: &Opened| attr_of(o, env.types);
    let start = Instant::now();
    let mut journal = Vec::new();
    let mut pending: Vec<(Step, bool)> = Vec::new();
    for op in &scenario.ops {
        let mut step = op.step.clone();
        if let (Some(d), Step::Open { event, .. }) = (op.on_owner, &mut step) {
            flush(g, &mut pending, &attr, &mut journal, start)?;
            event.cpu = match g.cpumask(&env.pmus[d as usize])?.first() {
                Some(&cpu) => cpu as i32,
                None => bail!(
                    "{}:{}: cpu=owner({d}), but {} is parked there",
                    scenario.file.display(),
                    op.line,
                    env.pmus[d as usize]
                ),
            };
        }
        if perf_op(&step, attr).is_some() {
            let opens = !op.wants.iter().any(|w| matches!(w, Want::Refused { .. }));
            pending.push((step, opens));
            continue;
        }
        // A desync (an open that did not give the handle the parser gave
        // it) shows in the replay as a finding at that open.
        flush(g, &mut pending, &attr, &mut journal, start)?;
        journal.push(host_step(
            g,
            control,
            env.device,
            env.pmus,
            step,
            env.timeout,
            start,
        )?);
    }
    flush(g, &mut pending, &attr, &mut journal, start)?;
    Ok(journal)
}

/// Leaves the guest as a scenario (or a lifecycle run) found it: its
/// events closed, its gauges' occupancy 0, its allowed sets the defaults,
/// every CPU online, no rate, each PMU on its domain's first CPU.
pub fn restore(
    g: &mut Guest,
    control: &mut ControlClient,
    env: &Env,
    journal: &[Entry],
) -> Result<()> {
    let mut open: std::collections::BTreeSet<Handle> = std::collections::BTreeSet::new();
    for entry in journal {
        match (&entry.step, &entry.result) {
            (Step::Open { expect, .. }, Ok(words)) if words.as_slice() == [u64::from(*expect)] => {
                open.insert(*expect);
            }
            (Step::Close { handle }, _) => {
                open.remove(handle);
            }
            _ => {}
        }
    }
    for handle in open {
        let _ = g.close(handle);
    }
    for entry in journal {
        match entry.step {
            Step::Rate { domain, .. } => {
                control.set_rate(
                    domain,
                    super::generate::RMID_RATE,
                    perfbed_device::regs::Event::MbmLocalBytes,
                    0,
                )?;
            }
            // A gauge reads the level last set: the next scenario's
            // model starts from none.
            Step::Occupancy { domain, rmid, .. } => control.set_occupancy(domain, rmid, 0)?,
            Step::Allowed { domain, .. } => {
                control
                    .set_allowed(domain, &env.device.domains[domain as usize])
                    .map_err(|e| anyhow::anyhow!("the default allowed set back: {e}"))?;
            }
            _ => {}
        }
    }
    let cpus = env.device.domains.iter().flatten().copied();
    let online =
        perfbed_device::cpus::parse_cpu_list(g.read_file("/sys/devices/system/cpu/online")?.trim())
            .map_err(|e| anyhow::anyhow!("/sys/devices/system/cpu/online: {e}"))?;
    for cpu in cpus.filter(|c| !online.contains(c)) {
        g.set_online(cpu, true)?;
    }
    home(g, control, env)
}

/// Puts every PMU on its domain's first CPU (through an allowed set of
/// that CPU alone, then the default set, which keeps it there), so that
/// each scenario starts with the owners its `offline` lines can name.
pub fn home(g: &mut Guest, control: &mut ControlClient, env: &Env) -> Result<()> {
    for (d, (pmu, cpus)) in (0u32..).zip(env.pmus.iter().zip(&env.device.domains)) {
        let first = cpus[0];
        let (_, mask) = g.wait_cpumask(pmu, |m| m.len() == 1 && cpus.contains(&m[0]))?;
        if mask == [first] {
            continue;
        }
        for set in [vec![first], cpus.clone()] {
            control
                .set_allowed(d, &set)
                .map_err(|e| anyhow::anyhow!("{pmu}: the allowed set {set:?}: {e}"))?;
            let (ok, mask) = g.wait_cpumask(pmu, |m| m == [first])?;
            if !ok {
                bail!("{pmu}: the allowed set {set:?}: cpumask {mask:?}, want [{first}]");
            }
        }
    }
    Ok(())
}

/// Shrinks `failing` on the guest that ran it: the guest's state reset
/// (the run's events closed, every CPU online, the default allowed sets,
/// no rate, each PMU on its domain's first CPU), then each candidate
/// carried out as `cargo xtask scenario` would, judged as it judges, and
/// the state reset again.
#[allow(clippy::too_many_arguments)]
pub fn shrink_on_guest(
    g: &mut Guest,
    control: &mut ControlClient,
    env: &Env,
    layout: &Layout,
    failing: &shrink::Failing,
    budget: &Shrinking,
    file: &Path,
) -> Result<Result<shrink::Shrunk, String>> {
    restore(g, control, env, failing.journal)?;
    let shape = shape(env.device);
    let target = failing.first.index;
    crate::progress::say(&format!(
        "    shrinking: the first finding, operation {target}, within {} or {} candidates",
        human(budget.time),
        budget.candidates
    ));
    let mut oracle = |text: &str, at: &[usize]| -> Result<Option<(usize, String)>> {
        let first = probe_next_handle(g)?;
        let scenario = parse(file, text, layout, first)?;
        let journal = carry_out(g, control, env, &scenario)?;
        let first = replay(shape, &journal).findings.into_iter().next();
        restore(g, control, env, &journal)?;
        Ok(first.map(|f| (at.get(f.index).copied().unwrap_or(usize::MAX), f.text)))
    };
    shrink::shrink(failing, layout, shape, budget, file, &mut oracle)
}

/// The layout a scenario is parsed for.
pub fn layout(cpus: u8, device: &DeviceConfig) -> Layout {
    Layout {
        cpus: u32::from(cpus),
        domains: device.domains.clone(),
        rmids: device.rmids,
    }
}

/// Shrinks the run's journal (at `path`) from its first finding to a
/// scenario in the run folder: what to print.
#[allow(clippy::too_many_arguments)]
pub fn shrink_run(
    g: &mut Guest,
    control: &mut ControlClient,
    pmus: &[String],
    types: &[u32],
    vm_config: &VmConfig,
    timeout: Duration,
    path: &Path,
    first: &Finding,
    budget: &Shrinking,
) -> Result<String> {
    let text = std::fs::read_to_string(path)?;
    let (header, journal) =
        journal::from_text(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let env = Env {
        pmus,
        types,
        device: &vm_config.device,
        timeout,
    };
    let layout = layout(vm_config.cpus, &vm_config.device);
    let failing = shrink::Failing {
        journal: &journal,
        owners: header.cpus.owners,
        first: first.clone(),
    };
    let file = vm_config.run_dir.join("shrunk.scn");
    let shrunk = shrink_on_guest(g, control, &env, &layout, &failing, budget, &file)?;
    let text = match shrunk {
        Ok(s) => s.text(),
        Err(why) => format!("not shrunk: {why}"),
    };
    crate::progress::say(&format!("    {text}"));
    Ok(text)
}
