//! The rows measured on booted guests: boot time against stock QEMU, the
//! cost of a counter read in the guest, hotplug throughput with events open,
//! the QEMU host's dispatch cost per access, and QEMU's memory.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use perfbed_agent::{AgentMessage, HostRequest, PerfAttr, ReadTarget};
use perfbed_device::regs::{self, Event};

use crate::build::image::Images;
use crate::guest::Guest;
use crate::guest::{pmu_name, MODULE};
use crate::host::Accel;
use crate::host::config::DEVICE_BASE;
use crate::host::vm::Vm;
use crate::host;
use crate::progress::human;
use crate::run::{scenario_for, RunArgs};
use super::report::{Goal, Row};

/// Stock Debian QEMU (package qemu-system-x86), the boot baseline.
const STOCK_QEMU: &str = "/usr/bin/qemu-system-x86_64";
/// The line the guest kernel prints as it starts `/init`.
const INIT_LINE: &str = "Run /init as init process";
/// microvm's first virtio-mmio transport: its MAGIC register is the
/// cheapest device read the guest can make, the "bare exit".
const VIRTIO_MMIO_BASE: u64 = 0xfeb0_0000;
const VIRTIO_MAGIC: u64 = 0x7472_6976;
const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;

/// How much of each measurement: `--quick` only proves every row works.
pub struct Effort {
    pub boots: usize,
    pub reads: u32,
    pub hotplug_rounds: u32,
}

impl Effort {
    pub fn new(quick: bool) -> Effort {
        if quick {
            Effort { boots: 1, reads: 200, hotplug_rounds: 1 }
        } else {
            Effort { boots: 5, reads: 5000, hotplug_rounds: 5 }
        }
    }
}

pub fn rows(ws: &Path, images: &Images, accel: &Accel, effort: &Effort) -> Result<Vec<Row>> {
    let args = RunArgs::for_tests();
    let mut rows = Vec::new();

    eprintln!("==> bench: {} boots on perfbed's QEMU (microvm) and on stock QEMU (-M pc)", effort.boots);
    let mut ours = Vec::new();
    let mut our_memory = Vec::new();
    let mut kernel_part = Vec::new();
    let mut gaps = Vec::new();
    for i in 0..effort.boots {
        let scenario = scenario_for(ws, images, &args, &format!("bench-boot-{i}"))?;
        let booted = Vm::boot(&scenario.vm, accel)?;
        our_memory.push(rss_beyond_ram_kib(booted.vm.pid(), args.memory)?);
        ours.push(booted.since_spawn);
        kernel_part.push(Duration::from_millis(booted.hello.uptime_ms));
        let serial_log = booted.vm.serial_log.clone();
        booted.vm.power_off(Duration::from_secs(30))?;
        if i == 0 {
            gaps = slowest_gaps(&fs::read_to_string(&serial_log).unwrap_or_default(), 3);
        }
    }
    let mut stock = Vec::new();
    let mut stock_memory = Vec::new();
    let mut pc_cpus = String::new();
    for i in 0..effort.boots {
        let scenario = scenario_for(ws, images, &args, &format!("bench-boot-pc-{i}"))?;
        let (time, memory) = stock_boot_to_init(&scenario.vm, accel)?;
        if i == 0 {
            // A kernel without ACPI finds only the boot CPU on -M pc: say so.
            let log = fs::read_to_string(scenario.vm.run_dir.join("serial.log")).unwrap_or_default();
            pc_cpus = log.lines().find_map(|l| Some(l.split_once("smp: Brought up ")?.1.trim().to_string())).unwrap_or_default();
        }
        stock.push(time);
        stock_memory.push(memory);
    }
    let (ours, stock, kernel_part) = (median(&mut ours), median(&mut stock), median(&mut kernel_part));
    eprintln!("    perfbed microvm {} to agent ready, stock -M pc {} to /init (medians)", human(ours), human(stock));
    rows.push(
        Row::new("boot: VM start to agent ready (perfbed QEMU microvm)", ours.as_secs_f64(), "s")
            .against("stock QEMU -M pc to /init", stock.as_secs_f64())
            .goal(Goal::RatioAtMost(1.0 / 3.0))
            .note(format!(
                "median of {} boots each, {} vCPUs, {} MiB, TCG; the -M pc baseline stops at the kernel's \"{INIT_LINE}\" \
                 (its guest has no PCI for the agent's virtio console), which favours it; the -M pc guest brought up {pc_cpus}; \
                 perfbed-vmm: not written yet. \
                 Where perfbed's boot goes: QEMU start and firmware {}, guest kernel to agent ready {} (guest uptime); \
                 slowest kernel log gaps: {}",
                effort.boots,
                args.cpus,
                args.memory,
                human(ours.saturating_sub(kernel_part)),
                human(kernel_part),
                gaps.join("; ")
            )),
    );
    rows.push(
        Row::new("memory: QEMU RSS beyond guest RAM (perfbed microvm)", median_f(&mut our_memory) / 1024.0, "MiB")
            .against("stock QEMU -M pc", median_f(&mut stock_memory) / 1024.0)
            .note("resident memory of the QEMU process minus the guest RAM mapping's, once the guest is up"),
    );

    let scenario = scenario_for(ws, images, &args, "bench-guest")?;
    let booted = Vm::boot(&scenario.vm, accel)?;
    let mut vm = booted.vm;
    let mut guest = Guest { vm: &mut vm, timeout: Duration::from_secs(300) };
    rows.extend(in_guest(&mut guest, &scenario.vm.device, effort)?);
    let serial_log = vm.serial_log.clone();
    vm.power_off(Duration::from_secs(30))?;
    let problems = host::console::kernel_log_problems(&fs::read_to_string(&serial_log).unwrap_or_default());
    if !problems.is_empty() {
        bail!("the benchmark guest's kernel log has problems (see {}):\n  {}", serial_log.display(), problems.join("\n  "));
    }
    Ok(rows)
}

/// Counter reads, dispatch and hotplug, in one guest with perfbed.ko loaded.
fn in_guest(g: &mut Guest, device: &perfbed_device::DeviceConfig, effort: &Effort) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    g.expect_done(HostRequest::LoadModule { name: MODULE.into() })?;
    // Domain 1 (CPUs 2-3 by default): its owner is not CPU 0.
    let domain = device.domains.len() - 1;
    let pmu = pmu_name(domain);
    let ty = g.pmu_type(&pmu)?;
    let owner = *g.cpumask(&pmu)?.first().with_context(|| format!("{pmu} is parked with every CPU online"))?;
    let other = if owner == 0 { 1 } else { 0 };
    let attr = PerfAttr { type_: ty, config: Event::MbmTotalBytes as u64 | 1 << 8, ..PerfAttr::default() };
    let event = match g.open_as(attr, -1, owner as i32, None)? {
        Ok(handle) => handle,
        Err(errno) => bail!("opening {pmu}/mbm_total_bytes,rmid=1/: {errno}"),
    };
    let software = PerfAttr { type_: PERF_TYPE_SOFTWARE, config: PERF_COUNT_SW_CPU_CLOCK, ..PerfAttr::default() };
    let sw = match g.open_as(software, -1, owner as i32, None)? {
        Ok(handle) => handle,
        Err(errno) => bail!("opening cpu-clock on CPU {owner}: {errno}"),
    };
    let n = effort.reads;
    let owner_read = time(g, ReadTarget::Event { handle: event }, owner, n)?.0;
    let other_read = time(g, ReadTarget::Event { handle: event }, other, n)?.0;
    let sw_read = time(g, ReadTarget::Event { handle: sw }, owner, n)?.0;
    let registers = ReadTarget::Mmio { base: DEVICE_BASE, size: device.size(), offset: 0 };
    let floor_target = ReadTarget::Mmio { base: DEVICE_BASE, size: device.size(), offset: regs::slot_count(domain as u64, 0) };
    let (floor, floor_value) = time(g, floor_target, owner, n)?;
    if floor_value & regs::COUNTER_ERROR != 0 {
        bail!("the floor's register read from the owner CPU {owner} got the error bit ({floor_value:#x})");
    }
    let (magic, magic_value) = time(g, registers, owner, n)?;
    if magic_value != regs::MAGIC_VALUE {
        bail!("reading perfbed's MAGIC register gave {magic_value:#x}");
    }
    g.close(event)?;
    g.close(sw)?;
    let reads_note = format!("{n} reads in a loop pinned to the CPU, TCG; ns per read() or load");
    rows.push(
        Row::new("counter read: read() on the owner CPU", owner_read, "ns")
            .against("floor + software read", floor + sw_read)
            .goal(Goal::RatioAtMost(1.2))
            .note(reads_note),
    );
    rows.push(Row::new("counter read: read() from another CPU", other_read, "ns").against("owner CPU read()", owner_read));
    rows.push(Row::new("counter read: register load via /dev/mem (floor)", floor, "ns"));
    rows.push(Row::new("counter read: read() of a software event (cpu-clock)", sw_read, "ns"));

    match time(g, ReadTarget::Mmio { base: VIRTIO_MMIO_BASE, size: 4096, offset: 0 }, owner, n) {
        Ok((bare, value)) if value & 0xffff_ffff == VIRTIO_MAGIC => rows.push(
            Row::new("device: QEMU dispatch ns/access (perfbed minus bare exit)", magic - bare, "ns")
                .against("bare exit (virtio-mmio MAGIC)", bare)
                .note("a load of perfbed's MAGIC register minus one of virtio-mmio's MAGIC, both behind QEMU's global lock"),
        ),
        Ok((_, value)) => bail!("virtio-mmio's MAGIC register read {value:#x}"),
        Err(e) => rows.push(Row::new("device: QEMU dispatch ns/access (perfbed minus bare exit)", magic, "ns").note(format!(
            "no bare exit to compare with ({e:#}); the value is perfbed's whole load"
        ))),
    }

    rows.extend(hotplug(g, device, effort.hotplug_rounds)?);
    Ok(rows)
}

/// ns per read of `target` from `cpu`, and the last value read.
fn time(g: &mut Guest, target: ReadTarget, cpu: u32, iterations: u32) -> Result<(f64, u64)> {
    match g.ask(HostRequest::TimeReads { target: target.clone(), cpu, iterations })? {
        AgentMessage::Timed { iterations, total_ns, last } if iterations > 0 => {
            Ok((total_ns as f64 / f64::from(iterations), last))
        }
        other => bail!("timing reads of {target:?} on CPU {cpu}: {other:?}"),
    }
}

/// Offline+online operations per second with 0, 4 and 16 perfbed events
/// open (spread over the domains, RMIDs and events).
fn hotplug(g: &mut Guest, device: &perfbed_device::DeviceConfig, rounds: u32) -> Result<Vec<Row>> {
    let types: Vec<u32> = (0..device.domains.len()).map(|d| g.pmu_type(&pmu_name(d))).collect::<Result<_>>()?;
    let mut rates = Vec::new();
    for events in [0u32, 4, 16] {
        let mut handles = Vec::new();
        for i in 0..events {
            let event = if i % 2 == 0 { Event::MbmTotalBytes } else { Event::MbmLocalBytes };
            let rmid = u64::from(i / 2 % device.rmids);
            let attr = PerfAttr { type_: types[i as usize % types.len()], config: event as u64 | rmid << 8, ..PerfAttr::default() };
            match g.open(attr, None)? {
                Ok(handle) => handles.push(handle),
                Err(errno) => bail!("opening hotplug event {i}: {errno}"),
            }
        }
        let answer = g.ask(HostRequest::Hotplug { rounds })?;
        let AgentMessage::Hotplug { rounds: done } = answer else {
            bail!("hotplug with {events} events: {answer:?}");
        };
        if let Some(problem) = done.iter().flat_map(|r| &r.problems).next() {
            bail!("hotplug with {events} events: {problem}");
        }
        let movable = u32::from(device.domains.iter().flatten().filter(|&&c| c != 0).count() as u8);
        let (off, on): (u64, u64) = done.iter().fold((0, 0), |(a, b), r| (a + r.offline_us, b + r.online_us));
        let ops = f64::from(2 * movable * rounds);
        rates.push((events, ops / ((off + on) as f64 / 1e6), off as f64 / f64::from(movable * rounds) / 1000.0, on as f64 / f64::from(movable * rounds) / 1000.0));
        for handle in handles {
            g.close(handle)?;
        }
    }
    let none = rates[0].1;
    let split = |(_, _, off, on): &(u32, f64, f64, f64)| format!("offline {off:.1} ms + online {on:.1} ms per CPU");
    Ok(vec![
        Row::new("hotplug: offline+online ops/s, no events", none, "ops/s").note(split(&rates[0])),
        Row::new("hotplug: offline+online ops/s, 4 events", rates[1].1, "ops/s").against("no events", none).note(split(&rates[1])),
        Row::new("hotplug: offline+online ops/s, 16 events", rates[2].1, "ops/s")
            .against("no events", none)
            .goal(Goal::RatioAtLeast(0.95))
            .note(format!("{}; {rounds} round(s) of every CPU but 0 offline then online", split(&rates[2]))),
    ])
}

/// Boots the same kernel and initramfs on stock Debian QEMU's `-M pc` and
/// returns the time from its start to the kernel starting `/init`, and its
/// resident memory beyond guest RAM then (KiB).
fn stock_boot_to_init(config: &host::config::VmConfig, accel: &Accel) -> Result<(Duration, f64)> {
    if !Path::new(STOCK_QEMU).is_file() {
        bail!("{STOCK_QEMU} is missing (Debian package qemu-system-x86; `cargo xtask bench` installs it as root)");
    }
    fs::create_dir_all(&config.run_dir)?;
    let mut qemu = Command::new(STOCK_QEMU);
    qemu.args(["-M", "pc"]);
    host::qemu::guest_args(&mut qemu, config, accel, &host::cmdline::base_cmdline(host::cmdline::host_tsc_khz()).join(" "));
    qemu.args(["-serial", "stdio"]);
    fs::write(config.run_dir.join("qemu.cmd"), crate::cmd::display(&qemu) + "\n")?;
    let start = Instant::now();
    let mut child = qemu
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(fs::File::create(config.run_dir.join("qemu.log"))?))
        .spawn()
        .with_context(|| format!("starting {STOCK_QEMU}"))?;
    let stdout = child.stdout.take().context("QEMU's stdout is piped")?;
    let mut log = fs::File::create(config.run_dir.join("serial.log"))?;
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).split(b'\n') {
            let Ok(line) = line else { break };
            let _ = log.write_all(&line).and_then(|()| log.write_all(b"\n"));
            if String::from_utf8_lossy(&line).contains(INIT_LINE) && tx.send(Instant::now()).is_err() {
                break;
            }
        }
    });
    let result = match rx.recv_timeout(config.boot_timeout) {
        Ok(at) => rss_beyond_ram_kib(child.id(), config.memory_mib).map(|memory| (at - start, memory)),
        Err(_) => Err(anyhow::anyhow!(
            "stock QEMU -M pc did not reach /init within {:?}; see {}",
            config.boot_timeout,
            config.run_dir.join("serial.log").display()
        )),
    };
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// The resident memory of process `pid` outside its guest RAM mapping (the
/// one mapping of guest RAM's size, give or take QEMU's alignment), in KiB.
fn rss_beyond_ram_kib(pid: u32, ram_mib: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/smaps");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let ram_kib = u64::from(ram_mib) * 1024;
    let field = |line: &str, name: &str| -> Option<u64> { line.strip_prefix(name)?.split_whitespace().next()?.parse().ok() };
    let (mut total, mut ram, mut size) = (0u64, 0u64, 0u64);
    for line in text.lines() {
        if let Some(kib) = field(line, "Size:") {
            size = kib;
        } else if let Some(kib) = field(line, "Rss:") {
            total += kib;
            if (ram_kib..=ram_kib + 4096).contains(&size) {
                ram += kib;
            }
        }
    }
    if ram == 0 {
        bail!("no guest RAM mapping of {ram_mib} MiB found in {path}");
    }
    Ok((total - ram) as f64)
}

/// The `n` longest pauses between consecutive timestamped kernel log lines:
/// "0.312 s before <line>".
fn slowest_gaps(log: &str, n: usize) -> Vec<String> {
    let stamped: Vec<(f64, &str)> = log
        .lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix('[')?;
            let (stamp, text) = rest.split_once(']')?;
            Some((stamp.trim().parse().ok()?, text.trim()))
        })
        .collect();
    let mut gaps: Vec<(f64, &str)> = stamped.windows(2).map(|w| (w[1].0 - w[0].0, w[1].1)).collect();
    gaps.sort_by(|a, b| b.0.total_cmp(&a.0));
    gaps.iter().take(n).map(|(gap, line)| format!("{gap:.3} s before \"{}\"", line.chars().take(60).collect::<String>())).collect()
}

fn median(times: &mut [Duration]) -> Duration {
    times.sort_unstable();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

fn median_f(values: &mut [f64]) -> f64 {
    values.sort_unstable_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slowest_gaps_name_the_line_after_the_pause() {
        let log = "[    0.000000] Linux version\n[    0.100000] a\nno stamp\n[    0.900000] slow one\n[    1.000000] b\n";
        assert_eq!(slowest_gaps(log, 2), vec!["0.800 s before \"slow one\"", "0.100 s before \"a\""]);
        assert!(slowest_gaps("", 3).is_empty());
    }
}
