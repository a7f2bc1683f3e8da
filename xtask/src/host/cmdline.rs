//! perfbed's guest kernel command line, and the TSC rate it tells the guest.

use std::fs;
use std::path::Path;
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

/// The guest's TSC rate under an instruction clock (`VmConfig::
/// instruction_clock`): TCG's TSC is QEMU's virtual clock, one tick per
/// nanosecond, which then advances by one per instruction.
pub const INSTRUCTION_CLOCK_KHZ: u64 = 1_000_000;

fn tsc() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86_64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// What the command line depends on: the guest's clock and how it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestClock {
    /// The host's TSC rate (the guest's, under TCG and KVM alike), kHz.
    pub tsc_khz: u64,
    /// The guest kernel's `CONFIG_HZ`, when known (see [`kernel_hz`]).
    pub hz: Option<u64>,
    /// The guest runs under TCG (no hardware virtualisation).
    pub tcg: bool,
}

/// perfbed's kernel command line before the device and the caller's extras.
pub fn base_cmdline(clock: &GuestClock) -> Vec<String> {
    let mut line = vec![
        "console=ttyS0".to_string(),
        // A panic reboots at once, and -no-reboot turns that into an exit.
        "panic=-1".into(),
        "reboot=t".into(),
        format!("tsc_early_khz={}", clock.tsc_khz),
        // No clocksource watchdog: a loaded TCG host would make it flap.
        "tsc=reliable".into(),
    ];
    if let Some(hz) = clock.hz.filter(|&hz| hz > 0) {
        // The boot CPU takes its loops per jiffy from the TSC rate, but every
        // other CPU calibrates its delay loop against the timer tick, which
        // under TCG fails ("calibrate_delay_direct() failed") after ~0.3 s
        // per CPU: most of a 4-vCPU boot's SMP bring-up. Preset it to what
        // the boot CPU computes (TSC cycles per jiffy: udelay() counts those).
        line.push(format!("lpj={}", clock.tsc_khz * 1000 / hz));
    }
    if clock.tcg {
        // TCG's local APIC timer fails the kernel's 100 ms verification
        // ("APIC timer disabled due to verification failure"), after which
        // the tick comes from the IOAPIC's timer, broadcast. Disabling it up
        // front leaves the guest in that same state without the calibration
        // and verification, and without a loaded host deciding the outcome.
        // Under KVM the APIC timer works: keep it.
        line.push("noapictimer".into());
        // With the tick on the IOAPIC, the kernel checks that it ticks by
        // waiting ~10 jiffies of delay loop for it; a loaded host can starve
        // TCG's timer that long and the boot panics ("IO-APIC + timer doesn't
        // work!", seen once at load 10). The timer does work: skip the check.
        line.push("no_timer_check".into());
    }
    line
}

/// The `CONFIG_HZ` of the kernel `vmlinux`, from the `.config` beside it
/// (a kernel tree's); `None` without one (a bare vmlinux), which then boots
/// with every CPU calibrating its delay loop.
pub fn kernel_hz(vmlinux: &Path) -> Option<u64> {
    let config = fs::read_to_string(vmlinux.parent()?.join(".config")).ok()?;
    config
        .lines()
        .find_map(|line| line.strip_prefix("CONFIG_HZ=")?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lpj_needs_the_kernels_hz_and_noapictimer_tcg() {
        let tcg = GuestClock {
            tsc_khz: 2_600_000,
            hz: Some(250),
            tcg: true,
        };
        let line = base_cmdline(&tcg);
        assert!(
            line.contains(&"lpj=10400000".to_string()) && line.contains(&"noapictimer".to_string()),
            "{line:?}"
        );
        assert!(line.contains(&"no_timer_check".to_string()), "{line:?}");
        assert!(
            line.contains(&"tsc_early_khz=2600000".to_string()),
            "{line:?}"
        );
        let kvm = base_cmdline(&GuestClock {
            hz: None,
            tcg: false,
            ..tcg
        });
        assert!(
            !kvm.iter()
                .any(|a| a.starts_with("lpj=") || a == "noapictimer" || a == "no_timer_check"),
            "{kvm:?}"
        );
        assert!(!base_cmdline(&GuestClock { hz: Some(0), ..tcg })
            .iter()
            .any(|a| a.starts_with("lpj=")));
    }

    #[test]
    fn hz_comes_from_the_config_beside_the_vmlinux() {
        let dir = std::env::temp_dir().join(format!("perfbed-hz-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        assert_eq!(kernel_hz(&dir.join("vmlinux")), None, "no .config");
        fs::write(
            dir.join(".config"),
            "CONFIG_HZ_250=y\nCONFIG_HZ=250\n# CONFIG_HZ_1000 is not set\n",
        )
        .unwrap();
        assert_eq!(kernel_hz(&dir.join("vmlinux")), Some(250));
        fs::write(dir.join(".config"), "CONFIG_HZ_PERIODIC=y\n").unwrap();
        assert_eq!(
            kernel_hz(&dir.join("vmlinux")),
            None,
            "CONFIG_HZ_PERIODIC is not CONFIG_HZ"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn measured_tsc_is_plausible() {
        let khz = host_tsc_khz();
        assert!((100_000..10_000_000).contains(&khz), "{khz} kHz");
    }
}
