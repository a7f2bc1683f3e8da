//! The `cargo xtask run` check that injects while CPUs move and park: an
//! event stays open on a domain whose CPUs can all go, the host injects
//! bursts and changes a steady rate from its own thread while the guest
//! flaps the PMU's CPU, parks the domain and brings it back, and the final
//! count must equal the device's truth exactly, at 100 % running.
//!
//! Kept apart from `moves` (which checks moves and parks with the
//! traffic stopped) and built on the stress's injector.

use std::time::Duration;

use anyhow::{bail, Result};
use perfbed_agent::{AgentMessage, HostRequest, HotplugOp, PerfAttr};
use perfbed_device::regs::Event;
use perfbed_device::{ControlClient, DeviceConfig};

use crate::checks::rng::Rng;
use crate::checks::traffic::{Injector, Key};
use crate::checks::Check;
use crate::guest::pmu_name;
use crate::guest::Guest;

/// An RMID the other PMU checks leave alone.
const RMID: u32 = 7;
const SEED: u64 = 0x5eed_0008;
/// How long the domain stays parked with the traffic running: well short
/// of the park's deadline (0.25 s on the default device, with the hotplug
/// steps around it), so that the placement is exact at 100 % running; a
/// park past it is `park longer than a wrap`'s.
const PARKED: Duration = Duration::from_millis(100);
/// How long the traffic runs after the return.
const AFTER: Duration = Duration::from_millis(300);

/// `control_socket` gives the injector its own connection.
pub fn check(
    g: &mut Guest,
    control: &mut ControlClient,
    control_socket: &std::path::Path,
    device: &DeviceConfig,
    types: &[u32],
) -> Result<Check> {
    let Some((d, allowed)) = device
        .domains
        .iter()
        .enumerate()
        .find(|(_, cpus)| cpus.len() >= 2 && !cpus.contains(&0))
    else {
        bail!(
            "no domain with two CPUs besides CPU 0 (domains {:?})",
            device.domains
        );
    };
    let pmu = pmu_name(d);
    let rmid = RMID.min(device.rmids - 1);
    let attr = PerfAttr {
        type_: types[d],
        config: Event::MbmTotalBytes as u64 | u64::from(rmid) << 8,
        read_format: 0b11,
        ..PerfAttr::default()
    };
    let handle = match g.open(attr, None)? {
        Ok(h) => h,
        Err(errno) => bail!("opening {pmu}/mbm_total_bytes,rmid={rmid}/: {errno}"),
    };
    let key = Key {
        domain: d as u32,
        rmid,
        event: Event::MbmTotalBytes,
    };
    let before = control.state()?;
    let injector = Injector::start(
        ControlClient::connect(control_socket)?,
        vec![key],
        vec![],
        device.unit_bytes,
        Rng::new(SEED),
    );

    let set = |cpus: &mut dyn Iterator<Item = &u32>, online| {
        cpus.map(|&cpu| HotplugOp::Set { cpu, online })
            .collect::<Vec<_>>()
    };
    let flaps = vec![
        HotplugOp::FlapOwner { pmu: pmu.clone() },
        HotplugOp::FlapOwner { pmu: pmu.clone() },
    ];
    let park = set(&mut allowed.iter(), false);
    let unpark = set(&mut allowed.iter().rev(), true);
    let mut seen = Vec::new();
    let mut problems = Vec::new();
    for (i, ops) in [flaps, park, unpark].into_iter().enumerate() {
        let request = HostRequest::HotplugBatch {
            ops,
            watch_pmus: vec![pmu.clone()],
            read_handles: vec![],
        };
        match g.ask(request)? {
            AgentMessage::HotplugBatch(result) => {
                problems.extend(result.ops.iter().filter_map(|op| op.error.clone()));
                seen.extend(
                    result
                        .ops
                        .iter()
                        .flat_map(|op| op.between.iter().chain(&op.masks))
                        .map(|m| {
                            if m.is_empty() {
                                "parked".to_string()
                            } else {
                                m.clone()
                            }
                        }),
                );
            }
            other => bail!("hotplug batch: {other:?}"),
        }
        if i == 1 {
            std::thread::sleep(PARKED);
        }
    }
    std::thread::sleep(AFTER);
    let traffic = injector.stop()?;
    control.wait_landed(g.timeout.as_millis() as u64)?;
    let v = g.read(handle)?;
    g.close(handle)?;
    let after = control.state()?;
    let truth = after
        .truth(key.domain, rmid, key.event)
        .wrapping_sub(before.truth(key.domain, rmid, key.event));
    // The slot counts whole units from its assignment, before the traffic:
    // the rest of the last unit is traffic no counter shows.
    let countable = perfbed_device::regs::whole_units(truth, after.config.unit_bytes);
    let (count, enabled, running) = (
        v[0],
        v.get(1).copied().unwrap_or(0),
        v.get(2).copied().unwrap_or(0),
    );
    if count != countable {
        problems.push(format!(
            "counted {count}, the device's truth {truth} ({countable} in whole units; off by {})",
            countable as i128 - count as i128
        ));
    }
    if enabled != running {
        problems.push(format!("time_enabled {enabled}, time_running {running}"));
    }
    if !seen.iter().any(|m| m == "parked") {
        problems.push(format!("{pmu} never parked: {seen:?}"));
    }
    Ok(Check::from_problems(
        "traffic while moving",
        problems,
        format!(
            "{pmu}: {} bursts and {} rate changes while its CPU flapped and the domain parked and returned ({}); {count} bytes counted = truth, 100 % running",
            traffic.bursts,
            traffic.rate_changes,
            seen.join("→")
        ),
    ))
}
