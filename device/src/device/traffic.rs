//! Traffic on its way into a domain: exact injections queued behind each
//! other, and steady rates. Time moves it forward; what lands is handed to
//! the caller, which counts it.
//!
//! Arithmetic is exact: sub-byte remainders are carried in byte·ns, so any
//! sequence of time steps lands the same bytes as one step over their sum.

use std::collections::{BTreeMap, VecDeque};

use crate::regs::Event;

/// Most injections a domain's queue holds (consecutive ones of the same
/// (rmid, event) share an entry): a control client cannot make the device
/// grow without bound.
pub const MAX_QUEUED: usize = 4096;

/// Nanoseconds per second.
const NS_PER_SEC: u128 = 1_000_000_000;

#[derive(Debug, Clone)]
struct Pending {
    rmid: u32,
    event: Event,
    bytes: u64,
}

#[derive(Debug, Clone, Default)]
struct Rate {
    bytes_per_sec: u64,
    /// Sub-byte remainder in byte·ns (always below 1e9).
    carry: u128,
}

/// One domain's traffic not landed yet.
#[derive(Debug, Clone, Default)]
pub(super) struct Traffic {
    queue: VecDeque<Pending>,
    /// Sub-byte remainder of the queue's bandwidth in byte·ns (below 1e9).
    queue_carry: u128,
    rates: BTreeMap<(u32, Event), Rate>,
}

impl Traffic {
    /// The sum of the steady rates, in bytes per second.
    fn steady_total(&self) -> u128 {
        self.rates.values().map(|r| u128::from(r.bytes_per_sec)).sum()
    }

    /// Injected bytes not landed yet.
    pub(super) fn pending(&self) -> u64 {
        self.queue.iter().fold(0u64, |acc, p| acc.saturating_add(p.bytes))
    }

    /// Queues `bytes` of (rmid, event) behind what is already queued;
    /// `false` (and nothing queued) when that would take a queue entry
    /// beyond [`MAX_QUEUED`].
    pub(super) fn inject(&mut self, rmid: u32, event: Event, bytes: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        if let Some(back) = self.queue.back_mut() {
            if back.rmid == rmid && back.event == event {
                if let Some(sum) = back.bytes.checked_add(bytes) {
                    back.bytes = sum;
                    return true;
                }
            }
        }
        if self.queue.len() >= MAX_QUEUED {
            return false;
        }
        self.queue.push_back(Pending { rmid, event, bytes });
        true
    }

    /// The steady rate of every (rmid, event) but this one, summed.
    pub(super) fn steady_total_except(&self, rmid: u32, event: Event) -> u128 {
        self.rates
            .iter()
            .filter(|(&k, _)| k != (rmid, event))
            .map(|(_, r)| u128::from(r.bytes_per_sec))
            .sum()
    }

    /// Sets the steady rate of (rmid, event); 0 removes it.
    pub(super) fn set_rate(&mut self, rmid: u32, event: Event, bytes_per_sec: u64) {
        if bytes_per_sec == 0 {
            self.rates.remove(&(rmid, event));
        } else {
            self.rates.entry((rmid, event)).or_default().bytes_per_sec = bytes_per_sec;
        }
    }

    /// The non-zero steady rates: (rmid, event, bytes per second).
    pub(super) fn rates(&self) -> impl Iterator<Item = (u32, Event, u64)> + '_ {
        self.rates.iter().map(|(&(rmid, event), r)| (rmid, event, r.bytes_per_sec))
    }

    /// Lets `dt` ns of traffic land, calling `land(rmid, event, bytes)` for
    /// each part that does. Steady rates first; the queue, FIFO, gets what
    /// they leave of `max_rate`.
    pub(super) fn advance(&mut self, dt: u64, max_rate: u64, mut land: impl FnMut(u32, Event, u64)) {
        let dt = u128::from(dt);
        for (&(rmid, event), rate) in &mut self.rates {
            let budget = rate.carry.saturating_add(u128::from(rate.bytes_per_sec).saturating_mul(dt));
            rate.carry = budget % NS_PER_SEC;
            let bytes = u64::try_from(budget / NS_PER_SEC).unwrap_or(u64::MAX);
            land(rmid, event, bytes);
        }
        let queue_rate = u128::from(max_rate).saturating_sub(self.steady_total());
        let mut budget = self.queue_carry.saturating_add(queue_rate.saturating_mul(dt));
        while let Some(front) = self.queue.front_mut() {
            let can = u64::try_from(budget / NS_PER_SEC).unwrap_or(u64::MAX);
            let take = can.min(front.bytes);
            front.bytes -= take;
            budget = budget.saturating_sub(u128::from(take).saturating_mul(NS_PER_SEC));
            let (rmid, event, done) = (front.rmid, front.event, front.bytes == 0);
            land(rmid, event, take);
            if done {
                self.queue.pop_front();
            } else {
                break;
            }
        }
        // Bandwidth is not banked while the queue is empty.
        self.queue_carry = if self.queue.is_empty() { 0 } else { budget % NS_PER_SEC };
    }
}
