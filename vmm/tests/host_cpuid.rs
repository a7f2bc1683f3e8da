//! perfbed-vmm's guest CPUID built from real hosts' CPUID, without the
//! hardware: each fixture in `tests/host_cpuid/` is the recorded CPUID of
//! one logical CPU of a real Intel or AMD machine (its source named in its
//! header). For each, and for several domain layouts, the test builds every
//! vCPU's CPUID as the VMM does (`vcpu::cpuid::apply_topology` over what
//! KVM would report on that host) and checks it two ways:
//! - the domains' topology rule, read straight from the leaves: each vCPU's
//!   L3 (leaf 4 on Intel, 0x8000_001D on AMD) and die (0x1F's die level;
//!   AMD's node in 0x8000_001E) hold exactly the CPUs of
//!   `perfbed_device::l3_topology::l3_of`;
//! - what a Linux 6.12 guest derives from those leaves
//!   ([`linux_cacheinfo`]): each CPU's L3 `shared_cpu_map` is the same set.

#[path = "host_cpuid/linux_cacheinfo.rs"]
mod linux_cacheinfo;

use kvm_bindings::{kvm_cpuid_entry2, KVM_CPUID_FLAG_SIGNIFCANT_INDEX};
use perfbed_device::l3_topology::{l3_of, l3_sharing_bits};
use perfbed_vmm::vcpu::cpuid::{apply_topology, Placement};

use linux_cacheinfo::{derive, l3_shared_cpu_map, Cpuid};

/// Every fixture, by file stem.
const FIXTURES: &[&str] = &[
    "intel-arrow-lake-core-ultra-7-265k",
    "intel-alder-lake-i5-12400",
    "intel-comet-lake-i7-10700k",
    "intel-kentsfield-xeon-x3210",
    "amd-zen5-ryzen-9-9950x",
    "amd-zen3-ryzen-9-5950x",
    "amd-zen1-ryzen-7-1800x",
    "amd-k10-phenom-ii-x6-1055t",
];

/// Domain layouts: (vCPUs, domains).
fn layouts() -> Vec<(u8, Vec<Vec<u32>>)> {
    let block = |from: u32, n: u32| (from..from + n).collect::<Vec<u32>>();
    vec![
        (1, vec![block(0, 1)]),
        (2, vec![block(0, 1), block(1, 1)]),
        (4, vec![block(0, 2), block(2, 2)]),
        (6, vec![block(0, 4), block(4, 2)]),
        (8, vec![block(0, 4), block(4, 4)]),
        (8, vec![block(0, 8)]),
        (16, (0..4).map(|d| block(4 * d, 4)).collect()),
        (16, vec![block(0, 8), block(8, 8)]),
        (32, vec![block(0, 16), block(16, 16)]),
    ]
}

/// Leaves whose subleaf (ECX) matters.
const INDEXED: &[u32] = &[
    0x4,
    0x7,
    0xb,
    0xd,
    0xf,
    0x10,
    0x12,
    0x14,
    0x17,
    0x18,
    0x1d,
    0x1f,
    0x8000_001d,
    0x8000_0020,
    0x8000_0026,
];

/// A fixture's leaves: `CPUID llllllll: eax-ebx-ecx-edx [SL nn] ...` lines
/// (a leaf listed again without `[SL nn]` is its next subleaf).
fn load(name: &str) -> Vec<kvm_cpuid_entry2> {
    let path = format!("{}/tests/host_cpuid/{name}.txt", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert!(
        text.lines().any(|l| l.starts_with("# Source: ")),
        "{name} does not name its source"
    );
    let mut entries: Vec<kvm_cpuid_entry2> = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("CPUID ")) {
        let (leaf, rest) = line["CPUID ".len()..].split_once(": ").unwrap();
        let function = u32::from_str_radix(leaf, 16).unwrap();
        let regs: Vec<u32> = rest[..35]
            .split('-')
            .map(|r| u32::from_str_radix(r, 16).unwrap())
            .collect();
        let index = match rest.find("[SL ") {
            Some(at) => u32::from_str_radix(&rest[at + 4..at + 6], 16).unwrap(),
            None => entries.iter().filter(|e| e.function == function).count() as u32,
        };
        let flags = if INDEXED.contains(&function) {
            KVM_CPUID_FLAG_SIGNIFCANT_INDEX
        } else {
            0
        };
        entries.push(kvm_cpuid_entry2 {
            function,
            index,
            flags,
            eax: regs[0],
            ebx: regs[1],
            ecx: regs[2],
            edx: regs[3],
            ..Default::default()
        });
    }
    assert!(entries.len() > 10, "{name}: {} leaves", entries.len());
    entries
}

/// What KVM_GET_SUPPORTED_CPUID makes of the host's topology leaves
/// (Linux 6.12 arch/x86/kvm/cpuid.c): 0xB and 0x1F's first subleaf
/// emptied, 0x8000_001E zeroed ("do not return host topology
/// information"), the extended range capped at 0x8000_0022; leaves 1, 4,
/// 0x8000_0006 and 0x8000_001D passed through.
fn as_kvm_reports(host: &[kvm_cpuid_entry2]) -> Vec<kvm_cpuid_entry2> {
    let mut entries: Vec<kvm_cpuid_entry2> = host
        .iter()
        .filter(|e| e.function < 0x8000_0000 || e.function <= 0x8000_0022)
        .copied()
        .collect();
    for e in &mut entries {
        match e.function {
            0xb | 0x1f if e.index == 0 => (e.eax, e.ebx, e.ecx) = (0, 0, 0),
            0x8000_001e => (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0),
            0x8000_0000 => e.eax = e.eax.min(0x8000_0022),
            _ => {}
        }
    }
    entries
}

/// Every vCPU's CPUID, as perfbed-vmm builds it for `domains`.
fn guest_cpuid(
    host: &[kvm_cpuid_entry2],
    vcpus: u8,
    domains: &[Vec<u32>],
) -> Vec<Vec<kvm_cpuid_entry2>> {
    let supported = as_kvm_reports(host);
    let llc_bits = l3_sharing_bits(u32::from(vcpus), domains);
    (0..vcpus)
        .map(|index| {
            let mut entries = supported.clone();
            apply_topology(
                &mut entries,
                Placement {
                    index,
                    vcpus,
                    llc_bits,
                },
            );
            entries
        })
        .collect()
}

/// The CPUs (by APIC ID, which is the CPU number) whose `key` equals CPU
/// `cpu`'s.
fn same(keys: &[u32], cpu: usize) -> Vec<u32> {
    (0..keys.len() as u32)
        .filter(|&i| keys[i as usize] == keys[cpu])
        .collect()
}

fn order(n: u32) -> u32 {
    perfbed_device::l3_topology::id_bits(n)
}

/// The domains' rule, read from the leaves themselves: each vCPU whose L3,
/// die or AMD node is not `l3_of`'s.
fn rule_violations(cpus: &[Vec<kvm_cpuid_entry2>], domains: &[Vec<u32>]) -> Vec<String> {
    let n = cpus.len() as u32;
    let amd = Cpuid(&cpus[0]).is_amd();
    let mut l3 = Vec::new();
    let mut die = Vec::new();
    let mut node = Vec::new();
    for (i, entries) in cpus.iter().enumerate() {
        let c = Cpuid(entries);
        let apic_id = c.leaf(0x1f, 0)[3];
        assert_eq!(apic_id, i as u32, "x2APIC ID of vCPU {i}");
        let cache = if amd { 0x8000_001d } else { 0x4 };
        let sharing = (0..8)
            .map(|s| c.leaf(cache, s)[0])
            .find(|eax| (eax >> 5) & 7 == 3)
            .map(|eax| (eax >> 14) & 0xfff);
        let Some(sharing) = sharing else {
            return vec![format!("leaves: vCPU {i} has no L3 in leaf {cache:#x}")];
        };
        l3.push(apic_id >> order(sharing + 1));
        // 0x1F: the die is the APIC ID above the core level's shift.
        let core = (0..8)
            .map(|s| c.leaf(0x1f, s))
            .find(|l| (l[2] >> 8) & 0xff == 2)
            .expect("0x1F has a core level");
        die.push(apic_id >> (core[0] & 0x1f));
        if amd {
            node.push(c.leaf(0x8000_001e, 0)[2] & 0xff);
        }
    }
    let mut problems = Vec::new();
    for cpu in 0..n as usize {
        let wanted = l3_of(cpu as u32, n, domains);
        for (what, keys) in [("L3", &l3), ("die", &die), ("AMD node", &node)] {
            if keys.is_empty() {
                continue;
            }
            let got = same(keys, cpu);
            if got != wanted {
                problems.push(format!(
                    "leaves: vCPU {cpu}'s {what} is CPUs {got:?}, the rule says {wanted:?}"
                ));
            }
        }
    }
    problems
}

/// What a Linux 6.12 guest makes of it: each CPU whose L3
/// `shared_cpu_map` or die (`topo.die_id`) is not `l3_of`'s.
fn linux_violations(cpus: &[Vec<kvm_cpuid_entry2>], domains: &[Vec<u32>]) -> Vec<String> {
    let n = cpus.len() as u32;
    let derived: Vec<_> = cpus.iter().map(|e| derive(&Cpuid(e))).collect();
    let dies: Vec<u32> = derived.iter().map(|d| d.die_id).collect();
    let mut problems = Vec::new();
    for cpu in 0..n as usize {
        let wanted = l3_of(cpu as u32, n, domains);
        let got = l3_shared_cpu_map(&derived, cpu);
        if got.as_ref() != Some(&wanted) {
            problems.push(format!(
                "Linux: CPU {cpu}'s L3 shared_cpu_map is {got:?}, the rule says {wanted:?} ({:?})",
                derived[cpu]
            ));
        }
        let die = same(&dies, cpu);
        if die != wanted {
            problems.push(format!(
                "Linux: CPU {cpu}'s die holds CPUs {die:?}, the rule says {wanted:?}"
            ));
        }
    }
    problems
}

fn check(fixture: &str) -> Vec<String> {
    let host = load(fixture);
    let mut problems = Vec::new();
    for (vcpus, domains) in layouts() {
        let cpus = guest_cpuid(&host, vcpus, &domains);
        for p in rule_violations(&cpus, &domains)
            .into_iter()
            .chain(linux_violations(&cpus, &domains))
        {
            problems.push(format!(
                "{fixture}, {vcpus} vCPUs, domains {domains:?}: {p}"
            ));
        }
    }
    problems
}

#[test]
fn every_host_dump_gives_the_domains_l3s_and_dies_by_the_leaves_and_by_linux() {
    let problems: Vec<String> = FIXTURES.iter().flat_map(|f| check(f)).collect();
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_fixtures_cover_both_vendors_with_and_without_0x1f_and_topoext() {
    let host: Vec<(bool, bool, bool)> = FIXTURES
        .iter()
        .map(|f| {
            let e = load(f);
            let c = Cpuid(&e);
            (
                c.is_amd(),
                c.leaf(0x1f, 1)[1] != 0,
                c.leaf(0x8000_0001, 0)[2] & (1 << 22) != 0,
            )
        })
        .collect();
    for wanted in [(false, true), (false, false)] {
        assert!(
            host.iter().any(|&(amd, x1f, _)| (amd, x1f) == wanted),
            "Intel with 0x1F {}",
            wanted.1
        );
    }
    for wanted in [true, false] {
        assert!(
            host.iter()
                .any(|&(amd, _, topoext)| amd && topoext == wanted),
            "AMD with TopoExt {wanted}"
        );
    }
}
