// SPDX-License-Identifier: GPL-2.0

//! Finding the device in the device tree, on boards that describe their devices there (arm64's
//! `virt`, whose node perfbed's QEMU adds: `images/qemu/arm64/`, docs/arm64.md): the registers
//! from the node's `reg`, domain `d`'s line from its `d`-th interrupt, a GIC SPI that the glue
//! maps to a Linux IRQ. Used when the `device` parameter is empty; x86's hosts announce the
//! device with the parameter and have no device tree.

use kernel::ffi::{c_int, c_uint};
use kernel::prelude::*;

use crate::irq;
use crate::regs;

extern "C" {
    fn perfbed_of_find(base: *mut u64, size: *mut u64, irqs: *mut c_uint, max_irqs: c_uint) -> c_int;
}

/// The device's node: (size, base, each domain's Linux IRQ), as `parse_device_param` gives them.
pub(crate) fn find() -> Result<(u64, u64, irq::Gsis)> {
    let (mut base, mut size) = (0u64, 0u64);
    let mut irqs = [0 as c_uint; regs::MAX_DOMAINS as usize];
    // SAFETY: The pointers are to locals that outlive the call; `irqs` has the length passed.
    let err = unsafe {
        // CAST: `MAX_DOMAINS` is 16.
        perfbed_of_find(&mut base, &mut size, irqs.as_mut_ptr(), irqs.len() as c_uint)
    };
    if err != 0 {
        pr_err!("no device: the parameter device= is empty and the device tree has no perfbed node ({})\n", err);
        return Err(Error::from_errno(err));
    }
    Ok((size, base, irq::Gsis::from_irqs(&irqs)))
}
