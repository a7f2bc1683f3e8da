//! The device on its own, driven from the guest without a driver (the
//! agent's register accesses through /dev/mem): its self-description, the
//! owner-only counter reads, placement enforcement and the ground truth.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use perfbed_agent::{AgentMessage, HostRequest, MmioAccess};
use perfbed_device::regs::{self, Event};
use perfbed_device::{ControlClient, DeviceConfig};

use super::Check;
use crate::host::vm::Vm;

/// The RMID the device checks count for.
const CHECK_RMID: u32 = 1;

/// Drives the device from the guest without a driver (the agent's register
/// accesses through /dev/mem): reads the self-description, then reads one
/// counter of every domain from every CPU, and compares what the guest saw
/// with what the device recorded through its control socket.
pub fn checks(
    vm: &mut Vm,
    guest_cpus: u8,
    device: &DeviceConfig,
    timeout: Duration,
) -> Result<Vec<Check>> {
    let mut checks = Vec::new();
    let cpus: Vec<u32> = (0..u32::from(guest_cpus)).collect();
    let domains = device.domains.len() as u64;

    // 1. The self-description, read from CPU 0.
    let mut expected: Vec<(String, u64, u64)> = vec![
        ("magic".into(), regs::REG_MAGIC, regs::MAGIC_VALUE),
        ("version".into(), regs::REG_VERSION, regs::VERSION_VALUE),
        ("domains".into(), regs::REG_NUM_DOMAINS, domains),
        ("rmids".into(), regs::REG_NUM_RMIDS, u64::from(device.rmids)),
        ("slots".into(), regs::REG_NUM_SLOTS, u64::from(device.slots)),
        (
            "width".into(),
            regs::REG_COUNTER_WIDTH,
            u64::from(device.counter_width),
        ),
        ("unit".into(), regs::REG_COUNTER_UNIT, device.unit_bytes),
        ("max rate".into(), regs::REG_MAX_RATE, device.max_rate),
    ];
    for (d, allowed) in device.domains.iter().enumerate() {
        let mask = allowed.iter().fold(0u64, |m, &c| m | 1 << c);
        expected.push((
            format!("domain {d} CPUs"),
            regs::domain_reg(d as u64, regs::DOM_ALLOWED_CPUS),
            mask,
        ));
    }
    let reads: Vec<MmioAccess> = expected
        .iter()
        .map(|(_, offset, _)| read_from(0, *offset))
        .collect();
    let values = mmio(vm, device, reads, timeout)?;
    let wrong: Vec<String> = expected
        .iter()
        .zip(&values)
        .filter(|((_, _, want), got)| want != *got)
        .map(|((name, _, want), got)| format!("{name}: {got:#x}, expected {want:#x}"))
        .collect();
    checks.push(Check::from_problems(
        "device self-description",
        wrong,
        format!(
            "{} registers as configured ({} domains, {} RMIDs, {} slots, {}-bit counters)",
            expected.len(),
            domains,
            device.rmids,
            device.slots,
            device.counter_width
        ),
    ));

    // 2. Each domain gets an owner (its last allowed CPU) and a counter slot;
    //    the host injects a known amount, then every CPU reads every counter.
    let mut control = ControlClient::connect(&vm.control_socket)
        .context("connecting to the device's control socket")?;
    control.reset_stats()?;
    let owners: Vec<u32> = device
        .domains
        .iter()
        .map(|allowed| *allowed.last().expect("validated: non-empty"))
        .collect();
    let mut setup = Vec::new();
    for (d, owner) in owners.iter().enumerate() {
        let d = d as u64;
        setup.push(MmioAccess {
            cpu: 0,
            offset: regs::domain_reg(d, regs::DOM_OWNER),
            write: Some(u64::from(*owner)),
        });
        let ctl = regs::slot_ctl_value(Event::MbmTotalBytes, u64::from(CHECK_RMID));
        setup.push(MmioAccess {
            cpu: 0,
            offset: regs::slot_ctl(d, 0),
            write: Some(ctl),
        });
    }
    mmio(vm, device, setup, timeout)?;
    // Several MiB and an odd number of units, per domain a different amount.
    let injected: Vec<u64> = (0..domains)
        .map(|d| (d + 1) * (3 << 20) + 10 * device.unit_bytes)
        .collect();
    for (d, bytes) in injected.iter().enumerate() {
        control.inject(d as u32, CHECK_RMID, Event::MbmTotalBytes, *bytes)?;
    }
    control.wait_landed(timeout.as_millis() as u64)?;
    let mut reads = Vec::new();
    for &cpu in &cpus {
        for d in 0..domains {
            reads.push(read_from(cpu, regs::slot_count(d, 0)));
        }
    }
    let values = mmio(vm, device, reads.clone(), timeout)?;
    let state = control.state()?;
    // Hand the device over as reset: no owners, no slots assigned, no stats.
    let mut release = Vec::new();
    for d in 0..domains {
        release.push(MmioAccess {
            cpu: 0,
            offset: regs::slot_ctl(d, 0),
            write: Some(0),
        });
        release.push(MmioAccess {
            cpu: 0,
            offset: regs::domain_reg(d, regs::DOM_OWNER),
            write: Some(regs::NO_OWNER),
        });
    }
    mmio(vm, device, release, timeout)?;
    control.reset_stats()?;

    let mask = regs::counter_mask(u64::from(device.counter_width));
    let mut problems = Vec::new();
    for (access, value) in reads.iter().zip(&values) {
        let d = ((access.offset - regs::DOMAIN_BASE) / regs::DOMAIN_STRIDE) as usize;
        let want = if access.cpu == owners[d] {
            (injected[d] / device.unit_bytes) & mask
        } else {
            regs::COUNTER_ERROR
        };
        if *value != want {
            problems.push(format!(
                "CPU {} read domain {d}: {value:#x}, expected {want:#x}",
                access.cpu
            ));
        }
    }
    checks.push(Check::from_problems(
        "counter reads",
        problems,
        format!(
            "{} reads: the owners read the exact count, the {} others got the error bit",
            reads.len(),
            reads.len() - owners.len()
        ),
    ));

    let mut problems = Vec::new();
    for (d, domain) in state.domains.iter().enumerate() {
        let every_cpu_once: BTreeMap<u32, u64> = cpus.iter().map(|&c| (c, 1)).collect();
        if domain.counter_reads_by_vcpu != every_cpu_once {
            problems.push(format!(
                "domain {d} saw reads from {:?}, expected one from each CPU",
                domain.counter_reads_by_vcpu
            ));
        }
        let expected_violations: BTreeMap<u32, u64> = cpus
            .iter()
            .filter(|&&c| c != owners[d])
            .map(|&c| (c, 1))
            .collect();
        if domain.violations_by_vcpu != expected_violations
            || domain.violations != expected_violations.len() as u64
        {
            problems.push(format!(
                "domain {d} counted {} violations {:?}, expected {:?}",
                domain.violations, domain.violations_by_vcpu, expected_violations
            ));
        }
    }
    checks.push(Check::from_problems(
        "placement enforcement",
        problems,
        "the device saw each read from the vCPU that made it and flagged every non-owner read"
            .into(),
    ));

    let mut problems = Vec::new();
    for (d, domain) in state.domains.iter().enumerate() {
        let truth = domain
            .truth
            .iter()
            .find(|t| t.rmid == CHECK_RMID && t.event == Event::MbmTotalBytes)
            .map_or(0, |t| t.bytes);
        let counted = domain.slots.first().map_or(0, |s| s.counted_bytes);
        if truth != injected[d] || counted != injected[d] {
            problems.push(format!(
                "domain {d}: injected {}, truth {truth}, counted {counted}",
                injected[d]
            ));
        }
    }
    if state.bad_accesses.total != 0 {
        problems.push(format!(
            "{} bad accesses: {:?}",
            state.bad_accesses.total, state.bad_accesses
        ));
    }
    checks.push(Check::from_problems(
        "ground truth",
        problems,
        format!(
            "truth and slot counts equal the injected {} bytes; no bad accesses",
            injected
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" and ")
        ),
    ));
    Ok(checks)
}

fn read_from(cpu: u32, offset: u64) -> MmioAccess {
    MmioAccess {
        cpu,
        offset,
        write: None,
    }
}

/// The agent's register accesses, one answer per access.
fn mmio(
    vm: &mut Vm,
    device: &DeviceConfig,
    accesses: Vec<MmioAccess>,
    timeout: Duration,
) -> Result<Vec<u64>> {
    let count = accesses.len();
    let request = HostRequest::Mmio {
        base: vm.device_base,
        size: device.size(),
        accesses,
    };
    match vm.request(&request, timeout)? {
        AgentMessage::Mmio { values } if values.len() == count => Ok(values),
        other => bail!("the agent answered {count} register accesses with {other:?}"),
    }
}
