//! A vCPU: its KVM file, its set-up, and the loop that runs it on its own
//! thread, sending every port and MMIO exit to the buses with its index.
//!
//! The boot vCPU (index 0) is put in the boot protocol's state by the VMM;
//! the others wait in KVM for the INIT/SIPI the guest sends through its
//! local APIC, as on hardware.

pub mod cpuid;
pub mod handle;
pub mod regs;
pub mod snapshot;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use kvm_bindings::{CpuId, Msrs};
use kvm_ioctls::{VcpuExit, VcpuFd, VmFd};

use crate::boot::BootEntry;
use crate::devices::bus::Bus;
use crate::memory::{GDT_ADDR, IDT_ADDR};
use crate::stats::Stats;

/// Why a vCPU could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    #[error("vCPU {index}: {what}: {source}")]
    Kvm {
        index: u8,
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("vCPU {index}: KVM took {set} of {wanted} MSRs")]
    Msrs {
        index: u8,
        set: usize,
        wanted: usize,
    },
    #[error("vCPU {index}: building its MSR list failed")]
    MsrList { index: u8 },
    #[error("vCPU {index}: {entries} CPUID entries are more than KVM takes")]
    CpuidList { index: u8, entries: usize },
}

impl VcpuError {
    /// What `map_err` needs for a failed KVM call on vCPU `index` doing `what`.
    fn kvm(index: u8, what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VcpuError {
        move |source| VcpuError::Kvm {
            index,
            what,
            source,
        }
    }
}

pub use handle::VcpuEnd;

/// The exception vector of `int3`.
pub const BREAKPOINT_VECTOR: u32 = 3;
/// The exception vector of a single step's trap.
pub const DEBUG_VECTOR: u32 = 1;

/// What one guest entry came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// An exit the buses handled, or a kick.
    Handled,
    /// A debug exit (`KVM_EXIT_DEBUG`, only while a debugger set
    /// `KVM_SET_GUEST_DEBUG`).
    Debug(DebugExit),
    /// The run is over.
    End(VcpuEnd),
}

/// A `KVM_EXIT_DEBUG`: which exception, at which linear address (for
/// `int3`, the instruction itself: KVM leaves RIP on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DebugExit {
    pub exception: u32,
    pub pc: u64,
}

/// Whoever set the guest debugging (the gdb stub): told of each debug exit
/// on the vCPU's own thread, it says whether the exit is its own (a
/// breakpoint it inserted, a step it asked for), in which case the vCPU
/// parks; any other `int3` goes back to the guest.
pub trait DebugExits: Send + Sync {
    fn claim(&self, vcpu: u8, exit: &DebugExit) -> bool;
}

pub struct Vcpu {
    index: u8,
    fd: VcpuFd,
}

impl Vcpu {
    /// Creates the vCPU at `placement` with CPUID (`supported`, plus the
    /// topology, without the vPMU), the boot MSRs and the LINT pins set.
    pub fn new(
        vm: &VmFd,
        supported: &CpuId,
        placement: cpuid::Placement,
        hide_xsave: bool,
    ) -> Result<Vcpu, VcpuError> {
        let index = placement.index;
        let kvm = |what| VcpuError::kvm(index, what);
        let fd = vm
            .create_vcpu(u64::from(index))
            .map_err(kvm("creating it"))?;
        let mut entries = supported.as_slice().to_vec();
        cpuid::apply_topology(&mut entries, placement);
        if hide_xsave {
            cpuid::hide_xsave(&mut entries);
        }
        if vm.check_extension(kvm_ioctls::Cap::TscDeadlineTimer) {
            cpuid::offer_tsc_deadline(&mut entries);
        }
        let cpuid = CpuId::from_entries(&entries).map_err(|_| VcpuError::CpuidList {
            index,
            entries: entries.len(),
        })?;
        fd.set_cpuid2(&cpuid).map_err(kvm("setting CPUID"))?;
        let entries = regs::boot_msrs();
        let msrs = Msrs::from_entries(&entries).map_err(|_| VcpuError::MsrList { index })?;
        let set = fd.set_msrs(&msrs).map_err(kvm("setting MSRs"))?;
        if set != entries.len() {
            return Err(VcpuError::Msrs {
                index,
                set,
                wanted: entries.len(),
            });
        }
        let mut lapic = fd.get_lapic().map_err(kvm("reading the local APIC"))?;
        regs::set_lint(&mut lapic);
        fd.set_lapic(&lapic)
            .map_err(kvm("setting the local APIC"))?;
        Ok(Vcpu { index, fd })
    }

    /// Puts the boot vCPU at the kernel's entry (the GDT must already be in
    /// guest memory at [`GDT_ADDR`]).
    pub fn set_boot_state(&self, entry: &BootEntry) -> Result<(), VcpuError> {
        let index = self.index;
        let kvm = |what| VcpuError::kvm(index, what);
        let mut sregs = self
            .fd
            .get_sregs()
            .map_err(kvm("reading special registers"))?;
        regs::boot_sregs(&mut sregs, entry, GDT_ADDR, IDT_ADDR);
        self.fd
            .set_sregs(&sregs)
            .map_err(kvm("setting special registers"))?;
        self.fd
            .set_regs(&regs::boot_regs(entry))
            .map_err(kvm("setting registers"))?;
        self.fd
            .set_fpu(&regs::boot_fpu())
            .map_err(kvm("setting the FPU"))?;
        Ok(())
    }

    /// Sets the general registers (the exit benchmark's small programs).
    pub fn set_regs(&self, regs: &kvm_bindings::kvm_regs) -> Result<(), VcpuError> {
        let index = self.index;
        self.fd.set_regs(regs).map_err(|source| VcpuError::Kvm {
            index,
            what: "setting registers",
            source,
        })
    }

    pub fn index(&self) -> u8 {
        self.index
    }

    /// The KVM file, for the debugger's register and debug ioctls (on a
    /// paused vCPU).
    pub fn fd(&self) -> &VcpuFd {
        &self.fd
    }

    /// Gives the `int3` that just exited back to the guest (the kernel's
    /// own, as its text patching uses): KVM delivers it as a software
    /// exception, RIP past the instruction, on the next entry.
    pub fn reinject_breakpoint(&self) -> Result<(), VcpuError> {
        let index = self.index;
        let kvm = |what| VcpuError::kvm(index, what);
        let mut events = self
            .fd
            .get_vcpu_events()
            .map_err(kvm("reading pending events"))?;
        events.exception.injected = 1;
        events.exception.nr = BREAKPOINT_VECTOR as u8;
        events.exception.has_error_code = 0;
        events.exception.error_code = 0;
        self.fd
            .set_vcpu_events(&events)
            .map_err(kvm("injecting #BP"))
    }

    /// Enters the guest once and handles the exit.
    pub fn step(&mut self, io: &Bus, mmio: &Bus, stats: &Stats) -> Exit {
        let vcpu = u32::from(self.index);
        match self.fd.run() {
            Ok(VcpuExit::IoIn(..) | VcpuExit::IoOut(..)) => {
                stats.io_exits.fetch_add(1, Ordering::Relaxed);
                self.port_io(io);
            }
            Ok(VcpuExit::MmioRead(addr, data)) => {
                stats.mmio_exits.fetch_add(1, Ordering::Relaxed);
                mmio.read(vcpu, addr, data);
            }
            Ok(VcpuExit::MmioWrite(addr, data)) => {
                stats.mmio_exits.fetch_add(1, Ordering::Relaxed);
                mmio.write(vcpu, addr, data);
            }
            Ok(VcpuExit::Debug(arch)) => {
                return Exit::Debug(DebugExit {
                    exception: arch.exception,
                    pc: arch.pc,
                })
            }
            Ok(other) => return Exit::End(end_of(vcpu, other)),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {}
            Err(e) => return Exit::End(VcpuEnd::Failed(format!("vCPU {vcpu}: KVM_RUN: {e}"))),
        }
        Exit::Handled
    }

    /// Sends the port I/O exit KVM just made to `io`. A string instruction
    /// (`rep outs`/`rep ins`) exits with `count` accesses of `size` bytes,
    /// which go to the one port one after the other; kvm-ioctls' exit gives
    /// only their bytes, so the size is read from `kvm_run` itself.
    fn port_io(&mut self, io: &Bus) {
        let vcpu = u32::from(self.index);
        let run = self.fd.get_kvm_run();
        if run.exit_reason != kvm_bindings::KVM_EXIT_IO {
            return;
        }
        // SAFETY: the exit reason is KVM_EXIT_IO, so `io` is the member of
        // the union the kernel filled.
        let exit = unsafe { run.__bindgen_anon_1.io };
        let (size, len) = (
            usize::from(exit.size),
            usize::from(exit.size) * exit.count as usize,
        );
        let base = (run as *mut kvm_bindings::kvm_run).cast::<u8>();
        // SAFETY: as in kvm-ioctls' `VcpuFd::run`, which builds the same
        // slice: the kernel puts the data `data_offset` bytes into the
        // vCPU's kvm_run mapping (KVM_GET_VCPU_MMAP_SIZE bytes, mapped for
        // the vCPU's life), `count * size` bytes of it; `self.fd` stays
        // borrowed mutably while the slice lives.
        let data =
            unsafe { std::slice::from_raw_parts_mut(base.add(exit.data_offset as usize), len) };
        let port = u64::from(exit.port);
        if u32::from(exit.direction) == kvm_bindings::KVM_EXIT_IO_OUT {
            io.write_string(vcpu, port, size, data);
        } else {
            io.read_string(vcpu, port, size, data);
        }
    }

    /// The vCPU with the buses it dispatches to, ready for its thread
    /// ([`handle::VcpuHandle::spawn`]); `debugger` is told of its debug
    /// exits.
    pub fn into_runner(
        self,
        io: Arc<Bus>,
        mmio: Arc<Bus>,
        stats: Arc<Stats>,
        debugger: Option<Arc<dyn DebugExits>>,
    ) -> BusRunner {
        // Only a debugger reaches a vCPU from another thread: without one
        // the thread owns its vCPU and takes no lock around an entry.
        let vcpu = match debugger {
            Some(_) => Holder::Shared(Arc::new(Mutex::new(self))),
            None => Holder::Alone(self),
        };
        let first_entry = vcpu.index() == 0;
        BusRunner {
            first_entry,
            vcpu,
            exits: Exits {
                io,
                mmio,
                stats,
                debugger,
            },
        }
    }
}

impl Vcpu {
    /// Reads this vCPU's state (its thread, between entries).
    pub fn snapshot(&self) -> Result<snapshot::VcpuSnapshot, VcpuError> {
        let index = self.index;
        let kvm = |what| VcpuError::kvm(index, what);
        Ok(snapshot::VcpuSnapshot {
            index,
            regs: self.fd.get_regs().map_err(kvm("reading registers"))?,
            sregs: self
                .fd
                .get_sregs()
                .map_err(kvm("reading special registers"))?,
            events: self
                .fd
                .get_vcpu_events()
                .map_err(kvm("reading pending events"))?,
            lapic: self.fd.get_lapic().map_err(kvm("reading the local APIC"))?,
            mp_state: self
                .fd
                .get_mp_state()
                .map_err(kvm("reading the MP state"))?,
        })
    }
}

/// The end of the run a vCPU's exit other than port or MMIO I/O means.
fn end_of(vcpu: u32, exit: VcpuExit) -> VcpuEnd {
    match exit {
        // A triple fault (`reboot=t`'s reset, or a broken guest's).
        VcpuExit::Shutdown => VcpuEnd::Reset,
        // x86 reports no system events without ACPI, but a reset is a
        // reset however it arrives.
        VcpuExit::SystemEvent(..) => VcpuEnd::Reset,
        VcpuExit::Hlt => VcpuEnd::KvmFailure(format!("vCPU {vcpu} halted outside the in-kernel irqchip")),
        VcpuExit::FailEntry(reason, cpu) => VcpuEnd::KvmFailure(format!(
            "vCPU {vcpu}: KVM could not enter the guest (hardware reason {reason:#x}, host CPU {cpu})"
        )),
        VcpuExit::InternalError => {
            VcpuEnd::KvmFailure(format!("vCPU {vcpu}: KVM internal error (emulation failure)"))
        }
        other => VcpuEnd::KvmFailure(format!("vCPU {vcpu}: unexpected exit {other:?}")),
    }
}

/// How a vCPU thread holds its vCPU.
enum Holder {
    /// No debugger: nobody else touches it.
    Alone(Vcpu),
    /// A debugger may reach it while it is paused; the thread locks it for
    /// each entry.
    Shared(SharedVcpu),
}

impl Holder {
    fn index(&self) -> u8 {
        match self {
            Holder::Alone(vcpu) => vcpu.index,
            Holder::Shared(vcpu) => lock(vcpu).index,
        }
    }
}

/// A vCPU its thread runs and a debugger may reach while it is paused.
pub type SharedVcpu = Arc<Mutex<Vcpu>>;

/// Locks a shared vCPU (its thread holds it only inside one entry).
pub fn lock(vcpu: &SharedVcpu) -> MutexGuard<'_, Vcpu> {
    vcpu.lock().unwrap_or_else(|p| p.into_inner())
}

/// A vCPU thread's work: enter the guest, send each exit to the buses.
pub struct BusRunner {
    vcpu: Holder,
    exits: Exits,
    /// The boot vCPU's first entry is timed (the time to the first guest
    /// instruction and the first exit).
    first_entry: bool,
}

/// Where a vCPU's exits go.
struct Exits {
    io: Arc<Bus>,
    mmio: Arc<Bus>,
    stats: Arc<Stats>,
    debugger: Option<Arc<dyn DebugExits>>,
}

impl BusRunner {
    /// The vCPU, for the debugger (its thread takes the lock for each
    /// entry; a paused vCPU's is free); `None` when the runner has no
    /// debugger.
    pub fn shared(&self) -> Option<SharedVcpu> {
        match &self.vcpu {
            Holder::Alone(_) => None,
            Holder::Shared(vcpu) => Some(vcpu.clone()),
        }
    }
}

impl Exits {
    /// Enters the guest once on `vcpu` and handles the exit.
    fn entry(&self, vcpu: &mut Vcpu, first: bool) -> handle::Step {
        if first {
            self.stats.note_first_run();
        }
        let exit = vcpu.step(&self.io, &self.mmio, &self.stats);
        if first {
            self.stats.note_first_exit();
        }
        match exit {
            Exit::Handled => handle::Step::Go,
            Exit::Debug(debug) => self.on_debug_exit(vcpu, &debug),
            Exit::End(end) => handle::Step::End(end),
        }
    }

    fn on_debug_exit(&self, vcpu: &Vcpu, exit: &DebugExit) -> handle::Step {
        if self
            .debugger
            .as_ref()
            .is_some_and(|d| d.claim(vcpu.index, exit))
        {
            return handle::Step::Park;
        }
        if exit.exception == BREAKPOINT_VECTOR {
            if let Err(e) = vcpu.reinject_breakpoint() {
                return handle::Step::End(VcpuEnd::Failed(e.to_string()));
            }
        }
        handle::Step::Go
    }
}

impl handle::Runnable for BusRunner {
    fn step(&mut self) -> handle::Step {
        let first = std::mem::take(&mut self.first_entry);
        match &mut self.vcpu {
            Holder::Alone(vcpu) => self.exits.entry(vcpu, first),
            Holder::Shared(vcpu) => self.exits.entry(&mut lock(vcpu), first),
        }
    }

    fn snapshot(&mut self) -> Result<snapshot::VcpuSnapshot, String> {
        let taken = match &self.vcpu {
            Holder::Alone(vcpu) => vcpu.snapshot(),
            Holder::Shared(vcpu) => lock(vcpu).snapshot(),
        };
        taken.map_err(|e| e.to_string())
    }

    fn immediate_exit(&mut self) -> *mut u8 {
        // The kvm_run page is mapped for the VcpuFd's life, which the
        // runner (alone or with its share of the vCPU) keeps.
        match &mut self.vcpu {
            Holder::Alone(vcpu) => &mut vcpu.fd.get_kvm_run().immediate_exit,
            Holder::Shared(vcpu) => &mut lock(vcpu).fd.get_kvm_run().immediate_exit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resets_end_the_run_as_resets_and_failure_exits_as_kvm_failures() {
        assert_eq!(end_of(0, VcpuExit::Shutdown), VcpuEnd::Reset);
        assert_eq!(
            end_of(
                0,
                VcpuExit::SystemEvent(kvm_bindings::KVM_SYSTEM_EVENT_RESET, &[])
            ),
            VcpuEnd::Reset
        );
        for exit in [
            VcpuExit::FailEntry(0x21, 1),
            VcpuExit::InternalError,
            VcpuExit::Hlt,
            VcpuExit::Debug(Default::default()),
        ] {
            let what = format!("{exit:?}");
            assert!(
                matches!(end_of(2, exit), VcpuEnd::KvmFailure(ref why) if why.starts_with("vCPU 2")),
                "{what}"
            );
        }
        let VcpuEnd::KvmFailure(why) = end_of(0, VcpuExit::FailEntry(0x21, 3)) else {
            unreachable!()
        };
        assert!(
            why.contains("hardware reason 0x21") && why.contains("host CPU 3"),
            "{why}"
        );
    }
}
