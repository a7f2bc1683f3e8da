//! CPU lists in the kernel's sysfs format (`"0-1,3"`) and a small CPU set.

use std::fmt;

use crate::regs::MAX_CPUS;

/// Why a CPU list could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuListError {
    /// A comma-separated item is empty (as in `"0,,1"`).
    #[error("empty item in CPU list {0:?}")]
    EmptyItem(String),
    /// An item is not a number or a `first-last` range.
    #[error("bad CPU number {item:?} in CPU list {list:?}")]
    BadNumber {
        /// The offending item.
        item: String,
        /// The whole list.
        list: String,
    },
    /// A range's end is below its start.
    #[error("reversed range {first}-{last} in CPU list")]
    ReversedRange {
        /// Start of the range.
        first: u32,
        /// End of the range.
        last: u32,
    },
    /// A CPU number above [`MAX_CPU_NUMBER`].
    #[error("CPU {0} in CPU list is above {max}, the largest CPU number Linux can have", max = MAX_CPU_NUMBER)]
    CpuTooLarge(u32),
}

/// The largest CPU number a list may hold: Linux's largest `NR_CPUS`
/// (`CONFIG_MAXSMP`, 8192 CPUs) less one. Bounding the numbers, not the
/// width of each range, keeps every list the parser accepts in canonical
/// form too: `"0-3000,2000-5000"` is `"0-5000"`, and a limit on a range's
/// width would refuse the second spelling of a list it took in the first.
pub const MAX_CPU_NUMBER: u32 = 8191;

/// The most CPUs perfbed's guest runs with, on either host: the guest
/// kernel's `CONFIG_NR_CPUS` (`images/kernel/config.fragment`). xtask's
/// `--cpus` and perfbed-vmm's limit are this one number.
pub const GUEST_MAX_CPUS: u8 = 64;

/// Parses a CPU list such as `"0-1,3"` (whitespace around items is ignored;
/// an empty or all-blank string is the empty list). The result is sorted and
/// free of duplicates.
pub fn parse_cpu_list(list: &str) -> Result<Vec<u32>, CpuListError> {
    let mut cpus = Vec::new();
    if list.trim().is_empty() {
        return Ok(cpus);
    }
    let number = |s: &str| -> Result<u32, CpuListError> {
        let cpu = s
            .trim()
            .parse::<u32>()
            .map_err(|_| CpuListError::BadNumber {
                item: s.trim().to_string(),
                list: list.to_string(),
            })?;
        if cpu > MAX_CPU_NUMBER {
            return Err(CpuListError::CpuTooLarge(cpu));
        }
        Ok(cpu)
    };
    for item in list.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(CpuListError::EmptyItem(list.to_string()));
        }
        match item.split_once('-') {
            Some((first, last)) => {
                let (first, last) = (number(first)?, number(last)?);
                if last < first {
                    return Err(CpuListError::ReversedRange { first, last });
                }
                cpus.extend(first..=last);
            }
            None => cpus.push(number(item)?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// Parses a device's domains: each domain's CPU list, domains separated by
/// `:` (`"0-1:2-3"`), as `cargo xtask run --domains` and QEMU's
/// `domains=` property take them. Empty domains are kept (empty lists);
/// [`crate::DeviceConfig::validate`] refuses them.
pub fn parse_domain_list(spec: &str) -> Result<Vec<Vec<u32>>, CpuListError> {
    spec.split(':').map(parse_cpu_list).collect()
}

/// Formats CPUs as a kernel CPU list (`[0, 1, 3]` gives `"0-1,3"`); the input
/// need not be sorted, duplicates are dropped, the empty list gives `""`.
pub fn format_cpu_list(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < sorted.len() {
        let first = sorted[i];
        let mut last = first;
        while i + 1 < sorted.len() && Some(sorted[i + 1]) == last.checked_add(1) {
            i += 1;
            last = sorted[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if first == last {
            out.push_str(&first.to_string());
        } else {
            out.push_str(&format!("{first}-{last}"));
        }
        i += 1;
    }
    out
}

/// A set of vCPU indices below [`MAX_CPUS`], as a u64 bitmask (the value of a
/// domain's `ALLOWED_CPUS` register).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CpuSet(pub u64);

impl CpuSet {
    /// The set of `cpus`, or the first CPU that does not fit.
    pub fn from_cpus(cpus: &[u32]) -> Result<CpuSet, u32> {
        let mut mask = 0u64;
        for &cpu in cpus {
            if u64::from(cpu) >= MAX_CPUS {
                return Err(cpu);
            }
            mask |= 1u64 << cpu;
        }
        Ok(CpuSet(mask))
    }

    /// Whether `cpu` is in the set (never true for CPUs `>= MAX_CPUS`).
    pub fn contains(self, cpu: u32) -> bool {
        u64::from(cpu) < MAX_CPUS && self.0 & (1u64 << cpu) != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The CPUs in the set, ascending.
    pub fn cpus(self) -> Vec<u32> {
        (0..MAX_CPUS as u32).filter(|&c| self.contains(c)).collect()
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_cpu_list(&self.cpus()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_lists() {
        assert_eq!(parse_cpu_list("0-1,3").unwrap(), vec![0, 1, 3]);
        assert_eq!(parse_cpu_list(" 5 , 2-3 ,2").unwrap(), vec![2, 3, 5]);
        assert_eq!(parse_cpu_list("7").unwrap(), vec![7]);
        assert_eq!(parse_cpu_list("").unwrap(), Vec::<u32>::new());
        assert_eq!(parse_cpu_list("\n").unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn rejects_bad_lists() {
        assert!(matches!(
            parse_cpu_list("0,,1"),
            Err(CpuListError::EmptyItem(_))
        ));
        assert!(matches!(
            parse_cpu_list("a"),
            Err(CpuListError::BadNumber { .. })
        ));
        assert!(matches!(
            parse_cpu_list("1-"),
            Err(CpuListError::BadNumber { .. })
        ));
        assert!(matches!(
            parse_cpu_list("-1"),
            Err(CpuListError::BadNumber { .. })
        ));
        assert_eq!(
            parse_cpu_list("3-1"),
            Err(CpuListError::ReversedRange { first: 3, last: 1 })
        );
        assert_eq!(
            parse_cpu_list("0-4294967295"),
            Err(CpuListError::CpuTooLarge(4294967295))
        );
        assert_eq!(parse_cpu_list("8192"), Err(CpuListError::CpuTooLarge(8192)));
        assert_eq!(parse_cpu_list("8191").unwrap(), vec![8191]);
    }

    /// What the fuzzer found: overlapping ranges, each narrow, whose union
    /// is one wide range. Whatever is accepted is accepted again formatted.
    #[test]
    fn an_accepted_list_is_accepted_again_in_canonical_form() {
        for list in [
            "0-345,5,518,6,099-3745,5,0974-5039,5,772",
            "0-8191",
            "8191,0-4000,4001-8190",
        ] {
            let cpus = parse_cpu_list(list).unwrap();
            let formatted = format_cpu_list(&cpus);
            assert_eq!(
                parse_cpu_list(&formatted),
                Ok(cpus),
                "{list:?} -> {formatted:?}"
            );
        }
        assert_eq!(
            format_cpu_list(&parse_cpu_list("0-345,99-3745,974-5039").unwrap()),
            "0-5039"
        );
    }

    #[test]
    fn parses_domain_lists() {
        assert_eq!(
            parse_domain_list("0-1:2-3").unwrap(),
            vec![vec![0, 1], vec![2, 3]]
        );
        assert_eq!(parse_domain_list("5").unwrap(), vec![vec![5]]);
        assert_eq!(parse_domain_list("0:").unwrap(), vec![vec![0], vec![]]);
        assert!(matches!(
            parse_domain_list("0-1:x"),
            Err(CpuListError::BadNumber { .. })
        ));
    }

    #[test]
    fn formats_and_round_trips() {
        assert_eq!(format_cpu_list(&[3, 0, 1]), "0-1,3");
        assert_eq!(format_cpu_list(&[]), "");
        assert_eq!(
            format_cpu_list(&[4, 4, 5, 6, 9, u32::MAX]),
            "4-6,9,4294967295"
        );
        for list in ["0", "0-63", "1,3,5-7,10-11"] {
            assert_eq!(format_cpu_list(&parse_cpu_list(list).unwrap()), list);
        }
    }

    #[test]
    fn cpu_set() {
        let set = CpuSet::from_cpus(&[0, 2, 63]).unwrap();
        assert_eq!(set.0, 0b101 | 1 << 63);
        assert!(set.contains(2) && !set.contains(1) && !set.contains(64));
        assert_eq!(set.to_string(), "0,2,63");
        assert_eq!(CpuSet::from_cpus(&[1, 64]), Err(64));
        assert!(CpuSet::default().is_empty());
    }
}
