//! The host's side of the stress: a thread that, through its own
//! connection to the device's control socket, injects bursts, changes
//! steady rates and occupancies at random while the guest hotplugs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use perfbed_device::regs::Event;
use perfbed_device::ControlClient;

use super::rng::Rng;

/// A (domain, RMID, event) the stress owns: traffic for it goes to exactly
/// one open event (or perf stat), so its count must equal the truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub domain: u32,
    pub rmid: u32,
    pub event: Event,
}

/// What the injector did.
#[derive(Debug, Default, Clone)]
pub struct TrafficStats {
    pub bursts: u64,
    pub burst_bytes: u64,
    pub rate_changes: u64,
    pub occupancy_changes: u64,
}

pub struct Injector {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<TrafficStats>>,
}

/// Largest burst, in counter units (4 MiB of 64-byte units).
const MAX_BURST_UNITS: u64 = 1 << 16;
/// Largest steady rate, in counter units per second (16 MiB/s of 64 B).
const MAX_RATE_UNITS: u64 = 1 << 18;

impl Injector {
    /// Starts injecting for `keys` (and setting the occupancy of
    /// `occupancy` (domain, RMID) pairs) until stopped.
    pub fn start(
        mut control: ControlClient,
        keys: Vec<Key>,
        occupancy: Vec<(u32, u32)>,
        unit: u64,
        mut rng: Rng,
    ) -> Injector {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || -> Result<TrafficStats> {
            let mut stats = TrafficStats::default();
            while !flag.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(rng.range(5, 40)));
                let Some(&key) = rng.pick(&keys) else { break };
                match rng.below(10) {
                    0..=4 => {
                        let bytes = rng.range(1, MAX_BURST_UNITS) * unit;
                        control
                            .inject(key.domain, key.rmid, key.event, bytes)
                            .context("injecting a burst")?;
                        stats.bursts += 1;
                        stats.burst_bytes += bytes;
                    }
                    5..=7 => {
                        let rate = if rng.chance(25) {
                            0
                        } else {
                            rng.range(1, MAX_RATE_UNITS) * unit
                        };
                        control
                            .set_rate(key.domain, key.rmid, key.event, rate)
                            .context("setting a rate")?;
                        stats.rate_changes += 1;
                    }
                    _ => {
                        if let Some(&(domain, rmid)) = rng.pick(&occupancy) {
                            control
                                .set_occupancy(domain, rmid, rng.range(0, 1 << 20) * unit)
                                .context("setting an occupancy")?;
                            stats.occupancy_changes += 1;
                        }
                    }
                }
            }
            // Quiet: every steady rate off, so that the truth stops moving.
            for key in &keys {
                control
                    .set_rate(key.domain, key.rmid, key.event, 0)
                    .context("clearing a rate")?;
            }
            Ok(stats)
        });
        Injector { stop, thread }
    }

    /// Stops injecting and clears every rate; the caller then waits for the
    /// bursts to land.
    pub fn stop(self) -> Result<TrafficStats> {
        self.stop.store(true, Ordering::Release);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the traffic thread panicked"))?
    }
}
