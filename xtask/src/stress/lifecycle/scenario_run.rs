//! `cargo xtask scenario FILE...`: every file parsed (and refused, with
//! its line, before anything is built or booted), then carried out on one
//! lifecycle guest in turn, each as an ordinary lifecycle journal replayed
//! through the model; a finding names the scenario's file and line.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use perfbed_device::DeviceConfig;

use crate::build::image::arch::Arch;
use crate::checks::pmu::context::Ctx;
use crate::checks::{clean_log_check, Check};
use crate::guest::Guest;
use crate::host;
use crate::host::config::VmConfig;
use crate::host::vm::Vm;
use crate::progress::human;

use super::cli::GuestShape;
use super::scenario::{arch_of, fails_hotplug, files_under};
use super::scenario_guest::{carry_out_file, layout, load};
use super::shrink::Shrinking;

#[derive(Args, Clone)]
pub struct ScenarioArgs {
    /// Scenario files, or folders of them (`.scn`, at any depth):
    /// scenarios/README.md says how to write one.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// The guest's architecture: arm64 boots on perfbed's aarch64 QEMU
    /// (the debug kernel unless `--normal`, as on x86), where CPU 0 goes
    /// offline too (docs/arm64.md). A file of a folder whose `# arch:` header names
    /// another is left out, with a note; a file named alone is refused.
    #[arg(long, value_enum, default_value_t = Arch::X86_64, conflicts_with = "sanitize")]
    pub arch: Arch,
    /// Guest vCPUs.
    #[arg(long, default_value_t = 4)]
    pub cpus: u8,
    /// The device's domains, e.g. 0-1:2-3 (default: the CPUs in two halves).
    #[arg(long)]
    pub domains: Option<String>,
    /// Boot the normal kernel instead of the debug one. It cannot fail a
    /// hotplug operation at a kernel state: a file of a folder with such a
    /// line is left out, with a note; a file named alone is refused.
    #[arg(long)]
    pub normal: bool,
    /// Boot the sanitizer kernel (the debug one with KCSAN) instead.
    #[arg(long, conflicts_with = "normal")]
    pub sanitize: bool,
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
    /// Only parse the files and check their wants against the model, on
    /// the host: every refusal with its file and line, nothing built or
    /// booted.
    #[arg(long, conflicts_with = "mutant")]
    pub parse_only: bool,
}

impl ScenarioArgs {
    fn guest(&self) -> GuestShape {
        GuestShape {
            arch: self.arch,
            cpus: self.cpus,
            domains: self.domains.clone(),
            memory: self.memory,
            variant: crate::stress::kernel_variant(self.normal, self.sanitize),
            host: self.host,
            timeout: Duration::from_secs(self.timeout),
        }
    }
}

pub fn run(ws: &Path, args: &ScenarioArgs) -> Result<bool> {
    let guest = args.guest();
    let device = guest.device()?;
    if args.arch != Arch::X86_64 && args.host != host::HostChoice::Qemu {
        bail!(
            "--arch {}: perfbed's QEMU only (no --host {})",
            args.arch.kernel_arch(),
            args.host.name()
        );
    }
    let files = files_under(&args.files).context("listing the scenario files")?;
    let (files, left_out) = of_guest(files, &args.files, args.arch, !args.normal)?;
    for (file, why) in &left_out {
        eprintln!("note: leaving out {} ({why})", file.display());
    }
    let texts = load(&files, &layout(args.cpus, &device, args.arch), &device)?;
    if args.parse_only {
        println!(
            "perfbed scenario: {} file{} parsed, every want as the model predicts (nothing booted)",
            texts.len(),
            if texts.len() == 1 { "" } else { "s" }
        );
        return Ok(true);
    }
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
        if args.arch != Arch::X86_64 {
            command += &format!(" --arch {}", args.arch.kernel_arch());
        }
        for (flag, value) in [("--domains", &args.domains), ("--mutant", &args.mutant)] {
            if let Some(v) = value {
                command += &format!(" {flag} {v}");
            }
        }
        if args.normal {
            command += " --normal";
        }
        if args.sanitize {
            command += " --sanitize";
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

/// The files kept, and those left out with why.
pub type Split = (Vec<PathBuf>, Vec<(PathBuf, String)>);

/// `files` split into those a guest of `arch` can carry out and those
/// found in a folder of `given` that it cannot, each with why: an `# arch:`
/// header naming another architecture (a file given by name stays, for
/// the parser to refuse), or, on a kernel without `fail_injection` (the
/// normal one), a line that fails a hotplug operation at a kernel state
/// (a file given by name is refused here).
pub fn of_guest(
    files: Vec<PathBuf>,
    given: &[PathBuf],
    arch: Arch,
    fail_injection: bool,
) -> Result<Split> {
    let mut kept = Vec::new();
    let mut left_out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        let named = given.contains(&file);
        let why = match arch_of(&text) {
            Some(other) if other != arch && !named => Some(format!(
                "its `# arch:` header names another architecture than {}",
                arch.kernel_arch()
            )),
            _ if !fail_injection && fails_hotplug(&text) => Some(
                "it fails hotplug operations at kernel states, which only the debug kernel can: run it without --normal".to_string(),
            ),
            _ => None,
        };
        match why {
            Some(why) if named => bail!("{}: {why}", file.display()),
            Some(why) => left_out.push((file, why)),
            None => kept.push(file),
        }
    }
    Ok((kept, left_out))
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
    texts: &[(PathBuf, String)],
    timeout: Duration,
    run_dir: &Path,
    shrink: Option<&Shrinking>,
) -> Result<Vec<Check>> {
    let socket = vm.control_socket.clone();
    let mut g = Guest { vm, timeout };
    let (_, types, control) = super::load_driver(&mut g, &socket, device)?;
    let mut ctx = Ctx {
        g: &mut g,
        control,
        device: device.clone(),
        types,
    };
    let mut checks = Vec::new();
    for (file, text) in texts {
        checks.push(carry_out_file(&mut ctx, file, text, run_dir, shrink)?);
    }
    let state = ctx.control.state()?;
    checks.push(super::super::jobs::violations_check(&state));
    Ok(checks)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ScenarioArgs,
    }

    /// `--parse-only` judges the files on the host and stops: a good one
    /// passes, a bad one is refused with its file and line, and nothing
    /// is built (the workspace given is empty).
    #[test]
    fn parse_only_refuses_bad_input_with_its_line_without_a_guest() {
        let dir = std::env::temp_dir().join(format!("perfbed-parse-only-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.scn");
        std::fs::write(
            &good,
            "a = open movable mbm_total_bytes rmid=1\nburst movable mbm_total_bytes rmid=1 1MiB\nread a\nwant a 1MiB\n",
        )
        .unwrap();
        let bad = dir.join("bad.scn");
        std::fs::write(
            &bad,
            "a = open movable mbm_total_bytes rmid=1\nflap movable\n",
        )
        .unwrap();
        let args = |file: &Path| {
            Cli::parse_from(["scenario", "--parse-only", file.to_str().unwrap()]).args
        };
        let nowhere = dir.join("no-workspace");
        assert!(run(&nowhere, &args(&good)).unwrap());
        let e = format!("{:#}", run(&nowhere, &args(&bad)).unwrap_err());
        assert!(e.contains("bad.scn:2: unknown operation `flap`"), "{e}");
        assert!(!nowhere.exists(), "nothing is built");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
