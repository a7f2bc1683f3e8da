//! The counting model's rules by name (and the journal replay's, which
//! judges each step with the model), so that a test can take one away.
//!
//! Each place where the model reports a mismatch, or narrows or widens
//! what a read may show, asks [`holds`] with its rule's name. Outside
//! tests `holds` is a constant `true`: release builds carry no switch. In
//! tests one rule at a time can be removed on the current thread
//! ([`without`]), and the table at the end of this file runs, for each
//! rule, the unit tests that pin it: each must pass with the rule and fail
//! without it. `docs/counting-semantics.md` ("The model's rules and the
//! tests that pin them") lists the same table, and a test holds the two
//! equal.
//!
//! Why a name per rule rather than patch files like the driver's mutants:
//! a model weakened by a patch costs a rebuild each and goes stale as the
//! model changes; a guard is one call at the rule's own line, compiled
//! away outside tests, and the exhaustive `match` of the table makes a new
//! rule without a pinning test a compile error.

macro_rules! rules {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// A rule of the counting model (see the module's docs).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
        pub enum Rule {
            $($(#[doc = $doc])* $name,)*
        }

        #[cfg(test)]
        impl Rule {
            /// Every rule, in the order declared.
            pub const ALL: &'static [Rule] = &[$(Rule::$name,)*];
        }
    };
}

rules! {
    // The clocks of one event.
    /// `time_enabled` never goes back.
    EnabledNeverBack,
    /// `time_running` never goes back.
    RunningNeverBack,
    /// Disabled throughout the window: `time_enabled` unchanged.
    EnabledStillWhileDisabled,
    /// Time passed while enabled: `time_enabled` moved.
    EnabledMovesWhileEnabled,
    /// Not counting throughout: `time_running` unchanged.
    RunningStillWhileNotCounting,
    /// Counting whenever enabled: `Δrunning == Δenabled`.
    RunningAsEnabledWhileCounting,
    /// `Δrunning <= Δenabled`.
    RunningAtMostEnabled,
    /// Time passed while counting for sure: `time_running` moved.
    RunningMovesWhileCounting,
    // The count of an `mbm_*` event.
    /// A count never goes back without a RESET.
    CountNeverBack,
    /// A count a read while parked showed is never taken back.
    ShownNeverTakenBack,
    /// Read while parked: at most what landed since the last fold.
    ParkedAtMostLanded,
    /// A read racing an unseen move may lag: its window stays open.
    ReadRacingMoveMayLag,
    /// A gauge's read racing an unseen move: its last read's value or now.
    RacingGaugeShowsLastOrNow,
    /// Steady traffic that landed during an operation that started or
    /// stopped the count, RESET it or read it: any part of it may show.
    FlowDuringAnOperationMayShow,
    /// Steady traffic that landed during a step that passed through a
    /// moment of not counting for sure (perf stat's event contending for a
    /// slot inside its step): any part of it may show.
    FlowThroughAnUnsureMomentMayShow,
    /// The device counts whole units: a count fed steady traffic may lag
    /// the truth by less than one, either end of a window.
    CountInWholeUnits,
    /// At most what landed while it was (maybe) counting.
    CountAtMostLanded,
    /// At least what landed while it was counting for sure.
    CountAtLeastSure,
    /// Multiplexed, `Δrunning == 0`: nothing counted.
    ZeroRunningCountedNothing,
    /// Multiplexed, running whenever enabled: everything counted.
    FullRunningCountedAll,
    /// Times reset by a read while parked settle nothing before it.
    ParkedReadSettlesNothing,
    /// A park in which one counter gained a quarter of a wrap may leave
    /// out what landed after the perf core stopped its events, shown as
    /// `Δrunning < Δenabled`.
    HeavyParkMayCountShort,
    /// A park of a PMU without an interrupt line may leave out what landed
    /// after the perf core stopped its events at the driver's time limit,
    /// whatever landed, shown as `Δrunning < Δenabled`.
    PolledParkMayCountShort,
    /// A park's short count is shown by perf's times since the value's
    /// baseline, reads while parked between.
    ShortfallSinceTheValueBaseline,
    /// A read without times may show a park's count short: it claims no
    /// running.
    ShortfallUnshownWithoutTimes,
    /// A move off the domain's last CPU online parks the PMU, and the
    /// CPU's return places it again.
    LastCpuFlapParks,
    /// RESET zeroes the count (and a gauge's fold), not the times, parked
    /// or not.
    Reset,
    /// A closed event cannot be read.
    ClosedUnreadable,
    /// A cpu-clock counts its own running time: `Δvalue` at least
    /// `Δrunning` less `CLOCK_SLACK_NS` and a tenth.
    ClockCountsItsRunning,
    /// Taking turns, a cpu-clock may fall short by `CLOCK_TURN_SLACK_NS`
    /// more for each turn in: perf's rotation starts its running time
    /// before it schedules the others out, its counter after.
    ClockTurnsMissTheirSchedule,
    /// A software member of a device group stands still in a move's
    /// transit: across a move, park or placement its `Δrunning` may fall
    /// short of `Δenabled`.
    SoftwareStillInTransit,
    // Gauges.
    /// A counting gauge reads the occupancy.
    GaugeReadsOccupancy,
    /// Rounded down to the unit, saturated at the width.
    GaugeRounded,
    /// Parked, a gauge shows its last fold.
    ParkedGaugeKeepsLastFold,
    /// Taking turns, a gauge shows an occupancy it may have seen last.
    MultiplexedGaugeSawOne,
    // Which events count.
    /// An uncontended PMU's groups count for sure.
    UncontendedCounts,
    /// A group of gauges only is never multiplexed (patch 0009).
    GaugesOnlyAlwaysOn,
    /// Pinned groups that fit together count for sure.
    PinnedThatFitRun,
    /// An exclusive group shares its PMU with nobody: both maybe.
    ExclusiveSharesWithNobody,
    /// Events the model does not see may keep an exclusive group off.
    UnseenEventsMayKeepExclusiveOff,
    /// A group of software events only is always on.
    SoftwareAlwaysOn,
    /// A sibling whose leader is disabled is disabled (perf's effective
    /// state).
    EffectiveEnabled,
    /// `PERF_IOC_FLAG_GROUP` reaches the whole group, also from a sibling.
    GroupIoctl,
    /// A leader's close promotes each sibling to a leader of its own.
    LeaderClosePromotes,
    /// A software sibling promoted by its disabled leader's close waits
    /// for a schedule-in: maybe.
    PromotedSoftwareWaits,
    /// A leader's close reschedules a device PMU (patch 0010): a sibling
    /// it promotes counts from the close.
    CloseReschedulesDevicePmu,
    /// A group with a device member lives in that device PMU's context.
    MixedGroupOnItsDevicePmu,
    /// A device member opened into a software group takes the group off
    /// and installs its siblings before its leader (perf's `move_group`):
    /// a sibling's `time_running` may miss the time between.
    MovedSiblingsWaitForTheirLeader,
    /// perf's `move_group` puts each member of the software group back in
    /// its state at open: a DISABLE or ENABLE since is undone, and a
    /// detached member is in a context again.
    MovedGroupStartsAsOpened,
    // Parks.
    /// A DISABLE while parked freezes the slot: nothing after it counts.
    FrozenSlotStops,
    /// A frozen slot counts against the domain's slots until placed or
    /// thawed.
    FrozenSlotKeepsItsPlace,
    /// An event's own ENABLE thaws its frozen slot: counting for sure.
    OwnEnableThaws,
    /// Put on while parked: maybe counting until placed.
    PutOnWhileParkedIsMaybe,
    /// The placement ends what the park left in doubt.
    PlacementEndsDoubt,
    /// Slot events of a park short of slots: maybe until placed.
    ContendedParkIsMaybe,
    /// Contention while moving unseen: maybe until the moves end, as in a park.
    MovingContentionIsMaybe,
    /// Every event of a park in which an exclusive group clashed: maybe
    /// until placed.
    ClashedParkIsMaybe,
    /// A park short of slots leaves its gauges counting.
    SlotContentionSparesGauges,
    /// A placement not seen may be a park: the value window stays open.
    UnknownPlacementMaybeParked,
    /// A gauge whose placement is not seen may have been folded.
    UnknownGaugeMaybeFolded,
    // CPUs going offline.
    /// An offline CPU's software groups fall apart, each event `OFF`.
    OfflineDetaches,
    /// A detached event is never scheduled again.
    DetachedNeverScheduled,
    /// ENABLE and DISABLE miss a detached event while its CPU is offline.
    DetachedUnreachableWhileOffline,
    /// A detached event is in no context: a later offline leaves it be.
    DetachedStaysDetached,
    /// A detached event's `time_enabled` may stand still while enabled.
    DetachedClockMayStandStill,
    /// A software group's CPU offline: no opens into it.
    OfflineCpuRefusesGroupOpens,
    // Opens.
    /// `ENODEV` on a parked PMU.
    ParkedRefusesOpens,
    /// `EBADF` for a leader not open.
    GroupNeedsLeader,
    /// `EINVAL` for a sibling as leader.
    SiblingCannotLead,
    /// `EINVAL` for a pinned or exclusive sibling: only a leader may be.
    OnlyLeadersPinOrExclude,
    /// `EINVAL` for a device event opened into a group of software events
    /// on another CPU than its PMU's.
    DeviceJoinsSoftwareGroupOnItsCpu,
    /// `EINVAL` for a group on two device PMUs.
    GroupOnOnePmu,
    /// `EINVAL` for a group needing more slots than the domain has.
    GroupFitsSlots,
    // Across the events of one PMU.
    /// `Σ Δrunning <= slots × Δenabled` over its `mbm_*` events.
    SlotsBound,
    /// An exclusive group runs alone among flexible groups.
    ExclusiveRunsAlone,
    /// Pinned groups may run beside an exclusive one.
    PinnedBesideExclusive,
    /// A group's `mbm_*` members show the same `Δrunning`.
    MembersRunTogether,
    /// Not across a park or a placement (patch 0008 decides per event).
    MembersApartAcrossParks,
    /// Events enabled throughout a window grew `time_enabled` alike.
    EqualEnabledGrowth,
    /// Not pinned groups: one that does not fit stops in ERROR.
    PinnedClockMayStop,
    /// A pinned group left out may be in ERROR until its ENABLE, and a read
    /// of it may return nothing.
    PinnedLeftOutMayErr,
    /// A group whose pinned leader may be in ERROR may neither count nor
    /// run, nor its `time_enabled` grow, until the leader's own ENABLE,
    /// also once the clash is over (a sibling's own ENABLE is not it).
    ErrorStopsTheWholeGroup,
    /// Only events enabled with an enabled leader throughout the window.
    SteadyEventsOnly,
    /// [`super::READ_SKEW_NS`] per read.
    ReadSkew,
    /// What the moments' reads' system calls took.
    ReadsTook,
    /// How far apart the moments' reads returned on the guest's clock.
    ReadsSpread,
    /// A read again with nothing but time between begins a moment.
    TimeAloneIsAMoment,
    /// The time waited between two moments is in neither one's spread.
    WaitNotInTheSpread,
    // The journal's replay (`stress::lifecycle::replay`): what each step's
    // result must be, beside the counts.
    /// An open opens, under the handle expected, or is refused with the
    /// errno the model expects.
    OpenAsPredicted,
    /// An open on a PMU whose placement is not seen may be refused
    /// (`ENODEV`) or succeed.
    OpenMaybeRefusedWhileUnknown,
    /// An ioctl succeeds on an open event, `EBADF` on a closed one.
    IoctlAsPredicted,
    /// A read of a closed event is refused (`EBADF`).
    ClosedReadRefused,
    /// A close succeeds on an open event only.
    CloseAsPredicted,
    /// Every other step succeeds, every read of an open event too.
    StepsSucceed,
    /// An event's `PERF_FORMAT_ID` never changes.
    IdStable,
    /// No two open events read the same id.
    IdsUnique,
    /// The device's placement violations stay what the first count showed.
    ViolationsNeverChange,
    /// A PMU's `cpumask` is what the step asserts.
    CpumaskAsAsserted,
    /// An ioctl that changes no count gives the answer the step asserts
    /// (`EBADF` on a closed event).
    RequestAnsweredAsAsserted,
    /// A PMU's driver count (`lost_wraps`, `irqs_on_owner`,
    /// `irqs_off_owner`) grows as the step asserts.
    DriverCountsAsAsserted,
    /// A PMU parks or is placed only where its placement was in doubt.
    PlacementChangesOnlyInDoubt,
    /// A software group is bound to the CPU it was opened on.
    SoftwareGroupsBoundToTheirCpu,
}

/// Whether `rule` holds: always, outside tests.
#[cfg(not(test))]
#[inline(always)]
pub const fn holds(_rule: Rule) -> bool {
    true
}

/// Whether `rule` holds: unless [`without`] took it away on this thread.
#[cfg(test)]
pub fn holds(rule: Rule) -> bool {
    REMOVED.with(|r| r.get() != Some(rule))
}

#[cfg(test)]
thread_local! {
    static REMOVED: std::cell::Cell<Option<Rule>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with `rule` taken out of the model on this thread (put back
/// also when `f` panics).
#[cfg(test)]
pub fn without<T>(rule: Rule, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Rule>);
    impl Drop for Restore {
        fn drop(&mut self) {
            REMOVED.with(|r| r.set(self.0));
        }
    }
    let _restore = Restore(REMOVED.with(|r| r.replace(Some(rule))));
    f()
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::sync::Once;

    use super::{without, Rule};
    use crate::model::tests as model;
    use crate::stress::lifecycle::replay::tests as replay;

    /// A pinning test: where it is, its name and its body.
    struct Pin {
        module: &'static str,
        name: &'static str,
        test: fn(),
    }

    impl Pin {
        /// As the docs' table names it: bare for the model's own tests,
        /// `replay::` for the replay's.
        fn doc_name(&self) -> String {
            match self.module {
                "model" => self.name.to_string(),
                module => format!("{module}::{}", self.name),
            }
        }
    }

    /// The unit tests that pin each rule (`Rule => module::test, ...;`):
    /// each passes with it and fails without it. The macro makes a `match`
    /// of it, so that a rule without a test does not compile.
    macro_rules! pinned {
        ($($rule:ident => $($module:ident::$test:ident),+;)*) => {
            fn pinned_by(rule: Rule) -> Vec<Pin> {
                match rule {
                    $(Rule::$rule => vec![$(Pin {
                        module: stringify!($module),
                        name: stringify!($test),
                        test: $module::$test,
                    }),+],)*
                }
            }
        };
    }

    pinned! {
        EnabledNeverBack => model::neither_clock_ever_goes_back_also_read_while_parked;
        RunningNeverBack => model::neither_clock_ever_goes_back_also_read_while_parked;
        EnabledStillWhileDisabled => model::a_disabled_window_counts_nothing_and_stops_both_clocks;
        EnabledMovesWhileEnabled => model::an_enabled_event_read_again_after_an_operation_shows_its_clocks_moved;
        RunningStillWhileNotCounting => model::a_disabled_window_counts_nothing_and_stops_both_clocks;
        RunningAsEnabledWhileCounting => model::an_enabled_event_counts_every_burst_and_runs_all_the_time;
        RunningAtMostEnabled => model::an_exclusive_group_shares_its_pmu_with_nobody;
        RunningMovesWhileCounting => model::a_park_in_which_an_exclusive_group_clashed_leaves_every_event_maybe_until_placed;
        CountNeverBack => model::a_count_never_goes_back_without_a_reset;
        ShownNeverTakenBack => model::a_count_shown_while_parked_is_never_taken_back;
        ParkedAtMostLanded => model::a_read_while_parked_may_lag_but_the_next_read_after_it_must_not;
        ReadRacingMoveMayLag => model::a_read_racing_an_unseen_move_may_lag_and_the_first_after_the_moves_catches_up;
        RacingGaugeShowsLastOrNow => model::a_gauge_read_racing_an_unseen_move_shows_its_last_read_or_now;
        FlowDuringAnOperationMayShow => replay::steady_traffic_during_an_operation_counts_for_sure_only_where_it_counted_before_and_after;
        FlowThroughAnUnsureMomentMayShow => model::steady_traffic_through_a_contended_moment_inside_a_step_may_show_in_part;
        CountInWholeUnits => replay::a_count_fed_steady_traffic_lags_the_truth_by_less_than_a_unit;
        CountAtMostLanded => model::an_enabled_event_counts_every_burst_and_runs_all_the_time;
        CountAtLeastSure => model::a_disable_while_parked_freezes_the_count_exactly;
        ZeroRunningCountedNothing => model::more_counters_than_slots_multiplex_and_perfs_times_settle_the_value;
        FullRunningCountedAll => model::more_counters_than_slots_multiplex_and_perfs_times_settle_the_value;
        ParkedReadSettlesNothing => model::times_reset_by_a_parked_read_do_not_settle_the_multiplexing_before_it;
        HeavyParkMayCountShort => model::a_heavy_park_may_count_short_only_as_less_running,
            model::a_read_while_parked_after_heavy_traffic_may_show_running_stopped;
        PolledParkMayCountShort => model::a_park_without_a_line_may_show_running_stopped_after_light_traffic;
        ShortfallSinceTheValueBaseline => model::a_parks_shortfall_shows_over_the_values_window_across_reads_while_parked;
        ShortfallUnshownWithoutTimes => model::a_read_without_times_may_show_a_stopped_parks_count_short;
        LastCpuFlapParks => replay::a_move_off_the_last_cpu_online_is_a_park_and_a_placement;
        Reset => model::reset_zeroes_the_value_not_the_times,
            model::reset_while_parked_counts_only_what_landed_after_it,
            model::a_parked_gauge_reads_its_last_fold_and_zero_after_a_reset;
        ClosedUnreadable => model::a_closed_event_cannot_be_read;
        GaugeReadsOccupancy => model::gauges_take_no_slot_and_read_the_occupancy;
        GaugeRounded => model::gauges_take_no_slot_and_read_the_occupancy;
        ParkedGaugeKeepsLastFold => model::a_parked_gauge_reads_its_last_fold_and_zero_after_a_reset;
        MultiplexedGaugeSawOne => model::a_multiplexed_gauge_reads_an_occupancy_it_may_have_seen;
        UncontendedCounts => model::an_enabled_event_counts_every_burst_and_runs_all_the_time;
        GaugesOnlyAlwaysOn => model::a_park_short_of_slots_leaves_its_gauges_counting_for_sure;
        PinnedThatFitRun => model::pinned_groups_that_fit_always_run;
        ExclusiveSharesWithNobody => model::an_exclusive_group_shares_its_pmu_with_nobody;
        UnseenEventsMayKeepExclusiveOff => model::an_exclusive_group_may_give_way_to_events_the_model_does_not_see;
        SoftwareAlwaysOn => model::a_group_of_software_events_only_is_always_on;
        ClockCountsItsRunning => model::a_cpu_clock_counts_its_own_running_time;
        ClockTurnsMissTheirSchedule => model::a_cpu_clock_taking_turns_may_miss_each_rotations_sched_out;
        SoftwareStillInTransit => model::a_cpu_clock_counts_its_own_running_time;
        EffectiveEnabled => model::a_sibling_under_a_disabled_leader_has_its_clocks_stopped_until_the_leader_is_on;
        GroupIoctl => model::group_ioctl_on_a_sibling_reaches_the_whole_group;
        LeaderClosePromotes => model::a_sibling_under_a_disabled_leader_has_its_clocks_stopped_until_the_leader_is_on;
        PromotedSoftwareWaits => model::a_software_sibling_promoted_by_its_disabled_leaders_close_waits_for_a_schedule_in;
        CloseReschedulesDevicePmu => model::a_software_sibling_promoted_by_its_disabled_leaders_close_waits_for_a_schedule_in;
        MixedGroupOnItsDevicePmu => model::a_cpu_going_offline_takes_its_software_groups_apart_for_good,
            model::an_exclusive_event_and_a_moved_mixed_group_take_turns_across_a_wait;
        MovedSiblingsWaitForTheirLeader => model::a_device_member_moves_its_software_group_siblings_first;
        MovedGroupStartsAsOpened => model::a_device_member_restarts_its_software_group_as_opened;
        FrozenSlotStops => model::a_disable_while_parked_freezes_the_count_exactly,
            replay::predict_foresees_a_journals_reads_without_a_guest;
        FrozenSlotKeepsItsPlace => model::a_frozen_slot_keeps_its_place_so_one_more_enabled_in_the_park_contends;
        OwnEnableThaws => model::a_disable_while_parked_freezes_the_count_exactly;
        PutOnWhileParkedIsMaybe => model::an_event_put_on_while_parked_is_maybe_until_placed;
        PlacementEndsDoubt => model::an_event_put_on_while_parked_is_maybe_until_placed,
            model::an_event_enabled_while_parked_may_miss_what_lands_before_it_is_placed;
        ContendedParkIsMaybe => model::a_pmu_contended_during_a_park_counts_nothing_sure_until_it_is_placed;
        MovingContentionIsMaybe => model::contention_while_moving_unseen_leaves_slot_events_maybe_until_the_moves_end;
        ClashedParkIsMaybe => model::a_park_in_which_an_exclusive_group_clashed_leaves_every_event_maybe_until_placed;
        SlotContentionSparesGauges => model::a_park_short_of_slots_leaves_its_gauges_counting_for_sure;
        UnknownPlacementMaybeParked => replay::a_placement_changed_unseen_loosens_its_stretch_only,
            replay::an_allowed_set_not_waited_for_is_in_doubt_until_a_step_settles_it;
        UnknownGaugeMaybeFolded => replay::a_gauge_parked_then_maybe_placed_may_show_the_new_occupancy;
        OfflineDetaches => model::a_cpu_going_offline_takes_its_software_groups_apart_for_good,
            replay::a_software_group_on_a_cpu_a_move_takes_offline_falls_apart_for_good;
        DetachedNeverScheduled => model::a_cpu_going_offline_takes_its_software_groups_apart_for_good;
        DetachedUnreachableWhileOffline => model::a_cpu_going_offline_takes_its_software_groups_apart_for_good;
        DetachedStaysDetached => model::a_cpu_going_offline_takes_its_software_groups_apart_for_good;
        DetachedClockMayStandStill => model::a_detached_event_enabled_again_may_show_its_clock_still;
        OfflineCpuRefusesGroupOpens => model::a_cpu_going_offline_takes_its_software_groups_apart_for_good;
        ParkedRefusesOpens => model::opens_the_kernel_must_refuse,
            replay::refusals_and_handles_are_checked;
        GroupNeedsLeader => model::opens_the_kernel_must_refuse;
        SiblingCannotLead => model::opens_the_kernel_must_refuse;
        OnlyLeadersPinOrExclude => model::opens_the_kernel_must_refuse;
        DeviceJoinsSoftwareGroupOnItsCpu => model::a_device_event_joins_a_software_group_only_on_its_cpu;
        GroupOnOnePmu => model::opens_the_kernel_must_refuse;
        GroupFitsSlots => model::opens_the_kernel_must_refuse;
        SlotsBound => model::at_most_slots_counters_run_at_once;
        ExclusiveRunsAlone => model::an_exclusive_group_runs_alone_and_a_groups_members_together,
            model::an_exclusive_event_and_a_moved_mixed_group_take_turns_across_a_wait;
        PinnedBesideExclusive => model::an_exclusive_group_runs_alone_and_a_groups_members_together;
        MembersRunTogether => model::an_exclusive_group_runs_alone_and_a_groups_members_together;
        MembersApartAcrossParks => model::a_groups_members_may_run_apart_across_a_park;
        EqualEnabledGrowth => model::events_enabled_throughout_one_window_show_the_same_time_enabled;
        PinnedClockMayStop => model::a_pinned_group_left_out_may_stop_its_clock;
        PinnedLeftOutMayErr => model::a_pinned_group_left_out_may_be_in_error_until_enabled_again;
        ErrorStopsTheWholeGroup => model::a_pinned_group_in_error_stops_read_through_its_sibling_until_the_leaders_enable;
        SteadyEventsOnly => model::an_event_disabled_in_the_window_is_not_compared;
        ReadSkew => model::events_enabled_throughout_one_window_show_the_same_time_enabled;
        ReadsTook => model::reads_that_took_long_widen_the_rules_across_events_by_what_they_took;
        ReadsSpread => model::reads_spread_apart_on_the_guest_widen_the_rules_across_events_by_their_spread;
        TimeAloneIsAMoment => model::reads_again_after_nothing_but_time_are_a_moment_of_their_own;
        WaitNotInTheSpread => model::an_exclusive_event_and_a_moved_mixed_group_take_turns_across_a_wait;
        OpenAsPredicted => replay::refusals_and_handles_are_checked;
        OpenMaybeRefusedWhileUnknown => replay::an_open_on_a_maybe_parked_pmu_may_be_refused,
            replay::an_allowed_set_not_waited_for_is_in_doubt_until_a_step_settles_it;
        IoctlAsPredicted => replay::each_steps_result_is_checked;
        ClosedReadRefused => replay::each_steps_result_is_checked;
        CloseAsPredicted => replay::each_steps_result_is_checked;
        StepsSucceed => replay::each_steps_result_is_checked;
        IdStable => replay::each_steps_result_is_checked;
        IdsUnique => replay::each_steps_result_is_checked;
        ViolationsNeverChange => replay::a_cpumask_or_violations_assertion_that_the_run_does_not_meet_is_a_finding;
        CpumaskAsAsserted => replay::a_cpumask_or_violations_assertion_that_the_run_does_not_meet_is_a_finding;
        RequestAnsweredAsAsserted => replay::an_ioctl_that_changes_no_count_gives_the_answer_asserted_and_leaves_the_count;
        DriverCountsAsAsserted => replay::a_driver_count_assertion_that_the_run_does_not_meet_is_a_finding;
        PlacementChangesOnlyInDoubt => replay::a_placement_changed_unseen_loosens_its_stretch_only;
        SoftwareGroupsBoundToTheirCpu => replay::a_software_group_on_a_cpu_a_move_takes_offline_falls_apart_for_good;
    }

    thread_local! {
        static QUIET: Cell<bool> = const { Cell::new(false) };
    }

    /// Runs `test` with `rule` removed; whether it panicked, its panic's
    /// message left unprinted (the hook prints every other panic as
    /// before).
    fn fails_without(rule: Rule, test: fn()) -> bool {
        static HOOK: Once = Once::new();
        HOOK.call_once(|| {
            let loud = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                if !QUIET.with(Cell::get) {
                    loud(info)
                }
            }));
        });
        QUIET.with(|q| q.set(true));
        let failed = std::panic::catch_unwind(|| without(rule, test)).is_err();
        QUIET.with(|q| q.set(false));
        failed
    }

    #[test]
    fn every_rule_removed_fails_the_tests_that_pin_it() {
        let mut uncaught = Vec::new();
        for &rule in Rule::ALL {
            for pin in pinned_by(rule) {
                // Passes with the rule (a panic here names the test).
                (pin.test)();
                if !fails_without(rule, pin.test) {
                    uncaught.push(format!("{rule:?}: {}", pin.doc_name()));
                }
            }
        }
        assert!(
            uncaught.is_empty(),
            "passing without the rule they pin:\n{}",
            uncaught.join("\n")
        );
    }

    /// The table of docs/counting-semantics.md ("The model's rules and
    /// the tests that pin them") says what `pinned_by` says.
    #[test]
    fn the_docs_table_is_the_codes() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/counting-semantics.md");
        let docs = std::fs::read_to_string(path).expect("reading docs/counting-semantics.md");
        let section = docs
            .split("\n## ")
            .find(|s| s.starts_with("The model's rules and the tests that pin them"))
            .expect("the docs' section on the model's rules");
        let ticked = |cell: &str| -> Vec<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        let in_docs: Vec<(String, Vec<String>)> = section
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                let cells: Vec<&str> = l.trim_matches('|').split('|').collect();
                let rule = ticked(cells[0]).concat();
                (rule, ticked(cells.last().copied().unwrap_or_default()))
            })
            .collect();
        let in_code: Vec<(String, Vec<String>)> = Rule::ALL
            .iter()
            .map(|&r| {
                let pins = pinned_by(r).iter().map(Pin::doc_name).collect();
                (format!("{r:?}"), pins)
            })
            .collect();
        assert_eq!(in_docs, in_code);
    }
}
