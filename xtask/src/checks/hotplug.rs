//! The agent's hotplug rounds: every CPU but 0 offline, then online again.

use std::fmt::Write as _;
use std::time::Duration;

use perfbed_agent::HotplugRound;

use super::Check;

/// `kept`: the CPU the rounds leave online, as the detail names it (CPU 0
/// on x86; the last CPU on arm64, where CPU 0 goes too).
pub fn check(requested: u32, results: &[HotplugRound], kept: &str) -> Check {
    let failed: Vec<&HotplugRound> = results.iter().filter(|r| !r.problems.is_empty()).collect();
    let passed_rounds = results.len() - failed.len();
    let n = results.len().max(1) as u64;
    let avg =
        |f: fn(&HotplugRound) -> u64| Duration::from_micros(results.iter().map(f).sum::<u64>() / n);
    let mut detail = format!(
        "{passed_rounds}/{requested} rounds passed (all CPUs but {kept} off, then on; offline {} / online {} per round)",
        human_ms(avg(|r| r.offline_us)),
        human_ms(avg(|r| r.online_us)),
    );
    if let Some(first) = failed.first() {
        let _ = write!(
            detail,
            "; round {}: {}",
            first.round,
            first.problems.join("; ")
        );
    }
    Check {
        name: "CPU hotplug",
        passed: results.len() == requested as usize && failed.is_empty(),
        detail,
    }
}

fn human_ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(n: u32, problems: &[&str]) -> HotplugRound {
        HotplugRound {
            round: n,
            offline_us: 1000,
            online_us: 500,
            problems: problems.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn hotplug_check_fails_on_a_bad_or_missing_round() {
        assert!(check(2, &[round(1, &[]), round(2, &[])], "0").passed);
        let bad = check(2, &[round(1, &[]), round(2, &["online is \"0-2\""])], "0");
        assert!(!bad.passed);
        assert!(bad.detail.contains("1/2 rounds passed") && bad.detail.contains("round 2"));
        assert!(!check(3, &[round(1, &[]), round(2, &[])], "0").passed);
    }
}
