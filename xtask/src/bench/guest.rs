//! The rows measured on booted guests: boot time against stock QEMU, the
//! cost of a counter read in the guest, hotplug throughput with events open,
//! the QEMU host's dispatch cost per access, and QEMU's memory.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use perfbed_agent::{AgentMessage, HostRequest, PerfAttr, ReadTarget};
use perfbed_device::regs::{self, Event};

use super::report::{Goal, Row};
use super::stats::Summary;
use crate::build::image::Images;
use crate::guest::Guest;
use crate::guest::{pmu_name, MODULE};
use crate::host;
use crate::host::config::DEVICE_BASE;
use crate::host::vm::Vm;
use crate::host::Accel;
use crate::run::scenario::Scenario;
use crate::run::{scenario_for, RunArgs};

/// Stock Debian QEMU (package qemu-system-x86), the boot baseline.
const STOCK_QEMU: &str = "/usr/bin/qemu-system-x86_64";
/// The line the guest kernel prints as it starts `/init` (for the boot breakdown).
const INIT_LINE: &str = "Run /init as init process";
/// microvm's first virtio-mmio transport: its MAGIC register is the
/// cheapest device read the guest can make, the "bare exit".
const VIRTIO_MMIO_BASE: u64 = 0xfeb0_0000;
const VIRTIO_MAGIC: u64 = 0x7472_6976;
pub(super) const PERF_TYPE_SOFTWARE: u32 = 1;
pub(super) const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;

/// How much of each measurement: `--quick` only proves every row works.
pub struct Effort {
    pub boots: usize,
    /// Reads per timed loop, and timed loops of each kind, interleaved.
    pub reads: u32,
    pub read_rounds: u32,
    pub hotplug_rounds: u32,
}

impl Effort {
    pub fn new(quick: bool) -> Effort {
        if quick {
            Effort {
                boots: 1,
                reads: 200,
                read_rounds: 2,
                hotplug_rounds: 1,
            }
        } else {
            Effort {
                boots: 5,
                reads: 2000,
                read_rounds: 7,
                hotplug_rounds: 5,
            }
        }
    }
}

pub fn rows(ws: &Path, images: &Images, accel: &Accel, effort: &Effort) -> Result<Vec<Row>> {
    let args = RunArgs::for_tests();
    // The same images on one vCPU (its one domain on CPU 0): what SMP costs.
    let one_cpu = RunArgs {
        cpus: 1,
        domains: Some("0".into()),
        ..RunArgs::for_tests()
    };
    let mut rows = Vec::new();

    eprintln!(
        "==> bench: {} rounds of boots to agent ready, interleaved: perfbed's QEMU with {} vCPUs and with 1, stock QEMU with {}",
        effort.boots, args.cpus, args.cpus
    );
    let (mut ours, mut one, mut stock) = (Vec::new(), Vec::new(), Vec::new());
    let (mut our_memory, mut stock_memory, mut kernel_part, mut one_kernel_part) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut breakdown = BootBreakdown::default();
    for i in 0..effort.boots {
        let scenario = scenario_for(ws, images, &args, &format!("bench-boot-{i}"))?;
        let booted = Vm::boot(&scenario.vm, accel)?;
        our_memory.push(rss_beyond_ram_kib(booted.vm.pid(), args.memory)?);
        ours.push(booted.since_spawn.as_secs_f64());
        kernel_part.push(booted.hello.uptime_ms as f64 / 1000.0);
        let serial_log = booted.vm.serial_log.clone();
        booted.vm.power_off(Duration::from_secs(30))?;
        if i == 0 {
            breakdown = BootBreakdown::of(&fs::read_to_string(&serial_log).unwrap_or_default());
        }

        let scenario = scenario_for(ws, images, &one_cpu, &format!("bench-boot-1cpu-{i}"))?;
        let booted = Vm::boot(&scenario.vm, accel)?;
        one.push(booted.since_spawn.as_secs_f64());
        one_kernel_part.push(booted.hello.uptime_ms as f64 / 1000.0);
        booted.vm.power_off(Duration::from_secs(30))?;

        let scenario = scenario_for(ws, images, &args, &format!("bench-boot-stock-{i}"))?;
        let (time, memory) = stock_boot_to_agent(&scenario.vm, accel)?;
        stock.push(time.as_secs_f64());
        stock_memory.push(memory);
    }
    let summary = |samples: &[f64]| Summary::of(samples).context("no boots measured");
    let (ours, one, stock) = (summary(&ours)?, summary(&one)?, summary(&stock)?);
    let (kernel_part, one_kernel_part) = (summary(&kernel_part)?, summary(&one_kernel_part)?);
    eprintln!(
        "    perfbed {} vCPUs {:.3} s, 1 vCPU {:.3} s, stock QEMU {:.3} s to agent ready (medians)",
        args.cpus, ours.median, one.median, stock.median
    );
    let how = format!(
        "median ± half range of {} boots each, interleaved, {} MiB, {}; from QEMU's start to the agent's greeting",
        effort.boots,
        args.memory,
        if accel.kvm { "KVM" } else { "TCG" }
    );
    rows.push(
        Row::measured(&format!("boot: VM start to agent ready, {} vCPUs (perfbed QEMU microvm)", args.cpus), ours, "s")
            .against(&format!("stock QEMU 7.2 microvm, {} vCPUs, same guest, no perfbed device", args.cpus), stock.median)
            .goal(Goal::AtMost(1.0))
            .note(format!(
                "{how}. Where it goes: QEMU start and firmware {:.3} s, guest kernel to agent ready {:.3} s (guest uptime); {}",
                ours.median - kernel_part.median,
                kernel_part.median,
                breakdown.describe()
            )),
    );
    rows.push(
        Row::measured(&format!("boot: VM start to agent ready, {} vCPUs against 1 (perfbed QEMU microvm)", args.cpus), ours, "s")
            .against("the same images on 1 vCPU", one.median)
            .goal(Goal::RatioAtMost(1.1))
            .note(format!(
                "{how}; 1 vCPU: ± {:.3} s, guest uptime at agent ready {:.3} s against {:.3} s with {} vCPUs",
                one.spread, one_kernel_part.median, kernel_part.median, args.cpus
            )),
    );
    rows.push(
        Row::measured("memory: QEMU RSS beyond guest RAM (perfbed microvm)", summary(&our_memory)?.scaled(1.0 / 1024.0), "MiB")
            .against("stock QEMU 7.2 microvm", summary(&stock_memory)?.median / 1024.0)
            .note("resident memory of the QEMU process minus the guest RAM mapping's, at the agent's greeting"),
    );

    let scenario = scenario_for(ws, images, &args, "bench-guest")?;
    let booted = Vm::boot(&scenario.vm, accel)?;
    let mut vm = booted.vm;
    let mut guest = Guest {
        vm: &mut vm,
        timeout: Duration::from_secs(300),
    };
    rows.extend(in_guest(&mut guest, &scenario.vm.device, effort)?);
    let serial_log = vm.serial_log.clone();
    vm.power_off(Duration::from_secs(30))?;
    let problems =
        host::console::kernel_log_problems(&fs::read_to_string(&serial_log).unwrap_or_default());
    if !problems.is_empty() {
        bail!(
            "the benchmark guest's kernel log has problems (see {}):\n  {}",
            serial_log.display(),
            problems.join("\n  ")
        );
    }
    Ok(rows)
}

/// The counter-read rows alone (`bench --reads`): one guest on perfbed's
/// QEMU, perfbed.ko loaded, the same interleaved rounds as the full bench.
pub fn read_rows(ws: &Path, images: &Images, accel: &Accel, effort: &Effort) -> Result<Vec<Row>> {
    let args = RunArgs::for_tests();
    let scenario = scenario_for(ws, images, &args, "bench-reads")?;
    eprintln!(
        "==> bench: {} interleaved rounds of the counter reads, {} reads each",
        effort.read_rounds, effort.reads
    );
    let mut vm = Vm::boot(&scenario.vm, accel)?.vm;
    let mut g = Guest {
        vm: &mut vm,
        timeout: Duration::from_secs(300),
    };
    g.expect_done(HostRequest::LoadModule {
        name: MODULE.into(),
    })?;
    let rows = reads(&mut g, &scenario.vm.device, effort, &Place::Qemu)?;
    vm.power_off(Duration::from_secs(30))?;
    Ok(rows)
}

/// Counter reads, dispatch and hotplug, in one guest with perfbed.ko loaded.
fn in_guest(
    g: &mut Guest,
    device: &perfbed_device::DeviceConfig,
    effort: &Effort,
) -> Result<Vec<Row>> {
    g.expect_done(HostRequest::LoadModule {
        name: MODULE.into(),
    })?;
    let mut rows = reads(g, device, effort, &Place::Qemu)?;
    rows.extend(hotplug(g, device, effort.hotplug_rounds)?);
    Ok(rows)
}

/// Which host the read rows were measured on.
enum Place {
    Qemu,
    /// perfbed-vmm, natively or in the box: `name` says which.
    Vmm {
        name: &'static str,
    },
}

impl Place {
    /// The rows' names end with this.
    fn suffix(&self) -> String {
        match self {
            Place::Qemu => String::new(),
            Place::Vmm { name } => format!(" (perfbed-{name})"),
        }
    }
}

/// perfbed-vmm's rows: one boot to agent ready and the counter reads, on
/// native KVM where this machine has VT-x/SVM, else in the box (an L1 Linux
/// under QEMU TCG running perfbed-vmm on its KVM).
pub fn vmm_rows(ws: &Path, images: &Images, accel: &Accel, effort: &Effort) -> Result<Vec<Row>> {
    let args = RunArgs {
        host: host::HostChoice::Vmm,
        ..RunArgs::for_tests()
    };
    let scenario = scenario_for(ws, images, &args, "bench-vmm")?;
    let run_dir = &scenario.vm.run_dir;
    let mut attempt = 0;
    loop {
        let _ = fs::remove_file(run_dir.join(host::vm::BOX_STUCK_FILE));
        let error = match vmm_rows_once(&scenario, &args, accel, effort) {
            Ok(rows) => return Ok(rows),
            Err(e) => e,
        };
        // As the tests do (`test::RERUN_ON_BOX_HANG`): only a run the
        // harness diagnosed as the box itself stuck runs again, loudly.
        let Some(why) = host::vm::box_hung(run_dir) else {
            return Err(error);
        };
        attempt += 1;
        if attempt > host::vm::BOX_HANG_RERUNS {
            return Err(error.context(format!("the box itself hung {attempt} times in a row")));
        }
        let kept = host::vm::keep_run_dir(run_dir, &format!("box-hang-{attempt}"))?;
        eprintln!(
            "==> bench: THE BOX ITSELF HUNG (its QEMU under TCG or L1, not perfbed; docs/box-verification.md), rerun {attempt} of at most {}:\n  {}\n  the hung attempt ({error}) is kept in {}",
            host::vm::BOX_HANG_RERUNS,
            why.trim().replace('\n', "\n  "),
            kept.display()
        );
    }
}

/// One boot of perfbed-vmm and its rows.
fn vmm_rows_once(
    scenario: &Scenario,
    args: &RunArgs,
    accel: &Accel,
    effort: &Effort,
) -> Result<Vec<Row>> {
    let place = Place::Vmm {
        name: scenario.vm.host.name(),
    };
    eprintln!(
        "==> bench: perfbed-{}: a boot and the counter reads",
        scenario.vm.host.name()
    );
    let booted = Vm::boot(&scenario.vm, accel)?;
    let boot = Row::new(
        &format!(
            "boot: VM start to agent ready, {} vCPUs{}",
            args.cpus,
            place.suffix()
        ),
        booted.since_spawn.as_secs_f64(),
        "s",
    )
    .note(format!(
        "one boot; guest uptime at agent ready {:.3} s{}",
        booted.hello.uptime_ms as f64 / 1000.0,
        if matches!(scenario.vm.host, host::Host::VmmBox(_)) {
            "; from the box's QEMU start: its L1 Linux boots first"
        } else {
            ""
        }
    ));
    let mut vm = booted.vm;
    let mut g = Guest {
        vm: &mut vm,
        timeout: Duration::from_secs(600),
    };
    g.expect_done(HostRequest::LoadModule {
        name: MODULE.into(),
    })?;
    let mut rows = vec![boot];
    rows.extend(reads(&mut g, &scenario.vm.device, effort, &place)?);
    vm.power_off(Duration::from_secs(60))?;
    Ok(rows)
}

/// The counter-read and dispatch rows. Each figure is measured once per
/// round and the rounds interleaved, so that a sum or difference of figures
/// is taken within a round, the load of the moment on both sides of it.
///
/// On perfbed-vmm there is no QEMU dispatch and no virtio-mmio register to
/// compare with: its rows are the reads alone.
fn reads(
    g: &mut Guest,
    device: &perfbed_device::DeviceConfig,
    effort: &Effort,
    place: &Place,
) -> Result<Vec<Row>> {
    // The last domain (CPUs 2-3 by default): its owner is not CPU 0.
    let domain = device.domains.len() - 1;
    let pmu = pmu_name(domain);
    let ty = g.pmu_type(&pmu)?;
    let owner = *g
        .cpumask(&pmu)?
        .first()
        .with_context(|| format!("{pmu} is parked with every CPU online"))?;
    let other = if owner == 0 { 1 } else { 0 };
    let attr = PerfAttr {
        type_: ty,
        config: Event::MbmTotalBytes as u64 | 1 << 8,
        ..PerfAttr::default()
    };
    let event = match g.open_as(attr, -1, owner as i32, None)? {
        Ok(handle) => handle,
        Err(errno) => bail!("opening {pmu}/mbm_total_bytes,rmid=1/: {errno}"),
    };
    let software = PerfAttr {
        type_: PERF_TYPE_SOFTWARE,
        config: PERF_COUNT_SW_CPU_CLOCK,
        ..PerfAttr::default()
    };
    let sw = match g.open_as(software, -1, owner as i32, None)? {
        Ok(handle) => handle,
        Err(errno) => bail!("opening cpu-clock on CPU {owner}: {errno}"),
    };
    let n = effort.reads;
    let magic_target = ReadTarget::Mmio {
        base: DEVICE_BASE,
        size: device.size(),
        offset: 0,
    };
    let floor_target = ReadTarget::Mmio {
        base: DEVICE_BASE,
        size: device.size(),
        offset: regs::slot_count(domain as u64, 0),
    };
    let bare_target = ReadTarget::Mmio {
        base: VIRTIO_MMIO_BASE,
        size: 4096,
        offset: 0,
    };
    let mut r = ReadRounds::default();
    for _ in 0..effort.read_rounds {
        let owner_read = time(g, ReadTarget::Event { handle: event }, owner, n)?.0;
        let other_read = time(g, ReadTarget::Event { handle: event }, other, n)?.0;
        let sw_read = time(g, ReadTarget::Event { handle: sw }, owner, n)?.0;
        let (floor, floor_value) = time(g, floor_target.clone(), owner, n)?;
        if floor_value & regs::COUNTER_ERROR != 0 {
            bail!("the floor's register read from the owner CPU {owner} got the error bit ({floor_value:#x})");
        }
        let (magic, magic_value) = time(g, magic_target.clone(), owner, n)?;
        if magic_value != regs::MAGIC_VALUE {
            bail!("reading perfbed's MAGIC register gave {magic_value:#x}");
        }
        if let Place::Qemu = place {
            let (bare, bare_value) = time(g, bare_target.clone(), owner, n)?;
            if bare_value & 0xffff_ffff != VIRTIO_MAGIC {
                bail!("virtio-mmio's MAGIC register read {bare_value:#x}");
            }
            r.bare.push(bare);
            r.dispatch.push(magic - bare);
        }
        r.owner.push(owner_read);
        r.other.push(other_read);
        r.software.push(sw_read);
        r.floor.push(floor);
        r.owner_floor.push(floor + sw_read);
        r.owner_extra.push(owner_read - floor - sw_read);
        r.other_extra.push(other_read - owner_read);
    }
    g.close(event)?;
    g.close(sw)?;
    let s = |samples: &[f64]| Summary::of(samples).context("no read rounds measured");
    let (owner_read, owner_extra, other_extra) =
        (s(&r.owner)?, s(&r.owner_extra)?, s(&r.other_extra)?);
    let rounds = effort.read_rounds;
    let how = format!("median ± half range of {rounds} interleaved rounds of {n} reads in a loop pinned to the CPU; ns per read() or load");
    let at = place.suffix();
    let mut rows = vec![
        Row::measured(
            &format!("counter read: read() on the owner CPU{at}"),
            owner_read,
            "ns",
        )
        .against("floor + software read", s(&r.owner_floor)?.median)
        .goal(Goal::RatioAtMost(1.2))
        .note(format!(
            "{how}; above floor + software read within each round: {:.0} ± {:.0} ns",
            owner_extra.median, owner_extra.spread
        )),
        Row::measured(
            &format!("counter read: read() from another CPU{at}"),
            s(&r.other)?,
            "ns",
        )
        .against("owner CPU read()", owner_read.median)
        .note(format!(
            "above the owner's read within each round: {:.0} ± {:.0} ns",
            other_extra.median, other_extra.spread
        )),
        Row::measured(
            &format!("counter read: register load via /dev/mem (floor){at}"),
            s(&r.floor)?,
            "ns",
        ),
        Row::measured(
            &format!("counter read: read() of a software event (cpu-clock){at}"),
            s(&r.software)?,
            "ns",
        ),
    ];
    if let Place::Qemu = place {
        rows.push(
            Row::measured("device: QEMU dispatch ns/access (perfbed minus bare exit)", s(&r.dispatch)?, "ns")
                .against("bare exit (virtio-mmio MAGIC)", s(&r.bare)?.median)
                .note(
                    "a load of perfbed's MAGIC register minus one of virtio-mmio's MAGIC, both behind QEMU's global lock, \
                     the difference taken within each round: a spread wider than the value means no difference is seen",
                ),
        );
    }
    Ok(rows)
}

/// The per-round figures of [`reads`] (ns).
#[derive(Default)]
struct ReadRounds {
    owner: Vec<f64>,
    other: Vec<f64>,
    software: Vec<f64>,
    floor: Vec<f64>,
    owner_floor: Vec<f64>,
    owner_extra: Vec<f64>,
    other_extra: Vec<f64>,
    bare: Vec<f64>,
    dispatch: Vec<f64>,
}

/// ns per read of `target` from `cpu`, and the last value read.
pub(super) fn time(
    g: &mut Guest,
    target: ReadTarget,
    cpu: u32,
    iterations: u32,
) -> Result<(f64, u64)> {
    match g.ask(HostRequest::TimeReads {
        target: target.clone(),
        cpu,
        iterations,
    })? {
        AgentMessage::Timed {
            iterations,
            total_ns,
            last,
        } if iterations > 0 => Ok((total_ns as f64 / f64::from(iterations), last)),
        other => bail!("timing reads of {target:?} on CPU {cpu}: {other:?}"),
    }
}

/// The numbers of perfbed events the hotplug rows hold open.
pub const HOTPLUG_EVENTS: [u32; 4] = [0, 4, 16, 64];

/// Offline+online throughput with some events open.
pub struct HotplugRate {
    pub events: u32,
    /// Operations (an offline or an online of one CPU) per second, over the rounds.
    pub ops: Summary,
    /// Mean ms per CPU offline, and per CPU online.
    pub offline_ms: f64,
    pub online_ms: f64,
}

/// Offline+online throughput with each of [`HOTPLUG_EVENTS`] perfbed
/// events open, spread over the domains, RMIDs and events.
pub fn hotplug_rates(
    g: &mut Guest,
    device: &perfbed_device::DeviceConfig,
    rounds: u32,
) -> Result<Vec<HotplugRate>> {
    let types: Vec<u32> = (0..device.domains.len())
        .map(|d| g.pmu_type(&pmu_name(d)))
        .collect::<Result<_>>()?;
    let movable = device.domains.iter().flatten().filter(|&&c| c != 0).count() as f64;
    let mut rates = Vec::new();
    for events in HOTPLUG_EVENTS {
        let mut handles = Vec::new();
        for i in 0..events {
            let event = if i % 2 == 0 {
                Event::MbmTotalBytes
            } else {
                Event::MbmLocalBytes
            };
            let rmid = u64::from(i / 2 % device.rmids);
            let attr = PerfAttr {
                type_: types[i as usize % types.len()],
                config: event as u64 | rmid << 8,
                ..PerfAttr::default()
            };
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
        let per_round: Vec<f64> = done
            .iter()
            .map(|r| 2.0 * movable / ((r.offline_us + r.online_us) as f64 / 1e6))
            .collect();
        let (off, on): (u64, u64) = done
            .iter()
            .fold((0, 0), |(a, b), r| (a + r.offline_us, b + r.online_us));
        let per_cpu_ms = |us: u64| us as f64 / (movable * done.len() as f64) / 1000.0;
        let ops = Summary::of(&per_round).context("the hotplug answered no rounds")?;
        rates.push(HotplugRate {
            events,
            ops,
            offline_ms: per_cpu_ms(off),
            online_ms: per_cpu_ms(on),
        });
        for handle in handles {
            g.close(handle)?;
        }
    }
    Ok(rates)
}

/// The guest shapes of the hotplug scaling table: (vCPUs, domains). With 16
/// PMUs every domain is one CPU, so that offlining a CPU parks its PMU
/// instead of moving it.
const SCALING_SHAPES: [(u8, &str); 4] = [
    (4, "0-3"),
    (4, "0-1:2-3"),
    (8, "0-1:2-3:4-5:6-7"),
    (16, "0:1:2:3:4:5:6:7:8:9:10:11:12:13:14:15"),
];

/// `bench --hotplug-scaling`: offline+online ops/s for each number of
/// events open on each shape of [`SCALING_SHAPES`], each against the same
/// guest with no events (the CPU count differs between shapes, and hotplug
/// costs grow with it: compare within a shape). `kernel_args` go at the end
/// of every guest's command line.
pub fn hotplug_scaling(
    ws: &Path,
    images: &Images,
    accel: &Accel,
    kernel_args: &[String],
) -> Result<Vec<Row>> {
    const ROUNDS: u32 = 3;
    let mut rows = Vec::new();
    for (cpus, domains) in SCALING_SHAPES {
        let args = RunArgs {
            cpus,
            domains: Some(domains.into()),
            ..RunArgs::for_tests()
        };
        let pmus = domains.split(':').count();
        eprintln!("==> hotplug scaling: {pmus} PMU(s) on {cpus} vCPUs ({domains})");
        let mut scenario = scenario_for(ws, images, &args, &format!("bench-scaling-{pmus}"))?;
        scenario
            .vm
            .extra_cmdline
            .extend(kernel_args.iter().cloned());
        let mut vm = Vm::boot(&scenario.vm, accel)?.vm;
        let mut g = Guest {
            vm: &mut vm,
            timeout: Duration::from_secs(600),
        };
        g.expect_done(HostRequest::LoadModule {
            name: MODULE.into(),
        })?;
        let rates = hotplug_rates(&mut g, &scenario.vm.device, ROUNDS)?;
        vm.power_off(Duration::from_secs(30))?;
        let none = rates[0].ops.median;
        for r in &rates {
            rows.push(
                Row::measured(
                    &format!("hotplug: {pmus} PMU(s), {cpus} vCPUs, {} events", r.events),
                    r.ops,
                    "ops/s",
                )
                .against("no events", none)
                .note(format!(
                    "offline {:.1} ms + online {:.1} ms per CPU; {ROUNDS} rounds",
                    r.offline_ms, r.online_ms
                )),
            );
        }
    }
    Ok(rows)
}

/// The hotplug rows: ops/s with each number of events, against none.
fn hotplug(g: &mut Guest, device: &perfbed_device::DeviceConfig, rounds: u32) -> Result<Vec<Row>> {
    let rates = hotplug_rates(g, device, rounds)?;
    let none = rates[0].ops.median;
    let split = |r: &HotplugRate| {
        format!(
            "offline {:.1} ms + online {:.1} ms per CPU",
            r.offline_ms, r.online_ms
        )
    };
    Ok(rates
        .iter()
        .map(|r| match r.events {
            0 => Row::measured("hotplug: offline+online ops/s, no events", r.ops, "ops/s").note(format!(
                "{}; median ± half range of {rounds} round(s) of every CPU but 0 offline then online",
                split(r)
            )),
            events => {
                let row = Row::measured(&format!("hotplug: offline+online ops/s, {events} events"), r.ops, "ops/s")
                    .against("no events", none)
                    .note(split(r));
                if events == 16 {
                    row.goal(Goal::RatioAtLeast(0.95))
                } else {
                    row
                }
            }
        })
        .collect())
}

/// Boots the same kernel and initramfs on stock Debian QEMU's microvm, with
/// the command line perfbed's QEMU gives them but no perfbed device, and
/// returns the time from its start to the agent's greeting, and its
/// resident memory beyond guest RAM then (KiB).
fn stock_boot_to_agent(config: &host::config::VmConfig, accel: &Accel) -> Result<(Duration, f64)> {
    if !Path::new(STOCK_QEMU).is_file() {
        bail!("{STOCK_QEMU} is missing (Debian package qemu-system-x86; `cargo xtask bench` installs it as root)");
    }
    fs::create_dir_all(&config.run_dir)?;
    let socket = config.run_dir.join("agent.sock");
    let _ = fs::remove_file(&socket);
    let mut qemu = Command::new(STOCK_QEMU);
    for dir in &config.firmware_dirs {
        qemu.arg("-L").arg(dir);
    }
    qemu.args(["-M", host::qemu::MACHINE]);
    let clock = host::cmdline::GuestClock {
        tsc_khz: host::cmdline::host_tsc_khz(),
        hz: host::cmdline::kernel_hz(&config.vmlinux),
        tcg: !accel.kvm,
    };
    host::qemu::guest_args(
        &mut qemu,
        config,
        accel,
        &host::cmdline::base_cmdline(&clock).join(" "),
    );
    qemu.arg("-serial").arg(format!(
        "file:{}",
        config.run_dir.join("serial.log").display()
    ));
    host::qemu::agent_port_args(&mut qemu, &socket);
    fs::write(
        config.run_dir.join("qemu.cmd"),
        crate::cmd::display(&qemu) + "\n",
    )?;
    let start = Instant::now();
    let mut child = qemu
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(fs::File::create(
            config.run_dir.join("qemu.log"),
        )?))
        .spawn()
        .with_context(|| format!("starting {STOCK_QEMU}"))?;
    let greeting = host::vm::connect(&socket, &mut child).and_then(|stream| {
        stream.set_read_timeout(Some(config.boot_timeout))?;
        let mut line = String::new();
        BufReader::new(stream)
            .read_line(&mut line)
            .context("reading the agent's greeting")?;
        let at = start.elapsed();
        match serde_json::from_str(&line) {
            Ok(AgentMessage::Hello(_)) => {
                rss_beyond_ram_kib(child.id(), config.memory_mib).map(|memory| (at, memory))
            }
            _ => bail!(
                "stock QEMU's guest greeted with {line:?}; see {}",
                config.run_dir.join("serial.log").display()
            ),
        }
    });
    let _ = child.kill();
    let _ = child.wait();
    greeting
}

/// The resident memory of process `pid` outside its guest RAM mapping (the
/// one mapping of guest RAM's size, give or take QEMU's alignment), in KiB.
fn rss_beyond_ram_kib(pid: u32, ram_mib: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/smaps");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let ram_kib = u64::from(ram_mib) * 1024;
    let field = |line: &str, name: &str| -> Option<u64> {
        line.strip_prefix(name)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
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

/// Kernel log lines with their printk timestamps (s).
fn stamped(log: &str) -> Vec<(f64, &str)> {
    log.lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix('[')?;
            let (stamp, text) = rest.split_once(']')?;
            Some((stamp.trim().parse().ok()?, text.trim()))
        })
        .collect()
}

/// The `n` longest pauses between consecutive timestamped kernel log lines:
/// "0.312 s before <line>".
fn slowest_gaps(log: &str, n: usize) -> Vec<String> {
    let mut gaps: Vec<(f64, &str)> = stamped(log)
        .windows(2)
        .map(|w| (w[1].0 - w[0].0, w[1].1))
        .collect();
    gaps.sort_by(|a, b| b.0.total_cmp(&a.0));
    gaps.iter()
        .take(n)
        .map(|(gap, line)| {
            format!(
                "{gap:.3} s before \"{}\"",
                line.chars().take(60).collect::<String>()
            )
        })
        .collect()
}

/// Where one boot's kernel time went, from its log.
#[derive(Debug, Default, PartialEq)]
struct BootBreakdown {
    /// From "smp: Bringing up secondary CPUs" to "smp: Brought up".
    smp: Option<f64>,
    /// The kernel's timestamp as it starts `/init`.
    to_init: Option<f64>,
    gaps: Vec<String>,
}

impl BootBreakdown {
    fn of(log: &str) -> BootBreakdown {
        let lines = stamped(log);
        let at = |what: &str| {
            lines
                .iter()
                .find(|(_, text)| text.contains(what))
                .map(|(stamp, _)| *stamp)
        };
        let smp = at("smp: Bringing up secondary CPUs")
            .zip(at("smp: Brought up"))
            .map(|(from, to)| to - from);
        BootBreakdown {
            smp,
            to_init: at(INIT_LINE),
            gaps: slowest_gaps(log, 3),
        }
    }

    fn describe(&self) -> String {
        let stamp = |s: Option<f64>| s.map_or("?".to_string(), |s| format!("{s:.3} s"));
        format!(
            "SMP bring-up {}, kernel start to /init {}; slowest kernel log gaps: {}",
            stamp(self.smp),
            stamp(self.to_init),
            self.gaps.join("; ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_breakdown_finds_smp_and_init() {
        let log = "[    0.500000] smp: Bringing up secondary CPUs ...\n[    0.039000] on an AP\n\
                   [    0.650000] smp: Brought up 1 node, 4 CPUs\n[    1.200000] Run /init as init process\n";
        let b = BootBreakdown::of(log);
        assert_eq!(b.to_init, Some(1.2));
        assert!((b.smp.unwrap() - 0.15).abs() < 1e-9, "{b:?}");
        let text = b.describe();
        assert!(text.starts_with("SMP bring-up 0.150 s, kernel start to /init 1.200 s; slowest kernel log gaps: 0.611 s before"), "{text}");
        assert_eq!(
            BootBreakdown::of("").describe(),
            "SMP bring-up ?, kernel start to /init ?; slowest kernel log gaps: "
        );
    }

    #[test]
    fn slowest_gaps_name_the_line_after_the_pause() {
        let log = "[    0.000000] Linux version\n[    0.100000] a\nno stamp\n[    0.900000] slow one\n[    1.000000] b\n";
        assert_eq!(
            slowest_gaps(log, 2),
            vec!["0.800 s before \"slow one\"", "0.100 s before \"a\""]
        );
        assert!(slowest_gaps("", 3).is_empty());
    }
}
