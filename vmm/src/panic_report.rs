//! The panic path: a panic anywhere in the VMM (a vCPU thread, the event
//! loop) still flushes the serial log and prints the run's figures before the
//! process ends.
//!
//! The release profile keeps the workspace's `panic = "abort"` (cargo has no
//! per-package `panic`, and the agent wants it), so nothing unwinds: the hook
//! is the only code that runs after a panic. It does the report on a helper
//! thread and waits for it at most [`REPORT_PATIENCE`]: should the panicking
//! thread hold a lock the report needs, the process still ends.

use std::sync::mpsc;
use std::sync::Arc;
use std::thread::{self, ThreadId};
use std::time::Duration;

/// How long the hook waits for the report.
pub const REPORT_PATIENCE: Duration = Duration::from_secs(2);

/// Makes every later panic run `report` (after the usual message), given
/// the panicking thread (which the report must not wait for: it is the one
/// waiting).
pub fn install(report: Arc<dyn Fn(ThreadId) + Send + Sync>) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        log::error!("panicked; flushing the serial log and reporting before the process ends");
        let panicking = thread::current().id();
        let (done, finished) = mpsc::channel();
        let report = report.clone();
        let spawned = thread::Builder::new()
            .name("panic-report".into())
            .spawn(move || {
                report(panicking);
                let _ = done.send(());
            });
        if spawned.is_err() || finished.recv_timeout(REPORT_PATIENCE).is_err() {
            log::error!("the report did not finish within {REPORT_PATIENCE:?} (a lock held by the panicking thread?)");
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn a_panic_runs_the_report_and_a_stuck_report_does_not_hold_it() {
        let ran = Arc::new(AtomicU32::new(0));
        let counter = ran.clone();
        let previous = std::panic::take_hook();
        let me = thread::current().id();
        install(Arc::new(move |panicking| {
            assert_eq!(panicking, me, "the report is told which thread panicked");
            counter.fetch_add(1, Ordering::SeqCst);
        }));
        let caught = std::panic::catch_unwind(|| panic!("on purpose"));
        assert!(caught.is_err());
        assert_eq!(ran.load(Ordering::SeqCst), 1, "the report did not run");

        install(Arc::new(|_| thread::sleep(Duration::from_secs(3600))));
        let started = std::time::Instant::now();
        let caught = std::panic::catch_unwind(|| panic!("on purpose, stuck report"));
        assert!(caught.is_err());
        assert!(
            started.elapsed() < REPORT_PATIENCE * 3,
            "the hook waited {:?}",
            started.elapsed()
        );
        std::panic::set_hook(previous);
    }
}
