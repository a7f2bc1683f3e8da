// SPDX-License-Identifier: GPL-2.0

//! Allowed sets that change at run time: the host changes a domain's `DOM_ALLOWED_CPUS`
//! (`perfbed ctl allowed`) and sets `CONFIG_STATUS_ALLOWED` in `DOM_CONFIG_STATUS`, which raises
//! the domain's interrupt if the line has `IRQ_CTL_CONFIG` (always, placed or parked).
//!
//! **What happens.** The device numbers the sets: `DOM_ALLOWED_GEN` goes one up at each change,
//! and the device checks reads against the set of the generation the driver last wrote to
//! `DOM_ALLOWED_ACK` (it remembers the last 64). Whoever looks first (the interrupt handler, or
//! the poll, which looks too, as the fallback and for hosts without a line) runs
//! [`Domain::check_config`]: if the device is at a generation the domain is not, it reads the set
//! with its generation (generation, set, generation again, until the two agree), stores both,
//! acknowledges that generation and kicks the domain's [`Replacement`], a work. The work brings
//! the domain up to date the same way and calls [`Registration::update_allowed_cpus`]: the perf
//! core runs `filter_allowed_cpus` (which answers from the stored set) and moves the PMU with its
//! events if its CPU is no longer allowed, parks it if no allowed CPU is online, places it if it
//! was parked and one is now. `migrate_cpu` then does what it does on hotplug: the owner register,
//! the slots read on the way out and in, the interrupt's affinity (`irq::follow`).
//!
//! **The last change wins, none is missed.** Every change raises `DOM_CONFIG_STATUS`, and so the
//! line, again; a look that finds the domain behind the device's generation kicks the work, and a
//! kick while the work runs makes it run once more. So after the last change the work runs at
//! least once with the last generation stored, and places the PMU by it.
//!
//! **No read from a CPU the device does not allow.** The device checks a read against exactly the
//! set the driver stored: the store and the acknowledgement happen together under the domain's
//! lock, as every counter read and its `reads_here` check do. From the moment a set is stored the
//! old owner's handler, poll and perf callbacks leave the counters to the device (which keeps
//! counting) if it drops them, and the new owner catches up. A `del` of an event on the old owner
//! in that interval leaves its slot counting, as in a move. (Version 3 acknowledged by reading
//! `DOM_CONFIG_STATUS`, so a change landing between that read and the read of the set made the
//! device check against a set the driver had not seen: 15 changes back to back caught reads out.)
//!
//! **Locking.** [`Domain::check_config`] runs under the domain's raw spinlock (interrupts off),
//! as every counter read and its `reads_here` check do: that is what makes "stored before
//! acknowledged" hold for a read racing on another CPU. `update_allowed_cpus` takes the CPU hotplug lock and the perf core's PMU lock,
//! and sleeps, so it runs in the work (process context), never in the handler. The work holds
//! [`Replacement`]'s mutex around the call; nothing the perf core calls under its locks
//! (`filter_allowed_cpus`, `migrate_cpu`) takes that mutex, so the order is always the mutex,
//! then the hotplug lock, then the PMU lock, then the domain's raw spinlock. The mutex is what
//! lets the module go: [`Replacement::detach`], before the PMU is unregistered, waits for a
//! running work and leaves later ones nothing to call.

use core::ptr::NonNull;

use kernel::prelude::*;
use kernel::sync::{new_mutex, Arc, Mutex};

use crate::hw;
use crate::regs;
use crate::{Domain, DomainHw, DomainPmu};
use core::sync::atomic::Ordering;
use kernel::perf::Registration;

/// A registered PMU, for the work.
///
/// # Invariants
///
/// Points at a live, pinned registration for as long as it is in [`Replacement::pmu`]: it is
/// put there after registration and taken out by [`Replacement::detach`] before the
/// registration is dropped.
struct PmuRef(NonNull<Registration<DomainPmu>>);

// SAFETY: `Registration<DomainPmu>` is `Sync` (and `Send`); the pointer is only dereferenced to a
// shared reference, from whichever thread runs the work.
unsafe impl Send for PmuRef {}

/// The work that places a domain's PMU again after its allowed set changed.
#[pin_data]
pub(crate) struct Replacement {
    /// The domain's PMU, once registered and until the module goes.
    #[pin]
    pmu: Mutex<Option<PmuRef>>,
}

impl Replacement {
    /// A stopped work with no PMU yet; [`Replacement::attach`] gives it one.
    pub(crate) fn new_work() -> Result<hw::Poller<Replacement>> {
        let target = Arc::pin_init(pin_init!(Replacement { pmu <- new_mutex!(None) }), GFP_KERNEL)?;
        // The period is unused: the work runs once per kick (`poll` returns `false`).
        hw::Poller::new(target, 1)
    }

    /// Gives the work its PMU.
    ///
    /// # Safety
    ///
    /// `pmu` must stay registered, pinned where it is, until [`Replacement::detach`] returned.
    pub(crate) unsafe fn attach(&self, pmu: &Registration<DomainPmu>) {
        // INVARIANT: The caller keeps `pmu` alive until `detach`.
        *self.pmu.lock() = Some(PmuRef(NonNull::from(pmu)));
    }

    /// Takes the PMU away, after the work that is running (if any) has finished.
    pub(crate) fn detach(&self) {
        *self.pmu.lock() = None;
    }
}

impl hw::Poll for Replacement {
    fn poll(&self) -> bool {
        let guard = self.pmu.lock();
        let Some(pmu) = &*guard else {
            // Not registered yet (registration kicks the work again) or going away.
            return false;
        };
        // SAFETY: By the type invariant of `PmuRef`, the registration is alive while in `pmu`,
        // and the mutex held keeps `detach` from taking it out meanwhile.
        let pmu = unsafe { pmu.0.as_ref() };
        let domain = pmu.data().domain();
        if domain.park_stop.swap(false, Ordering::Relaxed) {
            // A counter gained half a wrap unread in a park (`irq.rs`): nothing the PMU's
            // placement does below changes that.
            pmu.stop_parked();
        }
        let allowed = domain.read_allowed();
        let before = pmu.cpu();
        match pmu.update_allowed_cpus() {
            // Still where it was (also the kick at registration): nothing to say.
            Ok(()) if pmu.cpu() == before => {}
            Ok(()) => match pmu.cpu() {
                Some(cpu) => pr_info!(
                    "perfbed_l3_{}: allowed CPUs {:#x}, on CPU {}\n",
                    domain.index,
                    allowed,
                    cpu
                ),
                None => pr_info!(
                    "perfbed_l3_{}: allowed CPUs {:#x}, parked (no allowed CPU online)\n",
                    domain.index,
                    allowed
                ),
            },
            Err(e) => pr_warn!(
                "perfbed_l3_{}: allowed CPUs {:#x}: the perf core cannot place the PMU again: \
                 {:?}\n",
                domain.index,
                allowed,
                e
            ),
        }
        false
    }
}

/// Reads domain `index`'s allowed set with its generation: `DOM_ALLOWED_GEN`, then
/// `DOM_ALLOWED_CPUS`, then `DOM_ALLOWED_GEN` again; the same generation twice means the set is
/// that generation's. `None` if the host changed it between the two each of `tries` times.
pub(crate) fn generation(mmio: &hw::Mmio, index: u32, tries: u32) -> Option<(u64, u64)> {
    let reg = |r| regs::domain_reg(index.into(), r);
    for _ in 0..tries {
        let gen = mmio.read(reg(regs::DOM_ALLOWED_GEN));
        let set = mmio.read(reg(regs::DOM_ALLOWED_CPUS));
        if mmio.read(reg(regs::DOM_ALLOWED_GEN)) == gen {
            return Some((gen, set));
        }
    }
    None
}

/// How often [`Domain::sync_allowed`] reads again a set that changed while it read it, before it
/// leaves it to the work (interrupts are off meanwhile).
const SYNC_TRIES: u32 = 8;

impl Domain {
    /// Brings the domain to the device's newest allowed-set generation, if it is not there
    /// already: reads the set with its generation, stores both, and acknowledges the generation
    /// (`DOM_ALLOWED_ACK`), which makes the device check reads against exactly that set. Under
    /// the domain's lock (`_hw`), like every counter read and its `reads_here` check, so no read
    /// of this driver ever falls between the store and the acknowledgement. Returns whether the
    /// stored generation changed, or could not be brought up to date (then nothing changed and
    /// the work tries again).
    fn sync_allowed(&self, _hw: &mut DomainHw) -> bool {
        let known = self.allowed_gen.load(Ordering::Relaxed);
        if self.dev.mmio.read(self.reg(regs::DOM_ALLOWED_GEN)) == known {
            return false;
        }
        if let Some((gen, set)) = generation(&self.dev.mmio, self.index, SYNC_TRIES) {
            self.allowed.store(set, Ordering::Relaxed);
            self.allowed_gen.store(gen, Ordering::Relaxed);
            self.dev.mmio.write(self.reg(regs::DOM_ALLOWED_ACK), gen);
        }
        true
    }

    /// [`Domain::sync_allowed`] from process context; returns the allowed set stored.
    pub(crate) fn read_allowed(&self) -> u64 {
        let mut again = false;
        hw::with_irqs_off(|| again = self.sync_allowed(&mut self.hw.lock()));
        if again && self.dev.mmio.read(self.reg(regs::DOM_ALLOWED_GEN)) != self.allowed_gen.load(Ordering::Relaxed) {
            // Still behind (the host changes faster than a read): once more after this one.
            self.replacement.kick_now();
        }
        self.allowed()
    }

    /// Looks for an allowed-set change and acts on it; returns `DOM_CONFIG_STATUS` as read
    /// (which lowers the line). Safe in atomic context.
    ///
    /// The status only says that something changed; the generation says what: a domain behind
    /// the device's generation is brought up to it ([`Domain::sync_allowed`]) at once, so that
    /// an owner the new set drops stops reading now, and the work is kicked to place the PMU by
    /// it. A change landing after this raises the status, and so the line, again.
    pub(crate) fn check_config(&self, hw: &mut DomainHw) -> u64 {
        let config = self.dev.mmio.read(self.reg(regs::DOM_CONFIG_STATUS));
        if self.sync_allowed(hw) {
            self.replacement.kick_now();
        }
        config
    }

    /// After registration: the work may place the PMU from now on. Kicked once, for a change
    /// that came while the PMU was being registered.
    ///
    /// # Safety
    ///
    /// As for [`Replacement::attach`].
    pub(crate) unsafe fn attach_pmu(&self, pmu: &Registration<DomainPmu>) {
        // SAFETY: By the function requirements.
        unsafe { self.replacement.target().attach(pmu) };
        self.replacement.kick_now();
    }

    /// Before unregistration: no more re-placement.
    pub(crate) fn detach_pmu(&self) {
        self.replacement.target().detach();
    }
}
