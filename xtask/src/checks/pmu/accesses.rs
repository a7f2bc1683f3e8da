//! What perfbed.ko's own register accesses did over every PMU check: the
//! device counted no bad access (an unknown offset, a wrong size, a write
//! to a read-only register) and no placement violation (a counter read
//! from a vCPU other than its domain's owner).
//!
//! The migration check looks at its own window; this one covers the whole
//! PMU phase from the reset at its start, the multiplexing rotations, the
//! perf_event_open matrix, the real perf tool and the unload and reload
//! included. It runs last.

use anyhow::Result;
use perfbed_device::DeviceState;

use super::context::Ctx;
use crate::checks::Check;

pub fn check(ctx: &mut Ctx) -> Result<Check> {
    let state = ctx.control.state()?;
    Ok(verdict(&state))
}

fn verdict(state: &DeviceState) -> Check {
    let mut problems = Vec::new();
    for (d, domain) in state.domains.iter().enumerate() {
        if domain.violations != 0 {
            problems.push(format!(
                "domain {d}: {} placement violations, by vCPU {:?}",
                domain.violations, domain.violations_by_vcpu
            ));
        }
    }
    if state.bad_accesses.total != 0 {
        problems.push(format!(
            "{} bad accesses: {:?}",
            state.bad_accesses.total, state.bad_accesses
        ));
    }
    let reads: u64 = state
        .domains
        .iter()
        .flat_map(|d| d.counter_reads_by_vcpu.values())
        .sum();
    Check::from_problems(
        "driver's accesses",
        problems,
        format!("{reads} counter reads by perfbed.ko over every PMU check, each from its domain's owner; no bad access"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use perfbed_device::regs::{self, Event};
    use perfbed_device::{Device, DeviceConfig};

    /// A device whose domain 0 is owned by CPU 1 and counts in slot 0.
    fn owned() -> Device {
        let mut device = Device::new(DeviceConfig::default()).unwrap();
        device.write(0, 0, regs::domain_reg(0, regs::DOM_OWNER), 8, 1);
        device.write(
            0,
            0,
            regs::slot_ctl(0, 0),
            8,
            regs::slot_ctl_value(Event::MbmTotalBytes, 1),
        );
        device
    }

    #[test]
    fn owner_reads_pass() {
        let mut device = owned();
        device.read(1, 1, regs::slot_count(0, 0), 8);
        let check = verdict(&device.state(2));
        assert!(check.passed, "{}", check.detail);
        assert!(
            check.detail.starts_with("1 counter reads"),
            "{}",
            check.detail
        );
    }

    #[test]
    fn a_non_owner_read_or_a_bad_access_fails_and_is_named() {
        let mut device = owned();
        device.read(1, 0, regs::slot_count(0, 0), 8);
        let check = verdict(&device.state(2));
        assert!(!check.passed);
        assert!(
            check
                .detail
                .contains("domain 0: 1 placement violations, by vCPU {0: 1}"),
            "{}",
            check.detail
        );

        let mut device = owned();
        device.read(1, 1, regs::slot_count(0, 0) + 1, 8);
        let check = verdict(&device.state(2));
        assert!(!check.passed);
        assert!(check.detail.contains("1 bad accesses"), "{}", check.detail);
    }
}
