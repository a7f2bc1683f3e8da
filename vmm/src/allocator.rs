//! Address ranges and interrupt lines handed out to devices: an MMIO window
//! allocator and a GSI allocator.
//!
//! rust-vmm's `vm-allocator` does this job too; these are smaller because the
//! layout perfbed needs is small and must reproduce the QEMU host's machine
//! exactly (the monitoring device at its base, its GSIs pinned, the virtio
//! transports packed from the start of their window as on QEMU's microvm):
//! a window hands out ranges in order, and a GSI is either pinned or the
//! lowest free one.

use std::collections::BTreeSet;

/// Why a range or a line could not be handed out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    #[error("the {window} window ({base:#x}..{end:#x}) has no room for {len:#x} more bytes")]
    WindowFull {
        window: &'static str,
        base: u64,
        end: u64,
        len: u64,
    },
    #[error("a zero-length range was asked of the {window} window")]
    EmptyRange { window: &'static str },
    #[error("GSI {0} is already taken")]
    GsiTaken(u32),
    #[error("GSI {gsi} is outside the IOAPIC's {first}..={last}")]
    GsiOutOfRange { gsi: u32, first: u32, last: u32 },
    #[error("no free GSI in {first}..={last}")]
    NoFreeGsi { first: u32, last: u32 },
}

/// A window of guest-physical MMIO space, handed out front to back, each
/// range aligned to the window's alignment.
#[derive(Debug, Clone)]
pub struct MmioWindow {
    name: &'static str,
    base: u64,
    end: u64,
    align: u64,
    next: u64,
}

impl MmioWindow {
    /// The window `base..end`; ranges start at multiples of `align` (a power
    /// of two) from `base`.
    pub fn new(name: &'static str, base: u64, end: u64, align: u64) -> MmioWindow {
        debug_assert!(align.is_power_of_two() && base.is_multiple_of(align) && base < end);
        MmioWindow {
            name,
            base,
            end,
            align,
            next: base,
        }
    }

    /// The next `len` bytes of the window.
    pub fn allocate(&mut self, len: u64) -> Result<u64, AllocationError> {
        if len == 0 {
            return Err(AllocationError::EmptyRange { window: self.name });
        }
        let full = || AllocationError::WindowFull {
            window: self.name,
            base: self.base,
            end: self.end,
            len,
        };
        let start = self.next;
        let stop = start
            .checked_add(len)
            .filter(|&s| s <= self.end)
            .ok_or_else(full)?;
        // The next range starts aligned; a window ending unaligned just has
        // less room.
        self.next = stop
            .checked_next_multiple_of(self.align)
            .unwrap_or(self.end)
            .min(self.end);
        Ok(start)
    }
}

/// The IOAPIC's GSIs: pinned ones (a line the QEMU host fixes too) and the
/// lowest free one for the rest.
#[derive(Debug, Clone)]
pub struct GsiAllocator {
    first: u32,
    last: u32,
    taken: BTreeSet<u32>,
}

impl GsiAllocator {
    /// GSIs `first..=last` free, except `reserved` (legacy lines with a
    /// fixed owner: the timer, the keyboard, COM1...).
    pub fn new(first: u32, last: u32, reserved: &[u32]) -> GsiAllocator {
        GsiAllocator {
            first,
            last,
            taken: reserved.iter().copied().collect(),
        }
    }

    /// Takes `gsi` itself.
    pub fn pin(&mut self, gsi: u32) -> Result<u32, AllocationError> {
        if !(self.first..=self.last).contains(&gsi) {
            return Err(AllocationError::GsiOutOfRange {
                gsi,
                first: self.first,
                last: self.last,
            });
        }
        if !self.taken.insert(gsi) {
            return Err(AllocationError::GsiTaken(gsi));
        }
        Ok(gsi)
    }

    /// Takes the lowest free GSI.
    pub fn allocate(&mut self) -> Result<u32, AllocationError> {
        let gsi = (self.first..=self.last)
            .find(|g| !self.taken.contains(g))
            .ok_or(AllocationError::NoFreeGsi {
                first: self.first,
                last: self.last,
            })?;
        self.taken.insert(gsi);
        Ok(gsi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_hands_out_aligned_ranges_in_order_until_full() {
        let mut w = MmioWindow::new("test", 0x1000, 0x2000, 0x200);
        assert_eq!(w.allocate(0x200), Ok(0x1000));
        assert_eq!(w.allocate(0x10), Ok(0x1200));
        assert_eq!(
            w.allocate(0x200),
            Ok(0x1400),
            "the 0x10 range took a whole slot"
        );
        assert_eq!(w.allocate(0xa00), Ok(0x1600));
        assert!(matches!(
            w.allocate(1),
            Err(AllocationError::WindowFull { .. })
        ));
        assert!(matches!(
            w.allocate(0),
            Err(AllocationError::EmptyRange { .. })
        ));
        let mut w = MmioWindow::new("test", 0x1000, 0x2000, 0x1000);
        assert!(
            matches!(
                w.allocate(u64::MAX),
                Err(AllocationError::WindowFull { .. })
            ),
            "no wrap"
        );
        assert_eq!(w.allocate(0x1000), Ok(0x1000));
    }

    #[test]
    fn gsis_are_pinned_or_the_lowest_free_and_never_given_twice() {
        let mut g = GsiAllocator::new(5, 23, &[8, 12]);
        assert_eq!(g.pin(13), Ok(13));
        assert_eq!(g.pin(13), Err(AllocationError::GsiTaken(13)));
        assert_eq!(g.pin(12), Err(AllocationError::GsiTaken(12)), "reserved");
        assert!(matches!(
            g.pin(24),
            Err(AllocationError::GsiOutOfRange { gsi: 24, .. })
        ));
        let mut got: Vec<u32> = (0..16).map(|_| g.allocate().unwrap()).collect();
        assert_eq!(got[..4], [5, 6, 7, 9]);
        got.sort();
        got.dedup();
        assert_eq!(got.len(), 16);
        assert!(!got.contains(&13) && !got.contains(&8));
        assert_eq!(
            g.allocate(),
            Err(AllocationError::NoFreeGsi { first: 5, last: 23 })
        );
    }
}
