//! The Intel MultiProcessor Specification 1.4 table: how a guest without
//! ACPI (like the QEMU host's `microvm,acpi=off`) learns its CPUs, its
//! IOAPIC and how ISA interrupts reach it.
//!
//! The floating pointer and the configuration table are built as one byte
//! image from [`MPTABLE_ADDR`] to the end of base memory: the table first,
//! the floating pointer at [`MP_FLOATING_ADDR`] (the last KiB, where the
//! kernel scans). The whole range is reserved in the E820 map.

use crate::memory::{BASE_MEMORY_END, IOAPIC_ADDR, LAPIC_ADDR, MPTABLE_ADDR, MP_FLOATING_ADDR};

/// IOAPIC pins; every one is announced as the ISA IRQ of the same number,
/// matching KVM's default GSI routing (GSI n is pin n).
pub const IOAPIC_PINS: u8 = 24;

const SPEC_REV: u8 = 4;
const LAPIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;
const FLOATING_LEN: usize = 16;
const HEADER_LEN: usize = 44;
const CPU_ENTRY_LEN: usize = 20;
const SMALL_ENTRY_LEN: usize = 8;

const ENTRY_PROCESSOR: u8 = 0;
const ENTRY_BUS: u8 = 1;
const ENTRY_IOAPIC: u8 = 2;
const ENTRY_IO_INTERRUPT: u8 = 3;
const ENTRY_LOCAL_INTERRUPT: u8 = 4;

const INT_TYPE_INT: u8 = 0;
const INT_TYPE_NMI: u8 = 1;
const INT_TYPE_EXTINT: u8 = 3;

const CPU_ENABLED: u8 = 1;
const CPU_BSP: u8 = 2;
/// Family 6, as the signature a processor entry carries.
const CPU_SIGNATURE: u32 = 0x600;
/// FPU and APIC present.
const CPU_FEATURES: u32 = 0x201;

/// Why the table could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MpTableError {
    #[error("an MP table for {0} vCPUs does not fit below the floating pointer")]
    TooLarge(u8),
    #[error("an MP table needs at least one vCPU")]
    NoCpus,
}

/// Where the table's image goes.
pub const fn address() -> u64 {
    MPTABLE_ADDR
}

/// The IOAPIC's ID: the first after the CPUs' APIC IDs (0..vcpus).
pub fn ioapic_id(vcpus: u8) -> u8 {
    vcpus
}

/// The table for `vcpus` vCPUs with APIC IDs 0..vcpus (vCPU 0 the BSP), as
/// bytes to copy to [`address()`].
pub fn build(vcpus: u8) -> Result<Vec<u8>, MpTableError> {
    if vcpus == 0 {
        return Err(MpTableError::NoCpus);
    }
    let entries = usize::from(vcpus) + 1 + 1 + usize::from(IOAPIC_PINS) + 2;
    let table_len = HEADER_LEN
        + usize::from(vcpus) * CPU_ENTRY_LEN
        + (1 + 1 + usize::from(IOAPIC_PINS) + 2) * SMALL_ENTRY_LEN;
    if table_len as u64 > MP_FLOATING_ADDR - MPTABLE_ADDR {
        return Err(MpTableError::TooLarge(vcpus));
    }
    let table_addr = MPTABLE_ADDR;

    let mut floating = Vec::with_capacity(FLOATING_LEN);
    floating.extend_from_slice(b"_MP_");
    floating.extend_from_slice(&(table_addr as u32).to_le_bytes());
    floating.push(1); // length in 16-byte units
    floating.push(SPEC_REV);
    floating.push(0); // checksum, below
    floating.extend_from_slice(&[0; 5]); // feature bytes: a table is present
    floating[10] = checksum_complement(&floating);

    let mut body = Vec::with_capacity(table_len - HEADER_LEN);
    for cpu in 0..vcpus {
        body.push(ENTRY_PROCESSOR);
        body.push(cpu); // local APIC ID
        body.push(LAPIC_VERSION);
        body.push(CPU_ENABLED | if cpu == 0 { CPU_BSP } else { 0 });
        body.extend_from_slice(&CPU_SIGNATURE.to_le_bytes());
        body.extend_from_slice(&CPU_FEATURES.to_le_bytes());
        body.extend_from_slice(&[0; 8]);
    }
    const ISA_BUS: u8 = 0;
    body.extend_from_slice(&[ENTRY_BUS, ISA_BUS]);
    body.extend_from_slice(b"ISA   ");
    body.extend_from_slice(&[ENTRY_IOAPIC, ioapic_id(vcpus), IOAPIC_VERSION, 1]);
    body.extend_from_slice(&(IOAPIC_ADDR as u32).to_le_bytes());
    for pin in 0..IOAPIC_PINS {
        // Flags 0: polarity and trigger conform to the bus (ISA: edge, high).
        body.extend_from_slice(&[
            ENTRY_IO_INTERRUPT,
            INT_TYPE_INT,
            0,
            0,
            ISA_BUS,
            pin,
            ioapic_id(vcpus),
            pin,
        ]);
    }
    // LINT0 takes the 8259's ExtINT, LINT1 NMIs, on every local APIC (0xff).
    body.extend_from_slice(&[
        ENTRY_LOCAL_INTERRUPT,
        INT_TYPE_EXTINT,
        0,
        0,
        ISA_BUS,
        0,
        0xff,
        0,
    ]);
    body.extend_from_slice(&[
        ENTRY_LOCAL_INTERRUPT,
        INT_TYPE_NMI,
        0,
        0,
        ISA_BUS,
        0,
        0xff,
        1,
    ]);

    let mut header = Vec::with_capacity(HEADER_LEN);
    header.extend_from_slice(b"PCMP");
    header.extend_from_slice(&(table_len as u16).to_le_bytes());
    header.push(SPEC_REV);
    header.push(0); // checksum, below
    header.extend_from_slice(b"PERFBED ");
    header.extend_from_slice(b"perfbed-vmm ");
    header.extend_from_slice(&0u32.to_le_bytes()); // no OEM table
    header.extend_from_slice(&0u16.to_le_bytes());
    header.extend_from_slice(&(entries as u16).to_le_bytes());
    header.extend_from_slice(&(LAPIC_ADDR as u32).to_le_bytes());
    header.extend_from_slice(&[0; 4]); // no extended table
    let mut table = header;
    table.extend_from_slice(&body);
    table[7] = checksum_complement(&table);

    let mut image = table;
    image.resize((MP_FLOATING_ADDR - MPTABLE_ADDR) as usize, 0);
    image.extend_from_slice(&floating);
    image.resize((BASE_MEMORY_END - MPTABLE_ADDR) as usize, 0);
    Ok(image)
}

/// The byte that makes `bytes` sum to zero (mod 256).
fn checksum_complement(bytes: &[u8]) -> u8 {
    let sum = bytes.iter().fold(0u8, |acc, b| acc.wrapping_add(*b));
    0u8.wrapping_sub(sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MAX_VCPUS;

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |acc, b| acc.wrapping_add(*b))
    }

    fn u16_at(b: &[u8], at: usize) -> usize {
        usize::from(u16::from_le_bytes([b[at], b[at + 1]]))
    }

    /// The floating pointer (where the kernel scans) and the table it
    /// points to.
    fn parts(image: &[u8]) -> (&[u8], &[u8]) {
        let at = (MP_FLOATING_ADDR - MPTABLE_ADDR) as usize;
        let floating = &image[at..at + FLOATING_LEN];
        let pointer = u64::from(u32::from_le_bytes(floating[4..8].try_into().unwrap()));
        let start = (pointer - MPTABLE_ADDR) as usize;
        let table = &image[start..];
        (floating, &table[..u16_at(table, 4)])
    }

    #[test]
    fn checksums_are_zero_and_lengths_agree() {
        for vcpus in [1, 2, 4, 8, 32, MAX_VCPUS] {
            let image = build(vcpus).unwrap();
            assert_eq!(
                image.len() as u64,
                BASE_MEMORY_END - MPTABLE_ADDR,
                "the image fills the reserved range"
            );
            let (floating, table) = parts(&image);
            assert_eq!(&floating[..4], b"_MP_");
            assert_eq!(sum(floating), 0, "floating pointer, {vcpus} vCPUs");
            assert_eq!(&table[..4], b"PCMP");
            assert_eq!(sum(table), 0, "configuration table, {vcpus} vCPUs");
            assert_eq!(
                u16_at(table, 34),
                usize::from(vcpus) + 28,
                "entry count, {vcpus} vCPUs"
            );
            assert!(MPTABLE_ADDR as usize + table.len() <= MP_FLOATING_ADDR as usize);
        }
    }

    #[test]
    fn every_vcpu_has_its_apic_id_and_the_ioapic_the_next() {
        let image = build(MAX_VCPUS).unwrap();
        let (_, table) = parts(&image);
        let cpus: Vec<u8> = (0..usize::from(MAX_VCPUS))
            .map(|i| table[HEADER_LEN + i * CPU_ENTRY_LEN + 1])
            .collect();
        assert_eq!(cpus, (0..MAX_VCPUS).collect::<Vec<_>>());
        let ioapic = HEADER_LEN + usize::from(MAX_VCPUS) * CPU_ENTRY_LEN + SMALL_ENTRY_LEN;
        assert_eq!(
            (table[ioapic], table[ioapic + 1]),
            (ENTRY_IOAPIC, MAX_VCPUS)
        );
    }

    #[test]
    fn entries_describe_the_cpus_and_ioapic() {
        let image = build(4).unwrap();
        let (_, table) = parts(&image);
        let mut at = HEADER_LEN;
        let mut cpus = Vec::new();
        let (mut ioapics, mut io_ints, mut local_ints, mut count) = (0, 0, 0, 0);
        while at < table.len() {
            count += 1;
            match table[at] {
                ENTRY_PROCESSOR => {
                    cpus.push((table[at + 1], table[at + 3]));
                    at += CPU_ENTRY_LEN;
                    continue;
                }
                ENTRY_IOAPIC => {
                    assert_eq!(table[at + 1], 4, "the IOAPIC's ID follows the CPUs'");
                    ioapics += 1;
                }
                ENTRY_IO_INTERRUPT => {
                    assert_eq!(table[at + 5], table[at + 7], "ISA IRQ n is pin n");
                    io_ints += 1;
                }
                ENTRY_LOCAL_INTERRUPT => local_ints += 1,
                ENTRY_BUS => assert_eq!(&table[at + 2..at + 8], b"ISA   "),
                other => panic!("unknown entry type {other} at {at}"),
            }
            at += SMALL_ENTRY_LEN;
        }
        assert_eq!(at, table.len());
        assert_eq!(count, u16_at(table, 34));
        assert_eq!(cpus, vec![(0, 3), (1, 1), (2, 1), (3, 1)]);
        assert_eq!((ioapics, io_ints, local_ints), (1, 24, 2));
    }

    #[test]
    fn sizes_that_do_not_fit_are_refused() {
        assert_eq!(build(0), Err(MpTableError::NoCpus));
        assert_eq!(build(141), Err(MpTableError::TooLarge(141)));
        assert!(build(140).is_ok());
    }
}
