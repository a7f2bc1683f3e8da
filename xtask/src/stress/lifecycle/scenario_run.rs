//! `cargo xtask scenario FILE...`: every file parsed (and refused, with
//! its line, before anything is built or booted), then carried out on one
//! lifecycle guest in turn, each as an ordinary lifecycle journal replayed
//! through the model; a finding names the scenario's file and line.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use perfbed_device::DeviceConfig;

use crate::checks::counting::Handle;
use crate::checks::{clean_log_check, Check};
use crate::guest::Guest;
use crate::host;
use crate::host::config::VmConfig;
use crate::host::vm::Vm;
use crate::progress::human;

use super::cli::GuestShape;
use super::journal::{self, Entry, Header, Step};
use super::reads;
use super::replay::replay;
use super::run::{probe_next_handle, shape};
use super::scenario::{files_under, parse, wants_against_model, Layout, Scenario, Want};
pub use super::scenario_guest::layout;
use super::scenario_guest::{carry_out, home, restore, shrink_on_guest, Env};
use super::shrink::{self, Shrinking};

#[derive(Args, Clone)]
pub struct ScenarioArgs {
    /// Scenario files, or folders of them (`.scn`, at any depth):
    /// scenarios/README.md says how to write one.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Guest vCPUs.
    #[arg(long, default_value_t = 4)]
    pub cpus: u8,
    /// The device's domains, e.g. 0-1:2-3 (default: the CPUs in two halves).
    #[arg(long)]
    pub domains: Option<String>,
    /// Boot the normal kernel instead of the debug one.
    #[arg(long)]
    pub normal: bool,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 512)]
    pub memory: u32,
    /// Seconds the boot, and each request to the guest, may take.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// Which VMM runs the guest (as for `stress`).
    #[arg(long, value_enum, default_value_t = host::HostChoice::Qemu)]
    pub host: host::HostChoice,
    /// Plant the named bug first (a driver or kernel mutant, as for
    /// `stress --mutant`): the scenarios that must catch it then fail.
    #[arg(long, value_name = "NAME")]
    pub mutant: Option<String>,
    /// Do not shrink a failing scenario (by default its first finding is
    /// shrunk, in the same guest, to `NAME.shrunk.scn` in the run folder).
    #[arg(long)]
    pub no_shrink: bool,
    /// Seconds shrinking one failing scenario may take.
    #[arg(long, default_value_t = 600, value_name = "SECS")]
    pub shrink_time: u64,
}

impl ScenarioArgs {
    fn guest(&self) -> GuestShape {
        GuestShape {
            cpus: self.cpus,
            domains: self.domains.clone(),
            memory: self.memory,
            normal: self.normal,
            host: self.host,
            timeout: Duration::from_secs(self.timeout),
        }
    }
}

/// Reads and parses `files` for `layout` (handles from 1), with the wants
/// the model contradicts: every refusal, each with its file and line.
pub fn load(
    files: &[PathBuf],
    layout: &Layout,
    device: &DeviceConfig,
) -> Result<Vec<(PathBuf, String)>> {
    let mut texts = Vec::new();
    let mut refused = Vec::new();
    for file in files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        match parse(file, &text, layout, 1) {
            Ok(s) => refused.extend(wants_against_model(&s, shape(device))),
            Err(e) => refused.push(e),
        }
        texts.push((file.clone(), text));
    }
    if !refused.is_empty() {
        let lines: Vec<String> = refused.iter().map(ToString::to_string).collect();
        bail!(
            "{} refused before the guest boots:\n  {}",
            files_word(refused.len()),
            lines.join("\n  ")
        );
    }
    Ok(texts)
}

fn files_word(n: usize) -> String {
    if n == 1 {
        "a scenario line is".into()
    } else {
        format!("{n} scenario lines are")
    }
}

pub fn run(ws: &Path, args: &ScenarioArgs) -> Result<bool> {
    let guest = args.guest();
    let device = guest.device()?;
    let files = files_under(&args.files).context("listing the scenario files")?;
    let texts = load(&files, &layout(args.cpus, &device), &device)?;
    let mutant = match &args.mutant {
        Some(name) => Some(crate::stress::mutants::find(ws, name)?),
        None => None,
    };
    let name = mutant
        .as_ref()
        .map_or("scenario".into(), super::cli::run_name);
    let (vm_config, accel, under) = guest.vm(ws, mutant.as_ref(), &name)?;
    eprintln!(
        "==> scenario: {} file{}{}, {} vCPUs, {} slots per domain, {} kernel, under {under}",
        texts.len(),
        if texts.len() == 1 { "" } else { "s" },
        mutant
            .as_ref()
            .map_or(String::new(), |m| format!(", mutant {}", m.name)),
        vm_config.cpus,
        device.slots,
        guest.variant().name()
    );
    let start = Instant::now();
    let shrink = (!args.no_shrink).then(|| {
        let mut command = format!("cargo xtask scenario --cpus {}", args.cpus);
        for (flag, value) in [("--domains", &args.domains), ("--mutant", &args.mutant)] {
            if let Some(v) = value {
                command += &format!(" {flag} {v}");
            }
        }
        if args.normal {
            command += " --normal";
        }
        if args.host != host::HostChoice::Qemu {
            command += &format!(" --host {}", args.host.name());
        }
        Shrinking::new(Duration::from_secs(args.shrink_time), command)
    });
    let (checks, boot_time) = execute(&vm_config, &accel, &texts, guest.timeout, shrink.as_ref())?;
    let passed = checks.iter().all(|c| c.passed);
    println!(
        "\nperfbed scenario: {}",
        if passed { "PASSED" } else { "FAILED" }
    );
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for c in &checks {
        println!(
            "  {}  {:width$}  {}",
            if c.passed { "PASS" } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    println!(
        "  time: boot {}, boot to the last verdict {}; journals in {}",
        human(boot_time),
        human(start.elapsed()),
        vm_config.run_dir.display()
    );
    Ok(passed)
}

/// Boots `vm_config`, carries out the scenarios `texts` (each file's
/// path and text, refused already if bad), powers off: one check per
/// scenario, the placement violations and the kernel log's; and how long
/// the boot took. With `shrink`, a scenario the model finds fault with is
/// shrunk to a smaller one that fails the same way (its check says where).
pub fn execute(
    vm_config: &VmConfig,
    accel: &host::Accel,
    texts: &[(PathBuf, String)],
    timeout: Duration,
    shrink: Option<&Shrinking>,
) -> Result<(Vec<Check>, Duration)> {
    let booted = Vm::boot(vm_config, accel)?;
    let mut vm = booted.vm;
    let mut checks = on_guest(
        &mut vm,
        &vm_config.device,
        vm_config.cpus,
        texts,
        timeout,
        &vm_config.run_dir,
        shrink,
    )?;
    vm.power_off(Duration::from_secs(60))?;
    checks.push(clean_log_check(&vm_config.run_dir.join("serial.log")));
    Ok((checks, booted.boot_time))
}

/// Loads the driver and runs each scenario; one check per scenario, then
/// the device's placement violations.
fn on_guest(
    vm: &mut Vm,
    device: &DeviceConfig,
    cpus: u8,
    texts: &[(PathBuf, String)],
    timeout: Duration,
    run_dir: &Path,
    shrink: Option<&Shrinking>,
) -> Result<Vec<Check>> {
    let socket = vm.control_socket.clone();
    let mut g = Guest { vm, timeout };
    let (pmus, types, mut control) = super::load_driver(&mut g, &socket, device)?;
    let layout = layout(cpus, device);
    let mut checks = Vec::new();
    let env = Env {
        pmus: &pmus,
        types: &types,
        device,
        timeout,
    };
    home(&mut g, &mut control, &env)?;
    for (file, text) in texts {
        // Numbered from the agent's next handle this time.
        let first = probe_next_handle(&mut g)?;
        let scenario = parse(file, text, &layout, first).map_err(anyhow::Error::from)?;
        let journal = carry_out(&mut g, &mut control, &env, &scenario)?;
        let path = run_dir.join(format!(
            "{}.jsonl",
            file.file_stem()
                .map_or("scenario".into(), |s| s.to_string_lossy())
        ));
        let header = Header {
            pmus: device.domains.len() as u32,
            slots: device.slots,
            unit_bytes: device.unit_bytes,
            counter_width: device.counter_width,
            max_rate: device.max_rate,
            seed: 0,
            replay: format!("cargo xtask scenario {}", file.display()),
            cpus: journal::Cpus::default(),
        };
        std::fs::write(&path, journal::to_text(&header, &journal)?)
            .with_context(|| format!("writing {}", path.display()))?;
        let mut check = judge(&scenario, &journal, device);
        let first = replay(shape(device), &journal).findings.into_iter().next();
        let said = match (shrink, check.passed, first) {
            (Some(budget), false, Some(first)) => {
                let failing = shrink::Failing {
                    journal: &journal,
                    owners: vec![],
                    first,
                };
                let file = path.with_extension("shrunk.scn");
                let shrunk =
                    shrink_on_guest(&mut g, &mut control, &env, &layout, &failing, budget, &file)?;
                Some(match shrunk {
                    Ok(s) => s.text(),
                    Err(why) => format!("not shrunk: {why}"),
                })
            }
            (Some(_), false, None) => {
                Some("not shrunk: the model found nothing (a want failed, or the guest)".into())
            }
            _ => None,
        };
        if let Some(said) = said {
            check.detail += &format!("\n    {said}");
        }
        checks.push(check);
        restore(&mut g, &mut control, &env, &journal)?;
    }
    let state = control.state()?;
    checks.push(super::super::jobs::violations_check(&state));
    Ok(checks)
}

/// The scenario's verdict: the replay's findings and the wants the run
/// did not show, each at its file and line.
fn judge(scenario: &Scenario, journal: &[Entry], device: &DeviceConfig) -> Check {
    let at = |line: usize| format!("{}:{line}", scenario.file.display());
    let replayed = replay(shape(device), journal);
    // By line: the model's findings and the unmet wants, in file order.
    let mut problems: Vec<(usize, String)> = replayed
        .findings
        .iter()
        .map(|f| (scenario.ops[f.index].line, f.text.clone()))
        .collect();
    let mut formats = std::collections::BTreeMap::new();
    for (op, entry) in scenario.ops.iter().zip(journal) {
        if let Step::Open { event, expect } = &entry.step {
            formats.insert(*expect, event.read_format);
        }
        for want in &op.wants {
            if let Some(problem) = want_problem(want, &op.shows, entry, &formats) {
                problems.push((want_line(want), problem));
            }
        }
    }
    problems.sort_by_key(|&(line, _)| line);
    let mut problems: Vec<String> = problems
        .into_iter()
        .map(|(line, text)| format!("{}: {text}", at(line)))
        .collect();
    if !problems.is_empty() {
        // The model names events by handle.
        let legend: Vec<String> = scenario
            .names
            .iter()
            .map(|(h, name)| format!("{name} = event {h}"))
            .collect();
        problems.push(format!("(events: {})", legend.join(", ")));
    }
    let name = scenario
        .check
        .clone()
        .unwrap_or_else(|| scenario.file.display().to_string());
    Check::from_problems(
        Box::leak(name.into_boxed_str()),
        problems,
        format!(
            "{}: {} operations, {} reads, {} values, all as the model says",
            scenario.file.display(),
            journal.len(),
            replayed.reads,
            replayed.values
        ),
    )
}

fn want_line(want: &Want) -> usize {
    match want {
        Want::Value { line, .. } | Want::Refused { line, .. } => *line,
    }
}

/// What the run showed against one want, if it differs.
fn want_problem(
    want: &Want,
    shows: &[Handle],
    entry: &Entry,
    formats: &std::collections::BTreeMap<Handle, journal::ReadFormat>,
) -> Option<String> {
    match (want, &entry.result, &entry.step) {
        (Want::Refused { errno, .. }, Err(got), _) if got == errno => None,
        (Want::Refused { errno, .. }, got, _) => {
            Some(format!("the open gave {got:?}, want {errno}"))
        }
        (Want::Value { .. }, Err(e), _) => Some(format!("the read failed: {e}")),
        (
            Want::Value {
                handle,
                name,
                bytes,
                ..
            },
            Ok(words),
            &Step::Read { handle: read },
        ) => {
            let Some(format) = formats.get(&read) else {
                return Some(format!(
                    "the read of {name}: its event's open is not in the journal"
                ));
            };
            match reads::parse(words, *format, read, shows) {
                Ok(members) => match members.iter().find(|m| m.handle == *handle) {
                    Some(m) if m.observed.value == *bytes => None,
                    Some(m) => Some(format!("{name} read {}, want {bytes}", m.observed.value)),
                    None => Some(format!("the read does not show {name}")),
                },
                Err(e) => Some(format!("the read of {name}: {e}")),
            }
        }
        (Want::Value { .. }, Ok(_), step) => Some(format!("a value wanted of {step:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> DeviceConfig {
        let mut device = crate::stress::device(4, None).unwrap();
        device.slots = super::super::SLOTS;
        device
    }

    /// The journal of `scenario` as if every step did what it says, with
    /// `reads` as the reads' answers, in order.
    fn journal_of(scenario: &Scenario, reads: &[Vec<u64>]) -> Vec<Entry> {
        let mut reads = reads.iter();
        scenario
            .ops
            .iter()
            .map(|op| Entry {
                step: op.step.clone(),
                result: Ok(match op.step {
                    Step::Open { expect, .. } => vec![u64::from(expect)],
                    Step::Read { .. } => reads.next().unwrap().clone(),
                    Step::Park { .. } => vec![],
                    Step::Unpark { cpu, .. } => vec![u64::from(cpu)],
                    _ => vec![0],
                }),
                took_ns: 1000,
                at_ns: 0,
            })
            .collect()
    }

    #[test]
    fn a_finding_and_an_unmet_want_name_the_file_and_line() {
        let device = device();
        let text = "a = open movable mbm_total_bytes rmid=1\n\
                    burst movable mbm_total_bytes rmid=1 1MiB\n\
                    park movable\n\
                    burst movable mbm_total_bytes rmid=1 2MiB\n\
                    disable a\n\
                    burst movable mbm_total_bytes rmid=1 4MiB\n\
                    unpark movable\n\
                    read a\n\
                    want a 3MiB\n";
        let s = parse(Path::new("p.scn"), text, &layout(4, &device), 1).unwrap();
        let right = judge(&s, &journal_of(&s, &[vec![3 << 20]]), &device);
        assert!(right.passed, "{}", right.detail);
        // Counted what landed while disabled: a read the model may allow
        // (a DISABLE while parked), but not the want.
        let counted = judge(&s, &journal_of(&s, &[vec![7 << 20]]), &device);
        assert!(!counted.passed);
        assert!(
            counted
                .detail
                .contains("p.scn:9: a read 7340032, want 3145728"),
            "{}",
            counted.detail
        );
        // Counted more than landed, where the model knows it exactly:
        // its finding, at the read's line, with no want to help it.
        let plain = "a = open movable mbm_total_bytes rmid=1\n\
                     burst movable mbm_total_bytes rmid=1 1MiB\n\
                     read a\n";
        let s = parse(Path::new("q.scn"), plain, &layout(4, &device), 1).unwrap();
        assert!(judge(&s, &journal_of(&s, &[vec![1 << 20]]), &device).passed);
        let more = judge(&s, &journal_of(&s, &[vec![2 << 20]]), &device);
        assert!(!more.passed);
        assert!(
            more.detail.ends_with("(events: a = event 1)"),
            "{}",
            more.detail
        );
        assert!(
            more.detail.starts_with("q.scn:3: read of event 1"),
            "{}",
            more.detail
        );
    }
}
