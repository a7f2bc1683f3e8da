//! Whole `cargo xtask run`s as a user types them: warm (nothing changed)
//! and cold (a fresh clone with an empty cache), timed from outside.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;

use super::report::{Goal, Row};
use crate::build::deps;
use crate::progress::human;

/// The goal for the first run on a fresh 2-core machine.
const COLD_GOAL_S: f64 = 360.0;
/// The first run before this work, on a fresh 2-core machine (issue 11).
const COLD_BEFORE_S: f64 = 643.0;

/// A no-change `cargo xtask run`, against the boot and the checks of that
/// same run. `--quick` (the `bench_quick` VM test) runs one check: the
/// path a warm run takes (every image found built, the boot, the time
/// line) is the same, and the whole run's checks are `boot_and_hotplug`'s,
/// which would cost a second 3 min here.
pub fn warm(ws: &Path, quick: bool) -> Result<Row> {
    let mut run = Command::new(deps::cargo());
    run.current_dir(ws).args(["xtask", "run"]);
    if quick {
        run.args(QUICK_WARM_RUN);
    }
    // Once so that everything is built, then the measured one (`--quick`
    // trusts that the caller just built the images).
    if !quick {
        let _ = output_of(&mut run)?;
    }
    let start = Instant::now();
    let (ok, out) = output_of(&mut run)?;
    let wall = start.elapsed();
    if !ok {
        bail!(
            "the warm `cargo xtask run` failed:\n{}",
            last_lines(&out, 20)
        );
    }
    let times = RunTimes::parse(&out).context("the warm run printed no time line")?;
    let inside = times.boot + times.checks;
    Ok(Row::new(
        "warm run: no-change `cargo xtask run`",
        wall.as_secs_f64(),
        "s",
    )
    .against("boot + checks of the same run", inside.as_secs_f64())
    .goal(Goal::RatioAtMost(2.0))
    .note(format!(
        "wall time from outside{}; the run itself says images {}, boot {}, checks {}, total {}",
        if quick {
            format!(" of `cargo xtask run {}`", QUICK_WARM_RUN.join(" "))
        } else {
            String::new()
        },
        human(times.images),
        human(times.boot),
        human(times.checks),
        human(times.total)
    )))
}

/// `--quick`'s warm run: one hotplug round, one check.
const QUICK_WARM_RUN: [&str; 4] = ["--rounds", "1", "--check", "=CPU hotplug"];

/// Runs `cmd` with stdout and stderr together; (success, text).
fn output_of(cmd: &mut Command) -> Result<(bool, String)> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", crate::cmd::display(cmd)))?;
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    text += &String::from_utf8_lossy(&out.stdout);
    Ok((out.status.success(), text))
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The "time:" line `cargo xtask run` ends with.
#[derive(Debug, PartialEq)]
struct RunTimes {
    images: Duration,
    boot: Duration,
    checks: Duration,
    total: Duration,
}

impl RunTimes {
    fn parse(out: &str) -> Option<RunTimes> {
        let line = out
            .lines()
            .find_map(|l| l.trim().strip_prefix("time: images "))?;
        let after = |key: &str| -> Option<Duration> {
            parse_human(line.split(key).nth(1)?.split([',', '(']).next()?.trim())
        };
        Some(RunTimes {
            images: parse_human(line.split(',').next()?.trim())?,
            boot: after("boot to agent ready ")?,
            checks: after("checks ")?,
            total: after("total ")?,
        })
    }
}

/// The inverse of `progress::human`: "1.7 s" or "4m38s".
fn parse_human(text: &str) -> Option<Duration> {
    if let Some(s) = text.strip_suffix(" s") {
        return s.parse::<f64>().ok().map(Duration::from_secs_f64);
    }
    let (m, s) = text.strip_suffix('s')?.split_once('m')?;
    Some(Duration::from_secs(
        m.parse::<u64>().ok()? * 60 + s.parse::<u64>().ok()?,
    ))
}

/// Where the last cold run's figures are kept between bench runs.
fn cold_file(ws: &Path) -> PathBuf {
    ws.join("target/perfbed/bench/cold.json")
}

/// The cold-run row: measured now (`--cold`), or the last measurement;
/// `None` if there is none yet.
pub fn cold(ws: &Path, measure: bool) -> Result<Option<Row>> {
    if measure {
        measure_cold(ws)?;
    }
    let path = cold_file(ws);
    let Ok(text) = fs::read_to_string(&path) else {
        eprintln!("    no cold run measured yet: `cargo xtask bench --cold` (about 10 min)");
        return Ok(None);
    };
    let doc: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let total = doc["total_s"]
        .as_f64()
        .context("cold.json without total_s")?;
    // The CPU the run cost over the cores it had: no build schedule can
    // finish sooner than that.
    let floor = match (doc["cpu_s"].as_f64(), doc["cores"].as_u64()) {
        (Some(cpu), Some(cores)) if cores > 0 => {
            let floor = cpu / cores as f64;
            let secs = |s: f64| human(Duration::from_secs_f64(s));
            format!(
                "CPU user + sys {}: floor {} on {cores} cores, wall/floor {:.2}; ",
                secs(cpu),
                secs(floor),
                total / floor
            )
        }
        _ => "CPU time not recorded; ".to_string(),
    };
    let steps: Vec<String> = doc["steps"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| {
                    Some(format!(
                        "{} {}",
                        s["step"].as_str()?,
                        human(Duration::from_secs_f64(s["s"].as_f64()?))
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Some(
        Row::new("cold run: first `cargo xtask run`, empty cache", total, "s")
            .against("before this work (issue 11, not side by side)", COLD_BEFORE_S)
            .goal(Goal::AtMost(COLD_GOAL_S))
            .note(format!(
                "{floor}measured {} {} (load average after: {}; apt not included: packages installed): {}",
                doc["when"].as_str().unwrap_or("?"),
                measured_tree(ws, doc["commit"].as_str()),
                doc["loadavg_after"].as_str().unwrap_or("?"),
                steps.join(", ")
            )),
    ))
}

/// Which tree a saved cold run measured, against the work tree's HEAD now:
/// a figure of an older tree must say so.
fn measured_tree(ws: &Path, commit: Option<&str>) -> String {
    let Some(commit) = commit else {
        return "of an unrecorded commit".into();
    };
    let short = &commit[..commit.len().min(10)];
    let range = format!("{commit}..HEAD");
    let since = crate::cmd::output(
        Command::new("git")
            .arg("-C")
            .arg(ws)
            .args(["rev-list", "--count", &range]),
    );
    match since.ok().and_then(|n| n.trim().parse::<u64>().ok()) {
        Some(0) => format!("of HEAD ({short})"),
        Some(n) => format!("of {short}, {n} commit(s) before HEAD: not this tree's figure"),
        None => format!("of {short}, not an ancestor of HEAD: not this tree's figure"),
    }
}

/// A fresh clone of the committed work tree, run with an empty cache
/// (`XDG_CACHE_HOME`) and an empty target folder; the Debian packages are
/// already installed, so apt is not part of it.
fn measure_cold(ws: &Path) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("perfbed-cold-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let clone = dir.join("perfbed");
    crate::cmd::output(
        Command::new("git")
            .arg("clone")
            .arg("--quiet")
            .arg(ws)
            .arg(&clone),
    )?;
    eprintln!(
        "==> bench: cold run in {} with XDG_CACHE_HOME={}/cache (about 10 min)",
        clone.display(),
        dir.display()
    );
    let commit = crate::cmd::output(
        Command::new("git")
            .arg("-C")
            .arg(&clone)
            .args(["rev-parse", "HEAD"]),
    )?;
    let commit = commit.trim();
    let cpu_before = crate::cmd::children_cpu_time();
    let start = Instant::now();
    let (ok, out) = output_of(
        Command::new("nice")
            .args(["-n", "5"])
            .arg(deps::cargo())
            .args(["xtask", "run"])
            .current_dir(&clone)
            .env("XDG_CACHE_HOME", dir.join("cache"))
            .env_remove("CARGO_TARGET_DIR"),
    )?;
    let wall = start.elapsed();
    let cpu = crate::cmd::children_cpu_time().saturating_sub(cpu_before);
    fs::write(dir.join("run.log"), &out)?;
    if !ok {
        bail!(
            "the cold run failed (log {}):\n{}",
            dir.join("run.log").display(),
            last_lines(&out, 20)
        );
    }
    let mut steps: Vec<serde_json::Value> = out
        .lines()
        .filter_map(|l| {
            let (name, took) = l.trim().rsplit_once(" done in ")?;
            Some(json!({ "step": name, "s": parse_human(took)?.as_secs_f64() }))
        })
        .collect();
    if let Some(times) = RunTimes::parse(&out) {
        // What xtask cannot time itself: cargo building it in the fresh clone.
        steps.insert(0, json!({ "step": "cargo builds xtask", "s": wall.saturating_sub(times.total).as_secs_f64() }));
        steps.push(
            json!({ "step": "images (wall, steps overlap)", "s": times.images.as_secs_f64() }),
        );
        steps.push(json!({ "step": "boot", "s": times.boot.as_secs_f64() }));
        steps.push(json!({ "step": "checks", "s": times.checks.as_secs_f64() }));
    }
    let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let when = crate::cmd::output(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))?
        .trim()
        .to_string();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let doc = json!({
        "when": when,
        "commit": commit,
        "total_s": wall.as_secs_f64(),
        "cpu_s": cpu.as_secs_f64(),
        "cores": cores,
        "steps": steps,
        "loadavg_after": load.trim(),
    });
    let path = cold_file(ws);
    fs::create_dir_all(path.parent().context("cold.json has a folder")?)?;
    fs::write(&path, serde_json::to_string_pretty(&doc)? + "\n")?;
    fs::copy(dir.join("run.log"), path.with_extension("log"))?;
    let _ = fs::remove_dir_all(&dir);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_time_line_is_parsed() {
        let out = "perfbed run: PASSED\n  time: images 2.3 s, boot to agent ready 1.7 s (guest uptime 1.2 s), checks 8.7 s, total 4m38s\n";
        assert_eq!(
            RunTimes::parse(out),
            Some(RunTimes {
                images: Duration::from_secs_f64(2.3),
                boot: Duration::from_secs_f64(1.7),
                checks: Duration::from_secs_f64(8.7),
                total: Duration::from_secs(278),
            })
        );
        assert_eq!(RunTimes::parse("no time here"), None);
        assert_eq!(
            parse_human(&human(Duration::from_secs(643))),
            Some(Duration::from_secs(643))
        );
        assert_eq!(parse_human("soon"), None);
    }

    #[test]
    fn the_cold_row_shows_its_cpu_floor_and_which_tree_it_measured() {
        let ws = std::env::temp_dir().join(format!("perfbed-cold-row-{}", std::process::id()));
        let _ = fs::remove_dir_all(&ws);
        fs::create_dir_all(cold_file(&ws).parent().unwrap()).unwrap();
        assert!(cold(&ws, false).unwrap().is_none());

        let doc = json!({ "when": "then", "commit": "0123456789abcdef", "total_s": 450.0, "cpu_s": 600.0, "cores": 2, "steps": [] });
        fs::write(cold_file(&ws), doc.to_string()).unwrap();
        let row = cold(&ws, false).unwrap().unwrap();
        assert_eq!(row.value, 450.0);
        // Not a git work tree: the commit cannot be this tree's.
        for want in [
            "CPU user + sys 10m00s",
            "floor 5m00s on 2 cores",
            "wall/floor 1.50",
            "of 0123456789, not an ancestor",
        ] {
            assert!(row.note.contains(want), "{want:?} not in {:?}", row.note);
        }

        // A file from before the CPU time was kept says so.
        fs::write(
            cold_file(&ws),
            json!({ "when": "then", "total_s": 450.0 }).to_string(),
        )
        .unwrap();
        let row = cold(&ws, false).unwrap().unwrap();
        assert!(
            row.note.contains("CPU time not recorded")
                && row.note.contains("of an unrecorded commit"),
            "{}",
            row.note
        );
        fs::remove_dir_all(&ws).unwrap();
    }
}
