//! A typed client of the guest agent: the requests the scenarios make, each
//! with the answer it expects turned into a plain Rust result, and the names
//! perfbed.ko gives things in the guest.

pub mod perf_abi;

use std::time::Duration;

use anyhow::{bail, Context, Result};
use perfbed_agent::{
    AgentMessage, BpfRead, HostRequest, PerfAttr, PerfIoctl, PerfOp, PerfOpResult,
};
use perfbed_device::cpus::parse_cpu_list;

use crate::host::vm::Vm;

/// The driver's module name.
pub const MODULE: &str = "perfbed";

/// The PMU perfbed.ko registers for `domain`.
pub fn pmu_name(domain: usize) -> String {
    format!("perfbed_l3_{domain}")
}

pub struct Guest<'a> {
    pub vm: &'a mut Vm,
    pub timeout: Duration,
}

/// What perf_event_open gave: a handle, or the errno's name ("EBUSY").
pub type Opened = std::result::Result<u32, String>;

impl Guest<'_> {
    pub fn ask(&mut self, request: HostRequest) -> Result<AgentMessage> {
        self.vm.request(&request, self.timeout)
    }

    pub fn expect_done(&mut self, request: HostRequest) -> Result<()> {
        match self.ask(request.clone())? {
            AgentMessage::Done => Ok(()),
            other => bail!("{request:?}: {other:?}"),
        }
    }

    pub fn read_file(&mut self, path: &str) -> Result<String> {
        match self.ask(HostRequest::ReadFile { path: path.into() })? {
            AgentMessage::Text { text } => Ok(text.trim().to_string()),
            other => bail!("reading {path}: {other:?}"),
        }
    }

    /// A count in one of a device-scope PMU's sysfs files (`open_waits`,
    /// `move_max_ns`, `lost_wraps`, `irqs_on_owner`, ...).
    pub fn pmu_count(&mut self, pmu: &str, file: &str) -> Result<u64> {
        let path = format!("/sys/bus/event_source/devices/{pmu}/{file}");
        let text = self.read_file(&path)?;
        text.parse()
            .with_context(|| format!("{path}: {text:?} is not a count"))
    }

    /// A device-scope PMU's sysfs `open_waits` and `open_retries` (patch
    /// 0006): what CPU hotplug cost its opens inside the kernel.
    pub fn open_waits_and_retries(&mut self, pmu: &str) -> Result<(u64, u64)> {
        Ok((
            self.pmu_count(pmu, "open_waits")?,
            self.pmu_count(pmu, "open_retries")?,
        ))
    }

    /// The CPUs in a PMU's `cpumask` file (empty while parked).
    pub fn cpumask(&mut self, pmu: &str) -> Result<Vec<u32>> {
        let text = self.read_file(&format!("/sys/bus/event_source/devices/{pmu}/cpumask"))?;
        parse_cpu_list(&text).map_err(|e| anyhow::anyhow!("{pmu}/cpumask {text:?}: {e}"))
    }

    /// Polls a PMU's `cpumask` until `ok` holds of it (30 s at most, far
    /// above what a placement takes); the mask seen last, and whether it held.
    pub fn wait_cpumask(
        &mut self,
        pmu: &str,
        ok: impl Fn(&[u32]) -> bool,
    ) -> Result<(bool, Vec<u32>)> {
        self.wait_cpumask_steady(pmu, ok, std::time::Duration::ZERO)
    }

    /// Polls a PMU's `cpumask` until `ok` has held on every read for
    /// `steady` (30 s at most): placements still under way (allowed sets the host did not
    /// wait for) can take a PMU through the mask asked for and away again
    /// within milliseconds (3, then 2, then 3), so one read that holds does
    /// not say that they are over. The mask seen last, and whether it held.
    pub fn wait_cpumask_steady(
        &mut self,
        pmu: &str,
        ok: impl Fn(&[u32]) -> bool,
        steady: std::time::Duration,
    ) -> Result<(bool, Vec<u32>)> {
        let start = std::time::Instant::now();
        let mut held_since = None;
        loop {
            let mask = self.cpumask(pmu)?;
            let now = std::time::Instant::now();
            held_since = if ok(&mask) {
                held_since.or(Some(now))
            } else {
                None
            };
            let steady_now = held_since.is_some_and(|t| now - t >= steady);
            if steady_now || start.elapsed() > std::time::Duration::from_secs(30) {
                return Ok((steady_now, mask));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    pub fn pmu_type(&mut self, pmu: &str) -> Result<u32> {
        let text = self.read_file(&format!("/sys/bus/event_source/devices/{pmu}/type"))?;
        text.parse().with_context(|| format!("{pmu}/type {text:?}"))
    }

    pub fn set_online(&mut self, cpu: u32, online: bool) -> Result<()> {
        self.expect_done(HostRequest::SetCpuOnline { cpu, online })
    }

    /// A system-wide event on `cpu` (device-scope PMUs move it to their CPU).
    pub fn open(&mut self, attr: PerfAttr, group: Option<u32>) -> Result<Opened> {
        self.open_as(attr, -1, 0, group)
    }

    pub fn open_as(
        &mut self,
        attr: PerfAttr,
        pid: i32,
        cpu: i32,
        group: Option<u32>,
    ) -> Result<Opened> {
        match self.ask(HostRequest::PerfOpen {
            attr,
            pid,
            cpu,
            group,
        })? {
            AgentMessage::PerfOpened { handle } => Ok(Ok(handle)),
            AgentMessage::Errno { name, .. } => Ok(Err(name)),
            other => bail!("perf_event_open: {other:?}"),
        }
    }

    /// perf_event_open with PERF_FLAG_* `flags` (FD_CLOEXEC is always added).
    pub fn open_flags(
        &mut self,
        attr: PerfAttr,
        pid: i32,
        cpu: i32,
        group: Option<u32>,
        flags: u64,
    ) -> Result<Opened> {
        match self.ask(HostRequest::PerfOpenFlags {
            attr,
            pid,
            cpu,
            group,
            flags,
        })? {
            AgentMessage::PerfOpened { handle } => Ok(Ok(handle)),
            AgentMessage::Errno { name, .. } => Ok(Err(name)),
            other => bail!("perf_event_open: {other:?}"),
        }
    }

    /// An ioctl on an open event: its return value, or the errno's name.
    pub fn ioctl(
        &mut self,
        handle: u32,
        ioctl: PerfIoctl,
    ) -> Result<std::result::Result<u64, String>> {
        match self.ask(HostRequest::PerfIoctl {
            handle,
            ioctl: ioctl.clone(),
        })? {
            AgentMessage::PerfValues { values } if values.len() == 1 => Ok(Ok(values[0])),
            AgentMessage::Errno { name, .. } => Ok(Err(name)),
            other => bail!("{ioctl:?} on event {handle}: {other:?}"),
        }
    }

    /// The u64 words a read() of the event gives.
    pub fn read(&mut self, handle: u32) -> Result<Vec<u64>> {
        match self.ask(HostRequest::PerfRead { handle })? {
            AgentMessage::PerfValues { values } if !values.is_empty() => Ok(values),
            other => bail!("reading event {handle}: {other:?}"),
        }
    }

    /// The words of a read() of each event, all read by one request, within
    /// microseconds of each other in the guest (the agent makes a pass that
    /// took over 0.5 ms, its vCPU preempted, again: up to 8 passes).
    pub fn read_many(&mut self, handles: &[u32]) -> Result<Vec<Vec<u64>>> {
        match self.ask(HostRequest::PerfReadMany {
            handles: handles.to_vec(),
        })? {
            AgentMessage::PerfValuesMany { values } if values.len() == handles.len() => {
                // As `read`: a read() of 0 bytes is perf's end of file for an event
                // in the error state, which no check can judge by its words.
                if let Some(i) = values.iter().position(Vec::is_empty) {
                    bail!(
                        "reading events {handles:?}: event {} read 0 bytes (perf put it in the error state: a pinned group that could not be scheduled?)",
                        handles[i]
                    );
                }
                Ok(values)
            }
            other => bail!("reading events {handles:?}: {other:?}"),
        }
    }

    /// One batch of perf operations, carried out back to back by the
    /// agent: one result each.
    pub fn perf_ops(&mut self, ops: Vec<PerfOp>) -> Result<Vec<PerfOpResult>> {
        let n = ops.len();
        match self.ask(HostRequest::PerfOps { ops })? {
            AgentMessage::PerfOps { results } if results.len() == n => Ok(results),
            other => bail!("a batch of {n} perf operations: {other:?}"),
        }
    }

    pub fn close(&mut self, handle: u32) -> Result<()> {
        self.expect_done(HostRequest::PerfClose { handle })
    }

    /// Starts the agent's BPF reader of event `handle` on the raw
    /// tracepoints `tracepoints` (see [`HostRequest::BpfReaderStart`]).
    pub fn bpf_reader_start(&mut self, handle: u32, tracepoints: &[&str]) -> Result<()> {
        self.expect_done(HostRequest::BpfReaderStart {
            handle,
            tracepoints: tracepoints.iter().map(|tp| tp.to_string()).collect(),
        })
    }

    /// The BPF reader's reads since the last drain, and how many it could
    /// not record; `stop` unloads it after.
    pub fn bpf_reader_drain(&mut self, stop: bool) -> Result<(Vec<BpfRead>, u64)> {
        match self.ask(HostRequest::BpfReaderDrain { stop })? {
            AgentMessage::BpfReads { reads, dropped } => Ok((reads, dropped)),
            other => bail!("draining the BPF reader: {other:?}"),
        }
    }

    /// Runs a program in the guest: (exit status, stdout, stderr).
    pub fn run(&mut self, argv: &[&str]) -> Result<(Option<i32>, String, String)> {
        match self.ask(HostRequest::Run {
            argv: argv.iter().map(|s| s.to_string()).collect(),
        })? {
            AgentMessage::Ran {
                status,
                stdout,
                stderr,
            } => Ok((status, stdout, stderr)),
            other => bail!("running {argv:?}: {other:?}"),
        }
    }
}
