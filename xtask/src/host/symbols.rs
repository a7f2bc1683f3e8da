//! Kernel addresses to `function+offset`, from a kernel's `System.map` (or
//! a loaded module's symbols), for the story of a hung VM: which kernel,
//! which function a snapshot's RIP was in.
//!
//! Neither kernel is relocated: perfbed's guest kernel has no
//! `CONFIG_RANDOMIZE_BASE`, and the box boots its L1 kernel (Debian's, which
//! has it) with `nokaslr`. So both are linked at `0xffffffff81000000` and an
//! address falls in both maps; only one of them was running. The story
//! names both and leaves the choice to the reader (QEMU's `info registers`
//! does not say whether L1's CPU was in its nested guest).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

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

    /// The functions of a module's `.text`, from its `.ko` (`objdump -t
    /// -C`: Rust's names demangled), placed at `text_base`, where the guest
    /// loaded it (`/proc/modules` gives the start of the module's text,
    /// which is `.text` when it is the `.ko`'s first executable section, as
    /// for perfbed's modules).
    pub fn of_module(ko: &Path, text_base: u64) -> Result<SystemMap> {
        let out = std::process::Command::new("objdump")
            .args(["-t", "-C"])
            .arg(ko)
            .output()
            .with_context(|| format!("running objdump -t on {}", ko.display()))?;
        if !out.status.success() {
            bail!(
                "objdump -t {}: {}",
                ko.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let mut map =
            SystemMap::of_module_symbols(&String::from_utf8_lossy(&out.stdout), text_base);
        map.path = ko.to_path_buf();
        Ok(map)
    }

    /// [`SystemMap::of_module`] from `objdump -t`'s lines: each function
    /// of `.text` (`0000000000001381 l     F .text\t0000000000000047
    /// name`), moved to `text_base`; the text ends after the last one.
    fn of_module_symbols(objdump: &str, text_base: u64) -> SystemMap {
        let mut symbols = Vec::new();
        let mut end = text_base;
        for line in objdump.lines() {
            let Some((left, right)) = line.split_once('\t') else {
                continue;
            };
            let fields: Vec<&str> = left.split_whitespace().collect();
            let (Some(addr), Some(section)) = (fields.first(), fields.last()) else {
                continue;
            };
            let Some((size, name)) = right.split_once(' ') else {
                continue;
            };
            let (Ok(addr), Ok(size)) =
                (u64::from_str_radix(addr, 16), u64::from_str_radix(size, 16))
            else {
                continue;
            };
            if *section != ".text" || !fields.contains(&"F") {
                continue;
            }
            let addr = text_base + addr;
            end = end.max(addr + size);
            symbols.push((addr, name.trim().to_string()));
        }
        symbols.sort();
        SystemMap {
            path: PathBuf::new(),
            text: symbols,
            etext: Some(end),
        }
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

    /// A module's map (its text in the modules' area), not a kernel's.
    fn is_module(&self) -> bool {
        self.text.first().is_some_and(|(a, _)| *a >= MODULES_START)
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

/// One sentence on `rip` in each named kernel's map; in the modules' area,
/// the named module whose text holds it, if any.
pub fn describe(rip: u64, maps: &[(&str, &SystemMap)]) -> String {
    if rip >= MODULES_START {
        if let Some((module, f)) = maps
            .iter()
            .filter(|(_, m)| m.is_module())
            .find_map(|(module, m)| Some((module, m.resolve(rip)?)))
        {
            return format!("RIP {rip:#x} is {f} in {module}");
        }
        let kernels: Vec<&str> = maps
            .iter()
            .filter(|(_, m)| !m.is_module())
            .map(|(k, _)| *k)
            .collect();
        return format!(
            "RIP {rip:#x} is in the modules' area of {} (no System.map covers modules)",
            kernels.join(" or ")
        );
    }
    let each: Vec<String> = maps
        .iter()
        .filter(|(_, m)| !m.is_module())
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

    /// `objdump -t -C` of perfbed_scope_test.ko, trimmed: functions of
    /// `.text` and of another section, a section symbol, data.
    const OBJDUMP: &str = "\
0000000000000000 l    d  .text\t0000000000000000 .text
0000000000000000 l     F .text\t0000000000000181 perfbed_scope_test::register::<perfbed_scope_test::ScopePmu>
0000000000001381 l     F .text\t0000000000000047 perfbed_scope_test::probe::add
00000000000013c8 l     F .text\t0000000000000010 perfbed_scope_test::spin_with_interrupts_off
0000000000000000 g     F .init.text\t0000000000000062 init_module
0000000000000010 l     O .data\t0000000000000008 perfbed_scope_test::READY
";

    #[test]
    fn a_modules_functions_name_addresses_where_it_was_loaded() {
        let base = 0xffffffffa0010000;
        let module = SystemMap::of_module_symbols(OBJDUMP, base);
        let kernel = SystemMap::parse(MAP);
        let maps = [
            ("the guest's kernel", &kernel),
            ("perfbed_scope_test.ko", &module),
        ];
        assert_eq!(
            describe(base + 0x13c8 + 2, &maps),
            "RIP 0xffffffffa00113ca is perfbed_scope_test::spin_with_interrupts_off+0x2 in perfbed_scope_test.ko"
        );
        assert_eq!(
            module.resolve(base + 0x1385).as_deref(),
            Some("perfbed_scope_test::probe::add+0x4")
        );
        // Past the module's last function, below its text, elsewhere in
        // the modules' area: no name.
        assert_eq!(module.resolve(base + 0x13d8), None);
        assert_eq!(module.resolve(base - 1), None);
        assert_eq!(
            describe(0xffffffffc0251ba5, &maps),
            "RIP 0xffffffffc0251ba5 is in the modules' area of the guest's kernel (no System.map covers modules)"
        );
        // A kernel address is the kernel's, the module's map not named.
        assert_eq!(
            describe(0xffffffff81185239, &maps),
            "RIP 0xffffffff81185239 is csum_ipv6_magic+0x16 in the guest's kernel"
        );
    }
}
