//! What the VMM measures about itself: when the guest first ran, how many
//! exits of each kind the vCPUs took, and how much memory the VMM holds
//! beyond the guest's RAM.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Shared by every vCPU thread.
#[derive(Debug)]
pub struct Stats {
    start: Instant,
    first_run_ns: AtomicU64,
    first_exit_ns: AtomicU64,
    pub io_exits: AtomicU64,
    pub mmio_exits: AtomicU64,
}

impl Stats {
    /// Times are measured from `start` (the VMM's own start).
    pub fn new(start: Instant) -> Stats {
        Stats {
            start,
            first_run_ns: AtomicU64::new(0),
            first_exit_ns: AtomicU64::new(0),
            io_exits: AtomicU64::new(0),
            mmio_exits: AtomicU64::new(0),
        }
    }

    fn since_start(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The boot vCPU is about to enter the guest for the first time.
    pub fn note_first_run(&self) {
        let _ = self.first_run_ns.compare_exchange(
            0,
            self.since_start(),
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    /// The boot vCPU came back from the guest (its first exit).
    pub fn note_first_exit(&self) {
        let _ = self.first_exit_ns.compare_exchange(
            0,
            self.since_start(),
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    /// Nanoseconds from VMM start to the first KVM_RUN and to the first exit.
    pub fn boot_times(&self) -> (u64, u64) {
        (
            self.first_run_ns.load(Ordering::SeqCst),
            self.first_exit_ns.load(Ordering::SeqCst),
        )
    }
}

/// Resident memory of this process outside the `guest` host ranges, in
/// bytes, from `/proc/self/smaps` (`None` where it cannot be read).
pub fn rss_beyond(guest: &[(u64, u64)]) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    Some(rss_outside(&smaps, guest))
}

/// The sum of `Rss:` of every mapping in `smaps` not inside a `guest` range.
pub fn rss_outside(smaps: &str, guest: &[(u64, u64)]) -> u64 {
    let mut total_kib = 0;
    let mut counted = true;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((from, to)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            let (Ok(from), Ok(to)) = (u64::from_str_radix(from, 16), u64::from_str_radix(to, 16))
            else {
                continue;
            };
            counted = !guest
                .iter()
                .any(|&(start, len)| from >= start && to <= start + len);
        } else if let Some(rest) = line.strip_prefix("Rss:") {
            if counted {
                total_kib += rest
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0);
            }
        }
    }
    total_kib * 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0c0000000-55d0c0100000 r-xp 00000000 08:01 123 /usr/bin/perfbed-vmm
Size:               1024 kB
Rss:                 800 kB
7f0000000000-7f0020000000 rw-p 00000000 00:00 0
Size:             524288 kB
Rss:              100000 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
Rss:                  12 kB
";

    #[test]
    fn guest_ram_is_left_out() {
        assert_eq!(
            rss_outside(SMAPS, &[(0x7f00_0000_0000, 0x2000_0000)]),
            (800 + 12) * 1024
        );
        assert_eq!(rss_outside(SMAPS, &[]), (800 + 100_000 + 12) * 1024);
    }

    #[test]
    fn this_process_has_some_rss() {
        assert!(rss_beyond(&[]).unwrap() > 0);
    }

    #[test]
    fn first_times_are_kept() {
        let stats = Stats::new(Instant::now());
        assert_eq!(stats.boot_times(), (0, 0));
        stats.note_first_run();
        let (run, _) = stats.boot_times();
        stats.note_first_run();
        stats.note_first_exit();
        let (again, exit) = stats.boot_times();
        assert!(run > 0 && again == run && exit >= run);
    }
}
