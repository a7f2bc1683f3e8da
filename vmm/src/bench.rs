//! The exit benchmark: what a device MMIO exit costs against a bare exit,
//! measured with a few guest instructions instead of a kernel.
//!
//! One vCPU in 32-bit protected mode runs
//!
//! ```text
//! 0x1000  mov ecx, N
//! 0x1005  mov eax, [ebx]      ; the exit under test
//! 0x1007  dec ecx
//! 0x1008  jnz 0x1005
//! 0x100a  out 0xf4, al        ; done
//! ```
//!
//! with `%ebx` first at a device register, then at an address nothing
//! claims. The round trip is the wall time per iteration seen from the VMM
//! (exit, handler, re-entry, the loop's three instructions); the handler
//! time is what [`PerfbedMmio`] measures inside the device call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use kvm_bindings::{kvm_regs, KVM_MAX_CPUID_ENTRIES};
use perfbed_device::{regs as device_regs, DeviceConfig, SharedDevice};
use vm_memory::{Bytes, GuestAddress};

use crate::boot::BootEntry;
use crate::builder::{create_vm, write_gdt};
use crate::devices::bus::{Bus, BusDevice};
use crate::devices::perfbed::PerfbedMmio;
use crate::memory::{MMIO_HOLE_START, PERFBED_DEVICE_BASE};
use crate::stats::Stats;
use crate::vcpu::cpuid::Placement;
use crate::vcpu::{Exit, Vcpu, VcpuEnd};
use crate::vmm::VmmError;

const CODE_ADDR: u64 = 0x1000;
const DONE_PORT: u64 = 0xf4;
/// An address in the MMIO hole that no device claims.
pub const UNCLAIMED_ADDR: u64 = MMIO_HOLE_START + 0x1000;

/// Figures from one benchmark.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExitCosts {
    pub iterations: u32,
    /// Wall time per device-register read, exit to exit.
    pub device_round_trip_ns: f64,
    /// Time inside the device per read.
    pub device_handler_ns: f64,
    /// Wall time per read of an unclaimed address.
    pub bare_round_trip_ns: f64,
}

/// The guest program for `iterations` reads of `[ebx]`.
pub fn program(iterations: u32) -> Vec<u8> {
    let mut code = vec![0xb9];
    code.extend_from_slice(&iterations.to_le_bytes());
    code.extend_from_slice(&[
        0x8b,
        0x03,
        0x49,
        0x75,
        0xfb,
        0xe6,
        DONE_PORT as u8,
        0xeb,
        0xfe,
    ]);
    code
}

struct Done(AtomicBool);

impl BusDevice for Done {
    fn read(&self, _: u32, _: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn write(&self, _: u32, _: u64, _: &[u8]) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Runs the program with `%ebx = addr`; the wall time of the run.
fn time_loop(
    vcpu: &mut Vcpu,
    addr: u64,
    io: &Bus,
    mmio: &Bus,
    done: &Done,
    stats: &Stats,
) -> Result<f64, VmmError> {
    let regs = kvm_regs {
        rip: CODE_ADDR,
        rbx: addr,
        rflags: 2,
        ..Default::default()
    };
    vcpu.set_regs(&regs)?;
    done.0.store(false, Ordering::SeqCst);
    let started = Instant::now();
    while !done.0.load(Ordering::SeqCst) {
        match vcpu.step(io, mmio, stats) {
            Exit::Handled => {}
            // No debugger sets guest debugging here.
            Exit::Debug(exit) => {
                return Err(VmmError::VcpuFailed(format!(
                    "the benchmark guest took a debug exit: {exit:?}"
                )))
            }
            Exit::End(VcpuEnd::Reset) => {
                return Err(VmmError::VcpuFailed("the benchmark guest reset".into()))
            }
            Exit::End(VcpuEnd::Failed(why) | VcpuEnd::KvmFailure(why)) => {
                return Err(VmmError::VcpuFailed(why))
            }
            // Only a handle stops a vCPU; the benchmark runs it bare.
            Exit::End(VcpuEnd::Stopped) => {
                return Err(VmmError::VcpuFailed(
                    "the benchmark vCPU was stopped".into(),
                ))
            }
        }
    }
    Ok(started.elapsed().as_nanos() as f64)
}

/// Measures `iterations` device exits and as many bare exits.
pub fn exit_costs(iterations: u32) -> Result<ExitCosts, VmmError> {
    let iterations = iterations.max(1);
    let (kvm, vm, memory) = create_vm(64)?;
    write_gdt(&memory, false)?;
    memory.write_slice(&program(iterations), GuestAddress(CODE_ADDR))?;
    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(|source| VmmError::Kvm {
            what: "reading supported CPUID",
            source,
        })?;
    let mut vcpu = Vcpu::new(
        &vm,
        &supported,
        Placement {
            index: 0,
            vcpus: 1,
            llc_bits: 0,
        },
        false,
    )?;
    vcpu.set_boot_state(&BootEntry::Pvh {
        entry: CODE_ADDR,
        start_info: 0,
    })?;

    let device = SharedDevice::new(DeviceConfig::default())?;
    let perfbed = Arc::new(PerfbedMmio::new(device.clone()));
    let done = Arc::new(Done(AtomicBool::new(false)));
    let mut io = Bus::new("port");
    io.insert("done", DONE_PORT, 1, done.clone())?;
    let mut mmio = Bus::new("MMIO");
    mmio.insert(
        "perfbed device",
        PERFBED_DEVICE_BASE,
        device.size(),
        perfbed.clone(),
    )?;
    let stats = Stats::new(Instant::now());

    let register = PERFBED_DEVICE_BASE + device_regs::REG_MAGIC;
    // Once each to fault in the pages and warm the paths, then measured.
    time_loop(&mut vcpu, register, &io, &mmio, &done, &stats)?;
    time_loop(&mut vcpu, UNCLAIMED_ADDR, &io, &mmio, &done, &stats)?;
    let (before, before_ns) = perfbed.handler_time();
    let device_ns = time_loop(&mut vcpu, register, &io, &mmio, &done, &stats)?;
    let (after, after_ns) = perfbed.handler_time();
    let bare_ns = time_loop(&mut vcpu, UNCLAIMED_ADDR, &io, &mmio, &done, &stats)?;
    let n = f64::from(iterations);
    Ok(ExitCosts {
        iterations,
        device_round_trip_ns: device_ns / n,
        device_handler_ns: (after_ns - before_ns) as f64 / (after - before).max(1) as f64,
        bare_round_trip_ns: bare_ns / n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_loops_back_to_its_read() {
        let code = program(0x1234_5678);
        assert_eq!(code[0], 0xb9);
        assert_eq!(
            u32::from_le_bytes(code[1..5].try_into().unwrap()),
            0x1234_5678
        );
        // jnz's displacement is relative to the next instruction (0x100a).
        let jnz_next = 0x0a_i64;
        assert_eq!(jnz_next + i64::from(code[9] as i8), 0x05);
        assert_eq!(&code[10..12], &[0xe6, DONE_PORT as u8]);
    }

    #[test]
    fn the_unclaimed_address_is_free_even_beside_the_largest_device() {
        let largest = perfbed_device::DeviceConfig {
            domains: vec![vec![0]; 16],
            rmids: 256,
            slots: 32,
            ..Default::default()
        };
        let device = SharedDevice::new(largest).unwrap();
        let mut mmio = Bus::new("MMIO");
        mmio.insert(
            "perfbed device",
            PERFBED_DEVICE_BASE,
            device.size(),
            Arc::new(PerfbedMmio::new(device)),
        )
        .unwrap();
        assert!(!mmio.is_claimed(UNCLAIMED_ADDR, 4));
        assert!(mmio.is_claimed(PERFBED_DEVICE_BASE + device_regs::REG_MAGIC, 8));
    }
}
