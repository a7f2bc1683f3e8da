//! `cargo xtask series`: the kernel series of `images/kernel/patches/` as
//! a reviewer receives it, checked patch by patch. Each prefix must apply
//! to the base without offset or fuzz, each patch must be numbered in the
//! series' order and named in the cover letter's shortlog, and
//! `checkpatch.pl --strict` of the base tree may report no error but the
//! missing Signed-off-by (whoever posts the series adds it) and no warning
//! but the MAINTAINERS reminder for a file an existing entry covers. With
//! `--build`, every prefix must also build the guest's kernel. Each patch
//! must be undone in part by a kernel mutant (its `# Undoes:` lines), whose
//! named check is what the patch turns green, or say why none undoes it;
//! `--prove` runs those mutants. The series and its cover letter, with the
//! tables, go into the run folder.

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
use crate::stress::mutants::{self, Mutant, MutantKind};

#[derive(clap::Args, Debug, Default)]
pub struct SeriesArgs {
    /// Also build the guest's kernel (x86, the normal configuration) at
    /// every prefix: the base first, then one incremental build after each
    /// patch (a whole kernel build for the base; not yet timed over the
    /// series).
    #[arg(long)]
    pub build: bool,
    /// Also prove what each patch turns green: run every kernel mutant
    /// that undoes part of a patch, or only those named (a kernel build
    /// and a lifecycle run each, its named check first, as `cargo xtask
    /// stress --mutant NAME` runs it) and show whether its check failed.
    #[arg(long, num_args = 0.., value_name = "MUTANT")]
    pub prove: Option<Vec<String>>,
}

/// The checkpatch report whoever posts the series clears by adding theirs.
const SIGNED_OFF_BY: &str = "Missing Signed-off-by: line(s)";
/// The reminder checkpatch gives for every new file, whether or not an
/// entry of MAINTAINERS already covers it (the cover letter says which).
const MAINTAINERS_REMINDER: &str =
    "added, moved or deleted file(s), does MAINTAINERS need updating?";
/// The cover letter's placeholder for this command's table.
const TABLE_MARK: &str = "@SERIES_TABLE@";
/// Why no kernel mutant undoes a patch, for each patch none does.
const WITHOUT_A_MUTANT: &str = "mutants/patches-without-a-mutant.txt";

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

/// What shows that one patch turns something green: the kernel mutants
/// that undo part of it, each with the `cargo xtask run` check that must
/// then fail (and passes on the series), or why no mutant does.
#[derive(Debug, Default, PartialEq)]
struct Proof {
    mutants: Vec<MutantProof>,
    otherwise: Option<String>,
}

#[derive(Debug, PartialEq)]
struct MutantProof {
    mutant: String,
    check: Option<String>,
    /// With `--prove`: what its run came to.
    run: Option<String>,
}

/// Each patch's proof (by title, in the series' order), from the kernel
/// mutants' `# Undoes:` lines and the reasons of [`WITHOUT_A_MUTANT`]
/// (`SUBJECT | why`, `#` comments), and what is wrong with them: a mutant
/// or a reason naming no patch of the series, a patch with both or with
/// neither.
fn proofs(titles: &[String], mutants: &[Undoing], reasons: &str) -> (Vec<Proof>, Vec<String>) {
    let mut proofs: Vec<Proof> = titles.iter().map(|_| Proof::default()).collect();
    let mut problems = Vec::new();
    let index = |subject: &str| titles.iter().position(|t| t == subject);
    for undoing in mutants {
        let name = &undoing.mutant.name;
        for subject in &undoing.undoes {
            match index(subject) {
                Some(i) => proofs[i].mutants.push(MutantProof {
                    mutant: name.clone(),
                    check: undoing.check.clone(),
                    run: None,
                }),
                None => problems.push(format!(
                    "the mutant {name} undoes {subject:?}, which is no patch of the series"
                )),
            }
        }
    }
    for line in reasons.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((subject, why)) = line.split_once(" | ") else {
            problems.push(format!(
                "{WITHOUT_A_MUTANT}: {line:?} is not `SUBJECT | why`"
            ));
            continue;
        };
        match index(subject.trim()) {
            Some(i) => proofs[i].otherwise = Some(why.trim().to_string()),
            None => problems.push(format!(
                "{WITHOUT_A_MUTANT} names {subject:?}, which is no patch of the series"
            )),
        }
    }
    for (title, proof) in titles.iter().zip(&proofs) {
        match (proof.mutants.is_empty(), &proof.otherwise) {
            (true, None) => problems.push(format!(
                "no kernel mutant undoes {title:?} (a `# Undoes:` line), and {WITHOUT_A_MUTANT} does not say why"
            )),
            (false, Some(_)) => problems.push(format!(
                "{title:?} has a kernel mutant, yet {WITHOUT_A_MUTANT} says why it has none"
            )),
            _ => {}
        }
    }
    (proofs, problems)
}

/// A kernel mutant, the subjects of the series patches it undoes part of
/// and the check it names.
struct Undoing {
    mutant: Mutant,
    undoes: Vec<String>,
    check: Option<String>,
}

/// Every kernel mutant, with what it undoes.
fn kernel_mutants(ws: &Path) -> Result<Vec<Undoing>> {
    let mut out = Vec::new();
    for mutant in mutants::all(ws)? {
        if mutant.kind == MutantKind::Driver {
            continue;
        }
        out.push(Undoing {
            undoes: mutant.undoes()?,
            check: mutant.run_check()?,
            mutant,
        });
    }
    Ok(out)
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
    let titles: Vec<String> = patches
        .iter()
        .map(|p| {
            let text = fs::read_to_string(p).unwrap_or_default();
            let subject = subject_of(&text).unwrap_or_default();
            numbered(&subject).map_or(subject.clone(), |(_, _, t)| t.to_string())
        })
        .collect();
    let kernel_mutants = kernel_mutants(ws)?;
    let reasons_path = kernel::images_dir(ws).join(WITHOUT_A_MUTANT);
    let reasons = fs::read_to_string(&reasons_path)
        .with_context(|| format!("reading {}", reasons_path.display()))?;
    let (mut proofs, proof_problems) = proofs(&titles, &kernel_mutants, &reasons);
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
    if let Some(names) = &args.prove {
        prove(ws, &kernel_mutants, names, &mut proofs)?;
    }
    let table = table(&verdicts, &base, base_build) + &green_table(&verdicts, &proofs);
    print!("{table}");
    let out = run_dir.join("patches");
    write_series(&out, &patches, &letter, &table)?;
    let unproven = proofs
        .iter()
        .flat_map(|p| &p.mutants)
        .filter(|m| m.run.as_ref().is_some_and(|r| !r.starts_with(CAUGHT)))
        .count();
    let failed = verdicts.iter().filter(|v| !v.problems.is_empty()).count()
        + usize::from(!letter_problems.is_empty())
        + usize::from(!proof_problems.is_empty())
        + unproven;
    if !proof_problems.is_empty() {
        println!(
            "what the patches turn green:\n  {}",
            proof_problems.join("\n  ")
        );
    }
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

/// How a proven mutant's run cell starts.
const CAUGHT: &str = "failed";

/// `--prove`: each kernel mutant that undoes a patch, run as `cargo xtask
/// stress --mutant NAME` runs it (its kernel built, its named check first,
/// then the lifecycle stress against the model), its verdict put in the
/// proofs of the patches it undoes.
fn prove(
    ws: &Path,
    kernel_mutants: &[Undoing],
    names: &[String],
    proofs: &mut [Proof],
) -> Result<()> {
    let undoing: Vec<&Mutant> = kernel_mutants
        .iter()
        .filter(|u| !u.undoes.is_empty())
        .map(|u| &u.mutant)
        .collect();
    if let Some(unknown) = names
        .iter()
        .find(|n| !undoing.iter().any(|m| &m.name == *n))
    {
        let known: Vec<&str> = undoing.iter().map(|m| m.name.as_str()).collect();
        bail!(
            "--prove {unknown}: no kernel mutant of that name undoes a patch; they are: {}",
            known.join(", ")
        );
    }
    for mutant in undoing
        .into_iter()
        .filter(|m| names.is_empty() || names.contains(&m.name))
    {
        let row = crate::stress::lifecycle::cli::run_mutant_as_stress_does(ws, mutant)?;
        let run = match (&row.caught_at, &row.error, row.caught_by) {
            (_, Some(e), _) => format!("NOT RUN: {}", e.lines().next().unwrap_or_default()),
            (Some(_), None, Some(by)) => format!("{CAUGHT}: \"{by}\" ({})", human(row.time)),
            (Some(n), None, None) => {
                format!(
                    "{CAUGHT}: the model, after {n} operations ({})",
                    human(row.time)
                )
            }
            (None, None, _) => format!("NOT CAUGHT ({}): {}", human(row.time), row.replay),
        };
        for proof in proofs.iter_mut() {
            for m in proof.mutants.iter_mut().filter(|m| m.mutant == mutant.name) {
                m.run = Some(run.clone());
            }
        }
    }
    Ok(())
}

/// The table of what each patch turns green.
fn green_table(verdicts: &[Verdict], proofs: &[Proof]) -> String {
    let mut out = String::from(
        "\nWhat each patch turns green: a kernel mutant undoes part of it, and the\n\
         check the mutant names must fail with it and pass on the series\n\
         (`cargo xtask series --prove [MUTANT...]`):\n",
    );
    for (v, proof) in verdicts.iter().zip(proofs) {
        let number = v.file.get(..4).unwrap_or(&v.file);
        if let Some(why) = &proof.otherwise {
            let _ = writeln!(out, "  {number}  no mutant: {why}");
        }
        for m in &proof.mutants {
            let check = m
                .check
                .as_ref()
                .map_or("the lifecycle model".to_string(), |c| format!("\"{c}\""));
            let run = m.run.as_ref().map_or(String::new(), |r| format!("; {r}"));
            let _ = writeln!(out, "  {number}  {check} (mutant {}){run}", m.mutant);
        }
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
    fn every_patch_is_proven_by_a_mutant_or_says_why_not() {
        let titles = [
            "perf/core: Fix it".to_string(),
            "rust: perf: Bind it".into(),
        ];
        let undoing = |name: &str, subject: &str, check: Option<&str>| Undoing {
            mutant: Mutant {
                name: name.to_string(),
                kind: MutantKind::KernelPatch,
                file: PathBuf::from(format!("{name}.patch")),
            },
            undoes: vec![subject.to_string()],
            check: check.map(str::to_string),
        };
        let fix = undoing("fix-undone", "perf/core: Fix it", Some("a check"));
        let reasons = "# comment\nrust: perf: Bind it | an API with no user yet\n";
        let (found, problems) = proofs(&titles, std::slice::from_ref(&fix), reasons);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(found[0].mutants[0].check.as_deref(), Some("a check"));
        assert_eq!(
            found[1].otherwise.as_deref(),
            Some("an API with no user yet")
        );

        let (_, problems) = proofs(&titles, std::slice::from_ref(&fix), "");
        assert!(problems[0].contains("does not say why"), "{problems:?}");
        let both = "perf/core: Fix it | no need\nrust: perf: Bind it | an API\n";
        let (_, problems) = proofs(&titles, std::slice::from_ref(&fix), both);
        assert!(problems[0].contains("yet"), "{problems:?}");
        let stray = undoing("stray", "perf/core: Gone", None);
        let (_, problems) = proofs(&titles, &[fix, stray], reasons);
        assert!(
            problems[0].contains("no patch of the series"),
            "{problems:?}"
        );
        let (_, problems) = proofs(&titles, &[], "rust: perf: Bind it: no bar\n");
        assert!(
            problems
                .iter()
                .any(|p| p.contains("is not `SUBJECT | why`")),
            "{problems:?}"
        );
    }

    #[test]
    fn the_repositorys_series_is_proven_patch_by_patch() {
        let ws = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let patches = kernel::patches_in(ws, "patches").unwrap();
        let titles: Vec<String> = patches
            .iter()
            .map(|p| {
                let subject = subject_of(&fs::read_to_string(p).unwrap()).unwrap();
                numbered(&subject).unwrap().2.to_string()
            })
            .collect();
        let named = kernel_mutants(ws).unwrap();
        let reasons = fs::read_to_string(kernel::images_dir(ws).join(WITHOUT_A_MUTANT)).unwrap();
        let (_, problems) = proofs(&titles, &named, &reasons);
        assert!(problems.is_empty(), "{problems:#?}");
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
