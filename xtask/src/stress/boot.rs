//! `cargo xtask boot-stress`: boots the guest again and again, alternating an
//! idle host with one where a busy process competes for the CPUs, and reports
//! every hang or failure and the boot times side by side. A boot that is
//! reliable only on an idle machine is not reliable.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use crate::build::image;
use crate::host;
use crate::host::vm::Vm;
use crate::progress::human;
use crate::run::{self, scenario_for, RunArgs};

#[derive(Args)]
pub struct BootStressArgs {
    /// Boots per condition (idle, loaded).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    boots: u32,
    /// Seconds a boot may take before it counts as hung.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Which VMM boots the guest: perfbed's QEMU (the default), perfbed-vmm
    /// (`vmm`: on native KVM, else in the box), or `auto`.
    #[arg(long, value_enum, default_value_t = host::HostChoice::Qemu)]
    host: host::HostChoice,
    /// Boot the debug kernel instead of the normal one.
    #[arg(long, conflicts_with = "sanitize")]
    debug: bool,
    /// Boot the sanitizer kernel (the debug one with KCSAN) instead.
    #[arg(long)]
    sanitize: bool,
}

/// A process that keeps one CPU busy until dropped.
struct Load(Child);

impl Load {
    fn start() -> Result<Load> {
        let child = Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .stdin(Stdio::null())
            .spawn()
            .context("starting the load process")?;
        Ok(Load(child))
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn run(ws: &Path, args: &BootStressArgs) -> Result<bool> {
    let variant = run::variant(args.debug, args.sanitize, false);
    let images = image::ensure_for(ws, variant, image::Purpose::Run)?;
    let accel = host::choose_accel();
    let mut run_args = RunArgs::for_tests();
    run_args.timeout = args.timeout;
    run_args.host = args.host;
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut failures: Vec<String> = Vec::new();
    for i in 0..args.boots * 2 {
        let loaded = i % 2 == 1;
        let _load = if loaded { Some(Load::start()?) } else { None };
        let label = if loaded { "loaded" } else { "idle" };
        let scenario = scenario_for(ws, &images, &run_args, &format!("boot-stress-{i}-{label}"))?;
        let result = Vm::boot(&scenario.vm, &accel).and_then(|booted| {
            let time = booted.boot_time;
            booted.vm.power_off(Duration::from_secs(30)).map(|()| time)
        });
        match result {
            Ok(time) => {
                eprintln!("    boot {:>3} ({label:6}): {}", i + 1, human(time));
                times[usize::from(loaded)].push(time);
            }
            Err(e) => {
                eprintln!("    boot {:>3} ({label:6}): FAILED", i + 1);
                failures.push(format!("boot {} ({label}): {e:#}", i + 1));
            }
        }
    }
    println!(
        "\nboot-stress: {} boots per condition, VM start to agent ready",
        args.boots
    );
    let [idle, loaded] = &mut times;
    let (idle_stats, loaded_stats) = (Stats::of(idle), Stats::of(loaded));
    for (label, stats) in [("idle", &idle_stats), ("loaded", &loaded_stats)] {
        match stats {
            Some(s) => println!(
                "  {label:6} n={:<3} median {}  min {}  max {}  spread (max-min) {}",
                s.n,
                human(s.median),
                human(s.min),
                human(s.max),
                human(s.max - s.min)
            ),
            None => println!("  {label:6} no successful boot"),
        }
    }
    if let (Some(i), Some(l)) = (&idle_stats, &loaded_stats) {
        println!(
            "  loaded/idle median ratio: {:.2}",
            l.median.as_secs_f64() / i.median.as_secs_f64()
        );
    }
    println!("  failures or hangs: {}", failures.len());
    for failure in &failures {
        println!("\n{failure}");
    }
    Ok(failures.is_empty())
}

struct Stats {
    n: usize,
    median: Duration,
    min: Duration,
    max: Duration,
}

impl Stats {
    fn of(times: &mut [Duration]) -> Option<Stats> {
        times.sort_unstable();
        Some(Stats {
            n: times.len(),
            median: times.get(times.len() / 2).copied()?,
            min: *times.first()?,
            max: *times.last()?,
        })
    }
}
