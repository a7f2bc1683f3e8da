//! The real `perf stat -a` under a steady rate, against the device's truth
//! (a rate, judged by the truth over the run: the model judges bursts).
//! Exact counts of every event are `scenarios/counts/exact-counts.scn`.

use anyhow::Result;
use perfbed_device::regs::Event;

use super::context::{Ctx, MIB, UNIT};
use crate::checks::Check;
use crate::guest::pmu_name;

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
