//! The host's configuration inputs: CPU lists and `--domains` specs (as
//! `cargo xtask run --domains` and QEMU's `domains=` property take them),
//! the QEMU shim's properties, and device configs as JSON.
//!
//! Checked: parsing never panics; a parsed CPU list is sorted, unique and
//! formats to a list that parses back to it; a config the validator accepts
//! makes a device whose self-description matches it, and one it refuses
//! makes none.

use arbitrary::{Arbitrary, Unstructured};
use perfbed_device::cpus::{format_cpu_list, parse_cpu_list, parse_domain_list};
use perfbed_device::{regs, Device, DeviceConfig};

#[derive(Arbitrary, Debug)]
struct Properties<'a> {
    domains: &'a str,
    rmids: u32,
    slots: u32,
    width: u32,
    max_rate: u64,
    trace_capacity: u32,
}

pub fn run(bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        check_cpu_list(text);
        if let Ok(domains) = parse_domain_list(text) {
            assert_eq!(domains.len(), text.split(':').count());
            domains.iter().for_each(|d| check_sorted(d));
            check_config(&DeviceConfig { domains, ..DeviceConfig::default() });
        }
        if let Ok(config) = serde_json::from_str::<DeviceConfig>(text) {
            check_config(&config);
        }
    }
    let mut u = Unstructured::new(bytes);
    if let Ok(p) = Properties::arbitrary(&mut u) {
        let props = perfbed_qemu::Properties {
            domains: p.domains,
            rmids: p.rmids,
            slots: p.slots,
            width: p.width,
            max_rate: p.max_rate,
            // Bounded: the trace ring is allocated up front.
            trace_capacity: p.trace_capacity % 65536,
        };
        if let Ok(config) = perfbed_qemu::config_from_properties(&props) {
            check_config(&config);
        }
    }
}

fn check_sorted(cpus: &[u32]) {
    assert!(cpus.windows(2).all(|w| w[0] < w[1]), "not sorted and unique: {cpus:?}");
}

fn check_cpu_list(text: &str) {
    let Ok(cpus) = parse_cpu_list(text) else {
        return;
    };
    check_sorted(&cpus);
    let formatted = format_cpu_list(&cpus);
    assert_eq!(parse_cpu_list(&formatted).as_ref(), Ok(&cpus), "{text:?} -> {formatted:?}");
}

fn check_config(config: &DeviceConfig) {
    match (config.validate(), Device::new(config.clone())) {
        (Ok(()), Ok(mut device)) => {
            assert_eq!(device.size(), config.size());
            let reg = |d: &mut Device, off| d.read(0, 0, off, 8);
            assert_eq!(reg(&mut device, regs::REG_MAGIC), regs::MAGIC_VALUE);
            assert_eq!(reg(&mut device, regs::REG_DEVICE_SIZE), config.size());
            assert_eq!(reg(&mut device, regs::REG_NUM_DOMAINS), config.domains.len() as u64);
            for (d, cpus) in config.domains.iter().enumerate() {
                let mask = reg(&mut device, regs::domain_reg(d as u64, regs::DOM_ALLOWED_CPUS));
                let want = cpus.iter().fold(0u64, |m, &c| m | 1 << c);
                assert_eq!(mask, want, "domain {d} of {config:?}");
            }
            // The whole block fits the size it announces.
            let last = regs::occupancy(config.domains.len() as u64 - 1, u64::from(config.rmids) - 1);
            assert!(last + 8 <= config.size(), "{config:?}");
        }
        (Err(_), Err(_)) => {}
        (v, d) => panic!("validate {v:?} but Device::new {:?} for {config:?}", d.map(|_| ())),
    }
}
