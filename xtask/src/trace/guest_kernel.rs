//! The guest kernel's own view of a run on the timeline: ftrace's CPU
//! hotplug tracepoints (`cpuhp_enter`, `cpuhp_multi_enter`, `cpuhp_exit`)
//! and a kprobe on the perf core's device-scope placement
//! (`perf_device_set_cpu`, the one function every move, park and placement
//! goes through), recorded in the guest from boot to the trace's save.
//!
//! ftrace stamps them with `trace_clock` set to `mono`, which is
//! `CLOCK_MONOTONIC`, the clock the agent stamps its own events with, so the
//! agent's clock sync ([`ClockOffset`]) puts them on the device's clock too.
//! Of the hotplug states ftrace records only those whose name says perf
//! (`/sys/devices/system/cpu/hotplug/states`: the perf core's and the x86
//! PMU's): a CPU offline and online pass about a hundred states each, which
//! would bury them and fill the buffer of a long run.

use std::time::Duration;

use anyhow::{bail, Result};
use perfbed_agent::{AgentMessage, HostRequest};

use super::guest::ClockOffset;
use crate::build::image::arch::Arch;
use crate::host::vm::Vm;

const TRACEFS: &str = "/sys/kernel/tracing";
const BUSYBOX: &str = "/bin/busybox";
/// The kprobe on the placement: the PMU and the CPU it gets (-1: parked);
/// x86-64 passes the first two arguments in rdi and rsi, arm64 in x0 and
/// x1. The function is also called for PMUs that stay where they are;
/// [`lines`] keeps only the calls that change a PMU's CPU.
fn placement_probe(arch: Arch) -> &'static str {
    match arch {
        Arch::X86_64 => "p:perfbed/device_set_cpu perf_device_set_cpu pmu=%di:x64 to=%si:s32",
        Arch::Arm64 => "p:perfbed/device_set_cpu perf_device_set_cpu pmu=%x0:x64 to=%x1:s32",
    }
}

/// Turns the recording on. A kprobe that cannot be placed (the compiler
/// inlined the function) leaves the hotplug states alone; what was turned
/// on is returned for the run's log.
pub fn start(vm: &mut Vm, timeout: Duration) -> Result<String> {
    let probe = placement_probe(vm.arch);
    let script = format!(
        "set -e; t={TRACEFS}; [ -e $t/trace ] || {BUSYBOX} mount -t tracefs nodev $t; \
         echo 0 > $t/tracing_on; echo > $t/trace; echo mono > $t/trace_clock; \
         echo 2048 > $t/buffer_size_kb; \
         f=$({BUSYBOX} awk -F': ' '/perf/ {{ printf \"%s%d\", (n++ ? \" || idx == \" : \"idx == \"), $1 }}' \
           /sys/devices/system/cpu/hotplug/states); \
         for e in cpuhp_enter cpuhp_multi_enter cpuhp_exit; do \
           [ -z \"$f\" ] || echo \"$f\" > $t/events/cpuhp/$e/filter; echo 1 > $t/events/cpuhp/$e/enable; done; \
         probe=' (perf_device_set_cpu cannot be probed)'; \
         if echo '{probe}' >> $t/kprobe_events 2>/dev/null; then \
           echo 1 > $t/events/perfbed/device_set_cpu/enable; probe=' and the placement kprobe'; fi; \
         echo 1 > $t/tracing_on; echo \"cpuhp tracepoints of states $f$probe\""
    );
    let argv = [BUSYBOX, "sh", "-c", &script].map(String::from).to_vec();
    match vm.request(&HostRequest::Run { argv }, timeout)? {
        AgentMessage::Ran {
            status: Some(0),
            stdout,
            ..
        } => Ok(stdout.trim().to_string()),
        AgentMessage::Ran { status, stderr, .. } => {
            bail!(
                "turning the guest's tracing on exited {status:?}: {}",
                stderr.trim()
            )
        }
        other => bail!("turning the guest's tracing on: {other:?}"),
    }
}

/// What ftrace recorded so far (the whole buffer, read without consuming).
pub fn collect(vm: &mut Vm, timeout: Duration) -> Result<String> {
    match vm.request(
        &HostRequest::ReadFile {
            path: format!("{TRACEFS}/trace"),
        },
        timeout,
    )? {
        AgentMessage::Text { text } => Ok(text),
        other => bail!("reading the guest's ftrace buffer: {other:?}"),
    }
}

/// One record of ftrace's text output: its time in ns, the CPU it ran on,
/// the event's name and what follows it.
struct Record<'a> {
    ns: u64,
    ran_on: u32,
    event: &'a str,
    fields: &'a str,
}

/// `comm-pid [cpu] flags secs.micros: event: fields`; a comm may hold
/// spaces, so the record is read from the `[cpu]` on.
fn record(line: &str) -> Option<Record<'_>> {
    if line.starts_with('#') {
        return None;
    }
    let open = line.find(" [")?;
    let rest = &line[open + 2..];
    let close = rest.find(']')?;
    let ran_on = rest[..close].trim().parse().ok()?;
    let rest = &rest[close + 1..];
    let colon = rest.find(": ")?;
    let stamp = rest[..colon].split_whitespace().last()?;
    let (secs, frac) = stamp.split_once('.')?;
    let digits = frac.len().min(9);
    let frac_ns: u64 = frac[..digits].parse::<u64>().ok()? * 10u64.pow(9 - digits as u32);
    let ns = secs
        .parse::<u64>()
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(frac_ns)?;
    let (event, fields) = rest[colon + 2..].split_once(':')?;
    Some(Record {
        ns,
        ran_on,
        event: event.trim(),
        fields: fields.trim(),
    })
}

/// `key: value` pairs as ftrace prints them (`cpu: 0003 target:   0`),
/// with the callback in brackets as `fn`.
fn pairs(fields: &str) -> Vec<(String, String)> {
    let (head, callback) = match fields.rsplit_once(" (") {
        Some((head, tail)) => (head, tail.strip_suffix(')')),
        None => (fields, None),
    };
    let mut out = Vec::new();
    let mut words = head.split_whitespace().peekable();
    while let Some(word) = words.next() {
        if let Some(key) = word.strip_suffix(':') {
            if let Some(value) = words.next() {
                out.push((key.to_string(), value.trim_start_matches('0').to_string()));
            }
        } else if let Some((key, value)) = word.split_once('=') {
            out.push((key.to_string(), value.to_string()));
        }
    }
    for (_, v) in out.iter_mut() {
        if v.is_empty() {
            *v = "0".into();
        }
    }
    if let Some(callback) = callback {
        // `%ps` of a module's function is `name [module]`.
        let name = callback.split(['+', ' ']).next().unwrap_or(callback);
        out.push(("fn".into(), name.into()));
    }
    out
}

/// The recorded records as `guest_kernel` trace lines on the device's
/// clock: the hotplug states and each placement that changed a PMU's CPU.
pub fn lines(ftrace: &str, offset: ClockOffset) -> Vec<String> {
    // Each PMU's CPU as the last placement left it.
    let mut placed: Vec<(String, String)> = Vec::new();
    let mut out = Vec::new();
    for record in ftrace.lines().filter_map(record) {
        let mut fields = pairs(record.fields);
        let field = |fields: &[(String, String)], k: &str| {
            fields
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let keep = match record.event {
            "cpuhp_enter" | "cpuhp_multi_enter" | "cpuhp_exit" => true,
            "device_set_cpu" => {
                let (pmu, to) = (field(&fields, "pmu"), field(&fields, "to"));
                let changed = match placed.iter_mut().find(|(p, _)| *p == pmu) {
                    Some((_, cpu)) if *cpu == to => false,
                    Some((_, cpu)) => {
                        *cpu = to.clone();
                        true
                    }
                    None => {
                        placed.push((pmu, to.clone()));
                        true
                    }
                };
                // The lane is the domain of the CPU the PMU gets, or for a
                // park of the CPU that parked it (an offline's runs on the
                // CPU going down).
                let cpu = if to.starts_with('-') {
                    record.ran_on.to_string()
                } else {
                    to
                };
                fields.retain(|(k, _)| k != "cpu" && k != "pmu");
                fields.insert(0, ("cpu".into(), cpu));
                fields.push(("ran_on".into(), record.ran_on.to_string()));
                changed
            }
            _ => false,
        };
        if !keep {
            continue;
        }
        let body: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out.push(format!(
            "{:>12} - guest_kernel event={} {} guest_ns={}",
            offset.device_time(record.ns),
            record.event,
            body.join(" "),
            record.ns
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FTRACE: &str = "\
# tracer: nop
#
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
#              | |         |   |||||     |         |
    perfbed agent-61      [000] .....    12.000001: cpuhp_enter: cpu: 0003 target:   0 step: 213 (perf_event_exit_cpu)
    perfbed agent-61      [000] .....    12.000200: sched_switch: prev_comm=x prev_pid=1
    perfbed agent-61      [000] .....    12.000300: cpuhp_multi_enter: cpu: 0003 target:   0 step: 180 (perfbed_cpu_offline [perfbed])
    perfbed agent-61      [000] .....    12.000400: device_set_cpu: (perf_device_set_cpu+0x0/0x90) pmu=0xffff888003a1c000 to=2
    perfbed agent-61      [000] .....    12.000450: device_set_cpu: (perf_device_set_cpu+0x0/0x90) pmu=0xffff888003a1c000 to=2
    perfbed agent-61      [000] .....    12.000460: device_set_cpu: (perf_device_set_cpu+0x0/0x90) pmu=0xffff888003a1d000 to=0
    perfbed agent-61      [000] .....    12.000500: cpuhp_exit:  cpu: 0003  state: 179 step: 180 ret: 0
         cpuhp/3-27      [003] .....    12.000600: device_set_cpu: (perf_device_set_cpu+0x0/0x90) pmu=0xffff888003a1c000 to=-1
    perfbed agent-61      [000] .....    12.000700: cpuhp_exit:  cpu: 0003  state: 212 step: 213 ret: 0
";

    #[test]
    fn perf_states_and_placements_become_guest_kernel_lines() {
        let lines = lines(FTRACE, ClockOffset(1_000));
        let bodies: Vec<&str> = lines
            .iter()
            .map(|l| l.split_once(" - ").unwrap().1)
            .collect();
        assert_eq!(
            bodies,
            [
                "guest_kernel event=cpuhp_enter cpu=3 target=0 step=213 fn=perf_event_exit_cpu guest_ns=12000001000",
                "guest_kernel event=cpuhp_multi_enter cpu=3 target=0 step=180 fn=perfbed_cpu_offline guest_ns=12000300000",
                "guest_kernel event=device_set_cpu cpu=2 to=2 ran_on=0 guest_ns=12000400000",
                "guest_kernel event=device_set_cpu cpu=0 to=0 ran_on=0 guest_ns=12000460000",
                "guest_kernel event=cpuhp_exit cpu=3 state=179 step=180 ret=0 guest_ns=12000500000",
                "guest_kernel event=device_set_cpu cpu=3 to=-1 ran_on=3 guest_ns=12000600000",
                "guest_kernel event=cpuhp_exit cpu=3 state=212 step=213 ret=0 guest_ns=12000700000",
            ]
        );
        // On the device's clock: guest time plus the offset.
        assert_eq!(lines[0].split_whitespace().next(), Some("12000002000"));
    }

    #[test]
    fn garbage_and_headers_give_no_lines() {
        let text = "# tracer: nop\nnot a record\n x [zz] 1.5: cpuhp_enter: cpu: 1\n";
        assert!(lines(text, ClockOffset(0)).is_empty());
    }
}
