//! perfbed's guest kernel command line, and the TSC rate it tells the guest.

use std::thread;
use std::time::{Duration, Instant};

/// The host's TSC frequency in kHz, measured. Under TCG the guest's TSC runs
/// at the host's rate; telling the guest (`tsc_early_khz=`) spares it the TSC
/// calibration that can hang a TCG guest on a busy host.
pub fn host_tsc_khz() -> u64 {
    let measure = || {
        let (t0, c0) = (Instant::now(), tsc());
        thread::sleep(Duration::from_millis(50));
        let (c1, t1) = (tsc(), Instant::now());
        (c1 - c0) as u128 * 1_000_000 / (t1 - t0).as_nanos().max(1)
    };
    // A preemption between a pair of reads skews one sample; the median of
    // three shrugs it off.
    let mut samples = [measure(), measure(), measure()];
    samples.sort_unstable();
    samples[1] as u64
}

fn tsc() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86_64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// perfbed's kernel command line before the device and the caller's extras,
/// for a host whose TSC runs at `tsc_khz`.
pub fn base_cmdline(tsc_khz: u64) -> Vec<String> {
    vec![
        "console=ttyS0".to_string(),
        // A panic reboots at once, and -no-reboot turns that into an exit.
        "panic=-1".into(),
        "reboot=t".into(),
        format!("tsc_early_khz={tsc_khz}"),
        // No clocksource watchdog: a loaded TCG host would make it flap.
        "tsc=reliable".into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_tsc_is_plausible() {
        let khz = host_tsc_khz();
        assert!((100_000..10_000_000).contains(&khz), "{khz} kHz");
    }
}
