//! The series against the kernel it patches, side by side in one run: what
//! every perf user pays for `PERF_PMU_SCOPE_DEVICE` whether or not a
//! device-scope PMU exists. `struct perf_event`'s size (every event of every
//! PMU carries it), a read() of a cpu-clock event (perf's read path, which
//! the series branches in), and a context switch with per-task software
//! events open (`perf bench sched pipe` under `perf stat -e
//! cpu-clock,task-clock`: the scheduling path of a task context, which the
//! series' scheduling changes sit on). Both kernels are built from the same
//! source, configuration and testbed patches and booted with the same agent
//! and perf; the rounds alternate between them and swap their order every
//! round, so that a drift of the host's load lands on both.

use std::fs;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use perfbed_agent::{HostRequest, PerfAttr, ReadTarget};

use super::guest::{time, Effort, PERF_COUNT_SW_CPU_CLOCK, PERF_TYPE_SOFTWARE};
use super::report::{Goal, Row};
use super::stats::Summary;
use crate::build::image::{self, arch::Arch, kernel::Kernel, Images};
use crate::guest::Guest;
use crate::host::vm::Vm;
use crate::host::Accel;
use crate::run::{scenario_for, RunArgs};

/// The CPU both measurements run on (not CPU 0, which takes the agent's
/// channel and the timer's housekeeping).
const CPU: u32 = 1;
/// `perf bench sched pipe` runs per boot, the boot's figure their median:
/// one run the host preempted does not stand for the boot.
const PIPE_RUNS: usize = 3;
/// A ratio of the series' figure to the unpatched one's that counts as no
/// change: the goal of 99 % of the unpatched speed.
const SAME_SPEED: f64 = 1.0 / 0.99;

/// The rows, each the series against the unpatched kernel.
pub fn rows(ws: &Path, patched: &Images, accel: &Accel, effort: &Effort) -> Result<Vec<Row>> {
    let unpatched = image::ensure_unpatched(ws, patched)?;
    let with_series = sizeof_perf_event(ws, patched)?;
    let without = sizeof_perf_event(ws, &unpatched)?;
    let mut rows = vec![Row::new(
        "series: sizeof(struct perf_event)",
        with_series as f64,
        "bytes",
    )
    .against("6.12 unpatched", without as f64)
    .goal(Goal::RatioAtMost(1.0))
    .note(format!(
        "{:+} bytes on every event of every PMU; from the normal configuration, compiled in each tree",
        with_series as i64 - without as i64
    ))];

    let rounds = effort.boots.max(2);
    let loops = if effort.boots > 1 { 20_000 } else { 2_000 };
    eprintln!(
        "==> bench: the series (without and with a device-scope PMU registered) against 6.12 unpatched, \
         {rounds} rounds of a boot of each, in turn: {} loops of {} cpu-clock read()s and {PIPE_RUNS} \
         runs of perf bench sched pipe -l {loops} on CPU {CPU}",
        effort.read_rounds, effort.reads
    );
    let boots = [
        Boot {
            name: "series",
            images: patched,
            driver: false,
        },
        Boot {
            name: "scoped",
            images: patched,
            driver: true,
        },
        Boot {
            name: "unpatched",
            images: &unpatched,
            driver: false,
        },
    ];
    let mut reads = [Vec::new(), Vec::new(), Vec::new()];
    let mut switches = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..rounds {
        // Each round starts with the next kernel, so that none is always
        // first after the host's other work.
        for k in 0..boots.len() {
            let which = (round + k) % boots.len();
            let (read, switch) = measure(ws, &boots[which], accel, round, effort, loops)?;
            reads[which].push(read);
            switches[which].push(switch);
        }
    }
    let summary = |samples: &[f64]| Summary::of(samples).context("no rounds measured");
    let clock = GuestClock::of(accel);
    let how = format!(
        "median ± half range of {rounds} boots of each kernel, in turn, on CPU {CPU}; {}",
        clock.says()
    );
    let unpatched = 2;
    for (kernel, when) in [
        (0, "no device-scope PMU registered (every perf user's case)"),
        (
            1,
            "perfbed.ko loaded, its device-scope PMUs registered with no event open (the static key on)",
        ),
    ] {
        let tag = if kernel == 0 { "" } else { ", a device-scope PMU registered" };
        for (name, unit, samples, what) in [
            (
                "read() of a cpu-clock event",
                clock.unit(),
                &reads,
                format!(
                    "each boot's median of {} loops of {} read()s of a cpu-clock event, pinned to its CPU",
                    effort.read_rounds, effort.reads
                ),
            ),
            (
                "context switch with per-task software events open",
                clock.thousand_units_per_op(),
                &switches,
                format!("each boot's median of {PIPE_RUNS} runs of perf bench sched pipe -l {loops} pinned to one CPU under perf stat -e cpu-clock,task-clock"),
            ),
        ] {
            let (with_series, without) =
                (summary(&samples[kernel])?, summary(&samples[unpatched])?);
            rows.push(
                Row::measured(&format!("series{tag}: {name}"), with_series, unit)
                    .against("6.12 unpatched", without.median)
                    .goal(Goal::RatioAtMost(SAME_SPEED))
                    .note(format!(
                        "{when}; {what}; {how}; unpatched ± {}; {}",
                        super::report::short(without.spread),
                        spread_verdict(&with_series, &without)
                    )),
            );
        }
    }
    Ok(rows)
}

/// What the guests' clock measures. Under TCG the host's time says little
/// about a kernel's speed (TCG translates each path differently from a CPU
/// running it, and this host's load moves it by a third between boots), so
/// there the guests run with an instruction clock: a figure is the
/// instructions the guest executed, the length of the path, which the host's
/// load does not move. On KVM the guest's clock is real time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GuestClock {
    Time,
    Instructions,
}

impl GuestClock {
    fn of(accel: &Accel) -> Self {
        if accel.kvm {
            GuestClock::Time
        } else {
            GuestClock::Instructions
        }
    }

    /// The unit of a figure the guest's clock gives in nanoseconds.
    fn unit(self) -> &'static str {
        match self {
            GuestClock::Time => "ns",
            GuestClock::Instructions => "instructions",
        }
    }

    /// The unit of a figure the guest's clock gives in µs per operation.
    fn thousand_units_per_op(self) -> &'static str {
        match self {
            GuestClock::Time => "µs/op",
            GuestClock::Instructions => "k instructions/op",
        }
    }

    fn says(self) -> &'static str {
        match self {
            GuestClock::Time => "the guests' clock is real time (KVM)",
            GuestClock::Instructions => {
                "the guests' clock counts their instructions (TCG with -icount shift=0,sleep=off), \
                 so that a figure is a path's length, which the host's load does not move"
            }
        }
    }
}

/// Whether both spreads are under a tenth of their medians: only then can a
/// ratio near 1 tell the kernels apart.
fn spread_verdict(a: &Summary, b: &Summary) -> String {
    let worst = (a.spread / a.median).max(b.spread / b.median);
    if worst < 0.1 {
        format!(
            "spreads under a tenth of the value (worst {:.1} %)",
            worst * 100.0
        )
    } else {
        format!(
            "a spread of {:.0} % of the value: more rounds (--series-rounds) or a quieter host before the ratio decides anything",
            worst * 100.0
        )
    }
}

/// One kernel the rounds boot.
struct Boot<'a> {
    /// Its run folders' name (short: the sockets in a run folder need
    /// paths under 108 bytes).
    name: &'static str,
    images: &'a Images,
    /// Load perfbed.ko before measuring: its device-scope PMUs turn the
    /// series' static key on.
    driver: bool,
}

/// One boot of `images`: ns per cpu-clock read() (the median of
/// `effort.read_rounds` loops, so that a loop the host preempted does not
/// stand for the boot) and µs per pipe round trip (the median of
/// [`PIPE_RUNS`] runs).
fn measure(
    ws: &Path,
    boot: &Boot,
    accel: &Accel,
    round: usize,
    effort: &Effort,
    loops: u32,
) -> Result<(f64, f64)> {
    let name = format!("{}-{round}", boot.name);
    let mut scenario = scenario_for(ws, boot.images, &RunArgs::for_tests(), &name)?;
    scenario.vm.instruction_clock = GuestClock::of(accel) == GuestClock::Instructions;
    let booted = Vm::boot(&scenario.vm, accel)?;
    let mut vm = booted.vm;
    let mut g = Guest {
        vm: &mut vm,
        timeout: Duration::from_secs(300),
    };
    if boot.driver {
        g.expect_done(HostRequest::LoadModule {
            name: crate::guest::MODULE.into(),
        })?;
    }
    let clock = PerfAttr {
        type_: PERF_TYPE_SOFTWARE,
        config: PERF_COUNT_SW_CPU_CLOCK,
        ..PerfAttr::default()
    };
    let event = match g.open_as(clock, -1, CPU as i32, None)? {
        Ok(handle) => handle,
        Err(errno) => bail!("opening cpu-clock on CPU {CPU}: {errno}"),
    };
    let mut reads = Vec::new();
    for _ in 0..effort.read_rounds {
        reads.push(
            time(
                &mut g,
                ReadTarget::Event { handle: event },
                CPU,
                effort.reads,
            )?
            .0,
        );
    }
    let read = Summary::of(&reads).context("no read loop timed")?.median;
    g.close(event)?;
    let loops = loops.to_string();
    let mask = format!("{:#x}", 1u32 << CPU);
    let argv = [
        "/bin/busybox",
        "taskset",
        &mask,
        "/usr/bin/perf",
        "stat",
        "-e",
        "cpu-clock,task-clock",
        "--",
        "/usr/bin/perf",
        "bench",
        "sched",
        "pipe",
        "-l",
        &loops,
    ];
    let mut switches = Vec::new();
    for _ in 0..PIPE_RUNS {
        let (status, stdout, stderr) = g.run(&argv)?;
        if status != Some(0) {
            bail!("{argv:?} exited with {status:?}:\n{stdout}\n{stderr}");
        }
        switches.push(
            usecs_per_op(&stdout).with_context(|| {
                format!("no usecs/op in perf bench's output:\n{stdout}\n{stderr}")
            })?,
        );
    }
    let switch = Summary::of(&switches).context("no pipe run")?.median;
    vm.power_off(Duration::from_secs(30))?;
    Ok((read, switch))
}

/// perf bench's "      61.700000 usecs/op" line.
fn usecs_per_op(output: &str) -> Option<f64> {
    output
        .lines()
        .find_map(|l| l.trim().strip_suffix("usecs/op")?.trim().parse().ok())
}

/// `sizeof(struct perf_event)` in the tree `images` boots, compiled there as
/// an external module's assembly (no boot, no debug info needed).
fn sizeof_perf_event(ws: &Path, images: &Images) -> Result<u64> {
    let tree = images.vmlinux.parent().context("vmlinux has a folder")?;
    let dir = ws.join("target/perfbed/bench/sizeof").join(
        tree.parent()
            .and_then(|p| p.file_name())
            .unwrap_or_default(),
    );
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    fs::write(dir.join("Kbuild"), "obj-m += sizeof_perf_event.o\n")?;
    fs::write(
        dir.join("sizeof_perf_event.c"),
        "#include <linux/perf_event.h>\n\n\
         const unsigned long perfbed_sizeof_perf_event = sizeof(struct perf_event);\n",
    )?;
    let output = crate::cmd::output(
        Kernel::make_for(tree, Arch::X86_64)?
            .arg(format!("M={}", dir.display()))
            .arg("sizeof_perf_event.s"),
    )?;
    let asm = fs::read_to_string(dir.join("sizeof_perf_event.s"))
        .with_context(|| format!("make gave no assembly:\n{output}"))?;
    sizeof_from_assembly(&asm).with_context(|| {
        format!(
            "no perfbed_sizeof_perf_event in {}",
            dir.join("sizeof_perf_event.s").display()
        )
    })
}

/// The `.quad` after the symbol's label.
fn sizeof_from_assembly(asm: &str) -> Option<u64> {
    let mut lines = asm
        .lines()
        .skip_while(|l| l.trim() != "perfbed_sizeof_perf_event:");
    lines.next()?;
    lines
        .next()?
        .trim()
        .strip_prefix(".quad")?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_perf_bench_and_the_assembly() {
        let bench = "# Running 'sched/pipe' benchmark:\n# Executed 2000 pipe operations between two processes\n\n     Total time: 0.123 [sec]\n\n      61.700000 usecs/op\n          16207 ops/sec\n";
        assert_eq!(usecs_per_op(bench), Some(61.7));
        assert_eq!(usecs_per_op("Total time: 0.1 [sec]\n"), None);
        let asm = "\t.globl\tperfbed_sizeof_perf_event\nperfbed_sizeof_perf_event:\n\t.quad\t1472\n\t.ident\t\"GCC\"\n";
        assert_eq!(sizeof_from_assembly(asm), Some(1472));
        assert_eq!(sizeof_from_assembly("other:\n\t.quad\t8\n"), None);
    }

    #[test]
    fn spreads_are_judged_against_a_tenth() {
        let tight = Summary {
            median: 100.0,
            spread: 5.0,
        };
        let loose = Summary {
            median: 100.0,
            spread: 30.0,
        };
        assert!(spread_verdict(&tight, &tight).starts_with("spreads under a tenth"));
        assert!(spread_verdict(&tight, &loose).contains("30 %"));
    }
}
