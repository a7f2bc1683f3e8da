// SPDX-License-Identifier: GPL-2.0

//! The device's allowed sets against the kernel's own idea of the caches.
//!
//! On hardware, a device-scope PMU's allowed CPUs are the CPUs that share what it monitors (an
//! L3 for memory-bandwidth and cache-occupancy monitors), and its driver takes them from the
//! device or the firmware. The kernel learns the same thing another way: its cacheinfo, from
//! CPUID on x86, from the firmware's cache description (device-tree cache nodes or ACPI's PPTT)
//! on arm64. Here the device says which CPUs each domain allows and the host says which CPUs
//! share each L3 (perfbed's x86 hosts in CPUID, its arm64 board in the device tree); the two
//! differ when the host's topology is not derived from the domains, or with domains that are not
//! an aligned power-of-two split of the CPUs (the hosts lay L3s out as such blocks: an x86
//! guest's APIC IDs are dense).
//!
//! Only the kernel's sharing maps are compared, which every architecture fills: not the caches'
//! ids (6.12 gives device-tree caches none) nor dies (arm64 has none).
//!
//! The driver places its PMUs by the device (which enforces its own rules) either way. It only
//! says, once per domain at registration, whether the kernel's cacheinfo agrees, so that a log
//! tells a testbed whose topology is fiction. Only online CPUs are compared: the kernel's
//! sharing maps hold online CPUs only.

use kernel::prelude::*;

use crate::hw;

/// What the kernel's cacheinfo says of a domain's allowed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum L3Agreement {
    /// The L3 of every online allowed CPU is shared by exactly the online allowed CPUs.
    Agrees,
    /// The L3 of an online allowed CPU is shared by another set of CPUs.
    Differs { cpu: u32, l3: u64 },
    /// No allowed CPU is online (or none is allowed): nothing to compare.
    NoneOnline,
    /// The kernel knows no L3 for an online allowed CPU (or shares it beyond CPU 63).
    NoL3 { cpu: u32 },
}

/// Compares `allowed` (a mask of CPUs 0-63) with the kernel's L3 sharing maps. Process context.
pub(crate) fn l3_agreement(allowed: u64) -> L3Agreement {
    let mut online = 0u64;
    // The first online allowed CPU's L3, and the first CPU whose L3 is another.
    let mut first = None;
    let mut other = None;
    for cpu in (0..64).filter(|cpu| allowed & (1u64 << cpu) != 0) {
        match hw::l3_shared_cpus(cpu) {
            Ok(l3) => {
                online |= 1u64 << cpu;
                match first {
                    None => first = Some((cpu, l3)),
                    Some((_, seen)) if seen != l3 && other.is_none() => other = Some((cpu, l3)),
                    Some(_) => {}
                }
            }
            Err(e) if e == ENXIO => {}
            Err(_) => return L3Agreement::NoL3 { cpu },
        }
    }
    match (first, other) {
        (None, _) => L3Agreement::NoneOnline,
        (Some(_), Some((cpu, l3))) => L3Agreement::Differs { cpu, l3 },
        (Some((cpu, l3)), None) if l3 != online => L3Agreement::Differs { cpu, l3 },
        (Some(_), None) => L3Agreement::Agrees,
    }
}

/// Logs what [`l3_agreement`] finds for the domain `name` (one line, at `info`).
pub(crate) fn report(name: &CStr, allowed: u64) {
    match l3_agreement(allowed) {
        L3Agreement::Agrees => pr_info!(
            "{}: allowed CPUs {:#x} share one L3 by the kernel's cacheinfo\n",
            name,
            allowed
        ),
        L3Agreement::Differs { cpu, l3 } => pr_info!(
            "{}: allowed CPUs {:#x} differ from the kernel's cacheinfo: CPU {}'s L3 is shared by {:#x}; placing by the device\n",
            name,
            allowed,
            cpu,
            l3
        ),
        L3Agreement::NoneOnline => pr_info!(
            "{}: allowed CPUs {:#x}: none online, not compared with the kernel's cacheinfo\n",
            name,
            allowed
        ),
        L3Agreement::NoL3 { cpu } => pr_info!(
            "{}: allowed CPUs {:#x}: the kernel's cacheinfo has no L3 for CPU {}\n",
            name,
            allowed,
            cpu
        ),
    }
}
