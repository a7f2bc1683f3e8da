//! CPUID as each vCPU sees it: what KVM supports, with a topology derived
//! from the VM's configuration and no vPMU.
//!
//! The topology (the rule is `perfbed_device::l3_topology`'s): one package;
//! APIC ID = vCPU index (as the MP table says); no SMT; the CPUs are split
//! into dies of `2^llc_bits` consecutive APIC IDs, each die one L3. The
//! VMM takes `llc_bits` from the monitoring device's largest domain, so that
//! when the domains are a power-of-two split each domain is one die and one
//! L3, and the guest's cacheinfo (`shared_cpu_list`) agrees with the
//! device. Every leaf that says so is written, on either vendor, whether or
//! not KVM listed it:
//! - Intel: 0x4 (threads sharing each cache), 0xB (SMT, core = package),
//!   0x1F (SMT, core = die, die = package);
//! - AMD: 0x8000_0008 (cores), 0x8000_001D (threads sharing each cache),
//!   0x8000_001E (node = die), and 0xB/0x1F too (Linux reads them on AMD
//!   first, and without TopoExt takes the L3 from 0x1F's core level);
//!   TopoExt is always offered, and when KVM lists no level-3 subleaf of
//!   0x8000_001D (TCG's CPU in the box has none) the whole leaf is given:
//!   32 KiB L1d and L1i, a 512 KiB L2 per core, a 16 MiB L3 per die, the
//!   same L3 in 0x8000_0006; without an L3 Linux makes no `index3`.
//!
//! The vPMU is off, as in Firecracker: leaf 0xA (Intel's architectural PMU)
//! is zero, AMD's PerfCtrExtCore and PerfMonV2 are hidden, so the guest's
//! hardware PMUs are the same on both hosts (none: QEMU's TCG has none).

use kvm_bindings::{kvm_cpuid_entry2, KVM_CPUID_FLAG_SIGNIFCANT_INDEX};

const LEAF_VENDOR: u32 = 0x0;
const LEAF_FEATURES: u32 = 0x1;
const LEAF_CACHE_PARAMS: u32 = 0x4;
const LEAF_ARCH_PMU: u32 = 0xa;
const LEAF_EXT_TOPOLOGY: u32 = 0xb;
const LEAF_XSAVE: u32 = 0xd;
const LEAF_V2_EXT_TOPOLOGY: u32 = 0x1f;
const LEAF_AMD_EXT_MAX: u32 = 0x8000_0000;
const LEAF_AMD_FEATURES: u32 = 0x8000_0001;
const LEAF_AMD_L2_L3: u32 = 0x8000_0006;
const LEAF_AMD_SIZES: u32 = 0x8000_0008;
const LEAF_AMD_CACHE_TOPOLOGY: u32 = 0x8000_001d;
const LEAF_AMD_EXT_APIC: u32 = 0x8000_001e;
const LEAF_AMD_PERFMON_V2: u32 = 0x8000_0022;

const EDX_HTT: u32 = 1 << 28;
const ECX_TSC_DEADLINE: u32 = 1 << 24;
const ECX_XSAVE: u32 = 1 << 26;
const ECX_OSXSAVE: u32 = 1 << 27;
const ECX_AVX: u32 = 1 << 28;
const ECX_HYPERVISOR: u32 = 1 << 31;
const AMD_ECX_CMP_LEGACY: u32 = 1 << 1;
const AMD_ECX_TOPOEXT: u32 = 1 << 22;
const AMD_ECX_PERFCTR_CORE: u32 = 1 << 23;
const LEVEL_TYPE_SMT: u32 = 1;
const LEVEL_TYPE_CORE: u32 = 2;
const LEVEL_TYPE_DIE: u32 = 5;
/// The L3 given to a CPU that lists none: 16 MiB, 16-way, 64-byte lines.
const SYNTHETIC_L3_KIB: u32 = 16 * 1024;
/// The same, in 0x8000_0006 EDX's encoding.
const AMD_SYNTHETIC_L3: u32 = (32 << 18) | (0x8 << 12) | (1 << 8) | 64;

/// Bits of APIC ID that number `n` cores: ceil(log2 n).
pub fn core_id_bits(n: u8) -> u32 {
    perfbed_device::l3_topology::id_bits(u32::from(n))
}

/// Where one vCPU sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Its index, which is its APIC ID.
    pub index: u8,
    /// The VM's vCPUs.
    pub vcpus: u8,
    /// APIC ID bits below the die (and L3) number.
    pub llc_bits: u32,
}

impl Placement {
    fn apic_id(&self) -> u32 {
        u32::from(self.index)
    }
    fn package_bits(&self) -> u32 {
        core_id_bits(self.vcpus)
    }
    fn llc_bits(&self) -> u32 {
        self.llc_bits.min(self.package_bits())
    }
    /// CPUs in this vCPU's die (the last die may be short).
    fn die_cpus(&self) -> u32 {
        let first = (self.apic_id() >> self.llc_bits()) << self.llc_bits();
        (u32::from(self.vcpus) - first).min(1 << self.llc_bits())
    }
    fn dies(&self) -> u32 {
        u32::from(self.vcpus).div_ceil(1 << self.llc_bits())
    }
}

/// Whether leaf 0 says AuthenticAMD (or HygonGenuine).
fn is_amd(entries: &[kvm_cpuid_entry2]) -> bool {
    entries.iter().find(|e| e.function == 0).is_some_and(|e| {
        let vendor = [
            e.ebx.to_le_bytes(),
            e.edx.to_le_bytes(),
            e.ecx.to_le_bytes(),
        ]
        .concat();
        vendor == b"AuthenticAMD" || vendor == b"HygonGenuine"
    })
}

/// One subleaf of 0xB or 0x1F.
fn level(
    function: u32,
    index: u32,
    shift: u32,
    cpus: u32,
    level_type: u32,
    apic_id: u32,
) -> kvm_cpuid_entry2 {
    kvm_cpuid_entry2 {
        function,
        index,
        flags: KVM_CPUID_FLAG_SIGNIFCANT_INDEX,
        eax: shift,
        ebx: cpus,
        ecx: (level_type << 8) | index,
        edx: apic_id,
        ..Default::default()
    }
}

/// One subleaf of leaf 4 or 0x8000_001D (they share the layout): `kind`
/// 1 data, 2 instruction, 3 unified.
fn cache_leaf(
    function: u32,
    index: u32,
    kind: u32,
    level: u32,
    kib: u32,
    ways: u32,
    sharing: u32,
) -> kvm_cpuid_entry2 {
    let sets = kib * 1024 / (64 * ways);
    kvm_cpuid_entry2 {
        function,
        index,
        flags: KVM_CPUID_FLAG_SIGNIFCANT_INDEX,
        // Self-initializing (bit 8), threads sharing it - 1.
        eax: kind | (level << 5) | (1 << 8) | (sharing << 14),
        // 64-byte lines, one partition, `ways` ways.
        ebx: 63 | ((ways - 1) << 22),
        ecx: sets - 1,
        ..Default::default()
    }
}

/// The cache leaves for an AMD CPU that lists no L3 (see the module's doc).
fn amd_caches(l3_sharing: u32) -> [kvm_cpuid_entry2; 5] {
    let f = LEAF_AMD_CACHE_TOPOLOGY;
    [
        cache_leaf(f, 0, 1, 1, 32, 8, 0),
        cache_leaf(f, 1, 2, 1, 32, 8, 0),
        cache_leaf(f, 2, 3, 2, 512, 8, 0),
        cache_leaf(f, 3, 3, 3, SYNTHETIC_L3_KIB, 16, l3_sharing),
        // No more caches.
        kvm_cpuid_entry2 {
            function: LEAF_AMD_CACHE_TOPOLOGY,
            index: 4,
            flags: KVM_CPUID_FLAG_SIGNIFCANT_INDEX,
            ..Default::default()
        },
    ]
}

/// Adds an L3 to the leaf-4 list of an Intel CPU that lists none (Core 2
/// and older have their last level at L2): the guest's L3 is where the
/// domains are drawn, so it must have one. Its sharing and core fields are
/// written with the others afterwards.
fn give_intel_l3(entries: &mut Vec<kvm_cpuid_entry2>) {
    let listed = entries
        .iter()
        .filter(|e| e.function == LEAF_CACHE_PARAMS && e.eax & 0x1f != 0)
        .count() as u32;
    entries.retain(|e| !(e.function == LEAF_CACHE_PARAMS && e.eax & 0x1f == 0));
    let f = LEAF_CACHE_PARAMS;
    entries.push(cache_leaf(f, listed, 3, 3, SYNTHETIC_L3_KIB, 16, 0));
    entries.push(kvm_cpuid_entry2 {
        function: f,
        index: listed + 1,
        flags: KVM_CPUID_FLAG_SIGNIFCANT_INDEX,
        ..Default::default()
    });
}

/// AMD family 0x17 models up to 0x1F (Zen 1 and Zen+): Linux
/// (`cacheinfo_amd_init_llc_id`) takes their L3 from APIC ID bit 3 and
/// ignores 0x8000_001D, so the guest's L3s would be blocks of 8 CPUs
/// whatever the domains. They are shown as model 0x20 (Dali, still Zen 1
/// to Linux's errata), whose L3 Linux reads from 0x8000_001D. Leaves 1 and
/// 0x8000_0001 both carry the signature.
fn renumber_zen1(entries: &mut [kvm_cpuid_entry2]) {
    for e in entries
        .iter_mut()
        .filter(|e| e.function == LEAF_FEATURES || e.function == LEAF_AMD_FEATURES)
    {
        let family = ((e.eax >> 8) & 0xf) + ((e.eax >> 20) & 0xff);
        let model = ((e.eax >> 4) & 0xf) | (((e.eax >> 16) & 0xf) << 4);
        if family == 0x17 && model <= 0x1f {
            e.eax = (e.eax & !0x000f_00f0) | (0x2 << 16);
        }
    }
}

/// Writes the topology leaves of `entries` for vCPU `at` (see the module's
/// doc), inserting 0xB and 0x1F.
pub fn apply_topology(entries: &mut Vec<kvm_cpuid_entry2>, at: Placement) {
    let amd = is_amd(entries);
    let apic_id = at.apic_id();
    let count = u32::from(at.vcpus.max(1));
    let shift = at.package_bits();
    let llc = at.llc_bits();
    let l3_sharing = (1u32 << llc) - 1;
    let lists_l3 =
        |function| move |e: &kvm_cpuid_entry2| e.function == function && (e.eax >> 5) & 0x7 == 3;
    let synthetic_caches = amd && !entries.iter().any(lists_l3(LEAF_AMD_CACHE_TOPOLOGY));
    if !amd && !entries.iter().any(lists_l3(LEAF_CACHE_PARAMS)) {
        give_intel_l3(entries);
    }
    if amd {
        renumber_zen1(entries);
    }
    for e in entries.iter_mut() {
        match e.function {
            // 0x1F must be readable: raise the basic range to it.
            LEAF_VENDOR => e.eax = e.eax.max(LEAF_V2_EXT_TOPOLOGY),
            LEAF_FEATURES => {
                // APIC ID, logical processors per package, CLFLUSH size 8 qwords.
                e.ebx = (apic_id << 24) | (count << 16) | (8 << 8) | (e.ebx & 0xff);
                if count > 1 {
                    e.edx |= EDX_HTT;
                } else {
                    e.edx &= !EDX_HTT;
                }
                e.ecx |= ECX_HYPERVISOR;
            }
            LEAF_CACHE_PARAMS => {
                // EAX[31:26]: cores per package - 1; EAX[25:14]: threads
                // sharing the cache - 1 (the L3: the die's; the rest private).
                let level = (e.eax >> 5) & 0x7;
                let sharing = if level >= 3 { l3_sharing } else { 0 };
                e.eax = (e.eax & 0x3fff) | (sharing << 14) | (((1 << shift) - 1) << 26);
            }
            LEAF_ARCH_PMU | LEAF_AMD_PERFMON_V2 => (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0),
            LEAF_AMD_FEATURES if amd => {
                if count > 1 {
                    e.ecx |= AMD_ECX_CMP_LEGACY;
                } else {
                    e.ecx &= !AMD_ECX_CMP_LEGACY;
                }
                e.ecx &= !AMD_ECX_PERFCTR_CORE;
                e.ecx |= AMD_ECX_TOPOEXT;
            }
            // Up to 0x8000_001E (topology) readable.
            LEAF_AMD_EXT_MAX if amd => e.eax = e.eax.max(LEAF_AMD_EXT_APIC),
            LEAF_AMD_L2_L3 if amd && (synthetic_caches || e.edx == 0) => e.edx = AMD_SYNTHETIC_L3,
            LEAF_AMD_SIZES if amd => {
                // NC = cores - 1, ApicIdCoreIdSize = the bits they take.
                e.ecx = (e.ecx & !0xf0ff) | (shift << 12) | (count - 1);
            }
            LEAF_AMD_CACHE_TOPOLOGY if amd => {
                let level = (e.eax >> 5) & 0x7;
                let sharing = if level >= 3 { l3_sharing } else { 0 };
                e.eax = (e.eax & !(0xfff << 14)) | (sharing << 14);
            }
            LEAF_AMD_EXT_APIC if amd => {
                e.eax = apic_id;
                e.ebx = apic_id & 0xff; // core ID; one thread per core
                                        // Node (die) ID, nodes per package - 1 (3 bits).
                e.ecx = ((apic_id >> llc) & 0xff) | ((at.dies() - 1).min(7) << 8);
            }
            _ => {}
        }
    }
    if amd {
        if synthetic_caches {
            entries.retain(|e| e.function != LEAF_AMD_CACHE_TOPOLOGY);
            entries.extend(amd_caches(l3_sharing));
        }
        if !entries.iter().any(|e| e.function == LEAF_AMD_EXT_APIC) {
            entries.push(kvm_cpuid_entry2 {
                function: LEAF_AMD_EXT_APIC,
                eax: apic_id,
                ebx: apic_id & 0xff,
                ecx: ((apic_id >> llc) & 0xff) | ((at.dies() - 1).min(7) << 8),
                ..Default::default()
            });
        }
    }
    entries.retain(|e| e.function != LEAF_EXT_TOPOLOGY && e.function != LEAF_V2_EXT_TOPOLOGY);
    let b = LEAF_EXT_TOPOLOGY;
    entries.push(level(b, 0, 0, 1, LEVEL_TYPE_SMT, apic_id));
    entries.push(level(b, 1, shift, count, LEVEL_TYPE_CORE, apic_id));
    entries.push(level(b, 2, 0, 0, 0, apic_id));
    let v2 = LEAF_V2_EXT_TOPOLOGY;
    entries.push(level(v2, 0, 0, 1, LEVEL_TYPE_SMT, apic_id));
    entries.push(level(v2, 1, llc, at.die_cpus(), LEVEL_TYPE_CORE, apic_id));
    entries.push(level(v2, 2, shift, count, LEVEL_TYPE_DIE, apic_id));
    entries.push(level(v2, 3, 0, 0, 0, apic_id));
}

/// Offers the local APIC's TSC-deadline mode, which KVM's in-kernel APIC
/// has but does not list as supported CPUID. With it the guest needs no
/// APIC timer calibration, which a loaded host can make fail ("lapic is not
/// functional"); QEMU offers it too.
pub fn offer_tsc_deadline(entries: &mut [kvm_cpuid_entry2]) {
    for e in entries.iter_mut().filter(|e| e.function == LEAF_FEATURES) {
        e.ecx |= ECX_TSC_DEADLINE;
    }
}

/// Hides XSAVE (and AVX, which needs it) from the guest: it then keeps its
/// FPU state with FXSAVE. For the box: QEMU's TCG emulation of SVM does not
/// make XSETBV exit, so the L1 KVM never sees the guest's XCR0, keeps
/// CPUID 0xD's size at x87-only, and the guest warns "XSAVE consistency
/// problem: size 2696 != kernel_size 576".
pub fn hide_xsave(entries: &mut [kvm_cpuid_entry2]) {
    for e in entries.iter_mut() {
        match e.function {
            LEAF_FEATURES => e.ecx &= !(ECX_XSAVE | ECX_OSXSAVE | ECX_AVX),
            LEAF_XSAVE => (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(function: u32, index: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            ..Default::default()
        }
    }

    fn vendor(name: &[u8; 12]) -> kvm_cpuid_entry2 {
        let word = |i: usize| u32::from_le_bytes(name[i..i + 4].try_into().unwrap());
        kvm_cpuid_entry2 {
            function: 0,
            eax: 0x1f,
            ebx: word(0),
            edx: word(4),
            ecx: word(8),
            ..Default::default()
        }
    }

    fn entries(vendor_name: &[u8; 12]) -> Vec<kvm_cpuid_entry2> {
        let mut l3 = leaf(LEAF_CACHE_PARAMS, 3);
        l3.eax = (3 << 5) | 0x3;
        let mut l1 = leaf(LEAF_CACHE_PARAMS, 0);
        l1.eax = (1 << 5) | 0x1;
        vec![
            vendor(vendor_name),
            leaf(LEAF_FEATURES, 0),
            l1,
            l3,
            leaf(LEAF_EXT_TOPOLOGY, 0),
            leaf(LEAF_EXT_TOPOLOGY, 1),
            leaf(LEAF_AMD_FEATURES, 0),
            leaf(LEAF_AMD_SIZES, 0),
            leaf(LEAF_AMD_EXT_APIC, 0),
        ]
    }

    fn find(e: &[kvm_cpuid_entry2], function: u32, index: u32) -> kvm_cpuid_entry2 {
        *e.iter()
            .find(|x| x.function == function && x.index == index)
            .unwrap()
    }

    #[test]
    fn bits_for_core_counts() {
        assert_eq!(
            [1, 2, 3, 4, 5, 8, 9, 32].map(core_id_bits),
            [0, 1, 2, 2, 3, 3, 4, 5]
        );
    }

    fn at(index: u8, vcpus: u8, llc_bits: u32) -> Placement {
        Placement {
            index,
            vcpus,
            llc_bits,
        }
    }

    fn levels(e: &[kvm_cpuid_entry2], function: u32) -> Vec<(u32, u32, u32, u32)> {
        let mut l: Vec<_> = e
            .iter()
            .filter(|x| x.function == function)
            .map(|x| (x.index, x.eax, x.ebx, x.ecx >> 8))
            .collect();
        l.sort();
        l
    }

    #[test]
    fn every_vcpu_sees_its_apic_id_and_the_package_size() {
        for index in 0..4u8 {
            let mut e = entries(b"GenuineIntel");
            apply_topology(&mut e, at(index, 4, 2));
            let features = find(&e, LEAF_FEATURES, 0);
            assert_eq!(features.ebx >> 24, u32::from(index));
            assert_eq!((features.ebx >> 16) & 0xff, 4);
            assert_ne!(features.edx & EDX_HTT, 0);
            assert_ne!(features.ecx & ECX_HYPERVISOR, 0);
            let smt = find(&e, LEAF_EXT_TOPOLOGY, 0);
            let core = find(&e, LEAF_EXT_TOPOLOGY, 1);
            assert_eq!(
                (smt.eax, smt.ebx, smt.ecx >> 8, smt.edx),
                (0, 1, LEVEL_TYPE_SMT, u32::from(index))
            );
            assert_eq!(
                (core.eax, core.ebx, core.ecx >> 8, core.edx),
                (2, 4, LEVEL_TYPE_CORE, u32::from(index))
            );
            assert_eq!(core.ecx & 0xff, 1);
            assert_eq!(find(&e, LEAF_CACHE_PARAMS, 3).eax >> 26, 3);
            assert_eq!(
                (find(&e, LEAF_CACHE_PARAMS, 3).eax >> 14) & 0xfff,
                3,
                "L3 shared by all"
            );
            assert_eq!(
                (find(&e, LEAF_CACHE_PARAMS, 0).eax >> 14) & 0xfff,
                0,
                "L1 private"
            );
            assert_eq!(
                find(&e, LEAF_AMD_SIZES, 0).ecx,
                0,
                "AMD leaves untouched on Intel"
            );
            assert_eq!(find(&e, LEAF_V2_EXT_TOPOLOGY, 2).edx, u32::from(index));
        }
    }

    #[test]
    fn dies_and_l3s_follow_the_domains_and_0xb_0x1f_are_inserted() {
        // 6 vCPUs in domains of 4 (0-3, 4-5): llc_bits 2.
        let mut e = entries(b"GenuineIntel");
        e.retain(|x| x.function != LEAF_EXT_TOPOLOGY);
        e[0].eax = 0xd;
        apply_topology(&mut e, at(5, 6, 2));
        assert_eq!(find(&e, LEAF_VENDOR, 0).eax, 0x1f, "0x1F made readable");
        assert_eq!(
            levels(&e, LEAF_EXT_TOPOLOGY),
            vec![(0, 0, 1, 1), (1, 3, 6, 2), (2, 0, 0, 0)]
        );
        assert_eq!(
            levels(&e, LEAF_V2_EXT_TOPOLOGY),
            vec![(0, 0, 1, 1), (1, 2, 2, 2), (2, 3, 6, 5), (3, 0, 0, 0)]
        );
        assert_eq!(
            (find(&e, LEAF_CACHE_PARAMS, 3).eax >> 14) & 0xfff,
            3,
            "the L3 is the die's 4"
        );
        assert_eq!(
            find(&e, LEAF_CACHE_PARAMS, 3).eax >> 26,
            7,
            "8 APIC IDs in the package"
        );
        // Linux's L3 id: APIC ID >> get_count_order(sharing + 1).
        assert_eq!(5 >> core_id_bits(4), 1);
    }

    #[test]
    fn an_amd_cpu_without_an_l3_is_given_the_cache_leaves() {
        // As TCG's CPU in the box: no TopoExt, no 0x8000_001D/1E, no L3.
        let mut e = vec![
            vendor(b"AuthenticAMD"),
            leaf(LEAF_AMD_EXT_MAX, 0),
            leaf(LEAF_AMD_FEATURES, 0),
            leaf(LEAF_AMD_L2_L3, 0),
        ];
        e[1].eax = 0x8000_0008;
        apply_topology(&mut e, at(3, 4, 1));
        assert_eq!(find(&e, LEAF_AMD_EXT_MAX, 0).eax, LEAF_AMD_EXT_APIC);
        assert_ne!(find(&e, LEAF_AMD_FEATURES, 0).ecx & AMD_ECX_TOPOEXT, 0);
        assert_eq!(find(&e, LEAF_AMD_L2_L3, 0).edx, AMD_SYNTHETIC_L3);
        let caches: Vec<(u32, u32, u32)> = (0..5)
            .map(|i| find(&e, LEAF_AMD_CACHE_TOPOLOGY, i))
            .map(|c| (c.eax & 0x1f, (c.eax >> 5) & 0x7, (c.eax >> 14) & 0xfff))
            .collect();
        assert_eq!(
            caches,
            vec![(1, 1, 0), (2, 1, 0), (3, 2, 0), (3, 3, 1), (0, 0, 0)]
        );
        let l3 = find(&e, LEAF_AMD_CACHE_TOPOLOGY, 3);
        let bytes = (l3.ebx & 0xfff) as u64 + 1;
        let ways = u64::from(l3.ebx >> 22) + 1;
        assert_eq!(bytes * ways * (u64::from(l3.ecx) + 1), 16 << 20, "16 MiB");
        let ext = find(&e, LEAF_AMD_EXT_APIC, 0);
        assert_eq!(
            (ext.eax, ext.ecx & 0xff, (ext.ecx >> 8) & 7),
            (3, 1, 1),
            "vCPU 3 on node 1 of 2"
        );
    }

    #[test]
    fn the_vpmu_is_off() {
        let mut e = entries(b"AuthenticAMD");
        e.push(kvm_cpuid_entry2 {
            function: LEAF_ARCH_PMU,
            eax: 0x0804_3004,
            ebx: 1,
            edx: 0x603,
            ..Default::default()
        });
        e.push(kvm_cpuid_entry2 {
            function: LEAF_AMD_PERFMON_V2,
            eax: 1,
            ebx: 6,
            ..Default::default()
        });
        let features = e
            .iter_mut()
            .find(|x| x.function == LEAF_AMD_FEATURES)
            .unwrap();
        features.ecx = AMD_ECX_PERFCTR_CORE | 1;
        apply_topology(&mut e, at(0, 2, 0));
        let pmu = find(&e, LEAF_ARCH_PMU, 0);
        assert_eq!((pmu.eax, pmu.ebx, pmu.ecx, pmu.edx), (0, 0, 0, 0));
        assert_eq!(find(&e, LEAF_AMD_PERFMON_V2, 0).eax, 0);
        assert_eq!(find(&e, LEAF_AMD_FEATURES, 0).ecx & AMD_ECX_PERFCTR_CORE, 0);
        assert_ne!(
            find(&e, LEAF_AMD_FEATURES, 0).ecx & 1,
            0,
            "other features stay"
        );
    }

    #[test]
    fn amd_leaves_agree_with_the_topology() {
        let mut e = entries(b"AuthenticAMD");
        let mut l3 = leaf(LEAF_AMD_CACHE_TOPOLOGY, 3);
        l3.eax = (3 << 5) | 0x3 | (7 << 14);
        let mut l1 = leaf(LEAF_AMD_CACHE_TOPOLOGY, 0);
        l1.eax = (1 << 5) | 0x1 | (1 << 14);
        e.extend([l1, l3, leaf(LEAF_AMD_L2_L3, 0)]);
        // 3 vCPUs, domains 0-1 and 2: vCPU 2 is die (node) 1 of 2.
        apply_topology(&mut e, at(2, 3, 1));
        let sizes = find(&e, LEAF_AMD_SIZES, 0);
        assert_eq!(sizes.ecx & 0xff, 2);
        assert_eq!((sizes.ecx >> 12) & 0xf, 2);
        assert_ne!(find(&e, LEAF_AMD_FEATURES, 0).ecx & AMD_ECX_CMP_LEGACY, 0);
        let ext = find(&e, LEAF_AMD_EXT_APIC, 0);
        assert_eq!((ext.eax, ext.ecx & 0xff, (ext.ecx >> 8) & 0x7), (2, 1, 1));
        assert_eq!(
            (find(&e, LEAF_AMD_CACHE_TOPOLOGY, 3).eax >> 14) & 0xfff,
            1,
            "the L3 is shared by 2"
        );
        assert_eq!(
            (find(&e, LEAF_AMD_CACHE_TOPOLOGY, 0).eax >> 14) & 0xfff,
            0,
            "the L1 is private"
        );
        assert_eq!(
            find(&e, LEAF_AMD_CACHE_TOPOLOGY, 3).eax & 0x3fff,
            (3 << 5) | 0x3
        );
        assert_eq!(
            find(&e, LEAF_AMD_L2_L3, 0).edx,
            AMD_SYNTHETIC_L3,
            "an L3 given where there was none"
        );
    }

    #[test]
    fn tsc_deadline_is_offered() {
        let mut e = vec![leaf(LEAF_FEATURES, 0), leaf(LEAF_EXT_TOPOLOGY, 0)];
        offer_tsc_deadline(&mut e);
        assert_eq!(e[0].ecx, ECX_TSC_DEADLINE);
        assert_eq!(e[1].ecx, 0);
    }

    #[test]
    fn xsave_can_be_hidden() {
        let mut e = vec![
            kvm_cpuid_entry2 {
                function: LEAF_FEATURES,
                ecx: ECX_XSAVE | ECX_OSXSAVE | ECX_AVX | 1,
                ..Default::default()
            },
            kvm_cpuid_entry2 {
                function: LEAF_XSAVE,
                index: 0,
                eax: 7,
                ebx: 576,
                ecx: 832,
                ..Default::default()
            },
        ];
        hide_xsave(&mut e);
        assert_eq!(e[0].ecx, 1, "SSE3 stays");
        assert_eq!((e[1].eax, e[1].ebx, e[1].ecx), (0, 0, 0));
    }

    #[test]
    fn one_vcpu_has_no_htt() {
        let mut e = entries(b"AuthenticAMD");
        e[1].edx = EDX_HTT;
        apply_topology(&mut e, at(0, 1, 0));
        assert_eq!(find(&e, LEAF_FEATURES, 0).edx & EDX_HTT, 0);
        assert_eq!(find(&e, LEAF_AMD_FEATURES, 0).ecx & AMD_ECX_CMP_LEGACY, 0);
    }
}
