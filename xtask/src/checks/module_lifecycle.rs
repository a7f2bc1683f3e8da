//! perfbed.ko's lifecycle, checked on a booted guest: loaded and unloaded
//! again and again, with an event open (unload refused, nothing left behind)
//! and without; and loaded with a wrong `device=` parameter (missing,
//! malformed, misaligned, too small, no device there), which must fail with
//! a clear kernel log line and -EINVAL or -ENODEV, never an oops.

use std::fs;
use std::path::Path;
use std::thread;
use std::time::Duration;

use anyhow::{bail, Result};
use perfbed_agent::{AgentMessage, HostRequest, PerfAttr};
use perfbed_device::regs::Event;
use perfbed_device::ControlClient;

use crate::checks::Check;
use crate::guest::Guest;
use crate::guest::{pmu_name, MODULE};
use crate::host::config::DEVICE_BASE;
use crate::host::console::kernel_log_problems;

/// How many load/unload cycles each loop makes.
pub const CYCLES: u32 = 100;

/// `Slab:` of /proc/meminfo, in KiB.
fn slab_kib(g: &mut Guest) -> Result<u64> {
    let meminfo = g.read_file("/proc/meminfo")?;
    let line = meminfo.lines().find(|l| l.starts_with("Slab:"));
    match line
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
    {
        Some(kib) => Ok(kib),
        None => bail!("no Slab: line in /proc/meminfo"),
    }
}

fn loaded(g: &mut Guest) -> Result<bool> {
    Ok(g.read_file("/proc/modules")?
        .lines()
        .any(|l| l.split_whitespace().next() == Some(MODULE)))
}

/// The lines the kernel logged to the serial console after byte `from`.
fn log_since(serial_log: &Path, from: usize) -> String {
    // The console is copied to the log by another thread: give it a moment.
    thread::sleep(Duration::from_millis(300));
    let log = fs::read(serial_log).unwrap_or_default();
    String::from_utf8_lossy(log.get(from..).unwrap_or_default()).into_owned()
}

fn log_len(serial_log: &Path) -> usize {
    fs::metadata(serial_log).map_or(0, |m| m.len() as usize)
}

/// Loads and unloads the driver `CYCLES` times with an event open (the
/// unload refused while it is) and `CYCLES` times without.
pub fn load_unload(g: &mut Guest, control: &mut ControlClient) -> Result<Check> {
    let mut problems = Vec::new();
    if loaded(g)? {
        g.expect_done(HostRequest::UnloadModule {
            name: MODULE.into(),
        })?;
    }
    // One cycle first, so that the slab caches the driver uses exist.
    g.expect_done(HostRequest::LoadModule {
        name: MODULE.into(),
    })?;
    g.expect_done(HostRequest::UnloadModule {
        name: MODULE.into(),
    })?;
    let slab_before = slab_kib(g)?;
    let mut refused = String::new();
    for i in 0..CYCLES {
        g.expect_done(HostRequest::LoadModule {
            name: MODULE.into(),
        })?;
        let pmu_type = g.pmu_type(&pmu_name(0))?;
        let attr = PerfAttr {
            type_: pmu_type,
            config: Event::MbmTotalBytes as u64 | 1 << 8,
            ..PerfAttr::default()
        };
        let h = match g.open(attr, None)? {
            Ok(h) => h,
            Err(errno) => bail!("cycle {i}: opening an event: {errno}"),
        };
        match g.ask(HostRequest::UnloadModule {
            name: MODULE.into(),
        })? {
            AgentMessage::Done => {
                problems.push(format!("cycle {i}: rmmod with an event open succeeded"));
                break;
            }
            AgentMessage::Error { error } => refused = error,
            other => bail!("cycle {i}: rmmod answered {other:?}"),
        }
        g.close(h)?;
        g.expect_done(HostRequest::UnloadModule {
            name: MODULE.into(),
        })?;
    }
    for _ in 0..CYCLES {
        g.expect_done(HostRequest::LoadModule {
            name: MODULE.into(),
        })?;
        g.expect_done(HostRequest::UnloadModule {
            name: MODULE.into(),
        })?;
    }
    let slab_after = slab_kib(g)?;
    let grew = slab_after.saturating_sub(slab_before);
    // A leak of even one small object per cycle shows over 200 cycles; a
    // page or two of slab churn does not.
    if grew > 512 {
        problems.push(format!(
            "slab memory grew by {grew} KiB over {} cycles ({slab_before} → {slab_after} KiB)",
            2 * CYCLES
        ));
    }
    if loaded(g)? {
        problems.push("perfbed is still loaded after the last unload".into());
    }
    let state = control.state()?;
    for d in &state.domains {
        if d.owner.is_some() || d.slots.iter().any(|s| s.event.is_some()) {
            problems.push(format!(
                "domain {} keeps an owner or a slot after unloading",
                d.domain
            ));
        }
    }
    // Leave it loaded, as the other checks expect.
    g.expect_done(HostRequest::LoadModule {
        name: MODULE.into(),
    })?;
    Ok(Check::from_problems(
        "module load/unload",
        problems,
        format!(
            "{CYCLES} cycles with an event open (rmmod refused: {refused}) and {CYCLES} without; slab {slab_before} → {slab_after} KiB; nothing left on the device"
        ),
    ))
}

/// Loads the driver with wrong `device=` parameters: each fails with the
/// errno and the kernel log line it must give, and no oops.
pub fn bad_device_params(g: &mut Guest, serial_log: &Path, device_size: u64) -> Result<Check> {
    if loaded(g)? {
        g.expect_done(HostRequest::UnloadModule {
            name: MODULE.into(),
        })?;
    }
    let misaligned = format!("device={device_size:#x}@{:#x}", DEVICE_BASE + 4);
    let too_small = format!("device=0x1000@{DEVICE_BASE:#x}");
    let tiny = format!("device=0x100@{DEVICE_BASE:#x}");
    let nothing_there = format!("device={device_size:#x}@{:#x}", DEVICE_BASE - 0x10_0000);
    let cases: Vec<(&str, String, &str, &str)> = vec![
        (
            "missing",
            String::new(),
            "Invalid argument",
            "missing parameter device=",
        ),
        (
            "empty",
            "device=".into(),
            "Invalid argument",
            "missing parameter device=",
        ),
        (
            "not hex",
            format!("device=zz@{DEVICE_BASE:#x}"),
            "Invalid argument",
            "malformed parameter device=",
        ),
        (
            "no @",
            "device=0x3000".into(),
            "Invalid argument",
            "malformed parameter device=",
        ),
        (
            "misaligned base",
            misaligned,
            "Invalid argument",
            "malformed parameter device=",
        ),
        (
            "smaller than the global block",
            tiny,
            "Invalid argument",
            "malformed parameter device=",
        ),
        (
            "overflowing",
            "device=0x3000@0xfffffffffffff000".into(),
            "Invalid argument",
            "malformed parameter device=",
        ),
        (
            "smaller than the device",
            too_small,
            "No such device",
            "perfbed",
        ),
        (
            "no device there (wrong magic)",
            nothing_there,
            "No such device",
            "no perfbed device at",
        ),
    ];
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    for (name, params, errno, logged) in &cases {
        let from = log_len(serial_log);
        let answer = g.ask(HostRequest::LoadModuleWith {
            name: MODULE.into(),
            params: params.clone(),
        })?;
        let log = log_since(serial_log, from);
        let error = match answer {
            AgentMessage::Error { error } => error,
            AgentMessage::Done => {
                problems.push(format!("{name} ({params:?}): the module loaded"));
                g.expect_done(HostRequest::UnloadModule {
                    name: MODULE.into(),
                })?;
                continue;
            }
            other => bail!("loading with {params:?}: {other:?}"),
        };
        let line = log
            .lines()
            .find(|l| l.contains("perfbed"))
            .unwrap_or("")
            .trim()
            .to_string();
        if !error.contains(errno) {
            problems.push(format!("{name} ({params:?}): {error}, expected {errno}"));
        }
        if !log.contains(logged) {
            problems.push(format!(
                "{name} ({params:?}): the kernel log does not say {logged:?}: {line:?}"
            ));
        }
        let oops = kernel_log_problems(&log);
        if !oops.is_empty() {
            problems.push(format!("{name} ({params:?}): {}", oops.join("; ")));
        }
        seen.push(format!(
            "{name}: {}",
            if error.contains("No such device") {
                "ENODEV"
            } else {
                "EINVAL"
            }
        ));
    }
    if loaded(g)? {
        problems.push("perfbed is loaded after only failed loads".into());
    }
    g.expect_done(HostRequest::LoadModule {
        name: MODULE.into(),
    })?;
    Ok(Check::from_problems(
        "wrong device= parameter",
        problems,
        seen.join(", "),
    ))
}
