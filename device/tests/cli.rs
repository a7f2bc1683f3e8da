//! The `perfbed` command line: help for every command, usage errors that
//! name the flag (exit 2), socket failures that name the socket (exit 1).

use std::process::{Command, Output};

fn perfbed(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_perfbed"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn every_command_has_help() {
    let commands: &[&[&str]] = &[
        &[],
        &["ctl"],
        &["serve"],
        &["ctl", "--socket", "s", "state"],
        &["ctl", "--socket", "s", "inject"],
        &["ctl", "--socket", "s", "rate"],
        &["ctl", "--socket", "s", "occupancy"],
        &["ctl", "--socket", "s", "wait"],
        &["ctl", "--socket", "s", "reset"],
        &["ctl", "--socket", "s", "trace"],
    ];
    for command in commands {
        let mut args = command.to_vec();
        args.push("--help");
        let out = perfbed(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("Usage: perfbed"), "{args:?}: {help}");
    }
    let help =
        String::from_utf8_lossy(&perfbed(&["ctl", "--socket", "s", "rate", "--help"]).stdout)
            .into_owned();
    for flag in ["--domain", "--rmid", "--event", "--bytes-per-sec"] {
        assert!(help.contains(flag), "rate --help lacks {flag}: {help}");
    }
}

#[test]
fn usage_errors_name_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "ctl",
                "--socket",
                "s",
                "inject",
                "--domain",
                "x",
                "--rmid",
                "0",
                "--event",
                "mbm_total_bytes",
                "--bytes",
                "1",
            ],
            "--domain",
        ),
        (
            &[
                "ctl",
                "--socket",
                "s",
                "inject",
                "--domain",
                "0",
                "--rmid",
                "-1",
                "--event",
                "mbm_total_bytes",
                "--bytes",
                "1",
            ],
            "-1",
        ),
        (
            &[
                "ctl", "--socket", "s", "inject", "--domain", "0", "--rmid", "0", "--event",
                "nope", "--bytes", "1",
            ],
            "--event",
        ),
        (
            &[
                "ctl",
                "--socket",
                "s",
                "inject",
                "--domain",
                "0",
                "--rmid",
                "0",
                "--event",
                "mbm_total_bytes",
            ],
            "--bytes",
        ),
        (
            &[
                "ctl",
                "--socket",
                "s",
                "occupancy",
                "--domain",
                "0",
                "--rmid",
                "0",
                "--bytes",
                "99999999999999999999",
            ],
            "--bytes",
        ),
        (
            &["ctl", "--socket", "s", "wait", "--timeout-ms", "soon"],
            "--timeout-ms",
        ),
        (
            &["ctl", "--socket", "s", "state", "--bogus", "1"],
            "--bogus",
        ),
        (&["ctl", "state"], "--socket"),
        (&["serve"], "--socket"),
        (&["frobnicate"], "frobnicate"),
    ];
    for (args, named) in cases {
        let out = perfbed(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = stderr(&out);
        assert!(
            err.contains(named),
            "{args:?}: the error does not name {named}: {err}"
        );
    }
}

#[test]
fn a_missing_socket_is_named() {
    let path = std::env::temp_dir().join(format!("perfbed-no-such-{}.sock", std::process::id()));
    let out = perfbed(&["ctl", "--socket", path.to_str().unwrap(), "state"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("cannot connect to") && err.contains(path.to_str().unwrap()),
        "{err}"
    );
}
