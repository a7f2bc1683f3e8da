//! The VM as `gdbstub` sees it: one gdb thread per vCPU (thread `i + 1` is
//! vCPU `i`), registers and memory read through paused vCPUs, software
//! breakpoints in guest memory, continue and single-step per vCPU.
//!
//! Every operation but `resume` runs with all vCPUs paused (gdbstub only
//! handles packets while the target is stopped), so the vCPUs' KVM files
//! are free to use from the stub's thread.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use gdbstub::common::{Signal, Tid};
use gdbstub::stub::MultiThreadStopReason;
use gdbstub::target::ext::base::multithread::{
    MultiThreadBase, MultiThreadResume, MultiThreadResumeOps, MultiThreadSchedulerLocking,
    MultiThreadSchedulerLockingOps, MultiThreadSingleStep, MultiThreadSingleStepOps,
};
use gdbstub::target::ext::base::BaseOps;
use gdbstub::target::ext::breakpoints::{
    Breakpoints as BreakpointsExt, BreakpointsOps, SwBreakpoint, SwBreakpointOps,
};
use gdbstub::target::{Target, TargetError, TargetResult};
use gdbstub_arch::x86::reg::X86_64CoreRegs;
use gdbstub_arch::x86::X86_64_SSE;
use kvm_bindings::{
    kvm_guest_debug, KVM_GUESTDBG_BLOCKIRQ, KVM_GUESTDBG_ENABLE, KVM_GUESTDBG_SINGLESTEP,
    KVM_GUESTDBG_USE_SW_BP,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::breakpoints::Breakpoints;
use super::hub::{Hub, Stop, StopKind};
use super::paging::Paging;
use super::regs;
use crate::devices::bus::Bus;
use crate::vcpu::handle::{HandleError, VcpuControl};
use crate::vcpu::{lock, SharedVcpu};

/// How long a vCPU may take to leave the guest and park.
const PAUSE_PATIENCE: Duration = Duration::from_secs(5);
const PAGE: u64 = 4096;

/// Why the stub could not do what gdb asked (a fatal error ends the
/// session; gdb is told of the others as `E` replies).
#[derive(Debug, thiserror::Error)]
pub enum TargetFailure {
    #[error("vCPU {vcpu}: {what}: {source}")]
    Kvm {
        vcpu: usize,
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error(transparent)]
    Handle(#[from] HandleError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Continue,
    Step,
}

/// The VM behind the stub.
pub struct VmTarget {
    vcpus: Vec<SharedVcpu>,
    controls: Vec<Arc<VcpuControl>>,
    memory: GuestMemoryMmap,
    mmio: Arc<Bus>,
    pub(super) hub: Arc<Hub>,
    breakpoints: Breakpoints,
    actions: Vec<Option<Action>>,
    /// gdb asked that the vCPUs without an action stay stopped.
    scheduler_locked: bool,
    /// Whether KVM took `KVM_GUESTDBG_BLOCKIRQ` (no interrupt handler
    /// entered during a step); learned on the first step.
    block_irq: bool,
}

fn kvm(vcpu: usize, what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> TargetFailure {
    move |source| TargetFailure::Kvm { vcpu, what, source }
}

pub fn tid(vcpu: usize) -> Tid {
    Tid::new(vcpu + 1).expect("vCPU index + 1 is never zero")
}

impl VmTarget {
    pub fn new(
        vcpus: Vec<SharedVcpu>,
        controls: Vec<Arc<VcpuControl>>,
        memory: GuestMemoryMmap,
        mmio: Arc<Bus>,
        hub: Arc<Hub>,
    ) -> VmTarget {
        let n = vcpus.len();
        VmTarget {
            vcpus,
            controls,
            memory,
            mmio,
            hub,
            breakpoints: Breakpoints::default(),
            actions: vec![None; n],
            scheduler_locked: false,
            block_irq: true,
        }
    }

    fn vcpu(&self, tid: Tid) -> Result<usize, TargetError<TargetFailure>> {
        let index = tid.get() - 1;
        if index < self.vcpus.len() {
            Ok(index)
        } else {
            Err(TargetError::NonFatal)
        }
    }

    /// Parks every vCPU that has not ended (the guest is stopped for gdb).
    pub fn pause_all(&self) -> Result<(), TargetFailure> {
        for control in &self.controls {
            match control.pause(PAUSE_PATIENCE) {
                Ok(()) | Err(HandleError::Ended { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// gdb went away: no breakpoint, no guest debugging, every vCPU runs.
    pub fn release(&mut self) {
        if let Err(e) = self.pause_all() {
            log::warn!("gdb: pausing the vCPUs to release them: {e}");
        }
        self.breakpoints.clear(&self.memory);
        for (index, vcpu) in self.vcpus.iter().enumerate() {
            if let Err(e) = lock(vcpu).fd().set_guest_debug(&kvm_guest_debug::default()) {
                log::warn!("gdb: vCPU {index}: clearing guest debugging: {e}");
            }
        }
        self.hub.arm(Vec::new(), BTreeSet::new());
        for control in &self.controls {
            let _ = control.resume();
        }
    }

    /// What to tell gdb of a stop the hub queued (the vCPUs paused).
    pub fn stop_reason(stop: Stop) -> MultiThreadStopReason<u64> {
        match stop.kind {
            StopKind::Breakpoint => MultiThreadStopReason::SwBreak(tid(usize::from(stop.vcpu))),
            StopKind::Step => MultiThreadStopReason::SignalWithThread {
                tid: tid(usize::from(stop.vcpu)),
                signal: Signal::SIGTRAP,
            },
        }
    }

    fn paging(&self, index: usize) -> Result<Paging, TargetFailure> {
        let sregs = lock(&self.vcpus[index])
            .fd()
            .get_sregs()
            .map_err(kvm(index, "reading special registers"))?;
        Ok(Paging {
            cr0: sregs.cr0,
            cr3: sregs.cr3,
            cr4: sregs.cr4,
            efer: sregs.efer,
        })
    }

    /// Reads or writes `len` bytes at `gva` as vCPU `index` sees them, a
    /// page at a time: RAM, or the MMIO bus (a device register read by the
    /// debugger, as QEMU's gdbstub does) in accesses of at most 8 bytes.
    /// How many bytes it got to.
    fn access(
        &self,
        index: usize,
        gva: u64,
        len: usize,
        mut each: impl FnMut(Place, usize) -> bool,
    ) -> usize {
        let Ok(paging) = self.paging(index) else {
            return 0;
        };
        let mut done = 0;
        while done < len {
            let at = gva.wrapping_add(done as u64);
            let chunk = ((PAGE - at % PAGE) as usize).min(len - done);
            let Ok(gpa) = paging.translate(&self.memory, at) else {
                break;
            };
            let place = if self.memory.read_obj::<u8>(GuestAddress(gpa)).is_ok() {
                Place::Ram(gpa, chunk)
            } else if self.mmio.is_claimed(gpa, chunk.min(8)) {
                Place::Mmio(gpa, chunk.min(8 - (gpa % 8) as usize))
            } else {
                break;
            };
            let n = match place {
                Place::Ram(_, n) | Place::Mmio(_, n) => n,
            };
            if !each(place, done) {
                break;
            }
            done += n;
        }
        done
    }

    fn set_guest_debug(&mut self, index: usize, step: bool) -> Result<(), TargetFailure> {
        let mut control = 0;
        if !self.breakpoints.is_empty() {
            control |= KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_USE_SW_BP;
        }
        if step {
            control |= KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP;
            if self.block_irq {
                control |= KVM_GUESTDBG_BLOCKIRQ;
            }
        }
        let debug = kvm_guest_debug {
            control,
            ..Default::default()
        };
        let vcpu = lock(&self.vcpus[index]);
        match vcpu.fd().set_guest_debug(&debug) {
            Err(e) if e.errno() == libc::EINVAL && control & KVM_GUESTDBG_BLOCKIRQ != 0 => {
                // Older KVM: steps may enter an interrupt handler.
                log::warn!("gdb: KVM has no KVM_GUESTDBG_BLOCKIRQ; a step may land in an interrupt handler");
                self.block_irq = false;
                let debug = kvm_guest_debug {
                    control: control & !KVM_GUESTDBG_BLOCKIRQ,
                    ..Default::default()
                };
                vcpu.fd()
                    .set_guest_debug(&debug)
                    .map_err(kvm(index, "setting guest debugging"))
            }
            other => other.map_err(kvm(index, "setting guest debugging")),
        }
    }
}

/// Where a piece of an access landed.
#[derive(Debug, Clone, Copy)]
enum Place {
    Ram(u64, usize),
    Mmio(u64, usize),
}

impl Target for VmTarget {
    type Arch = X86_64_SSE;
    type Error = TargetFailure;

    #[inline(always)]
    fn base_ops(&mut self) -> BaseOps<'_, Self::Arch, Self::Error> {
        BaseOps::MultiThread(self)
    }

    #[inline(always)]
    fn support_breakpoints(&mut self) -> Option<BreakpointsOps<'_, Self>> {
        Some(self)
    }
}

impl MultiThreadBase for VmTarget {
    fn read_registers(&mut self, out: &mut X86_64CoreRegs, tid: Tid) -> TargetResult<(), Self> {
        let index = self.vcpu(tid)?;
        let vcpu = lock(&self.vcpus[index]);
        let fd = vcpu.fd();
        let r = fd
            .get_regs()
            .map_err(kvm(index, "reading registers"))
            .map_err(TargetError::Fatal)?;
        let s = fd
            .get_sregs()
            .map_err(kvm(index, "reading special registers"))
            .map_err(TargetError::Fatal)?;
        let f = fd
            .get_fpu()
            .map_err(kvm(index, "reading the FPU"))
            .map_err(TargetError::Fatal)?;
        *out = regs::to_gdb(&r, &s, &f);
        Ok(())
    }

    fn write_registers(&mut self, from: &X86_64CoreRegs, tid: Tid) -> TargetResult<(), Self> {
        let index = self.vcpu(tid)?;
        let vcpu = lock(&self.vcpus[index]);
        let fd = vcpu.fd();
        let mut r = fd
            .get_regs()
            .map_err(kvm(index, "reading registers"))
            .map_err(TargetError::Fatal)?;
        let mut f = fd
            .get_fpu()
            .map_err(kvm(index, "reading the FPU"))
            .map_err(TargetError::Fatal)?;
        regs::from_gdb(from, &mut r, &mut f);
        fd.set_regs(&r)
            .map_err(kvm(index, "setting registers"))
            .map_err(TargetError::Fatal)?;
        fd.set_fpu(&f)
            .map_err(kvm(index, "setting the FPU"))
            .map_err(TargetError::Fatal)?;
        Ok(())
    }

    fn read_addrs(&mut self, start: u64, data: &mut [u8], tid: Tid) -> TargetResult<usize, Self> {
        let index = self.vcpu(tid)?;
        let (memory, mmio) = (&self.memory, &self.mmio);
        let len = data.len();
        let vcpu = index as u32;
        let mut out = vec![0u8; len];
        let n = self.access(index, start, len, |place, at| match place {
            Place::Ram(gpa, n) => memory
                .read_slice(&mut out[at..at + n], GuestAddress(gpa))
                .is_ok(),
            Place::Mmio(gpa, n) => {
                mmio.read(vcpu, gpa, &mut out[at..at + n]);
                true
            }
        });
        if n == 0 && len > 0 {
            return Err(TargetError::NonFatal);
        }
        self.breakpoints.hide(start, &mut out[..n]);
        data[..n].copy_from_slice(&out[..n]);
        Ok(n)
    }

    fn write_addrs(&mut self, start: u64, data: &[u8], tid: Tid) -> TargetResult<(), Self> {
        let index = self.vcpu(tid)?;
        let mut bytes = data.to_vec();
        self.breakpoints.absorb(start, &mut bytes);
        let (memory, mmio) = (&self.memory, &self.mmio);
        let vcpu = index as u32;
        let n = self.access(index, start, bytes.len(), |place, at| match place {
            Place::Ram(gpa, n) => memory
                .write_slice(&bytes[at..at + n], GuestAddress(gpa))
                .is_ok(),
            Place::Mmio(gpa, n) => {
                mmio.write(vcpu, gpa, &bytes[at..at + n]);
                true
            }
        });
        if n < bytes.len() {
            return Err(TargetError::NonFatal);
        }
        Ok(())
    }

    fn list_active_threads(
        &mut self,
        thread_is_active: &mut dyn FnMut(Tid),
    ) -> Result<(), Self::Error> {
        for index in 0..self.vcpus.len() {
            thread_is_active(tid(index));
        }
        Ok(())
    }

    #[inline(always)]
    fn support_resume(&mut self) -> Option<MultiThreadResumeOps<'_, Self>> {
        Some(self)
    }
}

impl MultiThreadResume for VmTarget {
    fn resume(&mut self) -> Result<(), Self::Error> {
        let stepping: BTreeSet<u8> = (0..self.vcpus.len())
            .filter(|&i| self.actions[i] == Some(Action::Step))
            .map(|i| i as u8)
            .collect();
        for index in 0..self.vcpus.len() {
            self.set_guest_debug(index, stepping.contains(&(index as u8)))?;
        }
        self.hub.arm(self.breakpoints.addresses(), stepping);
        for (index, control) in self.controls.iter().enumerate() {
            if self.actions[index].is_some() || !self.scheduler_locked {
                match control.resume() {
                    Ok(()) | Err(HandleError::Ended { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    fn clear_resume_actions(&mut self) -> Result<(), Self::Error> {
        self.actions.fill(None);
        self.scheduler_locked = false;
        Ok(())
    }

    fn set_resume_action_continue(
        &mut self,
        tid: Tid,
        _signal: Option<Signal>,
    ) -> Result<(), Self::Error> {
        // A signal means nothing to a kernel: it is dropped, as QEMU does.
        if let Some(action) = self.actions.get_mut(tid.get() - 1) {
            *action = Some(Action::Continue);
        }
        Ok(())
    }

    #[inline(always)]
    fn support_single_step(&mut self) -> Option<MultiThreadSingleStepOps<'_, Self>> {
        Some(self)
    }

    #[inline(always)]
    fn support_scheduler_locking(&mut self) -> Option<MultiThreadSchedulerLockingOps<'_, Self>> {
        Some(self)
    }
}

impl MultiThreadSingleStep for VmTarget {
    fn set_resume_action_step(
        &mut self,
        tid: Tid,
        _signal: Option<Signal>,
    ) -> Result<(), Self::Error> {
        if let Some(action) = self.actions.get_mut(tid.get() - 1) {
            *action = Some(Action::Step);
        }
        Ok(())
    }
}

impl MultiThreadSchedulerLocking for VmTarget {
    fn set_resume_action_scheduler_lock(&mut self) -> Result<(), Self::Error> {
        self.scheduler_locked = true;
        Ok(())
    }
}

impl BreakpointsExt for VmTarget {
    #[inline(always)]
    fn support_sw_breakpoint(&mut self) -> Option<SwBreakpointOps<'_, Self>> {
        Some(self)
    }
}

impl SwBreakpoint for VmTarget {
    fn add_sw_breakpoint(&mut self, addr: u64, _kind: usize) -> TargetResult<bool, Self> {
        // Kernel text is mapped alike on every vCPU: vCPU 0's tables do.
        let paging = self.paging(0).map_err(TargetError::Fatal)?;
        let Ok(gpa) = paging.translate_text(&self.memory, addr) else {
            return Ok(false);
        };
        Ok(self.breakpoints.insert(&self.memory, addr, gpa).is_ok())
    }

    fn remove_sw_breakpoint(&mut self, addr: u64, _kind: usize) -> TargetResult<bool, Self> {
        Ok(self.breakpoints.remove(&self.memory, addr))
    }
}
