//! `cargo xtask fuzz`: the libFuzzer targets of `fuzz/`, run with the pinned
//! cargo-fuzz on the stable toolchain.
//!
//! cargo-fuzz builds with `-Zsanitizer=address`, a nightly flag; stable rustc
//! ships the sanitizer runtimes and accepts the flag under
//! `RUSTC_BOOTSTRAP=1`, so no nightly toolchain is needed. Each target keeps
//! its growing corpus in `fuzz/corpus/<target>` (not in git) and starts from
//! the committed seeds in `fuzz/seeds/<target>`; a crash is saved under
//! `fuzz/artifacts/<target>/` and reported with the command that replays it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::build::cache;
use crate::build::deps;
use crate::cmd::{self, Step};
use crate::progress::human;

pub const CARGO_FUZZ_VERSION: &str = "0.13.2";

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
                "{}: CRASH after {} executions; input saved: {}\n    replay: cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run {} {}\n    log: {}",
                self.target,
                self.executions,
                input.display(),
                self.target,
                input.display(),
                self.log.display()
            ),
        }
    }
}

pub fn run(ws: &Path, args: &FuzzArgs) -> Result<bool> {
    let cargo_fuzz = ensure_cargo_fuzz()?;
    let mut passed = true;
    for &(target, what, _) in TARGETS
        .iter()
        .filter(|t| args.target.as_deref().is_none_or(|n| n == t.0))
    {
        eprintln!("==> fuzzing {target} for {} s: {what}", args.seconds);
        let outcome = run_target(ws, &cargo_fuzz, target, args.seconds)?;
        println!("{}", outcome.summary());
        if let Some((_, story)) = &outcome.crash {
            println!("{story}");
            passed = false;
        }
    }
    Ok(passed)
}

/// The pinned cargo-fuzz, installed from crates.io into the cache.
pub fn ensure_cargo_fuzz() -> Result<PathBuf> {
    let root = cache::root()?.join(format!("tools/cargo-fuzz-{CARGO_FUZZ_VERSION}"));
    let binary = root.join("bin/cargo-fuzz");
    if binary.is_file() {
        return Ok(binary);
    }
    // Installed beside the final folder and renamed into place, so that two
    // runs installing at once never see a half-installed tool.
    let staging = root.with_file_name(format!(
        "cargo-fuzz-{CARGO_FUZZ_VERSION}.partial-{}",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&staging);
    let log = cache::root()?.join("logs/cargo-fuzz.log");
    let step = Step::start(
        &format!("installing cargo-fuzz {CARGO_FUZZ_VERSION} from crates.io"),
        &log,
    )?;
    step.run(
        Command::new(deps::cargo())
            .args([
                "install",
                "cargo-fuzz",
                "--locked",
                "--version",
                CARGO_FUZZ_VERSION,
                "--root",
            ])
            .arg(&staging),
    )
    .context(
        "cargo-fuzz could not be installed, so nothing can be fuzzed (is crates.io reachable?)",
    )?;
    step.finish();
    if fs::rename(&staging, &root).is_err() && !binary.is_file() {
        bail!(
            "cannot move cargo-fuzz from {} to {}",
            staging.display(),
            root.display()
        );
    }
    let _ = fs::remove_dir_all(&staging);
    Ok(binary)
}

/// Builds and runs one target for `seconds`; an error means it could not
/// run at all, a crash is an [`Outcome`].
pub fn run_target(
    ws: &Path,
    cargo_fuzz: &Path,
    target: &'static str,
    seconds: u64,
) -> Result<Outcome> {
    let dir = ws.join("fuzz");
    let corpus = dir.join("corpus").join(target);
    fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    let log = ws.join("target/perfbed/fuzz").join(format!("{target}.log"));
    fs::create_dir_all(log.parent().expect("a folder"))?;
    let dict = TARGETS.iter().find(|t| t.0 == target).and_then(|t| t.2);
    let mut command = Command::new(cargo_fuzz);
    command
        .current_dir(&dir)
        .env("RUSTC_BOOTSTRAP", "1")
        .args(["fuzz", "run", target])
        .arg(&corpus)
        .arg(dir.join("seeds").join(target))
        .args([
            "--",
            "-print_final_stats=1",
            "-malloc_limit_mb=512",
            "-rss_limit_mb=1024",
        ])
        .arg(format!("-max_total_time={seconds}"));
    if let Some(dict) = dict {
        command.arg(format!("-dict={dict}"));
    }
    eprintln!("    $ {}", cmd::display(&command));
    let start = Instant::now();
    let status = command
        .stdin(Stdio::null())
        .stdout(Stdio::from(fs::File::create(&log)?))
        .stderr(Stdio::from(fs::File::create(&log)?.try_clone()?))
        .status()
        .with_context(|| format!("starting {}", cargo_fuzz.display()))?;
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
            "{target}: cargo fuzz failed ({status}) after {}\n--- {} ---\n{}",
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
