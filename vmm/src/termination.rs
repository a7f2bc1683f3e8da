//! SIGTERM and SIGINT as an eventfd the event loop watches, so that a
//! terminated VMM stops its vCPUs, joins them and reports like one whose
//! guest reset, instead of dying with vCPU threads inside `KVM_RUN`.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, Ordering};

use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::register_signal_handler;

/// The eventfd the handler writes (-1: none yet).
static TERMINATION_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_termination(
    _signal: libc::c_int,
    _info: *mut libc::siginfo_t,
    _context: *mut libc::c_void,
) {
    let fd = TERMINATION_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let one = 1u64;
        // SAFETY: write(2) is async-signal-safe; the buffer is 8 valid
        // bytes. A failed write means the counter is already non-zero.
        unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    }
}

/// An eventfd that becomes readable on SIGTERM or SIGINT. The handler
/// stays installed for the process's life; a second call moves it to the
/// new eventfd (the old one must then be kept open by its owner or the
/// handler may write to a reused descriptor; the VMM calls it once).
pub fn watch() -> std::io::Result<EventFd> {
    let evt = EventFd::new(libc::EFD_NONBLOCK)?;
    let handler_end = evt.try_clone()?;
    TERMINATION_FD.store(handler_end.as_raw_fd(), Ordering::SeqCst);
    // The handler's descriptor lives as long as the process.
    std::mem::forget(handler_end);
    for signal in [libc::SIGTERM, libc::SIGINT] {
        register_signal_handler(signal, on_termination)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    }
    Ok(evt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigterm_makes_the_eventfd_readable_and_does_not_end_the_process() {
        let evt = watch().unwrap();
        assert!(evt.read().is_err(), "readable before any signal");
        // SAFETY: raising a signal whose handler is installed.
        assert_eq!(unsafe { libc::raise(libc::SIGTERM) }, 0);
        assert_eq!(evt.read().unwrap(), 1);
    }
}
