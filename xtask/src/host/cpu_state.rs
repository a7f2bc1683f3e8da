//! What two snapshots of a hung VM's vCPUs (QEMU's monitor: `info
//! registers -a`, `info lapic N`, see `monitor.rs`) say: whether a vCPU
//! sat with interrupts enabled and a deliverable interrupt pending in its
//! local APIC in both, which no running x86 CPU does for long; and whether
//! its local APIC timer had expired with its interrupt still pending.
//!
//! In the box that is L1's one vCPU not taking its own timer interrupt. In
//! the hang of 2026-12-02 the first snapshot caught L1's CPU running the
//! nested guest (RIP in the guest kernel's `io_serial_out`, the guest's
//! RFLAGS.IF clear) with L1's timer expired and vector 236 pending: under
//! SVM with `V_INTR_MASKING` (which KVM sets) the nested guest's IF does not
//! hold off the host's interrupts, they cause a #VMEXIT; QEMU's TCG did not
//! take it, and L1 reported its CPU stuck for 109 s in that vCPU's thread.
//! The harness names such a state, rather than leaving a bare timeout that
//! reads like perfbed's hang.
//!
//! perfbed-vmm writes its vCPUs' state in the same format
//! (`perfbed_vmm::vcpu::snapshot`, with an `EVENTS=` line of what KVM holds
//! to deliver), so this one reader decodes both hosts' captures
//! ([`describe`]).

/// One vCPU as a snapshot shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VcpuState {
    pub cpu: usize,
    pub rip: Option<u64>,
    /// RFLAGS.IF.
    pub interrupts_enabled: bool,
    pub halted: bool,
    /// Vectors pending in the local APIC's IRR.
    pub irr: Vec<u8>,
    /// Processor priority (PPR).
    pub ppr: Option<u8>,
    /// The local APIC timer's vector (LVTT), if unmasked.
    pub timer_vector: Option<u8>,
    /// The timer's current count (0: expired, for a one-shot).
    pub timer_count: Option<u64>,
    /// The count it was last armed with (a timer armed again between two
    /// snapshots shows another one, most likely).
    pub timer_initial: Option<u64>,
    /// What decides whether QEMU's TCG takes a pending interrupt, from the
    /// `INTREQ=` line perfbed's QEMU adds to `info registers` (patch 0003).
    pub tcg: Option<TcgInterruptState>,
    /// Vectors in service (ISR).
    pub isr: Vec<u8>,
    /// CR3 (whose page tables the vCPU ran on).
    pub cr3: Option<u64>,
    /// The events KVM holds for the next entry (perfbed-vmm's `EVENTS=`
    /// line), those that are set, as `NAME=value`.
    pub pending: Vec<String>,
}

/// The vCPU loop's view of interrupts in perfbed's QEMU (TCG): the request
/// bits it polls, GIF, and in an SVM guest the host's IF at VMRUN.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TcgInterruptState {
    /// `CPUState::interrupt_request`.
    pub request: u32,
    /// In an SVM guest (`HF_GUEST_MASK`).
    pub in_guest: bool,
    pub gif: bool,
    /// The host's RFLAGS.IF at VMRUN, which gates external interrupts in
    /// the guest under V_INTR_MASKING.
    pub hif: bool,
    pub vintr: bool,
}

/// `CPU_INTERRUPT_HARD` and `CPU_INTERRUPT_POLL` (QEMU 7.2).
const INTERRUPT_HARD: u32 = 0x2;
const INTERRUPT_POLL: u32 = 0x10;

impl TcgInterruptState {
    /// Parses the `INTREQ=... GUEST=. GIF=. HIF=. VINTR=. ...` line.
    fn parse(line: &str) -> Option<TcgInterruptState> {
        let flag = |key: &str| field(line, key).map(|v| v == "1");
        Some(TcgInterruptState {
            request: u32::from_str_radix(field(line, "INTREQ=")?, 16).ok()?,
            in_guest: flag("GUEST=")?,
            gif: flag("GIF=")?,
            hif: flag("HIF=")?,
            vintr: flag("VINTR=")?,
        })
    }

    /// Why a pending external interrupt is not being taken, as far as these
    /// bits tell.
    pub fn why_not_taken(&self) -> String {
        let requested = self.request & (INTERRUPT_HARD | INTERRUPT_POLL) != 0;
        let bits = format!(
            "interrupt_request {:#x}, GIF {}, {}",
            self.request,
            u8::from(self.gif),
            if self.in_guest {
                format!(
                    "in an SVM guest, V_INTR_MASKING {} HIF {}",
                    u8::from(self.vintr),
                    u8::from(self.hif)
                )
            } else {
                "not in an SVM guest".into()
            }
        );
        let verdict = if !requested {
            "no HARD or POLL request is raised: the vCPU loop was never told (a lost request)"
        } else if !self.gif {
            "requested, but GIF is clear"
        } else if self.in_guest && self.vintr && !self.hif {
            "requested, but the host's IF at VMRUN (HIF) was clear"
        } else {
            "requested and deliverable by these bits: the vCPU loop is not looking"
        };
        format!("QEMU: {bits}: {verdict}")
    }
}

impl VcpuState {
    /// The highest pending vector above the processor priority's class:
    /// one the CPU takes as soon as interrupts are enabled.
    pub fn deliverable(&self) -> Option<u8> {
        let top = *self.irr.iter().max()?;
        (top >> 4 > self.ppr.unwrap_or(0) >> 4).then_some(top)
    }
}

/// The vCPUs of one snapshot's text.
pub fn parse(text: &str) -> Vec<VcpuState> {
    let mut cpus: Vec<VcpuState> = Vec::new();
    let mut lapic_of: Option<usize> = None;
    for line in text.lines() {
        if let Some(n) = line
            .strip_prefix("CPU#")
            .and_then(|n| n.trim().parse().ok())
        {
            cpus.push(VcpuState {
                cpu: n,
                ..VcpuState::default()
            });
            lapic_of = None;
            continue;
        }
        if let Some(n) = line
            .strip_prefix("### info lapic ")
            .and_then(|n| n.trim().parse::<usize>().ok())
        {
            lapic_of = cpus.iter().position(|c| c.cpu == n);
            continue;
        }
        match lapic_of {
            None => {
                let Some(cpu) = cpus.last_mut() else { continue };
                if let Some(rip) = field(line, "RIP=") {
                    cpu.rip = u64::from_str_radix(rip, 16).ok();
                }
                if let Some(flags) =
                    field(line, "RFL=").and_then(|f| u64::from_str_radix(f, 16).ok())
                {
                    cpu.interrupts_enabled = flags & (1 << 9) != 0;
                }
                if let Some(hlt) = field(line, "HLT=") {
                    cpu.halted = hlt == "1";
                }
                if line.starts_with("INTREQ=") {
                    cpu.tcg = TcgInterruptState::parse(line);
                }
                if let Some(cr3) = field(line, "CR3=") {
                    cpu.cr3 = u64::from_str_radix(cr3, 16).ok();
                }
                if let Some(events) = line.strip_prefix("EVENTS=") {
                    cpu.pending = pending_events(events);
                }
            }
            Some(i) => {
                let cpu = &mut cpus[i];
                if let Some(rest) = line.strip_prefix("IRR") {
                    cpu.irr = rest
                        .split_whitespace()
                        .filter_map(|v| v.parse().ok())
                        .collect();
                } else if let Some(rest) = line.strip_prefix("ISR") {
                    cpu.isr = rest
                        .split_whitespace()
                        .filter_map(|v| v.parse().ok())
                        .collect();
                } else if line.split_whitespace().next() == Some("LVTT") && !line.contains("masked")
                {
                    cpu.timer_vector = line
                        .split("(vec ")
                        .nth(1)
                        .and_then(|v| v.trim_end_matches(')').parse().ok());
                } else if let Some(count) = field(line, "current_count = ") {
                    cpu.timer_count = count.parse().ok();
                    cpu.timer_initial =
                        field(line, "initial_count = ").and_then(|c| c.parse().ok());
                } else if let Some(ppr) = field(line, "PPR ") {
                    cpu.ppr = u8::from_str_radix(ppr.trim_start_matches("0x"), 16).ok();
                }
            }
        }
    }
    cpus
}

/// The set fields of an `EVENTS=` line that mean something is pending or
/// being injected (the MP state and the vectors' numbers only say which).
fn pending_events(events: &str) -> Vec<String> {
    const FLAGS: &[&str] = &[
        "EXC_INJ", "EXC_PEND", "INT_INJ", "NMI_INJ", "NMI_PEND", "SMI_PEND", "SHADOW",
    ];
    let value = |key: &str| field(events, &format!("{key}=")).map(str::to_string);
    let mut out = Vec::new();
    for flag in FLAGS {
        if value(flag).is_some_and(|v| v != "0") {
            let detail = match *flag {
                "EXC_INJ" | "EXC_PEND" => format!(
                    " (vector {}, error {})",
                    value("EXC_NR").unwrap_or_default(),
                    value("EXC_ERR").unwrap_or_default()
                ),
                "INT_INJ" => format!(" (vector {})", value("INT_NR").unwrap_or_default()),
                _ => String::new(),
            };
            out.push(format!("{flag}{detail}"));
        }
    }
    out
}

/// One line per vCPU of a capture, decoded: where it was, whether it could
/// take interrupts, its local APIC's pending and in-service vectors and
/// timer, and (perfbed-vmm) the events KVM held for it.
pub fn describe(cpus: &[VcpuState]) -> Vec<String> {
    let list = |v: &[u8]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            format!("{v:?}")
        }
    };
    cpus.iter()
        .map(|c| {
            let mut line = format!(
                "vCPU {}: RIP {}, interrupts {}, {}; IRR {}, ISR {}, PPR {:#04x}",
                c.cpu,
                c.rip.map_or("?".into(), |r| format!("{r:#x}")),
                if c.interrupts_enabled {
                    "enabled"
                } else {
                    "disabled"
                },
                if c.halted { "halted" } else { "running" },
                list(&c.irr),
                list(&c.isr),
                c.ppr.unwrap_or(0)
            );
            match (c.timer_vector, c.timer_count) {
                (Some(v), Some(n)) => line += &format!(", timer vector {v} count {n}"),
                _ => line += ", timer masked",
            }
            if let Some(v) = c.deliverable() {
                line += &format!(", vector {v} deliverable");
            }
            if !c.pending.is_empty() {
                line += &format!(", KVM holds {}", c.pending.join(" "));
            }
            line
        })
        .collect()
}

/// The word after `key` on `line`.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(key)? + key.len();
    line[at..].split_whitespace().next()
}

/// A sentence for each vCPU that had interrupts enabled, was not halted,
/// and held the same deliverable interrupt pending in both snapshots.
pub fn stuck_interrupts(first: &[VcpuState], second: &[VcpuState], gap: &str) -> Vec<String> {
    first
        .iter()
        .filter_map(|a| {
            let b = second.iter().find(|b| b.cpu == a.cpu)?;
            let vector = a.deliverable().filter(|&v| Some(v) == b.deliverable())?;
            if !(a.interrupts_enabled && b.interrupts_enabled) || a.halted || b.halted {
                return None;
            }
            let what = if a.timer_vector == Some(vector) { "its local APIC timer's" } else { "a" };
            let rip = |s: &VcpuState| s.rip.map_or("?".into(), |r| format!("{r:#x}"));
            Some(format!(
                "vCPU {}: interrupts enabled and {what} vector {vector} pending above its priority (PPR {:#04x}) in two snapshots {gap} apart (RIP {} then {}): it is not taking a deliverable interrupt",
                a.cpu,
                a.ppr.unwrap_or(0),
                rip(a),
                rip(b)
            ))
        })
        .collect()
}

/// A sentence for each snapshot in which a vCPU's local APIC timer had
/// expired (count 0) with its vector pending and deliverable: the interrupt
/// has waited since the timer fired.
pub fn expired_timer_pending(snapshots: &[(&str, &[VcpuState])]) -> Vec<String> {
    let mut out = Vec::new();
    for (when, cpus) in snapshots {
        for c in cpus.iter() {
            if c.timer_count == Some(0)
                && c.timer_vector.is_some()
                && c.deliverable() == c.timer_vector
            {
                out.push(format!(
                    "vCPU {} ({when}): its local APIC timer expired and its vector {} pending above its priority, not taken, with RFLAGS.IF {} at RIP {}{}",
                    c.cpu,
                    c.timer_vector.unwrap_or(0),
                    if c.interrupts_enabled { "set" } else { "clear" },
                    c.rip.map_or("?".into(), |r| format!("{r:#x}")),
                    c.tcg.as_ref().map_or(String::new(), |t| format!("; {}", t.why_not_taken()))
                ));
            }
        }
    }
    out
}

/// The vCPUs whose local APIC timer had expired with its vector pending
/// and deliverable in *both* snapshots: the interrupt was not taken in all
/// the time between them, whatever RFLAGS.IF said. A single snapshot with
/// IF clear proves nothing (a kernel runs with interrupts off for short
/// stretches); the second snapshot of a live CPU shows the timer re-armed
/// or its vector gone (box run of 2026-12-02: IF clear in L1's
/// `__wake_up_common` with the timer pending, 1 s later L1 in user mode
/// with the timer counting and IRR empty). Expired in both with another
/// initial count is a timer armed again between them, so a live CPU (box
/// run of 2026-12-05: L1 alive, its nested guest's CPU deadlocked).
pub fn timer_stuck_in_both(first: &[VcpuState], second: &[VcpuState]) -> Vec<usize> {
    let expired = |c: &VcpuState| {
        c.timer_count == Some(0) && c.timer_vector.is_some() && c.deliverable() == c.timer_vector
    };
    first
        .iter()
        .filter(|a| expired(a))
        .filter(|a| {
            second
                .iter()
                .any(|b| b.cpu == a.cpu && expired(b) && b.timer_initial == a.timer_initial)
        })
        .map(|a| a.cpu)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The box hang of 2026-12-01 (cpu-state.txt, trimmed).
    const HUNG: &str = "### info registers -a
CPU#0
RAX=ff147b21845b2100 RBX=ff147b2181dd8bd8 RCX=ff147b214104df80 RDX=000000000000000a
RIP=ffffffff9bccbb9c RFL=00000246 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=0
### info lapic 0
dumping local APIC state for CPU 0 

LVT0\t 0x00010700 active-hi edge  masked                      ExtINT (vec 0)
LVTTHMR\t 0x00000000 active-hi edge                              Fixed  (vec 0)
LVTT\t 0x000000ec active-hi edge                 one-shot     Fixed  (vec 236)
Timer\t DCR=0x3 (divide by 16) initial_count = 107006 current_count = 0
ISR\t (none)
IRR\t 236 

APR 0x00 TPR 0x10 DFR 0x0f LDR 0x01 PPR 0x10
";

    #[test]
    fn the_box_hangs_snapshot_reads_as_a_stuck_timer_interrupt() {
        let cpus = parse(HUNG);
        assert_eq!(
            cpus,
            [VcpuState {
                cpu: 0,
                rip: Some(0xffffffff9bccbb9c),
                interrupts_enabled: true,
                halted: false,
                irr: vec![236],
                ppr: Some(0x10),
                timer_vector: Some(236),
                timer_count: Some(0),
                timer_initial: Some(107006),
                tcg: None,
                isr: vec![],
                cr3: None,
                pending: vec![],
            }]
        );
        let said = expired_timer_pending(&[("first", &cpus)]);
        assert_eq!(said.len(), 1);
        assert!(
            said[0]
                .contains("vector 236 pending above its priority, not taken, with RFLAGS.IF set"),
            "{}",
            said[0]
        );
        let counting = parse(&HUNG.replace("current_count = 0", "current_count = 1149"));
        assert!(expired_timer_pending(&[("again", &counting)]).is_empty());
        let said = stuck_interrupts(&cpus, &cpus, "1 s");
        assert_eq!(said.len(), 1);
        assert!(
            said[0].starts_with(
                "vCPU 0: interrupts enabled and its local APIC timer's vector 236 pending"
            ),
            "{}",
            said[0]
        );
    }

    #[test]
    fn perfbed_qemus_interrupt_line_says_why_the_timer_waits() {
        let line = "INTREQ=00000000 EXITREQ=0 ICOUNT_DECR=00000000 GUEST=1 GIF=1 HIF=1 VINTR=1 VGIF=1 NMI_BLOCKED=0 INT_CTL=01000000 INTERCEPT=0000000000000000";
        let hung = HUNG.replace("HLT=0\n", &format!("HLT=0\n{line}\n"));
        let cpus = parse(&hung);
        let tcg = cpus[0].tcg.clone().expect("the INTREQ line is read");
        assert_eq!(
            tcg,
            TcgInterruptState {
                request: 0,
                in_guest: true,
                gif: true,
                hif: true,
                vintr: true
            }
        );
        let said = expired_timer_pending(&[("first", &cpus)]);
        assert!(
            said[0].contains("no HARD or POLL request is raised"),
            "{}",
            said[0]
        );
        let requested = TcgInterruptState {
            request: 0x2,
            ..tcg.clone()
        };
        assert!(requested
            .why_not_taken()
            .contains("the vCPU loop is not looking"));
        let hif_clear = TcgInterruptState {
            request: 0x2,
            hif: false,
            ..tcg.clone()
        };
        assert!(hif_clear.why_not_taken().contains("HIF) was clear"));
        let gif_clear = TcgInterruptState {
            request: 0x10,
            gif: false,
            ..tcg
        };
        assert!(gif_clear.why_not_taken().contains("GIF is clear"));
        // A stock QEMU prints no such line: nothing is made up.
        assert_eq!(parse(HUNG)[0].tcg, None);
    }

    #[test]
    fn a_cpu_that_took_it_masks_it_or_halts_is_not_stuck() {
        let hung = parse(HUNG);
        let taken = parse(&HUNG.replace("IRR\t 236", "IRR\t (none)"));
        let masked = parse(&HUNG.replace("RFL=00000246", "RFL=00000046"));
        let halted = parse(&HUNG.replace("HLT=0", "HLT=1"));
        let above = parse(&HUNG.replace("PPR 0x10", "PPR 0xf0"));
        for other in [&taken, &masked, &halted, &above] {
            assert!(
                stuck_interrupts(&hung, other, "1 s").is_empty(),
                "{other:?}"
            );
        }
        assert!(stuck_interrupts(&hung, &[], "1 s").is_empty());
    }

    #[test]
    fn the_nested_guest_running_with_the_hosts_timer_pending_is_named() {
        // 2026-12-02: L1's CPU in the nested guest's io_serial_out, the
        // guest's IF clear, L1's timer expired and pending.
        let hung = HUNG.replace(
            "RIP=ffffffff9bccbb9c RFL=00000246",
            "RIP=ffffffff81173e13 RFL=00000002",
        );
        let cpus = parse(&hung);
        assert!(
            stuck_interrupts(&cpus, &cpus, "1 s").is_empty(),
            "IF clear: not the two-snapshot case"
        );
        let said = expired_timer_pending(&[("first snapshot", &cpus)]);
        assert_eq!(said.len(), 1);
        assert!(
            said[0].ends_with("with RFLAGS.IF clear at RIP 0xffffffff81173e13"),
            "{}",
            said[0]
        );
    }

    #[test]
    fn only_a_timer_left_pending_across_both_snapshots_is_stuck() {
        let hung = parse(&HUNG.replace("RFL=00000246", "RFL=00000012"));
        assert_eq!(timer_stuck_in_both(&hung, &hung), [0]);
        // 2026-12-02: 1 s later the timer was re-armed and IRR empty.
        let alive = parse(
            &HUNG
                .replace("current_count = 0", "current_count = 29390")
                .replace("IRR\t 236", "IRR\t (none)"),
        );
        assert!(timer_stuck_in_both(&hung, &alive).is_empty());
        assert!(timer_stuck_in_both(&alive, &hung).is_empty());
        assert!(timer_stuck_in_both(&hung, &[]).is_empty());
        // 2026-12-05: expired again in the second, but armed again between.
        let rearmed = parse(
            &HUNG
                .replace("RFL=00000246", "RFL=00000012")
                .replace("initial_count = 107006", "initial_count = 52113"),
        );
        assert_eq!(rearmed[0].timer_count, Some(0));
        assert!(timer_stuck_in_both(&hung, &rearmed).is_empty());
    }

    #[test]
    fn perfbed_vmms_capture_is_read_by_the_same_reader() {
        let mut taken = perfbed_vmm::vcpu::snapshot::VcpuSnapshot {
            index: 2,
            ..Default::default()
        };
        taken.regs.rip = 0xffff_ffff_8100_1234;
        taken.regs.rflags = 0x2;
        taken.sregs.cr3 = 0x1c0_2000;
        taken.events.nmi.pending = 1;
        let set = |l: &mut kvm_bindings::kvm_lapic_state, offset: usize, value: u32| {
            for (i, b) in value.to_le_bytes().iter().enumerate() {
                l.regs[offset + i] = *b as _;
            }
        };
        set(&mut taken.lapic, 0x320, 0xec); // LVTT, one-shot, vector 236
        set(&mut taken.lapic, 0x200 + 7 * 0x10, 1 << (236 - 224)); // IRR
        set(&mut taken.lapic, 0xa0, 0x10); // PPR
        let text = perfbed_vmm::vcpu::snapshot::render(&[Ok(taken)]);
        let cpus = parse(&text);
        assert_eq!(cpus.len(), 1, "{text}");
        let c = &cpus[0];
        assert_eq!(
            (c.cpu, c.rip, c.interrupts_enabled, c.halted),
            (2, Some(0xffff_ffff_8100_1234), false, false)
        );
        assert_eq!(
            (c.irr.clone(), c.ppr, c.timer_vector, c.timer_count),
            (vec![236], Some(0x10), Some(236), Some(0))
        );
        assert_eq!(
            (c.cr3, c.pending.clone()),
            (Some(0x1c0_2000), vec!["NMI_PEND".to_string()])
        );
        let said = describe(&cpus);
        assert_eq!(
            said,
            ["vCPU 2: RIP 0xffffffff81001234, interrupts disabled, running; IRR [236], ISR none, PPR 0x10, timer vector 236 count 0, vector 236 deliverable, KVM holds NMI_PEND"]
        );
        // The expired timer with interrupts off reads as on QEMU.
        assert!(expired_timer_pending(&[("capture", &cpus)])[0]
            .contains("with RFLAGS.IF clear at RIP 0xffffffff81001234"));
        let halted = parse(&text.replace("HLT=0", "HLT=1"));
        assert!(describe(&halted)[0].contains("halted"));
    }
}
