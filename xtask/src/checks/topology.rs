//! The guest's CPU topology against the device's domains: every CPU's L3
//! (`cache/index3/shared_cpu_list`) and die (`topology/die_id`) as the
//! rule in `perfbed_device::l3_topology` says perfbed-vmm's CPUID makes
//! them. With domains that are a power-of-two split, that is "each domain
//! is one L3 and one die"; with others the guest cannot match them (dense
//! APIC IDs) and the check says so, and still judges the guest by the rule.
//!
//! Run on both hosts: perfbed-vmm lays its CPUID out by the rule, and the
//! QEMU host passes `-smp` sockets and cores by it (`host/qemu.rs`).

use anyhow::Result;
use perfbed_device::cpus::format_cpu_list;
use perfbed_device::l3_topology;

use super::Check;
use crate::guest::Guest;

/// Reads every CPU's L3 and die and compares them with the rule.
pub fn check(guest: &mut Guest, cpus: u8, domains: &[Vec<u32>]) -> Result<Check> {
    let cpus = u32::from(cpus);
    let bits = l3_topology::l3_sharing_bits(cpus, domains);
    let mut problems = Vec::new();
    let mut l3s = Vec::new();
    for cpu in 0..cpus {
        let base = format!("/sys/devices/system/cpu/cpu{cpu}");
        let want = format_cpu_list(&l3_topology::l3_of(cpu, cpus, domains));
        match guest.read_file(&format!("{base}/cache/index3/shared_cpu_list")) {
            Ok(got) if got == want => {}
            Ok(got) => problems.push(format!(
                "CPU {cpu}'s L3 is shared by {got}, expected {want}"
            )),
            Err(e) => problems.push(format!("CPU {cpu} has no L3 in its cacheinfo ({e:#})")),
        }
        match guest.read_file(&format!("{base}/topology/die_id")) {
            Ok(got) if got == (cpu >> bits).to_string() => {}
            Ok(got) => problems.push(format!(
                "CPU {cpu} is on die {got}, expected {}",
                cpu >> bits
            )),
            Err(e) => problems.push(format!("CPU {cpu} has no die_id ({e:#})")),
        }
        if cpu & ((1 << bits) - 1) == 0 {
            l3s.push(want);
        }
    }
    let mismatched = l3_topology::mismatches(cpus, domains);
    let domains_text: Vec<String> = domains.iter().map(|d| format_cpu_list(d)).collect();
    let mut ok = format!(
        "L3s and dies {} = the domains {}",
        l3s.join(" : "),
        domains_text.join(" : ")
    );
    if !mismatched.is_empty() {
        ok = format!(
            "L3s and dies {} as the rule lays them out; the domains {} are not a power-of-two split, so they cannot match",
            l3s.join(" : "),
            domains_text.join(" : ")
        );
    }
    Ok(Check::from_problems(
        "topology matches the domains",
        problems,
        ok,
    ))
}
