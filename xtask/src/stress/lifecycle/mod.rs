//! The lifecycle stress: see `generate` (what it issues), `journal` (what
//! it records), `replay` (how it checks).

pub mod cli;
pub mod generate;
pub mod journal;
mod perf_stat;
pub mod reads;
pub mod replay;
pub mod run;

use std::time::Duration;

use anyhow::{Context, Result};
use perfbed_agent::HostRequest;
use perfbed_device::ControlClient;

use crate::checks::clean_log_check;
use crate::guest::Guest;
use crate::guest::{pmu_name, MODULE};
use crate::host::config::VmConfig;
use crate::host::vm::Vm;
use crate::host::Accel;
use run::{LifecycleConfig, LifecycleReport};

/// Counter slots per domain in the lifecycle device: few, so that the
/// generator's events often outnumber them and perf multiplexes.
pub const SLOTS: u32 = 4;

/// Boots `vm`, runs the lifecycle stress, powers off; the report's checks
/// include the kernel log's and the device's placement violations.
pub fn execute(
    vm_config: &VmConfig,
    accel: &Accel,
    config: &LifecycleConfig,
) -> Result<LifecycleReport> {
    let failed = |e: anyhow::Error| {
        e.context(format!(
            "the lifecycle stress did not complete; seed {}; replay with: {}\nrun folder: {}",
            config.seed,
            config.replay,
            vm_config.run_dir.display()
        ))
    };
    let booted = Vm::boot(vm_config, accel).map_err(failed)?;
    let mut vm = booted.vm;
    let mut report = on_guest(&mut vm, vm_config, config).map_err(failed)?;
    vm.power_off(Duration::from_secs(60)).map_err(failed)?;
    report
        .checks
        .push(clean_log_check(&vm_config.run_dir.join("serial.log")));
    Ok(report)
}

fn on_guest(
    vm: &mut Vm,
    vm_config: &VmConfig,
    config: &LifecycleConfig,
) -> Result<LifecycleReport> {
    let device = &vm_config.device;
    let socket = vm.control_socket.clone();
    let mut g = Guest {
        vm,
        timeout: config.timeout,
    };
    g.expect_done(HostRequest::LoadModule {
        name: MODULE.into(),
    })?;
    let pmus: Vec<String> = (0..device.domains.len()).map(pmu_name).collect();
    let mut types = Vec::new();
    for pmu in &pmus {
        types.push(g.pmu_type(pmu)?);
    }
    let mut control =
        ControlClient::connect(&socket).context("connecting to the device's control socket")?;
    control.reset_stats()?;
    let mut report = run::run(
        &mut g,
        u32::from(vm_config.cpus),
        &mut control,
        device,
        &pmus,
        &types,
        config,
        &vm_config.run_dir,
    )?;
    let state = control.state()?;
    report.checks.push(super::jobs::violations_check(&state));
    Ok(report)
}
