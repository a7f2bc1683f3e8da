//! The stress's allowed-set changes: the host changes a domain's allowed
//! set through the control socket (the device raises its configuration
//! interrupt, the driver asks the perf core to place the PMU again), and
//! the stress waits until the PMU's `cpumask` shows the placement the new
//! set calls for before it goes on, so that the next change or hotplug
//! operation meets a settled PMU.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::Result;
use perfbed_device::cpus::format_cpu_list;
use perfbed_device::ControlClient;

use crate::guest::Guest;

/// How long the guest may take to act on a change on a loaded TCG host.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);

/// One change and what the PMU did.
pub struct Change {
    /// `cpumask` before and after, as the kernel prints it (empty: parked).
    pub from: String,
    pub to: String,
    /// Why the PMU did not end where the set says, if it did not.
    pub problem: Option<String>,
}

/// Whether `mask` is where a PMU belongs under `cpus`: parked if `parks`
/// (no CPU of `cpus` online), else on one CPU of `cpus`.
fn settled(mask: &[u32], cpus: &[u32], parks: bool) -> bool {
    match mask {
        [] => parks,
        [cpu] => !parks && cpus.contains(cpu),
        _ => false,
    }
}

/// Changes domain `domain`'s allowed set to `cpus` and waits for `pmu` to
/// follow.
pub fn change(
    g: &mut Guest,
    control: &mut ControlClient,
    pmu: &str,
    domain: usize,
    cpus: &[u32],
    parks: bool,
) -> Result<Change> {
    let before = g.cpumask(pmu)?;
    control.set_allowed(domain as u32, cpus)?;
    let start = Instant::now();
    let mut mask = g.cpumask(pmu)?;
    while !settled(&mask, cpus, parks) && start.elapsed() < SETTLE_TIMEOUT {
        thread::sleep(Duration::from_millis(10));
        mask = g.cpumask(pmu)?;
    }
    let problem = (!settled(&mask, cpus, parks)).then(|| {
        let want = if parks {
            "parked".to_string()
        } else {
            format!("one of {}", format_cpu_list(cpus))
        };
        format!(
            "{pmu}: allowed set {} ({}): cpumask {:?} after {} s, want {want}",
            format_cpu_list(cpus),
            if cpus.is_empty() { "none" } else { "changed" },
            format_cpu_list(&mask),
            SETTLE_TIMEOUT.as_secs()
        )
    });
    Ok(Change {
        from: format_cpu_list(&before),
        to: format_cpu_list(&mask),
        problem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pmu_is_settled_only_where_the_set_says() {
        assert!(settled(&[3], &[2, 3], false));
        assert!(!settled(&[1], &[2, 3], false), "outside the set");
        assert!(!settled(&[], &[2, 3], false), "parked with a CPU online");
        assert!(settled(&[], &[], true));
        assert!(!settled(&[2], &[2], true), "placed where no CPU is online");
        assert!(!settled(&[2, 3], &[2, 3], false));
    }
}
