//! Steady traffic on counters that events watch (a scenario's `rate
//! DOMAIN EVENT rmid=N BYTES/s`, the lifecycle stress's `--watched-rates`),
//! measured around every step: the device's
//! truth of each flowing counter is sampled just before a step and just
//! after it, so the journal says what landed between two steps (counted as
//! a burst there) and what landed while one was carried out (at a moment
//! the model cannot place: `Model::flowed_during`).

use std::collections::BTreeMap;

use anyhow::Result;
use perfbed_device::ControlClient;

use super::generate::RMID_RATE;
use super::journal::{mbm_event, Entry, Flowed, Step};

/// A counter: (domain, event, RMID).
type Counter = (u32, u32, u32);

/// The counters steady traffic flows into, each with its truth when the
/// last step ended.
#[derive(Debug, Default)]
pub struct Flows {
    last: BTreeMap<Counter, u64>,
}

/// The watched counter a `Rate` step sets, if any, and its rate.
fn watched_rate(step: &Step) -> Option<(Counter, u64)> {
    match *step {
        Step::Rate {
            domain,
            rmid,
            event,
            bytes_per_sec,
        } if rmid != RMID_RATE => Some(((domain, event, rmid), bytes_per_sec)),
        _ => None,
    }
}

impl Flows {
    /// Whether `step` needs measuring: traffic flows, or it starts to.
    pub fn around(&self, step: &Step) -> bool {
        !self.last.is_empty() || watched_rate(step).is_some_and(|(_, rate)| rate > 0)
    }

    /// Just before `step`: the truth of each flowing counter, and of the
    /// one `step` starts (whose earlier traffic is not this flow's).
    pub fn before(
        &mut self,
        control: &mut ControlClient,
        step: &Step,
    ) -> Result<BTreeMap<Counter, u64>> {
        let state = control.state()?;
        let truth = |&(d, e, r): &Counter| state.truth(d, r, mbm_event(e));
        if let Some((counter, rate)) = watched_rate(step) {
            if rate > 0 && !self.last.contains_key(&counter) {
                self.last.insert(counter, truth(&counter));
            }
        }
        Ok(self.last.keys().map(|c| (*c, truth(c))).collect())
    }

    /// Just after the step whose journal entry is `entry`: what landed
    /// before it (since the step before) and while it ran; a counter whose
    /// rate the step stopped flows no more.
    pub fn after(
        &mut self,
        control: &mut ControlClient,
        before: &BTreeMap<Counter, u64>,
        entry: &mut Entry,
    ) -> Result<()> {
        let state = control.state()?;
        // A burst into a flowing counter is in its truth too: the journal
        // has it as the burst's, landed before the step ended.
        let burst = match entry.step {
            Step::Burst {
                domain,
                event,
                rmid,
                bytes,
            } => Some(((domain, event, rmid), bytes)),
            _ => None,
        };
        for (&counter, &then) in before {
            let (domain, e, rmid) = counter;
            let now = state.truth(domain, rmid, mbm_event(e));
            let last = self.last.insert(counter, now).unwrap_or(then);
            let injected = burst.filter(|(c, _)| *c == counter).map_or(0, |(_, b)| b);
            entry.flowed.push(Flowed {
                domain,
                event: e,
                rmid,
                before: then.wrapping_sub(last),
                during: now.wrapping_sub(then).wrapping_sub(injected),
            });
        }
        if let Some((counter, 0)) = watched_rate(&entry.step) {
            self.last.remove(&counter);
        }
        Ok(())
    }
}
