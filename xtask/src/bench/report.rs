//! The benchmark table: each row a value beside the baseline it was measured
//! against, their ratio and the goal; printed, saved as JSON and compared.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::stats::Summary;

/// What a row must reach.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Goal {
    /// Informational: no target.
    None,
    /// value / baseline at most this.
    RatioAtMost(f64),
    /// value / baseline at least this.
    RatioAtLeast(f64),
    /// The value itself at most this (in the row's unit).
    AtMost(f64),
}

/// The figure a row is compared with.
#[derive(Debug, Clone, PartialEq)]
pub struct Baseline {
    pub what: String,
    pub value: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub name: String,
    pub value: f64,
    pub unit: &'static str,
    pub baseline: Option<Baseline>,
    pub goal: Goal,
    /// Half the range of the repeated measurements `value` is the median
    /// of (see [`Summary`]), in `unit`; `None` when measured once.
    pub spread: Option<f64>,
    /// How it was measured, or why it is missing.
    pub note: String,
}

impl Row {
    pub fn new(name: &str, value: f64, unit: &'static str) -> Row {
        Row {
            name: name.into(),
            value,
            unit,
            baseline: None,
            goal: Goal::None,
            spread: None,
            note: String::new(),
        }
    }

    /// A row whose value is the median of repeated measurements, with their spread.
    pub fn measured(name: &str, summary: Summary, unit: &'static str) -> Row {
        Row {
            spread: Some(summary.spread),
            ..Row::new(name, summary.median, unit)
        }
    }

    pub fn against(mut self, what: &str, value: f64) -> Row {
        self.baseline = Some(Baseline {
            what: what.into(),
            value,
        });
        self
    }

    pub fn goal(mut self, goal: Goal) -> Row {
        self.goal = goal;
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Row {
        self.note = note.into();
        self
    }

    pub fn ratio(&self) -> Option<f64> {
        self.baseline
            .as_ref()
            .filter(|b| b.value > 0.0)
            .map(|b| self.value / b.value)
    }

    /// Whether the goal is met; `None` when there is no goal or no ratio.
    pub fn met(&self) -> Option<bool> {
        match self.goal {
            Goal::None => None,
            Goal::RatioAtMost(max) => self.ratio().map(|r| r <= max),
            Goal::RatioAtLeast(min) => self.ratio().map(|r| r >= min),
            Goal::AtMost(max) => Some(self.value <= max),
        }
    }

    fn goal_text(&self) -> String {
        match self.goal {
            Goal::None => "-".into(),
            Goal::RatioAtMost(max) => format!("ratio <= {}", short(max)),
            Goal::RatioAtLeast(min) => format!("ratio >= {}", short(min)),
            Goal::AtMost(max) => format!("<= {} {}", short(max), self.unit),
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "baseline": self.baseline.as_ref().map(|b| json!({ "what": b.what, "value": b.value })),
            "ratio": self.ratio(),
            "spread": self.spread,
            "goal": self.goal_text(),
            "met": self.met(),
            "note": self.note,
        })
    }
}

/// A number in at most 4 significant digits, without trailing noise.
pub fn short(x: f64) -> String {
    let a = x.abs();
    let text = if a >= 1000.0 || a == 0.0 {
        format!("{x:.0}")
    } else if a >= 100.0 {
        format!("{x:.1}")
    } else if a >= 10.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    };
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

pub fn table(rows: &[Row]) -> String {
    let mut lines = vec![[
        "row".to_string(),
        "value".into(),
        "baseline".into(),
        "ratio".into(),
        "goal".into(),
        "met".into(),
    ]];
    for row in rows {
        lines.push([
            row.name.clone(),
            match row.spread {
                Some(spread) => format!("{} ± {} {}", short(row.value), short(spread), row.unit),
                None => format!("{} {}", short(row.value), row.unit),
            },
            row.baseline.as_ref().map_or("-".into(), |b| {
                format!("{} {} ({})", short(b.value), row.unit, b.what)
            }),
            row.ratio().map_or("-".into(), short),
            row.goal_text(),
            match row.met() {
                Some(true) => "yes".into(),
                Some(false) => "NO".into(),
                None => "-".into(),
            },
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in &lines {
        let cells: Vec<String> = line
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "  {}", cells.join("  ").trim_end());
    }
    let notes: Vec<&Row> = rows.iter().filter(|r| !r.note.is_empty()).collect();
    if !notes.is_empty() {
        let _ = writeln!(out, "\n  notes:");
        for row in notes {
            let _ = writeln!(out, "  - {}: {}", row.name, row.note);
        }
    }
    out
}

/// What a saved result measured: its file name says it, and only a full
/// run is one of [`saved_runs`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Full,
    Quick,
    /// `--reads`: the counter-read rows alone.
    Reads,
    /// `--series`: the series' rows against the unpatched kernel alone.
    Series,
}

/// Writes the rows to `target/perfbed/bench/<unix time><kind>.json` and,
/// for a whole table (not `--reads` or `--series`, each a part of it),
/// `latest.json`; returns the first path.
pub fn save(workspace: &Path, rows: &[Row], kind: Kind) -> Result<PathBuf> {
    let dir = workspace.join("target/perfbed/bench");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let quick = kind == Kind::Quick;
    let doc = json!({ "time": now, "quick": quick, "rows": rows.iter().map(Row::to_json).collect::<Vec<_>>() });
    let text = serde_json::to_string_pretty(&doc)? + "\n";
    let suffix = match kind {
        Kind::Full => "",
        Kind::Quick => "-quick",
        Kind::Reads => "-reads",
        Kind::Series => "-series",
    };
    let path = dir.join(format!("{now}{suffix}.json"));
    fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    if matches!(kind, Kind::Full | Kind::Quick) {
        fs::write(dir.join("latest.json"), &text)?;
    }
    Ok(path)
}

/// The full (not `--quick`) runs saved in `target/perfbed/bench`, oldest
/// first: the files named by their unix time.
pub fn saved_runs(workspace: &Path) -> Result<Vec<PathBuf>> {
    let dir = workspace.join("target/perfbed/bench");
    let mut runs: Vec<(u64, PathBuf)> = Vec::new();
    for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if let (Ok(time), Some("json")) = (
            stem.parse::<u64>(),
            path.extension().and_then(|e| e.to_str()),
        ) {
            runs.push((time, path));
        }
    }
    runs.sort();
    Ok(runs.into_iter().map(|(_, path)| path).collect())
}

/// One row of a saved result.
struct SavedRow {
    name: String,
    value: f64,
    unit: String,
    ratio: Option<f64>,
    spread: Option<f64>,
}

/// The rows of a saved result.
fn load(path: &Path) -> Result<Vec<SavedRow>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let doc: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let Some(rows) = doc["rows"].as_array() else {
        bail!(
            "{} has no \"rows\": not a `cargo xtask bench` result",
            path.display()
        );
    };
    rows.iter()
        .map(|r| {
            let name = r["name"]
                .as_str()
                .context("a row without a name")?
                .to_string();
            let value = r["value"]
                .as_f64()
                .with_context(|| format!("row {name:?} without a value"))?;
            let unit = r["unit"].as_str().unwrap_or("").to_string();
            Ok(SavedRow {
                name,
                value,
                unit,
                ratio: r["ratio"].as_f64(),
                spread: r["spread"].as_f64(),
            })
        })
        .collect()
}

/// Whether a row moved from `a` to `b` by more than the two runs' spreads
/// together: `None` when either run has no spread for it (measured once, or
/// saved before spreads were), which judges nothing.
fn moved(a: &SavedRow, b: &SavedRow) -> Option<bool> {
    Some((b.value - a.value).abs() > a.spread? + b.spread?)
}

/// Two saved results side by side: each row's value and ratio in A and B,
/// B/A, and whether it moved beyond its spread; then the rows that did.
pub fn compare(a: &Path, b: &Path) -> Result<String> {
    let (rows_a, rows_b) = (load(a)?, load(b)?);
    let mut out = format!("  A: {}\n  B: {}\n", a.display(), b.display());
    let ratio = |r: Option<f64>| r.map_or("-".to_string(), short);
    let value = |r: &SavedRow| match r.spread {
        Some(spread) => format!("{} ± {}", short(r.value), short(spread)),
        None => short(r.value),
    };
    let (mut moved_rows, mut unjudged) = (Vec::new(), 0);
    for ra in &rows_a {
        let Some(rb) = rows_b.iter().find(|rb| rb.name == ra.name) else {
            let _ = writeln!(
                out,
                "  {}: {} {} -> (not in B)",
                ra.name,
                value(ra),
                ra.unit
            );
            continue;
        };
        let change = if ra.value != 0.0 {
            short(rb.value / ra.value)
        } else {
            "-".into()
        };
        let verdict = match moved(ra, rb) {
            Some(true) => {
                moved_rows.push(ra.name.as_str());
                "MOVED beyond the spread"
            }
            Some(false) => "within the spread",
            None => {
                unjudged += 1;
                "no spread to judge by"
            }
        };
        let (va, vb, unit, qa, qb) = (
            value(ra),
            value(rb),
            &ra.unit,
            ratio(ra.ratio),
            ratio(rb.ratio),
        );
        let _ = writeln!(
            out,
            "  {}: {va} -> {vb} {unit} (B/A {change}; {verdict}); ratio {qa} -> {qb}",
            ra.name
        );
    }
    for rb in rows_b
        .iter()
        .filter(|rb| !rows_a.iter().any(|ra| ra.name == rb.name))
    {
        let _ = writeln!(
            out,
            "  {}: (not in A) -> {} {}",
            rb.name,
            value(rb),
            rb.unit
        );
    }
    if moved_rows.is_empty() {
        let _ = writeln!(
            out,
            "\n  no row moved beyond its spread ({unjudged} row(s) without a spread not judged)"
        );
    } else {
        let _ = writeln!(
            out,
            "\n  moved beyond their spread ({unjudged} row(s) without a spread not judged):"
        );
        for name in moved_rows {
            let _ = writeln!(out, "  - {name}");
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals_are_judged_on_the_ratio_or_the_value() {
        let row = Row::new("boot", 2.0, "s")
            .against("pc", 4.0)
            .goal(Goal::RatioAtMost(1.0 / 3.0));
        assert_eq!(row.ratio(), Some(0.5));
        assert_eq!(row.met(), Some(false));
        assert_eq!(
            Row::new("x", 1.0, "s")
                .against("y", 4.0)
                .goal(Goal::RatioAtMost(0.3))
                .met(),
            Some(true)
        );
        assert_eq!(
            Row::new("x", 96.0, "ops/s")
                .against("y", 100.0)
                .goal(Goal::RatioAtLeast(0.95))
                .met(),
            Some(true)
        );
        assert_eq!(
            Row::new("x", 94.0, "ops/s")
                .against("y", 100.0)
                .goal(Goal::RatioAtLeast(0.95))
                .met(),
            Some(false)
        );
        assert_eq!(
            Row::new("x", 120.0, "ns").goal(Goal::AtMost(100.0)).met(),
            Some(false)
        );
        assert_eq!(
            Row::new("x", 1.0, "ns").goal(Goal::RatioAtMost(2.0)).met(),
            None,
            "no baseline, no verdict"
        );
        assert_eq!(Row::new("x", 1.0, "ns").against("zero", 0.0).ratio(), None);
    }

    #[test]
    fn table_and_json_round_trip_through_compare() {
        let rows = vec![
            Row::new("boot", 1.5, "s")
                .against("pc", 3.0)
                .goal(Goal::RatioAtMost(0.5)),
            Row::new("model", 61.0, "ns")
                .goal(Goal::AtMost(100.0))
                .note("criterion"),
        ];
        let text = table(&rows);
        assert!(
            text.contains("1.5 s")
                && text.contains("3 s (pc)")
                && text.contains("<= 100 ns")
                && text.contains("- model: criterion")
        );
        let dir = std::env::temp_dir().join(format!("perfbed-bench-{}", std::process::id()));
        let a = save(&dir, &rows, Kind::Quick).unwrap();
        let mut slower = rows.clone();
        slower[0].value = 3.0;
        slower.pop();
        let b = dir.join("b.json");
        fs::write(
            &b,
            serde_json::to_string(
                &json!({ "rows": slower.iter().map(Row::to_json).collect::<Vec<_>>() }),
            )
            .unwrap(),
        )
        .unwrap();
        let diff = compare(&a, &b).unwrap();
        assert!(
            diff.contains("boot: 1.5 -> 3 s (B/A 2; no spread to judge by); ratio 0.5 -> 1"),
            "{diff}"
        );
        assert!(diff.contains("model: 61 ns -> (not in B)"), "{diff}");
        assert!(
            diff.contains("no row moved beyond its spread (1 row(s) without a spread not judged)"),
            "{diff}"
        );
        assert!(compare(&a, &dir.join("absent.json")).is_err());
        fs::write(dir.join("target/perfbed/bench/17.json"), "{}").unwrap();
        fs::write(dir.join("target/perfbed/bench/5.json"), "{}").unwrap();
        let latest = fs::read_to_string(dir.join("target/perfbed/bench/latest.json")).unwrap();
        for (kind, suffix) in [(Kind::Reads, "-reads.json"), (Kind::Series, "-series.json")] {
            let part = save(&dir, &rows[..1], kind).unwrap();
            assert!(
                part.to_str().unwrap().ends_with(suffix),
                "{}",
                part.display()
            );
            assert_eq!(
                fs::read_to_string(dir.join("target/perfbed/bench/latest.json")).unwrap(),
                latest,
                "{suffix}: a part of the table is not the latest table"
            );
        }
        let runs = saved_runs(&dir).unwrap();
        let names: Vec<_> = runs
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["5.json", "17.json"],
            "quick, reads-only and series-only runs, latest.json and others are not full runs"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn compare_names_the_rows_that_moved_beyond_their_spread() {
        let dir = std::env::temp_dir().join(format!("perfbed-bench-spread-{}", std::process::id()));
        let read = |v: f64, s: f64| {
            Row::measured(
                "read",
                Summary {
                    median: v,
                    spread: s,
                },
                "ns",
            )
        };
        let boot = |v: f64, s: f64| {
            Row::measured(
                "boot",
                Summary {
                    median: v,
                    spread: s,
                },
                "s",
            )
        };
        let a = save(&dir, &[read(100.0, 5.0), boot(2.0, 0.1)], Kind::Quick).unwrap();
        let b = dir.join("b.json");
        let rows_b = [read(111.0, 5.0), boot(2.15, 0.1)];
        fs::write(
            &b,
            serde_json::to_string(
                &json!({ "rows": rows_b.iter().map(Row::to_json).collect::<Vec<_>>() }),
            )
            .unwrap(),
        )
        .unwrap();
        let diff = compare(&a, &b).unwrap();
        assert!(
            diff.contains("read: 100 ± 5 -> 111 ± 5 ns (B/A 1.11; MOVED beyond the spread)"),
            "{diff}"
        );
        assert!(
            diff.contains("boot: 2 ± 0.1 -> 2.15 ± 0.1 s (B/A 1.075; within the spread)"),
            "{diff}"
        );
        assert!(
            diff.contains(
                "moved beyond their spread (0 row(s) without a spread not judged):\n  - read\n"
            ),
            "{diff}"
        );
        assert!(!diff.contains("  - boot"), "{diff}");
        assert!(table(&rows_b).contains("111 ± 5 ns"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn numbers_are_short() {
        assert_eq!(short(61.0), "61");
        assert_eq!(short(0.33333), "0.333");
        assert_eq!(short(1234.4), "1234");
        assert_eq!(short(12.345), "12.35");
    }
}
