//! Exact counts: every event and several RMIDs in every domain, and the real
//! `perf stat -a` under a steady rate.

use anyhow::Result;
use perfbed_device::regs::Event;

use super::context::{Ctx, MIB, UNIT};
use crate::checks::Check;
use crate::guest::pmu_name;

/// 2. Exact counts for every event and several RMIDs in both domains,
///    including a total that wraps the hardware counter three times.
pub fn exact_counts(ctx: &mut Ctx) -> Result<Check> {
    let wrap = (1u64 << ctx.device.counter_width) * ctx.device.unit_bytes;
    let mut plan = Vec::new(); // (domain, event, rmid, bytes)
    for d in 0..ctx.device.domains.len() {
        let d64 = d as u64;
        plan.push((
            d,
            Event::MbmTotalBytes,
            1,
            3 * wrap + 4096 * (d64 + 1) + 640,
        ));
        plan.push((d, Event::MbmTotalBytes, 3, 10 * MIB + 128 * (d64 + 1)));
        plan.push((d, Event::MbmLocalBytes, 3, 5 * MIB + 64));
    }
    let mut handles = Vec::new();
    for &(d, event, rmid, _) in &plan {
        handles.push(ctx.open(d, event, rmid)?);
    }
    let occupancy: Vec<(usize, u64)> = (0..ctx.device.domains.len())
        .map(|d| (d, (12_345 + d as u64) * ctx.device.unit_bytes))
        .collect();
    let mut occ_handles = Vec::new();
    for &(d, bytes) in &occupancy {
        ctx.control.set_occupancy(d as u32, 5, bytes)?;
        occ_handles.push(ctx.open(d, Event::LlcOccupancy, 5)?);
    }
    let injections: Vec<_> = plan.iter().map(|&(d, e, r, b)| (d, r, e, b)).collect();
    ctx.inject_and_land(&injections)?;
    let mut problems = Vec::new();
    for (&(d, event, rmid, bytes), &h) in plan.iter().zip(&handles) {
        let got = ctx.count(h)?;
        if got != bytes {
            problems.push(format!(
                "{}/{event:?},rmid={rmid}/ counted {got}, injected {bytes}",
                pmu_name(d)
            ));
        }
    }
    for (&(d, bytes), &h) in occupancy.iter().zip(&occ_handles) {
        let got = ctx.count(h)?;
        if got != bytes {
            problems.push(format!(
                "{}/llc_occupancy,rmid=5/ reads {got}, set {bytes}",
                pmu_name(d)
            ));
        }
    }
    for h in handles.into_iter().chain(occ_handles) {
        ctx.g.close(h)?;
    }
    Ok(Check::from_problems("exact counts",
        problems,
        format!("{} cumulative events and {} occupancy gauges exact, incl. {} bytes = 3 wraps of the {}-bit counter", plan.len(), occupancy.len(), 3 * wrap, ctx.device.counter_width),
    ))
}

/// 8. `perf stat -a` from the real perf tool agrees with the device's truth
///    under a steady rate.
pub fn perf_stat(ctx: &mut Ctx) -> Result<Check> {
    let (d, rmid, rate) = (0usize, 3u32, 64 * MIB);
    ctx.control
        .set_rate(d as u32, rmid, Event::MbmTotalBytes, rate)?;
    let spec = format!("{}/mbm_total_bytes,rmid={rmid}/", pmu_name(d));
    let result = ctx.g.run(&[
        "/usr/bin/perf",
        "stat",
        "-a",
        "-x,",
        "-e",
        &spec,
        "/bin/busybox",
        "sleep",
        "2",
    ]);
    ctx.control
        .set_rate(d as u32, rmid, Event::MbmTotalBytes, 0)?;
    let (status, _, stderr) = result?;
    // CSV: value,unit,event,run time (ns),percentage running,... where the
    // event is printed as given, commas included.
    let line = stderr.lines().find(|l| l.contains(&spec)).unwrap_or("");
    let (head, tail) = line.split_once(&format!(",{spec},")).unwrap_or(("", ""));
    let (value, unit) = head.split_once(',').unwrap_or(("", ""));
    let run_ns = tail.split(',').next().unwrap_or("");
    let parsed = (value.parse::<f64>().ok(), run_ns.parse::<f64>().ok());
    let mut problems = Vec::new();
    let mut detail = String::new();
    match parsed {
        (Some(mb), Some(run_ns)) if status == Some(0) => {
            let expected_mb = rate as f64 * run_ns / 1e9 / MIB as f64;
            let error = (mb - expected_mb).abs() / expected_mb;
            detail = format!("perf stat -a -e {spec}: {mb:.1} {unit} over {:.2} s; the device's rate gives {expected_mb:.1} ({:.1} %)", run_ns / 1e9, error * 100.0);
            if error > 0.05 || unit != UNIT {
                problems.push(detail.clone());
            }
        }
        _ => problems.push(format!("perf stat exited {status:?}: {}", stderr.trim())),
    }
    Ok(Check::from_problems("perf stat", problems, detail))
}
