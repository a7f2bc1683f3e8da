//! Which checks ran when: the [`Span`]s that `checks::CheckLog` records
//! (a check, or a family that reports several at once, and the host's time
//! it took), saved with the trace as `host_check` lines on the device's
//! clock; they are the bands along the plot's time axis:
//!
//! ```text
//! <start_ns> - host_check until=<end_ns> failed=<n> names=<name>,<name>...
//! ```
//!
//! A name is written with `%` escapes for the characters the trace's
//! `key=value` words cannot hold (space, `,`, `=`, `%`).

use std::time::Instant;

/// A batch of checks and the host's time it took.
#[derive(Debug, Clone)]
pub struct Span {
    pub start: Instant,
    pub end: Instant,
    pub names: Vec<&'static str>,
    pub failed: usize,
}

/// The host's clock against the device's: the device's `now_ns` read at
/// host instant `at` (the middle of the request that read it).
#[derive(Debug, Clone, Copy)]
pub struct HostClock {
    pub at: Instant,
    pub device_ns: u64,
}

impl HostClock {
    fn device_ns(&self, t: Instant) -> u64 {
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        if t >= self.at {
            self.device_ns.saturating_add(ns(t - self.at))
        } else {
            self.device_ns.saturating_sub(ns(self.at - t))
        }
    }
}

/// The spans as trace lines on the device's clock; spans that ended
/// before `first_ns` (the trace's first record) are left out, and one that
/// began before it starts there.
pub fn lines(spans: &[Span], clock: HostClock, first_ns: u64) -> Vec<String> {
    spans
        .iter()
        .filter_map(|s| {
            let end = clock.device_ns(s.end);
            let start = clock.device_ns(s.start).max(first_ns);
            (end >= first_ns).then(|| {
                let names: Vec<String> = s.names.iter().map(|n| escape(n)).collect();
                format!(
                    "{start:>12} - host_check until={end} failed={} names={}",
                    s.failed,
                    names.join(",")
                )
            })
        })
        .collect()
}

fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            ' ' | ',' | '=' | '%' => out.push_str(&format!("%{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// A `names=` value back into the check names.
pub fn parse_names(value: &str) -> Vec<String> {
    value.split(',').map(unescape).collect()
}

fn unescape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 3)
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match code {
            Some(b) => {
                out.push(char::from(b));
                rest = &rest[i + 3..];
            }
            None => {
                out.push('%');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}
