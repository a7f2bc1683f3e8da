//! Which CPUs share an L3 in a guest whose device has these domains: the
//! rule perfbed-vmm's CPUID follows and the topology check judges by.
//!
//! APIC IDs are the CPU numbers (0..n, as the MP table lists them), and an
//! x86 guest groups CPUs by APIC ID bits: CPUs share an L3 (and a die) when
//! their APIC IDs agree above the cache's "sharing" bits. Those bits are
//! the fewest that hold the largest domain, so the guest's L3s are the
//! aligned blocks of `2^bits` CPUs (the last one possibly short).
//!
//! The guest's L3s therefore *match* the device's domains exactly when the
//! domains are those blocks: a power-of-two split of the CPUs in order
//! (`0-1:2-3`, `0-3:4-7:8-11:12-15`, `0-3:4-5` for 6 CPUs). Any other split
//! (`0-2:3-5`, `0,2:1,3`, domains that leave CPUs out) cannot be matched
//! with dense APIC IDs; the guest then sees the blocks, not the domains,
//! and [`mismatches`] says where they differ.

/// Bits of APIC ID that hold `n` CPUs: ceil(log2 n).
pub fn id_bits(n: u32) -> u32 {
    let n = n.max(1);
    32 - (n - 1).leading_zeros()
}

/// The L3's sharing bits for `cpus` CPUs and these domains: enough for the
/// largest domain (all the CPUs when there is none), at most the package's.
pub fn l3_sharing_bits(cpus: u32, domains: &[Vec<u32>]) -> u32 {
    let largest = domains.iter().map(|d| d.len() as u32).max().unwrap_or(cpus);
    id_bits(largest).min(id_bits(cpus))
}

/// The CPUs sharing CPU `cpu`'s L3 (of `cpus` CPUs), in order.
pub fn l3_of(cpu: u32, cpus: u32, domains: &[Vec<u32>]) -> Vec<u32> {
    let bits = l3_sharing_bits(cpus, domains);
    let first = (cpu >> bits) << bits;
    (first..(first + (1 << bits)).min(cpus)).collect()
}

/// Every domain whose CPUs' L3 is not the domain itself, with that L3:
/// empty when the guest's L3s are the device's domains.
pub fn mismatches(cpus: u32, domains: &[Vec<u32>]) -> Vec<(usize, Vec<u32>)> {
    let mut wrong = Vec::new();
    for (d, domain) in domains.iter().enumerate() {
        let mut sorted = domain.clone();
        sorted.sort_unstable();
        for &cpu in &sorted {
            let l3 = l3_of(cpu, cpus, domains);
            if l3 != sorted {
                wrong.push((d, l3));
                break;
            }
        }
    }
    wrong
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_of_two_splits_match() {
        for (cpus, domains) in [
            (4, vec![vec![0, 1], vec![2, 3]]),
            (16, (0..4).map(|d| (4 * d..4 * d + 4).collect()).collect()),
            (6, vec![vec![0, 1, 2, 3], vec![4, 5]]),
            (3, vec![vec![0, 1], vec![2]]),
            (1, vec![vec![0]]),
            (64, vec![(0..32).collect(), (32..64).collect()]),
        ] {
            assert_eq!(
                mismatches(cpus, &domains),
                vec![],
                "{cpus} CPUs, {domains:?}"
            );
        }
        assert_eq!(l3_of(5, 6, &[vec![0, 1, 2, 3], vec![4, 5]]), vec![4, 5]);
        assert_eq!(l3_sharing_bits(16, &[(0..4).collect()]), 2);
    }

    #[test]
    fn other_splits_are_named_with_the_l3_the_guest_sees() {
        assert_eq!(
            mismatches(6, &[vec![0, 1, 2], vec![3, 4, 5]]),
            vec![(0, vec![0, 1, 2, 3]), (1, vec![0, 1, 2, 3])]
        );
        assert_eq!(
            mismatches(4, &[vec![0, 2], vec![1, 3]]),
            vec![(0, vec![0, 1]), (1, vec![0, 1])]
        );
        // Domains that leave CPUs out: each domain is still a block, and the
        // CPUs outside get blocks of their own.
        assert_eq!(mismatches(4, &[vec![0, 1]]), vec![]);
        assert_eq!(l3_of(3, 4, &[vec![0, 1]]), vec![2, 3]);
        assert_eq!(mismatches(4, &[vec![1, 2]]), vec![(0, vec![0, 1])]);
    }

    #[test]
    fn no_domains_means_one_l3() {
        assert_eq!(l3_of(3, 4, &[]), vec![0, 1, 2, 3]);
        assert_eq!(
            [1, 2, 3, 4, 5, 8, 9, 64].map(id_bits),
            [0, 1, 2, 2, 3, 3, 4, 6]
        );
    }
}
