// SPDX-License-Identifier: GPL-2.0

//! The device's interrupts: one line per domain, announced on the command line after the
//! registers (`perfbed.device=<size>@<base>:<gsi>,<gsi>...`, domain `d`'s GSI the `d`-th; a
//! domain without one is polled only, as on a host without interrupts).
//!
//! **What the line is for.** The device raises a domain's line when a slot counted half a wrap
//! since it was last read (threshold mode, `DOM_IRQ_THRESHOLD` = an eighth of a wrap), and when
//! the host changed the domain's allowed CPUs (`allowed.rs`: a work asks the perf core to place
//! the PMU again). The handler folds every held slot on the owner,
//! which re-arms the threshold: under any rate the counters are read before they can wrap twice,
//! without waiting for the poll. The poll stays as the fallback, [`POLL_FACTOR`] times slower
//! for a domain with a line (at the device's maximum rate still more often than a counter
//! wraps), and at its usual period for a domain without one.
//!
//! **x86 moves an edge interrupt lazily.** Without interrupt remapping an IOAPIC line's new
//! affinity takes effect when its next interrupt is acknowledged on the old target: after a
//! move the first interrupt may still arrive on the old CPU, if it is online. The handler sees
//! that it is not the owner, counts it (`irqs_off_owner`) and leaves the status to the owner's
//! poll; every later one arrives on the owner.
//!
//! **The handler must run on the owner.** `DOM_IRQ_STATUS` is counter data: the device answers
//! a read off the owner with `COUNTER_ERROR` and counts a placement violation. So the line's
//! affinity follows the PMU: [`follow`], from `migrate_cpu`, points it at the new owner after
//! the owner register changed, and on a park at the online CPUs outside the domain (its own are
//! going or gone) with the overflow interrupt disabled in `DOM_IRQ_CTL` (nobody may read the counters; the configuration interrupt stays
//! on, since an allowed-set change is what may end the park). The handler checks that it runs on
//! the owner (under the domain's lock, which `migrate_cpu` takes to change the owner) before it
//! touches the status; an interrupt that was already on its way to the old owner when the PMU
//! moved is counted (`irqs_off_owner`) and left to the owner's next poll, which acks the status
//! too, so no edge is lost.
//!
//! **Locking.** `migrate_cpu` runs in the perf core's hotplug callbacks and in
//! `perf_pmu_register`, under `pmus_lock` (a mutex), in the cpuhp thread with the hotplug lock
//! held for writing, interrupts on. [`follow`] calls `irq_set_affinity()` there, which takes
//! only the descriptor's raw lock (no `cpus_read_lock()`, which would deadlock against the
//! hotplug writer; on a park the glue allocates a cpumask with `GFP_KERNEL`, which the cpuhp
//! thread may), and never with the domain's raw spinlock held: the handler
//! takes the domain's lock with the descriptor's lock released (the IRQ core drops it around the
//! action), so the two are never nested in either order. On a CPU going offline the perf core
//! moves the PMU at `CPUHP_AP_PERF_ONLINE`, before `fixup_irqs()` would move the line off the
//! dying CPU to a CPU of its own choosing: the affinity the driver set is in place by then.
//! `free_irq` (in [`Line`]'s drop) waits for a running handler before the domain can go.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kernel::ffi::{c_char, c_int, c_uint, c_void};
use kernel::prelude::*;
use kernel::sync::Arc;

use crate::regs;
use crate::Domain;

/// Each domain's GSI, as announced (`None`: the domain has no line).
#[derive(Clone, Copy)]
pub(crate) struct Gsis {
    gsis: [Option<u32>; regs::MAX_DOMAINS as usize],
}

impl Gsis {
    /// No domain has a line.
    pub(crate) const NONE: Gsis = Gsis { gsis: [None; regs::MAX_DOMAINS as usize] };

    /// Parses the list after the `:` of the parameter: decimal GSIs separated by commas, at most
    /// one per domain the device can have.
    pub(crate) fn parse(text: &[u8]) -> Option<Gsis> {
        let mut gsis = Gsis::NONE;
        for (count, item) in text.split(|&c| c == b',').enumerate() {
            let gsi = parse_decimal(item.trim_ascii())?;
            *gsis.gsis.get_mut(count)? = Some(gsi);
        }
        Some(gsis)
    }

    /// Lines a device tree gave, already Linux IRQs (`of.rs`; 0: the domain has none).
    #[cfg(CONFIG_OF)]
    pub(crate) fn from_irqs(irqs: &[u32]) -> Gsis {
        let mut gsis = Gsis::NONE;
        for (line, &irq) in gsis.gsis.iter_mut().zip(irqs) {
            *line = (irq != 0).then_some(irq);
        }
        gsis
    }

    /// Domain `domain`'s GSI, if it has one.
    pub(crate) fn of(&self, domain: u32) -> Option<u32> {
        self.gsis.get(domain as usize).copied().flatten()
    }
}

/// A decimal number that fits a `u32` (a GSI is far below that).
fn parse_decimal(text: &[u8]) -> Option<u32> {
    if text.is_empty() {
        return None;
    }
    text.iter().try_fold(0u32, |value, &c| {
        let digit = (c as char).to_digit(10)?;
        value.checked_mul(10)?.checked_add(digit)
    })
}

/// A domain's interrupt statistics and whether it has a line; the sysfs counter files
/// `irqs_on_owner` and `irqs_off_owner`.
pub(crate) struct DomainIrq {
    /// The domain's line is requested and enabled: the poll acks the status too.
    pub(crate) enabled: AtomicBool,
    /// Interrupts handled on the owner (status read, slots folded).
    pub(crate) on_owner: AtomicU64,
    /// Interrupts that arrived on a CPU that was not the owner (left to the owner's poll).
    pub(crate) off_owner: AtomicU64,
    /// An overflow status is up for an owner to ack: an interrupt taken off the owner left it
    /// for the owner's poll, which then visits the owner even with no slot held, or a parked
    /// threshold raised it, which the placement acks on the new owner.
    pub(crate) ack_owed: AtomicBool,
}

impl DomainIrq {
    pub(crate) const fn new() -> DomainIrq {
        DomainIrq {
            enabled: AtomicBool::new(false),
            on_owner: AtomicU64::new(0),
            off_owner: AtomicU64::new(0),
            ack_owed: AtomicBool::new(false),
        }
    }
}

/// `DOM_IRQ_CTL` while the domain has an owner: both interrupts, threshold mode.
const CTL_PLACED: u64 = regs::IRQ_CTL_OVERFLOW | regs::IRQ_CTL_CONFIG;
/// `DOM_IRQ_CTL` while parked: the same, at the parked threshold. Nobody may read the status:
/// an overflow interrupt there means that a counter could soon wrap unread.
const CTL_PARKED: u64 = regs::IRQ_CTL_OVERFLOW | regs::IRQ_CTL_CONFIG;
/// `DOM_IRQ_CTL` once a park's counters are stopped, or before the line is enabled: only a
/// configuration change counts.
const CTL_CONFIG_ONLY: u64 = regs::IRQ_CTL_CONFIG;

/// `DOM_IRQ_THRESHOLD` while placed: an eighth of a wrap, so that the owner reads a counter long
/// before it could wrap.
fn threshold_placed(domain: &Domain) -> u64 {
    1u64 << (domain.dev.width - 3)
}

/// `DOM_IRQ_THRESHOLD` while parked: half a wrap since the last read. A park whose counters
/// gain less loses nothing and is not stopped; at the device's maximum rate the other half
/// leaves a quarter of a wrap's time for the stop to come.
fn threshold_parked(domain: &Domain) -> u64 {
    1u64 << (domain.dev.width - 1)
}

impl Domain {
    /// The interrupt handler: on the owner, acks the status and folds every held slot.
    fn handle_irq(&self) -> bool {
        let mut hw = self.hw.lock();
        // First, so that an owner the device no longer allows reads nothing (`allowed.rs`).
        let config = self.check_config(&mut hw);
        if hw.owner.is_none() && self.irq.enabled.load(Ordering::Relaxed) {
            self.watch_park(config);
            return true;
        }
        if !self.reads_here(&hw) {
            // A configuration change may come anywhere (the line is pointed away from the
            // domain while parked): only an overflow interrupt has to reach the owner.
            if config == 0 {
                self.irq.off_owner.fetch_add(1, Ordering::Relaxed);
                self.irq.ack_owed.store(true, Ordering::Relaxed);
            }
            return true;
        }
        let status = self.dev.mmio.read(self.reg(regs::DOM_IRQ_STATUS));
        self.sync_held(&mut hw);
        drop(hw);
        self.irq.on_owner.fetch_add(1, Ordering::Relaxed);
        config != 0 || status != 0
    }

    /// An interrupt while parked, off any owner, with the domain's lock held. Nobody may read the
    /// overflow status. Without a configuration change it can only be the overflow: a counter
    /// gained half a wrap unread. The perf core is asked to stop the park's events, which
    /// freezes their counters ([`Pmu::stop`](kernel::perf::Pmu::stop)), and the overflow
    /// interrupt goes off until the placement, so the line drops. With one, the overflow
    /// interrupt is turned off and on again: an overflow status still up raises the line anew,
    /// and the next call sees no configuration change.
    fn watch_park(&self, config: u64) {
        let ctl = self.reg(regs::DOM_IRQ_CTL);
        self.dev.mmio.write(ctl, CTL_CONFIG_ONLY);
        if config == 0 {
            self.irq.ack_owed.store(true, Ordering::Relaxed);
            self.park_stop.store(true, Ordering::Relaxed);
            self.replacement.kick_now();
        } else {
            self.dev.mmio.write(ctl, CTL_PARKED);
        }
    }

    /// At a placement, before the overflow interrupt goes back on: acks on the new owner `cpu` an
    /// overflow status left up (a park stopped by its threshold, where nobody may ack it). Left
    /// up, it would raise the line at once, where x86 may take it off the owner (it moves a
    /// line's target lazily) and leave the ack to a poll; a park that came before that poll
    /// would see the stale status and be stopped from its start.
    pub(crate) fn ack_before_placement(&self, cpu: u32) {
        if !self.irq.ack_owed.load(Ordering::Relaxed) {
            return;
        }
        // An offline owner (`ENXIO`) is left alone: the perf core moves the domain away.
        let _ = crate::hw::on_cpu(cpu, || {
            crate::hw::with_irqs_off(|| {
                let hw = self.hw.lock();
                if self.reads_here(&hw) {
                    self.ack_in_poll();
                }
            });
        });
    }

    /// On the owner with the domain's lock held: acks the overflow status, so that an interrupt
    /// that went elsewhere during a move, or a stopped park's threshold, does not leave the line
    /// up with no edge to come. In the poll and at a park the caller has just read every held
    /// slot; at a placement ([`Domain::ack_before_placement`]) the new owner's read, or the poll
    /// it kicks, follows.
    pub(crate) fn ack_in_poll(&self) {
        if self.irq.enabled.load(Ordering::Relaxed) {
            self.dev.mmio.read(self.reg(regs::DOM_IRQ_STATUS));
            self.irq.ack_owed.store(false, Ordering::Relaxed);
        }
    }
}

/// Points the domain's line at `owner` (`None`: parked), from `migrate_cpu`, after the owner
/// changed; see the module's comment for the locking. A failure is reported (rate-limited) and
/// leaves the poll to keep counts exact.
pub(crate) fn follow(line: &Line, domain: &Domain, owner: Option<u32>) {
    // The overflow interrupt goes off and on again around each change: a status still up
    // (taken off the owner and not acked yet) then raises the line anew at its new target, the
    // new owner, which acks it, or while parked the handler, which stops the park at once.
    let ctl = domain.reg(regs::DOM_IRQ_CTL);
    domain.dev.mmio.write(ctl, CTL_CONFIG_ONLY);
    let result = match owner {
        Some(cpu) => {
            let r = line.set_affinity(cpu);
            domain.dev.mmio.write(domain.reg(regs::DOM_IRQ_THRESHOLD), threshold_placed(domain));
            domain.dev.mmio.write(ctl, CTL_PLACED);
            r
        }
        None => {
            let r = line.set_affinity_away(domain.allowed());
            domain.dev.mmio.write(domain.reg(regs::DOM_IRQ_THRESHOLD), threshold_parked(domain));
            domain.dev.mmio.write(ctl, CTL_PARKED);
            r
        }
    };
    if let Err(e) = result {
        crate::hw::warn_ratelimited!(
            "perfbed_l3_{}: cannot move interrupt {}: {:?}\n",
            domain.index,
            line.irq,
            e
        );
    }
}

/// How many poll periods a domain with a line waits between polls: the device's counters wrap
/// after `POLLS_PER_WRAP` (5) periods at its maximum rate, so the poll alone still reads them
/// every 0.4 wrap if the interrupt never comes (a margin a loaded TCG host needs: at 0.8 wrap,
/// `exact counts` lost wraps with the interrupt broken).
pub(crate) const POLL_FACTOR: u32 = 2;

/// Turns the domain's interrupts on once its line is requested: threshold at an eighth of a
/// wrap, before the slower poll comes at any rate above a third of the maximum.
pub(crate) fn enable(domain: &Domain) {
    domain.dev.mmio.write(domain.reg(regs::DOM_IRQ_THRESHOLD), threshold_placed(domain));
    domain.irq.enabled.store(true, Ordering::Relaxed);
    domain.dev.mmio.write(domain.reg(regs::DOM_IRQ_CTL), CTL_CONFIG_ONLY);
}

/// Turns the domain's interrupts off (before its line is freed).
pub(crate) fn disable(domain: &Domain) {
    domain.dev.mmio.write(domain.reg(regs::DOM_IRQ_CTL), 0);
    domain.irq.enabled.store(false, Ordering::Relaxed);
}

/// `struct perfbed_irq`, opaque to Rust.
#[repr(C)]
struct RawLine {
    _opaque: [u8; 0],
}

// The functions of `irq_glue.c`, as prototyped in `irq_glue.h`.
extern "C" {
    fn perfbed_irq_request(
        irq: c_uint,
        func: unsafe extern "C" fn(*mut c_void) -> bool,
        data: *mut c_void,
        name: *const c_char,
        err: *mut c_int,
    ) -> *mut RawLine;
    fn perfbed_irq_set_affinity(line: *mut RawLine, cpu: c_uint) -> c_int;
    fn perfbed_irq_set_affinity_away(line: *mut RawLine, cpus: u64) -> c_int;
    fn perfbed_irq_free(line: *mut RawLine);
}

/// # Safety
///
/// `data` must be the pointer of a `Domain` kept alive by an `Arc` for the call.
unsafe extern "C" fn handler_callback(data: *mut c_void) -> bool {
    // SAFETY: By the function requirements `data` points at a live `Domain`.
    let domain = unsafe { &*data.cast_const().cast::<Domain>() };
    domain.handle_irq()
}

/// A domain's requested interrupt line; freed on drop.
///
/// # Invariants
///
/// `raw` was returned by `perfbed_irq_request` for `irq` with `handler_callback` and the address
/// of `*domain`, and is freed only by `drop`, before `domain` is released.
pub(crate) struct Line {
    raw: NonNull<RawLine>,
    irq: u32,
    domain: Arc<Domain>,
}

// SAFETY: The glue's functions may be called from any thread; the domain is `Send + Sync`.
unsafe impl Send for Line {}
// SAFETY: As for `Send`; the methods take `&self` and the IRQ core serialises them.
unsafe impl Sync for Line {}

impl Line {
    /// Requests interrupt `irq` for `domain`, named `name` in /proc/interrupts. On x86 the
    /// legacy GSIs the hosts use (below 16) are the IRQs of the same number.
    pub(crate) fn request(irq: u32, domain: Arc<Domain>, name: &CStr) -> Result<Line> {
        let data = core::ptr::from_ref::<Domain>(&domain).cast_mut().cast::<c_void>();
        let mut err: c_int = 0;
        // SAFETY: `perfbed_irq_request` copies `name` and stores `data`, which stays valid while
        // `domain` is held, i.e. until after `perfbed_irq_free` in `drop`; `err` is writable.
        let raw = unsafe { perfbed_irq_request(irq, handler_callback, data, name.as_char_ptr(), &mut err) };
        match NonNull::new(raw) {
            // INVARIANT: `raw` serves `*domain`, which the line holds.
            Some(raw) => Ok(Line { raw, irq, domain }),
            None => Err(Error::from_errno(err)),
        }
    }

    /// The IRQ number.
    pub(crate) fn irq(&self) -> u32 {
        self.irq
    }

    fn set_affinity(&self, cpu: u32) -> Result {
        // SAFETY: By the type invariant `raw` is a live line.
        kernel::error::to_result(unsafe { perfbed_irq_set_affinity(self.raw.as_ptr(), cpu) })
    }

    fn set_affinity_away(&self, cpus: u64) -> Result {
        // SAFETY: By the type invariant `raw` is a live line; the caller is in process context
        // (`migrate_cpu`), where the glue may allocate.
        kernel::error::to_result(unsafe { perfbed_irq_set_affinity_away(self.raw.as_ptr(), cpus) })
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        disable(&self.domain);
        // SAFETY: By the type invariant `raw` is live; `perfbed_irq_free` waits for a running
        // handler and frees it. `domain` is released only after this.
        unsafe { perfbed_irq_free(self.raw.as_ptr()) }
    }
}
