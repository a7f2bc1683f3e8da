//! The end-to-end checks of perfbed.ko: device-scope PMUs `perfbed_l3_<d>`
//! opened from the guest with perf_event_open (and the real perf tool),
//! traffic injected through the device's control socket, every count
//! compared with the device's ground truth while CPUs come and go.

pub mod accesses;
pub mod across_moves;
pub mod allowed_attacks;
pub mod allowed_sets;
pub mod attacks;
pub mod context;
pub mod counts;
pub mod groups;
pub mod interrupts;
pub mod move_attacks;
pub mod moves;
pub mod moving_traffic;
pub mod multiplexing;
pub mod park_attacks;
pub mod perf_matrix;
pub mod redteam;
pub mod registration;
pub mod semantics;

use anyhow::Result;
use perfbed_device::{ControlClient, DeviceConfig};

use crate::checks::Check;
use crate::guest::{pmu_name, Guest};
use context::Ctx;

/// Runs every check; the driver must be loaded. `control_socket` is the
/// device's, for checks that inject from a thread of their own.
pub fn run(
    g: &mut Guest,
    control: ControlClient,
    control_socket: &std::path::Path,
    device: &DeviceConfig,
) -> Result<Vec<Check>> {
    let mut types = Vec::new();
    for d in 0..device.domains.len() {
        types.push(g.pmu_type(&pmu_name(d))?);
    }
    let mut ctx = Ctx {
        g,
        control,
        device: device.clone(),
        types,
    };
    ctx.control.reset_stats()?;
    let mut checks = vec![
        registration::sysfs(&mut ctx)?,
        counts::exact_counts(&mut ctx)?,
    ];
    checks.push(moves::migration(&mut ctx)?);
    checks.push(moves::parking(&mut ctx)?);
    checks.push(interrupts::follow_the_owner(&mut ctx)?);
    checks.push(allowed_sets::changes(&mut ctx)?);
    checks.push(allowed_sets::with_reset_and_disable(&mut ctx)?);
    checks.push(across_moves::disabled_across_moves(&mut ctx)?);
    checks.push(across_moves::exclusive_after_moves(&mut ctx)?);
    checks.push(across_moves::mixed_group_after_move(&mut ctx)?);
    checks.push(across_moves::opens_racing_moves(&mut ctx)?);
    checks.push(moving_traffic::check(
        ctx.g,
        &mut ctx.control,
        control_socket,
        &ctx.device,
        &ctx.types,
    )?);
    checks.push(multiplexing::multiplexing(&mut ctx)?);
    checks.push(semantics::disable_window(&mut ctx)?);
    checks.push(semantics::multiplexed_park(&mut ctx)?);
    checks.push(semantics::long_park(&mut ctx)?);
    checks.push(groups::groups(&mut ctx)?);
    checks.push(groups::bad_attributes(&mut ctx)?);
    checks.push(perf_matrix::run(
        ctx.g,
        &mut ctx.control,
        &ctx.device,
        &ctx.types,
    )?);
    checks.push(counts::perf_stat(&mut ctx)?);
    checks.extend(redteam::run(&mut ctx)?);
    checks.extend(attacks::run(&mut ctx)?);
    checks.extend(move_attacks::run(&mut ctx)?);
    checks.extend(park_attacks::run(&mut ctx)?);
    checks.extend(allowed_attacks::run(&mut ctx)?);
    checks.push(registration::unload(&mut ctx)?);
    checks.push(accesses::check(&mut ctx)?);
    Ok(checks)
}
