//! The real perf tool runs in the guest.

use std::time::Duration;

use anyhow::Result;

use super::Check;
use crate::guest::Guest;
use crate::host::vm::Vm;

/// The real perf tool, copied into the guest with its libraries, runs.
pub fn check(vm: &mut Vm, timeout: Duration) -> Result<Check> {
    let mut guest = Guest { vm, timeout };
    let (status, _, stderr) = guest.run(&[
        "/usr/bin/perf",
        "stat",
        "-x,",
        "-e",
        "task-clock",
        "/bin/busybox",
        "true",
    ])?;
    let passed = status == Some(0) && stderr.contains("task-clock");
    let detail = if passed {
        "`perf stat -e task-clock busybox true` runs in the guest".to_string()
    } else {
        format!("perf stat exited {status:?}: {}", stderr.trim())
    };
    Ok(Check {
        name: "perf tool",
        passed,
        detail,
    })
}
