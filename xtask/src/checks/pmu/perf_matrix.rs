//! The perf_event_open matrix: every `perf_event_attr` field and flag a
//! counting device PMU must refuse or honour, groups of every kind,
//! `read_format` combinations, `PERF_FLAG_*`, ioctls on an open event, and
//! the `pid`/`cpu` arguments, each with the errno the kernel's own uncore and
//! device PMUs give (or the success perf semantics call for).
//!
//! Each case reports what it saw as a short text ("EINVAL", "opened",
//! "3 words") compared with what it must see; a case that cannot even run
//! (the agent does not answer) fails the whole check. Where the arm64
//! guest's kernel legitimately answers otherwise than x86's, the case says
//! arm64's answer and why ([`on_arm64`]).

use anyhow::{bail, Result};
use perfbed_agent::{PerfAttr, PerfIoctl};
use perfbed_device::regs::Event;
use perfbed_device::{ControlClient, DeviceConfig};

use super::context::Ctx;
use crate::build::image::arch::Arch;
use crate::checks::Check;
use crate::guest::perf_abi::*;
use crate::guest::{Guest, Opened};

type Run = Box<dyn Fn(&mut Matrix) -> Result<String>>;

/// One case: its name, the outcome it must have, and how to get it.
struct Case {
    name: String,
    want: String,
    /// Why the guest's architecture answers `want` where x86's kernel
    /// answers otherwise.
    why: Option<&'static str>,
    run: Run,
}

fn case(
    name: impl Into<String>,
    want: &str,
    run: impl Fn(&mut Matrix) -> Result<String> + 'static,
) -> Case {
    Case {
        name: name.into(),
        want: want.into(),
        why: None,
        run: Box::new(run),
    }
}

/// `case` as the guest of `arch` must answer it: on arm64 `want`, for the
/// reason `why`, where the arm64 kernel's answer differs from x86's.
fn on_arm64(arch: Arch, want: &str, why: &'static str, case: Case) -> Case {
    match arch {
        Arch::X86_64 => case,
        Arch::Arm64 => Case {
            want: want.into(),
            why: Some(why),
            ..case
        },
    }
}

pub struct Matrix<'a, 'b> {
    g: &'a mut Guest<'b>,
    control: &'a mut ControlClient,
    /// Each domain's PMU type.
    types: Vec<u32>,
    /// Events opened by the current case, closed after it.
    open: Vec<u32>,
}

fn outcome(opened: &Opened) -> String {
    match opened {
        Ok(_) => "opened".into(),
        Err(errno) => errno.clone(),
    }
}

impl Matrix<'_, '_> {
    fn attr(&self, domain: usize, event: Event, rmid: u32) -> PerfAttr {
        PerfAttr {
            type_: self.types[domain],
            config: event as u64 | u64::from(rmid) << 8,
            ..PerfAttr::default()
        }
    }

    /// The default event: domain 0, mbm_total_bytes, RMID 1.
    fn good(&self) -> PerfAttr {
        self.attr(0, Event::MbmTotalBytes, 1)
    }

    /// Opens and remembers the event for closing after the case.
    fn open(
        &mut self,
        attr: PerfAttr,
        pid: i32,
        cpu: i32,
        group: Option<u32>,
        flags: u64,
    ) -> Result<Opened> {
        let opened = self.g.open_flags(attr, pid, cpu, group, flags)?;
        if let Ok(h) = opened {
            self.open.push(h);
        }
        Ok(opened)
    }

    /// Opens a system-wide event on CPU 0 that must open.
    fn must_open(&mut self, attr: PerfAttr, group: Option<u32>) -> Result<u32> {
        match self.open(attr, -1, 0, group, 0)? {
            Ok(h) => Ok(h),
            Err(errno) => bail!("a setup open failed: {errno}"),
        }
    }

    /// The outcome of opening `attr` system-wide on CPU 0.
    fn try_attr(&mut self, attr: PerfAttr) -> Result<String> {
        Ok(outcome(&self.open(attr, -1, 0, None, 0)?))
    }

    fn ioctl(&mut self, handle: u32, ioctl: PerfIoctl) -> Result<String> {
        Ok(match self.g.ioctl(handle, ioctl)? {
            Ok(_) => "ok".into(),
            Err(errno) => errno,
        })
    }

    fn inject(&mut self, domain: usize, rmid: u32, bytes: u64) -> Result<()> {
        self.control
            .inject(domain as u32, rmid, Event::MbmTotalBytes, bytes)?;
        self.control
            .wait_landed(self.g.timeout.as_millis() as u64)?;
        Ok(())
    }

    /// The number of u64 words a read of an event with `read_format` gives.
    fn words(&mut self, read_format: u64) -> Result<String> {
        let h = self.must_open(
            PerfAttr {
                read_format,
                ..self.good()
            },
            None,
        )?;
        Ok(format!("{} words", self.g.read(h)?.len()))
    }

    /// The PMU's CPU for domain `d`.
    fn pmu_cpu(&mut self, d: usize) -> Result<i32> {
        match self.g.cpumask(&crate::guest::pmu_name(d))?.first() {
            Some(&cpu) => Ok(cpu as i32),
            None => bail!("{} is parked", crate::guest::pmu_name(d)),
        }
    }

    fn close_all(&mut self) -> Result<()> {
        // Siblings before leaders: close in reverse open order.
        while let Some(h) = self.open.pop() {
            self.g.close(h)?;
        }
        Ok(())
    }
}

fn flag_case(name: &str, flags: u64, want: &str) -> Case {
    case(name, want, move |m| {
        let attr = PerfAttr { flags, ..m.good() };
        m.try_attr(attr)
    })
}

/// What a counting event (no period) with the one `sample_type` bit `name` gets.
fn sample_type_want(name: &str) -> &'static str {
    match name {
        // The driver, as perf's device PMUs (arm_dsu_pmu, arm-ccn) refuse it.
        "BRANCH_STACK" => "EINVAL",
        // The core: the guest kernel has no CONFIG_CGROUP_PERF.
        "CGROUP" => "EINVAL",
        // The rest shape samples, which a counting event never writes, or the ids of the
        // core's side-band records: the core honours them, the driver has nothing to do.
        _ => "opened",
    }
}

/// What a counting event gets with `PERF_SAMPLE_BRANCH_STACK` and any one `branch_sample_type`
/// bit: a privilege level alone (USER, KERNEL, HV) the core refuses, as it names no branch kind;
/// any other the core accepts and the driver refuses, as it refuses every branch stack.
const BRANCH_BIT_WANT: &str = "EINVAL";

/// `attr` with the `sample_type` bit `bit` and what that bit needs to be well-formed: a branch
/// kind, a register, an aligned stack size.
fn with_sample_bit(attr: PerfAttr, bit: u64) -> PerfAttr {
    let mut attr = PerfAttr {
        sample_type: bit,
        ..attr
    };
    match bit {
        SAMPLE_BRANCH_STACK => attr.branch_sample_type = BRANCH_ANY,
        SAMPLE_REGS_USER => attr.sample_regs_user = REG_X86_IP,
        SAMPLE_REGS_INTR => attr.sample_regs_intr = REG_X86_IP,
        SAMPLE_STACK_USER => attr.sample_stack_user = 8192,
        _ => {}
    }
    attr
}

fn cases(device: &DeviceConfig, arch: Arch) -> Vec<Case> {
    let rmids = device.rmids;
    let slots = device.slots;
    let other_domain_cpu = device
        .domains
        .get(1)
        .and_then(|d| d.first().copied())
        .unwrap_or(0) as i32;
    let mut cases = vec![
        // The event itself.
        case("type of no PMU", "ENOENT", |m| {
            let attr = PerfAttr { type_: m.types.iter().max().copied().unwrap_or(0) + 1000, ..m.good() };
            m.try_attr(attr)
        }),
        case("event 0", "EINVAL", |m| m.try_attr(PerfAttr { config: 1 << 8, ..m.good() })),
        case("unknown event 9", "EINVAL", |m| m.try_attr(PerfAttr { config: 9 | 1 << 8, ..m.good() })),
        case("config bits above the rmid field", "EINVAL", |m| m.try_attr(PerfAttr { config: m.good().config | 1 << 40, ..m.good() })),
        case(format!("rmid {rmids} (one too many)"), "EINVAL", move |m| m.try_attr(m.attr(0, Event::MbmTotalBytes, rmids))),
        case(format!("rmid {} (the last)", rmids - 1), "opened", move |m| m.try_attr(m.attr(0, Event::MbmTotalBytes, rmids - 1))),
        case("llc_occupancy (no slot)", "opened", |m| m.try_attr(m.attr(0, Event::LlcOccupancy, 1))),
        case("mbm_local_bytes", "opened", |m| m.try_attr(m.attr(0, Event::MbmLocalBytes, 1))),
        case("config1 set", "EINVAL", |m| m.try_attr(PerfAttr { config1: 1, ..m.good() })),
        case("config2 set", "EINVAL", |m| m.try_attr(PerfAttr { config2: 1, ..m.good() })),
        case("config3 set", "EINVAL", |m| m.try_attr(PerfAttr { config3: 1, ..m.good() })),
        // Counting only: what a device PMU cannot filter or sample.
        flag_case("exclude_user", FLAG_EXCLUDE_USER, "EINVAL"),
        flag_case("exclude_kernel", FLAG_EXCLUDE_KERNEL, "EINVAL"),
        flag_case("exclude_hv", FLAG_EXCLUDE_HV, "EINVAL"),
        flag_case("exclude_idle", FLAG_EXCLUDE_IDLE, "EINVAL"),
        flag_case("exclude_host", FLAG_EXCLUDE_HOST, "EINVAL"),
        flag_case("exclude_guest", FLAG_EXCLUDE_GUEST, "EINVAL"),
        case("sample_period (sampling)", "EOPNOTSUPP", |m| m.try_attr(PerfAttr { sample_period: 1000, ..m.good() })),
        case("freq with sample_freq (sampling)", "EOPNOTSUPP", |m| m.try_attr(PerfAttr { flags: FLAG_FREQ, sample_period: 100, ..m.good() })),
        case("sample_period with bit 63", "EINVAL", |m| m.try_attr(PerfAttr { sample_period: 1 << 63, ..m.good() })),
        case("freq with sample_freq 0 (counting)", "opened", |m| m.try_attr(PerfAttr { flags: FLAG_FREQ, ..m.good() })),
        flag_case("aux_output", FLAG_AUX_OUTPUT, "EOPNOTSUPP"),
        // sample_type and branch_sample_type beyond one well-formed bit (the bits one by one
        // follow this list): what the core makes of them, before and after the driver.
        case("PERF_SAMPLE_BRANCH_STACK with a period (sampling, refused first)", "EOPNOTSUPP", |m| {
            m.try_attr(with_sample_bit(PerfAttr { sample_period: 1000, ..m.good() }, SAMPLE_BRANCH_STACK))
        }),
        case("PERF_SAMPLE_BRANCH_STACK with no branch kind", "EINVAL", |m| {
            m.try_attr(PerfAttr { sample_type: SAMPLE_BRANCH_STACK, branch_sample_type: BRANCH_PLM_ALL, ..m.good() })
        }),
        case("PERF_SAMPLE_BRANCH_STACK with USER|KERNEL|HV|ANY", "EINVAL", |m| {
            m.try_attr(PerfAttr { sample_type: SAMPLE_BRANCH_STACK, branch_sample_type: BRANCH_PLM_ALL | BRANCH_ANY, ..m.good() })
        }),
        case("branch_sample_type ANY without PERF_SAMPLE_BRANCH_STACK (ignored)", "opened", |m| {
            m.try_attr(PerfAttr { branch_sample_type: BRANCH_ANY, ..m.good() })
        }),
        case("branch_sample_type of undefined bits without PERF_SAMPLE_BRANCH_STACK (ignored)", "opened", |m| {
            m.try_attr(PerfAttr { branch_sample_type: !(BRANCH_MAX - 1), ..m.good() })
        }),
        case("PERF_SAMPLE_REGS_USER naming no register", "EINVAL", |m| m.try_attr(PerfAttr { sample_type: SAMPLE_REGS_USER, ..m.good() })),
        on_arm64(arch, "EINVAL", "bits 32-33 are arm64's PC and a bit past PERF_REG_ARM64_MAX: perf_reg_validate() refuses the mask",
            case("PERF_SAMPLE_REGS_USER with XMM0 (an extended register)", "EOPNOTSUPP", |m| {
                m.try_attr(PerfAttr { sample_type: SAMPLE_REGS_USER, sample_regs_user: REG_X86_IP | REG_X86_XMM0, ..m.good() })
            })),
        case("PERF_SAMPLE_REGS_INTR naming no register", "EINVAL", |m| m.try_attr(PerfAttr { sample_type: SAMPLE_REGS_INTR, ..m.good() })),
        case("PERF_SAMPLE_STACK_USER of 4 bytes (not 8-aligned)", "EINVAL", |m| {
            m.try_attr(PerfAttr { sample_type: SAMPLE_STACK_USER, sample_stack_user: 4, ..m.good() })
        }),
        case("PERF_SAMPLE_WEIGHT with PERF_SAMPLE_WEIGHT_STRUCT", "EINVAL", |m| {
            m.try_attr(PerfAttr { sample_type: SAMPLE_WEIGHT | SAMPLE_WEIGHT_STRUCT, ..m.good() })
        }),
        case("PERF_SAMPLE_AUX with aux_sample_size, no AUX leader", "EINVAL", |m| {
            m.try_attr(PerfAttr { sample_type: SAMPLE_AUX, aux_sample_size: 4096, ..m.good() })
        }),
        case("sample_type PERF_SAMPLE_MAX (the first undefined bit)", "EINVAL", |m| m.try_attr(PerfAttr { sample_type: SAMPLE_MAX, ..m.good() })),
        // Flags the core checks.
        flag_case("a reserved flag bit", FLAG_RESERVED_BIT, "EINVAL"),
        case("an unknown read_format bit", "EINVAL", |m| m.try_attr(PerfAttr { read_format: 1 << 5, ..m.good() })),
        case("an unknown sample_type bit", "EINVAL", |m| m.try_attr(PerfAttr { sample_type: 1 << 62, ..m.good() })),
        case("an unknown branch_sample_type bit", "EINVAL", |m| {
            m.try_attr(PerfAttr { sample_type: SAMPLE_BRANCH_STACK, branch_sample_type: BRANCH_MAX | BRANCH_ANY, ..m.good() })
        }),
        flag_case("inherit_thread without inherit", FLAG_INHERIT_THREAD, "EINVAL"),
        flag_case("sigtrap without remove_on_exec", FLAG_SIGTRAP, "EINVAL"),
        flag_case("remove_on_exec with enable_on_exec", FLAG_REMOVE_ON_EXEC | FLAG_ENABLE_ON_EXEC, "EINVAL"),
        case("attr.size 8 (below VER0)", "E2BIG", |m| m.try_attr(PerfAttr { size: 8, ..m.good() })),
        case("attr.size above a page", "E2BIG", |m| m.try_attr(PerfAttr { size: 4097, ..m.good() })),
        case("attr.size 64 (VER0)", "opened", |m| m.try_attr(PerfAttr { size: PERF_ATTR_SIZE_VER0, ..m.good() })),
        // Flags a counting event honours or that do not concern it.
        flag_case("pinned", FLAG_PINNED, "opened"),
        flag_case("exclusive", FLAG_EXCLUSIVE, "opened"),
        flag_case("inherit (system-wide: no effect)", FLAG_INHERIT, "opened"),
        flag_case("enable_on_exec (system-wide: no effect)", FLAG_ENABLE_ON_EXEC, "opened"),
        // What a counting PMU without an overflow interrupt cannot honour: a skid constraint on
        // samples (perf(1) retries lower levels on EOPNOTSUPP), a signal on overflow; a
        // breakpoint event's field.
        flag_case("precise_ip 1", FLAG_PRECISE_IP_1, "EOPNOTSUPP"),
        flag_case("precise_ip 2", FLAG_PRECISE_IP_2, "EOPNOTSUPP"),
        flag_case("precise_ip 3", FLAG_PRECISE_IP_3, "EOPNOTSUPP"),
        // The core refuses sigtrap for CPU-wide events first; the driver refuses it too.
        flag_case("sigtrap with remove_on_exec (a signal on overflow)", FLAG_SIGTRAP | FLAG_REMOVE_ON_EXEC, "EINVAL"),
        // AUX actions: the core refuses them, as for any PMU without AUX pause or an AUX group.
        case("aux_start_paused", "EOPNOTSUPP", |m| m.try_attr(PerfAttr { aux_action: AUX_START_PAUSED, ..m.good() })),
        case("aux_pause (on overflow, no AUX group)", "EINVAL", |m| m.try_attr(PerfAttr { aux_action: AUX_PAUSE, ..m.good() })),
        case("aux_resume (on overflow, no AUX group)", "EINVAL", |m| m.try_attr(PerfAttr { aux_action: AUX_RESUME, ..m.good() })),
        case("bp_type (a breakpoint's)", "EINVAL", |m| m.try_attr(PerfAttr { bp_type: 1, ..m.good() })),
        // Fields for samples, callchains and the ring buffer, which a counting event never uses.
        flag_case("exclude_callchain_kernel|user (no callchains)", FLAG_EXCLUDE_CALLCHAIN_KERNEL | FLAG_EXCLUDE_CALLCHAIN_USER, "opened"),
        flag_case("watermark (ring buffer wakeups)", FLAG_WATERMARK, "opened"),
        flag_case("write_backward (ring buffer)", FLAG_WRITE_BACKWARD, "opened"),
        flag_case("inherit_stat (system-wide: no effect)", FLAG_INHERIT_STAT, "opened"),
        // Side-band records the perf core writes, whatever the PMU.
        flag_case(
            "side-band records mmap_data|sample_id_all|mmap2|comm_exec|context_switch|namespaces|ksymbol|bpf_event|cgroup|text_poke|build_id",
            FLAG_MMAP_DATA | FLAG_SAMPLE_ID_ALL | FLAG_MMAP2 | FLAG_COMM_EXEC | FLAG_CONTEXT_SWITCH | FLAG_NAMESPACES | FLAG_KSYMBOL | FLAG_BPF_EVENT | FLAG_CGROUP | FLAG_TEXT_POKE | FLAG_BUILD_ID,
            "opened",
        ),
        flag_case("side-band records mmap|comm|task", FLAG_MMAP | FLAG_COMM | FLAG_TASK, "opened"),
        case("use_clockid CLOCK_MONOTONIC", "opened", |m| m.try_attr(PerfAttr { flags: FLAG_USE_CLOCKID, clockid: CLOCK_MONOTONIC, ..m.good() })),
        case("disabled, then enabled: counts from the enable", "0 then 4096", |m| {
            let h = m.must_open(PerfAttr { flags: FLAG_DISABLED, ..m.good() }, None)?;
            m.inject(0, 1, 8192)?;
            let off = m.g.read(h)?[0];
            m.g.ioctl(h, PerfIoctl::Enable { group: false })?.map_err(|e| anyhow::anyhow!("enable: {e}"))?;
            m.inject(0, 1, 4096)?;
            let on = m.g.read(h)?[0];
            Ok(format!("{off} then {on}"))
        }),
        // pid and cpu.
        case("pid -1, cpu -1", "EINVAL", |m| Ok(outcome(&m.open(m.good(), -1, -1, None, 0)?))),
        case("pid 0 (this task), cpu -1", "EINVAL", |m| Ok(outcome(&m.open(m.good(), 0, -1, None, 0)?))),
        case("pid 1, cpu -1", "EINVAL", |m| Ok(outcome(&m.open(m.good(), 1, -1, None, 0)?))),
        case("pid 1, cpu 0", "EINVAL", |m| Ok(outcome(&m.open(m.good(), 1, 0, None, 0)?))),
        case("pid of no task", "ESRCH", |m| Ok(outcome(&m.open(m.good(), 999_999, 0, None, 0)?))),
        case("cpu outside the domain: moved to the PMU's CPU, exact", "opened, 65536", move |m| {
            let opened = m.open(m.good(), -1, other_domain_cpu, None, 0)?;
            let Ok(h) = opened else { return Ok(outcome(&opened)) };
            m.inject(0, 1, 65536)?;
            Ok(format!("opened, {}", m.g.read(h)?[0]))
        }),
        case("cpu 1000 (no such CPU)", "EINVAL", |m| Ok(outcome(&m.open(m.good(), -1, 1000, None, 0)?))),
        // PERF_FLAG_*.
        case("PERF_FLAG_FD_NO_GROUP with a leader: not in its group", "opened, leader nr 1", |m| {
            let leader = m.must_open(PerfAttr { read_format: FORMAT_GROUP, ..m.good() }, None)?;
            let opened = m.open(m.attr(0, Event::MbmLocalBytes, 1), -1, 0, Some(leader), OPEN_FLAG_FD_NO_GROUP)?;
            Ok(format!("{}, leader nr {}", outcome(&opened), m.g.read(leader)?[0]))
        }),
        case("PERF_FLAG_FD_OUTPUT with a leader (no buffer to share)", "EINVAL", |m| {
            let leader = m.must_open(m.good(), None)?;
            Ok(outcome(&m.open(m.attr(0, Event::MbmLocalBytes, 1), -1, 0, Some(leader), OPEN_FLAG_FD_OUTPUT)?))
        }),
        case("PERF_FLAG_PID_CGROUP with pid -1", "EINVAL", |m| Ok(outcome(&m.open(m.good(), -1, 0, None, OPEN_FLAG_PID_CGROUP)?))),
        // A cgroup event: pid is then a file descriptor (the agent's stdin), on the PMU's CPU.
        case("PERF_FLAG_PID_CGROUP with an open fd (a cgroup event)", "EINVAL", |m| {
            let cpu = m.pmu_cpu(0)?;
            Ok(outcome(&m.open(m.good(), 0, cpu, None, OPEN_FLAG_PID_CGROUP)?))
        }),
        case("an unknown PERF_FLAG bit", "EINVAL", |m| Ok(outcome(&m.open(m.good(), -1, 0, None, OPEN_FLAG_UNKNOWN)?))),
        // Groups.
        case("sibling of the same PMU", "opened", |m| {
            let leader = m.must_open(m.good(), None)?;
            Ok(outcome(&m.open(m.attr(0, Event::MbmLocalBytes, 1), -1, 0, Some(leader), 0)?))
        }),
        case("sibling from the other domain's PMU", "EINVAL", |m| {
            let leader = m.must_open(m.good(), None)?;
            Ok(outcome(&m.open(m.attr(1, Event::MbmTotalBytes, 1), -1, 0, Some(leader), 0)?))
        }),
        case("software leader on the PMU's CPU, device sibling", "opened", |m| {
            let cpu = m.pmu_cpu(0)?;
            let sw = PerfAttr { type_: PERF_TYPE_SOFTWARE, config: PERF_COUNT_SW_CPU_CLOCK, ..PerfAttr::default() };
            let leader = match m.open(sw, -1, cpu, None, 0)? {
                Ok(h) => h,
                Err(e) => bail!("software leader: {e}"),
            };
            Ok(outcome(&m.open(m.good(), -1, cpu, Some(leader), 0)?))
        }),
        case("software leader on another CPU, device sibling", "EINVAL", move |m| {
            let sw = PerfAttr { type_: PERF_TYPE_SOFTWARE, config: PERF_COUNT_SW_CPU_CLOCK, ..PerfAttr::default() };
            let leader = match m.open(sw, -1, other_domain_cpu, None, 0)? {
                Ok(h) => h,
                Err(e) => bail!("software leader: {e}"),
            };
            Ok(outcome(&m.open(m.good(), -1, other_domain_cpu, Some(leader), 0)?))
        }),
        case("software sibling of a device leader", "opened", |m| {
            let cpu = m.pmu_cpu(0)?;
            let leader = m.must_open(m.good(), None)?;
            let sw = PerfAttr { type_: PERF_TYPE_SOFTWARE, config: PERF_COUNT_SW_CPU_CLOCK, ..PerfAttr::default() };
            Ok(outcome(&m.open(sw, -1, cpu, Some(leader), 0)?))
        }),
        case("sibling of a sibling", "EINVAL", |m| {
            let leader = m.must_open(m.good(), None)?;
            let sibling = m.must_open(m.attr(0, Event::MbmLocalBytes, 1), Some(leader))?;
            Ok(outcome(&m.open(m.attr(0, Event::LlcOccupancy, 1), -1, 0, Some(sibling), 0)?))
        }),
        case(format!("group of {} slot events ({} slots)", slots + 1, slots), "EINVAL", move |m| {
            let leader = m.must_open(m.good(), None)?;
            for i in 1..slots {
                m.must_open(m.attr(0, Event::MbmTotalBytes, (i + 1) % rmids), Some(leader))?;
            }
            Ok(outcome(&m.open(m.attr(0, Event::MbmLocalBytes, 1), -1, 0, Some(leader), 0)?))
        }),
        case("pinned group leader with siblings, group read", "nr 3", |m| {
            let leader = m.must_open(PerfAttr { flags: FLAG_PINNED, read_format: FORMAT_GROUP, ..m.good() }, None)?;
            m.must_open(m.attr(0, Event::MbmLocalBytes, 1), Some(leader))?;
            m.must_open(m.attr(0, Event::LlcOccupancy, 1), Some(leader))?;
            Ok(format!("nr {}", m.g.read(leader)?[0]))
        }),
        // read_format.
        case("read_format none", "1 words", |m| m.words(0)),
        case("read_format TOTAL_TIME_ENABLED", "2 words", |m| m.words(FORMAT_TOTAL_TIME_ENABLED)),
        case("read_format TOTAL_TIME_RUNNING", "2 words", |m| m.words(FORMAT_TOTAL_TIME_RUNNING)),
        case("read_format FORMAT_ID", "2 words", |m| m.words(FORMAT_ID)),
        case("read_format FORMAT_LOST", "2 words", |m| m.words(FORMAT_LOST)),
        case("read_format ENABLED|RUNNING|FORMAT_ID|FORMAT_LOST", "5 words", |m| m.words(FORMAT_TOTAL_TIME_ENABLED | FORMAT_TOTAL_TIME_RUNNING | FORMAT_ID | FORMAT_LOST)),
        case("read_format FORMAT_GROUP, no siblings", "2 words", |m| m.words(FORMAT_GROUP)),
        case("read_format FORMAT_GROUP|FORMAT_ID, one sibling: ids match", "5 words, ids match", |m| {
            let leader = m.must_open(PerfAttr { read_format: FORMAT_GROUP | FORMAT_ID, ..m.good() }, None)?;
            let sibling = m.must_open(m.attr(0, Event::MbmLocalBytes, 1), Some(leader))?;
            let v = m.g.read(leader)?;
            let ids = (m.g.ioctl(leader, PerfIoctl::Id)?, m.g.ioctl(sibling, PerfIoctl::Id)?);
            let matched = v.len() == 5 && ids == (Ok(v[2]), Ok(v[4]));
            Ok(format!("{} words, ids {}", v.len(), if matched { "match" } else { "differ" }))
        }),
        // ioctls on an open event.
        case("ioctl ENABLE", "ok", |m| {
            let h = m.must_open(m.good(), None)?;
            m.ioctl(h, PerfIoctl::Enable { group: false })
        }),
        case("ioctl DISABLE: the count stops", "ok, 4096", |m| {
            let h = m.must_open(m.good(), None)?;
            m.inject(0, 1, 4096)?;
            let r = m.ioctl(h, PerfIoctl::Disable { group: false })?;
            m.inject(0, 1, 8192)?;
            Ok(format!("{r}, {}", m.g.read(h)?[0]))
        }),
        case("ioctl RESET: the count restarts", "ok, 0", |m| {
            let h = m.must_open(m.good(), None)?;
            m.inject(0, 1, 4096)?;
            let r = m.ioctl(h, PerfIoctl::Reset { group: false })?;
            Ok(format!("{r}, {}", m.g.read(h)?[0]))
        }),
        case("ioctl ENABLE|DISABLE with PERF_IOC_FLAG_GROUP", "ok ok", |m| {
            let leader = m.must_open(m.good(), None)?;
            m.must_open(m.attr(0, Event::MbmLocalBytes, 1), Some(leader))?;
            let a = m.ioctl(leader, PerfIoctl::Disable { group: true })?;
            let b = m.ioctl(leader, PerfIoctl::Enable { group: true })?;
            Ok(format!("{a} {b}"))
        }),
        case("ioctl REFRESH (sampling only)", "EINVAL", |m| {
            let h = m.must_open(m.good(), None)?;
            m.ioctl(h, PerfIoctl::Refresh { count: 1 })
        }),
        case("ioctl PERIOD (sampling only)", "EINVAL", |m| {
            let h = m.must_open(m.good(), None)?;
            m.ioctl(h, PerfIoctl::Period { period: 1000 })
        }),
        case("ioctl FORMAT_ID", "ok", |m| {
            let h = m.must_open(m.good(), None)?;
            m.ioctl(h, PerfIoctl::Id)
        }),
        case("ioctl SET_OUTPUT -1", "ok", |m| {
            let h = m.must_open(m.good(), None)?;
            m.ioctl(h, PerfIoctl::SetOutput { target: None })
        }),
        case("ioctl SET_FILTER (not a tracepoint)", "EINVAL", |m| {
            let h = m.must_open(m.good(), None)?;
            m.ioctl(h, PerfIoctl::SetFilter { filter: "common_pid != 0".into() })
        }),
        case("ioctl PAUSE_OUTPUT (no buffer)", "EINVAL", |m| {
            let h = m.must_open(m.good(), None)?;
            m.ioctl(h, PerfIoctl::PauseOutput { pause: true })
        }),
        case("ioctl MODIFY_ATTRIBUTES (breakpoints only)", "EOPNOTSUPP", |m| {
            let h = m.must_open(m.good(), None)?;
            let attr = m.good();
            m.ioctl(h, PerfIoctl::ModifyAttributes { attr })
        }),
        // perfbed's guest kernels have BPF (docs/guest.md): the core
        // looks up the program first (fd -1: EBADF), and a counting event
        // of a PMU that is not a tracepoint has no program array to query.
        case("ioctl SET_BPF fd -1 (not a BPF program)", "EBADF", |m| {
            let h = m.must_open(m.good(), None)?;
            m.ioctl(h, PerfIoctl::SetBpf { fd: -1 })
        }),
        case("ioctl QUERY_BPF (not a tracepoint event)", "EINVAL", |m| {
            let h = m.must_open(m.good(), None)?;
            m.ioctl(h, PerfIoctl::QueryBpf)
        }),
    ];
    // Every sample_type bit alone, on a counting event, then every branch_sample_type bit
    // alone under PERF_SAMPLE_BRANCH_STACK: docs/attributes.md says why each gets what it gets.
    for (i, name) in SAMPLE_TYPE_BITS.iter().enumerate() {
        let bit = 1 << i;
        cases.push(case(
            format!("PERF_SAMPLE_{name} (counting)"),
            sample_type_want(name),
            move |m| m.try_attr(with_sample_bit(m.good(), bit)),
        ));
    }
    for (i, name) in BRANCH_SAMPLE_BITS.iter().enumerate() {
        let bit = 1 << i;
        cases.push(case(
            format!("PERF_SAMPLE_BRANCH_STACK with PERF_SAMPLE_BRANCH_{name}"),
            BRANCH_BIT_WANT,
            move |m| {
                m.try_attr(PerfAttr {
                    sample_type: SAMPLE_BRANCH_STACK,
                    branch_sample_type: bit,
                    ..m.good()
                })
            },
        ));
    }
    // Offline CPUs: the last CPU of the domain that can go offline.
    if let Some((d, cpus)) = device
        .domains
        .iter()
        .enumerate()
        .find(|(_, c)| c.len() >= 2 && !c.contains(&0))
    {
        let cpu = *cpus.last().expect("two CPUs");
        let cpus = cpus.clone();
        cases.push(case(
            format!("cpu {cpu} offline, its own domain's PMU"),
            "opened",
            move |m| {
                m.g.set_online(cpu, false)?;
                let opened = m.open(m.attr(d, Event::MbmTotalBytes, 1), -1, cpu as i32, None, 0);
                m.g.set_online(cpu, true)?;
                Ok(outcome(&opened?))
            },
        ));
        cases.push(case(
            format!("cpu {cpu} offline, domain 0's PMU"),
            "opened",
            move |m| {
                m.g.set_online(cpu, false)?;
                let opened = m.open(m.good(), -1, cpu as i32, None, 0);
                m.g.set_online(cpu, true)?;
                Ok(outcome(&opened?))
            },
        ));
        cases.push(case(
            format!("all of domain {d}'s CPUs offline (parked)"),
            "ENODEV",
            move |m| {
                for &c in &cpus {
                    m.g.set_online(c, false)?;
                }
                let opened = m.open(m.attr(d, Event::MbmTotalBytes, 1), -1, 0, None, 0);
                for &c in &cpus {
                    m.g.set_online(c, true)?;
                }
                Ok(outcome(&opened?))
            },
        ));
    }
    cases
}

/// The matrix as a check of its own (what a driver mutant can name).
pub fn check(ctx: &mut Ctx) -> Result<Check> {
    let arch = ctx.g.vm.arch;
    run(ctx.g, &mut ctx.control, &ctx.device, &ctx.types, arch)
}

/// Runs every case; the driver must be loaded.
fn run(
    g: &mut Guest,
    control: &mut ControlClient,
    device: &DeviceConfig,
    types: &[u32],
    arch: Arch,
) -> Result<Check> {
    let cases = cases(device, arch);
    let mut m = Matrix {
        g,
        control,
        types: types.to_vec(),
        open: Vec::new(),
    };
    let mut problems = Vec::new();
    for case in &cases {
        let got = (case.run)(&mut m);
        m.close_all()?;
        match got {
            Ok(got) if got == case.want => {}
            Ok(got) => problems.push(match case.why {
                None => format!("{}: {got}, expected {}", case.name, case.want),
                Some(why) => format!("{}: {got}, expected {} ({why})", case.name, case.want),
            }),
            Err(e) => problems.push(format!("{}: could not run: {e:#}", case.name)),
        }
    }
    let passed = cases.len() - problems.len();
    Ok(Check::from_problems(
        "perf_event_open matrix",
        problems,
        format!("{passed} of {} cases: attr fields and flags, every sample_type and branch_sample_type bit, pid/cpu, PERF_FLAG_*, groups, read_format, ioctls, offline CPUs", cases.len()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_matrix_has_at_least_forty_distinct_cases() {
        let cases = cases(&DeviceConfig::default(), Arch::X86_64);
        assert!(cases.len() >= 40, "{} cases", cases.len());
        let mut names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), cases.len(), "case names repeat");
    }

    #[test]
    fn arm64_answers_otherwise_only_where_its_kernel_does_each_with_why() {
        let x86 = cases(&DeviceConfig::default(), Arch::X86_64);
        let arm64 = cases(&DeviceConfig::default(), Arch::Arm64);
        assert_eq!(x86.len(), arm64.len());
        assert!(x86.iter().all(|c| c.why.is_none()));
        let differ: Vec<(&str, &str, &str)> = x86
            .iter()
            .zip(&arm64)
            .filter(|(x, a)| x.want != a.want || a.why.is_some())
            .map(|(x, a)| {
                assert_eq!(x.name, a.name);
                assert!(
                    a.why.is_some_and(|w| !w.is_empty()),
                    "{}: no reason",
                    a.name
                );
                (x.name.as_str(), x.want.as_str(), a.want.as_str())
            })
            .collect();
        assert_eq!(
            differ,
            [(
                "PERF_SAMPLE_REGS_USER with XMM0 (an extended register)",
                "EOPNOTSUPP",
                "EINVAL"
            )]
        );
    }

    /// docs/attributes.md's tables give every bit the outcome its case expects, so the page
    /// cannot drift from the check.
    #[test]
    fn the_docs_give_every_bit_its_outcome() {
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap();
        let docs = std::fs::read_to_string(repo.join("docs/attributes.md")).unwrap();
        let has_row = |bit: usize, name: &str, want: &str| {
            let row = format!("| {bit} | `{name}` | {want} |");
            assert!(
                docs.lines().any(|l| l.starts_with(&row)),
                "docs/attributes.md has no row {row:?}"
            );
        };
        for (bit, name) in SAMPLE_TYPE_BITS.iter().enumerate() {
            has_row(bit, &format!("PERF_SAMPLE_{name}"), sample_type_want(name));
        }
        for (bit, name) in BRANCH_SAMPLE_BITS.iter().enumerate() {
            has_row(bit, &format!("PERF_SAMPLE_BRANCH_{name}"), BRANCH_BIT_WANT);
        }
    }
}
