//! The stress run's hotplug schedule, generated from a seed: a list of
//! steps (one step = one cycle), each a few CPU operations of one kind, or
//! a change of a domain's allowed set by the host and its restoration.
//!
//! The generator keeps the online set it expects, so every step is valid
//! where it stands (a CPU goes offline only if it is online, and so on),
//! CPU 0 never goes offline (on x86, where it cannot; on arm64 it goes like
//! any other, and one CPU always stays online), and the last step brings
//! every CPU back.

use std::collections::BTreeSet;

use crate::stress::rng::Rng;

/// What a step does to the device's domains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StepKind {
    /// The CPU a domain's PMU counts on goes offline and comes straight
    /// back: the PMU moves (resolved in the guest, which knows the owner).
    FlapOwner,
    /// Every CPU of a domain goes offline: its PMU parks.
    Park,
    /// A parked domain's CPUs come back, in a shuffled order.
    Unpark,
    /// One CPU goes offline and online (or the reverse) several times in a row.
    Toggle,
    /// Every CPU but one goes offline: CPU 0 stays (x86), or a CPU drawn
    /// at random (arm64); every domain without it parks.
    AllButOneOffline,
    /// Every offline CPU comes back, in another order than it left.
    ReturnShuffled,
    /// One CPU goes offline.
    OfflineOne,
    /// One CPU comes online.
    OnlineOne,
    /// The host shrinks a domain's allowed set to a random part of its CPUs
    /// (empty, or without the owner, sometimes), the PMU is placed again
    /// (moved, parked or left where it is), and the set is restored.
    AllowedChange,
    /// One CPU goes offline, or an offline one online, with a hotplug
    /// state armed to fail: the kernel rolls the operation back (or it
    /// completes without reaching the state and is undone), so the online
    /// set stays as it was. Only with `stress --fail-injection`.
    FailInjected,
}

/// The kinds a default schedule deals.
pub const ALL_KINDS: [StepKind; 9] = [
    StepKind::FlapOwner,
    StepKind::Park,
    StepKind::Unpark,
    StepKind::Toggle,
    StepKind::AllButOneOffline,
    StepKind::ReturnShuffled,
    StepKind::OfflineOne,
    StepKind::OnlineOne,
    StepKind::AllowedChange,
];

/// The kinds a schedule deals: [`ALL_KINDS`], and with `fail_injection`
/// [`StepKind::FailInjected`] too.
pub fn kinds(fail_injection: bool) -> Vec<StepKind> {
    let mut kinds = ALL_KINDS.to_vec();
    if fail_injection {
        kinds.push(StepKind::FailInjected);
    }
    kinds
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Set {
        cpu: u32,
        online: bool,
    },
    /// Offline the CPU domain `domain`'s PMU counts on, then online it.
    FlapOwner {
        domain: usize,
    },
    /// The host changes domain `domain`'s allowed set to `cpus`, and the
    /// stress waits for the PMU to be placed again: parked if `parks` (no
    /// CPU of `cpus` online), else on a CPU of `cpus`.
    SetAllowed {
        domain: usize,
        cpus: Vec<u32>,
        parks: bool,
    },
    /// Take `cpu` online or offline with a hotplug state armed to fail:
    /// the `pick`th (modulo their number) of the failable states the run
    /// found in the guest.
    FailAt {
        cpu: u32,
        online: bool,
        pick: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub kind: StepKind,
    pub ops: Vec<Op>,
}

/// The guest's CPUs and the device's domains (each domain's allowed CPUs).
#[derive(Debug, Clone)]
pub struct Topology {
    pub cpus: u32,
    pub domains: Vec<Vec<u32>>,
    /// CPU 0 can go offline (arm64): the schedule takes it offline like
    /// the others, parks the domains that hold it, and keeps one CPU
    /// online. Without it (x86) CPU 0 never goes, and a seed deals what it
    /// always did.
    pub cpu0_offline: bool,
}

/// What the generator believes is online, and the order CPUs went offline.
struct State<'a> {
    topo: &'a Topology,
    online: BTreeSet<u32>,
    offline_order: Vec<u32>,
}

impl State<'_> {
    /// The online CPUs that can go offline one at a time: every one but
    /// CPU 0 (x86); on arm64 every one while two are online or more.
    fn hotpluggable_online(&self) -> Vec<u32> {
        if self.topo.cpu0_offline {
            return match self.online.len() {
                0 | 1 => Vec::new(),
                _ => self.online.iter().copied().collect(),
            };
        }
        self.online.iter().copied().filter(|&c| c != 0).collect()
    }

    /// The CPUs that can be offline: from CPU 1 (x86), from CPU 0 (arm64).
    fn hotpluggable(&self) -> std::ops::Range<u32> {
        u32::from(!self.topo.cpu0_offline)..self.topo.cpus
    }

    fn offline(&self) -> Vec<u32> {
        self.hotpluggable()
            .filter(|c| !self.online.contains(c))
            .collect()
    }

    fn online_in(&self, domain: usize) -> Vec<u32> {
        self.topo.domains[domain]
            .iter()
            .copied()
            .filter(|c| self.online.contains(c))
            .collect()
    }

    fn set(&mut self, ops: &mut Vec<Op>, cpu: u32, online: bool) {
        if online {
            self.online.insert(cpu);
            self.offline_order.retain(|&c| c != cpu);
        } else {
            self.online.remove(&cpu);
            self.offline_order.push(cpu);
        }
        ops.push(Op::Set { cpu, online });
    }

    /// Domains whose PMU can be made to move: two CPUs online.
    fn flappable(&self) -> Vec<usize> {
        (0..self.topo.domains.len())
            .filter(|&d| self.online_in(d).len() >= 2)
            .collect()
    }

    /// Domains that can park and are not parked yet: on x86 those without
    /// CPU 0; on arm64 those with a CPU online outside them, which stays.
    fn parkable(&self) -> Vec<usize> {
        (0..self.topo.domains.len())
            .filter(|&d| {
                let cpus = &self.topo.domains[d];
                let can_park = if self.topo.cpu0_offline {
                    self.online.iter().any(|c| !cpus.contains(c))
                } else {
                    !cpus.contains(&0)
                };
                can_park && !self.online_in(d).is_empty()
            })
            .collect()
    }

    fn parked(&self) -> Vec<usize> {
        (0..self.topo.domains.len())
            .filter(|&d| self.online_in(d).is_empty())
            .collect()
    }

    /// The ops of one step of `kind`, or None where it cannot be done now.
    fn step(&mut self, kind: StepKind, rng: &mut Rng) -> Option<Vec<Op>> {
        let mut ops = Vec::new();
        match kind {
            StepKind::FlapOwner => {
                let domain = *rng.pick(&self.flappable())?;
                // Sometimes twice: the PMU's new CPU goes too.
                for _ in 0..rng.range(1, 2) {
                    ops.push(Op::FlapOwner { domain });
                }
            }
            StepKind::Park => {
                let domain = *rng.pick(&self.parkable())?;
                let mut cpus = self.online_in(domain);
                rng.shuffle(&mut cpus);
                for cpu in cpus {
                    self.set(&mut ops, cpu, false);
                }
            }
            StepKind::Unpark => {
                let domain = *rng.pick(&self.parked())?;
                let mut cpus = self.topo.domains[domain].clone();
                self.shuffle_returning(&mut cpus, rng);
                for cpu in cpus {
                    self.set(&mut ops, cpu, true);
                }
            }
            StepKind::Toggle => {
                // Not the last CPU online (arm64): it cannot go.
                let cpus: Vec<u32> = self
                    .hotpluggable()
                    .filter(|c| self.online.len() >= 2 || !self.online.contains(c))
                    .collect();
                let cpu = *rng.pick(&cpus)?;
                let was = self.online.contains(&cpu);
                for _ in 0..rng.range(2, 6) {
                    self.set(&mut ops, cpu, !was);
                    self.set(&mut ops, cpu, was);
                }
            }
            StepKind::AllButOneOffline => {
                let mut cpus = self.hotpluggable_online();
                if self.topo.cpu0_offline && !cpus.is_empty() {
                    let stays = rng.below(cpus.len() as u64) as usize;
                    cpus.remove(stays);
                }
                if cpus.len() < 2 {
                    return None;
                }
                rng.shuffle(&mut cpus);
                for cpu in cpus {
                    self.set(&mut ops, cpu, false);
                }
            }
            StepKind::ReturnShuffled => {
                let mut cpus = self.offline();
                if cpus.len() < 2 {
                    return None;
                }
                self.shuffle_returning(&mut cpus, rng);
                for cpu in cpus {
                    self.set(&mut ops, cpu, true);
                }
            }
            StepKind::OfflineOne => {
                let cpu = *rng.pick(&self.hotpluggable_online())?;
                self.set(&mut ops, cpu, false);
            }
            StepKind::OnlineOne => {
                let cpu = *rng.pick(&self.offline())?;
                self.set(&mut ops, cpu, true);
            }
            StepKind::FailInjected => {
                let (online, offline) = (self.hotpluggable_online(), self.offline());
                let bring_online = match (online.is_empty(), offline.is_empty()) {
                    (true, true) => return None,
                    (false, false) => rng.chance(50),
                    (going, _) => going,
                };
                let cpu = *rng.pick(if bring_online { &offline } else { &online })?;
                ops.push(Op::FailAt {
                    cpu,
                    online: bring_online,
                    pick: rng.range(0, 1 << 16) as u32,
                });
            }
            StepKind::AllowedChange => {
                let domains: Vec<usize> = (0..self.topo.domains.len()).collect();
                let domain = *rng.pick(&domains)?;
                let original = self.topo.domains[domain].clone();
                // Each CPU kept at even odds: the owner often goes, and now
                // and then every CPU.
                let part: Vec<u32> = original
                    .iter()
                    .copied()
                    .filter(|_| rng.chance(50))
                    .collect();
                for cpus in [part, original] {
                    let parks = !cpus.iter().any(|c| self.online.contains(c));
                    ops.push(Op::SetAllowed {
                        domain,
                        cpus,
                        parks,
                    });
                }
            }
        }
        Some(ops)
    }

    /// Shuffles CPUs about to come back so that they do not return in the
    /// reverse of the order they left (the order a stack would give).
    fn shuffle_returning(&self, cpus: &mut Vec<u32>, rng: &mut Rng) {
        cpus.retain(|c| !self.online.contains(c));
        rng.shuffle(cpus);
        let stack_order: Vec<u32> = self
            .offline_order
            .iter()
            .rev()
            .copied()
            .filter(|c| cpus.contains(c))
            .collect();
        if cpus.len() >= 2 && *cpus == stack_order {
            cpus.rotate_left(1);
        }
    }
}

/// Why no schedule can be made for a topology.
#[derive(Debug, PartialEq, Eq)]
pub struct NoSchedule(pub String);

/// `cycles` steps from `seed`, then, if any CPU is still offline, one
/// more step that brings them all back.
pub fn generate(
    topo: &Topology,
    seed: u64,
    cycles: u32,
    kinds: &[StepKind],
) -> Result<Vec<Step>, NoSchedule> {
    if topo.cpus < 2 {
        return Err(NoSchedule(
            "the stress needs a CPU besides CPU 0 to take offline".into(),
        ));
    }
    if let Some(cpu) = topo.domains.iter().flatten().find(|&&c| c >= topo.cpus) {
        return Err(NoSchedule(format!(
            "a domain allows CPU {cpu}, but the guest has {} CPUs",
            topo.cpus
        )));
    }
    let mut rng = Rng::new(seed);
    let mut state = State {
        topo,
        online: (0..topo.cpus).collect(),
        offline_order: Vec::new(),
    };
    let mut steps = Vec::with_capacity(cycles as usize + 1);
    // A deck of every kind, dealt in a shuffled order: each kind comes round
    // once per deck (if it can be done where it falls), so even a short run
    // covers them all.
    let mut deck: Vec<StepKind> = Vec::new();
    while steps.len() < cycles as usize {
        if deck.is_empty() {
            deck = kinds.to_vec();
            rng.shuffle(&mut deck);
        }
        let kind = deck.pop().expect("refilled above");
        if let Some(ops) = state.step(kind, &mut rng) {
            steps.push(Step { kind, ops });
        }
    }
    let mut ops = Vec::new();
    let mut back = state.offline();
    state.shuffle_returning(&mut back, &mut rng);
    for cpu in back {
        state.set(&mut ops, cpu, true);
    }
    if !ops.is_empty() {
        steps.push(Step {
            kind: StepKind::ReturnShuffled,
            ops,
        });
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn four() -> Topology {
        Topology {
            cpus: 4,
            domains: vec![vec![0, 1], vec![2, 3]],
            cpu0_offline: false,
        }
    }

    fn sixteen() -> Topology {
        Topology {
            cpus: 16,
            domains: (0..4).map(|d| (4 * d..4 * d + 4).collect()).collect(),
            cpu0_offline: false,
        }
    }

    /// `topo` as on arm64, where CPU 0 goes offline too.
    fn arm64(topo: Topology) -> Topology {
        Topology {
            cpu0_offline: true,
            ..topo
        }
    }

    /// A digest of the ops of a schedule, as text.
    fn ops_hash(steps: &[Step]) -> String {
        let ops: Vec<&Vec<Op>> = steps.iter().map(|s| &s.ops).collect();
        crate::build::cache::Key::new("schedule")
            .add("ops", format!("{ops:?}").as_bytes())
            .hex()
    }

    /// The x86 schedules of a few seeds, as main dealt them before arm64
    /// could take CPU 0 offline: a seed's replay must stay the same run.
    #[test]
    fn x86_seeds_deal_the_schedules_they_always_dealt() {
        let first: Vec<Vec<Op>> = generate(&four(), 7, 4, &ALL_KINDS)
            .unwrap()
            .into_iter()
            .map(|s| s.ops)
            .collect();
        assert_eq!(format!("{first:?}"), PINNED_FIRST_OPS);
        let hashes: Vec<String> = [(four(), 7), (four(), 99), (sixteen(), 3)]
            .into_iter()
            .flat_map(|(topo, seed)| {
                [false, true]
                    .map(|fail| ops_hash(&generate(&topo, seed, 300, &kinds(fail)).unwrap()))
            })
            .collect();
        assert_eq!(hashes, PINNED_HASHES);
    }

    const PINNED_FIRST_OPS: &str = "[[Set { cpu: 3, online: false }, Set { cpu: 3, online: true }, \
        Set { cpu: 3, online: false }, Set { cpu: 3, online: true }], [Set { cpu: 3, online: false }, \
        Set { cpu: 1, online: false }, Set { cpu: 2, online: false }], [SetAllowed { domain: 0, \
        cpus: [0], parks: false }, SetAllowed { domain: 0, cpus: [0, 1], parks: false }], \
        [Set { cpu: 1, online: true }], [Set { cpu: 3, online: true }, Set { cpu: 2, online: true }]]";
    const PINNED_HASHES: [&str; 6] = [
        "21b144b2da046a4b",
        "ef641670bcdfa429",
        "cf6000e6685f274f",
        "3d8c4d3f6691a3c6",
        "933a26a7f6343a87",
        "f8b6a81ae33f8c32",
    ];

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        for topo in [four(), sixteen()] {
            assert_eq!(
                generate(&topo, 99, 300, &ALL_KINDS).unwrap(),
                generate(&topo, 99, 300, &ALL_KINDS).unwrap()
            );
            assert_ne!(
                generate(&topo, 99, 300, &ALL_KINDS).unwrap(),
                generate(&topo, 100, 300, &ALL_KINDS).unwrap()
            );
        }
    }

    #[test]
    fn every_kind_of_step_comes_up_in_a_short_run() {
        for topo in [four(), sixteen()] {
            for (seed, fail_injection) in (0..50).zip([false, true].into_iter().cycle()) {
                let dealt = kinds(fail_injection);
                let steps = generate(&topo, seed, 60, &dealt).unwrap();
                let seen: BTreeSet<StepKind> = steps.iter().map(|s| s.kind).collect();
                assert_eq!(
                    seen,
                    dealt.into_iter().collect(),
                    "seed {seed}, {} CPUs",
                    topo.cpus
                );
            }
        }
    }

    /// Replays a schedule on an online set: every op must be valid where it
    /// stands, CPU 0 never goes (x86), a CPU always stays online, and
    /// everything is back at the end.
    fn replay(topo: &Topology, steps: &[Step]) -> Result<(), String> {
        let mut online: BTreeSet<u32> = (0..topo.cpus).collect();
        for (i, step) in steps.iter().enumerate() {
            if step.ops.is_empty() {
                return Err(format!("step {i} has no op"));
            }
            let before = online.clone();
            for op in &step.ops {
                match *op {
                    Op::Set {
                        cpu: 0,
                        online: false,
                    } if !topo.cpu0_offline => return Err(format!("step {i} offlines CPU 0")),
                    Op::Set { online: false, .. } if online.len() == 1 => {
                        return Err(format!("step {i} takes the last CPU offline"))
                    }
                    Op::Set { cpu, online: true } if !online.insert(cpu) => {
                        return Err(format!("step {i}: CPU {cpu} was online"))
                    }
                    Op::Set { cpu, online: false } if !online.remove(&cpu) => {
                        return Err(format!("step {i}: CPU {cpu} was offline"))
                    }
                    Op::Set { .. } => {}
                    Op::FlapOwner { domain } => {
                        let up = topo.domains[domain]
                            .iter()
                            .filter(|c| online.contains(c))
                            .count();
                        if up < 2 {
                            return Err(format!(
                                "step {i} flaps domain {domain} with {up} CPU online"
                            ));
                        }
                    }
                    Op::FailAt { cpu: 0, .. } if !topo.cpu0_offline => {
                        return Err(format!("step {i} fails a hotplug of CPU 0"))
                    }
                    Op::FailAt {
                        cpu, online: up, ..
                    } if online.contains(&cpu) == up => {
                        return Err(format!(
                            "step {i} fails CPU {cpu} {} where it already is",
                            if up { "online" } else { "offline" }
                        ))
                    }
                    Op::FailAt { .. } => {}
                    Op::SetAllowed {
                        domain,
                        ref cpus,
                        parks,
                    } => {
                        if cpus.iter().any(|c| !topo.domains[domain].contains(c)) {
                            return Err(format!(
                                "step {i} allows {cpus:?}, outside domain {domain}"
                            ));
                        }
                        if parks == cpus.iter().any(|c| online.contains(c)) {
                            return Err(format!(
                                "step {i} expects parks={parks} for {cpus:?} with {online:?} online"
                            ));
                        }
                    }
                }
            }
            let expect_same = matches!(
                step.kind,
                StepKind::FlapOwner
                    | StepKind::Toggle
                    | StepKind::AllowedChange
                    | StepKind::FailInjected
            );
            if step.kind == StepKind::AllowedChange {
                match step.ops.last() {
                    Some(Op::SetAllowed { domain, cpus, .. }) if *cpus == topo.domains[*domain] => {
                    }
                    last => {
                        return Err(format!(
                            "step {i} leaves a domain's allowed set changed: {last:?}"
                        ))
                    }
                }
            }
            if expect_same != (online == before) {
                return Err(format!(
                    "step {i} ({:?}) changed the online set {before:?} → {online:?}",
                    step.kind
                ));
            }
            if step.kind == StepKind::Park
                && step
                    .ops
                    .iter()
                    .any(|op| matches!(op, Op::Set { online: true, .. }))
            {
                return Err(format!("step {i} parks by bringing a CPU online"));
            }
        }
        if online.len() != topo.cpus as usize {
            return Err(format!("the schedule ends with only {online:?} online"));
        }
        Ok(())
    }

    #[test]
    fn schedules_are_consistent_and_never_offline_cpu0() {
        let odd = Topology {
            cpus: 5,
            domains: vec![vec![0], vec![1, 2, 3], vec![3, 4]],
            cpu0_offline: false,
        };
        for topo in [four(), sixteen(), odd] {
            for seed in 0..200 {
                let steps = generate(&topo, seed, 80, &kinds(seed % 2 == 1)).unwrap();
                replay(&topo, &steps)
                    .unwrap_or_else(|e| panic!("seed {seed}, {} CPUs: {e}", topo.cpus));
            }
        }
    }

    #[test]
    fn the_replay_check_catches_bad_schedules() {
        let topo = four();
        let bad = [
            vec![Step {
                kind: StepKind::OfflineOne,
                ops: vec![Op::Set {
                    cpu: 0,
                    online: false,
                }],
            }],
            vec![Step {
                kind: StepKind::OnlineOne,
                ops: vec![Op::Set {
                    cpu: 2,
                    online: true,
                }],
            }],
            vec![Step {
                kind: StepKind::OfflineOne,
                ops: vec![Op::Set {
                    cpu: 2,
                    online: false,
                }],
            }],
            vec![
                Step {
                    kind: StepKind::OfflineOne,
                    ops: vec![Op::Set {
                        cpu: 3,
                        online: false,
                    }],
                },
                Step {
                    kind: StepKind::FlapOwner,
                    ops: vec![Op::FlapOwner { domain: 1 }],
                },
                Step {
                    kind: StepKind::OnlineOne,
                    ops: vec![Op::Set {
                        cpu: 3,
                        online: true,
                    }],
                },
            ],
            vec![Step {
                kind: StepKind::AllowedChange,
                ops: vec![Op::SetAllowed {
                    domain: 1,
                    cpus: vec![3],
                    parks: false,
                }],
            }],
            vec![Step {
                kind: StepKind::AllowedChange,
                ops: vec![Op::SetAllowed {
                    domain: 1,
                    cpus: vec![2, 3],
                    parks: true,
                }],
            }],
        ];
        for steps in bad {
            assert!(replay(&topo, &steps).is_err(), "{steps:?}");
        }
    }

    #[test]
    fn returns_come_back_in_another_order_than_they_left() {
        let topo = sixteen();
        let mut differed = 0;
        for seed in 0..100 {
            let steps = generate(&topo, seed, 100, &ALL_KINDS).unwrap();
            // The CPUs offline, in the order they left.
            let mut order: Vec<u32> = Vec::new();
            for step in &steps {
                let back: Vec<u32> = step
                    .ops
                    .iter()
                    .filter_map(|op| match *op {
                        Op::Set { cpu, online: true } => Some(cpu),
                        _ => None,
                    })
                    .collect();
                if step.kind == StepKind::ReturnShuffled && back.len() >= 2 {
                    let stack: Vec<u32> = order
                        .iter()
                        .rev()
                        .copied()
                        .filter(|c| back.contains(c))
                        .collect();
                    assert_ne!(back, stack, "seed {seed}: CPUs returned in stack order");
                    differed += 1;
                }
                for op in &step.ops {
                    match *op {
                        Op::Set { cpu, online: false } => order.push(cpu),
                        Op::Set { cpu, online: true } => order.retain(|&c| c != cpu),
                        Op::FlapOwner { .. } | Op::SetAllowed { .. } | Op::FailAt { .. } => {}
                    }
                }
            }
        }
        assert!(differed > 100, "only {differed} shuffled returns seen");
    }

    #[test]
    fn a_guest_without_a_second_cpu_gets_no_schedule() {
        let topo = Topology {
            cpus: 1,
            domains: vec![vec![0]],
            cpu0_offline: false,
        };
        assert!(generate(&topo, 1, 10, &ALL_KINDS).is_err());
    }

    #[test]
    fn arm64_schedules_take_cpu0_offline_and_keep_a_cpu_online() {
        let two = Topology {
            cpus: 2,
            domains: vec![vec![0], vec![1]],
            cpu0_offline: true,
        };
        for topo in [arm64(four()), arm64(sixteen()), two] {
            let mut cpu0_offline = 0;
            let mut domains_with_cpu0_parked = 0;
            for seed in 0..200 {
                let steps = generate(&topo, seed, 80, &ALL_KINDS).unwrap();
                replay(&topo, &steps)
                    .unwrap_or_else(|e| panic!("seed {seed}, {} CPUs: {e}", topo.cpus));
                let ops = steps.iter().flat_map(|s| &s.ops);
                cpu0_offline += ops
                    .filter(|op| {
                        matches!(
                            op,
                            Op::Set {
                                cpu: 0,
                                online: false
                            }
                        )
                    })
                    .count();
                domains_with_cpu0_parked += steps
                    .iter()
                    .filter(|s| {
                        s.kind == StepKind::Park
                            && s.ops.iter().any(|op| matches!(op, Op::Set { cpu: 0, .. }))
                    })
                    .count();
            }
            assert!(
                cpu0_offline > 200,
                "{} CPUs: CPU 0 offline {cpu0_offline} times",
                topo.cpus
            );
            assert!(
                domains_with_cpu0_parked > 20,
                "{} CPUs: {domains_with_cpu0_parked} parks of CPU 0's domain",
                topo.cpus
            );
        }
    }

    #[test]
    fn the_replay_check_refuses_the_last_cpu_offline_on_arm64() {
        let topo = arm64(four());
        let steps = [Step {
            kind: StepKind::AllButOneOffline,
            ops: (0..4).map(|cpu| Op::Set { cpu, online: false }).collect(),
        }];
        assert!(replay(&topo, &steps).unwrap_err().contains("last CPU"));
    }
}
