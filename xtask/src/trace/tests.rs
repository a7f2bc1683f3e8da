use perfbed_agent::{GuestEvent, GuestEventKind};
use perfbed_device::regs::{self, Event};
use perfbed_device::{trace_file, Device, DeviceConfig};

use super::*;
use clap::Parser;
use window::WindowError;

const MS: u64 = 1_000_000;

/// A recorded run in miniature: domain 1 (CPUs 2-3) placed on CPU 3, its
/// counter read, CPU 3 goes offline and the owner moves to 2, a read from the
/// old CPU is a violation, then CPU 2 goes too and the domain parks. The
/// guest's events are stamped 5 ms behind the device's clock.
fn recorded_run() -> String {
    let mut d = Device::new(DeviceConfig {
        counter_width: 8,
        ..DeviceConfig::default()
    })
    .unwrap();
    let owner = regs::domain_reg(1, regs::DOM_OWNER);
    let count = regs::slot_count(1, 0);
    d.write(MS, 0, owner, 8, 3);
    d.write(
        MS,
        3,
        regs::slot_ctl(1, 0),
        8,
        regs::slot_ctl_value(Event::MbmTotalBytes, 4),
    );
    d.inject(2 * MS, 1, 4, Event::MbmTotalBytes, 200 * 64)
        .unwrap();
    d.read(3 * MS, 3, count, 8);
    d.inject(4 * MS, 1, 4, Event::MbmTotalBytes, 100 * 64)
        .unwrap();
    d.read(5 * MS, 3, count, 8); // 300 units: wrapped once at 8 bits
    d.write(6 * MS, 3, owner, 8, 2); // CPU 3 going: move to 2
    d.read(7 * MS, 3, count, 8); // the old CPU reads: violation
    d.read(8 * MS, 2, count, 8);
    d.write(9 * MS, 2, owner, 8, regs::NO_OWNER); // CPU 2 going: park
    d.read(10 * MS, 0, regs::REG_MAGIC, 8); // the clock sync, from CPU 0
    let snap = d.trace_since(0);
    let device_text = trace_file(&snap.header(), snap.dropped, &snap.lines());
    let sync_guest = 10 * MS - 5 * MS;
    let guest_event = |t: u64, kind| GuestEvent {
        time_ns: t - 5 * MS,
        kind,
    };
    let events = vec![
        guest_event(
            6 * MS,
            GuestEventKind::CpuOffline {
                cpu: 3,
                took_ns: 2 * MS,
                ok: true,
            },
        ),
        guest_event(
            9 * MS,
            GuestEventKind::CpuOffline {
                cpu: 2,
                took_ns: 2 * MS,
                ok: true,
            },
        ),
        guest_event(
            9 * MS + 1,
            GuestEventKind::Cpumask {
                pmu: "perfbed_l3_1".into(),
                cpus: String::new(),
            },
        ),
    ];
    let device = Trace::parse(&device_text).unwrap();
    let offset = guest::ClockOffset::from_sync(&device.lines, 0, sync_guest, sync_guest).unwrap();
    assert_eq!(offset, guest::ClockOffset(i128::from(5 * MS)));
    guest::merge(&device_text, &guest::lines(&events, offset))
}

#[test]
fn a_recorded_run_plots_its_moves_parks_violations_and_hotplug_marks() {
    let trace = Trace::parse(&recorded_run()).unwrap();
    // The guest's offline of CPU 3 lands on the device clock at the move.
    let offline = trace
        .lines
        .iter()
        .find(|l| l.kind == "guest_offline")
        .unwrap();
    assert_eq!((offline.time_ns, offline.number("cpu")), (6 * MS, Some(3)));
    let timeline = timeline::build(&trace);
    let marks = timeline.marks();
    assert_eq!(
        marks,
        timeline::Marks {
            owner_changes: 3,
            moves: 1,
            parks: 1,
            violations: 1,
            offline: 2,
            online: 0,
            counter_points: 3
        }
    );
    let dom1 = &timeline.domains[1];
    // The guest saw the PMU parked (an empty cpumask) when the device did.
    assert_eq!(
        dom1.cpumask.iter().map(|&(_, c)| c).collect::<Vec<_>>(),
        [None]
    );
    assert_eq!(
        dom1.violations.iter().map(|&(_, c)| c).collect::<Vec<_>>(),
        [3]
    );
    assert_eq!(dom1.moves.iter().map(|&(_, c)| c).collect::<Vec<_>>(), [2]);
    // The counter wrapped its 8 bits and still meets the truth.
    let slot = &dom1.slots[0];
    assert_eq!(
        slot.counter
            .iter()
            .map(|&(_, b)| b as u64)
            .collect::<Vec<_>>(),
        [200 * 64, 300 * 64, 300 * 64]
    );
    assert_eq!(
        slot.truth
            .iter()
            .map(|&(_, b)| b as u64)
            .collect::<Vec<_>>(),
        [200 * 64, 300 * 64, 300 * 64]
    );
    assert!(timeline.domains[0].owner.is_empty());

    let svg = plot::svg(&timeline).unwrap();
    // One red cross (two strokes) per violation, and red nowhere else.
    let red = format!(
        "stroke=\"#{:02X}{:02X}{:02X}\"",
        plot::VIOLATION.0,
        plot::VIOLATION.1,
        plot::VIOLATION.2
    );
    // (and the legend's one cross, in the lane that has violations)
    assert_eq!(
        svg.matches(&red).count(),
        2 * marks.violations + 2,
        "{}",
        &svg[..svg.len().min(2000)]
    );
    assert!(svg.contains("domain 1 (allowed CPUs [2, 3])"));
}

#[test]
fn the_table_puts_each_record_in_its_domain_column() {
    let trace = Trace::parse(&recorded_run()).unwrap();
    let table = table::render(&trace, None);
    let row = |needle: &str| {
        table
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle} in\n{table}"))
            .to_string()
    };
    let columns = |l: &str| {
        l.split('|')
            .map(str::trim)
            .map(String::from)
            .collect::<Vec<_>>()
    };
    // time | device | domain 0 | domain 1 | guest
    assert_eq!(
        columns(&row("VIOLATION"))[3],
        "c3 R SLOT_COUNT[0] 0x8000000000000000 VIOLATION"
    );
    assert_eq!(columns(&row("MOVE"))[3], "MOVE owner 3 -> 2");
    assert_eq!(columns(&row("PARK"))[3], "PARK owner 2 -> none");
    assert_eq!(columns(&row("cpu3 offline"))[4], "cpu3 offline (2.0 ms)");
    assert_eq!(
        columns(&row("REG_MAGIC"))[1],
        "c0 R REG_MAGIC 0x44454246524550"
    );
    assert!(table
        .lines()
        .next()
        .unwrap()
        .contains("domain 1 (CPUs 2-3)"));
}

#[test]
fn bad_trace_files_are_refused_with_the_reason() {
    assert!(Trace::parse("hello\n")
        .unwrap_err()
        .to_string()
        .contains("not a perfbed trace"));
    let header = perfbed_device::TRACE_MAGIC.to_string()
        + " domains=0-1 rmids=8 slots=4 width=24 unit=64 dropped=0\n";
    let err = Trace::parse(&(header + "12 x read\n")).unwrap_err();
    assert!(format!("{err:#}").contains("trace line 2"), "{err:#}");
}

#[test]
fn interrupts_and_allowed_set_changes_are_on_the_timeline() {
    let mut d = Device::new(DeviceConfig {
        counter_width: 8,
        unit_bytes: 1,
        max_rate: 1_000_000_000,
        ..DeviceConfig::default()
    })
    .unwrap();
    let status = regs::domain_reg(1, regs::DOM_IRQ_STATUS);
    d.write(MS, 0, regs::domain_reg(1, regs::DOM_OWNER), 8, 3);
    d.write(
        MS,
        3,
        regs::slot_ctl(1, 0),
        8,
        regs::slot_ctl_value(Event::MbmTotalBytes, 4),
    );
    d.write(MS, 3, regs::domain_reg(1, regs::DOM_IRQ_THRESHOLD), 8, 100);
    d.write(
        MS,
        3,
        regs::domain_reg(1, regs::DOM_IRQ_CTL),
        8,
        regs::IRQ_CTL_OVERFLOW,
    );
    d.inject(2 * MS, 1, 4, Event::MbmTotalBytes, 150).unwrap();
    d.read(3 * MS, 2, status, 8); // off the owner: a violation, not an interrupt handled
    d.read(3 * MS, 3, status, 8); // the owner acks
    d.read(4 * MS, 3, status, 8); // nothing pending: not an interrupt
    d.set_allowed(5 * MS, 1, &[2]).unwrap();
    let snap = d.trace_since(0);
    let trace = Trace::parse(&trace_file(&snap.header(), snap.dropped, &snap.lines())).unwrap();
    let dom = &timeline::build(&trace).domains[1];
    assert_eq!(dom.interrupts.len(), 1, "{:?}", dom.interrupts);
    assert_eq!(dom.interrupts[0].1, 3);
    assert_eq!(dom.violations.len(), 1);
    assert_eq!(dom.allowed_changes.len(), 1);
    assert_eq!(dom.allowed_changes[0].1, "2");
}

/// `n` points of a counter with a spike and a dip among them.
fn noisy(n: usize) -> Vec<(f64, f64)> {
    (0..n)
        .map(|i| {
            let v = match i {
                i if i == n / 3 => 1e9,
                i if i == 2 * n / 3 => -5.0,
                i => (i % 7) as f64,
            };
            (i as f64 / n as f64, v)
        })
        .collect()
}

#[test]
fn thinning_keeps_each_columns_extremes_and_at_most_four_points_a_column() {
    let points = noisy(100_000);
    let columns = 250;
    let thinned = plot::thin(&points, 0.0, 1.0 / columns as f64);
    assert!(thinned.len() <= 4 * columns, "{} points", thinned.len());
    assert!(thinned.len() >= 2 * columns, "{} points", thinned.len());
    // The spike, the dip, the first and the last survive.
    for p in [
        points[0],
        points[points.len() - 1],
        points[points.len() / 3],
        points[2 * points.len() / 3],
    ] {
        assert!(thinned.contains(&p), "{p:?} lost");
    }
    // Every column keeps its own lowest and highest.
    let column = |t: f64| (t * columns as f64).floor() as usize;
    for c in 0..columns {
        let of = |v: &[(f64, f64)]| -> (f64, f64) {
            v.iter()
                .filter(|p| column(p.0) == c)
                .fold((f64::MAX, f64::MIN), |(lo, hi), p| {
                    (lo.min(p.1), hi.max(p.1))
                })
        };
        assert_eq!(of(&thinned), of(&points), "column {c}");
    }
    // In time order, no point twice.
    assert!(thinned.windows(2).all(|w| w[0].0 < w[1].0));
}

#[test]
fn overlapping_marks_are_drawn_once_per_column_and_row() {
    let marks: Vec<(f64, u32)> = (0..1000).map(|i| (i as f64 / 1000.0, i % 2)).collect();
    let kept = plot::spread(&marks, 0.0, 0.1);
    // Ten columns, two rows each.
    assert_eq!(kept.len(), 20, "{kept:?}");
    let dots = plot::apart(&[(0.0, 0.0), (0.1, 0.0), (0.5, 0.0), (0.6, 9.0)], 0.4, 5.0);
    assert_eq!(dots, [(0.0, 0.0), (0.5, 0.0), (0.6, 9.0)]);
}

#[test]
fn the_time_axis_ticks_in_seconds_at_round_steps() {
    // A whole run: 85 s, from 2.1 s on the device's clock.
    let (ticks, decimals) = plot::time_ticks(2.1, 87.3, 12);
    assert_eq!(ticks, [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0]);
    assert_eq!(decimals, 0);
    let labels: Vec<String> = ticks
        .iter()
        .map(|&t| plot::tick_label(t, decimals))
        .collect();
    assert_eq!(labels[0], "10");
    // A single move: a quarter of a second.
    let (ticks, decimals) = plot::time_ticks(5.21, 5.46, 12);
    assert_eq!(decimals, 2);
    let labels: Vec<String> = ticks
        .iter()
        .map(|&t| plot::tick_label(t, decimals))
        .collect();
    assert_eq!(labels, ["5.25", "5.30", "5.35", "5.40", "5.45"]);
    // Milliseconds of a move, and never more ticks than asked for.
    for (lo, hi) in [(0.001, 0.0103), (0.0, 1e-6), (3.0, 3000.0), (0.5, 0.7)] {
        let (ticks, _) = plot::time_ticks(lo, hi, 12);
        assert!((2..=12).contains(&ticks.len()), "{lo}..{hi}: {ticks:?}");
        assert!(ticks.iter().all(|t| (lo..=hi).contains(t)), "{ticks:?}");
    }
    let (ticks, decimals) = plot::time_ticks(0.001, 0.0103, 12);
    assert_eq!(plot::tick_label(ticks[0], decimals), "0.001");
}

#[test]
fn a_counter_reassigned_has_one_lane_and_one_legend_entry_per_slot() {
    let mut d = Device::new(DeviceConfig::default()).unwrap();
    let ctl = |s| regs::slot_ctl(1, s);
    let total4 = regs::slot_ctl_value(Event::MbmTotalBytes, 4);
    d.write(MS, 0, regs::domain_reg(1, regs::DOM_OWNER), 8, 3);
    // Slot 0 counts (total, RMID 4) twice, slot 1 once between, and slot 0
    // (local, RMID 4) once.
    for (t, slot, value) in [
        (1, 0, total4),
        (3, 0, 0),
        (4, 1, total4),
        (5, 1, 0),
        (6, 0, total4),
        (8, 0, regs::slot_ctl_value(Event::MbmLocalBytes, 4)),
    ] {
        d.write(t * MS, 3, ctl(slot), 8, value);
        d.inject(t * MS, 1, 4, Event::MbmTotalBytes, 6400).unwrap();
        d.read(t * MS + 1, 3, regs::slot_count(1, slot), 8);
    }
    let snap = d.trace_since(0);
    let trace = Trace::parse(&trace_file(&snap.header(), snap.dropped, &snap.lines())).unwrap();
    let timeline = timeline::build(&trace);
    let lanes = timeline.domains[1].counter_lanes();
    let entries: Vec<Vec<(u32, usize)>> = lanes
        .iter()
        .map(|l| l.entries.iter().map(|(k, s)| (k.slot, s.len())).collect())
        .collect();
    // (total, 4): slot 0 with its two assignments, slot 1; (local, 4): slot 0.
    assert_eq!(entries, [vec![(0, 2), (1, 1)], vec![(0, 1)]]);
    let svg = plot::svg(&timeline).unwrap();
    for label in [
        "slot 0: mbm_total_bytes rmid 4",
        "slot 1: mbm_total_bytes rmid 4",
        "slot 0: mbm_local_bytes rmid 4",
    ] {
        assert_eq!(svg.matches(label).count(), 1, "{label}");
    }
}

#[test]
fn a_window_keeps_what_happened_in_it_and_the_owner_it_started_with() {
    let trace = Trace::parse(&recorded_run()).unwrap();
    let whole = timeline::build(&trace);
    // From just before the move (6 ms) to before the park (9 ms).
    let w = whole.window(0.0055, 0.0085);
    assert_eq!((w.start, w.end), (0.0055, 0.0085));
    let dom = &w.domains[1];
    assert_eq!(dom.initial_owner, Some(Some(3)));
    assert_eq!(dom.moves.iter().map(|m| m.1).collect::<Vec<_>>(), [2]);
    assert!(dom.parks.is_empty());
    assert_eq!(dom.violations.len(), 1);
    assert_eq!(dom.offline.iter().map(|o| o.1).collect::<Vec<_>>(), [3]);
    // Of the counter's reads at 3, 5 and 8 ms only the last.
    assert_eq!(
        dom.slots
            .iter()
            .map(|s| s.counter.len())
            .collect::<Vec<_>>(),
        [1]
    );
    // The printed table keeps the same window.
    let window = Window::new(Some(0.0055), Some(0.0085), 0.001, 0.010).unwrap();
    let table = table::render(&trace, Some(window));
    assert!(table.contains("MOVE owner 3 -> 2"), "{table}");
    assert!(!table.contains("PARK"), "{table}");
    assert!(!table.contains("SLOT_CTL"), "{table}");
    assert!(table::render(&trace, None).contains("PARK"));
}

/// `cargo xtask trace`'s arguments, parsed as the command line would be.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: TraceArgs,
}

#[test]
fn bad_windows_are_refused_with_the_reason() {
    for bad in ["abc", "-1", "NaN", "inf", ""] {
        let err = Cli::try_parse_from(["trace", "t.txt", &format!("--from={bad}")])
            .err()
            .unwrap_or_else(|| panic!("--from {bad:?} accepted"))
            .to_string();
        assert!(err.contains("not a time"), "{bad:?}: {err}");
    }
    let ok = Cli::try_parse_from(["trace", "t.txt", "--from", "1.5", "--to", "2"]).unwrap();
    assert_eq!((ok.args.from, ok.args.to), (Some(1.5), Some(2.0)));
    assert_eq!(
        Window::new(Some(5.0), Some(2.0), 0.0, 10.0),
        Err(WindowError::Reversed { from: 5.0, to: 2.0 })
    );
    // Reversed, and before the trace too: reversed is what to fix first.
    assert_eq!(
        Window::new(Some(5.0), Some(2.0), 2.1, 11.0),
        Err(WindowError::Reversed { from: 5.0, to: 2.0 })
    );
    assert!(matches!(
        Window::new(Some(3.0), Some(3.0), 0.0, 10.0),
        Err(WindowError::Reversed { .. })
    ));
    // Past the end, with --to left to default: outside, not reversed.
    let outside = Window::new(Some(20.0), None, 1.0, 10.0).unwrap_err();
    assert!(matches!(outside, WindowError::Outside { .. }));
    assert!(
        outside
            .to_string()
            .contains("runs from 1.000000 s to 10.000000 s"),
        "{outside}"
    );
    assert!(matches!(
        Window::new(None, Some(0.5), 1.0, 10.0),
        Err(WindowError::Outside { .. })
    ));
    assert_eq!(
        Window::new(Some(2.0), None, 1.0, 10.0),
        Ok(Window {
            from: 2.0,
            to: 10.0
        })
    );
}

#[test]
fn check_spans_become_bands_on_the_device_clock() {
    let mut log = crate::checks::log::CheckLog::new();
    let check = |name, passed| crate::checks::Check {
        name,
        passed,
        detail: String::new(),
    };
    std::thread::sleep(std::time::Duration::from_millis(2));
    log.push(check("perf_event_open matrix", true));
    std::thread::sleep(std::time::Duration::from_millis(2));
    log.extend([check("x=1, 50% off", false), check("groups", true)]);
    assert_eq!(log.len(), 3);
    // The device's clock read 1 s when the host's read `at`.
    let clock = spans::HostClock {
        at: std::time::Instant::now(),
        device_ns: 1_000_000_000,
    };
    let lines = spans::lines(log.spans(), clock, 0);
    assert_eq!(lines.len(), 2, "{lines:?}");
    let text = format!(
        "{} domains=0-1 rmids=8 slots=4 width=24 unit=64 dropped=0\n{}\n",
        perfbed_device::TRACE_MAGIC,
        lines.join("\n")
    );
    let timeline = timeline::build(&Trace::parse(&text).unwrap());
    let bands = &timeline.checks;
    assert_eq!(bands[0].names, ["perf_event_open matrix"]);
    assert_eq!(bands[1].names, ["x=1, 50% off", "groups"]);
    assert_eq!((bands[0].failed, bands[1].failed), (0, 1));
    // Back to back, each at least the 2 ms slept, all before the clock read.
    assert!(bands[0].end - bands[0].start >= 0.002);
    assert_eq!(bands[0].end, bands[1].start);
    assert!(bands[1].end <= 1.0);
    // Spans that ended before the trace's first record are left out.
    assert!(spans::lines(log.spans(), clock, 1_000_000_000).is_empty());
    let svg = plot::svg(&timeline).unwrap();
    assert!(svg.contains("perf_event_open matrix"), "{svg}");
}

#[test]
fn guest_kernel_events_land_in_their_domains_lane() {
    let text = format!(
        "{} domains=0-1:2-3 rmids=8 slots=4 width=24 unit=64 dropped=0\n\
         1000 - guest_kernel event=cpuhp_enter cpu=3 target=0 step=213 fn=perf_event_exit_cpu guest_ns=5\n\
         2000 - guest_kernel event=cpuhp_exit cpu=3 state=0 step=213 ret=0 guest_ns=6\n\
         3000 - guest_kernel cpu=1\n",
        perfbed_device::TRACE_MAGIC
    );
    let timeline = timeline::build(&Trace::parse(&text).unwrap());
    assert!(timeline.domains[0].kernel.is_empty());
    let events = &timeline.domains[1].kernel;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0].event, "cpuhp_enter");
    assert_eq!(events[0].cpu, 3);
    assert_eq!(events[0].detail, "fn=perf_event_exit_cpu step=213 target=0");
    let svg = plot::svg(&timeline).unwrap();
    assert!(svg.contains("cpuhp_exit"));
    assert!(svg.contains("kernel events (guest tracepoints)"));
}

#[test]
fn a_long_busy_trace_draws_under_a_megabyte_with_every_violation() {
    // A minute of a busy run: four slots per domain read every 10 ms (six
    // reads a pixel column), the owner moving every 100 ms, a violation
    // every 10 s. Drawn mark by mark this would be several megabytes.
    let mut d = Device::new(DeviceConfig {
        trace_capacity: 1 << 20,
        ..DeviceConfig::default()
    })
    .unwrap();
    let (step, end) = (10 * MS, 60_000 * MS);
    for dom in 0..2u32 {
        let owner = dom * 2;
        d.write(
            MS,
            owner,
            regs::domain_reg(u64::from(dom), regs::DOM_OWNER),
            8,
            u64::from(owner),
        );
        for slot in 0..4 {
            let value = regs::slot_ctl_value(Event::MbmTotalBytes, slot);
            d.write(MS, owner, regs::slot_ctl(u64::from(dom), slot), 8, value);
            d.set_rate(
                MS,
                dom,
                slot as u32,
                Event::MbmTotalBytes,
                1 << (20 + 2 * slot),
            )
            .unwrap();
        }
    }
    let mut t = 10 * MS;
    let mut records = 0;
    while t < end {
        for dom in 0..2u32 {
            let owner = dom * 2 + ((t / (100 * MS)) % 2) as u32;
            if t.is_multiple_of(100 * MS) {
                d.write(
                    t,
                    owner,
                    regs::domain_reg(u64::from(dom), regs::DOM_OWNER),
                    8,
                    u64::from(owner),
                );
            }
            for slot in 0..4u64 {
                d.read(t, owner, regs::slot_count(u64::from(dom), slot), 8);
                records += 1;
            }
            if t.is_multiple_of(10_000 * MS) {
                d.read(t, owner ^ 1, regs::slot_count(u64::from(dom), 0), 8);
            }
        }
        t += step;
    }
    let snap = d.trace_since(0);
    assert_eq!(snap.dropped, 0);
    let trace = Trace::parse(&trace_file(&snap.header(), snap.dropped, &snap.lines())).unwrap();
    let timeline = timeline::build(&trace);
    let marks = timeline.marks();
    assert!(marks.counter_points >= records, "{marks:?}");
    assert_eq!(marks.violations, 2 * 5);
    let svg = plot::svg(&timeline).unwrap();
    assert!(svg.len() < 1 << 20, "{} bytes", svg.len());
    let red = format!(
        "stroke=\"#{:02X}{:02X}{:02X}\"",
        plot::VIOLATION.0,
        plot::VIOLATION.1,
        plot::VIOLATION.2
    );
    // Every violation drawn (two strokes each), and each domain's legend.
    assert_eq!(svg.matches(&red).count(), 2 * marks.violations + 2 * 2);
}

#[test]
fn byte_labels_stay_short_however_large_the_count() {
    assert_eq!(plot::bytes_label(0.0), "0 B");
    assert_eq!(plot::bytes_label(64.0), "64 B");
    assert_eq!(plot::bytes_label(3.48e9), "3.48 GB");
    assert_eq!(plot::bytes_label(146.4e6), "146.4 MB");
    // A counter gone wrong (unwrapped past any real traffic).
    assert_eq!(plot::bytes_label(1e21), "1 ZB");
}
