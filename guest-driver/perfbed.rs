// SPDX-License-Identifier: GPL-2.0

//! perfbed: device-scope perf PMUs for the perfbed monitoring device.
//!
//! For now this is the module's skeleton: it loads, says so, and unloads.
//! The PMU driver grows here once the guest kernel carries
//! `PERF_PMU_SCOPE_DEVICE` and the `kernel::perf` abstraction.

use kernel::prelude::*;

module! {
    type: Perfbed,
    name: "perfbed",
    author: "perfbed developers",
    description: "Device-scope perf PMUs for the perfbed monitoring device",
    license: "GPL",
}

struct Perfbed;

impl kernel::Module for Perfbed {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        pr_info!("loaded\n");
        Ok(Perfbed)
    }
}

impl Drop for Perfbed {
    fn drop(&mut self) {
        pr_info!("unloaded\n");
    }
}
