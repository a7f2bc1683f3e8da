//! [`CheckLog`]: a run's checks collected as they finish, with the host's
//! clock at each, so that the trace's plot can show which check ran when.

use std::ops::Deref;
use std::time::Instant;

use crate::checks::Check;
use crate::trace::spans::Span;

/// Checks collected so far, and when each batch of them finished: the time
/// between one addition and the next is the span of what was added.
pub struct CheckLog {
    checks: Vec<Check>,
    spans: Vec<Span>,
    last: Instant,
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
