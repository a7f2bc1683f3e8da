//! The guest's initramfs: the agent as `/init`, the modules it loads, perf
//! built from the guest's tree with its shell tests, and the few nodes the
//! kernel needs before devtmpfs is mounted.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::cpio::{Archive, Kind};
use super::perf::{self, Perf};
use crate::build::cache::{Entry, Key};

const RECIPE: &str = "initramfs-5";

fn read(path: &str) -> Result<Vec<u8>> {
    fs::read(path).with_context(|| {
        format!("reading {path} for the initramfs (is its package installed? `cargo xtask deps`)")
    })
}

/// The shared libraries (and the dynamic loader) a host program needs, as
/// `ldd` resolves them; none for a static program.
fn shared_libraries(program: &str) -> Result<Vec<String>> {
    let out = std::process::Command::new("ldd")
        .arg(program)
        .output()
        .context("running ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // ldd fails on static programs ("not a dynamic executable").
        return Ok(Vec::new());
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        match path {
            Some(p) if p.starts_with('/') => libs.push(p.to_string()),
            Some("not") => bail!("{program} needs a library ldd cannot find: {}", line.trim()),
            _ => {}
        }
    }
    Ok(libs)
}

/// Where the initramfs carries the kernel's cpu-hotplug selftest.
pub const SELFTEST_IN_GUEST: &str = "usr/share/perfbed/cpu-on-off-test.sh";
/// The selftest in the kernel tree the guest is built from.
pub const SELFTEST_IN_TREE: &str = "tools/testing/selftests/cpu-hotplug/cpu-on-off-test.sh";

/// `tmp` for the scripts' `mktemp` (perf's shell tests).
const BASE_DIRS: [&str; 6] = ["dev", "proc", "sys", "tmp", "lib", "lib/modules"];

/// Host programs copied into the guest with the shared libraries they need
/// (perf, built from the guest's tree, comes the same way): a static
/// busybox for the little commands around perf (`busybox sleep`), bash for
/// the kernel's
/// selftest scripts, and util-linux's lscpu (busybox has none), so that
/// the guest's topology as a user sees it can be shown (`cargo xtask up
/// --exec /usr/bin/lscpu`; issue 18: the domains' L3s and dies). lscpu
/// adds about 130 KB and libsmartcols about 250 KB. coreutils' mktemp
/// (44 KB) for perf's shell tests: their templates end in five X's, which
/// busybox's mktemp refuses (it wants six).
pub const HOST_PROGRAMS: &[&str] = &[
    "/bin/busybox",
    "/bin/bash",
    "/usr/bin/lscpu",
    "/usr/bin/mktemp",
];

/// Returns the cached initramfs for this agent and these modules, which go
/// to `/lib/modules` for the agent to load when the host asks, these
/// scripts (guest path, host path), executable, and perf with its tests.
pub fn ensure(
    agent: &Path,
    modules: &[PathBuf],
    scripts: &[(&str, PathBuf)],
    perf: &Perf,
) -> Result<PathBuf> {
    let agent_bytes = fs::read(agent).with_context(|| format!("reading {}", agent.display()))?;
    // Files at their host paths (relative), with their contents.
    let mut files: Vec<(String, Vec<u8>, bool)> = Vec::new();
    for (guest_path, host_path) in scripts {
        let bytes =
            fs::read(host_path).with_context(|| format!("reading {}", host_path.display()))?;
        files.push((guest_path.trim_start_matches('/').to_string(), bytes, true));
    }
    for test in crate::build::cache::files_below(&perf.tests)? {
        let rel = test.strip_prefix(&perf.tests).expect("below the tests");
        let executable = fs::metadata(&test)?.permissions().mode() & 0o111 != 0;
        let bytes = fs::read(&test).with_context(|| format!("reading {}", test.display()))?;
        let guest_path = Path::new(perf::TESTS_IN_GUEST).join(rel);
        files.push((guest_path.to_string_lossy().into_owned(), bytes, executable));
    }
    let perf_binary = perf.binary.to_string_lossy();
    let programs = HOST_PROGRAMS
        .iter()
        .map(|p| (p.trim_start_matches('/'), *p))
        .chain([(perf::IN_GUEST, perf_binary.as_ref())]);
    for (guest_path, program) in programs {
        files.push((guest_path.to_string(), read(program)?, true));
        for lib in shared_libraries(program)? {
            if !files
                .iter()
                .any(|(p, _, _)| *p == lib.trim_start_matches('/'))
            {
                files.push((lib.trim_start_matches('/').to_string(), read(&lib)?, true));
            }
        }
    }
    archive(&agent_bytes, modules, files)
}

/// The arm64 guest's initramfs: the agent, the modules, busybox (a static
/// arm64 build from Debian, [`super::busybox`]) and perf (static,
/// cross-built from the guest's tree, [`perf::ensure_for`]); no bash,
/// lscpu or perf's shell tests (docs/arm64.md).
pub fn ensure_arm64(
    agent: &Path,
    modules: &[PathBuf],
    busybox: &Path,
    perf: &Perf,
) -> Result<PathBuf> {
    let agent_bytes = fs::read(agent).with_context(|| format!("reading {}", agent.display()))?;
    let busybox = fs::read(busybox).with_context(|| format!("reading {}", busybox.display()))?;
    let perf_binary =
        fs::read(&perf.binary).with_context(|| format!("reading {}", perf.binary.display()))?;
    archive(
        &agent_bytes,
        modules,
        vec![
            ("bin/busybox".to_string(), busybox, true),
            (perf::IN_GUEST.to_string(), perf_binary, true),
        ],
    )
}

/// The cached initramfs of the agent as `/init`, the modules in
/// `/lib/modules` and `files` (path, contents, executable), written if
/// missing.
fn archive(
    agent_bytes: &[u8],
    modules: &[PathBuf],
    files: Vec<(String, Vec<u8>, bool)>,
) -> Result<PathBuf> {
    let mut module_bytes = Vec::new();
    for ko in modules {
        let name = ko
            .file_name()
            .context("a module path has a file name")?
            .to_string_lossy();
        let bytes = fs::read(ko).with_context(|| format!("reading {}", ko.display()))?;
        module_bytes.push((format!("lib/modules/{name}"), bytes));
    }
    let mut key = Key::new(RECIPE);
    key.add("agent", agent_bytes);
    for (name, bytes) in &module_bytes {
        key.add(name, bytes);
    }
    for (path, bytes, _) in &files {
        key.add(path, bytes);
    }
    let entry = Entry::new("initramfs", &key)?;
    let cpio = entry.dir.join("initramfs.cpio");
    if entry.is_ready() {
        return Ok(cpio);
    }
    entry.begin()?;
    let mut archive = Archive::new();
    for dir in BASE_DIRS {
        archive.add(dir, Kind::Dir);
    }
    // The kernel opens /dev/console for init's stdio before anything mounts
    // devtmpfs; without it the agent's fatal errors would go nowhere.
    archive.add("dev/console", Kind::CharDevice { major: 5, minor: 1 });
    archive.add(
        "init",
        Kind::File {
            data: agent_bytes,
            executable: true,
        },
    );
    for (path, bytes) in &module_bytes {
        archive.add(
            path,
            Kind::File {
                data: bytes,
                executable: false,
            },
        );
    }
    let mut dirs: Vec<String> = BASE_DIRS.map(String::from).to_vec();
    for (path, bytes, executable) in &files {
        // Parents first, each once.
        let mut parent = String::new();
        for part in path
            .split('/')
            .collect::<Vec<_>>()
            .split_last()
            .map_or(&[][..], |(_, dirs)| dirs)
        {
            parent = if parent.is_empty() {
                part.to_string()
            } else {
                format!("{parent}/{part}")
            };
            if !dirs.contains(&parent) {
                archive.add(&parent, Kind::Dir);
                dirs.push(parent.clone());
            }
        }
        archive.add(
            path,
            Kind::File {
                data: bytes,
                executable: *executable,
            },
        );
    }
    fs::write(&cpio, archive.finish()).with_context(|| format!("writing {}", cpio.display()))?;
    entry.mark_ready()?;
    eprintln!("==> initramfs written: {}", cpio.display());
    Ok(cpio)
}
