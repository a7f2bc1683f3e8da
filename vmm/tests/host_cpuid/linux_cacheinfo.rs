//! A small model of what a Linux 6.12 guest derives from its CPUID about
//! its L3s and dies: the APIC ID and die ID (arch/x86/kernel/cpu/
//! topology_ext.c, topology_amd.c), the LLC ID (cacheinfo.c's
//! `init_intel_cacheinfo` and `cacheinfo_amd_init_llc_id`) and the L3's
//! `shared_cpu_map` (cacheinfo.c's `__cache_cpumap_setup` and
//! `__cache_amd_cpumap_setup`). Written from reading those files; only the
//! paths a perfbed-vmm guest can take are modelled (one package, no SMT
//! masks beyond what the leaves say, no Hygon, no NODEID MSR).

use kvm_bindings::{kvm_cpuid_entry2, KVM_CPUID_FLAG_SIGNIFCANT_INDEX};

/// One CPU's CPUID, answered as KVM answers the guest: the entry for the
/// function (and index, where it is significant), zeros for anything
/// missing or beyond the range leaf 0 / 0x8000_0000 reports.
pub struct Cpuid<'a>(pub &'a [kvm_cpuid_entry2]);

impl Cpuid<'_> {
    pub fn leaf(&self, function: u32, index: u32) -> [u32; 4] {
        let max = if function >= 0x8000_0000 {
            self.raw(0x8000_0000, 0)[0]
        } else {
            self.raw(0, 0)[0]
        };
        if function > max && function != 0 && function != 0x8000_0000 {
            return [0; 4];
        }
        self.raw(function, index)
    }

    fn raw(&self, function: u32, index: u32) -> [u32; 4] {
        self.0
            .iter()
            .find(|e| {
                e.function == function
                    && (e.flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX == 0 || e.index == index)
            })
            .map_or([0; 4], |e| [e.eax, e.ebx, e.ecx, e.edx])
    }

    pub fn is_amd(&self) -> bool {
        let l = self.leaf(0, 0);
        let vendor = [l[1].to_le_bytes(), l[3].to_le_bytes(), l[2].to_le_bytes()].concat();
        vendor == b"AuthenticAMD"
    }

    /// Family and model as `cpu_detect` computes them.
    pub fn family_model(&self) -> (u32, u32) {
        let eax = self.leaf(1, 0)[0];
        let mut family = (eax >> 8) & 0xf;
        if family == 0xf {
            family += (eax >> 20) & 0xff;
        }
        let mut model = (eax >> 4) & 0xf;
        if family >= 0x6 {
            model += ((eax >> 16) & 0xf) << 4;
        }
        (family, model)
    }
}

/// `get_count_order`: ceil(log2 n).
fn count_order(n: u32) -> u32 {
    if n <= 1 {
        0
    } else {
        32 - (n - 1).leading_zeros()
    }
}

/// Topology domain types of leaves 0xB and 0x1F.
const SMT: u32 = 1;
const DIE: u32 = 5;

/// What the guest's topology code takes from one CPU's extended topology
/// leaf (0x1F before 0xB, as `cpu_parse_topology_ext`): the x2APIC ID and
/// the shift below the die domain (levels it does not list take the shift
/// of the level below, as `topology_set_dom` propagates them).
fn ext_topology(c: &Cpuid) -> Option<(u32, u32)> {
    for leaf in [0x1f, 0xb] {
        let first = c.leaf(leaf, 0);
        // A valid leaf's first subleaf has processors and a type.
        if first[1] & 0xffff == 0 || (first[2] >> 8) & 0xff == 0 {
            continue;
        }
        let mut below_die = 0;
        for sub in 0.. {
            let l = c.leaf(leaf, sub);
            let kind = (l[2] >> 8) & 0xff;
            if kind == 0 {
                break;
            }
            if (SMT..DIE).contains(&kind) {
                below_die = l[0] & 0x1f;
            }
        }
        return Some((first[3], below_die));
    }
    None
}

/// What one guest CPU derives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derived {
    pub apic_id: u32,
    /// `topo.die_id` (from 0x1F's die level; 0 with 0xB alone).
    pub die_id: u32,
    /// AMD's node ID (0x8000_001E ECX), `None` on Intel or without TopoExt.
    pub amd_node_id: Option<u32>,
    /// `topo.llc_id`.
    pub llc_id: Option<u32>,
    /// What the L3's `shared_cpu_map` groups CPUs by: on Intel the APIC ID
    /// above the L3 leaf's "threads sharing" order (`__cache_cpumap_setup`),
    /// on AMD the LLC ID (`cpu_llc_shared_mask`, which
    /// `__cache_amd_cpumap_setup` uses for the L3). `None`: no L3 leaf.
    l3_group: Option<u32>,
}

/// The cache leaves of Intel's leaf 4 or AMD's 0x8000_001D: (level, the
/// "threads sharing" field), until the null type.
fn cache_leaves(c: &Cpuid, function: u32) -> Vec<(u32, u32)> {
    (0..16)
        .map(|i| c.leaf(function, i)[0])
        .take_while(|eax| eax & 0x1f != 0)
        .map(|eax| ((eax >> 5) & 0x7, (eax >> 14) & 0xfff))
        .collect()
}

pub fn derive(c: &Cpuid) -> Derived {
    let (apic_id, below_die) = ext_topology(c).unwrap_or((c.leaf(1, 0)[1] >> 24, 0));
    let die_id = apic_id >> below_die;
    if !c.is_amd() {
        // init_intel_cacheinfo: the L3 id is the APIC ID without the bits
        // of the threads sharing it; the LLC is the L3 (else the L2).
        let leaves = cache_leaves(c, 4);
        let id_of = |level: u32| {
            leaves
                .iter()
                .find(|(l, _)| *l == level)
                .map(|(_, sharing)| {
                    let order = count_order(sharing + 1);
                    (apic_id & !((1 << order) - 1), order)
                })
        };
        let l3 = id_of(3);
        return Derived {
            apic_id,
            die_id,
            amd_node_id: None,
            llc_id: l3.or_else(|| id_of(2)).map(|(id, _)| id),
            l3_group: l3.map(|(_, order)| apic_id >> order),
        };
    }
    let topoext = c.leaf(0x8000_0001, 0)[2] & (1 << 22) != 0;
    let (family, model) = c.family_model();
    // parse_topology_amd: with TopoExt, 0x8000_001E gives the node and
    // cacheinfo_amd_init_llc_id the LLC; without it (and no NODEID MSR in
    // a guest) legacy_set_llc takes the core domain's shift.
    let (amd_node_id, mut llc_id) = (None, None);
    let amd_node_id = if topoext {
        Some(c.leaf(0x8000_001e, 0)[2] & 0xff)
    } else {
        amd_node_id
    };
    if let Some(node) = amd_node_id {
        if c.leaf(0x8000_0006, 0)[3] != 0 {
            llc_id = if family < 0x17 {
                Some(node)
            } else if family == 0x17 && model <= 0x1f {
                Some(apic_id >> 3)
            } else {
                let leaves = cache_leaves(c, 0x8000_001d);
                leaves
                    .last()
                    .map(|(_, sharing)| apic_id >> count_order(sharing + 1))
            };
        }
    }
    if llc_id.is_none() {
        // legacy_set_llc: the core domain's shift (0x1F's core level, or
        // 0xB's: the package).
        llc_id = Some(apic_id >> core_shift(c));
    }
    Derived {
        apic_id,
        die_id,
        amd_node_id,
        llc_id,
        l3_group: llc_id,
    }
}

/// The core domain's shift from 0x1F or 0xB (0 without either).
fn core_shift(c: &Cpuid) -> u32 {
    for leaf in [0x1f, 0xb] {
        for sub in 0..8 {
            let l = c.leaf(leaf, sub);
            if (l[2] >> 8) & 0xff == 2 {
                return l[0] & 0x1f;
            }
        }
    }
    0
}

/// The L3's `shared_cpu_map` of CPU `cpu` among all `cpus` (guest CPU
/// numbers, as listed); `None` when the guest makes no L3 for it.
pub fn l3_shared_cpu_map(cpus: &[Derived], cpu: usize) -> Option<Vec<u32>> {
    let group = cpus[cpu].l3_group?;
    Some(
        (0..cpus.len() as u32)
            .filter(|&i| cpus[i as usize].l3_group == Some(group))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_order_is_the_kernels() {
        assert_eq!(
            [1, 2, 3, 4, 5, 8, 9].map(count_order),
            [0, 1, 2, 2, 3, 3, 4]
        );
    }
}
