//! `cargo xtask vmm-bench`: what a device MMIO exit costs perfbed-vmm,
//! against a bare exit to an address nothing claims, side by side on the
//! same vCPU (`perfbed-vmm --bench-exits`): on this machine's /dev/kvm where
//! it opens, and in the box.

use std::fs::{self, File};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::build::box_image;
use crate::build::image::{self, Variant};
use crate::host;
use crate::host::config::VmConfig;
use crate::host::the_box;

#[derive(Args)]
pub struct VmmBenchArgs {
    /// Exits of each kind per measurement.
    #[arg(long, default_value_t = 5000)]
    iterations: u32,
    /// Skip the box (only this machine's /dev/kvm).
    #[arg(long)]
    no_box: bool,
}

/// The figures `perfbed-vmm --bench-exits` prints, `key=value` a line.
fn figures(output: &str) -> Vec<(String, String)> {
    output
        .lines()
        .filter_map(|l| l.trim().split_once('='))
        .filter(|(k, _)| k.ends_with("_ns") || *k == "iterations" || k.ends_with("_ratio"))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

fn print_figures(place: &str, output: &str) -> bool {
    let figures = figures(output);
    if figures.is_empty() {
        println!("{place}: no figures\n{output}");
        return false;
    }
    println!("{place}:");
    for (key, value) in figures {
        println!("  {key:<28} {value}");
    }
    true
}

pub fn run(ws: &Path, args: &VmmBenchArgs) -> Result<bool> {
    let (vmm, _) = box_image::build_binaries(ws)?;
    let iterations = args.iterations.to_string();
    let mut ok = true;
    let accel = host::choose_accel();
    if fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
    {
        let out = Command::new(&vmm)
            .args(["--bench-exits", &iterations])
            .output()
            .context("running perfbed-vmm")?;
        let place = format!("this machine's /dev/kvm ({})", accel.reason);
        ok &= out.status.success() && print_figures(&place, &String::from_utf8_lossy(&out.stdout));
    }
    if args.no_box {
        return Ok(ok);
    }
    let images = image::ensure(ws, Variant::Normal)?;
    let box_images = box_image::ensure(ws, &images.vmlinux, &images.initramfs)?;
    let run_dir = host::config::new_run_dir(ws, "vmm-bench");
    fs::create_dir_all(&run_dir)?;
    let config = VmConfig {
        qemu: images.qemu.binary.clone(),
        firmware_dirs: images.qemu.firmware_dirs.clone(),
        vmlinux: images.vmlinux.clone(),
        initramfs: images.initramfs.clone(),
        cpus: 1,
        memory_mib: 128,
        extra_cmdline: vec![],
        run_dir: run_dir.clone(),
        boot_timeout: Duration::from_secs(300),
        device: Default::default(),
        host: host::Host::VmmBox(box_images.clone()),
        serial_ring: None,
        instruction_clock: false,
        gdb: None,
        verbose: false,
    };
    let agent = run_dir.join("agent.sock");
    let box_log = run_dir.join("box.log");
    let bench_args = vec!["--bench-exits".to_string(), iterations];
    let mut qemu = the_box::qemu_command(
        &config,
        &box_images,
        &bench_args,
        &agent,
        &run_dir.join("control.sock"),
        &run_dir.join("serial.log"),
        host::cmdline::host_tsc_khz(),
    );
    eprintln!(
        "==> the exit benchmark in the box (log: {})",
        box_log.display()
    );
    let mut child = qemu
        .stdin(Stdio::null())
        .stdout(Stdio::from(File::create(&box_log)?))
        .stderr(Stdio::from(File::create(run_dir.join("qemu.log"))?))
        .spawn()
        .context("starting the box's QEMU")?;
    // QEMU waits for the agent socket's client before it starts L1.
    let deadline = Instant::now() + Duration::from_secs(300);
    let _client = loop {
        if let Ok(stream) = UnixStream::connect(&agent) {
            break stream;
        }
        if Instant::now() > deadline || child.try_wait()?.is_some() {
            let _ = child.kill();
            bail!("the box's QEMU did not open {}", agent.display());
        }
        thread::sleep(Duration::from_millis(10));
    };
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!(
                "the box did not finish the benchmark within 300 s (log: {})",
                box_log.display()
            );
        }
        thread::sleep(Duration::from_millis(100));
    };
    let log = fs::read_to_string(&box_log).unwrap_or_default();
    ok &= status.success()
        && print_figures(&format!("in the box ({})", box_images.kernel_package), &log);
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_picked_from_a_console_log() {
        let log = "[ 1.0] kvm: Nested Paging enabled\niterations=100\ndevice_mmio_round_trip_ns=900\n\
                   perfbed-box: console=ttyS0\nbare_mmio_round_trip_ns=800\ndevice_vs_bare_ratio=1.125\n";
        let got = figures(log);
        let keys: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "iterations",
                "device_mmio_round_trip_ns",
                "bare_mmio_round_trip_ns",
                "device_vs_bare_ratio"
            ]
        );
    }
}
