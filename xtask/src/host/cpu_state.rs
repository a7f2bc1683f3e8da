//! What two snapshots of a hung VM's vCPUs (QEMU's monitor: `info
//! registers -a`, `info lapic N`, see `monitor.rs`) say: whether a vCPU
//! sat with interrupts enabled and a deliverable interrupt pending in its
//! local APIC in both, which no running x86 CPU does for long.
//!
//! In the box that is L1's one vCPU not taking its own timer interrupt: the
//! nested box (QEMU's TCG emulating SVM for L1's KVM) is stuck, whatever
//! the guest inside it was doing; the harness names it so, rather than
//! leaving a bare timeout that reads like perfbed's hang.

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
        if let Some(n) = line.strip_prefix("CPU#").and_then(|n| n.trim().parse().ok()) {
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
                if let Some(flags) = field(line, "RFL=").and_then(|f| u64::from_str_radix(f, 16).ok()) {
                    cpu.interrupts_enabled = flags & (1 << 9) != 0;
                }
                if let Some(hlt) = field(line, "HLT=") {
                    cpu.halted = hlt == "1";
                }
            }
            Some(i) => {
                let cpu = &mut cpus[i];
                if let Some(rest) = line.strip_prefix("IRR") {
                    cpu.irr = rest.split_whitespace().filter_map(|v| v.parse().ok()).collect();
                } else if line.split_whitespace().next() == Some("LVTT") && !line.contains("masked") {
                    cpu.timer_vector = line
                        .split("(vec ")
                        .nth(1)
                        .and_then(|v| v.trim_end_matches(')').parse().ok());
                } else if let Some(ppr) = field(line, "PPR ") {
                    cpu.ppr = u8::from_str_radix(ppr.trim_start_matches("0x"), 16).ok();
                }
            }
        }
    }
    cpus
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
            }]
        );
        let said = stuck_interrupts(&cpus, &cpus, "1 s");
        assert_eq!(said.len(), 1);
        assert!(
            said[0].starts_with("vCPU 0: interrupts enabled and its local APIC timer's vector 236 pending"),
            "{}",
            said[0]
        );
    }

    #[test]
    fn a_cpu_that_took_it_masks_it_or_halts_is_not_stuck() {
        let hung = parse(HUNG);
        let taken = parse(&HUNG.replace("IRR\t 236", "IRR\t (none)"));
        let masked = parse(&HUNG.replace("RFL=00000246", "RFL=00000046"));
        let halted = parse(&HUNG.replace("HLT=0", "HLT=1"));
        let above = parse(&HUNG.replace("PPR 0x10", "PPR 0xf0"));
        for other in [&taken, &masked, &halted, &above] {
            assert!(stuck_interrupts(&hung, other, "1 s").is_empty(), "{other:?}");
        }
        assert!(stuck_interrupts(&hung, &[], "1 s").is_empty());
    }
}
