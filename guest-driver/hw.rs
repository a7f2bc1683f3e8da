// SPDX-License-Identifier: GPL-2.0

//! Safe wrappers around `glue.c`: the kernel services the driver needs and 6.12's Rust kernel
//! crate has no abstraction for. This is the driver's only `unsafe` code.

use kernel::ffi::{c_char, c_int, c_uint, c_void};
use core::ptr::{self, NonNull};

use kernel::prelude::*;
use kernel::sync::Arc;

/// `struct perfbed_poller`, opaque to Rust.
#[repr(C)]
struct RawPoller {
    _opaque: [u8; 0],
}

// The functions of `glue.c`, as prototyped in `glue.h`.
extern "C" {
    fn perfbed_device_param() -> *const c_char;
    fn perfbed_ioremap(base: u64, size: u64) -> *mut c_void;
    fn perfbed_iounmap(addr: *mut c_void);
    fn perfbed_readq(addr: *const c_void, offset: u64) -> u64;
    fn perfbed_writeq(addr: *mut c_void, offset: u64, value: u64);
    fn perfbed_run_on_cpu(
        cpu: c_uint,
        func: unsafe extern "C" fn(*mut c_void),
        data: *mut c_void,
    ) -> c_int;
    fn perfbed_run_irqs_off(func: unsafe extern "C" fn(*mut c_void), data: *mut c_void);
    fn perfbed_ratelimit() -> bool;
    fn perfbed_poller_create(
        func: unsafe extern "C" fn(*mut c_void) -> bool,
        data: *mut c_void,
        period_ms: c_uint,
    ) -> *mut RawPoller;
    fn perfbed_poller_kick(poller: *mut RawPoller);
    fn perfbed_poller_kick_now(poller: *mut RawPoller);
    fn perfbed_poller_destroy(poller: *mut RawPoller);
    fn perfbed_l3_shared_cpus(cpu: c_uint, shared: *mut u64) -> c_int;
}

/// Returns the `device=` module parameter (empty when not given).
pub(crate) fn device_param() -> &'static CStr {
    // SAFETY: The parameter is a static NUL-terminated buffer of the module that lives as long as
    // the module's code; its sysfs file is read-only (0444), so nothing writes it after load.
    unsafe { CStr::from_char_ptr(perfbed_device_param()) }
}

/// Whether a rate-limited warning may be printed now (one budget for the whole driver).
pub(crate) fn ratelimit() -> bool {
    // SAFETY: `perfbed_ratelimit` only updates a static ratelimit state under its own lock; it
    // may be called from any context.
    unsafe { perfbed_ratelimit() }
}

/// Prints a warning, rate-limited (there is no `pr_warn_ratelimited!` in 6.12's Rust).
macro_rules! warn_ratelimited {
    ($($arg:tt)*) => {
        if $crate::hw::ratelimit() {
            ::kernel::pr_warn!($($arg)*);
        }
    };
}
pub(crate) use warn_ratelimited;

/// A mapped register region: 64-bit registers at 8-byte aligned offsets.
///
/// # Invariants
///
/// `addr` is an `ioremap` mapping of `size` bytes, unmapped only by `drop`.
pub(crate) struct Mmio {
    addr: NonNull<c_void>,
    size: u64,
}

// SAFETY: An MMIO mapping may be used from any CPU and thread; `readq`/`writeq` are single
// accesses that need no locking of their own.
unsafe impl Send for Mmio {}
// SAFETY: As for `Send`: shared use only performs single MMIO accesses.
unsafe impl Sync for Mmio {}

impl Mmio {
    /// Maps `size` bytes of physical address space at `base`.
    pub(crate) fn map(base: u64, size: u64) -> Result<Self> {
        // SAFETY: `ioremap` accepts any range and returns NULL when it cannot map it.
        let addr = unsafe { perfbed_ioremap(base, size) };
        let addr = NonNull::new(addr).ok_or(ENOMEM)?;
        // INVARIANT: `addr` maps `size` bytes.
        Ok(Mmio { addr, size })
    }

    fn in_range(&self, offset: u64) -> bool {
        offset % 8 == 0 && offset.checked_add(8).is_some_and(|end| end <= self.size)
    }

    /// Reads the register at `offset`. Offsets outside the region read as all ones (with both
    /// counter flag bits set), like a bus error, and are never accessed.
    ///
    /// Inlined: a counter read on the owner is this and little else, and under TCG every call
    /// and return is a translation-block lookup.
    #[inline]
    pub(crate) fn read(&self, offset: u64) -> u64 {
        if !self.in_range(offset) {
            return Self::read_outside(offset);
        }
        // SAFETY: By the type invariant `addr` maps `size` bytes, and `offset..offset + 8` is
        // inside them and aligned.
        unsafe { perfbed_readq(self.addr.as_ptr(), offset) }
    }

    /// What a read outside the region gets, with its warning: out of line, never on the way of a
    /// good read.
    #[cold]
    fn read_outside(offset: u64) -> u64 {
        warn_ratelimited!("read outside the registers at {:#x}\n", offset);
        u64::MAX
    }

    /// Writes `value` to the register at `offset`; offsets outside the region are ignored.
    pub(crate) fn write(&self, offset: u64, value: u64) {
        if !self.in_range(offset) {
            warn_ratelimited!("write outside the registers at {:#x}\n", offset);
            return;
        }
        // SAFETY: As in `read`.
        unsafe { perfbed_writeq(self.addr.as_ptr(), offset, value) }
    }
}

impl Drop for Mmio {
    fn drop(&mut self) {
        // SAFETY: By the type invariant `addr` is a live `ioremap` mapping, not used after this.
        unsafe { perfbed_iounmap(self.addr.as_ptr()) }
    }
}

/// Calls the `FnOnce` in the `Option<F>` that `data` points at.
///
/// # Safety
///
/// `data` must point at an `Option<F>` that nothing else accesses during the call.
unsafe extern "C" fn call_once<F: FnOnce()>(data: *mut c_void) {
    // SAFETY: By the function requirements.
    let f = unsafe { &mut *data.cast::<Option<F>>() };
    if let Some(f) = f.take() {
        f();
    }
}

/// Runs `f` on this CPU with interrupts disabled.
///
/// The driver's spinlocks are taken with interrupts off everywhere (the perf callbacks and the
/// poll run in that state), so process context takes them through this.
pub(crate) fn with_irqs_off(f: impl FnOnce()) {
    fn run<F: FnOnce()>(f: F) {
        let mut f = Some(f);
        // SAFETY: `perfbed_run_irqs_off` calls `call_once::<F>` once, synchronously, on `&mut f`,
        // which lives on this stack frame and is not otherwise used during the call.
        unsafe { perfbed_run_irqs_off(call_once::<F>, ptr::from_mut(&mut f).cast()) }
    }
    run(f)
}

/// Runs `f` on `cpu` with interrupts disabled (in an IPI, or directly if `cpu` is this CPU) and
/// waits for it. Fails with `ENXIO` if `cpu` is offline; `f` is then not run.
///
/// Must be called from process context with interrupts enabled.
pub(crate) fn on_cpu(cpu: u32, f: impl FnOnce() + Send) -> Result {
    fn run<F: FnOnce() + Send>(cpu: u32, f: F) -> Result {
        let mut f = Some(f);
        // SAFETY: `smp_call_function_single` with `wait` set calls `call_once::<F>` at most once
        // and returns only after it has finished, so `f`, on this stack frame, outlives the call
        // and is used by one CPU at a time. `F: Send` allows running it on another CPU.
        let ret = unsafe { perfbed_run_on_cpu(cpu, call_once::<F>, ptr::from_mut(&mut f).cast()) };
        kernel::error::to_result(ret)
    }
    run(cpu, f)
}

/// The CPUs (0-63, as a mask) that share `cpu`'s level-3 cache by the kernel's cacheinfo.
/// Fails with `ENXIO` if `cpu` is offline, `ENOENT` if the kernel knows no L3 for it, `ERANGE`
/// if a sharer is CPU 64 or above.
///
/// Must be called from process context (it takes the CPU hotplug lock).
pub(crate) fn l3_shared_cpus(cpu: u32) -> Result<u64> {
    let mut shared = 0u64;
    // SAFETY: `perfbed_l3_shared_cpus` reads the kernel's cacheinfo under the CPU hotplug lock
    // and writes only `*shared`, a valid `u64` on this stack frame.
    let ret = unsafe { perfbed_l3_shared_cpus(cpu, &mut shared) };
    kernel::error::to_result(ret).map(|()| shared)
}

/// The work a [`Poller`] does.
pub(crate) trait Poll: Send + Sync + 'static {
    /// Polls once, in process context. Returns whether to poll again after another period.
    fn poll(&self) -> bool;
}

/// # Safety
///
/// `data` must be the pointer of an `Arc<T>` that is alive for the call.
unsafe extern "C" fn poll_callback<T: Poll>(data: *mut c_void) -> bool {
    // SAFETY: By the function requirements `data` points at a live `T`.
    let target = unsafe { &*data.cast_const().cast::<T>() };
    target.poll()
}

/// A delayed work that calls [`Poll::poll`] on a `T` every period once kicked, until `poll`
/// returns `false`; a later [`Poller::kick`] starts it again.
///
/// # Invariants
///
/// `raw` was created by `perfbed_poller_create` with the address of `*target` and
/// `poll_callback::<T>`, and is destroyed only by `drop`, before `target` is released.
pub(crate) struct Poller<T: Poll> {
    raw: NonNull<RawPoller>,
    target: Arc<T>,
}

// SAFETY: The poller's C functions may be called from any CPU (`kick` from atomic context too);
// the target is `Send + Sync`.
unsafe impl<T: Poll> Send for Poller<T> {}
// SAFETY: As for `Send`; `kick` takes `&self` and is safe to call concurrently.
unsafe impl<T: Poll> Sync for Poller<T> {}

impl<T: Poll> Poller<T> {
    /// Creates a stopped poller of `target` with a period of `period_ms` (at least one jiffy).
    pub(crate) fn new(target: Arc<T>, period_ms: u32) -> Result<Self> {
        let data = ptr::from_ref::<T>(&target).cast_mut().cast::<c_void>();
        // SAFETY: `perfbed_poller_create` only stores its arguments; the callback is called with
        // `data`, which stays valid while `target` is held, i.e. until after the poller is
        // destroyed in `drop`.
        let raw = unsafe { perfbed_poller_create(poll_callback::<T>, data, period_ms) };
        let raw = NonNull::new(raw).ok_or(ENOMEM)?;
        // INVARIANT: `raw` polls `*target`, which the poller holds.
        Ok(Poller { raw, target })
    }

    /// Makes sure a poll happens within one period. Safe in atomic context (interrupts off).
    pub(crate) fn kick(&self) {
        // SAFETY: By the type invariant `raw` is a live poller.
        unsafe { perfbed_poller_kick(self.raw.as_ptr()) }
    }

    /// Makes the poll happen now (as soon as a worker runs it). Safe in atomic context.
    pub(crate) fn kick_now(&self) {
        // SAFETY: By the type invariant `raw` is a live poller.
        unsafe { perfbed_poller_kick_now(self.raw.as_ptr()) }
    }

    /// Returns what the poller polls.
    pub(crate) fn target(&self) -> &Arc<T> {
        &self.target
    }
}

impl<T: Poll> Drop for Poller<T> {
    fn drop(&mut self) {
        // SAFETY: By the type invariant `raw` is live; `perfbed_poller_destroy` cancels the work,
        // waits for a running one, and frees it. `target` is released only after this.
        unsafe { perfbed_poller_destroy(self.raw.as_ptr()) }
    }
}
