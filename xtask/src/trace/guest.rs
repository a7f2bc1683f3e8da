//! The guest's side of a trace: the agent's events (stamped with the guest's
//! `CLOCK_MONOTONIC`) moved onto the device's clock and written as `guest_*`
//! lines of the trace format.
//!
//! The two clocks meet at one register read: the agent reads `REG_MAGIC`
//! between two readings of its clock (`ClockSync`), and the device records
//! that read with its own time. The offset is exact to within the read's
//! duration (microseconds under TCG).

use perfbed_agent::{GuestEvent, GuestEventKind};

use super::model::Line;

/// `device time - guest time`, in ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockOffset(pub i128);

impl ClockOffset {
    /// From a clock sync on `cpu` whose guest stamps are `before`/`after`:
    /// the device's last read of `REG_MAGIC` from that CPU in `device_lines`
    /// is that read.
    pub fn from_sync(
        device_lines: &[Line],
        cpu: u32,
        before: u64,
        after: u64,
    ) -> Option<ClockOffset> {
        let read = device_lines.iter().rev().find(|l| {
            l.kind == "read"
                && l.field("reg") == Some("REG_MAGIC")
                && l.number("cpu") == Some(u64::from(cpu))
        })?;
        let guest_mid = (i128::from(before) + i128::from(after)) / 2;
        Some(ClockOffset(i128::from(read.time_ns) - guest_mid))
    }

    pub(super) fn device_time(self, guest_ns: u64) -> u64 {
        u64::try_from((i128::from(guest_ns) + self.0).max(0)).unwrap_or(u64::MAX)
    }
}

/// One trace line per guest event, on the device's clock.
pub fn lines(events: &[GuestEvent], offset: ClockOffset) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            let body = match &e.kind {
                GuestEventKind::CpuOffline { cpu, took_ns, ok } => {
                    format!("guest_offline cpu={cpu} took_ns={took_ns}{}", if *ok { "" } else { " failed" })
                }
                GuestEventKind::CpuOnline { cpu, took_ns, ok } => {
                    format!("guest_online cpu={cpu} took_ns={took_ns}{}", if *ok { "" } else { " failed" })
                }
                GuestEventKind::PerfOpen { pmu_type, config, cpu, result } => {
                    format!("guest_perf_open type={pmu_type} config={config:#x} cpu={cpu} result={result}")
                }
                GuestEventKind::PerfClose { handle } => format!("guest_perf_close handle={handle}"),
                GuestEventKind::PerfOp { op, took_ns, result } => {
                    let result = match result {
                        Ok(words) => format!("{words:?}").replace(' ', ""),
                        Err(errno) => errno.clone(),
                    };
                    let op = serde_json::to_string(op).unwrap_or_default().replace(' ', "");
                    format!("guest_perf_op took_ns={took_ns} result={result} op={op}")
                }
                GuestEventKind::Cpumask { pmu, cpus } => {
                    format!("guest_cpumask pmu={pmu} cpus={}", if cpus.is_empty() { "none" } else { cpus })
                }
            };
            format!("{:>12} - {body} guest_ns={}", offset.device_time(e.time_ns), e.time_ns)
        })
        .collect()
}

/// The device's trace file with `extra` lines (the guest's, the checks')
/// merged in, in time order (a stable sort: records of one instant keep
/// their order).
pub fn merge(device_text: &str, extra: &[String]) -> String {
    let mut rows = device_text.lines();
    let header = rows.next().unwrap_or_default();
    let mut all: Vec<&str> = rows.chain(extra.iter().map(String::as_str)).collect();
    all.sort_by_key(|l| {
        l.split_whitespace()
            .next()
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(0)
    });
    let mut out = format!("{header}\n");
    for line in all {
        out.push_str(line);
        out.push('\n');
    }
    out
}
