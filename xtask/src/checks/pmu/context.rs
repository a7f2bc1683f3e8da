//! What every PMU check shares: the guest, the device's control socket, the
//! device's shape and each domain's PMU type, and the driver's encodings.

use std::time::Duration;

use anyhow::{bail, Result};
use perfbed_agent::PerfAttr;
use perfbed_device::regs::Event;
use perfbed_device::{ControlClient, DeviceConfig, DeviceState};

use crate::checks::counting::{DeviceShape, CUT_SLACK_NS};
use crate::guest::perf_abi::{FORMAT_TOTAL_TIME_ENABLED, FORMAT_TOTAL_TIME_RUNNING};
use crate::guest::{pmu_name, Guest};

/// The driver's event encoding: `format/event` = config:0-7,
/// `format/rmid` = config:8-23. Counts are in bytes.
pub fn config(event: Event, rmid: u32) -> u64 {
    event as u64 | u64::from(rmid) << 8
}

pub const EVENT_FILES: [(&str, Event); 3] = [
    ("llc_occupancy", Event::LlcOccupancy),
    ("mbm_total_bytes", Event::MbmTotalBytes),
    ("mbm_local_bytes", Event::MbmLocalBytes),
];
pub const UNIT: &str = "MB";
pub const SCALE: &str = "9.5367431640625e-07";

pub const MIB: u64 = 1 << 20;

/// The `read_format` of a check that judges clocks: value, time_enabled,
/// time_running.
pub const TIMES: u64 = FORMAT_TOTAL_TIME_ENABLED | FORMAT_TOTAL_TIME_RUNNING;

/// What a PMU check holds while it runs.
pub struct Ctx<'a, 'b> {
    pub g: &'a mut Guest<'b>,
    pub control: ControlClient,
    pub device: DeviceConfig,
    /// Each domain's PMU type.
    pub types: Vec<u32>,
}

impl Ctx<'_, '_> {
    pub fn attr(&self, domain: usize, event: Event, rmid: u32) -> PerfAttr {
        PerfAttr {
            type_: self.types[domain],
            config: config(event, rmid),
            ..PerfAttr::default()
        }
    }

    /// Opens an event that must open.
    pub fn open(&mut self, domain: usize, event: Event, rmid: u32) -> Result<u32> {
        let attr = self.attr(domain, event, rmid);
        match self.g.open(attr, None)? {
            Ok(handle) => Ok(handle),
            Err(errno) => bail!(
                "opening {}/{event:?},rmid={rmid}/: {errno}",
                pmu_name(domain)
            ),
        }
    }

    pub fn count(&mut self, handle: u32) -> Result<u64> {
        Ok(self.g.read(handle)?[0])
    }

    /// A park's deadline on this device (`struct pmu`'s `max_unread_ns`:
    /// half a wrap at the maximum rate; docs/counting-semantics.md, "Parks
    /// and wraps").
    pub fn park_deadline(&self) -> Duration {
        let shape = DeviceShape {
            pmus: self.device.domains.len() as u32,
            slots: self.device.slots,
            unit_bytes: self.device.unit_bytes,
            counter_width: self.device.counter_width,
            max_rate: self.device.max_rate,
        };
        Duration::from_nanos(shape.deadline_ns())
    }

    /// The one rule for a count read through a park, shared by every check
    /// that judges one: `start` and `end` read with [`TIMES`], `landed`
    /// bytes landed for the event between them at up to `rate` bytes/s.
    /// Either exact with `Δrunning == Δenabled` (placed before the
    /// deadline), or cut at the deadline: `Δrunning < Δenabled`, never more
    /// than landed, and short by at most what `rate` brings in the time not
    /// running (a tenth more and 1 MiB, for a rate that is not steady at
    /// the edges), and `also` bytes of a burst that may have landed after
    /// the deadline. With `park` (how long it surely was parked: from when
    /// the park was seen to before the placement began), a park past the
    /// deadline by more than [`CUT_SLACK_NS`] must be cut by at least that
    /// much. A problem, or `None`.
    pub fn judge_park_cut(
        &self,
        start: &[u64],
        end: &[u64],
        landed: u64,
        rate: u64,
        also: u64,
        park: Option<Duration>,
    ) -> Option<String> {
        let (got, en, run) = (
            end[0].wrapping_sub(start[0]),
            end[1].wrapping_sub(start[1]),
            end[2].wrapping_sub(start[2]),
        );
        let deadline = self.park_deadline();
        let cut_at_least = park.map_or(0, |p| {
            let p = u64::try_from(p.as_nanos()).unwrap_or(u64::MAX);
            let d = u64::try_from(deadline.as_nanos()).unwrap_or(u64::MAX);
            p.saturating_sub(d.saturating_add(CUT_SLACK_NS))
        });
        let not_running = en.saturating_sub(run);
        let may_miss = (u128::from(rate) * u128::from(not_running) * 11 / 10 / 1_000_000_000)
            .min(u128::from(u64::MAX)) as u64
            + MIB
            + also;
        let what = format!(
            "read {start:?} → {end:?}: counted {got} of {landed} landed, Δenabled {en} Δrunning {run}"
        );
        if end[0] < start[0] || end[1] < start[1] || end[2] < start[2] {
            Some(format!("{what}: went back"))
        } else if run > en || got > landed {
            Some(format!(
                "{what}: more running than enabled, or more counted than landed"
            ))
        } else if not_running < cut_at_least {
            Some(format!(
                "{what}: ran past the park's deadline ({deadline:?} of a park of {park:?}: want at least {cut_at_least} ns not running)"
            ))
        } else if got < landed && run == en {
            Some(format!("{what}: short at 100 % running"))
        } else if landed - got > may_miss {
            Some(format!(
                "{what}: {} bytes missing, more than {} B/s lands in the {not_running} ns not running (cut at the deadline: only what landed after it may be missing)",
                landed - got,
                rate
            ))
        } else {
            None
        }
    }

    pub fn truth(state: &DeviceState, domain: usize, rmid: u32, event: Event) -> u64 {
        state.domains[domain]
            .truth
            .iter()
            .find(|t| t.rmid == rmid && t.event == event)
            .map_or(0, |t| t.bytes)
    }

    pub fn inject_and_land(&mut self, injections: &[(usize, u32, Event, u64)]) -> Result<()> {
        for &(d, rmid, event, bytes) in injections {
            self.control.inject(d as u32, rmid, event, bytes)?;
        }
        self.control
            .wait_landed(self.g.timeout.as_millis() as u64)?;
        Ok(())
    }
}
