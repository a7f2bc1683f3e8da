//! Traffic on its way into a domain: exact injections queued behind each
//! other, and steady rates. Time moves it forward; what lands is handed to
//! the caller, which counts it.
//!
//! Arithmetic is exact: sub-byte remainders are carried in byte·ns, so any
//! sequence of time steps lands the same bytes as one step over their sum.
//!
//! `advance` runs on every guest register access, so it is kept cheap: the
//! rates are a sorted Vec (iterated, never searched, on that path), their sum
//! is kept up to date, and budgets that fit in a u64 are divided as u64s
//! (a u128 division is a library call several times slower).

use std::collections::VecDeque;

use crate::regs::Event;

/// Most injections a domain's queue holds (consecutive ones of the same
/// (rmid, event) share an entry): a control client cannot make the device
/// grow without bound.
pub const MAX_QUEUED: usize = 4096;

/// Nanoseconds per second.
const NS_PER_SEC: u128 = 1_000_000_000;
const NS_PER_SEC_U64: u64 = 1_000_000_000;

/// A budget in byte·ns as (whole bytes, remainder in byte·ns below 1e9).
fn whole_bytes(budget: u128) -> (u128, u128) {
    match u64::try_from(budget) {
        Ok(b) => (
            u128::from(b / NS_PER_SEC_U64),
            u128::from(b % NS_PER_SEC_U64),
        ),
        Err(_) => (budget / NS_PER_SEC, budget % NS_PER_SEC),
    }
}

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
    /// Non-zero steady rates, sorted by (rmid, event), each key once.
    rates: Vec<((u32, Event), Rate)>,
    /// The sum of `rates`, in bytes per second.
    steady_total: u128,
}

impl Traffic {
    /// Injected bytes not landed yet.
    pub(super) fn pending(&self) -> u64 {
        self.queue
            .iter()
            .fold(0u64, |acc, p| acc.saturating_add(p.bytes))
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
        let own = self
            .rate_index(rmid, event)
            .ok()
            .map_or(0, |i| u128::from(self.rates[i].1.bytes_per_sec));
        self.steady_total - own
    }

    /// Sets the steady rate of (rmid, event); 0 removes it.
    pub(super) fn set_rate(&mut self, rmid: u32, event: Event, bytes_per_sec: u64) {
        match (self.rate_index(rmid, event), bytes_per_sec) {
            (Ok(i), 0) => {
                self.steady_total -= u128::from(self.rates.remove(i).1.bytes_per_sec);
            }
            (Ok(i), _) => {
                let rate = &mut self.rates[i].1;
                self.steady_total =
                    self.steady_total - u128::from(rate.bytes_per_sec) + u128::from(bytes_per_sec);
                rate.bytes_per_sec = bytes_per_sec;
            }
            (Err(_), 0) => {}
            (Err(i), _) => {
                self.rates.insert(
                    i,
                    (
                        (rmid, event),
                        Rate {
                            bytes_per_sec,
                            carry: 0,
                        },
                    ),
                );
                self.steady_total += u128::from(bytes_per_sec);
            }
        }
    }

    fn rate_index(&self, rmid: u32, event: Event) -> Result<usize, usize> {
        self.rates
            .binary_search_by(|(key, _)| key.cmp(&(rmid, event)))
    }

    /// The non-zero steady rates: (rmid, event, bytes per second).
    pub(super) fn rates(&self) -> impl Iterator<Item = (u32, Event, u64)> + '_ {
        self.rates
            .iter()
            .map(|&((rmid, event), ref r)| (rmid, event, r.bytes_per_sec))
    }

    /// Lets `dt` ns of traffic land, calling `land(rmid, event, bytes)` for
    /// each part that does. Steady rates first; the queue, FIFO, gets what
    /// they leave of `max_rate`.
    pub(super) fn advance(
        &mut self,
        dt: u64,
        max_rate: u64,
        mut land: impl FnMut(u32, Event, u64),
    ) {
        if self.rates.is_empty() && self.queue.is_empty() {
            return;
        }
        let dt = u128::from(dt);
        for &mut ((rmid, event), ref mut rate) in &mut self.rates {
            let budget = rate
                .carry
                .saturating_add(u128::from(rate.bytes_per_sec).saturating_mul(dt));
            let (bytes, carry) = whole_bytes(budget);
            rate.carry = carry;
            land(rmid, event, u64::try_from(bytes).unwrap_or(u64::MAX));
        }
        let queue_rate = u128::from(max_rate).saturating_sub(self.steady_total);
        let budget = self
            .queue_carry
            .saturating_add(queue_rate.saturating_mul(dt));
        // Taking whole bytes leaves the remainder below 1e9 byte·ns as it is.
        let (mut bytes, carry) = whole_bytes(budget);
        while let Some(front) = self.queue.front_mut() {
            let take = u64::try_from(bytes).unwrap_or(u64::MAX).min(front.bytes);
            front.bytes -= take;
            bytes -= u128::from(take);
            let (rmid, event, done) = (front.rmid, front.event, front.bytes == 0);
            land(rmid, event, take);
            if done {
                self.queue.pop_front();
            } else {
                break;
            }
        }
        // Bandwidth is not banked while the queue is empty.
        self.queue_carry = if self.queue.is_empty() { 0 } else { carry };
    }
}
