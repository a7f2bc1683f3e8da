//! `cargo xtask fuzz`: the libFuzzer targets of `fuzz/`, built by cargo
//! with the instrumentation libFuzzer needs and run directly.
//!
//! The flags are the ones cargo-fuzz passes (its `project.rs`): LLVM's
//! SanitizerCoverage with inline 8-bit counters, the PC table, compare
//! tracing and stack depth, `--cfg fuzzing`, branch folding off, one codegen
//! unit, and AddressSanitizer. `-Zsanitizer` is a nightly flag; stable rustc
//! ships the sanitizer runtimes and accepts it under `RUSTC_BOOTSTRAP=1`, so
//! no nightly toolchain is needed, and without cargo-fuzz a fresh machine
//! does not spend minutes installing it from crates.io. `--target` keeps the
//! flags off build scripts and proc macros. `libfuzzer-sys` builds libFuzzer
//! itself. Each target keeps its growing corpus in `fuzz/corpus/<target>`
//! (not in git) and starts from the committed seeds in `fuzz/seeds/<target>`;
//! a crash is saved under `fuzz/artifacts/<target>/` and reported with the
//! command that replays it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::build::deps;
use crate::cmd::{self, Step};
use crate::progress::human;

/// The instrumentation of every crate a target links (not of the standard
/// library, which is prebuilt).
const RUSTFLAGS: &[&str] = &[
    "-Cpasses=sancov-module",
    "-Cllvm-args=-sanitizer-coverage-level=4",
    "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
    "-Cllvm-args=-sanitizer-coverage-pc-table",
    "-Cllvm-args=-sanitizer-coverage-trace-compares",
    "-Cllvm-args=-sanitizer-coverage-stack-depth",
    "-Cllvm-args=-simplifycfg-branch-fold-threshold=0",
    "--cfg=fuzzing",
    "-Zsanitizer=address",
    "-Ccodegen-units=1",
];

/// AddressSanitizer's options at run time: Rust's crates define the same
/// globals in several objects, which its ODR check would report.
const ASAN_OPTIONS: &str = "detect_odr_violation=0";

/// (name, what it feeds, libFuzzer dictionary).
pub const TARGETS: &[(&str, &str, Option<&str>)] = &[
    ("device_registers", "the device: any guest accesses, host requests and time steps, invariants checked", None),
    ("control_protocol", "the control socket's line reading and requests, from raw bytes", Some("dicts/control.dict")),
    ("agent_protocol", "the agent channel's messages (host side) and requests (agent side)", Some("dicts/agent.dict")),
    ("host_config", "CPU lists, --domains, the QEMU shim's properties, device configs", None),
    (
        "vmm_bus",
        "perfbed-vmm's MMIO bus: any access from any vCPU to the monitoring device and the virtio-mmio console, rings and chains the input writes",
        None,
    ),
    (
        "vmm_console",
        "perfbed-vmm's agent channel and serial port with an oracle: the host gets exactly the guest's bytes, in order, once; bounded VMM state under control floods",
        None,
    ),
];

#[derive(Args)]
pub struct FuzzArgs {
    /// One target (default: all, one after the other).
    #[arg(value_parser = clap::builder::PossibleValuesParser::new(TARGETS.iter().map(|t| t.0)))]
    target: Option<String>,
    /// How long to run each target.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    seconds: u64,
}

/// What one target's run gave.
pub struct Outcome {
    pub target: &'static str,
    pub executions: u64,
    pub seconds: f64,
    /// The saved crashing input and libFuzzer's story, if it found one.
    pub crash: Option<(PathBuf, String)>,
    pub log: PathBuf,
    /// The instrumented target, which replays an input given as argument.
    pub binary: PathBuf,
}

impl Outcome {
    pub fn summary(&self) -> String {
        match &self.crash {
            None => format!(
                "{}: {} executions in {:.0} s ({:.0}/s), no crash",
                self.target,
                self.executions,
                self.seconds,
                self.executions as f64 / self.seconds.max(1.0)
            ),
            Some((input, _)) => format!(
                "{}: CRASH after {} executions; input saved: {}\n    replay: ASAN_OPTIONS={ASAN_OPTIONS} {} {}\n    log: {}",
                self.target,
                self.executions,
                input.display(),
                self.binary.display(),
                input.display(),
                self.log.display()
            ),
        }
    }
}

pub fn run(ws: &Path, args: &FuzzArgs) -> Result<bool> {
    let targets = build_targets(ws)?;
    let mut passed = true;
    for &(target, what, _) in TARGETS
        .iter()
        .filter(|t| args.target.as_deref().is_none_or(|n| n == t.0))
    {
        eprintln!("==> fuzzing {target} for {} s: {what}", args.seconds);
        let outcome = run_target(ws, &targets, target, args.seconds)?;
        println!("{}", outcome.summary());
        if let Some((_, story)) = &outcome.crash {
            println!("{story}");
            passed = false;
        }
    }
    Ok(passed)
}

/// Builds every target, instrumented; returns the folder of the binaries.
/// A build that fails is an error that says so, with its log.
pub fn build_targets(ws: &Path) -> Result<PathBuf> {
    let dir = ws.join("fuzz");
    let triple = host_triple()?;
    let log = ws.join("target/perfbed/fuzz/build.log");
    fs::create_dir_all(log.parent().expect("a folder"))?;
    let step = Step::start(
        "building the fuzz targets with libFuzzer's instrumentation",
        &log,
    )?;
    step.run(
        Command::new(deps::cargo())
            .current_dir(&dir)
            .env("RUSTC_BOOTSTRAP", "1")
            .env("RUSTFLAGS", RUSTFLAGS.join(" "))
            .args(["build", "--release", "--bins", "--target", &triple])
            .args(["--config", "profile.release.debug=\"line-tables-only\""]),
    )
    .context("the fuzz targets did not build, so nothing can be fuzzed")?;
    step.finish();
    Ok(dir.join("target").join(triple).join("release"))
}

/// The host's target triple, as rustc names it (`host:` of `rustc -vV`).
fn host_triple() -> Result<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let about = cmd::output(Command::new(&rustc).arg("-vV"))?;
    about
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(|t| t.trim().to_string())
        .with_context(|| format!("`rustc -vV` names no host:\n{about}"))
}

/// Runs one target built by [`build_targets`] (in `targets`) for `seconds`;
/// an error means it could not run at all, a crash is an [`Outcome`].
pub fn run_target(
    ws: &Path,
    targets: &Path,
    target: &'static str,
    seconds: u64,
) -> Result<Outcome> {
    let dir = ws.join("fuzz");
    let corpus = dir.join("corpus").join(target);
    let artifacts = dir.join("artifacts").join(target);
    for folder in [&corpus, &artifacts] {
        fs::create_dir_all(folder).with_context(|| format!("creating {}", folder.display()))?;
    }
    let binary = targets.join(target);
    let log = ws.join("target/perfbed/fuzz").join(format!("{target}.log"));
    fs::create_dir_all(log.parent().expect("a folder"))?;
    let dict = TARGETS.iter().find(|t| t.0 == target).and_then(|t| t.2);
    let mut command = Command::new(&binary);
    command
        .current_dir(&dir)
        .env("ASAN_OPTIONS", ASAN_OPTIONS)
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .args([
            "-print_final_stats=1",
            "-malloc_limit_mb=512",
            "-rss_limit_mb=1024",
        ])
        .arg(format!("-max_total_time={seconds}"));
    if let Some(dict) = dict {
        command.arg(format!("-dict={dict}"));
    }
    command.arg(&corpus).arg(dir.join("seeds").join(target));
    eprintln!("    $ {}", cmd::display(&command));
    let start = Instant::now();
    let status = command
        .stdin(Stdio::null())
        .stdout(Stdio::from(fs::File::create(&log)?))
        .stderr(Stdio::from(fs::File::create(&log)?.try_clone()?))
        .status()
        .with_context(|| format!("starting {}", binary.display()))?;
    let took = start.elapsed();
    let text = fs::read_to_string(&log).unwrap_or_default();
    let executions = final_stat(&text, "stat::number_of_executed_units").unwrap_or(0);
    let crash = crash_input(&text).map(|input| (dir.join(input), story(&text)));
    if status.success() && crash.is_none() {
        if executions == 0 {
            bail!(
                "{target}: libFuzzer ran no input ({})\n{}",
                log.display(),
                cmd::tail(&log, 20)
            );
        }
    } else if crash.is_none() {
        bail!(
            "{target}: libFuzzer failed ({status}) after {}\n--- {} ---\n{}",
            human(took),
            log.display(),
            cmd::tail(&log, 30)
        );
    }
    Ok(Outcome {
        target,
        executions,
        seconds: took.as_secs_f64(),
        crash,
        log,
        binary,
    })
}

/// A `-print_final_stats` value, e.g. `stat::number_of_executed_units: 1234`.
fn final_stat(log: &str, name: &str) -> Option<u64> {
    log.lines().rev().find_map(|l| {
        l.strip_prefix(name)?
            .trim_start_matches(':')
            .trim()
            .parse()
            .ok()
    })
}

/// The input libFuzzer saved: "Test unit written to ./artifacts/x/crash-…".
fn crash_input(log: &str) -> Option<String> {
    log.lines().find_map(|l| {
        l.split_once("Test unit written to ")
            .map(|(_, path)| path.trim().to_string())
    })
}

/// The lines that say what went wrong: the panic message, or the sanitizer's
/// summary.
fn story(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains("panicked at")
                || l.contains("SUMMARY:")
                || l.contains("ERROR: libFuzzer")
                || l.starts_with("==") && l.contains("ERROR")
        })
        .take(6)
        .collect();
    let panic_message = log
        .lines()
        .skip_while(|l| !l.contains("panicked at"))
        .nth(1)
        .unwrap_or("");
    format!("    {}\n    {}", lines.join("\n    "), panic_message.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzer_output() {
        let log = "INFO: Seed: 1\n#2 INITED\nDone 4242 runs in 21 second(s)\nstat::number_of_executed_units: 4242\nstat::peak_rss_mb: 40\n";
        assert_eq!(
            final_stat(log, "stat::number_of_executed_units"),
            Some(4242)
        );
        assert_eq!(crash_input(log), None);
        let crash = "thread '<unnamed>' panicked at src/registers.rs:10:5:\nstep 3 (Step { ns: 1 }): truth fell\n\
                     ==1== ERROR: libFuzzer: deadly signal\nSUMMARY: libFuzzer: deadly signal\n\
                     MS: 1 ChangeBit-; base unit: 0\nartifact_prefix='/w/fuzz/artifacts/device_registers/'; \
                     Test unit written to /w/fuzz/artifacts/device_registers/crash-abc\n";
        assert_eq!(
            crash_input(crash).as_deref(),
            Some("/w/fuzz/artifacts/device_registers/crash-abc")
        );
        let story = story(crash);
        assert!(
            story.contains("panicked at src/registers.rs") && story.contains("truth fell"),
            "{story}"
        );
        assert_eq!(final_stat(crash, "stat::number_of_executed_units"), None);
    }

    #[test]
    fn every_target_has_a_file_and_seeds() {
        let ws = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let manifest = fs::read_to_string(ws.join("fuzz/Cargo.toml")).unwrap();
        for (target, _, dict) in TARGETS {
            assert!(
                ws.join(format!("fuzz/fuzz_targets/{target}.rs")).is_file(),
                "{target}"
            );
            assert!(
                manifest.contains(&format!("name = \"{target}\"")),
                "{target} is not a [[bin]]"
            );
            let seeds = fs::read_dir(ws.join(format!("fuzz/seeds/{target}")))
                .unwrap()
                .count();
            assert!(seeds > 0, "{target} has no seeds");
            if let Some(dict) = dict {
                assert!(ws.join("fuzz").join(dict).is_file(), "{dict}");
            }
        }
    }
}
