use super::*;

const SHAPE: DeviceShape = DeviceShape {
    pmus: 2,
    slots: 2,
    unit_bytes: 64,
    counter_width: 24,
    max_rate: 2 << 30,
    lined_pmus: 2,
};
/// [`SHAPE`] with an interrupt line for PMU 0 only: PMU 1 is polled, and
/// the perf core stops its parks at the driver's time limit.
const POLLED: DeviceShape = DeviceShape {
    lined_pmus: 1,
    ..SHAPE
};
const TOTAL: u32 = 2;

fn counter(pmu: u32, rmid: u32) -> OpenSpec {
    let kind = Kind::Counter {
        pmu,
        event: TOTAL,
        rmid,
    };
    OpenSpec {
        kind,
        disabled: false,
        pinned: false,
        exclusive: false,
        group: None,
    }
}

fn gauge(pmu: u32, rmid: u32) -> OpenSpec {
    OpenSpec {
        kind: Kind::Gauge { pmu, rmid },
        ..counter(pmu, rmid)
    }
}

fn software() -> OpenSpec {
    OpenSpec {
        kind: Kind::Software,
        ..counter(0, 0)
    }
}

impl OpenSpec {
    fn disabled(self) -> OpenSpec {
        OpenSpec {
            disabled: true,
            ..self
        }
    }
    fn pinned(self) -> OpenSpec {
        OpenSpec {
            pinned: true,
            ..self
        }
    }
    fn exclusive(self) -> OpenSpec {
        OpenSpec {
            exclusive: true,
            ..self
        }
    }
    fn under(self, leader: Handle) -> OpenSpec {
        OpenSpec {
            group: Some(leader),
            ..self
        }
    }
}

fn seen(value: u64, enabled: u64, running: u64) -> Observed {
    Observed {
        value,
        enabled: Some(enabled),
        running: Some(running),
    }
}

/// The fields of a read's mismatches, in the model's order.
fn fields(m: &mut Model, handle: Handle, observed: Observed) -> Vec<Field> {
    m.read(handle, observed).iter().map(|m| m.field).collect()
}

/// A group of two counters and two single ones: more than the slots.
fn pair_and_two_more() -> [OpenSpec; 4] {
    [
        counter(0, 1),
        counter(0, 2).under(1),
        counter(0, 3),
        counter(0, 4),
    ]
}

/// `specs` opened as events 1, 2, ... and each read once showing
/// zeros: the first moment of the rules across events.
fn opened_and_read(specs: &[OpenSpec]) -> Model {
    let mut m = Model::new(SHAPE);
    for (h, &spec) in (1..).zip(specs) {
        m.open(h, spec);
    }
    for (h, _) in (1..).zip(specs) {
        assert_eq!(fields(&mut m, h, seen(0, 0, 0)), vec![]);
    }
    m
}

#[test]
pub(super) fn an_enabled_event_counts_every_burst_and_runs_all_the_time() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.burst(0, TOTAL, 1, 4096);
    m.moved(0);
    m.burst(0, TOTAL, 1, 640);
    assert_eq!(fields(&mut m, 1, seen(4736, 100, 100)), vec![]);
    assert_eq!(
        fields(&mut m, 1, seen(4736 + 64, 200, 200)),
        vec![Field::Value]
    );
    assert_eq!(
        fields(&mut m, 1, seen(4800, 300, 290)),
        vec![Field::Running]
    );
}

#[test]
pub(super) fn a_disabled_window_counts_nothing_and_stops_both_clocks() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.burst(0, TOTAL, 1, 1024);
    m.ioctl(1, Ioctl::Disable, false);
    assert_eq!(fields(&mut m, 1, seen(1024, 50, 50)), vec![]);
    m.burst(0, TOTAL, 1, 2048);
    m.moved(0);
    m.park(0);
    m.unpark(0);
    assert_eq!(fields(&mut m, 1, seen(1024, 50, 50)), vec![]);
    // The disabled burst counted, and the clocks ran on: all reported.
    m.burst(0, TOTAL, 1, 2048);
    assert_eq!(
        fields(&mut m, 1, seen(3072, 90, 90)),
        vec![Field::Enabled, Field::Running, Field::Value]
    );
    m.ioctl(1, Ioctl::Enable, false);
    m.burst(0, TOTAL, 1, 128);
    assert_eq!(fields(&mut m, 1, seen(3072 + 128, 120, 120)), vec![]);
}

#[test]
pub(super) fn reset_zeroes_the_value_not_the_times() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.burst(0, TOTAL, 1, 1024);
    m.ioctl(1, Ioctl::Reset, false);
    m.burst(0, TOTAL, 1, 64);
    assert_eq!(fields(&mut m, 1, seen(64, 10, 10)), vec![]);
    m.ioctl(1, Ioctl::Reset, false);
    assert_eq!(fields(&mut m, 1, seen(1088, 20, 20)), vec![Field::Value]);
}

#[test]
pub(super) fn reset_while_parked_counts_only_what_landed_after_it() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.burst(0, TOTAL, 1, 1024);
    m.park(0);
    m.burst(0, TOTAL, 1, 2048);
    m.ioctl(1, Ioctl::Reset, false);
    m.burst(0, TOTAL, 1, 128);
    m.unpark(0);
    m.burst(0, TOTAL, 1, 64);
    assert_eq!(fields(&mut m, 1, seen(192, 10, 10)), vec![]);
    // What landed before the RESET, unread in the parked PMU, never counts.
    let mut m2 = Model::new(SHAPE);
    m2.open(1, counter(0, 1));
    m2.burst(0, TOTAL, 1, 1024);
    m2.park(0);
    m2.ioctl(1, Ioctl::Reset, false);
    m2.unpark(0);
    assert_eq!(fields(&mut m2, 1, seen(1024, 10, 10)), vec![Field::Value]);
}

#[test]
pub(super) fn times_reset_by_a_parked_read_do_not_settle_the_multiplexing_before_it() {
    let mut m = Model::new(SHAPE);
    for h in 1..=3 {
        m.open(h, counter(0, 1));
    }
    // Multiplexed: the burst may or may not count for event 1.
    m.burst(0, TOTAL, 1, 1024);
    m.close(3);
    m.park(0);
    // Parked: the value stays open, the times move on.
    assert_eq!(fields(&mut m, 1, seen(0, 100, 60)), vec![]);
    m.unpark(0);
    m.burst(0, TOTAL, 1, 64);
    // Running throughout since the parked read, which says nothing of
    // the burst before it: 64 and 1088 are both right, less than the
    // sure 64 is not.
    assert_eq!(fields(&mut m.clone(), 1, seen(64, 200, 160)), vec![]);
    assert_eq!(fields(&mut m.clone(), 1, seen(1088, 200, 160)), vec![]);
    assert_eq!(fields(&mut m, 1, seen(32, 200, 160)), vec![Field::Value]);
}

#[test]
pub(super) fn a_sibling_under_a_disabled_leader_has_its_clocks_stopped_until_the_leader_is_on() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1).disabled());
    m.open(2, counter(0, 2).under(1));
    m.burst(0, TOTAL, 2, 640);
    // perf's effective state: the leader's OFF stops the sibling's
    // time_enabled too, whatever the sibling's own state.
    assert_eq!(fields(&mut m, 2, seen(0, 0, 0)), vec![]);
    assert!(m.is_enabled(2));
    assert_eq!(fields(&mut m, 1, seen(0, 0, 0)), vec![]);
    // A move must not change that (patch 0008).
    m.moved(0);
    assert_eq!(fields(&mut m, 2, seen(0, 5, 0)), vec![Field::Enabled]);
    // Enabling the group through the sibling enables the leader.
    m.ioctl(2, Ioctl::Enable, true);
    assert!(m.is_enabled(1));
    m.burst(0, TOTAL, 2, 64);
    // Off, then counting: both clocks grow alike.
    assert_eq!(
        fields(&mut m.clone(), 2, seen(64, 150, 50)),
        vec![Field::Running]
    );
    assert_eq!(fields(&mut m, 2, seen(64, 150, 145)), vec![]);
    // Closing the leader promotes the sibling, which keeps counting.
    m.ioctl(1, Ioctl::Disable, false);
    m.close(1);
    assert_eq!(m.leader(2), Some(2));
    m.burst(0, TOTAL, 2, 64);
    assert_eq!(fields(&mut m, 2, seen(128, 200, 195)), vec![]);
}

#[test]
pub(super) fn group_ioctl_on_a_sibling_reaches_the_whole_group() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.open(2, gauge(0, 1).under(1));
    m.ioctl(2, Ioctl::Disable, true);
    assert!(!m.is_enabled(1) && !m.is_enabled(2));
    m.ioctl(2, Ioctl::Enable, false);
    assert!(!m.is_enabled(1) && m.is_enabled(2));
    assert_eq!(m.group(1), vec![1, 2]);
}

#[test]
pub(super) fn more_counters_than_slots_multiplex_and_perfs_times_settle_the_value() {
    let mut m = Model::new(SHAPE);
    for h in 1..=3 {
        m.open(h, counter(0, 1));
    }
    m.burst(0, TOTAL, 1, 1024);
    // Anything from 0 to the burst, but consistent with the times.
    assert_eq!(fields(&mut m, 1, seen(512, 100, 60)), vec![]);
    // Never running, yet counted.
    assert_eq!(
        fields(&mut m.clone(), 2, seen(512, 100, 0)),
        vec![Field::Value]
    );
    assert_eq!(fields(&mut m, 2, seen(0, 100, 0)), vec![]);
    m.burst(0, TOTAL, 1, 1024);
    // Ran the whole window, so it counted all of it.
    assert_eq!(fields(&mut m, 2, seen(512, 200, 100)), vec![Field::Value]);
    m.burst(0, TOTAL, 1, 1024);
    // More than ever landed.
    assert_eq!(
        fields(&mut m, 3, seen(3 * 1024 + 64, 300, 100)),
        vec![Field::Value]
    );
    // Close one: two on two slots, exact again.
    m.close(3);
    m.read(1, seen(2048, 400, 200));
    m.burst(0, TOTAL, 1, 64);
    assert_eq!(fields(&mut m, 1, seen(2112, 500, 300)), vec![]);
}

#[test]
pub(super) fn gauges_take_no_slot_and_read_the_occupancy() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.open(2, counter(0, 1));
    m.open(3, gauge(0, 4));
    m.occupancy(0, 4, 6400 + 10);
    assert_eq!(fields(&mut m, 3, seen(6400, 10, 10)), vec![]);
    m.ioctl(3, Ioctl::Disable, false);
    m.occupancy(0, 4, 128);
    assert_eq!(fields(&mut m, 3, seen(6400, 15, 15)), vec![]);
    assert_eq!(fields(&mut m, 3, seen(128, 15, 15)), vec![Field::Value]);
}

#[test]
pub(super) fn an_exclusive_group_shares_its_pmu_with_nobody() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1).exclusive());
    m.open(2, software());
    m.open(3, counter(0, 2).under(2));
    m.burst(0, TOTAL, 1, 64);
    // The model cannot say who ran, so only the bounds hold.
    assert_eq!(fields(&mut m, 1, seen(64, 100, 100)), vec![]);
    assert_eq!(fields(&mut m, 1, seen(64, 200, 201)), vec![Field::Running]);
    m.ioctl(2, Ioctl::Disable, false);
    assert_eq!(fields(&mut m, 1, seen(64, 250, 220)), vec![]);
    // Alone now: it must run all the time.
    m.burst(0, TOTAL, 1, 64);
    assert_eq!(fields(&mut m, 1, seen(128, 300, 250)), vec![Field::Running]);
}

#[test]
pub(super) fn an_exclusive_group_may_give_way_to_events_the_model_does_not_see() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1).exclusive());
    m.burst(0, TOTAL, 1, 64);
    assert_eq!(
        fields(&mut m, 1, seen(0, 10, 5)),
        vec![Field::Running, Field::Value]
    );
    m.others_may_open(0);
    // Alone until then: it ran.
    assert_eq!(fields(&mut m, 1, seen(0, 20, 6)), vec![]);
    m.burst(0, TOTAL, 1, 64);
    assert_eq!(fields(&mut m, 1, seen(64, 30, 10)), vec![]);
}

#[test]
pub(super) fn pinned_groups_that_fit_always_run() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1).pinned());
    for h in 2..=4 {
        m.open(h, counter(0, 2));
    }
    m.burst(0, TOTAL, 1, 64);
    assert_eq!(fields(&mut m, 1, seen(64, 10, 10)), vec![]);
    assert_eq!(fields(&mut m, 1, seen(64, 20, 15)), vec![Field::Running]);
}

#[test]
pub(super) fn opens_the_kernel_must_refuse() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.open(2, counter(0, 2).under(1));
    assert_eq!(
        m.predict_open(&counter(0, 3).under(1)),
        Err(Refusal::BadGroup),
        "a third slot"
    );
    assert_eq!(
        m.predict_open(&gauge(1, 1).under(1)),
        Err(Refusal::BadGroup),
        "another PMU"
    );
    assert_eq!(
        m.predict_open(&software().under(2)),
        Err(Refusal::BadGroup),
        "a sibling leads"
    );
    assert_eq!(
        m.predict_open(&counter(0, 3).under(9)),
        Err(Refusal::NoLeader)
    );
    assert_eq!(m.predict_open(&software().under(1)), Ok(()));
    for (pinned, exclusive) in [(true, false), (false, true)] {
        // A gauge takes no slot, so only the rule refuses it here.
        for sibling in [gauge(0, 3), software()] {
            let spec = OpenSpec {
                pinned,
                exclusive,
                ..sibling.under(1)
            };
            assert_eq!(
                m.predict_open(&spec),
                Err(Refusal::BadGroup),
                "a pinned or exclusive sibling: {spec:?}"
            );
        }
    }
    m.park(1);
    assert_eq!(m.predict_open(&counter(1, 1)), Err(Refusal::Parked));
    assert_eq!(m.predict_open(&counter(0, 1)), Ok(()));
    // A software sibling joins a parked group where it waits (patch 0006).
    m.open(3, counter(1, 3));
    assert_eq!(m.predict_open(&software().under(3)), Ok(()));
    assert_eq!(
        m.predict_open(&counter(1, 4).under(3)),
        Err(Refusal::Parked)
    );
}

/// perf binds a device event to its PMU's CPU and refuses a sibling of a
/// group on another CPU: a device event joins a group of software events
/// only on the CPU the group was opened on (the red team of the open path
/// found the model opening it).
#[test]
pub(super) fn a_device_event_joins_a_software_group_only_on_its_cpu() {
    let mut m = Model::new(SHAPE);
    m.open_on(1, software(), Some(1));
    let sibling = counter(0, 1).under(1);
    assert_eq!(
        m.predict_open_on(&sibling, Some(0)),
        Err(Refusal::BadGroup),
        "the PMU on CPU 0, the group on CPU 1"
    );
    assert_eq!(
        m.predict_open_on(&sibling, Some(1)),
        Ok(()),
        "both on CPU 1"
    );
    assert_eq!(
        m.predict_open_on(&sibling, None),
        Ok(()),
        "the PMU's CPU not known"
    );
    // A software sibling names its CPU itself.
    assert_eq!(m.predict_open_on(&software().under(1), Some(0)), Ok(()));
    // While the PMU moves unseen, or its placement is in doubt (a set
    // not waited for), the CPU a replay last followed it to may be stale.
    m.placement_unknown(0);
    assert_eq!(m.predict_open_on(&sibling, Some(0)), Ok(()), "in doubt");
    m.placement_seen(0, false);
    assert_eq!(m.predict_open_on(&sibling, Some(0)), Err(Refusal::BadGroup));
    m.moves_unseen(0, true);
    assert_eq!(m.predict_open_on(&sibling, Some(0)), Ok(()), "moving");
}

#[test]
pub(super) fn a_pmu_contended_during_a_park_counts_nothing_sure_until_it_is_placed() {
    // Seed 1, operation 372 of `--lifecycle 1000`: an event the parked
    // PMU scheduled without a slot stays so after the contention ends.
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.open(2, counter(0, 2));
    m.open(
        3,
        OpenSpec {
            disabled: true,
            ..counter(0, 3)
        },
    );
    assert_eq!(fields(&mut m, 1, seen(0, 10, 10)), vec![]);
    m.park(0);
    m.ioctl(3, Ioctl::Enable, false);
    m.ioctl(3, Ioctl::Disable, false);
    m.burst(0, TOTAL, 1, 640);
    m.unpark(0);
    assert_eq!(fields(&mut m, 1, seen(0, 30, 12)), vec![]);
    // Placed again: sure again.
    m.burst(0, TOTAL, 1, 64);
    assert_eq!(fields(&mut m, 1, seen(0, 40, 22)), vec![Field::Value]);
    // The same with the contention ended by a close (no frozen slot
    // left to keep the PMU contended).
    let mut m = opened_and_read(&[counter(0, 1), counter(0, 2), counter(0, 3).disabled()]);
    m.park(0);
    m.ioctl(3, Ioctl::Enable, false);
    m.close(3);
    m.burst(0, TOTAL, 1, 640);
    m.unpark(0);
    assert_eq!(fields(&mut m, 1, seen(0, 30, 12)), vec![]);
}

#[test]
pub(super) fn a_read_while_parked_may_lag_but_the_next_read_after_it_must_not() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.park(0);
    m.burst(0, TOTAL, 1, 640);
    assert_eq!(fields(&mut m, 1, seen(0, 10, 10)), vec![]);
    assert_eq!(fields(&mut m, 1, seen(1280, 20, 20)), vec![Field::Value]);
    m.unpark(0);
    assert_eq!(fields(&mut m, 1, seen(0, 30, 30)), vec![Field::Value]);
    m.park(0);
    m.burst(0, TOTAL, 1, 64);
    m.unpark(0);
    assert_eq!(fields(&mut m, 1, seen(64, 40, 40)), vec![]);
}

#[test]
pub(super) fn a_read_racing_an_unseen_move_may_lag_and_the_first_after_the_moves_catches_up() {
    let racing = || {
        let mut m = Model::new(SHAPE);
        m.open(1, counter(0, 1));
        m.moves_unseen(0, true);
        m.burst(0, TOTAL, 1, 640);
        m
    };
    // Raced a move: the count as last folded, twice; the first read
    // after the moves has it all.
    let mut m = racing();
    assert_eq!(fields(&mut m, 1, seen(0, 10, 10)), vec![]);
    m.burst(0, TOTAL, 1, 64);
    assert_eq!(fields(&mut m, 1, seen(640, 20, 20)), vec![]);
    m.moves_unseen(0, false);
    assert_eq!(fields(&mut m, 1, seen(704, 30, 30)), vec![]);
    // Never ahead of what landed.
    let mut m = racing();
    assert_eq!(fields(&mut m, 1, seen(1280, 10, 10)), vec![Field::Value]);
    // Once the moves are over, a read that still lags is wrong.
    let mut m = racing();
    m.moves_unseen(0, false);
    assert_eq!(fields(&mut m, 1, seen(0, 10, 10)), vec![Field::Value]);
    // The clocks are exact, racing or not.
    let mut m = racing();
    assert_eq!(fields(&mut m, 1, seen(0, 10, 5)), vec![Field::Running]);
}

#[test]
pub(super) fn contention_while_moving_unseen_leaves_slot_events_maybe_until_the_moves_end() {
    // The red team of 2026-12-06: a DISABLE that ends contention while
    // a move is under way; patch 0010 does not reschedule then.
    let mut m = opened_and_read(&[counter(0, 1), counter(0, 2), counter(0, 3).disabled()]);
    m.moves_unseen(0, true);
    m.ioctl(3, Ioctl::Enable, false);
    m.ioctl(3, Ioctl::Disable, false);
    m.burst(0, TOTAL, 1, 640);
    // Left off since: short of running, and of the count.
    assert_eq!(fields(&mut m, 1, seen(0, 30, 12)), vec![]);
    m.moves_unseen(0, false);
    // The last move placed it: sure again, and what landed while it
    // may have been off may be missing for good.
    m.burst(0, TOTAL, 1, 64);
    assert_eq!(fields(&mut m, 1, seen(64, 40, 22)), vec![]);
    m.burst(0, TOTAL, 1, 64);
    assert_eq!(fields(&mut m, 1, seen(64, 50, 32)), vec![Field::Value]);
}

#[test]
pub(super) fn a_gauge_read_racing_an_unseen_move_shows_its_last_read_or_now() {
    let racing = || {
        let mut m = Model::new(SHAPE);
        m.open(3, gauge(0, 4));
        m.occupancy(0, 4, 6400 + 10);
        assert_eq!(fields(&mut m, 3, seen(6400, 10, 10)), vec![]);
        m.moves_unseen(0, true);
        m.occupancy(0, 4, 128);
        m
    };
    assert_eq!(fields(&mut racing(), 3, seen(6400, 20, 20)), vec![]);
    assert_eq!(fields(&mut racing(), 3, seen(128, 20, 20)), vec![]);
    assert_eq!(
        fields(&mut racing(), 3, seen(64, 20, 20)),
        vec![Field::Value]
    );
    // After a RESET its last fold is 0.
    let mut m = racing();
    m.ioctl(3, Ioctl::Reset, false);
    assert_eq!(fields(&mut m, 3, seen(0, 20, 20)), vec![]);
    // Once the moves are over, the occupancy only.
    let mut m = racing();
    m.moves_unseen(0, false);
    assert_eq!(fields(&mut m, 3, seen(6400, 20, 20)), vec![Field::Value]);
}

#[test]
pub(super) fn a_heavy_park_may_count_short_only_as_less_running() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    // A light park: exact, stopped or not.
    m.park(0);
    m.burst(0, TOTAL, 1, 640);
    m.unpark(0);
    assert_eq!(
        fields(&mut m.clone(), 1, seen(0, 1000, 600)),
        vec![Field::Running, Field::Value],
        "a light park is counted, and runs"
    );
    assert_eq!(fields(&mut m, 1, seen(640, 1000, 1000)), vec![]);
    // A quarter of a 1 GiB wrap on one counter: the driver may have
    // had the core stop the events, and what landed after is not counted.
    m.park(0);
    m.burst(0, TOTAL, 1, 256 << 20);
    m.unpark(0);
    assert_eq!(
        fields(&mut m.clone(), 1, seen(640 + (100 << 20), 2000, 1500)),
        vec![],
        "stopped in the park: short, shown as less running"
    );
    assert_eq!(
        fields(&mut m, 1, seen(640 + (100 << 20), 2000, 2000)),
        vec![Field::Value],
        "short at 100 % running"
    );
}

#[test]
pub(super) fn a_read_while_parked_after_heavy_traffic_may_show_running_stopped() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    assert_eq!(fields(&mut m, 1, seen(0, 1000, 1000)), vec![]);
    m.park(0);
    let mut light = m.clone();
    m.burst(0, TOTAL, 1, 256 << 20);
    m.parks_checked();
    assert_eq!(fields(&mut m, 1, seen(0, 2000, 1100)), vec![]);
    light.burst(0, TOTAL, 1, 64 << 20);
    light.parks_checked();
    assert_eq!(
        fields(&mut light, 1, seen(0, 2000, 1100)),
        vec![Field::Running],
        "a light park runs"
    );
}

#[test]
pub(super) fn a_park_without_a_line_may_show_running_stopped_after_light_traffic() {
    let mut m = Model::new(POLLED);
    m.open(1, counter(0, 1));
    m.open(2, counter(1, 1));
    assert_eq!(fields(&mut m, 1, seen(0, 1000, 1000)), vec![]);
    assert_eq!(fields(&mut m, 2, seen(0, 1000, 1000)), vec![]);
    m.park(0);
    m.park(1);
    m.burst(0, TOTAL, 1, 64 << 20);
    m.burst(1, TOTAL, 1, 64 << 20);
    m.parks_checked();
    assert_eq!(
        fields(&mut m, 1, seen(0, 2000, 1100)),
        vec![Field::Running],
        "a light park of a PMU with a line runs"
    );
    assert_eq!(
        fields(&mut m, 2, seen(0, 2000, 1100)),
        vec![],
        "a park of a PMU without one may be stopped at its time limit"
    );
    m.unpark(1);
    m.burst(1, TOTAL, 1, 64 << 20);
    assert_eq!(
        fields(&mut m, 2, seen(64 << 20, 3000, 1200)),
        vec![],
        "what landed after the stop is not counted, shown as less running"
    );
}

/// A park of a PMU without a line stopped at its time limit, read while
/// parked (which resets the times' baseline, not the value's), then
/// disabled in the park: the read after the placement shows no time since
/// the last, but the value's window holds the whole shortfall (operation
/// 3761 of a 16-CPU lifecycle run).
#[test]
pub(super) fn a_parks_shortfall_shows_over_the_values_window_across_reads_while_parked() {
    // The running times the two reads while parked show.
    let parked_then_disabled = |first: u64, second: u64| {
        let mut m = Model::new(POLLED);
        m.open(1, counter(1, 1));
        m.park(1);
        m.parks_checked();
        assert_eq!(fields(&mut m, 1, seen(0, 1000, first)), vec![]);
        m.burst(1, TOTAL, 1, 640);
        m.parks_checked();
        m.ioctl(1, Ioctl::Disable, false);
        m.parks_checked();
        assert_eq!(fields(&mut m, 1, seen(0, 2000, second)), vec![]);
        m.unpark(1);
        m
    };
    let mut stopped = parked_then_disabled(300, 300);
    assert_eq!(
        fields(&mut stopped, 1, seen(0, 2000, 300)),
        vec![],
        "short, shown as less running since the value's baseline"
    );
    let mut ran = parked_then_disabled(1000, 2000);
    assert_eq!(
        fields(&mut ran, 1, seen(0, 2000, 2000)),
        vec![Field::Value],
        "short at 100 % running"
    );
}

/// A read without times claims no running: after a park of a PMU without
/// a line it may show the count short (operation 6229 of a 16-CPU
/// lifecycle run); after a light park of one with a line it may not.
#[test]
pub(super) fn a_read_without_times_may_show_a_stopped_parks_count_short() {
    let parked = |pmu: u32| {
        let mut m = Model::new(POLLED);
        m.open(1, counter(pmu, 1));
        m.park(pmu);
        m.parks_checked();
        m.burst(pmu, TOTAL, 1, 640);
        m.parks_checked();
        m.unpark(pmu);
        m.burst(pmu, TOTAL, 1, 128);
        m
    };
    assert_eq!(
        fields(&mut parked(1), 1, value_only(128)),
        vec![],
        "the park of a PMU without a line may have stopped"
    );
    assert_eq!(
        fields(&mut parked(0), 1, value_only(128)),
        vec![Field::Value],
        "a light park with a line counts all"
    );
}

#[test]
pub(super) fn an_event_enabled_while_parked_may_miss_what_lands_before_it_is_placed() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1).disabled());
    m.park(0);
    m.ioctl(1, Ioctl::Enable, false);
    m.burst(0, TOTAL, 1, 64);
    m.unpark(0);
    m.burst(0, TOTAL, 1, 128);
    let value_only = Observed {
        value: 128,
        enabled: None,
        running: None,
    };
    assert_eq!(fields(&mut m.clone(), 1, value_only), vec![]);
    assert_eq!(
        fields(
            &mut m,
            1,
            Observed {
                value: 64,
                ..value_only
            }
        ),
        vec![Field::Value]
    );
}

const MIB: u64 = 1 << 20;

fn value_only(value: u64) -> Observed {
    Observed {
        value,
        enabled: None,
        running: None,
    }
}

/// F2 ("freeze-attack: toggled in one park") to the return: E toggled
/// DISABLE, ENABLE, DISABLE, ENABLE, DISABLE in one park with a burst
/// after each, R enabled throughout.
fn f2_to_the_return() -> Model {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.open(2, counter(0, 1));
    m.burst(0, TOTAL, 1, MIB);
    m.park(0);
    m.burst(0, TOTAL, 1, 2 * MIB);
    for (i, ioctl) in [
        Ioctl::Disable,
        Ioctl::Enable,
        Ioctl::Disable,
        Ioctl::Enable,
        Ioctl::Disable,
    ]
    .into_iter()
    .enumerate()
    {
        m.ioctl(1, ioctl, false);
        m.burst(0, TOTAL, 1, (4 << i) * MIB);
    }
    m.unpark(0);
    m
}

#[test]
pub(super) fn a_disable_while_parked_freezes_the_count_exactly() {
    // The contract: frozen at each DISABLE, thawed by its own ENABLE
    // (counting on from there, parked or not): 1 + 2 + 8 + 32 MiB.
    let mut m = f2_to_the_return();
    assert_eq!(fields(&mut m, 1, value_only(43 * MIB)), vec![]);
    assert_eq!(fields(&mut m, 2, value_only(127 * MIB)), vec![]);
    m.burst(0, TOTAL, 1, 128 * MIB);
    assert_eq!(fields(&mut m, 1, value_only(43 * MIB)), vec![]);
    m.ioctl(1, Ioctl::Enable, false);
    m.burst(0, TOTAL, 1, 256 * MIB);
    assert_eq!(fields(&mut m, 1, value_only(299 * MIB)), vec![]);
    // The `parked-disable-not-frozen` mutant: the 4 + 16 + 64 MiB
    // landed while disabled counted too.
    let mut m = f2_to_the_return();
    assert_eq!(fields(&mut m, 1, value_only(127 * MIB)), vec![Field::Value]);
    // And a thawed slot counts for sure: missing the 8 MiB is wrong.
    let mut m = f2_to_the_return();
    assert_eq!(fields(&mut m, 1, value_only(35 * MIB)), vec![Field::Value]);
}

#[test]
pub(super) fn a_frozen_slot_keeps_its_place_so_one_more_enabled_in_the_park_contends() {
    // P6 on two slots: A and B hold them, C opened disabled.
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.open(2, counter(0, 2));
    m.open(3, counter(0, 3).disabled());
    assert_eq!(fields(&mut m, 2, seen(0, 0, 0)), vec![]);
    m.park(0);
    m.burst(0, TOTAL, 1, MIB);
    m.ioctl(1, Ioctl::Disable, false);
    // A's frozen slot is still A's: C has none, the park is contended,
    // and every slot event is maybe counting until the placement.
    m.ioctl(3, Ioctl::Enable, false);
    m.burst(0, TOTAL, 2, 2 * MIB);
    m.unpark(0);
    m.burst(0, TOTAL, 2, 4 * MIB);
    assert_eq!(fields(&mut m.clone(), 2, seen(4 * MIB, 100, 60)), vec![]);
    assert_eq!(fields(&mut m, 2, seen(6 * MIB, 100, 60)), vec![]);
    // A reads exactly what landed before its DISABLE.
    assert_eq!(fields(&mut m.clone(), 1, value_only(MIB)), vec![]);
    assert_eq!(fields(&mut m, 1, value_only(0)), vec![Field::Value]);
    // Placed, all three fit: C counts for sure (P6's extra event after
    // the return).
    m.read(3, seen(0, 50, 20));
    m.burst(0, TOTAL, 3, 8 * MIB);
    assert_eq!(fields(&mut m.clone(), 3, seen(8 * MIB, 150, 120)), vec![]);
    assert_eq!(
        fields(&mut m, 3, seen(0, 150, 20)),
        vec![Field::Running, Field::Value]
    );
}

#[test]
pub(super) fn an_event_put_on_while_parked_is_maybe_until_placed() {
    // P5: the leader of {L, S} DISABLEd before the park, ENABLEd in it.
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.open(2, counter(0, 2).under(1));
    m.ioctl(1, Ioctl::Disable, false);
    m.burst(0, TOTAL, 1, MIB);
    m.park(0);
    m.burst(0, TOTAL, 1, 2 * MIB);
    m.ioctl(1, Ioctl::Enable, false);
    m.burst(0, TOTAL, 1, 4 * MIB);
    m.unpark(0);
    m.burst(0, TOTAL, 1, 8 * MIB);
    assert_eq!(fields(&mut m.clone(), 1, value_only(8 * MIB)), vec![]);
    assert_eq!(fields(&mut m.clone(), 1, value_only(12 * MIB)), vec![]);
    // Placed: the 8 MiB counts for sure.
    assert_eq!(
        fields(&mut m.clone(), 1, value_only(4 * MIB)),
        vec![Field::Value]
    );
    assert_eq!(fields(&mut m, 1, value_only(15 * MIB)), vec![Field::Value]);
    // F4: {L, S}, L DISABLEd then closed while parked: S, promoted,
    // may count from its promotion (3 or 11 MiB), never the 4 MiB
    // landed while its leader was off; placed, it counts for sure.
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.open(2, counter(0, 2).under(1));
    m.burst(0, TOTAL, 2, MIB);
    m.park(0);
    m.burst(0, TOTAL, 2, 2 * MIB);
    m.ioctl(1, Ioctl::Disable, false);
    m.burst(0, TOTAL, 2, 4 * MIB);
    m.close(1);
    m.burst(0, TOTAL, 2, 8 * MIB);
    m.unpark(0);
    assert_eq!(fields(&mut m.clone(), 2, value_only(3 * MIB)), vec![]);
    assert_eq!(
        fields(&mut m.clone(), 2, value_only(15 * MIB)),
        vec![Field::Value]
    );
    assert_eq!(fields(&mut m, 2, value_only(11 * MIB)), vec![]);
    m.burst(0, TOTAL, 2, 16 * MIB);
    assert_eq!(fields(&mut m, 2, value_only(27 * MIB)), vec![]);
}

#[test]
pub(super) fn a_parked_gauge_reads_its_last_fold_and_zero_after_a_reset() {
    // "attack: gauge reset".
    let bytes = 4321 * 64;
    let mut m = Model::new(SHAPE);
    m.occupancy(0, 4, bytes);
    m.open(1, gauge(0, 4));
    assert_eq!(fields(&mut m, 1, value_only(bytes)), vec![]);
    m.ioctl(1, Ioctl::Reset, false);
    assert_eq!(fields(&mut m, 1, value_only(bytes)), vec![]);
    m.park(0);
    m.occupancy(0, 4, 2 * bytes);
    assert_eq!(
        fields(&mut m.clone(), 1, value_only(999)),
        vec![Field::Value]
    );
    assert_eq!(fields(&mut m, 1, value_only(bytes)), vec![]);
    m.ioctl(1, Ioctl::Reset, false);
    assert_eq!(
        fields(&mut m.clone(), 1, value_only(999)),
        vec![Field::Value]
    );
    assert_eq!(fields(&mut m, 1, value_only(0)), vec![]);
    m.unpark(0);
    assert_eq!(fields(&mut m, 1, value_only(2 * bytes)), vec![]);
}

#[test]
pub(super) fn neither_clock_ever_goes_back_also_read_while_parked() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    assert_eq!(fields(&mut m, 1, seen(0, 1000, 1000)), vec![]);
    // Both back by as much: every growth rule holds, only this one
    // sees it.
    assert_eq!(
        fields(&mut m.clone(), 1, seen(0, 900, 900)),
        vec![Field::Enabled, Field::Running]
    );
    // Shown while parked, taken back at the placement: the driver did so
    // before the perf core stopped long parks (patch 0018).
    m.park(0);
    assert_eq!(fields(&mut m, 1, seen(0, 2000, 2000)), vec![]);
    m.unpark(0);
    assert_eq!(fields(&mut m, 1, seen(0, 2100, 1500)), vec![Field::Running]);
}

#[test]
pub(super) fn at_most_slots_counters_run_at_once() {
    let mut m = opened_and_read(&[counter(0, 1), counter(0, 2), counter(0, 3)]);
    let s = 1_000_000_000;
    m.moved(0);
    // Two of three at a time, each alone within the rules.
    assert_eq!(fields(&mut m.clone(), 1, seen(0, s, 9 * s / 10)), vec![]);
    let mut two_thirds = m.clone();
    for h in 1..=3 {
        assert_eq!(fields(&mut two_thirds, h, seen(0, s, 2 * s / 3)), vec![]);
    }
    assert_eq!(fields(&mut m, 1, seen(0, s, 9 * s / 10)), vec![]);
    assert_eq!(fields(&mut m, 2, seen(0, s, 9 * s / 10)), vec![]);
    assert_eq!(
        fields(&mut m, 3, seen(0, s, 9 * s / 10)),
        vec![Field::Running]
    );
}

#[test]
pub(super) fn an_exclusive_group_runs_alone_and_a_groups_members_together() {
    let s = 1_000_000_000;
    let mut m = opened_and_read(&[counter(0, 1).exclusive(), counter(0, 2)]);
    m.moved(0);
    let mut turns = m.clone();
    assert_eq!(fields(&mut turns, 1, seen(0, s, s / 2)), vec![]);
    assert_eq!(fields(&mut turns, 2, seen(0, s, s / 2)), vec![]);
    assert_eq!(fields(&mut m, 1, seen(0, s, 8 * s / 10)), vec![]);
    assert_eq!(fields(&mut m, 2, seen(0, s, s / 2)), vec![Field::Running]);
    // A pinned group goes on before it and stays beside it (seed 17,
    // operation 833).
    let mut m = opened_and_read(&[counter(0, 1).exclusive(), counter(0, 2).pinned()]);
    m.moved(0);
    assert_eq!(fields(&mut m, 1, seen(0, s, s / 2)), vec![]);
    assert_eq!(fields(&mut m, 2, seen(0, s, s)), vec![]);
    // {1, 2} and two more: multiplexed, the pair in and out together.
    let mut m = opened_and_read(&pair_and_two_more());
    m.moved(0);
    let mut together = m.clone();
    assert_eq!(fields(&mut together, 1, seen(0, s, s / 2)), vec![]);
    assert_eq!(fields(&mut together, 2, seen(0, s, s / 2)), vec![]);
    assert_eq!(fields(&mut m, 1, seen(0, s, s / 2)), vec![]);
    assert_eq!(fields(&mut m, 2, seen(0, s, s / 5)), vec![Field::Running]);
}

/// Reads of a PMU's events, then the same reads a second later with no
/// operation between (a scenario's `wait`): two windows, each judged
/// on its own. (The model took the second reads for the first
/// moment's, and one event's second read against the other's first
/// gave a `time_enabled` mismatch that was not there.)
#[test]
pub(super) fn reads_again_after_nothing_but_time_are_a_moment_of_their_own() {
    let s = 1_000_000_000;
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1).exclusive());
    m.open(2, counter(0, 2));
    // Read at 0 s, then (after a move) at 1 s and at 2 s, taking turns.
    for (at, moves) in [(0, true), (1, false), (2, false)] {
        for h in [1, 2] {
            assert_eq!(
                fields(&mut m, h, seen(0, at * s, at * s / 2)),
                vec![],
                "{at} s"
            );
        }
        if moves {
            m.moved(0);
        }
    }
    // The rules still hold in the window of nothing but time.
    assert_eq!(fields(&mut m, 1, seen(0, 3 * s, 2 * s)), vec![]);
    assert_eq!(
        fields(&mut m, 2, seen(0, 3 * s, 2 * s)),
        vec![Field::Running]
    );
}

/// An exclusive event and a mixed group {cpu-clock leader, device
/// sibling} of the same PMU, moved twice, read a second apart with a
/// `wait` between (scenarios/groups/exclusive-and-groups-after-moves.scn):
/// the group is a device PMU's flexible group, so the two take turns, and
/// the second waited is no read's spread. (The model took the reads before
/// and after the wait for one moment's, allowed for the whole second
/// between them, and passed the kernel mutant `move-resets-group-caps`,
/// where both ran 100 %.)
#[test]
pub(super) fn an_exclusive_event_and_a_moved_mixed_group_take_turns_across_a_wait() {
    let s = 1_000_000_000;
    let ms = 1_000_000;
    let mut m = Model::new(SHAPE);
    m.open_on(1, software(), Some(2));
    m.open_on(2, counter(0, 5).under(1), Some(2));
    m.open(3, counter(0, 4).exclusive());
    // Each read's system call takes 0.1 ms and returns at `at`; the
    // cpu-clock leader counts its running time.
    let read = |m: &mut Model, at: u64, h: Handle, en: u64, run: u64| {
        m.read_took(ms / 10, at);
        let value = if h == 1 { run } else { 0 };
        fields(m, h, seen(value, en, run))
    };
    assert_eq!(read(&mut m, s, 3, 0, 0), vec![]);
    assert_eq!(read(&mut m, s + ms, 1, 0, 0), vec![]);
    m.moved(0);
    m.moved(0);
    assert_eq!(read(&mut m, 2 * s, 3, s, s / 2), vec![]);
    assert_eq!(read(&mut m, 2 * s + ms, 1, s, s / 2), vec![]);
    // A second later, nothing but the wait between.
    let mut turns = m.clone();
    assert_eq!(read(&mut turns, 3 * s, 3, 2 * s, s), vec![]);
    assert_eq!(read(&mut turns, 3 * s + ms, 1, 2 * s, s), vec![]);
    assert_eq!(read(&mut m, 3 * s, 3, 2 * s, 3 * s / 2), vec![]);
    assert_eq!(
        read(&mut m, 3 * s + ms, 1, 2 * s, 3 * s / 2),
        vec![Field::Running]
    );
}

#[test]
pub(super) fn a_cpu_going_offline_takes_its_software_groups_apart_for_good() {
    let mut m = Model::new(SHAPE);
    m.open_on(1, software(), Some(3));
    m.open_on(2, software().under(1), Some(3));
    m.open_on(3, software().under(1), Some(3));
    // A mixed group lives in its device PMU's context: it moves.
    m.open_on(4, software(), Some(3));
    m.open_on(5, counter(0, 1).under(4), Some(3));
    // Another CPU's group is left alone.
    m.open_on(6, software(), Some(2));
    m.open_on(7, software().under(6), Some(2));
    assert_eq!(fields(&mut m, 2, seen(0, 100, 100)), vec![]);
    m.cpu_offline(3);
    assert_eq!(fields(&mut m, 2, seen(0, 120, 120)), vec![]);
    assert_eq!(m.group(1), vec![1]);
    assert_eq!(m.group(2), vec![2]);
    assert_eq!(m.group(4), vec![4, 5]);
    assert_eq!(m.group(6), vec![6, 7]);
    assert_eq!(m.predict_open(&software().under(2)), Err(Refusal::Parked));
    // OFF: its clocks stand still; an ENABLE while the CPU is offline
    // does nothing.
    m.ioctl(2, Ioctl::Enable, false);
    assert!(!m.is_enabled(2));
    m.cpu_online(3);
    assert_eq!(m.group(1), vec![1], "the CPU's return makes no group whole");
    assert_eq!(
        fields(&mut m.clone(), 2, seen(0, 150, 150)),
        vec![Field::Enabled, Field::Running]
    );
    assert_eq!(fields(&mut m, 2, seen(0, 120, 120)), vec![]);
    // Enabled now, but out of the context: never scheduled.
    m.ioctl(2, Ioctl::Enable, true);
    assert!(m.is_enabled(2) && !m.is_enabled(1));
    assert_eq!(
        fields(&mut m.clone(), 2, seen(0, 200, 200)),
        vec![Field::Running]
    );
    assert_eq!(fields(&mut m, 2, seen(0, 200, 120)), vec![]);
    assert_eq!(fields(&mut m, 7, seen(0, 300, 300)), vec![]);
    // Out of every context's list, a second offline leaves it as it is
    // (INACTIVE: enabled, never running), and a DISABLE while its CPU
    // is offline does not reach it.
    m.cpu_offline(3);
    assert!(m.is_enabled(2));
    m.ioctl(2, Ioctl::Disable, false);
    assert!(m.is_enabled(2));
    assert_eq!(fields(&mut m, 2, seen(0, 260, 120)), vec![]);
}

#[test]
pub(super) fn a_detached_event_enabled_again_may_show_its_clock_still() {
    // INACTIVE in no context's list: perf brings its time_enabled up
    // to date only when something schedules or reads it there.
    let mut m = Model::new(SHAPE);
    m.open_on(1, software(), Some(3));
    m.open_on(2, software().under(1), Some(3));
    assert_eq!(fields(&mut m, 2, seen(0, 100, 100)), vec![]);
    m.cpu_offline(3);
    m.cpu_online(3);
    m.ioctl(2, Ioctl::Enable, false);
    m.moved(0);
    assert_eq!(fields(&mut m, 2, seen(0, 100, 100)), vec![]);
}

#[test]
pub(super) fn a_software_sibling_promoted_by_its_disabled_leaders_close_waits_for_a_schedule_in() {
    // Seed 3, operation 1119: {106 disabled, 107, 108} cpu-clock on CPU
    // 1, the leader closed; upstream schedules the promoted siblings at
    // the CPU context's next schedule-in, if any.
    let mut m = Model::new(SHAPE);
    m.open_on(1, software().disabled(), Some(1));
    m.open_on(2, software().under(1), Some(1));
    m.open_on(3, counter(0, 1).disabled(), None);
    m.open_on(4, counter(0, 2).under(3), None);
    assert_eq!(fields(&mut m, 2, seen(0, 0, 0)), vec![]);
    assert_eq!(fields(&mut m, 4, seen(0, 0, 0)), vec![]);
    m.close(1);
    m.close(3);
    assert_eq!(fields(&mut m, 2, seen(0, 50, 0)), vec![]);
    // A device PMU is rescheduled at the close (patch 0010).
    assert_eq!(
        fields(&mut m.clone(), 4, seen(0, 50, 0)),
        vec![Field::Running]
    );
    assert_eq!(fields(&mut m, 4, seen(0, 50, 50)), vec![]);
    m.moved(0);
    assert_eq!(fields(&mut m, 2, seen(0, 100, 0)), vec![]);
    assert_eq!(fields(&mut m, 4, seen(0, 100, 50)), vec![Field::Running]);
}

#[test]
fn predict_says_what_a_read_must_show_and_takes_it_as_the_baseline() {
    let mut m = f2_to_the_return();
    let exact = |base, bytes| ValueRule::Bytes {
        base,
        lo: bytes,
        hi: bytes,
        short: 0,
        over: 0,
        settle_zero: true,
        settle_full: true,
        lossy: false,
    };
    let want = m.predict(1).unwrap();
    assert_eq!(want.value, exact(0, 43 * MIB));
    // Frozen at each DISABLE, counting for sure from each ENABLE.
    assert_eq!(want.running, TimeRule::AsEnabled);
    m.ioctl(1, Ioctl::Enable, false);
    m.burst(0, TOTAL, 1, 256 * MIB);
    let want = m.predict(1).unwrap();
    assert_eq!(
        want.value,
        ValueRule::Bytes {
            base: 43 * MIB,
            lo: 256 * MIB,
            hi: 256 * MIB,
            short: 0,
            over: 0,
            settle_zero: true,
            settle_full: true,
            lossy: false,
        }
    );
    assert_eq!(
        want.running,
        TimeRule::AsEnabled,
        "disabled until the ENABLE, counting from it: both clocks alike"
    );
    assert_eq!(m.predict(9), None);
}

#[test]
fn an_event_counting_whenever_it_is_enabled_runs_as_long_as_it_is_enabled() {
    // Neither clock grows while disabled, both while counting: a
    // DISABLE and an ENABLE in the window leave them equal.
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    assert_eq!(fields(&mut m, 1, seen(0, 100, 100)), vec![]);
    m.ioctl(1, Ioctl::Disable, false);
    m.burst(0, TOTAL, 1, 64);
    m.moved(0);
    m.ioctl(1, Ioctl::Enable, false);
    m.burst(0, TOTAL, 1, 128);
    assert_eq!(fields(&mut m.clone(), 1, seen(128, 200, 200)), vec![]);
    assert_eq!(fields(&mut m, 1, seen(128, 200, 150)), vec![Field::Running]);
    // Frozen and thawed in one park: counting for sure throughout.
    m.park(0);
    m.ioctl(1, Ioctl::Disable, false);
    m.ioctl(1, Ioctl::Enable, false);
    m.unpark(0);
    assert_eq!(fields(&mut m.clone(), 1, seen(128, 300, 250)), vec![]);
    assert_eq!(fields(&mut m, 1, seen(128, 300, 200)), vec![Field::Running]);
}

#[test]
fn times_that_ran_whenever_enabled_settle_a_multiplexed_count_across_a_disable() {
    let mut m = Model::new(SHAPE);
    for h in 1..=3 {
        m.open(h, counter(0, 1));
    }
    assert_eq!(fields(&mut m, 1, seen(0, 100, 50)), vec![]);
    m.ioctl(1, Ioctl::Disable, false);
    m.burst(0, TOTAL, 1, 64);
    m.ioctl(1, Ioctl::Enable, false);
    m.burst(0, TOTAL, 1, 1024);
    // Running for all the time it was enabled: it counted the 1024.
    assert_eq!(fields(&mut m.clone(), 1, seen(1024, 200, 150)), vec![]);
    assert_eq!(fields(&mut m.clone(), 1, seen(512, 200, 120)), vec![]);
    assert_eq!(fields(&mut m, 1, seen(512, 200, 150)), vec![Field::Value]);
}

#[test]
pub(super) fn a_count_shown_while_parked_is_never_taken_back() {
    // Three counters on two slots: multiplexed, any count up to what
    // landed; but once shown, a count stays.
    let mut m = Model::new(SHAPE);
    for h in 1..=3 {
        m.open(h, counter(0, 1));
    }
    m.park(0);
    m.burst(0, TOTAL, 1, 640);
    assert_eq!(fields(&mut m, 1, value_only(640)), vec![]);
    assert_eq!(fields(&mut m.clone(), 1, value_only(0)), vec![Field::Value]);
    m.unpark(0);
    assert_eq!(fields(&mut m.clone(), 1, value_only(640)), vec![]);
    assert_eq!(fields(&mut m.clone(), 1, value_only(0)), vec![Field::Value]);
    // A RESET takes it back, as it should.
    m.ioctl(1, Ioctl::Reset, false);
    assert_eq!(fields(&mut m, 1, value_only(0)), vec![]);
}

#[test]
fn a_parked_gauge_keeps_running_though_its_value_is_the_last_fold() {
    let mut m = Model::new(SHAPE);
    m.occupancy(0, 4, 640);
    m.open(1, gauge(0, 4));
    assert_eq!(fields(&mut m, 1, seen(640, 100, 100)), vec![]);
    m.park(0);
    m.occupancy(0, 4, 6400);
    // Attached and enabled, no slot to miss: its clocks run on.
    assert_eq!(
        fields(&mut m.clone(), 1, seen(640, 200, 150)),
        vec![Field::Running]
    );
    assert_eq!(fields(&mut m, 1, seen(640, 200, 200)), vec![]);
    m.unpark(0);
    assert_eq!(fields(&mut m, 1, seen(6400, 300, 300)), vec![]);
}

#[test]
pub(super) fn an_enabled_event_read_again_after_an_operation_shows_its_clocks_moved() {
    // A parked read that shows the times of the read before the park
    // (perf's context time standing still while no CPU holds it):
    // the contract's clocks run on through a park.
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.moved(0);
    assert_eq!(fields(&mut m, 1, seen(0, 1000, 1000)), vec![]);
    m.park(0);
    m.burst(0, TOTAL, 1, 640);
    assert_eq!(
        fields(&mut m.clone(), 1, seen(0, 1000, 1000)),
        vec![Field::Enabled, Field::Running]
    );
    assert_eq!(fields(&mut m, 1, seen(0, 1500, 1500)), vec![]);
    // Reads one after the other, nothing between: nothing is owed.
    assert_eq!(fields(&mut m, 1, seen(0, 1500, 1500)), vec![]);
    // Disabled: both stand still, as before.
    m.ioctl(1, Ioctl::Disable, false);
    assert_eq!(fields(&mut m, 1, seen(0, 1600, 1600)), vec![]);
    m.moved(0);
    assert_eq!(fields(&mut m, 1, seen(0, 1600, 1600)), vec![]);
}

#[test]
pub(super) fn a_park_in_which_an_exclusive_group_clashed_leaves_every_event_maybe_until_placed() {
    // `stress --lifecycle 10000 --seed 3`, operation 7573: an exclusive
    // group shared the PMU with a counter and a gauge when it parked;
    // the exclusive group was the one on, so the gauge stood still
    // through the park, also after the exclusive group's DISABLE ended
    // the clash (perf puts nothing on while parked).
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1).exclusive());
    m.open(2, counter(0, 2));
    m.open(3, gauge(0, 4));
    assert_eq!(fields(&mut m, 3, seen(0, 1000, 500)), vec![]);
    m.park(0);
    assert_eq!(fields(&mut m, 3, seen(0, 1200, 600)), vec![]);
    m.ioctl(1, Ioctl::Disable, false);
    m.burst(0, TOTAL, 2, 640);
    assert_eq!(fields(&mut m, 3, seen(0, 1500, 600)), vec![]);
    // Placed: every event is on for sure again, and its clock moves.
    m.unpark(0);
    m.burst(0, TOTAL, 2, 640);
    assert_eq!(
        fields(&mut m.clone(), 3, seen(0, 1800, 600)),
        vec![Field::Running]
    );
    assert_eq!(fields(&mut m, 3, seen(0, 1800, 900)), vec![]);
}

#[test]
pub(super) fn a_park_short_of_slots_leaves_its_gauges_counting_for_sure() {
    // Contention for slots alone: a gauge takes none and goes on
    // whatever did not fit (patch 0009), so its clock moves through
    // the park.
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.open(2, counter(0, 2));
    m.open(3, counter(0, 3));
    m.open(4, gauge(0, 4));
    assert_eq!(fields(&mut m, 4, seen(0, 1000, 1000)), vec![]);
    m.park(0);
    assert_eq!(fields(&mut m, 4, seen(0, 1200, 1200)), vec![]);
    m.ioctl(1, Ioctl::Disable, false);
    m.burst(0, TOTAL, 2, 640);
    assert_eq!(
        fields(&mut m.clone(), 4, seen(0, 1500, 1200)),
        vec![Field::Running]
    );
    assert_eq!(fields(&mut m, 4, seen(0, 1500, 1500)), vec![]);
}

#[test]
pub(super) fn events_enabled_throughout_one_window_show_the_same_time_enabled() {
    // Two events of one PMU, enabled throughout between two moments
    // at which both were read: perf's clock is the context's, so both
    // grew alike (a move that loses one event's enabled time shows
    // here only: each one alone runs as it is enabled).
    let s = 1_000_000_000;
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.open(2, counter(0, 2));
    assert_eq!(fields(&mut m, 1, seen(0, 10, 10)), vec![]);
    assert_eq!(fields(&mut m, 2, seen(0, 10, 10)), vec![]);
    m.moved(0);
    assert_eq!(fields(&mut m, 1, seen(0, s, s)), vec![]);
    assert_eq!(fields(&mut m.clone(), 2, seen(0, s + 5, s + 5)), vec![]);
    assert_eq!(
        fields(&mut m, 2, seen(0, s / 2, s / 2)),
        vec![Field::Enabled]
    );
}

#[test]
pub(super) fn reads_that_took_long_widen_the_rules_across_events_by_what_they_took() {
    // `stress --lifecycle 10000 --seed 3` (the generator that draws
    // software groups on the CPUs that go offline), operation 6149:
    // two moments of reads of four events each, single reads taking up
    // to 10.5 ms on the loaded guest; two events' time_enabled grew
    // 16 ms apart, past four reads' 2 ms each at both ends.
    let ms = 1_000_000;
    let read = |m: &mut Model, took: u64, h: Handle, en: u64| {
        m.read_took(took, 0);
        fields(m, h, seen(0, en, en))
    };
    let mut m = Model::new(SHAPE);
    for h in 1..=4 {
        m.open(h, gauge(0, h));
    }
    for h in 1..=4 {
        assert_eq!(read(&mut m, 0, h, 10), vec![]);
    }
    m.moved(0);
    let mut quick = m.clone();
    for h in 1..=3 {
        assert_eq!(read(&mut quick, 0, h, 100 * ms), vec![]);
    }
    assert_eq!(read(&mut quick, 0, 4, 117 * ms), vec![Field::Enabled]);
    // The same numbers from reads that took 10 ms each: allowed.
    let mut slow = m.clone();
    for h in 1..=3 {
        assert_eq!(read(&mut slow, 10 * ms, h, 100 * ms), vec![]);
    }
    assert_eq!(read(&mut slow, 10 * ms, 4, 117 * ms), vec![]);
    // Not beyond what they took (1 ms each here).
    for h in 1..=3 {
        assert_eq!(read(&mut m, ms, h, 100 * ms), vec![]);
    }
    assert_eq!(read(&mut m, ms, 4, 130 * ms), vec![Field::Enabled]);
}

#[test]
pub(super) fn reads_spread_apart_on_the_guest_widen_the_rules_across_events_by_their_spread() {
    // `vmm_end_to_end` in the box (scenario exclusive-across-moves): two
    // events' time_enabled grew 10.9 ms apart over one window, though
    // each read's system call was quick: the nested guest's vCPU was
    // not run between two reads of one moment.
    let ms = 1_000_000;
    let read = |m: &mut Model, returned: u64, h: Handle, en: u64| {
        m.read_took(ms / 10, returned);
        fields(m, h, seen(0, en, en))
    };
    let mut m = Model::new(SHAPE);
    m.open(1, gauge(0, 1));
    m.open(2, gauge(0, 2));
    assert_eq!(read(&mut m, 1000 * ms, 1, 10), vec![]);
    assert_eq!(read(&mut m, 1000 * ms + ms / 5, 2, 10), vec![]);
    m.moved(0);
    // Returned 12 ms apart: the later read's clock grew 12 ms more.
    let mut spread = m.clone();
    assert_eq!(read(&mut spread, 2000 * ms, 1, 100 * ms), vec![]);
    assert_eq!(read(&mut spread, 2012 * ms, 2, 112 * ms), vec![]);
    // The same reads with their return unknown: only what the system
    // calls took is allowed for, and 12 ms is past it.
    let mut unknown = m.clone();
    assert_eq!(read(&mut unknown, 0, 1, 100 * ms), vec![]);
    assert_eq!(read(&mut unknown, 0, 2, 112 * ms), vec![Field::Enabled]);
    // Nor does a spread excuse more than it spans.
    assert_eq!(read(&mut m, 2000 * ms, 1, 100 * ms), vec![]);
    assert_eq!(read(&mut m, 2012 * ms, 2, 150 * ms), vec![Field::Enabled]);
}

#[test]
pub(super) fn a_groups_members_read_apart_show_their_running_apart_by_the_reads_spread() {
    // `vmm_end_to_end` in the box at 027f891 (scenario
    // reset-of-waiting-group-after-move, line 28): a group {1, 2} read
    // member by member, then a third event's ENABLE makes it wait, then
    // read again. Perf took 1's first read 14.7 ms before 2's, so 1's
    // time_running grew 17.15 ms to 2's 2.43 ms, both then out 5.7 ms.
    // The agent's stamps said 1's read took 8.4 ms, beginning 9.7 ms
    // before 2's returned, but the device served it 5.5 ms before that
    // start: the agent read its clock twice after the call (how long it
    // took, then when it returned), and its vCPU was not run between the
    // two. By the device, the read began 14.1 ms or more before it
    // returned.
    let mut m = opened_and_read(&[
        counter(0, 1),
        counter(0, 2).under(1),
        counter(0, 3),
        counter(0, 4).disabled(),
    ]);
    m.moved(0);
    let window = |first_took: u64| {
        let mut m = m.clone();
        m.read_took(first_took, 284_221_778_592);
        assert_eq!(fields(&mut m, 1, seen(0, 81_579_802, 81_579_802)), vec![]);
        m.read_took(1_274_899, 284_223_092_238);
        assert_eq!(fields(&mut m, 2, seen(0, 88_368_007, 88_368_007)), vec![]);
        m.ioctl(4, Ioctl::Enable, false);
        m.read_took(105_220, 284_230_548_026);
        assert_eq!(fields(&mut m, 1, seen(0, 104_367_977, 98_729_135)), vec![]);
        m.read_took(21_919, 284_230_593_353);
        fields(&mut m, 2, seen(0, 96_515_774, 90_801_847))
    };
    // The read as long as the device shows it: the spread allows for it.
    assert_eq!(window(14_100_000), vec![]);
    // As the agent stamped it: members whose reads lay 9.7 ms apart at
    // most cannot have run 14.7 ms apart.
    assert_eq!(window(8_370_008), vec![Field::Running]);
}

#[test]
pub(super) fn a_multiplexed_gauge_reads_an_occupancy_it_may_have_seen() {
    // A gauge beside an exclusive group takes turns: which occupancy
    // it last folded is perf's rotation, but it is one of them, or
    // its last fold, never a number the domain never held.
    let mut m = Model::new(SHAPE);
    m.occupancy(0, 4, 640);
    m.open(1, gauge(0, 4));
    assert_eq!(fields(&mut m, 1, value_only(640)), vec![]);
    m.open(2, counter(0, 1).exclusive());
    m.occupancy(0, 4, 1280);
    m.occupancy(0, 4, 1920);
    for v in [640, 1280, 1920] {
        assert_eq!(fields(&mut m.clone(), 1, value_only(v)), vec![]);
    }
    assert_eq!(
        fields(&mut m.clone(), 1, value_only(12345)),
        vec![Field::Value]
    );
    // A RESET while it takes turns: 0 until it counts, or what it saw.
    m.ioctl(1, Ioctl::Reset, false);
    assert_eq!(fields(&mut m.clone(), 1, value_only(0)), vec![]);
    assert_eq!(fields(&mut m.clone(), 1, value_only(1920)), vec![]);
    assert_eq!(fields(&mut m, 1, value_only(640)), vec![Field::Value]);
}

#[test]
pub(super) fn a_count_never_goes_back_without_a_reset() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.burst(0, TOTAL, 1, 640);
    assert_eq!(fields(&mut m, 1, value_only(640)), vec![]);
    // Nothing landed since: no more, and never less.
    assert_eq!(
        fields(&mut m.clone(), 1, value_only(320)),
        vec![Field::Value]
    );
    assert_eq!(fields(&mut m, 1, value_only(640)), vec![]);
}

#[test]
pub(super) fn a_closed_event_cannot_be_read() {
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.close(1);
    assert_eq!(fields(&mut m, 1, value_only(0)), vec![Field::Value]);
}

#[test]
pub(super) fn a_group_of_software_events_only_is_always_on() {
    // Beside more counters than slots: it needs none.
    let mut m = Model::new(SHAPE);
    m.open_on(1, software(), Some(1));
    m.open_on(2, software().under(1), Some(1));
    for h in 3..=5 {
        m.open(h, counter(0, h));
    }
    assert_eq!(fields(&mut m, 2, seen(0, 100, 100)), vec![]);
    m.moved(0);
    // Running throughout, whatever the counters do.
    for (running, want) in [(150, vec![Field::Running]), (200, vec![])] {
        assert_eq!(fields(&mut m.clone(), 2, seen(0, 200, running)), want);
    }
}

#[test]
pub(super) fn steady_traffic_through_a_contended_moment_inside_a_step_may_show_in_part() {
    // Seed 5 with watched rates: two counters on two slots, one fed a
    // rate, and a perf stat step that opens a third, lets bursts land and
    // closes it. The watched event counted before and after the step but
    // may have been rotated out inside it.
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.open(2, counter(0, 2));
    assert_eq!(fields(&mut m, 1, seen(0, 100, 100)), vec![]);
    let before = m.snapshot();
    m.open(3, counter(0, 3));
    m.burst(0, TOTAL, 3, 64 << 10);
    m.close(3);
    m.flowed_during(&before, (0, TOTAL, 1), 1 << 20, &[]);
    let short = Observed {
        value: (1 << 20) - (256 << 10),
        ..seen(0, 300, 250)
    };
    assert_eq!(fields(&mut m.clone(), 1, short), vec![]);
    assert_eq!(fields(&mut m, 1, seen(1 << 20, 300, 300)), vec![]);
    // A step that never left it short of a slot counts its flow for sure.
    let before = m.snapshot();
    m.ioctl(2, Ioctl::Reset, false);
    m.flowed_during(&before, (0, TOTAL, 1), 1 << 20, &[]);
    assert_eq!(
        fields(&mut m, 1, seen((2 << 20) - (64 << 10), 400, 400)),
        vec![Field::Value]
    );
}

#[test]
pub(super) fn a_device_member_moves_its_software_group_siblings_first() {
    // The watched-rates stress, shrunk: {e86, e87} cpu-clock on the owner,
    // then a counter opened into the group; e87 ran 0.2-2.1 ms short of
    // its time_enabled over that open.
    let mut m = Model::new(SHAPE);
    m.open_on(1, software(), Some(1));
    m.open_on(2, software().under(1), Some(1));
    assert_eq!(fields(&mut m, 1, seen(0, 100, 100)), vec![]);
    assert_eq!(fields(&mut m, 2, seen(0, 100, 100)), vec![]);
    m.open(3, counter(0, 3).under(1));
    assert_eq!(fields(&mut m.clone(), 2, seen(0, 300, 250)), vec![]);
    // Its leader was out as long as it was off.
    assert_eq!(
        fields(&mut m.clone(), 1, seen(0, 300, 250)),
        vec![Field::Running]
    );
    // Settled from the next window on.
    assert_eq!(fields(&mut m, 2, seen(0, 300, 250)), vec![]);
    assert_eq!(fields(&mut m, 2, seen(0, 400, 300)), vec![Field::Running]);
}

#[test]
pub(super) fn a_device_member_restarts_its_software_group_as_opened() {
    // scenarios/groups/device-member-restarts-a-software-group-as-opened.scn
    // on the debug kernel: move_group's perf_event__state_init() on each
    // member it installs again.
    let mut m = Model::new(SHAPE);
    // A leader its CPU's offline detached, the CPU back.
    m.open_on(1, software(), Some(1));
    m.cpu_offline(1);
    m.cpu_online(1);
    assert!(!m.is_enabled(1));
    m.open_on(2, counter(0, 3).under(1), Some(1));
    assert!(m.is_enabled(1), "the detached leader is enabled again");
    m.burst(0, TOTAL, 3, 1 << 20);
    assert_eq!(fields(&mut m, 2, seen(1 << 20, 100, 100)), vec![]);
    // A leader disabled since its open is enabled again; a sibling opened
    // disabled and enabled since is off again.
    m.open_on(3, software(), Some(1));
    m.open_on(4, software().disabled().under(3), Some(1));
    m.ioctl(4, Ioctl::Enable, false);
    m.ioctl(3, Ioctl::Disable, false);
    m.open_on(5, counter(0, 4).under(3), Some(1));
    assert!(m.is_enabled(3) && !m.is_enabled(4));
    // A group already in its device PMU's context is not moved again.
    m.ioctl(3, Ioctl::Disable, false);
    m.open_on(6, counter(0, 5).under(3), Some(1));
    assert!(!m.is_enabled(3));
}

#[test]
pub(super) fn a_groups_members_may_run_apart_across_a_park() {
    // {1, 2} and two more on two slots, parked and placed between two
    // reads: patch 0008 decides per event which keeps a slot.
    let s = 1_000_000_000;
    let mut m = opened_and_read(&pair_and_two_more());
    let mut moved = m.clone();
    m.park(0);
    m.unpark(0);
    assert_eq!(fields(&mut m, 1, seen(0, s, s / 2)), vec![]);
    assert_eq!(fields(&mut m, 2, seen(0, s, s / 5)), vec![]);
    // A move alone does not part them.
    moved.moved(0);
    assert_eq!(fields(&mut moved, 1, seen(0, s, s / 2)), vec![]);
    assert_eq!(
        fields(&mut moved, 2, seen(0, s, s / 5)),
        vec![Field::Running]
    );
}

#[test]
pub(super) fn a_pinned_group_left_out_may_stop_its_clock() {
    // Pinned groups that do not fit together: perf puts the one left
    // out in ERROR, where its time_enabled stops too.
    let s = 1_000_000_000;
    let mut m = opened_and_read(&[
        counter(0, 1).pinned(),
        counter(0, 2).under(1),
        counter(0, 3).pinned(),
    ]);
    m.moved(0);
    assert_eq!(fields(&mut m, 3, seen(0, s, s)), vec![]);
    assert_eq!(fields(&mut m, 1, seen(0, s / 2, 0)), vec![]);
}

#[test]
pub(super) fn a_pinned_group_left_out_may_be_in_error_until_enabled_again() {
    // A pinned exclusive group beside another pinned group: perf puts
    // one of them in ERROR, where a read returns nothing, until its
    // ENABLE. Pinned groups that fit are never there.
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1).pinned());
    m.open(2, counter(0, 2).pinned().exclusive());
    m.open(3, counter(0, 3));
    assert!(m.may_be_in_error(1) && m.may_be_in_error(2));
    assert!(
        !m.may_be_in_error(3),
        "not pinned: multiplexed, never ERROR"
    );
    m.close(1);
    assert!(m.may_be_in_error(2), "ERROR lasts past the clash");
    m.ioctl(2, Ioctl::Enable, false);
    assert!(!m.may_be_in_error(2), "an ENABLE takes it out of ERROR");
    let mut fit = Model::new(SHAPE);
    fit.open(1, counter(0, 1).pinned());
    fit.open(2, counter(0, 2).pinned());
    assert!(!fit.may_be_in_error(1) && !fit.may_be_in_error(2));
}

#[test]
pub(super) fn a_pinned_group_in_error_stops_read_through_its_sibling_until_the_leaders_enable() {
    // The red team's pinned group {4, 5} beside a pinned counter, one slot
    // short: perf puts the group's leader in ERROR. Read through the
    // sibling (the leader's read returns nothing), the group shows its
    // clocks stopped and nothing counted, also once the clash is over and
    // after the sibling's own ENABLE; the group ENABLE issued on the
    // sibling reaches the leader, and it counts for sure from there.
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1).pinned());
    m.open(4, counter(0, 4).pinned());
    m.open(5, counter(0, 5).under(4));
    m.burst(0, TOTAL, 5, 1 << 20);
    assert_eq!(fields(&mut m, 5, seen(0, 100, 100)), vec![]);
    m.close(1);
    m.burst(0, TOTAL, 5, 1 << 20);
    assert_eq!(fields(&mut m, 5, seen(0, 100, 100)), vec![]);
    m.ioctl(5, Ioctl::Enable, false);
    m.burst(0, TOTAL, 5, 1 << 20);
    assert_eq!(fields(&mut m, 5, seen(0, 100, 100)), vec![]);
    m.ioctl(5, Ioctl::Enable, true);
    m.burst(0, TOTAL, 5, 1 << 20);
    assert_eq!(
        fields(&mut m.clone(), 5, seen(0, 200, 200)),
        vec![Field::Value]
    );
    assert_eq!(fields(&mut m, 5, seen(1 << 20, 200, 200)), vec![]);
}

#[test]
pub(super) fn an_event_disabled_in_the_window_is_not_compared() {
    // The rules across events hold for the events enabled throughout:
    // one DISABLEd and ENABLEd in the window grew time_enabled less.
    let s = 1_000_000_000;
    let mut m = opened_and_read(&[counter(0, 1), counter(0, 2)]);
    let mut steady = m.clone();
    m.ioctl(2, Ioctl::Disable, false);
    m.moved(0);
    m.ioctl(2, Ioctl::Enable, false);
    assert_eq!(fields(&mut m, 1, seen(0, s, s)), vec![]);
    assert_eq!(fields(&mut m, 2, seen(0, s / 2, s / 2)), vec![]);
    // Enabled throughout, the same numbers are a mismatch.
    steady.moved(0);
    assert_eq!(fields(&mut steady, 1, seen(0, s, s)), vec![]);
    assert_eq!(
        fields(&mut steady, 2, seen(0, s / 2, s / 2)),
        vec![Field::Enabled]
    );
}

/// Counter 1 of PMU 0 leading cpu-clock 2 (opened on CPU 2), read once
/// after 100 ms counting.
fn cpu_clock_in_a_device_group() -> Model {
    const MS: u64 = 1_000_000;
    let mut m = Model::new(SHAPE);
    m.open(1, counter(0, 1));
    m.open_on(2, software().under(1), Some(2));
    assert_eq!(
        fields(&mut m, 2, seen(100 * MS, 100 * MS, 100 * MS)),
        vec![]
    );
    m
}

#[test]
pub(super) fn a_cpu_clock_taking_turns_may_miss_each_rotations_sched_out() {
    // Two more counters on two slots: the cpu-clock's group takes turns.
    // Each turn in, perf's rotation starts its running time at the context
    // time it took before scheduling the others out, its counter at its own
    // add after that. 160 ms of running is at most 41 turns of 4 ms.
    const MS: u64 = 1_000_000;
    let mut m = cpu_clock_in_a_device_group();
    m.open(3, counter(0, 1));
    m.open(4, counter(0, 1));
    m.burst(0, TOTAL, 1, 1 << 20);
    let (enabled, running) = (500 * MS, 260 * MS);
    // 5 ms and a tenth allow 21 ms short, the turns 12.3 ms more.
    assert_eq!(
        fields(&mut m.clone(), 2, seen(230 * MS, enabled, running)),
        vec![]
    );
    assert_eq!(
        fields(&mut m.clone(), 2, seen(225 * MS, enabled, running)),
        vec![Field::Value]
    );
    // A shorter mux interval allows more turns.
    m.mux_interval(2);
    assert_eq!(fields(&mut m, 2, seen(225 * MS, enabled, running)), vec![]);
}

#[test]
fn a_cpu_clock_of_a_parked_group_stands_still_when_its_holding_cpu_goes() {
    // Parked with CPUs 2-3 gone, domain 0's group waits on CPU 0, the
    // first online; CPU 0 going offline (arm64) hands it to CPU 1, a
    // transit in which the cpu-clock sibling stands still. CPU 1 going
    // offline instead moves nothing: the sibling runs as enabled.
    const MS: u64 = 1_000_000;
    let mut m = cpu_clock_in_a_device_group();
    m.cpu_offline(2);
    m.cpu_offline(3);
    m.park(0);
    assert_eq!(
        fields(&mut m, 2, seen(200 * MS, 200 * MS, 200 * MS)),
        vec![]
    );
    // Held on CPU 0, then (CPU 0 back, CPU 1 holding them) on CPU 1: the
    // holding CPU's offline hands them on, 5 ms of transit each time, the
    // other CPU's moves nothing.
    for (at, running, holding, other) in [(300, 295, 0, 1), (400, 390, 1, 0)] {
        let short = seen(running * MS, at * MS, running * MS);
        let mut not_holding = m.clone();
        not_holding.cpu_offline(other);
        assert_eq!(
            fields(&mut not_holding, 2, short),
            vec![Field::Running],
            "CPU {other} going"
        );
        m.cpu_offline(holding);
        assert_eq!(fields(&mut m, 2, short), vec![], "CPU {holding} going");
        m.cpu_online(holding);
    }
}

#[test]
pub(super) fn a_cpu_clock_counts_its_own_running_time() {
    // A cpu-clock sibling of a device group: the device's counter counts on
    // through a move, the cpu-clock's stands still, and its running time
    // must follow its own counter, not the group's transit.
    const MS: u64 = 1_000_000;
    let mut m = cpu_clock_in_a_device_group();
    m.moved(0);
    m.burst(0, TOTAL, 1, 1 << 20);
    // Over 200 ms it counted 199 ms, or 150 ms with its running time
    // credited the 50 ms it stood still in transit.
    let two = [(299 * MS, vec![]), (250 * MS, vec![Field::Value])];
    for (value, want) in two {
        assert_eq!(
            fields(&mut m.clone(), 2, seen(value, 300 * MS, 300 * MS)),
            want
        );
    }
    // Not credited the transit: 150 ms running of the 200 ms enabled, as
    // it counted.
    assert_eq!(
        fields(&mut m, 2, seen(250 * MS, 300 * MS, 250 * MS)),
        vec![]
    );
    // Without a move since, it counts throughout.
    m.burst(0, TOTAL, 1, 1 << 20);
    assert_eq!(
        fields(&mut m.clone(), 2, seen(300 * MS, 400 * MS, 300 * MS)),
        vec![Field::Running]
    );
    assert_eq!(
        fields(&mut m, 2, seen(350 * MS, 400 * MS, 350 * MS)),
        vec![]
    );
    // A RESET parts the count's baseline from the times': not judged.
    m.ioctl(2, Ioctl::Reset, false);
    assert_eq!(fields(&mut m, 2, seen(5 * MS, 450 * MS, 400 * MS)), vec![]);
    // From the read after it, judged again.
    assert_eq!(
        fields(&mut m.clone(), 2, seen(5 * MS, 500 * MS, 450 * MS)),
        vec![Field::Value]
    );
    assert_eq!(fields(&mut m, 2, seen(55 * MS, 500 * MS, 450 * MS)), vec![]);
}
