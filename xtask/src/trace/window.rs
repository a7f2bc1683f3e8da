//! `--from S --to S`: the part of a trace that `cargo xtask trace` prints
//! or draws, in seconds on the device's clock, checked against the trace.

use super::timeline;

/// A `--from`/`--to` value: a finite, non-negative number of seconds.
pub fn parse_seconds(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => Ok(s),
        _ => Err(format!(
            "{text:?} is not a time: give seconds on the device's clock, such as 12.5"
        )),
    }
}

/// The part of a trace to print or draw, in seconds on the device's clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub from: f64,
    pub to: f64,
}

/// Why a `--from`/`--to` pair does not fit a trace.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WindowError {
    #[error("--from {from} is not before --to {to}")]
    Reversed { from: f64, to: f64 },
    #[error("the window {from} s to {to} s is outside the trace, which runs from {start:.6} s to {end:.6} s")]
    Outside {
        from: f64,
        to: f64,
        start: f64,
        end: f64,
    },
}

impl Window {
    /// The window `from`..`to` (each defaulting to the trace's edge) of a
    /// trace that runs from `start` to `end`; it must overlap the trace.
    pub fn new(
        from: Option<f64>,
        to: Option<f64>,
        start: f64,
        end: f64,
    ) -> Result<Window, WindowError> {
        // Both given and reversed: say so, wherever they fall.
        if let (Some(from), Some(to)) = (from, to) {
            if from >= to {
                return Err(WindowError::Reversed { from, to });
            }
        }
        let (from, to) = (from.unwrap_or(start), to.unwrap_or(end));
        if to < start || from > end {
            return Err(WindowError::Outside {
                from,
                to,
                start,
                end,
            });
        }
        if from >= to {
            return Err(WindowError::Reversed { from, to });
        }
        Ok(Window { from, to })
    }

    pub fn contains(&self, time_ns: u64) -> bool {
        (self.from..=self.to).contains(&timeline::secs(time_ns))
    }
}
