// SPDX-License-Identifier: GPL-2.0

//! Allowed sets that change at run time: the host changes a domain's `DOM_ALLOWED_CPUS`
//! (`perfbed ctl allowed`) and sets `CONFIG_STATUS_ALLOWED` in `DOM_CONFIG_STATUS`, which raises
//! the domain's interrupt if the line has `IRQ_CTL_CONFIG` (always, placed or parked).
//!
//! **What happens.** Whoever looks first (the interrupt handler, or the poll, which looks too, as
//! the fallback and for hosts without a line) runs [`Domain::check_config`]: it stores the new
//! `DOM_ALLOWED_CPUS` at once, acknowledges the status and kicks the domain's [`Replacement`],
//! a work.
//! The work reads the register again (the last change wins when several come close together),
//! stores it and calls [`Registration::update_allowed_cpus`]: the perf core runs
//! `filter_allowed_cpus` (which answers from the stored set) and moves the PMU with its events
//! if its CPU is no longer allowed, parks it if no allowed CPU is online, places it if it was
//! parked and one is now. `migrate_cpu` then does what it does on hotplug: the owner register,
//! the slots read on the way out and in, the interrupt's affinity (`irq::follow`).
//!
//! **No read from a CPU the device no longer allows.** The device checks reads against the new
//! set from the moment the driver reads `DOM_CONFIG_STATUS` (until then against the set the
//! driver was placed by). [`Domain::check_config`] stores the new set *before* that read, and
//! `reads_here` asks it, so from then on the old owner's handler, poll and perf callbacks leave
//! the counters to the device (which keeps counting) and the new owner catches up: no read is
//! ever checked against a set the driver does not know. (Only a second change landing between
//! the two register reads, microseconds apart, could still catch one read out; the device
//! flags it and the driver ignores the value.) A `del` of an event on the old owner in that
//! interval leaves its slot counting, as in a move.
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

impl Domain {
    /// Stores `DOM_ALLOWED_CPUS` as the set the domain is placed by, and returns it. Under the
    /// domain's lock (`_hw`), like every counter read and its `reads_here` check: a read on the
    /// owner either comes before the store (and before the acknowledgement, so the device still
    /// checks it against the old set) or sees the new set; and two of these never store out of
    /// the order they read in.
    fn store_allowed(&self, _hw: &mut DomainHw) -> u64 {
        let allowed = self.dev.mmio.read(self.reg(regs::DOM_ALLOWED_CPUS));
        self.allowed.store(allowed, core::sync::atomic::Ordering::Relaxed);
        allowed
    }

    /// [`Domain::store_allowed`] from process context.
    pub(crate) fn read_allowed(&self) -> u64 {
        let mut allowed = 0;
        hw::with_irqs_off(|| allowed = self.store_allowed(&mut self.hw.lock()));
        allowed
    }

    /// Looks for an allowed-set change and acts on it; returns `DOM_CONFIG_STATUS` as read.
    /// Safe in atomic context.
    ///
    /// `DOM_ALLOWED_CPUS` is read and stored *before* `DOM_CONFIG_STATUS`: the device checks
    /// reads against the new set only once that status is read (acknowledged), so by then no
    /// CPU of this driver reads by the old one. Both registers may be read from any CPU.
    pub(crate) fn check_config(&self, hw: &mut DomainHw) -> u64 {
        let known = self.allowed();
        if self.store_allowed(hw) != known {
            // Seen before the status says so: stop reading from an owner it drops, now.
            self.replacement.kick_now();
        }
        let config = self.dev.mmio.read(self.reg(regs::DOM_CONFIG_STATUS));
        if config & regs::CONFIG_STATUS_ALLOWED != 0 {
            // A change between the two reads is stored now; the work reads the set again too.
            self.store_allowed(hw);
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
