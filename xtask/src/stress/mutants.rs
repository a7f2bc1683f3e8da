//! Planted bugs ("mutants"), kept as plain files, each a deliberately wrong
//! variant that a short lifecycle stress must catch:
//! - `guest-driver/mutants/<name>.patch`: the driver, `patch -p1` from the
//!   repository root (a module rebuild: cheap, `cargo xtask test` runs them);
//! - `images/kernel/mutants/<name>.patch`: the kernel, applied after the
//!   series and the testbed's patches; `images/kernel/mutants/<name>.series`:
//!   the patches to apply instead of both (the seed as posted), one a line,
//!   each a file relative to `images/kernel/` or the name of one of them;
//!   `#` starts a comment. Each is a kernel build: run on demand only.
//!
//! A patch file may start with lines of prose (`#` comments: what bug it
//! plants, which check must catch it): `patch` skips them.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Where a mutant lives, and so what it costs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MutantKind {
    Driver,
    KernelPatch,
    KernelSeries,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mutant {
    pub name: String,
    pub kind: MutantKind,
    pub file: PathBuf,
}

impl Mutant {
    /// The lifecycle seed that catches it, if its file names one on a line
    /// `# Lifecycle seed: N` (the seed whose first operations reach the
    /// bug's state; without one, the table's common seed).
    pub fn seed(&self) -> Result<Option<u64>> {
        let text = fs::read_to_string(&self.file)
            .with_context(|| format!("reading {}", self.file.display()))?;
        lifecycle_seed(&text).with_context(|| format!("{}", self.file.display()))
    }

    /// Whether its lifecycle run has a moving thread (`--moving-thread`):
    /// its file says so on a line `# Lifecycle moving thread: on`.
    pub fn moving_thread(&self) -> Result<bool> {
        let text = fs::read_to_string(&self.file)
            .with_context(|| format!("reading {}", self.file.display()))?;
        lifecycle_moving_thread(&text).with_context(|| format!("{}", self.file.display()))
    }

    /// The `cargo xtask run` check its file names on a line `# Must be
    /// caught by the check "NAME" ...`: the runner runs that check on the
    /// mutant's guest before the random operations.
    pub fn run_check(&self) -> Result<Option<String>> {
        let text = fs::read_to_string(&self.file)
            .with_context(|| format!("reading {}", self.file.display()))?;
        Ok(named_run_check(&text))
    }

    /// The series patches it undoes part of: the subjects its file names on
    /// lines `# Undoes: SUBJECT` (`cargo xtask series` shows the check it
    /// names as what those patches turn green).
    pub fn undoes(&self) -> Result<Vec<String>> {
        let text = fs::read_to_string(&self.file)
            .with_context(|| format!("reading {}", self.file.display()))?;
        Ok(undone_subjects(&text))
    }

    /// The first line of its file (without a comment's `#`): what it plants.
    pub fn summary(&self) -> String {
        let text = fs::read_to_string(&self.file).unwrap_or_default();
        let first = text.lines().next().unwrap_or_default();
        first.trim_start_matches('#').trim().to_string()
    }
}

/// The seed of a `# Lifecycle seed: N` line among a patch's leading
/// comment lines.
fn lifecycle_seed(text: &str) -> Result<Option<u64>> {
    for line in text.lines().take_while(|l| l.starts_with('#')) {
        if let Some(rest) = line
            .trim_start_matches('#')
            .trim()
            .strip_prefix("Lifecycle seed:")
        {
            let seed = rest.trim();
            return seed
                .parse()
                .map(Some)
                .with_context(|| format!("\"Lifecycle seed: {seed}\" is not a number"));
        }
    }
    Ok(None)
}

/// Whether a `# Lifecycle moving thread: on` line (or `off`) is among a
/// patch's leading comment lines.
fn lifecycle_moving_thread(text: &str) -> Result<bool> {
    for line in text.lines().take_while(|l| l.starts_with('#')) {
        if let Some(rest) = line
            .trim_start_matches('#')
            .trim()
            .strip_prefix("Lifecycle moving thread:")
        {
            return match rest.trim() {
                "on" => Ok(true),
                "off" => Ok(false),
                other => bail!("\"Lifecycle moving thread: {other}\": want on or off"),
            };
        }
    }
    Ok(false)
}

/// The NAME of a `# Must be caught by the check "NAME"` line among a
/// patch's leading comment lines.
fn named_run_check(text: &str) -> Option<String> {
    const PREFIX: &str = "Must be caught by the check \"";
    text.lines()
        .take_while(|l| l.starts_with('#'))
        .find_map(|line| {
            let rest = line.trim_start_matches('#').trim().strip_prefix(PREFIX)?;
            Some(rest.split('"').next()?.to_string())
        })
}

/// The SUBJECTs of `# Undoes: SUBJECT` lines among a mutant's leading
/// comment lines.
fn undone_subjects(text: &str) -> Vec<String> {
    text.lines()
        .take_while(|l| l.starts_with('#'))
        .filter_map(|line| {
            let subject = line
                .trim_start_matches('#')
                .trim()
                .strip_prefix("Undoes:")?;
            Some(subject.trim().to_string())
        })
        .collect()
}

const DRIVER_DIR: &str = "guest-driver/mutants";
const KERNEL_DIR: &str = "images/kernel/mutants";

/// Every mutant of the workspace, driver ones first, each group by name.
pub fn all(ws: &Path) -> Result<Vec<Mutant>> {
    let mut out = Vec::new();
    for (dir, ext, kind) in [
        (DRIVER_DIR, "patch", MutantKind::Driver),
        (KERNEL_DIR, "patch", MutantKind::KernelPatch),
        (KERNEL_DIR, "series", MutantKind::KernelSeries),
    ] {
        let Ok(entries) = fs::read_dir(ws.join(dir)) else {
            continue;
        };
        let mut found: Vec<Mutant> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == ext))
            .filter_map(|p| {
                Some(Mutant {
                    name: p.file_stem()?.to_str()?.to_string(),
                    kind: kind.clone(),
                    file: p,
                })
            })
            .collect();
        found.sort_by(|a, b| a.name.cmp(&b.name));
        out.extend(found);
    }
    Ok(out)
}

/// The mutant called `name`.
pub fn find(ws: &Path, name: &str) -> Result<Mutant> {
    let all = all(ws)?;
    let names: Vec<&str> = all.iter().map(|m| m.name.as_str()).collect();
    let found = all.iter().find(|m| m.name == name).cloned();
    found.with_context(|| {
        format!(
            "no mutant {name:?} (in {DRIVER_DIR}/ or {KERNEL_DIR}/); there are: {}",
            names.join(", ")
        )
    })
}

/// A copy of `guest-driver/` with the driver mutant applied, under
/// `target/mutants/<name>/` (made afresh each time): the folder to build
/// perfbed.ko from.
pub fn driver_tree(ws: &Path, mutant: &Mutant) -> Result<PathBuf> {
    if mutant.kind != MutantKind::Driver {
        bail!("{} is a kernel mutant", mutant.name);
    }
    let root = ws.join("target").join("mutants").join(&mutant.name);
    if root.exists() {
        fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
    }
    let sources = ws.join("guest-driver");
    for file in crate::build::cache::files_below(&sources)? {
        let rel = file.strip_prefix(ws).expect("below the workspace");
        let to = root.join(rel);
        fs::create_dir_all(to.parent().expect("a file has a parent"))?;
        fs::copy(&file, &to).with_context(|| format!("copying {}", file.display()))?;
    }
    apply(&root, &mutant.file)?;
    Ok(root.join("guest-driver"))
}

/// `patch -p1` of `patch` in `root`; a patch that does not apply is an
/// error that says so (a mutant written against an older driver).
fn apply(root: &Path, patch: &Path) -> Result<()> {
    let input = fs::File::open(patch).with_context(|| format!("opening {}", patch.display()))?;
    let out = Command::new("patch")
        .args([
            "-p1",
            "--batch",
            "--forward",
            "--no-backup-if-mismatch",
            "-d",
        ])
        .arg(root)
        .stdin(input)
        .output()
        .context("running patch (install it: apt-get install patch)")?;
    if !out.status.success() {
        bail!(
            "{} does not apply to the driver as it is now (refresh the mutant):\n{}{}",
            patch.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The kernel patch list a kernel mutant asks for, given the series
/// (`series`: the series' patches then the testbed's, in order, below
/// `kernel_dir`, which is `images/kernel/`): for a `.patch`, those then the
/// mutant; for a `.series`, its lines in order (a line that is neither a
/// file nor one of those patches is an error).
pub fn kernel_patches(
    mutant: &Mutant,
    series: &[PathBuf],
    kernel_dir: &Path,
) -> Result<Vec<PathBuf>> {
    match mutant.kind {
        MutantKind::Driver => bail!("{} is a driver mutant", mutant.name),
        MutantKind::KernelPatch => Ok(series
            .iter()
            .cloned()
            .chain([mutant.file.clone()])
            .collect()),
        MutantKind::KernelSeries => {
            let text = fs::read_to_string(&mutant.file)
                .with_context(|| format!("reading {}", mutant.file.display()))?;
            let wanted: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .collect();
            let mut out = Vec::new();
            for name in &wanted {
                let file = kernel_dir.join(name);
                if file.is_file() {
                    out.push(file);
                    continue;
                }
                let found = series
                    .iter()
                    .find(|p| p.file_name().is_some_and(|f| f == *name));
                out.push(found.cloned().with_context(|| {
                    format!("{}: no patch {name} in the series", mutant.file.display())
                })?);
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("perfbed-mutants-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_mutant_names_its_seed_in_its_leading_comments_only() {
        let with = "# Planted.\n# Lifecycle seed: 3\n--- a/x\n";
        assert_eq!(lifecycle_seed(with).unwrap(), Some(3));
        assert_eq!(
            lifecycle_seed("# Planted.\n--- a/x\n+# Lifecycle seed: 4\n").unwrap(),
            None
        );
        assert!(lifecycle_seed("# Lifecycle seed: three\n").is_err());
    }

    #[test]
    fn a_mutant_asks_for_a_moving_thread_in_its_leading_comments_only() {
        let on = "# Planted.\n# Lifecycle moving thread: on\n--- a/x\n";
        assert!(lifecycle_moving_thread(on).unwrap());
        assert!(!lifecycle_moving_thread("# Lifecycle moving thread: off\n").unwrap());
        assert!(!lifecycle_moving_thread("# Planted.\n--- a/x\n").unwrap());
        assert!(
            !lifecycle_moving_thread("# Planted.\n--- a/x\n+# Lifecycle moving thread: on\n")
                .unwrap()
        );
        assert!(lifecycle_moving_thread("# Lifecycle moving thread: yes\n").is_err());
    }

    /// A kernel series naming a patch or shim that was renamed or removed fails here, not after
    /// the minutes of unpacking a kernel for `stress --mutant` (whether the files still apply is
    /// only known to that build).
    #[test]
    fn a_mutant_names_the_patches_it_undoes_in_its_leading_comments_only() {
        let text = "# Planted.\n# Undoes: perf/core: Add it\n#   Undoes: rust: perf: Bind it \n--- a/x\n# Undoes: not this\n";
        assert_eq!(
            undone_subjects(text),
            ["perf/core: Add it", "rust: perf: Bind it"]
        );
        assert!(undone_subjects("# Planted.\n--- a/x\n").is_empty());
    }

    #[test]
    fn every_kernel_series_of_the_repository_names_files_that_exist() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let kernel_dir = repo.join("images/kernel");
        let series = crate::build::image::kernel::patches(repo).unwrap();
        let lists: Vec<Mutant> = all(repo)
            .unwrap()
            .into_iter()
            .filter(|m| m.kind == MutantKind::KernelSeries)
            .collect();
        assert!(!lists.is_empty(), "no kernel series in {KERNEL_DIR}");
        for mutant in &lists {
            let chosen = kernel_patches(mutant, &series, &kernel_dir)
                .unwrap_or_else(|e| panic!("{}: {e:#}", mutant.name));
            assert!(!chosen.is_empty(), "{} lists no patch", mutant.name);
        }
    }

    #[test]
    fn a_mutant_names_its_run_check_in_its_leading_comments_only() {
        let with = "# Planted.\n# Must be caught by the check \"mixed group after a move\" of `cargo xtask run`\n--- a/x\n";
        assert_eq!(
            named_run_check(with).as_deref(),
            Some("mixed group after a move")
        );
        let later = "# Planted.\n--- a/x\n+# Must be caught by the check \"parking\"\n";
        assert_eq!(named_run_check(later), None);
    }

    /// Every check a kernel mutant of the repository names is one that can
    /// run on its own: a misspelt name would fail only minutes into a
    /// kernel build and a boot.
    #[test]
    fn every_check_a_mutant_names_runs_on_its_own() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut named = 0;
        for mutant in all(repo).unwrap() {
            if let Some(check) = mutant.run_check().unwrap() {
                assert!(
                    crate::checks::pmu::can_run_alone(&check).unwrap(),
                    "{} names {check:?}, which does not run on its own",
                    mutant.name
                );
                named += 1;
            }
        }
        assert!(named >= 4, "only {named} mutants name a check");
    }

    /// The mutants no scenario catches yet, each with what a scenario
    /// would need: the runner step or attribute it lacks.
    const NOT_YET_SCENARIOS: &[(&str, &str)] = &[
        (
            "branch-stack-accepted",
            "an open attribute for sample_type and branch_sample_type, and the model refusing it with EINVAL",
        ),
        (
            "parked-pmu-rotated",
            "a line that reads which CPUs have a perf mux timer armed (the guest's /proc/timer_list): undone, the rule changed no count or time that nine park scenarios with contention judge",
        ),
        (
            "sibling-open-fails-where-its-group-left",
            "a line that opens siblings in a loop inside the guest while a move runs: its race window is microseconds of a move, which thousands of opens meet a few times and a scenario's host-driven opens, one a line, almost never",
        ),
    ];

    /// Every mutant names, as the check that must catch it, a scenario of
    /// the library (judged by the model), or is one of
    /// [`NOT_YET_SCENARIOS`], which says what it waits for (issue 34 item 5).
    #[test]
    fn every_mutant_is_caught_by_a_scenario_or_says_why_not() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let library = crate::stress::lifecycle::scenario_guest::library().unwrap();
        let mut waiting = Vec::new();
        for mutant in all(repo).unwrap() {
            let check = mutant.run_check().unwrap();
            let scenario = check
                .as_deref()
                .is_some_and(|c| library.iter().any(|s| s.check == c));
            let why = NOT_YET_SCENARIOS.iter().find(|(n, _)| *n == mutant.name);
            match (scenario, why) {
                (true, Some(_)) => panic!(
                    "{} names the scenario {check:?}: take it off NOT_YET_SCENARIOS",
                    mutant.name
                ),
                (false, None) => panic!(
                    "{} names {check:?}, which is no scenario of scenarios/",
                    mutant.name
                ),
                (false, Some(_)) => waiting.push(mutant.name),
                (true, None) => {}
            }
        }
        assert_eq!(
            waiting.len(),
            NOT_YET_SCENARIOS.len(),
            "NOT_YET_SCENARIOS names a mutant that is gone: {waiting:?}"
        );
    }

    /// A driver change that breaks a mutant's context fails here, at once, rather than in the
    /// `driver_mutants` VM test minutes later (a merge once left one mutant unappliable).
    #[test]
    fn every_driver_mutant_of_the_repository_applies_to_its_driver() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let ws = scratch("repo");
        for file in crate::build::cache::files_below(&repo.join("guest-driver")).unwrap() {
            let to = ws.join(file.strip_prefix(repo).unwrap());
            fs::create_dir_all(to.parent().unwrap()).unwrap();
            fs::copy(&file, &to).unwrap();
        }
        let drivers: Vec<Mutant> = all(&ws)
            .unwrap()
            .into_iter()
            .filter(|m| m.kind == MutantKind::Driver)
            .collect();
        assert!(
            !drivers.is_empty(),
            "no driver mutants found in {DRIVER_DIR}"
        );
        for mutant in &drivers {
            if let Err(e) = driver_tree(&ws, mutant) {
                panic!("{}: {e:#}", mutant.name);
            }
        }
        fs::remove_dir_all(&ws).unwrap();
    }

    #[test]
    fn mutants_are_found_by_kind_and_a_driver_mutant_is_applied_to_a_copy() {
        let ws = scratch("ws");
        fs::create_dir_all(ws.join(DRIVER_DIR)).unwrap();
        fs::create_dir_all(ws.join(KERNEL_DIR)).unwrap();
        fs::write(
            ws.join("guest-driver/driver.rs"),
            "fn a() {}\nfn b() { 1 }\n",
        )
        .unwrap();
        let patch = "# Planted bug: b gives 2.\n\n--- a/guest-driver/driver.rs\n+++ b/guest-driver/driver.rs\n@@ -1,2 +1,2 @@\n fn a() {}\n-fn b() { 1 }\n+fn b() { 2 }\n";
        fs::write(ws.join(DRIVER_DIR).join("two.patch"), patch).unwrap();
        fs::write(
            ws.join(KERNEL_DIR).join("seed.series"),
            "# as posted\n0001-a.patch\nmutants/seed/shim.patch\n",
        )
        .unwrap();
        fs::create_dir_all(ws.join(KERNEL_DIR).join("seed")).unwrap();
        fs::write(ws.join(KERNEL_DIR).join("seed/shim.patch"), "").unwrap();
        fs::write(ws.join(KERNEL_DIR).join("README.md"), "not a mutant").unwrap();
        let all = all(&ws).unwrap();
        assert_eq!(
            all.iter()
                .map(|m| (m.name.as_str(), m.kind.clone()))
                .collect::<Vec<_>>(),
            vec![
                ("two", MutantKind::Driver),
                ("seed", MutantKind::KernelSeries)
            ]
        );
        assert_eq!(all[0].summary(), "Planted bug: b gives 2.");
        let tree = driver_tree(&ws, &all[0]).unwrap();
        assert_eq!(
            fs::read_to_string(tree.join("driver.rs")).unwrap(),
            "fn a() {}\nfn b() { 2 }\n"
        );
        assert_eq!(
            fs::read_to_string(ws.join("guest-driver/driver.rs")).unwrap(),
            "fn a() {}\nfn b() { 1 }\n",
            "the work tree is untouched"
        );
        // Applied again to a changed driver, it says it does not apply.
        fs::write(
            ws.join("guest-driver/driver.rs"),
            "fn a() {}\nfn b() { 3 }\n",
        )
        .unwrap();
        let e = driver_tree(&ws, &all[0]).unwrap_err();
        assert!(format!("{e:#}").contains("does not apply"), "{e:#}");
        let series = vec![
            PathBuf::from("p/0001-a.patch"),
            PathBuf::from("p/0002-b.patch"),
        ];
        let kernel_dir = ws.join("images/kernel");
        let chosen = kernel_patches(&all[1], &series, &kernel_dir).unwrap();
        assert_eq!(
            chosen,
            vec![
                PathBuf::from("p/0001-a.patch"),
                kernel_dir.join("mutants/seed/shim.patch")
            ]
        );
        fs::write(ws.join(KERNEL_DIR).join("bad.series"), "0003-none.patch\n").unwrap();
        let bad = find(&ws, "bad").unwrap();
        assert!(kernel_patches(&bad, &series, &kernel_dir).is_err());
        assert!(find(&ws, "nope").is_err());
        fs::remove_dir_all(&ws).unwrap();
    }
}
