//! gdb on the guest kernel and perfbed.ko, through the host's gdb stub
//! (QEMU's gdbstub, or perfbed-vmm's, natively or relayed by the box: the
//! same TCP port on 127.0.0.1 either way): the commands that attach gdb
//! with the symbols of both, and the scripted session that the
//! `gdb_session` VM tests run.
//!
//! The gdb kernel variant (`images/kernel/gdb.fragment`) has DWARF 5 for the
//! C and the Rust, kallsyms (for `/sys/module/<name>/sections/`) and the
//! kernel's gdb scripts; it is not relocatable, so vmlinux's addresses are
//! the running kernel's. A module's sections go where the module loader put
//! them, which the agent reads from sysfs once the module is loaded.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::guest::Guest;

/// QEMU's customary gdbstub port.
pub const DEFAULT_PORT: u16 = 1234;

/// The sections of a loaded module gdb needs (`.init.*` are gone by then).
const SECTIONS: &[&str] = &[".text", ".rodata", ".data", ".bss"];

/// The gdb command that attaches to the stub on `port` with vmlinux's
/// symbols, runs `commands` and lets the guest go on.
pub fn attach_command(vmlinux: &Path, port: u16, commands: &[String]) -> String {
    let mut line = format!(
        "gdb -q -iex 'add-auto-load-safe-path {}' -ex 'set pagination off' -ex 'target remote 127.0.0.1:{port}'",
        scripts_dir(vmlinux).display()
    );
    for c in commands {
        line += &format!(" -ex '{c}'");
    }
    line + &format!(" -ex continue {}", vmlinux.display())
}

/// The kernel tree whose `vmlinux-gdb.py` (the `lx-*` commands) gdb may
/// load when it opens vmlinux.
fn scripts_dir(vmlinux: &Path) -> &Path {
    vmlinux.parent().unwrap_or(Path::new("/"))
}

/// Where the guest's module `name` sits: (section, address), `.text` first.
pub fn module_sections(guest: &mut Guest<'_>, name: &str) -> Result<Vec<(String, u64)>> {
    let mut sections = Vec::new();
    for section in SECTIONS {
        let path = format!("/sys/module/{name}/sections/{section}");
        let Ok(text) = guest.read_file(&path) else {
            continue;
        };
        let address = u64::from_str_radix(text.trim_start_matches("0x"), 16)
            .with_context(|| format!("{path}: {text:?}"))?;
        sections.push((section.to_string(), address));
    }
    match sections.first() {
        Some((first, _)) if first == ".text" => Ok(sections),
        _ => bail!("/sys/module/{name}/sections/.text is missing: is the module loaded, and the kernel built with kallsyms?"),
    }
}

/// `add-symbol-file` for a module loaded at `sections`.
pub fn add_symbol_file(ko: &Path, sections: &[(String, u64)]) -> String {
    let mut line = format!("add-symbol-file {}", ko.display());
    for (i, (name, address)) in sections.iter().enumerate() {
        if i == 0 {
            line += &format!(" {address:#x}");
        } else {
            line += &format!(" -s {name} {address:#x}");
        }
    }
    line
}

/// Reads the module's sections, writes `add-symbol-file` into
/// `run_dir/<name>.gdb` and prints how to use it.
pub fn announce_module(
    guest: &mut Guest<'_>,
    name: &str,
    ko: &Path,
    vmlinux: &Path,
    port: u16,
    run_dir: &Path,
) -> Result<PathBuf> {
    let sections = module_sections(guest, name)?;
    let script = run_dir.join(format!("{name}.gdb"));
    fs::write(&script, add_symbol_file(ko, &sections) + "\n")?;
    println!(
        "==> {name}.ko is loaded at {:#x}; in gdb (Ctrl-C first):",
        sections[0].1
    );
    println!("      source {}\n      continue", script.display());
    println!(
        "    or attach afresh:\n      {}",
        attach_command(vmlinux, port, &[format!("source {}", script.display())])
    );
    Ok(script)
}

/// A gdb in batch mode running `script` against the stub; its output lines
/// arrive on the returned channel as they come.
pub struct BatchGdb {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    transcript: Vec<String>,
    /// When the script's ready mark came, and how long after it the first
    /// stop's backtrace (`#0 ...`) did.
    ready_at: Option<std::time::Instant>,
    pub first_stop_after: Option<Duration>,
}

impl BatchGdb {
    pub fn start(vmlinux: &Path, script: &Path) -> Result<BatchGdb> {
        let mut child = Command::new("gdb")
            .args(["-q", "-batch", "-nx", "-iex"])
            .arg(format!(
                "add-auto-load-safe-path {}",
                scripts_dir(vmlinux).display()
            ))
            .arg("-x")
            .arg(script)
            .arg(vmlinux)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting gdb (Debian's gdb package; `cargo xtask deps` installs it)")?;
        let (tx, lines) = mpsc::channel();
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child.stderr.take().map(|s| Box::new(s) as _),
        ]
        .into_iter()
        .flatten()
        {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(BatchGdb {
            child,
            lines,
            transcript: Vec::new(),
            ready_at: None,
            first_stop_after: None,
        })
    }

    fn note(&mut self, line: String) {
        let now = std::time::Instant::now();
        if line.contains(READY_MARK) {
            self.ready_at.get_or_insert(now);
        }
        if line.starts_with("#0") && self.first_stop_after.is_none() {
            self.first_stop_after = self.ready_at.map(|t| now - t);
        }
        self.transcript.push(line);
    }

    /// Waits for a line containing `needle`.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(needle);
                    self.note(line);
                    if found {
                        return Ok(());
                    }
                }
                Err(_) => bail!(
                    "gdb did not print {needle:?} within {timeout:?}; it said:\n{}",
                    self.transcript.join("\n")
                ),
            }
        }
    }

    /// Waits for gdb to end; returns everything it printed.
    pub fn finish(&mut self, timeout: Duration) -> Result<String> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            while let Ok(line) = self.lines.try_recv() {
                self.note(line);
            }
            if let Some(status) = self.child.try_wait()? {
                std::thread::sleep(Duration::from_millis(50));
                while let Ok(line) = self.lines.try_recv() {
                    self.note(line);
                }
                let text = self.transcript.join("\n");
                if !status.success() {
                    bail!("gdb exited with {status}:\n{text}");
                }
                return Ok(text);
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                bail!(
                    "gdb did not finish within {timeout:?}:\n{}",
                    self.transcript.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for BatchGdb {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What the scripted session stops in: perfbed.ko's `read` callback (its
/// `kernel::perf::Pmu::read`, which perf calls to update a count; the module's
/// crate is `driver`), then the C glue that reads a register through the
/// driver's `ioremap` mapping.
const READ_CALLBACK: &str = " as kernel::perf::Pmu>::read";
const REGISTER_READ: &str = "perfbed_readq";
/// What `x/gx` at the mapping's start must show: `REG_MAGIC`.
const MAGIC_TEXT: &str = "0x0044454246524550";
/// What the script echoes once its breakpoint is set, before it continues.
const READY_MARK: &str = "PERFBED-GDB-READY";

/// What the scripted session saw.
pub struct Session {
    /// Everything gdb printed.
    pub output: String,
    /// From gdb's `continue` (the script's ready mark) to the breakpoint's
    /// backtrace: perf's start, the guest reaching the callback, the stop,
    /// and gdb reading the stack.
    pub to_breakpoint: Option<Duration>,
}

/// The scripted gdb session of the `gdb_session` VM tests, on a booted
/// guest whose host serves gdb on `port`: load perfbed.ko, attach gdb in batch
/// mode with its symbols, break in its read callback, run the real `perf
/// stat` so that it is hit, print the backtrace, read `REG_MAGIC` through
/// the driver's mapping, detach, and let perf finish. Returns gdb's output.
pub fn scripted_session(
    guest: &mut Guest<'_>,
    vmlinux: &Path,
    ko: &Path,
    port: u16,
    run_dir: &Path,
) -> Result<Session> {
    guest.expect_done(perfbed_agent::HostRequest::LoadModule {
        name: crate::guest::MODULE.into(),
    })?;
    let sections = module_sections(guest, crate::guest::MODULE)?;
    let (callback, offset) = read_callback_symbol(ko)?;
    // By address: the name is a Rust v0 mangled one, the offset is exact.
    let at = sections[0].1 + offset;
    let script = run_dir.join("session.gdb");
    let commands = [
        "set pagination off".to_string(),
        "set confirm off".into(),
        format!("target remote 127.0.0.1:{port}"),
        add_symbol_file(ko, &sections),
        format!("echo breaking in {callback}\\n"),
        format!("break *{at:#x}"),
        format!("echo {READY_MARK}\\n"),
        "continue".into(),
        "bt".into(),
        format!("break {REGISTER_READ}"),
        "continue".into(),
        "echo PERFBED-REGISTER\\n".into(),
        // The glue's C has no debug info: its first argument, the mapping's
        // address, is in rdi (x86-64 calling convention).
        "x/gx $rdi".into(),
        "delete".into(),
        "detach".into(),
    ];
    fs::write(&script, commands.join("\n") + "\n")?;
    let mut gdb = BatchGdb::start(vmlinux, &script)?;
    gdb.wait_for(READY_MARK, Duration::from_secs(120))?;
    // gdb continues the guest now. perf stat -I reads the count while the
    // event runs, which calls the PMU's read (a final read after disabling
    // would not): that hits the breakpoint.
    let perf = [
        "/usr/bin/perf",
        "stat",
        "-a",
        "-x,",
        "-I",
        "200",
        "-e",
        "perfbed_l3_0/mbm_total_bytes,rmid=3/",
        "/bin/busybox",
        "sleep",
        "1",
    ];
    let (status, _, stderr) = guest.run(&perf)?;
    let output = gdb.finish(Duration::from_secs(60))?;
    fs::write(run_dir.join("gdb.log"), &output)?;
    let mut problems = Vec::new();
    if status != Some(0) || !stderr.contains("perfbed_l3_0") {
        problems.push(format!("perf stat exited {status:?}: {}", stderr.trim()));
    }
    let backtrace: Vec<&str> = output.lines().filter(|l| l.starts_with('#')).collect();
    if !backtrace
        .first()
        .is_some_and(|l| l.contains("DomainPmu") && l.contains("read"))
    {
        problems.push(format!(
            "the backtrace does not start in perfbed.ko's read callback: {backtrace:?}"
        ));
    }
    let register = output.split("PERFBED-REGISTER").nth(1).unwrap_or("");
    if !register.contains(MAGIC_TEXT) {
        problems.push(format!(
            "x/gx at the mapping did not show REG_MAGIC {MAGIC_TEXT}"
        ));
    }
    if !problems.is_empty() {
        bail!("{}\n--- gdb ---\n{output}", problems.join("\n"));
    }
    Ok(Session {
        output,
        to_breakpoint: gdb.first_stop_after,
    })
}

/// The linkage name of perfbed.ko's read callback (the one function whose
/// demangled name is `<... as kernel::perf::Pmu>::read`) and its offset in
/// `.text`.
fn read_callback_symbol(ko: &Path) -> Result<(String, u64)> {
    let out = Command::new("nm")
        .arg("--defined-only")
        .arg(ko)
        .output()
        .context("running nm")?;
    let demangled = Command::new("nm")
        .args(["--defined-only", "--demangle"])
        .arg(ko)
        .output()
        .context("running nm")?;
    let raw = String::from_utf8_lossy(&out.stdout);
    let nice = String::from_utf8_lossy(&demangled.stdout);
    let found: Vec<(String, u64)> = raw
        .lines()
        .zip(nice.lines())
        .filter(|(_, n)| n.ends_with(READ_CALLBACK))
        .filter_map(|(r, _)| {
            let mut words = r.split_whitespace();
            let offset = u64::from_str_radix(words.next()?, 16).ok()?;
            let kind = words.next()?;
            let name = words.next()?;
            matches!(kind, "t" | "T").then(|| (name.to_string(), offset))
        })
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!(
            "perfbed.ko has {} functions named like {READ_CALLBACK}: {found:?}",
            found.len()
        ),
    }
}
