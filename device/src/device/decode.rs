//! Decoding a guest access: which register an offset names and which part
//! of it an access of a given size covers. The layout is `crate::regs`.

use super::trace::BadAccessKind;
use crate::regs;

/// The decoded register behind an 8-byte aligned offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reg {
    Global(u64),
    AllowedCpus(usize),
    Owner(usize),
    SlotCtl(usize, usize),
    SlotCount(usize, usize),
    Occupancy(usize, usize),
    IrqCtl(usize),
    IrqThreshold(usize),
    IrqStatus(usize),
    ConfigStatus(usize),
    AllowedGen(usize),
    AllowedAck(usize),
}

/// Which part of a register an access covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    Full,
    Low,
    High,
}

impl Part {
    /// The part of the full register value `full` this access sees.
    pub(super) fn of(self, full: u64) -> u64 {
        match self {
            Part::Full => full,
            Part::Low => full & 0xffff_ffff,
            Part::High => full >> 32,
        }
    }
}

/// Splits an access into (8-byte aligned offset, part).
pub(super) fn split(offset: u64, size: u32) -> Result<(u64, Part), BadAccessKind> {
    match size {
        8 if offset & 7 == 0 => Ok((offset, Part::Full)),
        4 if offset & 7 == 0 => Ok((offset, Part::Low)),
        4 if offset & 7 == 4 => Ok((offset - 4, Part::High)),
        8 | 4 => Err(BadAccessKind::Unaligned),
        _ => Err(BadAccessKind::BadSize),
    }
}

/// The register at 8-byte aligned offset `off` of a device with `domains`
/// domains, `slots` slots per domain and `rmids` RMIDs, if any.
pub(super) fn lookup(off: u64, domains: usize, slots: u32, rmids: u32) -> Option<Reg> {
    if off < regs::REG_GLOBAL_END {
        return Some(Reg::Global(off));
    }
    let rel = off.checked_sub(regs::DOMAIN_BASE)?;
    let d = usize::try_from(rel / regs::DOMAIN_STRIDE).ok()?;
    if d >= domains {
        return None;
    }
    let r = rel % regs::DOMAIN_STRIDE;
    let slots_end = regs::DOM_SLOTS + u64::from(slots) * regs::SLOT_STRIDE;
    let occ_end = regs::DOM_OCCUPANCY + u64::from(rmids) * 8;
    match r {
        regs::DOM_ALLOWED_CPUS => Some(Reg::AllowedCpus(d)),
        regs::DOM_OWNER => Some(Reg::Owner(d)),
        regs::DOM_IRQ_CTL => Some(Reg::IrqCtl(d)),
        regs::DOM_IRQ_THRESHOLD => Some(Reg::IrqThreshold(d)),
        regs::DOM_IRQ_STATUS => Some(Reg::IrqStatus(d)),
        regs::DOM_CONFIG_STATUS => Some(Reg::ConfigStatus(d)),
        regs::DOM_ALLOWED_GEN => Some(Reg::AllowedGen(d)),
        regs::DOM_ALLOWED_ACK => Some(Reg::AllowedAck(d)),
        _ if (regs::DOM_SLOTS..slots_end).contains(&r) => {
            let s = ((r - regs::DOM_SLOTS) / regs::SLOT_STRIDE) as usize;
            match (r - regs::DOM_SLOTS) % regs::SLOT_STRIDE {
                regs::SLOT_CTL_OFF => Some(Reg::SlotCtl(d, s)),
                regs::SLOT_COUNT_OFF => Some(Reg::SlotCount(d, s)),
                _ => None,
            }
        }
        _ if (regs::DOM_OCCUPANCY..occ_end).contains(&r) => {
            Some(Reg::Occupancy(d, ((r - regs::DOM_OCCUPANCY) / 8) as usize))
        }
        _ => None,
    }
}

impl Reg {
    /// The domain the register belongs to, if any.
    pub(super) fn domain(self) -> Option<usize> {
        match self {
            Reg::Global(_) => None,
            Reg::AllowedCpus(d)
            | Reg::Owner(d)
            | Reg::SlotCtl(d, _)
            | Reg::SlotCount(d, _)
            | Reg::Occupancy(d, _)
            | Reg::IrqCtl(d)
            | Reg::IrqThreshold(d)
            | Reg::IrqStatus(d)
            | Reg::ConfigStatus(d)
            | Reg::AllowedGen(d)
            | Reg::AllowedAck(d) => Some(d),
        }
    }

    /// The register's name as `device/README.md` spells it, with its index
    /// (`SLOT_COUNT[2]`).
    pub(super) fn name(self) -> String {
        match self {
            Reg::Global(off) => global_name(off).to_string(),
            Reg::AllowedCpus(_) => "DOM_ALLOWED_CPUS".into(),
            Reg::Owner(_) => "DOM_OWNER".into(),
            Reg::SlotCtl(_, s) => format!("SLOT_CTL[{s}]"),
            Reg::SlotCount(_, s) => format!("SLOT_COUNT[{s}]"),
            Reg::Occupancy(_, r) => format!("OCCUPANCY[{r}]"),
            Reg::IrqCtl(_) => "DOM_IRQ_CTL".into(),
            Reg::IrqThreshold(_) => "DOM_IRQ_THRESHOLD".into(),
            Reg::IrqStatus(_) => "DOM_IRQ_STATUS".into(),
            Reg::ConfigStatus(_) => "DOM_CONFIG_STATUS".into(),
            Reg::AllowedGen(_) => "DOM_ALLOWED_GEN".into(),
            Reg::AllowedAck(_) => "DOM_ALLOWED_ACK".into(),
        }
    }
}

/// The name of the global register at `off` (`RESERVED` between them).
fn global_name(off: u64) -> &'static str {
    match off {
        regs::REG_MAGIC => "REG_MAGIC",
        regs::REG_VERSION => "REG_VERSION",
        regs::REG_NUM_DOMAINS => "REG_NUM_DOMAINS",
        regs::REG_NUM_RMIDS => "REG_NUM_RMIDS",
        regs::REG_NUM_SLOTS => "REG_NUM_SLOTS",
        regs::REG_COUNTER_WIDTH => "REG_COUNTER_WIDTH",
        regs::REG_COUNTER_UNIT => "REG_COUNTER_UNIT",
        regs::REG_MAX_RATE => "REG_MAX_RATE",
        regs::REG_DOMAIN_BASE => "REG_DOMAIN_BASE",
        regs::REG_DOMAIN_STRIDE => "REG_DOMAIN_STRIDE",
        regs::REG_SLOT_BASE => "REG_SLOT_BASE",
        regs::REG_SLOT_STRIDE => "REG_SLOT_STRIDE",
        regs::REG_OCCUPANCY_BASE => "REG_OCCUPANCY_BASE",
        regs::REG_DEVICE_SIZE => "REG_DEVICE_SIZE",
        regs::REG_EVENTS => "REG_EVENTS",
        _ => "RESERVED",
    }
}
