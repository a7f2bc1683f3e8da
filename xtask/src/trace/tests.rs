use perfbed_agent::{GuestEvent, GuestEventKind};
use perfbed_device::regs::{self, Event};
use perfbed_device::{trace_file, Device, DeviceConfig};

use super::*;

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
    assert_eq!(
        svg.matches(&red).count(),
        2 * marks.violations,
        "{}",
        &svg[..svg.len().min(2000)]
    );
    assert!(svg.contains("domain 1: owner CPU"));
}

#[test]
fn the_table_puts_each_record_in_its_domain_column() {
    let trace = Trace::parse(&recorded_run()).unwrap();
    let table = table::render(&trace);
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
