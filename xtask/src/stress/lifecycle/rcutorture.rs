//! rcutorture beside the lifecycle stress (`stress --lifecycle N
//! --rcutorture`): the kernel's own RCU torture test on the debug kernel,
//! with its CPU on/off (`onoff`) taking CPUs offline and back at random
//! behind the host's back while the stress drives perf operations and
//! traffic. Its own torture is kept light for TCG (one reader, no fake
//! writers, no stutter, no forward-progress or boost tests, no
//! read-exit bursts, no shuffling). The run ends with `rmmod rcutorture`,
//! whose last statistics must say "End of test: SUCCESS".

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use perfbed_agent::HostRequest;

use crate::checks::Check;
use crate::guest::Guest;

/// The least time between two of onoff's CPU changes: it sleeps this long
/// after each (what lets the host tell when a park and a placement could
/// both have come and gone between two of its readings).
pub const ONOFF_INTERVAL: Duration = Duration::from_millis(200);
/// The guest kernel's CONFIG_HZ: rcutorture takes the interval in jiffies.
const GUEST_HZ: u128 = 250;
/// Seconds after the load before onoff's first change (waited out before
/// the stress begins, which runs hundreds of operations a second).
const ONOFF_HOLDOFF_S: u32 = 1;

/// rcutorture's module parameters.
fn params() -> String {
    let jiffies = ONOFF_INTERVAL.as_millis() * GUEST_HZ / 1000;
    format!(
        "torture_type=rcu onoff_interval={jiffies} onoff_holdoff={ONOFF_HOLDOFF_S} \
         nreaders=1 nfakewriters=0 stat_interval=0 shuffle_interval=0 stutter=0 \
         fwd_progress=0 test_boost=0 read_exit_burst=0 verbose=0"
    )
}

/// Loads torture.ko and rcutorture.ko (the debug kernel's modules).
pub fn start(g: &mut Guest) -> Result<()> {
    g.expect_done(HostRequest::LoadModuleWith {
        name: "torture".into(),
        params: String::new(),
    })?;
    g.expect_done(HostRequest::LoadModuleWith {
        name: "rcutorture".into(),
        params: params(),
    })?;
    std::thread::sleep(Duration::from_secs(ONOFF_HOLDOFF_S.into()));
    Ok(())
}

/// Unloads rcutorture (its cleanup prints its statistics and the end of
/// test) and torture, and judges what it printed to the serial log.
pub fn stop(g: &mut Guest, serial_log: &Path) -> Result<Check> {
    g.expect_done(HostRequest::UnloadModule {
        name: "rcutorture".into(),
    })?;
    g.expect_done(HostRequest::UnloadModule {
        name: "torture".into(),
    })?;
    // The console may lag the unload.
    let start = Instant::now();
    let mut log = String::new();
    while start.elapsed() < Duration::from_secs(10) {
        log = std::fs::read_to_string(serial_log).unwrap_or_default();
        if log.contains("End of test:") {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(judge(&log))
}

/// The check of rcutorture's end: "End of test: SUCCESS", with its
/// CPU on/off figures.
pub fn judge(log: &str) -> Check {
    let end = log
        .lines()
        .rev()
        .find_map(|l| l.split_once("End of test: ").map(|(_, rest)| rest));
    let onoff = onoff_figures(log);
    let figures = onoff.map_or("no onoff figures".to_string(), |o| {
        format!(
            "onlines {}/{}, offlines {}/{} (succeeded/tried)",
            o[0], o[1], o[2], o[3]
        )
    });
    let mut problems = Vec::new();
    match end {
        None => problems.push("rcutorture printed no \"End of test\" line".to_string()),
        Some(rest) if !rest.starts_with("SUCCESS") => {
            problems.push(format!("rcutorture: End of test: {rest}"))
        }
        Some(_) => {}
    }
    if onoff.is_none_or(|o| o[1] + o[3] == 0) {
        problems.push(format!(
            "rcutorture's onoff took no CPU on or off: {figures}"
        ));
    }
    Check::from_problems(
        "rcutorture onoff beside perf",
        problems,
        format!("End of test: SUCCESS; {figures}"),
    )
}

/// The last `onoff: a/b:c/d` of rcutorture's statistics: online successes
/// and attempts, offline successes and attempts.
pub fn onoff_figures(log: &str) -> Option<[u64; 4]> {
    let at = log.rfind("onoff: ")?;
    let text = log[at + "onoff: ".len()..].split_whitespace().next()?;
    let mut out = [0u64; 4];
    let numbers = text.split([':', '/']).map(str::parse::<u64>);
    let mut n = 0;
    for (slot, value) in out.iter_mut().zip(numbers) {
        *slot = value.ok()?;
        n += 1;
    }
    (n == 4).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const END: &str = "[  90.1] rcu-torture: rtc: 0000 ver: 512 tfle: 0 rta: 513 rtaf: 0 rtf: 503 rtmbe: 0 rtmbkf: 0/0 rtbe: 0 rtbke: 0 rtbf: 0 rtb: 0 nt: 4128 onoff: 41/41:43/43 27,418:53,1203 5101:19870 (HZ=250) barrier: 0/0:0 read-exits: 0 nocb-toggles: 0:0\n\
        [  90.2] rcu-torture:--- End of test: SUCCESS: nreaders=1 nfakewriters=0 stat_interval=0\n";

    #[test]
    fn the_end_of_test_and_the_onoff_figures_are_read_and_judged() {
        assert_eq!(onoff_figures(END), Some([41, 41, 43, 43]));
        let ok = judge(END);
        assert!(ok.passed, "{}", ok.detail);
        assert!(
            ok.detail.contains("onlines 41/41, offlines 43/43"),
            "{}",
            ok.detail
        );
        let failed = judge(&END.replace("SUCCESS", "FAILURE"));
        assert!(!failed.passed);
        assert!(
            failed.detail.contains("End of test: FAILURE"),
            "{}",
            failed.detail
        );
        let hotplug = judge(&END.replace("SUCCESS", "RCU_HOTPLUG"));
        assert!(!hotplug.passed);
        let none = judge(&END.replace("41/41:43/43", "0/0:0/0"));
        assert!(!none.passed, "an onoff that did nothing tested nothing");
        assert!(!judge("[ 1.0] booted\n").passed);
        assert_eq!(onoff_figures("onoff: 1/2:x/4 "), None);
    }
}
