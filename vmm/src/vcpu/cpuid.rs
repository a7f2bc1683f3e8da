//! CPUID as each vCPU sees it: what KVM supports, with a topology that
//! matches the MP table (one package, one core per vCPU, no SMT, APIC ID =
//! vCPU index).

use kvm_bindings::kvm_cpuid_entry2;

const LEAF_FEATURES: u32 = 0x1;
const LEAF_CACHE_PARAMS: u32 = 0x4;
const LEAF_EXT_TOPOLOGY: u32 = 0xb;
const LEAF_XSAVE: u32 = 0xd;
const LEAF_V2_EXT_TOPOLOGY: u32 = 0x1f;
const LEAF_AMD_FEATURES: u32 = 0x8000_0001;
const LEAF_AMD_SIZES: u32 = 0x8000_0008;
const LEAF_AMD_EXT_APIC: u32 = 0x8000_001e;

const EDX_HTT: u32 = 1 << 28;
const ECX_TSC_DEADLINE: u32 = 1 << 24;
const ECX_XSAVE: u32 = 1 << 26;
const ECX_OSXSAVE: u32 = 1 << 27;
const ECX_AVX: u32 = 1 << 28;
const ECX_HYPERVISOR: u32 = 1 << 31;
const AMD_ECX_CMP_LEGACY: u32 = 1 << 1;
const LEVEL_TYPE_SMT: u32 = 1;
const LEVEL_TYPE_CORE: u32 = 2;

/// Bits of APIC ID that number `n` cores: ceil(log2 n).
pub fn core_id_bits(n: u8) -> u32 {
    let n = u32::from(n.max(1));
    32 - (n - 1).leading_zeros()
}

/// Whether leaf 0 says AuthenticAMD (or HygonGenuine).
fn is_amd(entries: &[kvm_cpuid_entry2]) -> bool {
    entries.iter().find(|e| e.function == 0).is_some_and(|e| {
        let vendor = [e.ebx.to_le_bytes(), e.edx.to_le_bytes(), e.ecx.to_le_bytes()].concat();
        vendor == b"AuthenticAMD" || vendor == b"HygonGenuine"
    })
}

/// Rewrites the topology leaves of `entries` for vCPU `index` of `vcpus`.
pub fn apply_topology(entries: &mut [kvm_cpuid_entry2], index: u8, vcpus: u8) {
    let amd = is_amd(entries);
    let apic_id = u32::from(index);
    let count = u32::from(vcpus.max(1));
    let shift = core_id_bits(vcpus);
    for e in entries.iter_mut() {
        match e.function {
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
                // sharing the cache - 1 (the L3 is shared by all, the rest
                // private).
                let level = (e.eax >> 5) & 0x7;
                let sharing = if level >= 3 { count - 1 } else { 0 };
                e.eax = (e.eax & 0x3fff) | (sharing << 14) | ((count - 1) << 26);
            }
            LEAF_EXT_TOPOLOGY | LEAF_V2_EXT_TOPOLOGY => {
                let (eax, ebx, level_type) = match e.index {
                    0 => (0, 1, LEVEL_TYPE_SMT),
                    1 => (shift, count, LEVEL_TYPE_CORE),
                    _ => (0, 0, 0),
                };
                e.eax = eax;
                e.ebx = ebx;
                e.ecx = (level_type << 8) | (e.index & 0xff);
                e.edx = apic_id;
            }
            LEAF_AMD_FEATURES if amd => {
                if count > 1 {
                    e.ecx |= AMD_ECX_CMP_LEGACY;
                } else {
                    e.ecx &= !AMD_ECX_CMP_LEGACY;
                }
            }
            LEAF_AMD_SIZES if amd => {
                // NC = cores - 1, ApicIdCoreIdSize = the bits they take.
                e.ecx = (e.ecx & !0xf0ff) | (shift << 12) | (count - 1);
            }
            LEAF_AMD_EXT_APIC if amd => {
                e.eax = apic_id;
                e.ebx = apic_id & 0xff; // core ID; one thread per core
                e.ecx = 0; // node 0, one node
            }
            _ => {}
        }
    }
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
        kvm_cpuid_entry2 { function, index, ..Default::default() }
    }

    fn vendor(name: &[u8; 12]) -> kvm_cpuid_entry2 {
        let word = |i: usize| u32::from_le_bytes(name[i..i + 4].try_into().unwrap());
        kvm_cpuid_entry2 { function: 0, eax: 0x1f, ebx: word(0), edx: word(4), ecx: word(8), ..Default::default() }
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
        *e.iter().find(|x| x.function == function && x.index == index).unwrap()
    }

    #[test]
    fn bits_for_core_counts() {
        assert_eq!([1, 2, 3, 4, 5, 8, 9, 32].map(core_id_bits), [0, 1, 2, 2, 3, 3, 4, 5]);
    }

    #[test]
    fn every_vcpu_sees_its_apic_id_and_the_package_size() {
        for index in 0..4u8 {
            let mut e = entries(b"GenuineIntel");
            apply_topology(&mut e, index, 4);
            let features = find(&e, LEAF_FEATURES, 0);
            assert_eq!(features.ebx >> 24, u32::from(index));
            assert_eq!((features.ebx >> 16) & 0xff, 4);
            assert_ne!(features.edx & EDX_HTT, 0);
            assert_ne!(features.ecx & ECX_HYPERVISOR, 0);
            let smt = find(&e, LEAF_EXT_TOPOLOGY, 0);
            let core = find(&e, LEAF_EXT_TOPOLOGY, 1);
            assert_eq!((smt.eax, smt.ebx, smt.ecx >> 8, smt.edx), (0, 1, LEVEL_TYPE_SMT, u32::from(index)));
            assert_eq!((core.eax, core.ebx, core.ecx >> 8, core.edx), (2, 4, LEVEL_TYPE_CORE, u32::from(index)));
            assert_eq!(core.ecx & 0xff, 1);
            assert_eq!(find(&e, LEAF_CACHE_PARAMS, 3).eax >> 26, 3);
            assert_eq!((find(&e, LEAF_CACHE_PARAMS, 3).eax >> 14) & 0xfff, 3, "L3 shared by all");
            assert_eq!((find(&e, LEAF_CACHE_PARAMS, 0).eax >> 14) & 0xfff, 0, "L1 private");
            assert_eq!(find(&e, LEAF_AMD_SIZES, 0).ecx, 0, "AMD leaves untouched on Intel");
        }
    }

    #[test]
    fn amd_leaves_agree_with_the_topology() {
        let mut e = entries(b"AuthenticAMD");
        apply_topology(&mut e, 2, 3);
        let sizes = find(&e, LEAF_AMD_SIZES, 0);
        assert_eq!(sizes.ecx & 0xff, 2);
        assert_eq!((sizes.ecx >> 12) & 0xf, 2);
        assert_ne!(find(&e, LEAF_AMD_FEATURES, 0).ecx & AMD_ECX_CMP_LEGACY, 0);
        assert_eq!(find(&e, LEAF_AMD_EXT_APIC, 0).eax, 2);
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
            kvm_cpuid_entry2 { function: LEAF_FEATURES, ecx: ECX_XSAVE | ECX_OSXSAVE | ECX_AVX | 1, ..Default::default() },
            kvm_cpuid_entry2 { function: LEAF_XSAVE, index: 0, eax: 7, ebx: 576, ecx: 832, ..Default::default() },
        ];
        hide_xsave(&mut e);
        assert_eq!(e[0].ecx, 1, "SSE3 stays");
        assert_eq!((e[1].eax, e[1].ebx, e[1].ecx), (0, 0, 0));
    }

    #[test]
    fn one_vcpu_has_no_htt() {
        let mut e = entries(b"AuthenticAMD");
        e[1].edx = EDX_HTT;
        apply_topology(&mut e, 0, 1);
        assert_eq!(find(&e, LEAF_FEATURES, 0).edx & EDX_HTT, 0);
        assert_eq!(find(&e, LEAF_AMD_FEATURES, 0).ecx & AMD_ECX_CMP_LEGACY, 0);
    }
}
