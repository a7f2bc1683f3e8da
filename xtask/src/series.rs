//! `cargo xtask series`: the kernel series of `images/kernel/patches/` as
//! a reviewer receives it, checked patch by patch. Each prefix must apply
//! to the base without offset or fuzz, each patch must be numbered in the
//! series' order and named in the cover letter's shortlog, and
//! `checkpatch.pl --strict` of the base tree may report no error but the
//! missing Signed-off-by (whoever posts the series adds it) and no warning
//! but the MAINTAINERS reminder for a file an existing entry covers. With
//! `--build`, every prefix must also build the guest's kernel. The series
//! and its cover letter, with the table, go into the run folder.

use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::build::image::arch::Arch;
use crate::build::image::kernel::{self, Kernel, Variant};
use crate::cmd::Step;
use crate::host::config::new_run_dir;
use crate::progress::human;

#[derive(clap::Args, Debug, Default)]
pub struct SeriesArgs {
    /// Also build the guest's kernel (x86, the normal configuration) at
    /// every prefix: the base first, then one incremental build after each
    /// patch (a whole kernel build for the base; not yet timed over the
    /// series).
    #[arg(long)]
    pub build: bool,
}

/// The checkpatch report whoever posts the series clears by adding theirs.
const SIGNED_OFF_BY: &str = "Missing Signed-off-by: line(s)";
/// The reminder checkpatch gives for every new file, whether or not an
/// entry of MAINTAINERS already covers it (the cover letter says which).
const MAINTAINERS_REMINDER: &str =
    "added, moved or deleted file(s), does MAINTAINERS need updating?";
/// The cover letter's placeholder for this command's table.
const TABLE_MARK: &str = "@SERIES_TABLE@";

/// What checkpatch reported on one patch, each as its message line.
#[derive(Debug, Default, PartialEq)]
struct Checkpatch {
    errors: Vec<String>,
    warnings: Vec<String>,
    checks: Vec<String>,
}

impl Checkpatch {
    /// Reads checkpatch's report (its default format, `-q`).
    fn parse(report: &str) -> Checkpatch {
        let mut found = Checkpatch::default();
        for line in report.lines() {
            if let Some(m) = line.strip_prefix("ERROR: ") {
                found.errors.push(m.to_string());
            } else if let Some(m) = line.strip_prefix("WARNING: ") {
                found.warnings.push(m.to_string());
            } else if let Some(m) = line.strip_prefix("CHECK: ") {
                found.checks.push(m.to_string());
            }
        }
        found
    }

    /// The reports that fail the series: every error but the missing
    /// Signed-off-by, every warning but the MAINTAINERS reminder.
    fn blocking(&self) -> Vec<String> {
        let errors = self
            .errors
            .iter()
            .filter(|m| *m != SIGNED_OFF_BY)
            .map(|m| format!("ERROR: {m}"));
        let warnings = self
            .warnings
            .iter()
            .filter(|m| *m != MAINTAINERS_REMINDER)
            .map(|m| format!("WARNING: {m}"));
        errors.chain(warnings).collect()
    }

    /// The table's cell: what is left once the Signed-off-by is added.
    fn summary(&self) -> String {
        let errors = self.errors.iter().filter(|m| *m != SIGNED_OFF_BY).count();
        let mut cell = format!(
            "{errors} errors, {} warnings, {} checks",
            self.warnings.len(),
            self.checks.len()
        );
        let reminders = self
            .warnings
            .iter()
            .filter(|m| *m == MAINTAINERS_REMINDER)
            .count();
        if reminders > 0 {
            let _ = write!(cell, " ({reminders} the MAINTAINERS reminder)");
        }
        cell
    }
}

/// One patch's verdict.
struct Verdict {
    file: String,
    /// What is wrong with it: numbering, application, cover letter,
    /// checkpatch's blocking reports, the build.
    problems: Vec<String>,
    checkpatch: Checkpatch,
    /// Whether it applied to its prefix without offset or fuzz.
    exact: bool,
    /// How long its prefix took to build (`--build`).
    built_in: Option<Duration>,
}

/// The subject of a `git format-patch` file, its continuation lines joined.
fn subject_of(patch: &str) -> Option<String> {
    let mut lines = patch.lines();
    let first = lines.find_map(|l| l.strip_prefix("Subject: "))?;
    let mut subject = first.to_string();
    for more in lines.take_while(|l| l.starts_with(' ')) {
        subject.push_str(more);
    }
    Some(subject)
}

/// Splits `[PATCH k/n] title` into (k, n, title).
fn numbered(subject: &str) -> Option<(usize, usize, &str)> {
    let rest = subject.strip_prefix("[PATCH ")?;
    let (numbers, title) = rest.split_once("] ")?;
    let (k, n) = numbers.split_once('/')?;
    Some((k.parse().ok()?, n.parse().ok()?, title))
}

/// Whether `patch -p1`'s output shows a hunk that did not apply exactly
/// where the patch says.
fn applied_inexactly(output: &str) -> Option<&str> {
    output
        .lines()
        .find(|l| l.contains("with fuzz") || l.contains("(offset") || l.contains("FAILED"))
}

pub fn run(ws: &Path, args: &SeriesArgs) -> Result<bool> {
    let patches = kernel::patches_in(ws, "patches")?;
    if patches.is_empty() {
        bail!("images/kernel/patches/ holds no *.patch: there is no series");
    }
    let letter_path = kernel::images_dir(ws).join("series-cover-letter.txt");
    let letter = fs::read_to_string(&letter_path)
        .with_context(|| format!("reading the cover letter {}", letter_path.display()))?;
    let mut letter_problems = Vec::new();
    match subject_of(&letter).as_deref().and_then(numbered) {
        Some((0, n, _)) if n == patches.len() => {}
        _ => letter_problems.push(format!(
            "its subject is not `[PATCH 00/{}] title`: {:?}",
            patches.len(),
            subject_of(&letter).unwrap_or_default()
        )),
    }
    let run_dir = new_run_dir(ws, "series");
    let step = Step::start(
        "unpacking the base for the series",
        &run_dir.join("series.log"),
    )?;
    let tree = run_dir.join("linux");
    kernel::unpack_source(&step, &run_dir.join("unpack"), &tree)?;
    let base = kernel::base()?;
    if args.build {
        let fragments = kernel::fragment_paths(ws, Variant::Normal, Arch::X86_64);
        kernel::configure(&step, Arch::X86_64, &tree, &fragments)?;
    }
    let checked = (|| -> Result<_> {
        let base_build = if args.build {
            Some(build_prefix(&step, &tree).context("building the base, before any patch")?)
        } else {
            None
        };
        let mut verdicts = Vec::new();
        for (index, path) in patches.iter().enumerate() {
            verdicts.push(check_patch(
                &step,
                &tree,
                path,
                index + 1,
                patches.len(),
                &letter,
                args.build,
            )?);
        }
        Ok((base_build, verdicts))
    })();
    // The unpacked tree is a few hundred MiB (a few GiB built), also when a
    // patch does not apply: what is worth keeping is the series and its log.
    fs::remove_dir_all(&tree).with_context(|| format!("removing {}", tree.display()))?;
    let (base_build, verdicts) = checked?;
    step.finish();
    let table = table(&verdicts, &base, base_build);
    print!("{table}");
    let out = run_dir.join("patches");
    write_series(&out, &patches, &letter, &table)?;
    let failed = verdicts.iter().filter(|v| !v.problems.is_empty()).count()
        + usize::from(!letter_problems.is_empty());
    if !letter_problems.is_empty() {
        println!(
            "the cover letter ({}):\n  {}",
            letter_path.display(),
            letter_problems.join("\n  ")
        );
    }
    for v in verdicts.iter().filter(|v| !v.problems.is_empty()) {
        println!("{}:\n  {}", v.file, v.problems.join("\n  "));
    }
    println!(
        "the series with its cover letter: {}\nseries: {} patches and the cover letter, {}",
        out.display(),
        verdicts.len(),
        if failed == 0 {
            "every one as a reviewer should receive it".to_string()
        } else {
            format!("{failed} of them FAILED")
        }
    );
    Ok(failed == 0)
}

/// Applies the patch at `path`, number `number` of `total`, onto the tree
/// of its prefix, and judges it.
fn check_patch(
    step: &Step,
    tree: &Path,
    path: &Path,
    number: usize,
    total: usize,
    letter: &str,
    build: bool,
) -> Result<Verdict> {
    let file = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut problems = Vec::new();
    let subject = subject_of(&text).unwrap_or_default();
    match numbered(&subject) {
        Some((k, n, title)) => {
            if (k, n) != (number, total) {
                problems.push(format!(
                    "numbered [PATCH {k}/{n}], but it is patch {number} of {total}"
                ));
            }
            if !letter.contains(title) {
                problems.push(format!("the cover letter's shortlog lacks {title:?}"));
            }
        }
        None => problems.push(format!(
            "its subject {subject:?} is not `[PATCH k/n] title` (git format-patch --numbered)"
        )),
    }
    let applied = Command::new("patch")
        .args(["-p1", "--forward", "--batch", "--fuzz=0", "-d"])
        .arg(tree)
        .arg("-i")
        .arg(path)
        .output()
        .context("running patch")?;
    let output = String::from_utf8_lossy(&applied.stdout).into_owned()
        + &String::from_utf8_lossy(&applied.stderr);
    let mut log = fs::OpenOptions::new().append(true).open(step.log())?;
    writeln!(log, "\n$ patch -p1 --fuzz=0 -i {file}\n{output}")?;
    if !applied.status.success() {
        bail!("{file} does not apply to its prefix:\n{output}");
    }
    let inexact = applied_inexactly(&output);
    if let Some(line) = inexact {
        problems.push(format!("applies to its prefix only inexactly: {line}"));
    }
    let report = Command::new("perl")
        .arg(tree.join("scripts/checkpatch.pl"))
        .args(["--strict", "-q"])
        .arg(path)
        .current_dir(tree)
        .output()
        .context("running scripts/checkpatch.pl")?;
    let checkpatch = Checkpatch::parse(&String::from_utf8_lossy(&report.stdout));
    problems.extend(checkpatch.blocking());
    let built_in = if build {
        match build_prefix(step, tree) {
            Ok(took) => Some(took),
            Err(e) => {
                problems.push(format!("its prefix does not build: {e:#}"));
                None
            }
        }
    } else {
        None
    };
    Ok(Verdict {
        exact: inexact.is_none(),
        file,
        problems,
        checkpatch,
        built_in,
    })
}

/// One incremental build of the tree as it is now: the configuration
/// brought up to date (a patch may add an option), then the kernel.
fn build_prefix(step: &Step, tree: &Path) -> Result<Duration> {
    let started = Instant::now();
    step.run(Kernel::make_for(tree, Arch::X86_64)?.arg("olddefconfig"))?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    step.run(
        Kernel::make_for(tree, Arch::X86_64)?
            .arg(format!("-j{jobs}"))
            .arg("vmlinux"),
    )?;
    Ok(started.elapsed())
}

fn table(verdicts: &[Verdict], base: &str, base_build: Option<Duration>) -> String {
    let mut out = format!("Checked by `cargo xtask series` against {base}:\n");
    if let Some(took) = base_build {
        let _ = writeln!(out, "  the base builds ({})", human(took));
    }
    for v in verdicts {
        let number = v.file.get(..4).unwrap_or(&v.file);
        let verdict = if v.problems.is_empty() {
            "ok"
        } else {
            "FAILED"
        };
        let built = v
            .built_in
            .map_or(String::new(), |t| format!(", builds ({})", human(t)));
        let _ = writeln!(
            out,
            "  {number}  {verdict:6}  applies {}, checkpatch --strict: {}{built}",
            if v.exact { "exactly" } else { "inexactly" },
            v.checkpatch.summary()
        );
    }
    out
}

/// The series as `git send-email` would take it: the cover letter as
/// `0000-cover-letter.patch`, its table filled in, then the patches.
fn write_series(out: &Path, patches: &[PathBuf], letter: &str, table: &str) -> Result<()> {
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let filled = if letter.contains(TABLE_MARK) {
        letter.replace(TABLE_MARK, table.trim_end())
    } else {
        format!("{letter}\n{table}")
    };
    fs::write(out.join("0000-cover-letter.patch"), filled)?;
    for patch in patches {
        let name = patch.file_name().context("a patch has a name")?;
        fs::copy(patch, out.join(name)).with_context(|| format!("copying {}", patch.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpatch_blocks_on_anything_but_the_signed_off_by_and_the_maintainers_reminder() {
        let report = "\
WARNING: added, moved or deleted file(s), does MAINTAINERS need updating?
#10: 
new file mode 100644

CHECK: extern prototypes should be avoided in .h files
#203: FILE: include/linux/perf_event.h:1334:

ERROR: Missing Signed-off-by: line(s)

total: 1 errors, 1 warnings, 1 checks, 657 lines checked
";
        let found = Checkpatch::parse(report);
        assert_eq!(found.errors, [SIGNED_OFF_BY]);
        assert_eq!(found.checks.len(), 1);
        assert!(found.blocking().is_empty(), "{:?}", found.blocking());
        assert_eq!(
            found.summary(),
            "0 errors, 1 warnings, 1 checks (1 the MAINTAINERS reminder)"
        );
        let long = Checkpatch::parse(
            "WARNING: line length of 104 exceeds 100 columns\nERROR: Missing Signed-off-by: line(s)\n\
             ERROR: trailing whitespace\n",
        );
        assert_eq!(
            long.blocking(),
            [
                "ERROR: trailing whitespace",
                "WARNING: line length of 104 exceeds 100 columns"
            ]
        );
    }

    #[test]
    fn a_subject_is_numbered_and_its_continuation_joined() {
        let patch = "From 0 Mon Sep 17 00:00:00 2001\nSubject: [PATCH 17/17] perf/core: Bring a sibling's times up to date before it\n leads itself\nMIME-Version: 1.0\n";
        let subject = subject_of(patch).unwrap();
        assert_eq!(
            numbered(&subject),
            Some((
                17,
                17,
                "perf/core: Bring a sibling's times up to date before it leads itself"
            ))
        );
        assert_eq!(numbered("perf/core: Add PERF_PMU_SCOPE_DEVICE"), None);
        assert_eq!(numbered("[PATCH] perf/core: Add it"), None);
    }

    #[test]
    fn an_offset_or_fuzz_is_an_inexact_application() {
        assert_eq!(
            applied_inexactly("patching file kernel/events/core.c\n"),
            None
        );
        let offset =
            "patching file kernel/events/core.c\nHunk #2 succeeded at 1290 (offset 4 lines).\n";
        assert_eq!(
            applied_inexactly(offset),
            Some("Hunk #2 succeeded at 1290 (offset 4 lines).")
        );
        assert!(applied_inexactly("Hunk #1 succeeded at 10 with fuzz 1.\n").is_some());
    }
}
