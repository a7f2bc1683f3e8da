//! The benchmark table: each row a value beside the baseline it was measured
//! against, their ratio and the goal; printed, saved as JSON and compared.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

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
    /// How it was measured, or why it is missing.
    pub note: String,
}

impl Row {
    pub fn new(name: &str, value: f64, unit: &'static str) -> Row {
        Row { name: name.into(), value, unit, baseline: None, goal: Goal::None, note: String::new() }
    }

    pub fn against(mut self, what: &str, value: f64) -> Row {
        self.baseline = Some(Baseline { what: what.into(), value });
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
        self.baseline.as_ref().filter(|b| b.value > 0.0).map(|b| self.value / b.value)
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
    let mut lines = vec![["row".to_string(), "value".into(), "baseline".into(), "ratio".into(), "goal".into(), "met".into()]];
    for row in rows {
        lines.push([
            row.name.clone(),
            format!("{} {}", short(row.value), row.unit),
            row.baseline.as_ref().map_or("-".into(), |b| format!("{} {} ({})", short(b.value), row.unit, b.what)),
            row.ratio().map_or("-".into(), short),
            row.goal_text(),
            match row.met() {
                Some(true) => "yes".into(),
                Some(false) => "NO".into(),
                None => "-".into(),
            },
        ]);
    }
    let widths: Vec<usize> = (0..6).map(|c| lines.iter().map(|l| l[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for line in &lines {
        let cells: Vec<String> = line.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
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

/// Writes the rows to `target/perfbed/bench/<unix time>.json` and
/// `latest.json`; returns the first path.
pub fn save(workspace: &Path, rows: &[Row], quick: bool) -> Result<PathBuf> {
    let dir = workspace.join("target/perfbed/bench");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
    let doc = json!({ "time": now, "quick": quick, "rows": rows.iter().map(Row::to_json).collect::<Vec<_>>() });
    let text = serde_json::to_string_pretty(&doc)? + "\n";
    let path = dir.join(format!("{now}{}.json", if quick { "-quick" } else { "" }));
    fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    fs::write(dir.join("latest.json"), &text)?;
    Ok(path)
}

/// One row of a saved result: (name, value, unit, ratio).
type SavedRow = (String, f64, String, Option<f64>);

/// The rows of a saved result.
fn load(path: &Path) -> Result<Vec<SavedRow>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let doc: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let Some(rows) = doc["rows"].as_array() else {
        bail!("{} has no \"rows\": not a `cargo xtask bench` result", path.display());
    };
    rows.iter()
        .map(|r| {
            let name = r["name"].as_str().context("a row without a name")?.to_string();
            let value = r["value"].as_f64().with_context(|| format!("row {name:?} without a value"))?;
            Ok((name, value, r["unit"].as_str().unwrap_or("").to_string(), r["ratio"].as_f64()))
        })
        .collect()
}

/// Two saved results side by side: each row's value and ratio in A and B,
/// and B/A.
pub fn compare(a: &Path, b: &Path) -> Result<String> {
    let (rows_a, rows_b) = (load(a)?, load(b)?);
    let mut out = format!("  A: {}\n  B: {}\n", a.display(), b.display());
    let ratio = |r: Option<f64>| r.map_or("-".to_string(), short);
    for (name, va, unit, ra) in &rows_a {
        match rows_b.iter().find(|(n, ..)| n == name) {
            Some((_, vb, _, rb)) => {
                let change = if *va != 0.0 { short(vb / va) } else { "-".into() };
                let _ = writeln!(
                    out,
                    "  {name}: {} -> {} {unit} (B/A {change}); ratio {} -> {}",
                    short(*va),
                    short(*vb),
                    ratio(*ra),
                    ratio(*rb)
                );
            }
            None => {
                let _ = writeln!(out, "  {name}: {} {unit} -> (not in B)", short(*va));
            }
        }
    }
    for (name, vb, unit, _) in rows_b.iter().filter(|(n, ..)| !rows_a.iter().any(|(m, ..)| m == n)) {
        let _ = writeln!(out, "  {name}: (not in A) -> {} {unit}", short(*vb));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals_are_judged_on_the_ratio_or_the_value() {
        let row = Row::new("boot", 2.0, "s").against("pc", 4.0).goal(Goal::RatioAtMost(1.0 / 3.0));
        assert_eq!(row.ratio(), Some(0.5));
        assert_eq!(row.met(), Some(false));
        assert_eq!(Row::new("x", 1.0, "s").against("y", 4.0).goal(Goal::RatioAtMost(0.3)).met(), Some(true));
        assert_eq!(Row::new("x", 96.0, "ops/s").against("y", 100.0).goal(Goal::RatioAtLeast(0.95)).met(), Some(true));
        assert_eq!(Row::new("x", 94.0, "ops/s").against("y", 100.0).goal(Goal::RatioAtLeast(0.95)).met(), Some(false));
        assert_eq!(Row::new("x", 120.0, "ns").goal(Goal::AtMost(100.0)).met(), Some(false));
        assert_eq!(Row::new("x", 1.0, "ns").goal(Goal::RatioAtMost(2.0)).met(), None, "no baseline, no verdict");
        assert_eq!(Row::new("x", 1.0, "ns").against("zero", 0.0).ratio(), None);
    }

    #[test]
    fn table_and_json_round_trip_through_compare() {
        let rows = vec![
            Row::new("boot", 1.5, "s").against("pc", 3.0).goal(Goal::RatioAtMost(0.5)),
            Row::new("model", 61.0, "ns").goal(Goal::AtMost(100.0)).note("criterion"),
        ];
        let text = table(&rows);
        assert!(text.contains("1.5 s") && text.contains("3 s (pc)") && text.contains("<= 100 ns") && text.contains("- model: criterion"));
        let dir = std::env::temp_dir().join(format!("perfbed-bench-{}", std::process::id()));
        let a = save(&dir, &rows, true).unwrap();
        let mut slower = rows.clone();
        slower[0].value = 3.0;
        slower.pop();
        let b = dir.join("b.json");
        fs::write(&b, serde_json::to_string(&json!({ "rows": slower.iter().map(Row::to_json).collect::<Vec<_>>() })).unwrap()).unwrap();
        let diff = compare(&a, &b).unwrap();
        assert!(diff.contains("boot: 1.5 -> 3 s (B/A 2); ratio 0.5 -> 1"), "{diff}");
        assert!(diff.contains("model: 61 ns -> (not in B)"), "{diff}");
        assert!(compare(&a, &dir.join("absent.json")).is_err());
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
