//! The real perf tool runs in the guest: counting, and what the guest
//! kernel's tracing gives it (tracepoints as events, syscall tracing), and
//! what it must refuse on a device-scope PMU (sampling).

use std::time::Duration;

use anyhow::Result;

use super::Check;
use crate::guest::Guest;
use crate::host::vm::Vm;

const PERF: &str = "/usr/bin/perf";
const BUSYBOX: &str = "/bin/busybox";

/// perf's words for a PMU that refuses a sampling event with `EOPNOTSUPP`
/// (perf 6.1's `evsel__open_strerror`).
pub const SAMPLING_REFUSED: &str = "PMU Hardware doesn't support sampling/overflow-interrupts";
/// perf's words when the guest kernel has no eventfd (perf record's wakeup).
const NO_EVENTFD: &str = "Failed to create wakeup eventfd";

/// The real perf tool, copied into the guest with its libraries, runs.
pub fn check(vm: &mut Vm, timeout: Duration) -> Result<Check> {
    let mut guest = Guest { vm, timeout };
    let (status, _, stderr) =
        guest.run(&[PERF, "stat", "-x,", "-e", "task-clock", BUSYBOX, "true"])?;
    let passed = status == Some(0) && stderr.contains("task-clock");
    let detail = if passed {
        "`perf stat -e task-clock busybox true` runs in the guest".to_string()
    } else {
        format!("perf stat exited {status:?}: {}", stderr.trim())
    };
    Ok(Check {
        name: "perf tool",
        passed,
        detail,
    })
}

/// `perf record` of a device event reaches the PMU (the kernel has what
/// perf record needs) and the PMU refuses to sample, in perf's words for
/// its `EOPNOTSUPP`. `spec` is a perf event string (`perfbed_l3_1/...`).
pub fn record_refused(g: &mut Guest, spec: &str) -> Result<Check> {
    let (status, _, stderr) = g.run(&[
        PERF,
        "record",
        "-a",
        "-o",
        "/perf-record.data",
        "-e",
        spec,
        "--",
        BUSYBOX,
        "sleep",
        "0.3",
    ])?;
    let said = first_lines(&stderr, 3);
    let problem = if status == Some(0) {
        Some(format!("perf record of {spec} succeeded: {said}"))
    } else if stderr.contains(NO_EVENTFD) {
        Some(format!(
            "perf record never reached the PMU (no eventfd in the guest kernel): {said}"
        ))
    } else if !stderr.contains(SAMPLING_REFUSED) {
        Some(format!(
            "perf record exited {status:?} without the PMU's refusal of sampling: {said}"
        ))
    } else {
        None
    };
    Ok(Check::from_problems(
        "perf record refused",
        problem.into_iter().collect(),
        format!("`perf record -a -e {spec}` exits {status:?}: \"{SAMPLING_REFUSED}\" (the driver's EOPNOTSUPP for a sampling event)"),
    ))
}

/// `perf stat -e 'cpuhp:*' -a` counts the kernel's hotplug tracepoints
/// across `cycles` offline/online cycles of `cpu` driven by perf's own
/// workload: each operation runs at least one state's callbacks, so each of
/// `cpuhp_enter` and `cpuhp_exit` counts at least one per operation.
pub fn cpuhp_tracepoints(g: &mut Guest, cpu: u32, cycles: u32) -> Result<Check> {
    let online = format!("/sys/devices/system/cpu/cpu{cpu}/online");
    let script = (0..cycles)
        .map(|_| format!("echo 0 > {online} && echo 1 > {online}"))
        .collect::<Vec<_>>()
        .join(" && ");
    let ran = g.run(&[
        PERF, "stat", "-x,", "-a", "-e", "cpuhp:*", "--", BUSYBOX, "sh", "-c", &script,
    ]);
    // Whatever perf did, the CPU ends online for the checks that follow.
    if g.read_file(&online)? != "1" {
        g.set_online(cpu, true)?;
    }
    let (status, _, stderr) = ran?;
    let ops = u64::from(2 * cycles);
    let counts: Vec<(String, Option<u64>)> = ["cpuhp_enter", "cpuhp_multi_enter", "cpuhp_exit"]
        .iter()
        .map(|name| {
            (
                name.to_string(),
                csv_count(&stderr, &format!("cpuhp:{name}")),
            )
        })
        .collect();
    let count = |name: &str| counts.iter().find(|(n, _)| n == name).and_then(|(_, c)| *c);
    let shown = counts
        .iter()
        .map(|(n, c)| format!("{n} {}", c.map_or("-".into(), |c| c.to_string())))
        .collect::<Vec<_>>()
        .join(", ");
    let mut problems = Vec::new();
    if status != Some(0) {
        problems.push(format!(
            "perf stat exited {status:?}: {}",
            first_lines(&stderr, 3)
        ));
    }
    for name in ["cpuhp_enter", "cpuhp_exit"] {
        match count(name) {
            Some(n) if n >= ops => {}
            got => problems.push(format!(
                "cpuhp:{name} counted {got:?} over {ops} hotplug operations (want ≥ {ops})"
            )),
        }
    }
    Ok(Check::from_problems(
        "perf stat cpuhp tracepoints",
        problems,
        format!("`perf stat -a -e 'cpuhp:*'` over {cycles} offline/online cycles of CPU {cpu}: {shown} (≥ {ops} each of enter and exit)"),
    ))
}

/// `perf trace` of a small program shows its system calls (syscall
/// tracepoints, tracefs and perf 6.1's own libtraceevent).
pub fn trace(g: &mut Guest) -> Result<Check> {
    let (status, _, stderr) = g.run(&[PERF, "trace", "--", BUSYBOX, "true"])?;
    // perf trace prints one line per call, the result aligned in a column:
    // "4.2 ( 0.07 ms): busybox/56 brk()      = 0xbfcf000".
    let calls = stderr
        .lines()
        .filter(|l| {
            l.contains("busybox/") && l.split_once(')').is_some_and(|(_, r)| r.contains(" = "))
        })
        .count();
    let exited = stderr.contains("exit_group(");
    let mut problems = Vec::new();
    if status != Some(0) || calls == 0 || !exited {
        problems.push(format!(
            "perf trace exited {status:?} with {calls} system call lines (exit_group seen: {exited}): {}",
            first_lines(&stderr, 3)
        ));
    }
    Ok(Check::from_problems(
        "perf trace",
        problems,
        format!("`perf trace -- busybox true` shows its {calls} system calls, exit_group the last"),
    ))
}

/// The value of `event` in perf stat's CSV output (`value,unit,event,...`).
fn csv_count(csv: &str, event: &str) -> Option<u64> {
    csv.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(',').collect();
        (fields.get(2) == Some(&event)).then(|| fields[0].parse().ok())?
    })
}

fn first_lines(text: &str, n: usize) -> String {
    text.trim().lines().take(n).collect::<Vec<_>>().join(" | ")
}

#[cfg(test)]
mod tests {
    use super::csv_count;

    #[test]
    fn csv_counts_are_found_by_event() {
        let out = "12,,cpuhp:cpuhp_enter,100,100.00,,\n<not counted>,,cpuhp:cpuhp_exit,0,0.00,,\n";
        assert_eq!(csv_count(out, "cpuhp:cpuhp_enter"), Some(12));
        assert_eq!(csv_count(out, "cpuhp:cpuhp_exit"), None);
        assert_eq!(csv_count(out, "cpuhp:cpuhp_multi_enter"), None);
    }
}
