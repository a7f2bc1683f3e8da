//! The stress's requests to the guest: opens, the guest's jobs (perf stat,
//! the open-close loop), hotplug batches, and the checks of what they gave.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use perfbed_agent::{AgentMessage, HostRequest, HotplugBatchResult, JobResult, JobSpec, PerfAttr};
use perfbed_device::regs::Event;
use perfbed_device::DeviceState;

use crate::checks::Check;
use crate::guest::Guest;

pub fn open(g: &mut Guest, attr: PerfAttr, group: Option<u32>) -> Result<u32> {
    match g.open(attr.clone(), group)? {
        Ok(handle) => Ok(handle),
        Err(errno) => bail!("opening {attr:?}: {errno}"),
    }
}

/// Starts the real `perf stat -a` on `mbm_total_bytes` of `rmid` on `pmu`,
/// by name (scaled to MB) and by raw terms (bytes, exact), once it is
/// counting. Returns the job and the two event specs, for
/// [`perf_stat_counts`].
pub fn start_perf_stat(g: &mut Guest, pmu: &str, rmid: u32) -> Result<(u32, String, String)> {
    let named = format!("{pmu}/mbm_total_bytes,rmid={rmid}/");
    let raw = format!(
        "{pmu}/event={:#04x},rmid={rmid}/",
        Event::MbmTotalBytes as u64
    );
    let argv = [
        "/usr/bin/perf",
        "stat",
        "-a",
        "-x,",
        "-e",
        &named,
        "-e",
        &raw,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let job = start_job(
        g,
        JobSpec::Process {
            argv,
            perf_fds: 2,
            settle_ms: 200,
        },
    )?;
    Ok((job, named, raw))
}

pub fn start_job(g: &mut Guest, spec: JobSpec) -> Result<u32> {
    match g.ask(HostRequest::StartJob { spec: spec.clone() })? {
        AgentMessage::JobStarted { job } => Ok(job),
        other => bail!("starting {spec:?}: {other:?}"),
    }
}

/// An answer with as many op results as ops, each with one read per
/// handle. Anything else means bytes were lost between the agent and us
/// (the lost bytes of a 130 KB answer once spliced into valid JSON that
/// handed one event's reads to another), and no value in it can be trusted.
pub fn check_batch_shape(result: &HotplugBatchResult, ops: usize, handles: usize) -> Result<()> {
    if result.ops.len() != ops {
        bail!(
            "the agent's answer has {} op results for {ops} ops: the channel lost or mangled data",
            result.ops.len()
        );
    }
    if let Some((i, op)) = result
        .ops
        .iter()
        .enumerate()
        .find(|(_, op)| op.reads.len() != handles)
    {
        bail!("the agent's answer for op {i} has {} reads for {handles} events: the channel lost or mangled data", op.reads.len());
    }
    Ok(())
}

/// What CPU hotplug cost the opens inside the kernel, which user space does
/// not see: the device-scope PMUs' sysfs `open_waits` and `open_retries`
/// (patch 0006), summed over the PMUs.
#[derive(Debug, Default)]
pub struct OpenRetries {
    pub waits: u64,
    pub retries: u64,
}

pub fn kernel_open_retries(g: &mut Guest, pmus: &[String]) -> Result<OpenRetries> {
    let mut total = OpenRetries::default();
    for pmu in pmus {
        let (waits, retries) = g.open_waits_and_retries(pmu)?;
        total.waits += waits;
        total.retries += retries;
    }
    Ok(total)
}

pub fn stop_job(g: &mut Guest, job: u32, signal: i32) -> Result<JobResult> {
    match g.ask(HostRequest::StopJob {
        job,
        signal,
        timeout_ms: 20_000,
    })? {
        AgentMessage::JobDone(result) => Ok(result),
        other => bail!("stopping job {job}: {other:?}"),
    }
}

/// Opens may be refused with ENODEV while their domain is parked; EBUSY,
/// or anything else, is a failure of the kernel's retry.
pub fn open_loop_check(result: &JobResult) -> Check {
    let JobResult::OpenCloseLoop {
        attempts,
        opened,
        errors,
        read_errors,
    } = result
    else {
        return Check::from_problems(
            "open-close loop",
            vec![format!("not a loop result: {result:?}")],
            String::new(),
        );
    };
    let mut problems = Vec::new();
    let unexpected: BTreeMap<String, u64> = errors
        .iter()
        .filter(|(k, _)| k.as_str() != "ENODEV")
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    if !unexpected.is_empty() {
        problems.push(format!(
            "{attempts} opens: refused {}",
            histogram(&unexpected)
        ));
    }
    if !read_errors.is_empty() {
        problems.push(format!("reads failed: {}", histogram(read_errors)));
    }
    if *opened == 0 {
        problems.push(format!("none of {attempts} opens succeeded"));
    }
    Check::from_problems(
        "open-close loop",
        problems,
        format!(
            "{attempts} opens, {opened} opened, refused {} (ENODEV only while parked)",
            histogram(errors)
        ),
    )
}

pub fn violations_check(state: &DeviceState) -> Check {
    let problems: Vec<String> = state
        .domains
        .iter()
        .filter(|d| d.violations != 0)
        .map(|d| {
            format!(
                "domain {}: {} placement violations by vCPU {:?}",
                d.domain, d.violations, d.violations_by_vcpu
            )
        })
        .collect();
    let reads: u64 = state
        .domains
        .iter()
        .flat_map(|d| d.counter_reads_by_vcpu.values())
        .sum();
    Check::from_problems(
        "placement violations",
        problems,
        format!("0 in {reads} counter reads"),
    )
}

pub struct StatCounts {
    pub named_mb: f64,
    pub raw_bytes: u64,
    pub running_pct: Vec<f64>,
    /// The events' counted time in ns.
    pub run_ns: Vec<f64>,
}

/// perf stat's CSV (`-x,`): value,unit,event,run time,percentage running,...
/// where the event is printed as given on the command line.
pub fn perf_stat_counts(result: &JobResult, named: &str, raw: &str) -> Result<StatCounts> {
    let JobResult::Process { status, stderr, .. } = result else {
        bail!("not a process result: {result:?}")
    };
    let field = |spec: &str| -> Result<(f64, f64, f64)> {
        let line = stderr
            .lines()
            .find(|l| l.contains(&format!(",{spec},")))
            .with_context(|| format!("no line for {spec} (exit {status:?}): {}", stderr.trim()))?;
        let (head, tail) = line.split_once(&format!(",{spec},")).expect("found above");
        let value = head.split(',').next().unwrap_or("");
        let run_ns = tail.split(',').next().unwrap_or("");
        let pct = tail.split(',').nth(1).unwrap_or("");
        let value: f64 = value
            .parse()
            .with_context(|| format!("{spec}: value {value:?} in {line:?}"))?;
        let pct: f64 = pct
            .parse()
            .with_context(|| format!("{spec}: percentage {pct:?} in {line:?}"))?;
        let run_ns: f64 = run_ns
            .parse()
            .with_context(|| format!("{spec}: run time {run_ns:?} in {line:?}"))?;
        Ok((value, pct, run_ns))
    };
    let (named_mb, named_pct, named_ns) = field(named)?;
    let (raw_bytes, raw_pct, raw_ns) = field(raw)?;
    Ok(StatCounts {
        named_mb,
        raw_bytes: raw_bytes as u64,
        running_pct: vec![named_pct, raw_pct],
        run_ns: vec![named_ns, raw_ns],
    })
}

/// `{"EBUSY": 2, "ENODEV": 1}` as `EBUSY 2, ENODEV 1` (`none` when empty).
pub fn histogram(map: &BTreeMap<String, u64>) -> String {
    if map.is_empty() {
        return "none".into();
    }
    map.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_that_lost_data_is_refused() {
        use perfbed_agent::HotplugOpResult;
        let op = |reads: usize| HotplugOpResult {
            us: 1,
            writes: 1,
            error: None,
            masks: vec![],
            between: vec![],
            online: "0-3".into(),
            reads: vec![Ok(vec![1, 2, 3]); reads],
            injected: None,
        };
        let batch = |ops: Vec<HotplugOpResult>| HotplugBatchResult {
            masks_before: vec![],
            ops,
        };
        assert!(check_batch_shape(&batch(vec![op(2), op(2)]), 2, 2).is_ok());
        // Ops lost; one op's reads spliced with another's.
        assert!(check_batch_shape(&batch(vec![op(2)]), 2, 2).is_err());
        assert!(check_batch_shape(&batch(vec![op(2), op(5)]), 2, 2).is_err());
    }

    #[test]
    fn perf_stat_csv_is_parsed_and_garbage_refused() {
        let named = "perfbed_l3_1/mbm_total_bytes,rmid=3/";
        let raw = "perfbed_l3_1/event=0x02,rmid=3/";
        let stderr =
            format!("12.50,MB,{named},4000000000,100.00,,\n13107200,,{raw},4000000000,100.00,,\n");
        let result = JobResult::Process {
            status: Some(0),
            stdout: String::new(),
            stderr,
        };
        let c = perf_stat_counts(&result, named, raw).unwrap();
        assert_eq!(
            (c.named_mb, c.raw_bytes, c.running_pct.clone()),
            (12.5, 13_107_200, vec![100.0, 100.0])
        );
        let bad = JobResult::Process {
            status: Some(1),
            stdout: String::new(),
            stderr: format!("<not counted>,,{raw},0,0.00,,\n"),
        };
        assert!(perf_stat_counts(&bad, named, raw).is_err());
    }

    #[test]
    fn the_open_loop_fails_on_ebusy_and_passes_enodev() {
        let result = |errors: &[(&str, u64)]| JobResult::OpenCloseLoop {
            attempts: 100,
            opened: 90,
            errors: errors.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            read_errors: BTreeMap::new(),
        };
        assert!(open_loop_check(&result(&[("ENODEV", 10)])).passed);
        assert!(!open_loop_check(&result(&[("ENODEV", 5), ("EBUSY", 5)])).passed);
    }
}
