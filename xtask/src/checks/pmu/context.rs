//! What every PMU check shares: the guest, the device's control socket, the
//! device's shape and each domain's PMU type, and the driver's encodings;
//! and the step the checks in Rust all take (an `mbm_total_bytes` event
//! opened with a read format and flags).

use anyhow::{bail, Result};
use perfbed_agent::PerfAttr;
use perfbed_device::regs::Event;
use perfbed_device::{ControlClient, DeviceConfig, DeviceState};

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

    pub fn truth(state: &DeviceState, domain: usize, rmid: u32, event: Event) -> u64 {
        state.domains[domain]
            .truth
            .iter()
            .find(|t| t.rmid == rmid && t.event == event)
            .map_or(0, |t| t.bytes)
    }
}

/// An `mbm_total_bytes` event of domain `d` that must open, with
/// `read_format` and `flags`, in `group` if given.
pub fn open_with(
    ctx: &mut Ctx,
    d: usize,
    rmid: u32,
    read_format: u64,
    flags: u64,
    group: Option<u32>,
) -> Result<u32> {
    let mut attr = ctx.attr(d, Event::MbmTotalBytes, rmid);
    attr.read_format = read_format;
    attr.flags = flags;
    match ctx.g.open(attr, group)? {
        Ok(h) => Ok(h),
        Err(errno) => bail!(
            "opening {}/mbm_total_bytes,rmid={rmid}/ (group {group:?}): {errno}",
            pmu_name(d)
        ),
    }
}
