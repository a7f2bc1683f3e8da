//! Kernel addresses to `function+offset`, from a kernel's `System.map`, for
//! the story of a hung VM: which kernel, which function a snapshot's RIP was
//! in.
//!
//! Neither kernel is relocated: perfbed's guest kernel has no
//! `CONFIG_RANDOMIZE_BASE`, and the box boots its L1 kernel (Debian's, which
//! has it) with `nokaslr`. So both are linked at `0xffffffff81000000` and an
//! address falls in both maps; only one of them was running. The story
//! names both and leaves the choice to the reader (QEMU's `info registers`
//! does not say whether L1's CPU was in its nested guest).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// One kernel's text symbols, sorted by address.
pub struct SystemMap {
    pub path: PathBuf,
    /// (address, name) of every text symbol (`t`/`T`/`w`/`W`).
    text: Vec<(u64, String)>,
    /// The end of the kernel's text (`_etext`), if the map has it.
    etext: Option<u64>,
}

impl SystemMap {
    pub fn load(path: &Path) -> Result<SystemMap> {
        let text =
            fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut map = SystemMap::parse(&text);
        map.path = path.to_path_buf();
        Ok(map)
    }

    pub fn parse(text: &str) -> SystemMap {
        let mut symbols = Vec::new();
        let mut etext = None;
        for line in text.lines() {
            let mut fields = line.split_whitespace();
            let (Some(addr), Some(kind), Some(name)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            if name == "_etext" {
                etext = Some(addr);
            }
            if matches!(kind, "t" | "T" | "w" | "W") {
                symbols.push((addr, name.to_string()));
            }
        }
        symbols.sort();
        SystemMap {
            path: PathBuf::new(),
            text: symbols,
            etext,
        }
    }

    /// `function+0xoffset` for a text address, `None` outside the text.
    pub fn resolve(&self, addr: u64) -> Option<String> {
        if self.etext.is_some_and(|end| addr >= end) {
            return None;
        }
        let at = self
            .text
            .partition_point(|(a, _)| *a <= addr)
            .checked_sub(1)?;
        let (start, name) = &self.text[at];
        Some(format!("{name}+{:#x}", addr - start))
    }
}

/// Where x86-64 Linux maps modules (`MODULES_VADDR` without KASLR): the
/// guest's perfbed.ko, L1's kvm and kvm-amd. No System.map covers them.
const MODULES_START: u64 = 0xffff_ffff_a000_0000;

/// One sentence on `rip` in each named kernel's map.
pub fn describe(rip: u64, maps: &[(&str, &SystemMap)]) -> String {
    if rip >= MODULES_START {
        let kernels: Vec<&str> = maps.iter().map(|(k, _)| *k).collect();
        return format!(
            "RIP {rip:#x} is in the modules' area of {} (no System.map covers modules)",
            kernels.join(" or ")
        );
    }
    let each: Vec<String> = maps
        .iter()
        .map(|(kernel, map)| match map.resolve(rip) {
            Some(f) => format!("{f} in {kernel}"),
            None => format!("outside the text of {kernel}"),
        })
        .collect();
    format!("RIP {rip:#x} is {}", each.join(", or "))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAP: &str = "\
ffffffff81000000 T _text
ffffffff81185210 t csum_partial_copy_nocheck
ffffffff81185223 T csum_ipv6_magic
ffffffff81185270 T csum_and_copy_from_user
ffffffff814550c4 r __ksymtab_csum_ipv6_magic
ffffffff81300000 T _etext
";

    #[test]
    fn an_address_is_the_text_symbol_below_it() {
        let map = SystemMap::parse(MAP);
        assert_eq!(
            map.resolve(0xffffffff81185239).as_deref(),
            Some("csum_ipv6_magic+0x16")
        );
        assert_eq!(
            map.resolve(0xffffffff81185223).as_deref(),
            Some("csum_ipv6_magic+0x0")
        );
        // Data symbols never name an address, and nothing past the text does.
        assert_eq!(
            map.resolve(0xffffffff812fffff).as_deref(),
            Some("csum_and_copy_from_user+0x17ad8f")
        );
        assert_eq!(map.resolve(0xffffffff814550c8), None);
        assert_eq!(map.resolve(0xffffffff80000000), None);
    }

    #[test]
    fn the_story_names_each_kernel() {
        let guest = SystemMap::parse(MAP);
        let l1 = SystemMap::parse("ffffffff81185000 T io_serial_out\nffffffff81200000 T _etext\n");
        assert_eq!(
            describe(
                0xffffffff81185239,
                &[("the guest's kernel", &guest), ("L1's kernel", &l1)]
            ),
            "RIP 0xffffffff81185239 is csum_ipv6_magic+0x16 in the guest's kernel, or io_serial_out+0x239 in L1's kernel"
        );
        assert_eq!(
            describe(0xffffffff81250000, &[("L1's kernel", &l1)]),
            "RIP 0xffffffff81250000 is outside the text of L1's kernel"
        );
        assert_eq!(
            describe(0xffffffffc0251ba5, &[("the guest's kernel", &guest), ("L1's kernel", &l1)]),
            "RIP 0xffffffffc0251ba5 is in the modules' area of the guest's kernel or L1's kernel (no System.map covers modules)"
        );
    }
}
