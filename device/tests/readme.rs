//! `device/README.md` must agree with `regs.rs`, the authoritative map.

use perfbed_device::regs::*;

const README: &str = include_str!("../README.md");

/// (offset, name) of every table row whose first two cells are in backticks.
fn rows() -> Vec<(u64, String)> {
    README
        .lines()
        .filter_map(|line| {
            let mut cells = line.split('|').map(str::trim).skip(1);
            let offset = cells.next()?.strip_prefix("`0x")?;
            let hex: String = offset.chars().take_while(char::is_ascii_hexdigit).collect();
            let name = cells.next()?.trim_matches('`').to_string();
            Some((u64::from_str_radix(&hex, 16).ok()?, name))
        })
        .collect()
}

#[test]
fn readme_offsets_match_regs() {
    let expected: &[(&str, u64)] = &[
        ("REG_MAGIC", REG_MAGIC),
        ("REG_VERSION", REG_VERSION),
        ("REG_NUM_DOMAINS", REG_NUM_DOMAINS),
        ("REG_NUM_RMIDS", REG_NUM_RMIDS),
        ("REG_NUM_SLOTS", REG_NUM_SLOTS),
        ("REG_COUNTER_WIDTH", REG_COUNTER_WIDTH),
        ("REG_COUNTER_UNIT", REG_COUNTER_UNIT),
        ("REG_MAX_RATE", REG_MAX_RATE),
        ("REG_DOMAIN_BASE", REG_DOMAIN_BASE),
        ("REG_DOMAIN_STRIDE", REG_DOMAIN_STRIDE),
        ("REG_SLOT_BASE", REG_SLOT_BASE),
        ("REG_SLOT_STRIDE", REG_SLOT_STRIDE),
        ("REG_OCCUPANCY_BASE", REG_OCCUPANCY_BASE),
        ("REG_DEVICE_SIZE", REG_DEVICE_SIZE),
        ("REG_EVENTS", REG_EVENTS),
        ("DOM_ALLOWED_CPUS", DOM_ALLOWED_CPUS),
        ("DOM_OWNER", DOM_OWNER),
        ("SLOT_CTL[s]", DOM_SLOTS + SLOT_CTL_OFF),
        ("SLOT_COUNT[s]", DOM_SLOTS + SLOT_COUNT_OFF),
        ("OCCUPANCY[r]", DOM_OCCUPANCY),
        ("DOM_IRQ_CTL", DOM_IRQ_CTL),
        ("DOM_IRQ_THRESHOLD", DOM_IRQ_THRESHOLD),
        ("DOM_IRQ_STATUS", DOM_IRQ_STATUS),
        ("DOM_CONFIG_STATUS", DOM_CONFIG_STATUS),
        ("DOM_ALLOWED_GEN", DOM_ALLOWED_GEN),
        ("DOM_ALLOWED_ACK", DOM_ALLOWED_ACK),
    ];
    let rows = rows();
    for &(name, offset) in expected {
        let found: Vec<u64> = rows
            .iter()
            .filter(|(_, n)| n == name)
            .map(|&(o, _)| o)
            .collect();
        assert_eq!(found, vec![offset], "README row for {name}");
    }
    assert_eq!(
        rows.len(),
        expected.len(),
        "README has rows regs.rs lacks: {rows:?}"
    );
}

#[test]
fn readme_values_match_regs() {
    assert!(README.contains(&format!("`{MAGIC_VALUE:#018x}`")));
    assert!(README.contains(&format!("domain 0's block: `{DOMAIN_BASE:#06x}`")));
    assert!(README.contains(&format!(
        "bytes between domain blocks: `{DOMAIN_STRIDE:#06x}`"
    )));
    assert!(README.contains(&format!("bitmask of event ids: `{EVENTS_MASK:#06b}`")));
    assert!(README.contains(&format!("`0x{REG_GLOBAL_END:03x}..0x1000` is reserved")));
    assert!(README.contains(&format!(
        "`0x{:03x} + s * 0x{SLOT_STRIDE:02x}`",
        DOM_SLOTS + SLOT_CTL_OFF
    )));
    assert!(README.contains(&format!("`0x{:03x} + r * 8`", DOM_OCCUPANCY)));
}

/// regs.rs is compiled inside the kernel module: no std, no dependencies.
#[test]
fn regs_is_no_std_clean() {
    let src = include_str!("../src/regs.rs");
    for forbidden in [
        "std::",
        "use serde",
        "derive(Serialize",
        "alloc::",
        "extern crate",
        "Vec<",
        "String",
    ] {
        assert!(!src.contains(forbidden), "regs.rs mentions {forbidden:?}");
    }
    let imports: Vec<&str> = src
        .lines()
        .filter(|l| l.trim_start().starts_with("use "))
        .collect();
    assert!(
        imports.is_empty(),
        "regs.rs must not import anything: {imports:?}"
    );
}
