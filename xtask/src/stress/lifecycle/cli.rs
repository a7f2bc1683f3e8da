//! `cargo xtask stress --lifecycle OPS`, `--mutant NAME` and `--mutants`:
//! the lifecycle stress on its own guest, with or without a planted bug,
//! and the table of planted bugs.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::build::image::arch::Arch;
use crate::build::image::{self, Purpose, Variant};
use crate::host;
use crate::host::config::{self, VmConfig};
use crate::progress::human;
use crate::stress::mutants::{self, Mutant, MutantKind};
use crate::stress::{clock_seed, device, guest_vm, StressArgs};

use super::journal;
use super::replay::replay_on;
use super::run::{LifecycleConfig, LifecycleReport};
use super::SLOTS;

/// Operations of a mutant's run unless `--lifecycle` says otherwise, and
/// its seed unless `--seed` or the mutant's `# Lifecycle seed:` line does: enough to catch every mutant of the
/// table, short enough for `cargo xtask test`.
pub const MUTANT_OPS: u32 = 600;
pub const MUTANT_SEED: u64 = 17;

/// What one run of a mutant came to.
pub struct MutantRow {
    pub name: String,
    /// The operation that first differed from the model, if any.
    pub caught_at: Option<usize>,
    /// The check that caught it.
    pub caught_by: Option<&'static str>,
    pub time: Duration,
    pub replay: String,
    /// Why the run could not be made (a patch that does not apply, ...).
    pub error: Option<String>,
    /// The failing run shrunk to a scenario (see `shrink`), or why not.
    pub shrunk: Option<String>,
}

pub fn run(ws: &Path, args: &StressArgs) -> Result<bool> {
    if let Some(file) = &args.journal {
        return replay_file(file);
    }
    args.check_arch()?;
    if args.mutants {
        let rows = table(ws, args)?;
        print!("{}", table_text(&rows));
        return Ok(rows.iter().all(|r| r.caught_at.is_some()));
    }
    if let Some(name) = &args.mutant {
        let mutant = mutants::find(ws, name)?;
        let row = run_mutant(ws, args, &mutant)?;
        print!("{}", table_text(std::slice::from_ref(&row)));
        return Ok(row.caught_at.is_some());
    }
    let ops = args.lifecycle.unwrap_or(MUTANT_OPS);
    let seed = args.seed.unwrap_or_else(clock_seed);
    let (report, config) = lifecycle(ws, args, ops, seed, None, false)?;
    println!(
        "\nperfbed stress --lifecycle: {}",
        if report_passed(&report) {
            "PASSED"
        } else {
            "FAILED"
        }
    );
    print!("{}", checks_text(&report));
    print!("{}", report.text(&config));
    Ok(report_passed(&report))
}

/// `--journal FILE`: the replay of a saved journal, every finding printed.
fn replay_file(file: &Path) -> Result<bool> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let (header, entries) =
        journal::from_text(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let replayed = replay_on(header.shape(), &header.cpus, &entries);
    for f in &replayed.findings {
        println!(
            "operation {}: {}\n    {:?}",
            f.index, f.text, entries[f.index].step
        );
    }
    println!(
        "{} operations, {} reads, {} values: {} mismatches against the model (seed {}; the run: {})",
        entries.len(),
        replayed.reads,
        replayed.values,
        replayed.findings.len(),
        header.seed,
        header.replay
    );
    Ok(replayed.findings.is_empty())
}

fn report_passed(report: &LifecycleReport) -> bool {
    report.checks.iter().all(|c| c.passed)
}

fn checks_text(report: &LifecycleReport) -> String {
    let width = report
        .checks
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for check in &report.checks {
        let _ = writeln!(
            out,
            "  {}  {:width$}  {}",
            if check.passed { "PASS" } else { "FAIL" },
            check.name,
            check.detail
        );
    }
    out
}

/// Every driver mutant (and, with `--kernel-mutants`, every kernel one).
pub fn table(ws: &Path, args: &StressArgs) -> Result<Vec<MutantRow>> {
    let mut rows = Vec::new();
    for mutant in mutants::all(ws)? {
        if mutant.kind != MutantKind::Driver && !args.kernel_mutants {
            continue;
        }
        rows.push(run_mutant(ws, args, &mutant)?);
    }
    if rows.is_empty() {
        bail!("no mutants in guest-driver/mutants/ (or images/kernel/mutants/)");
    }
    Ok(rows)
}

/// `mutant`'s run as `cargo xtask stress --mutant NAME` makes it, every
/// flag at its default.
pub fn run_mutant_as_stress_does(ws: &Path, mutant: &Mutant) -> Result<MutantRow> {
    #[derive(clap::Parser)]
    struct Defaults {
        #[command(flatten)]
        args: StressArgs,
    }
    let defaults = <Defaults as clap::Parser>::try_parse_from(["stress"])
        .context("the stress command's defaults")?;
    run_mutant(ws, &defaults.args, mutant)
}

fn run_mutant(ws: &Path, args: &StressArgs, mutant: &Mutant) -> Result<MutantRow> {
    let ops = args.lifecycle.unwrap_or(MUTANT_OPS);
    let seed = match args.seed {
        Some(seed) => seed,
        None => mutant.seed()?.unwrap_or(MUTANT_SEED),
    };
    eprintln!("==> mutant {}: {}", mutant.name, mutant.summary());
    let start = Instant::now();
    let mut args = args.clone();
    args.moving_thread |= mutant.moving_thread()?;
    let replay = replay_command(&args, ops, seed, Some(&mutant.name));
    let result = lifecycle(ws, &args, ops, seed, Some(mutant), true).map(|(report, _)| report);
    Ok(mutant_row(mutant, replay, start, result))
}

/// The run folder's name for a mutant: short, as the sockets in it must
/// have paths under 108 bytes.
pub fn run_name(mutant: &Mutant) -> String {
    format!("mut-{}", mutant.name.chars().take(12).collect::<String>())
}

/// A mutant's row of the table, from its run (an `Err`: it did not run).
pub fn mutant_row(
    mutant: &Mutant,
    replay: String,
    start: Instant,
    result: Result<LifecycleReport>,
) -> MutantRow {
    let ((caught_at, caught_by), error, shrunk) = match result {
        Ok(report) => (caught(&report), None, report.shrunk),
        Err(e) => ((None, None), Some(format!("{e:#}")), None),
    };
    MutantRow {
        name: mutant.name.clone(),
        caught_at,
        caught_by,
        time: start.elapsed(),
        replay,
        error,
        shrunk,
    }
}

/// The images a mutant's guest of `arch` boots: its driver, or its kernel
/// (on arm64 a kernel mutant only).
pub fn mutant_images(
    ws: &Path,
    variant: Variant,
    arch: Arch,
    mutant: Option<&Mutant>,
) -> Result<image::Images> {
    if arch != Arch::X86_64 {
        return match mutant {
            None => image::ensure_arch(ws, variant, arch, None),
            Some(m) if m.kind == MutantKind::Driver => bail!(
                "{}: a driver mutant on --arch {} is not built yet (a kernel mutant is)",
                m.name,
                arch.kernel_arch()
            ),
            Some(m) => image::ensure_arch(
                ws,
                variant,
                arch,
                Some(&|series| mutants::kernel_patches(m, series, &ws.join("images/kernel"))),
            ),
        };
    }
    match mutant {
        None => image::ensure(ws, variant),
        Some(m) if m.kind == MutantKind::Driver => {
            let tree = mutants::driver_tree(ws, m)?;
            image::ensure_with_driver(ws, variant, Purpose::Test, Some(&tree))
        }
        Some(m) => image::ensure_with_kernel_patches(ws, variant, &|series| {
            mutants::kernel_patches(m, series, &ws.join("images/kernel"))
        }),
    }
}

/// Where a run first failed: a check before the random operations (after
/// 0 of them), its first mismatch against the model, or any other failing
/// check (a splat, a violation: counted as the last operation).
fn caught(report: &LifecycleReport) -> (Option<usize>, Option<&'static str>) {
    let first_failed = report.checks.iter().position(|c| !c.passed);
    let failed = first_failed.map(|i| report.checks[i].name);
    if first_failed.is_some_and(|i| i < report.prologue) {
        return (Some(0), failed);
    }
    match report.caught_at() {
        Some(at) => (Some(at), failed),
        None => (failed.map(|_| report.steps), failed),
    }
}

pub fn table_text(rows: &[MutantRow]) -> String {
    let mut out = String::from("\nplanted bugs (mutants):\n");
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(0);
    for r in rows {
        let verdict = match (&r.caught_at, &r.error) {
            (_, Some(e)) => format!("NOT RUN: {}", e.lines().next().unwrap_or("")),
            (Some(n), None) => match r.caught_by {
                Some(check) => format!("caught after {n} operations by \"{check}\""),
                None => format!("caught after {n} operations"),
            },
            (None, None) => "NOT CAUGHT".to_string(),
        };
        let _ = writeln!(
            out,
            "  {:width$}  {verdict} ({})\n    {}",
            r.name,
            human(r.time),
            r.replay
        );
        if let Some(shrunk) = &r.shrunk {
            let _ = writeln!(out, "    {shrunk}");
        }
        if let Some(e) = &r.error {
            for line in e.lines().skip(1) {
                let _ = writeln!(out, "      {line}");
            }
        }
    }
    out
}

fn replay_command(args: &StressArgs, ops: u32, seed: u64, mutant: Option<&str>) -> String {
    let mut cmd = format!(
        "cargo xtask stress --lifecycle {ops} --seed {seed}{}",
        args.guest_flags()
    );
    if args.no_parked_ioctls {
        cmd += " --no-parked-ioctls";
    }
    if args.rcutorture {
        cmd += " --rcutorture";
    }
    if args.moving_thread {
        cmd += " --moving-thread";
    }
    if args.watched_rates {
        cmd += " --watched-rates";
    }
    if let Some(m) = mutant {
        let _ = write!(cmd, " --mutant {m}");
    }
    cmd
}

/// The `cargo xtask run` check a mutant names, checked before anything is
/// built: a misspelt name fails now, not after a kernel build and a boot.
fn named_check(mutant: &Mutant) -> Result<Option<String>> {
    let check = mutant.run_check()?;
    if let Some(name) = &check {
        if !crate::checks::pmu::can_run_alone(name)? {
            bail!(
                "{} names the check {name:?}, which cannot run on its own",
                mutant.file.display()
            );
        }
    }
    Ok(check)
}

/// The guest of a lifecycle run, and of a scenario's: the stress device
/// with [`SLOTS`] slots, the debug kernel unless `--normal` or
/// `--sanitize`, on the host asked for; an arm64 guest (on perfbed's
/// aarch64 QEMU, `virt`) if `arch` says so.
pub struct GuestShape {
    pub arch: Arch,
    pub cpus: u8,
    pub domains: Option<String>,
    pub memory: u32,
    pub variant: Variant,
    pub host: host::HostChoice,
    pub timeout: Duration,
}

impl GuestShape {
    fn of(args: &StressArgs) -> GuestShape {
        GuestShape {
            arch: args.arch,
            cpus: args.cpus,
            domains: args.domains.clone(),
            memory: args.memory,
            variant: crate::stress::kernel_variant(args.normal, args.sanitize),
            host: args.host,
            timeout: Duration::from_secs(args.timeout),
        }
    }

    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// The device, checked against the guest's size.
    pub fn device(&self) -> Result<perfbed_device::DeviceConfig> {
        config::check_size(self.cpus, self.memory)?;
        let mut device = device(self.cpus, self.domains.as_deref())?;
        device.slots = SLOTS;
        Ok(device)
    }

    /// Builds what the guest needs (with `mutant`'s driver or kernel) and
    /// its VM, in a run folder called `name`; says which host and why.
    pub fn vm(
        &self,
        ws: &Path,
        mutant: Option<&Mutant>,
        name: &str,
    ) -> Result<(VmConfig, host::Accel, String)> {
        let device = self.device()?;
        let images = mutant_images(ws, self.variant(), self.arch, mutant)?;
        let accel = host::choose_accel();
        let (host, why) = match self.arch {
            Arch::X86_64 => {
                let (placement, why) = host::choose_host(self.host, &accel);
                let host = host::build_host(ws, placement, &images.vmlinux, &images.initramfs)?;
                (host, why)
            }
            Arch::Arm64 => (host::Host::QemuVirt, "TCG".into()),
        };
        let vm = VmConfig {
            host,
            ..guest_vm(
                ws,
                &images,
                device,
                self.cpus,
                self.memory,
                name,
                self.timeout,
            )
        };
        let under = if why.is_empty() {
            vm.host.name().to_string()
        } else {
            format!("{}: {why}", vm.host.name())
        };
        Ok((vm, accel, under))
    }
}

/// Builds what the run needs (the mutant's driver or kernel), boots, runs.
fn lifecycle(
    ws: &Path,
    args: &StressArgs,
    ops: u32,
    seed: u64,
    mutant: Option<&Mutant>,
    stop_at_first: bool,
) -> Result<(LifecycleReport, LifecycleConfig)> {
    let shape = GuestShape::of(args);
    shape.device()?;
    let run_check = match mutant {
        Some(m) => named_check(m)?,
        None => None,
    };
    let name = mutant.map_or_else(|| "lifecycle".to_string(), run_name);
    let (vm, accel, under) = shape.vm(ws, mutant, &name)?;
    let config = LifecycleConfig {
        ops,
        seed,
        timeout: shape.timeout,
        replay: replay_command(args, ops, seed, mutant.map(|m| m.name.as_str())),
        stop_at_first,
        parked_ioctls: !args.no_parked_ioctls,
        run_check,
        shrink: args.shrinking(),
        rcutorture: args.rcutorture,
        moving_thread: args.moving_thread,
        watched_rates: args.watched_rates,
    };
    eprintln!(
        "==> stress --lifecycle: {ops} operations, seed {seed}, {} vCPUs, {} slots per domain, {} kernel, under {under}{}{}",
        vm.cpus,
        SLOTS,
        shape.variant().name(),
        if args.moving_thread {
            ", with a moving thread"
        } else {
            ""
        },
        if args.watched_rates {
            ", with watched rates"
        } else {
            ""
        },
    );
    let report = super::execute(&vm, &accel, &config)?;
    Ok((report, config))
}
