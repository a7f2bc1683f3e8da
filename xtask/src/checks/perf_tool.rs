//! The real perf tool runs in the guest: counting, and what the guest
//! kernel's tracing gives it (tracepoints as events, syscall tracing), and
//! what it must refuse on a device-scope PMU (sampling); and perf's own test
//! suite, as the guest's tree ships it, on the device's PMUs.

use std::time::Duration;

use anyhow::Result;

use super::Check;
use crate::build::image::perf;
use crate::guest::Guest;
use crate::host::vm::Vm;

const PERF: &str = "/usr/bin/perf";
const BUSYBOX: &str = "/bin/busybox";

/// perf's words for a PMU that refuses a sampling event with `EOPNOTSUPP`
/// (`evsel__open_strerror`).
pub const SAMPLING_REFUSED: &str = "PMU Hardware doesn't support sampling/overflow-interrupts";
/// perf's words when the guest kernel has no eventfd (perf record's wakeup).
const NO_EVENTFD: &str = "Failed to create wakeup eventfd";

/// The perf tool built from the guest kernel's tree (its version is the
/// kernel's) runs in the guest.
pub fn check(vm: &mut Vm, timeout: Duration, kernel_release: &str) -> Result<Check> {
    let mut guest = Guest { vm, timeout };
    let (_, version, _) = guest.run(&[PERF, "--version"])?;
    let version = version.trim().to_string();
    if !perf::version_matches(&version, kernel_release) {
        return Ok(Check {
            name: "perf tool",
            passed: false,
            detail: format!(
                "the guest's perf is {version:?}, not the guest kernel's {kernel_release}"
            ),
        });
    }
    let (status, _, stderr) =
        guest.run(&[PERF, "stat", "-x,", "-e", "task-clock", BUSYBOX, "true"])?;
    let passed = status == Some(0) && stderr.contains("task-clock");
    let detail = if passed {
        format!("{version} (the guest kernel's tree): `perf stat -e task-clock busybox true` runs in the guest")
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
    let calls = stderr.lines().filter(|l| is_system_call_line(l)).count();
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

/// What a `perf test` must give in perfbed's guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Ok, every subtest but those that skip for one of these reasons
    /// (perf's words, and why that skip is right here); anything else fails
    /// the check.
    Pass(&'static [(&'static str, &'static str)]),
    /// Skipped, for the reason given (whose: perf's, the guest's or TCG's).
    Skip(&'static str),
}

/// The `perf test`s (by perf's own description) that apply to an
/// uncore-like PMU: event parsing from sysfs for every PMU, the sysfs PMU
/// format and aliases, `perf list`, `perf stat` and its output linters, and
/// an open of every PMU event. What one gives other than expected fails the
/// check, a Skip that starts to pass included, so this list stays true.
pub const PERF_TESTS: &[(&str, Expect)] = &[
    (
        "Parse event definition strings",
        Expect::Pass(&[("no aliases in sysfs", NO_SYSFS_ALIAS)]),
    ),
    ("Sysfs PMU tests", Expect::Pass(&[])),
    ("Event groups", Expect::Skip(EVENT_GROUPS_UNCORE)),
    ("perf list tests", Expect::Skip(NO_PYTHON)),
    ("perf stat tests", Expect::Pass(&[])),
    ("perf stat CSV output linter", Expect::Pass(&[])),
    ("perf stat STD output linter", Expect::Pass(&[])),
    ("perf stat JSON output linter", Expect::Skip(NO_PYTHON)),
    ("perf stat csv summary test", Expect::Pass(&[])),
    ("perf all PMU test", Expect::Pass(&[])),
];

/// perf's: "Parsing of aliased events from sysfs" applies to PMUs with a
/// sysfs `alias` file (Intel's discovered uncore PMUs).
const NO_SYSFS_ALIAS: &str =
    "perf's: the subtest needs a PMU with a sysfs alias file (Intel's discovered uncore); perfbed's have none";

/// perf's: its group test knows a fixed list of uncore PMUs (`amd_l3`,
/// `amd_df`, `uncore_imc_0`, `core_imc`, `hv_24x7`), none of them perfbed's.
const EVENT_GROUPS_UNCORE: &str =
    "perf's: the test knows only a fixed list of uncore PMUs, not perfbed's";

/// The guest's: perf's scripts check their output with Python, which the
/// guest does not carry (perf is built `NO_LIBPYTHON=1`; Python would add
/// some 30 MB to an initramfs that is loaded at every boot).
const NO_PYTHON: &str = "the guest has no Python for the script's JSON checks";

/// Where the shell tests run: busybox's applets as commands (`/bin/sh` is
/// its ash, as on Debian a POSIX shell, not bash) and `perf` on the PATH.
/// The stat linters' event check (`perf stat -e cpu-clock`) is pointed at
/// `PERFBED_EVENT`, system-wide (`-a`: a device counts no task), by a bash
/// function the `#!/bin/bash` linters inherit.
const SHELL_SETUP: &str = r#"/bin/busybox --install -s /bin 2>/dev/null
export PATH=/usr/bin:/bin
perf() {
    if [ "$1" = stat ] && [ "$2" = -e ] && [ "$3" = cpu-clock ]; then
        shift 3
        command perf stat -a -e "$PERFBED_EVENT" "$@"
    else
        command perf "$@"
    fi
}
export -f perf
"#;

/// The suites of `perf test list` ("  6: Parse event definition strings";
/// its subtests, "  6.1: ...", are not suites): (number, description).
/// Whether `line` of `perf trace` is one system call with its result, the
/// result aligned in a column: "4.2 ( 0.07 ms): busybox/56 brk()    =
/// 0xbfcf000". The thread is "COMM/TID", or ":TID/TID" when perf has not
/// learnt the command's name yet (seen under load, in the box); only the
/// traced command runs, so any thread will do.
fn is_system_call_line(line: &str) -> bool {
    let Some((_, call)) = line.split_once("): ") else {
        return false;
    };
    let Some((thread, call)) = call.split_once(' ') else {
        return false;
    };
    thread
        .rsplit_once('/')
        .is_some_and(|(_, tid)| !tid.is_empty() && tid.bytes().all(|b| b.is_ascii_digit()))
        && call.contains('(')
        && call.contains(" = ")
}

fn suites(list: &str) -> Vec<(&str, &str)> {
    list.lines()
        .filter_map(|l| {
            let (number, desc) = l.trim().split_once(": ")?;
            (!number.is_empty() && number.chars().all(|c| c.is_ascii_digit()))
                .then_some((number, desc.trim()))
        })
        .collect()
}

/// One line of `perf test`'s verdicts: ("6.2", "Ok" | "FAILED!" | "Skip" |
/// "Skip (reason)"). The description is padded to a width, then ':' and
/// the result.
fn verdict_line(line: &str) -> Option<(&str, &str)> {
    let (number, rest) = line.trim().split_once(": ")?;
    if number.is_empty() || !number.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return None;
    }
    let rest = rest.trim_end();
    let result = if let Some(at) = rest.find(": Skip") {
        &rest[at + 2..]
    } else {
        ["Ok", "FAILED!"]
            .into_iter()
            .find(|r| rest.ends_with(&format!(": {r}")))?
    };
    Some((number, result))
}

/// The verdicts in `perf test`'s output of the suite numbered `number`: its
/// own, or its subtests' (numbered below it).
fn verdicts<'a>(output: &'a str, number: &str) -> Vec<(&'a str, &'a str)> {
    let sub = format!("{number}.");
    output
        .lines()
        .filter_map(verdict_line)
        .filter(|(n, _)| *n == number || n.starts_with(&sub))
        .collect()
}

/// Whether `verdicts` are what `expect` asks; the problem if not.
fn judge(desc: &str, expect: Expect, verdicts: &[(&str, &str)]) -> Option<String> {
    if verdicts.is_empty() {
        return Some(format!("perf test printed no verdict for \"{desc}\""));
    }
    let shown = || {
        verdicts
            .iter()
            .map(|(n, r)| format!("{n}: {r}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let all = |f: &dyn Fn(&str) -> bool| verdicts.iter().all(|(_, r)| f(r));
    match expect {
        Expect::Pass(skips)
            if all(&|r| {
                r == "Ok"
                    || skips
                        .iter()
                        .any(|(reason, _)| r == format!("Skip ({reason})"))
            }) =>
        {
            None
        }
        Expect::Pass(_) => Some(format!("expected to pass: {}", shown())),
        Expect::Skip(_) if all(&|r| r.starts_with("Skip")) => None,
        Expect::Skip(why) => Some(format!("expected a skip ({why}), got: {}", shown())),
    }
}

/// perf's own test suite ([`PERF_TESTS`]) in the guest, with its shell
/// tests from the guest's tree, the linters' event a device event (`event`,
/// such as `perfbed_l3_0/mbm_total_bytes,rmid=1/`); one check per test.
pub fn perf_tests(g: &mut Guest, event: &str) -> Result<Vec<Check>> {
    let setup = format!("{SHELL_SETUP}export PERFBED_EVENT='{event}'\n");
    let (_, list, _) = g.run(&["/bin/bash", "-c", &format!("{PERF} test list 2>&1")])?;
    let suites = suites(&list);
    // By number: a suite's name selects the suite but not its subtests.
    let numbered: Vec<(&str, Expect, Option<&str>)> = PERF_TESTS
        .iter()
        .map(|(desc, expect)| {
            let number = suites.iter().find(|(_, d)| d == desc).map(|(n, _)| *n);
            (*desc, *expect, number)
        })
        .collect();
    let numbers: Vec<&str> = numbered.iter().filter_map(|(_, _, n)| *n).collect();
    let script = format!("{setup}exec {PERF} test {} 2>&1", numbers.join(" "));
    let (status, output, _) = g.run(&["/bin/bash", "-c", &script])?;
    let mut checks = Vec::new();
    for (desc, expect, number) in numbered {
        let Some(number) = number else {
            checks.push(Check::from_problems(
                desc,
                vec![format!("`perf test list` has no test \"{desc}\"")],
                String::new(),
            ));
            continue;
        };
        let found = verdicts(&output, number);
        let mut problem = judge(desc, expect, &found);
        if problem.is_some() {
            // perf's own account: the verbose run of that test alone.
            let verbose = format!("{setup}exec {PERF} test -v {number} 2>&1");
            let (_, out, _) = g.run(&["/bin/bash", "-c", &verbose])?;
            let tail: Vec<&str> = out.trim().lines().rev().take(12).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            problem = problem.map(|p| {
                format!(
                    "{p} (perf test exited {status:?}); perf test -v {number}: {}",
                    tail.join(" | ")
                )
            });
        }
        let results = found.iter().map(|(_, r)| *r).collect::<Vec<_>>().join(", ");
        let ok = match expect {
            Expect::Pass(skips) => {
                let skipped = skips
                    .iter()
                    .filter(|(reason, _)| results.contains(reason))
                    .map(|(_, why)| format!(" (skip: {why})"))
                    .collect::<String>();
                format!("perf test {number}: {results}{skipped}")
            }
            Expect::Skip(why) => format!("perf test {number}: {results} ({why})"),
        };
        checks.push(Check::from_problems(
            desc,
            problem.into_iter().collect(),
            ok,
        ));
    }
    Ok(checks)
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
    /// A system call line counts whether perf names the command or not
    /// yet (a call continued from before the name counts too); a line
    /// without a result does not.
    #[test]
    fn system_call_lines_with_and_without_the_commands_name() {
        use super::is_system_call_line;
        assert!(is_system_call_line(
            "     4.212 ( 0.070 ms): busybox/56 brk()                = 0xbfcf000"
        ));
        assert!(is_system_call_line(
            "    73.728 (50.922 ms): :63/63 brk()                    = 0x1eefb000"
        ));
        assert!(is_system_call_line(
            "         ? (         ): :63/63  ... [continued]: execve())  = 0"
        ));
        assert!(!is_system_call_line(
            "     4.212 ( 0.070 ms): busybox/56 exit_group()"
        ));
        assert!(!is_system_call_line("perf: no tracefs"));
    }

    use super::{csv_count, judge, suites, verdicts, Expect};

    #[test]
    fn csv_counts_are_found_by_event() {
        let out = "12,,cpuhp:cpuhp_enter,100,100.00,,\n<not counted>,,cpuhp:cpuhp_exit,0,0.00,,\n";
        assert_eq!(csv_count(out, "cpuhp:cpuhp_enter"), Some(12));
        assert_eq!(csv_count(out, "cpuhp:cpuhp_exit"), None);
        assert_eq!(csv_count(out, "cpuhp:cpuhp_multi_enter"), None);
    }

    #[test]
    fn perf_test_verdicts_are_read_per_test_and_subtest() {
        let list = "  6: Parse event definition strings\n  6.1: Test event parsing\n 66: Event groups\n107: perf all PMU test\n";
        assert_eq!(
            suites(list),
            vec![
                ("6", "Parse event definition strings"),
                ("66", "Event groups"),
                ("107", "perf all PMU test")
            ]
        );
        let out = "  6.1: Test event parsing                  : Ok\n  6.2: Parsing of all PMU events from sysfs: FAILED!\n 66: Event groups : Running (1 active)\n 66: Event groups : Skip (no uncore: here)\n107: perf all PMU test                       : Ok\n";
        let parse = verdicts(out, "6");
        assert_eq!(parse, vec![("6.1", "Ok"), ("6.2", "FAILED!")]);
        assert!(judge("Parse event definition strings", Expect::Pass(&[]), &parse).is_some());
        // A subtest's skip is fine only for a reason listed.
        let skipping = [("6.1", "Ok"), ("6.4", "Skip (no aliases in sysfs)")];
        assert!(judge("P", Expect::Pass(&[]), &skipping).is_some());
        assert!(judge(
            "P",
            Expect::Pass(&[("no aliases in sysfs", "why")]),
            &skipping
        )
        .is_none());
        assert!(judge("P", Expect::Pass(&[("other", "why")]), &skipping).is_some());
        let all = verdicts(out, "107");
        assert_eq!(all, vec![("107", "Ok")]);
        assert!(judge("perf all PMU test", Expect::Pass(&[]), &all).is_none());
        // A skip expected is fine; a pass where a skip was expected is not.
        let groups = verdicts(out, "66");
        assert_eq!(groups, vec![("66", "Skip (no uncore: here)")]);
        assert!(judge("Event groups", Expect::Skip("why"), &groups).is_none());
        assert!(judge("perf all PMU test", Expect::Skip("why"), &all).is_some());
        assert!(judge("perf list tests", Expect::Pass(&[]), &verdicts(out, "83")).is_some());
    }
}
