//! Repeated measurements summarised as a median and a spread, the two
//! figures every row of the table that was measured more than once carries.

/// The median of some measurements and how far they strayed from each
/// other: half their range (max - min) / 2. On a shared machine a single
/// preempted sample widens it, which is the point: a change smaller than
/// the spread cannot be told from the noise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub spread: f64,
}

impl Summary {
    /// `None` for no measurements. NaNs sort last and are kept: they show.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_unstable_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Some(Summary {
            median,
            spread: (sorted[n - 1] - sorted[0]) / 2.0,
        })
    }

    /// The same measurements in another unit.
    pub fn scaled(self, factor: f64) -> Summary {
        Summary {
            median: self.median * factor,
            spread: self.spread * factor,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_half_range() {
        assert_eq!(Summary::of(&[]), None);
        assert_eq!(
            Summary::of(&[3.0]),
            Some(Summary {
                median: 3.0,
                spread: 0.0
            })
        );
        assert_eq!(
            Summary::of(&[5.0, 1.0, 2.0]),
            Some(Summary {
                median: 2.0,
                spread: 2.0
            })
        );
        assert_eq!(
            Summary::of(&[4.0, 1.0, 2.0, 3.0]),
            Some(Summary {
                median: 2.5,
                spread: 1.5
            })
        );
        // A difference of interleaved samples may be negative; its spread is not.
        assert_eq!(
            Summary::of(&[-1.0, 3.0]),
            Some(Summary {
                median: 1.0,
                spread: 2.0
            })
        );
        assert_eq!(
            Summary {
                median: 2048.0,
                spread: 512.0
            }
            .scaled(1.0 / 1024.0),
            Summary {
                median: 2.0,
                spread: 0.5
            }
        );
    }
}
