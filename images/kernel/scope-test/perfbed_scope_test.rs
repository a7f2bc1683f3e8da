// SPDX-License-Identifier: GPL-2.0

//! perfbed_scope_test: a probe for device-scope perf PMUs.
//!
//! Registers two `PERF_PMU_SCOPE_DEVICE` PMUs with fixed sets of allowed CPUs, and one core-scope
//! PMU, meant for a 4-CPU guest:
//!
//! - `perfbed_scope_a`, counted on CPU 1 or 2;
//! - `perfbed_scope_b`, counted on CPU 3;
//! - `perfbed_scope_core`, an ordinary core-scope PMU (one CPU per core in its
//!   `cpumask`), which must behave as before the device-scope patch.
//!
//! Each has one counting-only event, `events/cpu` (`event=0x01`, with `format/event` at
//! `config:0-7`). A device-scope PMU has one counter: a group may hold one of its events
//! ([`Pmu::check_group`]), and its counter files `live_events` (events its `event_init` accepted
//! and its `event_destroy` has not released yet) and `groups_refused` show that a refused group
//! member is released all the same. Reading such an event sets its count to the number of the
//! CPU the read runs on plus one. The perf core reads an active CPU-bound event on the CPU it
//! counts on, so userspace sees where the event really is: its value is the PMU's `cpumask` CPU
//! plus one.
//!
//! One more event, not listed in `events/` (so no tool that walks a PMU's events meets it): on
//! `perfbed_scope_core`, `config=0x02` makes the PMU's `add` spin for good. The perf core calls
//! `add` with interrupts disabled on the event's CPU (in the IPI that installs a CPU-bound event
//! there), so opening such an event on CPU `n` leaves CPU `n` running with interrupts off in
//! [`spin_with_interrupts_off`] until the VM is killed: the testbed's hang on purpose, for the
//! harness's capture of the vCPUs (the `hang_capture` VM tests). Nothing else opens it.
//!
//! Like a real device, a device-scope PMU here is only read on the CPU the perf core placed it
//! on (which `migrate_cpu` tells it, before the events move): reads elsewhere, while an event is
//! in transit or waits on another CPU while its PMU is parked, leave the count alone. So a parked
//! event keeps the value of the CPU it last counted on, and reads the new one once its PMU is
//! placed again.

use kernel::c_str;
use kernel::perf::{
    self, Capabilities, CpuMask, Event, EventAttr, Flags, FormatAttr, Group, HwState, Options,
    Pmu, Registration, ScheduledEvent, Scope, TaskContext,
};
use kernel::prelude::*;

use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

module! {
    type: ScopeTest,
    name: "perfbed_scope_test",
    author: "perfbed developers",
    description: "Test probe for device-scope perf PMUs",
    license: "GPL",
}

/// The only listed event: `config` selects it in bits 0-7.
const EVENT_CPU: u64 = 0x01;
/// The core-scope PMU's unlisted event whose `add` never returns.
const EVENT_SPIN: u64 = 0x02;
const EVENT_MASK: u64 = 0xff;

/// Set once every test PMU is registered: until then no event can be created, so a failing
/// `init` drops registrations that have none.
static READY: AtomicBool = AtomicBool::new(false);

static EVENTS: [EventAttr<'static>; 1] = [EventAttr::new(c_str!("cpu"), c_str!("event=0x01"))];
static FORMATS: [FormatAttr<'static>; 1] = [FormatAttr::new(c_str!("event"), c_str!("config:0-7"))];
/// The counter files of a device-scope test PMU, in the order of [`ScopePmu::counter`].
static SCOPE_COUNTERS: [&CStr; 2] = [c_str!("live_events"), c_str!("groups_refused")];

/// The probe's behaviour, shared by every test PMU: reading an event sets its
/// count to the CPU the read runs on, plus one.
mod probe {
    use super::*;

    /// Sets the count to this CPU plus one, if `here` says this CPU may read the PMU.
    pub(super) fn update(event: &Event, here: bool) {
        if here {
            event.count().set(u64::from(perf::current_cpu()) + 1);
        }
    }

    /// Accepts a counting event of this PMU whose `config` is one of `known`.
    pub(super) fn event_init(event: &Event, known: &[u64]) -> Result {
        if event.attr_type() != event.pmu_type() {
            return Err(ENOENT);
        }
        if !READY.load(Ordering::Acquire) {
            return Err(ENODEV);
        }
        if event.is_sampling() {
            return Err(EOPNOTSUPP);
        }
        if event.config() & !EVENT_MASK != 0 || !known.contains(&(event.config() & EVENT_MASK)) {
            return Err(EINVAL);
        }
        // The perf core refuses these for device-scope PMUs already.
        if event.is_per_task() {
            return Err(EINVAL);
        }
        event.set_hw_state(HwState::STOPPED | HwState::UPTODATE);
        Ok(())
    }

    pub(super) fn add(event: &Event, flags: Flags) -> Result {
        event.set_hw_state(HwState::STOPPED | HwState::UPTODATE);
        if flags.contains(Flags::START) {
            start(event);
        }
        Ok(())
    }

    pub(super) fn start(event: &Event) {
        event.set_hw_state(HwState::empty());
    }

    pub(super) fn stop(event: &Event, flags: Flags, here: bool) {
        let mut state = event.hw_state();
        if flags.contains(Flags::UPDATE) && !state.contains(HwState::UPTODATE) {
            update(event, here);
            state = state | HwState::UPTODATE;
        }
        event.set_hw_state(state | HwState::STOPPED);
    }
}

/// Spins for good. Called by [`CorePmu`]'s `add`, which the perf core runs with interrupts
/// disabled, so the CPU never takes another interrupt: a hang on purpose (see the module's
/// documentation). Not inlined, so that the hung CPU's RIP names it.
#[inline(never)]
fn spin_with_interrupts_off() -> ! {
    loop {
        core::hint::spin_loop();
    }
}

/// The callbacks every test PMU shares: the probe's. (Only the optional
/// callbacks differ between the PMUs, and `#[vtable]` needs those spelled out;
/// each writes its own `add`.)
macro_rules! probe_callbacks {
    () => {
        fn del(&self, event: &ScheduledEvent, _flags: Flags) {
            probe::stop(event, Flags::UPDATE, self.reads_here());
        }

        fn start(&self, event: &Event, _flags: Flags) {
            probe::start(event);
        }

        fn stop(&self, event: &Event, flags: Flags) {
            probe::stop(event, flags, self.reads_here());
        }

        fn read(&self, event: &Event) {
            probe::update(event, self.reads_here());
        }
    };
}

/// A device-scope test PMU: its name, the CPUs it may be counted on, and the one it is counted
/// on now (-1 while parked).
struct ScopePmu {
    name: &'static CStr,
    allowed: &'static [u32],
    cpu: AtomicI32,
    /// Events `event_init` accepted that `event_destroy` has not released yet.
    live: AtomicU64,
    /// Group members `check_group` refused.
    refused: AtomicU64,
}

impl ScopePmu {
    fn new(name: &'static CStr, allowed: &'static [u32]) -> Self {
        ScopePmu {
            name,
            allowed,
            cpu: AtomicI32::new(-1),
            live: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    fn reads_here(&self) -> bool {
        i64::from(self.cpu.load(Ordering::Relaxed)) == i64::from(perf::current_cpu())
    }
}

#[vtable]
impl Pmu for ScopePmu {
    probe_callbacks!();

    fn add(&self, event: &ScheduledEvent, flags: Flags) -> Result {
        probe::add(event, flags)
    }

    fn event_init(&self, event: &Event) -> Result {
        probe::event_init(event, &[EVENT_CPU])?;
        self.live.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// One counter: a group holds at most one of this PMU's events.
    fn check_group(&self, event: &Event, group: &Group<'_>) -> Result {
        if group.members().any(|member| member.is_of_pmu(event)) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(EINVAL);
        }
        Ok(())
    }

    fn event_destroy(&self, _event: &Event) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }

    fn counter(&self, index: usize) -> u64 {
        match index {
            0 => self.live.load(Ordering::Relaxed),
            _ => self.refused.load(Ordering::Relaxed),
        }
    }

    fn filter_allowed_cpus(&self, cpus: &mut CpuMask) -> Result {
        cpus.and_cpus(self.allowed);
        Ok(())
    }

    fn migrate_cpu(&self, cpu: Option<u32>) {
        // CAST: CPU numbers are below `NR_CPUS`, far below `i32::MAX`.
        self.cpu.store(cpu.map_or(-1, |cpu| cpu as i32), Ordering::Relaxed);
        match cpu {
            Some(cpu) => pr_info!("{}: now counting on CPU {}\n", self.name, cpu),
            None => pr_info!("{}: parked\n", self.name),
        }
    }
}

/// A test PMU of an existing topology scope (one CPU per core), to check
/// that the device-scope patch leaves those scopes as they were.
struct CorePmu;

impl CorePmu {
    /// Read wherever the perf core runs it.
    fn reads_here(&self) -> bool {
        true
    }
}

#[vtable]
impl Pmu for CorePmu {
    probe_callbacks!();

    fn add(&self, event: &ScheduledEvent, flags: Flags) -> Result {
        if event.config() & EVENT_MASK == EVENT_SPIN {
            spin_with_interrupts_off();
        }
        probe::add(event, flags)
    }

    fn event_init(&self, event: &Event) -> Result {
        probe::event_init(event, &[EVENT_CPU, EVENT_SPIN])
    }
}

/// Registers the test PMU `name` with `scope`.
///
/// # Safety
///
/// As for [`Registration::new`]: the registration must not be dropped while events of the PMU
/// can exist.
unsafe fn register<T: Pmu>(
    module: &'static ThisModule,
    name: &'static CStr,
    scope: Scope,
    counters: &'static [&'static CStr],
    pmu: T,
) -> Result<Pin<KBox<Registration<T>>>> {
    let options = Options {
        name,
        scope,
        capabilities: Capabilities::NO_INTERRUPT,
        task_context: TaskContext::Invalid,
        events: &EVENTS,
        formats: &FORMATS,
        counters,
        unread_limit_ns: 0,
    };
    // SAFETY: The caller guarantees what `Registration::new` requires.
    let pmu = KBox::pin_init(unsafe { Registration::new(module, &options, pmu) }, GFP_KERNEL)?;
    match pmu.cpu() {
        Some(cpu) => pr_info!("{}: type {}, on CPU {}\n", name, pmu.pmu_type(), cpu),
        None => pr_info!("{}: type {}\n", name, pmu.pmu_type()),
    }
    Ok(pmu)
}

struct ScopeTest {
    _a: Pin<KBox<Registration<ScopePmu>>>,
    _b: Pin<KBox<Registration<ScopePmu>>>,
    _core: Pin<KBox<Registration<CorePmu>>>,
}

impl kernel::Module for ScopeTest {
    fn init(module: &'static ThisModule) -> Result<Self> {
        let a = c_str!("perfbed_scope_a");
        let b = c_str!("perfbed_scope_b");
        // SAFETY: Until `READY` is set below, `event_init` refuses every event, so if a later
        // registration fails, those dropped have none. After that the registrations live until
        // the module's exit, and every event holds a reference on the module.
        let test = unsafe {
            ScopeTest {
                _a: register(module, a, Scope::Device, &SCOPE_COUNTERS, ScopePmu::new(a, &[1, 2]))?,
                _b: register(module, b, Scope::Device, &SCOPE_COUNTERS, ScopePmu::new(b, &[3]))?,
                _core: register(module, c_str!("perfbed_scope_core"), Scope::Core, &[], CorePmu)?,
            }
        };
        READY.store(true, Ordering::Release);
        Ok(test)
    }
}
