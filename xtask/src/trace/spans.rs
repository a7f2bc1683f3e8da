//! Which checks ran when: [`CheckLog`] collects a run's checks as they
//! finish, and the host's clock at each; the time between one collection
//! and the next is the span of what was collected (one check, or a family
//! that reports several at once). Saved with the trace as `host_check`
//! lines on the device's clock, they are the bands along the plot's time
//! axis:
//!
//! ```text
//! <start_ns> - host_check until=<end_ns> failed=<n> names=<name>,<name>...
//! ```
//!
//! A name is written with `%` escapes for the characters the trace's
//! `key=value` words cannot hold (space, `,`, `=`, `%`).

use std::ops::Deref;
use std::time::Instant;

use crate::checks::Check;

/// Checks collected so far, and when each batch of them finished.
pub struct CheckLog {
    checks: Vec<Check>,
    spans: Vec<Span>,
    last: Instant,
}

/// One batch of checks and the host's time it took.
#[derive(Debug, Clone)]
pub struct Span {
    start: Instant,
    end: Instant,
    names: Vec<&'static str>,
    failed: usize,
}

impl Default for CheckLog {
    fn default() -> Self {
        CheckLog::new()
    }
}

impl CheckLog {
    /// An empty log whose first span starts now.
    pub fn new() -> CheckLog {
        CheckLog {
            checks: Vec::new(),
            spans: Vec::new(),
            last: Instant::now(),
        }
    }

    pub fn push(&mut self, check: Check) {
        self.extend([check]);
    }

    /// Adds `checks`, which ran since the previous addition, as one span.
    pub fn extend(&mut self, checks: impl IntoIterator<Item = Check>) {
        let end = Instant::now();
        let first = self.checks.len();
        self.checks.extend(checks);
        let batch = &self.checks[first..];
        if !batch.is_empty() {
            self.spans.push(Span {
                start: self.last,
                end,
                names: batch.iter().map(|c| c.name).collect(),
                failed: batch.iter().filter(|c| !c.passed).count(),
            });
        }
        self.last = end;
    }

    /// Starts the next span now: what ran since the last addition was no
    /// check's (a module load, the trace's saving).
    pub fn skip(&mut self) {
        self.last = Instant::now();
    }

    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    pub fn into_checks(self) -> Vec<Check> {
        self.checks
    }
}

impl Deref for CheckLog {
    type Target = [Check];
    fn deref(&self) -> &[Check] {
        &self.checks
    }
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
