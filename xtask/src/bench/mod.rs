//! `cargo xtask bench`: perfbed measured against baselines measured in the
//! same run, printed as a table of value, baseline, ratio and goal and saved
//! as JSON under `target/perfbed/bench/` (`--compare A.json B.json` compares
//! two). Every figure on these shared machines is noisy; the ratios are what
//! to read.
//!
//! - [`device`]: criterion microbenchmarks of the device model;
//! - [`guest`]: boots, counter reads, hotplug, dispatch and memory on guests;
//! - [`runs`]: whole `cargo xtask run`s, warm and cold;
//! - [`series`]: the kernel series against the 6.12 it patches;
//! - [`report`]: the rows, the table, the JSON;
//! - [`stats`]: repeated measurements as a median and a spread.

mod device;
mod guest;
mod report;
mod runs;
mod series;
mod stats;
pub mod vmm_exit;

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::build::{deps, image};
use crate::host;
pub use report::{table, Row};

#[derive(Args)]
pub struct BenchArgs {
    /// Few repetitions: proves every row still works (`cargo xtask test`
    /// runs this), not figures to quote.
    #[arg(long)]
    quick: bool,
    /// Measure only the cold first run: a fresh clone of the committed tree
    /// with an empty cache (about 10 minutes; apt not included). It is kept
    /// in target/perfbed/bench/cold.json, and every later table shows it.
    #[arg(long, conflicts_with = "quick")]
    cold: bool,
    /// Measure only how hotplug throughput grows with the events open and
    /// the PMUs: offline+online ops/s with 0, 4, 16 and 64 events, on 1, 2,
    /// 4 and 16 PMUs (a guest booted for each; a few minutes under TCG).
    #[arg(long, conflicts_with_all = ["quick", "cold"])]
    hotplug_scaling: bool,
    /// With --hotplug-scaling: an argument appended to every guest's kernel
    /// command line (repeatable), for A/B runs such as
    /// `rcupdate.rcu_expedited=1`.
    #[arg(long, requires = "hotplug_scaling", value_name = "ARG")]
    kernel_arg: Vec<String>,
    /// Measure only the counter-read rows (one guest on perfbed's QEMU,
    /// the full bench's interleaved rounds), for comparing one driver
    /// change: saved as `<time>-reads.json`, which `--compare A B` takes
    /// and the full runs' comparisons leave out.
    #[arg(long, conflicts_with_all = ["quick", "cold", "hotplug_scaling"])]
    reads: bool,
    /// Measure only the kernel series against the 6.12 it patches, side by
    /// side: sizeof(struct perf_event), a cpu-clock read(), a context switch
    /// with per-task software events (builds the unpatched kernel once,
    /// about 4 min; the full bench has these rows too, --quick does not).
    #[arg(long, conflicts_with_all = ["quick", "cold", "hotplug_scaling", "reads"])]
    series: bool,
    /// With --reads: interleaved rounds instead of the full bench's 7. On a
    /// loaded host a round's loops lose time to other processes at random,
    /// and more rounds give the median more to stand on.
    #[arg(long, requires = "reads", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    read_rounds: Option<u32>,
    /// With --series: boots of each kernel, alternating, instead of the
    /// full bench's 5. The spread of a row is half the range of its boots'
    /// figures, and a loaded host widens it; more boots give the median
    /// more to stand on.
    #[arg(long, requires = "series", value_name = "N", value_parser = clap::value_parser!(u32).range(2..))]
    series_rounds: Option<u32>,
    /// Compare saved results instead of measuring, naming the rows that
    /// moved beyond their spread: A against B; with one file, it against the
    /// latest full run; with none, the previous full run against the latest.
    #[arg(long, num_args = 0..=2, value_names = ["A.json", "B.json"])]
    compare: Option<Vec<PathBuf>>,
}

/// The start of every row `measure` must produce (the cold run only when
/// measured).
const EXPECTED_ROWS: &[&str] = &[
    "device: model ns/access",
    "device: host lock + clock",
    "device: QEMU dispatch",
    "boot: VM start to agent ready, 4 vCPUs (",
    "boot: VM start to agent ready, 4 vCPUs against 1",
    "counter read: read() on the owner CPU",
    "counter read: read() from another CPU",
    "counter read: register load",
    "counter read: read() of a software event",
    "hotplug: offline+online ops/s, no events",
    "hotplug: offline+online ops/s, 4 events",
    "hotplug: offline+online ops/s, 16 events",
    "hotplug: offline+online ops/s, 64 events",
    "boot: VM start to agent ready, 4 vCPUs (perfbed-vmm",
    "counter read: read() on the owner CPU (perfbed-vmm",
    "memory: QEMU RSS beyond guest RAM",
    "memory: initramfs size",
    "warm run:",
];

/// The expected rows that `rows` lacks.
pub fn missing_rows(rows: &[Row]) -> Vec<&'static str> {
    EXPECTED_ROWS
        .iter()
        .copied()
        .filter(|want| !rows.iter().any(|r| r.name.starts_with(want)))
        .collect()
}

/// The initramfs before this work, for its size row.
const INITRAMFS_BEFORE_MB: f64 = 37.7;

pub fn run(ws: &Path, args: &BenchArgs) -> Result<bool> {
    if let Some(files) = &args.compare {
        let (a, b) = match files.as_slice() {
            [a, b] => (a.clone(), b.clone()),
            [a] => (
                a.clone(),
                report::saved_runs(ws)?
                    .pop()
                    .context("no full run saved in target/perfbed/bench")?,
            ),
            _ => {
                let mut runs = report::saved_runs(ws)?;
                match (runs.pop(), runs.pop()) {
                    (Some(latest), Some(previous)) => (previous, latest),
                    _ => bail!(
                        "--compare without files needs two full runs saved in target/perfbed/bench"
                    ),
                }
            }
        };
        print!("{}", report::compare(&a, &b)?);
        return Ok(true);
    }
    if args.cold {
        let row = runs::cold(ws, true)?.context("the cold run left no figures")?;
        print!("{}", report::table(&[row]));
        return Ok(true);
    }
    if args.hotplug_scaling {
        deps::ensure_packages()?;
        let images = image::ensure_for(ws, image::Variant::Normal, image::Purpose::Run)?;
        let rows = guest::hotplug_scaling(ws, &images, &host::choose_accel(), &args.kernel_arg)?;
        print!("{}", report::table(&rows));
        return Ok(true);
    }
    if args.reads {
        deps::ensure_packages()?;
        let images = image::ensure_for(ws, image::Variant::Normal, image::Purpose::Run)?;
        let mut effort = guest::Effort::new(false);
        if let Some(rounds) = args.read_rounds {
            effort.read_rounds = rounds;
        }
        let rows = guest::read_rows(ws, &images, &host::choose_accel(), &effort)?;
        print!("{}", report::table(&rows));
        let path = report::save(ws, &rows, report::Kind::Reads)?;
        println!("\n  saved: {}", path.display());
        return Ok(true);
    }
    if args.series {
        deps::ensure_packages()?;
        let images = image::ensure_for(ws, image::Variant::Normal, image::Purpose::Run)?;
        let mut effort = guest::Effort::new(false);
        if let Some(rounds) = args.series_rounds {
            effort.boots = rounds as usize;
        }
        let rows = series::rows(ws, &images, &host::choose_accel(), &effort)?;
        print!("{}", report::table(&rows));
        let path = report::save(ws, &rows, report::Kind::Series)?;
        println!("\n  saved: {}", path.display());
        return Ok(true);
    }
    let rows = measure(ws, args.quick)?;
    println!(
        "\ncargo xtask bench{}:",
        if args.quick {
            " --quick (figures not to quote)"
        } else {
            ""
        }
    );
    print!("{}", report::table(&rows));
    let kind = if args.quick {
        report::Kind::Quick
    } else {
        report::Kind::Full
    };
    let path = report::save(ws, &rows, kind)?;
    println!("\n  saved: {}", path.display());
    Ok(true)
}

/// Every row. Goals missed are reported, not failures: the benchmark fails
/// only when a measurement cannot be made.
pub fn measure(ws: &Path, quick: bool) -> Result<Vec<Row>> {
    deps::ensure_packages()?;
    deps::ensure_bench()?;
    let mut rows = device::rows(ws, quick)?;
    let images = image::ensure_for(ws, image::Variant::Normal, image::Purpose::Run)?;
    let accel = host::choose_accel();
    let effort = guest::Effort::new(quick);
    rows.extend(guest::rows(ws, &images, &accel, &effort)?);
    rows.extend(guest::vmm_rows(ws, &images, &accel, &effort)?);
    if !quick {
        rows.extend(series::rows(ws, &images, &accel, &effort)?);
    }
    let size = fs::metadata(&images.initramfs)
        .with_context(|| format!("reading {}", images.initramfs.display()))?
        .len();
    rows.push(
        Row::new("memory: initramfs size", size as f64 / 1e6, "MB")
            .against("before this work", INITRAMFS_BEFORE_MB)
            .note("agent, modules, perf and busybox with their libraries, uncompressed"),
    );
    rows.push(runs::warm(ws, quick)?);
    rows.extend(runs::cold(ws, false)?);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_rows_are_named() {
        assert_eq!(missing_rows(&[]).len(), EXPECTED_ROWS.len());
        let all: Vec<Row> = EXPECTED_ROWS
            .iter()
            .map(|name| Row::new(&format!("{name} and more"), 1.0, "s"))
            .collect();
        assert!(missing_rows(&all).is_empty());
        assert_eq!(missing_rows(&all[1..]), vec![EXPECTED_ROWS[0]]);
    }
}
