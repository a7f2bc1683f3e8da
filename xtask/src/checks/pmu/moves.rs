//! The domain whose PMU moves and parks: the checks' choice of it, and the
//! rate they move it under. (The checks of moves and parks themselves are
//! scenarios: `scenarios/moves`, `scenarios/parks`.)

use anyhow::{bail, Result};

use super::context::{Ctx, MIB};

/// The first domain of `domains` with two CPUs or more, none of them CPU
/// 0 (which cannot go offline): its owner can move and it can park.
pub fn movable_in(domains: &[Vec<u32>]) -> Option<usize> {
    domains
        .iter()
        .position(|cpus| cpus.len() >= 2 && !cpus.contains(&0))
}

/// The domain whose CPUs can all go offline (CPU 0 cannot) and its set.
pub fn movable_domain(ctx: &Ctx) -> Result<(usize, Vec<u32>)> {
    match movable_in(&ctx.device.domains) {
        Some(d) => Ok((d, ctx.device.domains[d].clone())),
        None => bail!(
            "no domain with two CPUs besides CPU 0 to take offline (domains {:?})",
            ctx.device.domains
        ),
    }
}

/// Steady traffic that flows while CPUs move: 64 MiB/s, so that a move
/// (tens of milliseconds under TCG) always has some land while it is under way.
pub const MOVING_RATE: u64 = 64 * MIB;
