//! The checks: small functions that drive a booted guest (through
//! [`crate::guest`]) and the device (its control socket), and compare every
//! count with the device's truth. Each returns [`Check`]s; `run`, `stress`
//! and the VM tests compose them into a [`Report`] or a report of their own.
//!
//! One file per family. A check never boots a VM, never decides a host, and
//! never prints: it says PASS or FAIL and why, in its `detail`.

pub mod device;
pub mod hotplug;
pub mod log;
pub mod module_lifecycle;
pub mod perf_tool;
pub mod pmu;
pub mod scope;
pub mod slot_credit;
pub mod slow_reader;
pub mod topology;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use crate::host::console::{first_report, kernel_log_problems};
use crate::trace::SavedTrace;

/// One verdict: what was checked, whether it held, and the evidence.
pub struct Check {
    pub name: &'static str,
    pub passed: bool,
    pub detail: String,
}

/// The verdicts of one boot, with its timings and (when drawn) its trace.
pub struct Report {
    pub checks: Vec<Check>,
    pub boot_time: Duration,
    pub guest_uptime_at_ready: Duration,
    pub checks_time: Duration,
    pub serial_log: PathBuf,
    /// The saved device trace and its plot, when a check failed or the plot
    /// was asked for.
    pub trace: Option<SavedTrace>,
}

/// Fails on any WARN, BUG, oops, lockdep or RCU report in the kernel log.
pub fn clean_log_check(serial_log: &std::path::Path) -> Check {
    let log = std::fs::read_to_string(serial_log).unwrap_or_default();
    let mut check = Check::from_problems(
        "clean kernel log",
        kernel_log_problems(&log),
        "no WARN, BUG, oops, lockdep or RCU report".into(),
    );
    if let Some(report) = first_report(&log) {
        check.detail = format!(
            "{}\n    the first report:\n      {}",
            check.detail,
            report.replace('\n', "\n      ")
        );
    }
    check
}

/// Which checks a run carries out: every one, or those whose printed
/// names contain one of the patterns (`cargo xtask run --check`); a
/// pattern `=NAME` selects the check printed as NAME only (`CPU hotplug`
/// alone, not `topology after CPU hotplug`).
#[derive(Debug, Clone, Default)]
pub struct Select {
    patterns: Vec<String>,
}

impl Select {
    pub fn matching(patterns: &[String]) -> Select {
        Select {
            patterns: patterns.to_vec(),
        }
    }

    /// Whether the check printed as `name` runs.
    pub fn wants(&self, name: &str) -> bool {
        self.patterns.is_empty() || self.patterns.iter().any(|p| pattern_matches(p, name))
    }
}

/// Whether the `--check` pattern `pattern` selects the check printed as
/// `name`: `=NAME` exactly, anything else as a part of it.
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix('=') {
        Some(exact) => name == exact,
        None => name.contains(pattern),
    }
}

impl Check {
    /// Passes when nothing went wrong: the detail is then `ok`, otherwise
    /// every problem.
    pub fn from_problems(name: &'static str, problems: Vec<String>, ok: String) -> Check {
        let passed = problems.is_empty();
        Check {
            name,
            passed,
            detail: if passed { ok } else { problems.join("; ") },
        }
    }
}

impl Report {
    /// A report of `checks` and the kernel log's cleanliness, without timings.
    pub fn from_checks(mut checks: Vec<Check>, serial_log: &std::path::Path) -> Report {
        checks.push(clean_log_check(serial_log));
        Report {
            checks,
            boot_time: Duration::ZERO,
            guest_uptime_at_ready: Duration::ZERO,
            checks_time: Duration::ZERO,
            serial_log: serial_log.to_path_buf(),
            trace: None,
        }
    }

    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }

    pub fn table(&self) -> String {
        self.table_of(|_| true)
    }

    /// The failed checks alone, as [`Report::table`] prints them: what a
    /// truncated log must still show.
    pub fn failures(&self) -> String {
        self.table_of(|c| !c.passed)
    }

    fn table_of(&self, wanted: impl Fn(&Check) -> bool) -> String {
        let mut out = String::new();
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        for check in self.checks.iter().filter(|c| wanted(c)) {
            let mark = if check.passed { "PASS" } else { "FAIL" };
            let _ = writeln!(out, "  {mark}  {:width$}  {}", check.name, check.detail);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{Check, Report, Select};
    use std::time::Duration;

    #[test]
    fn a_reports_failures_are_its_failed_checks_alone() {
        let report = Report {
            checks: vec![
                Check::from_problems("counter reads", vec![], "exact".into()),
                Check::from_problems("ground truth", vec!["short by 4 KiB".into()], String::new()),
            ],
            boot_time: Duration::ZERO,
            guest_uptime_at_ready: Duration::ZERO,
            checks_time: Duration::ZERO,
            serial_log: "serial.log".into(),
            trace: None,
        };
        assert_eq!(report.table().lines().count(), 2);
        let failures = report.failures();
        assert_eq!(failures.lines().count(), 1, "{failures}");
        assert!(
            failures.contains("FAIL  ground truth   short by 4 KiB"),
            "{failures}"
        );
    }

    #[test]
    fn a_selection_runs_the_checks_whose_names_contain_a_pattern() {
        let all = Select::default();
        assert!(all.wants("anything"));
        let some = Select::matching(&["park".into(), "exact counts".into()]);
        assert!(some.wants("redteam: disabled across park"));
        assert!(some.wants("exact counts"));
        assert!(!some.wants("migration"));
        let exact = Select::matching(&["=CPU hotplug".into()]);
        assert!(exact.wants("CPU hotplug"));
        assert!(!exact.wants("topology after CPU hotplug"));
    }
}
