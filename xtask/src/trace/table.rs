//! `cargo xtask trace FILE`: the trace decoded into a table, one row per
//! record, with a column for the device's global block, one per domain and
//! one for the guest's events, so that each domain's story reads downwards.

use std::fmt::Write as _;

use perfbed_device::cpus::format_cpu_list;

use super::model::{Line, Trace};
use super::timeline::secs;
use super::window::Window;

const CELL: usize = 36;

/// The owner change's name: placed, moved or parked.
pub fn owner_change(line: &Line) -> &'static str {
    match (line.field("from"), line.field("to")) {
        (_, Some("none")) => "PARK",
        (Some("none"), _) => "PLACE",
        _ => "MOVE",
    }
}

fn event_short(event: Option<&str>) -> &str {
    match event {
        Some("mbm_total_bytes") => "total",
        Some("mbm_local_bytes") => "local",
        Some(other) => other,
        None => "?",
    }
}

/// What a line says, in a few words.
fn cell(line: &Line) -> String {
    let f = |k: &str| line.field(k).unwrap_or("?");
    match line.kind.as_str() {
        "read" | "write" => {
            let mut text = if line.kind == "read" {
                format!("c{} R {} {}", f("cpu"), f("reg"), f("value"))
            } else {
                format!("c{} W {}={}", f("cpu"), f("reg"), f("value"))
            };
            if line.has_flag("violation") {
                text += " VIOLATION";
            }
            if let Some(bad) = line.field("bad") {
                text += &format!(" BAD:{bad}");
            }
            text
        }
        "owner" => format!("{} owner {} -> {}", owner_change(line), f("from"), f("to")),
        "inject" => format!(
            "+{} B r{} {}",
            f("bytes"),
            f("rmid"),
            event_short(line.field("event"))
        ),
        "rate" => format!(
            "rate r{} {} {} B/s",
            f("rmid"),
            event_short(line.field("event")),
            f("bytes_per_sec")
        ),
        "occupancy" => format!("occupancy r{} {} B", f("rmid"), f("bytes")),
        "reset" => "RESET".into(),
        "irq" => format!(
            "IRQ {} status={} config={}",
            f("line"),
            f("status"),
            f("config")
        ),
        "allowed" => format!("ALLOWED {} -> {}", f("from"), f("to")),
        "dropped" => format!("DROPPED {} records", f("count")),
        "host_check" => {
            let names = line
                .field("names")
                .map(super::spans::parse_names)
                .unwrap_or_default()
                .join(", ");
            let until = line.number("until").map_or(0.0, secs);
            format!("CHECK {names} (to {until:.3} s)")
        }
        "guest_kernel" => format!("cpu{} {}", f("cpu"), f("event")),
        "guest_offline" | "guest_online" => {
            let took = line.number("took_ns").unwrap_or(0) as f64 / 1e6;
            let failed = if line.has_flag("failed") {
                " FAILED"
            } else {
                ""
            };
            format!(
                "cpu{} {} ({took:.1} ms){failed}",
                f("cpu"),
                &line.kind["guest_".len()..]
            )
        }
        "guest_perf_open" => format!("open type={} {} -> {}", f("type"), f("config"), f("result")),
        "guest_perf_close" => format!("close {}", f("handle")),
        "guest_cpumask" => format!("{} cpumask {}", f("pmu"), f("cpus")),
        other => other.to_string(),
    }
}

/// The column a line goes in: 0 the device's global block (and the host's
/// check spans), 1..=D the domains, D+1 the guest.
fn column(line: &Line, domains: usize) -> usize {
    if line.kind.starts_with("guest_") {
        return domains + 1;
    }
    line.domain().filter(|&d| d < domains).map_or(0, |d| d + 1)
}

/// The table of `trace`'s records (those in `window`, if given); times in
/// seconds on the device's clock.
pub fn render(trace: &Trace, window: Option<Window>) -> String {
    let domains = trace.shape.domains.len();
    let mut heads = vec!["device".to_string()];
    heads.extend(
        trace
            .shape
            .domains
            .iter()
            .enumerate()
            .map(|(d, cpus)| format!("domain {d} (CPUs {})", format_cpu_list(cpus))),
    );
    heads.push("guest".into());
    let mut out = String::new();
    let _ = write!(out, "{:>12} ", "time s");
    for h in &heads {
        let _ = write!(out, "| {h:CELL$} ");
    }
    out.push('\n');
    for line in trace
        .lines
        .iter()
        .filter(|l| window.is_none_or(|w| w.contains(l.time_ns)))
    {
        let col = column(line, domains);
        let _ = write!(out, "{:>12.6} ", secs(line.time_ns));
        for c in 0..heads.len() {
            let text = if c == col { cell(line) } else { String::new() };
            let _ = write!(out, "| {text:CELL$} ");
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
    }
    if trace.shape.dropped > 0 {
        let _ = writeln!(
            out,
            "({} older records were dropped: raise --trace-capacity)",
            trace.shape.dropped
        );
    }
    out
}
