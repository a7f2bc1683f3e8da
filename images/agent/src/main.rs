//! perfbed-agent: the guest's `/init`.
//!
//! It mounts what a test needs,
//! greets the host over the virtio console and then serves its requests (see
//! the protocol in `lib.rs`) until it is asked to end the VM.
//!
//! Being PID 1 it must never exit: any error it cannot report over the channel
//! goes to the console (the serial log) and the guest is powered off, so the
//! host sees a short run and a reason instead of a kernel panic.

use std::ffi::CString;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use perfbed_agent::{
    format_cpu_list, parse_cpu_list, AgentMessage, GuestEventKind, Hello, HostRequest,
    HotplugRound, CHANNEL_DEVICES, CONSOLE_DEVICE,
};

use journal::Journal;

mod batch;
mod bpf;
mod bpf_reader;
mod jobs;
mod journal;
mod mmio;
mod perf;
mod perf_ops;
mod timing;

/// The initramfs's modules, loaded when the host asks.
const MODULE_DIR: &str = "/lib/modules";
pub const CPU_SYSFS: &str = "/sys/devices/system/cpu";

fn main() {
    if let Err(error) = run() {
        eprintln!("perfbed-agent: fatal: {error}");
    }
    power_off();
}

fn run() -> Result<(), String> {
    mount_basics()?;
    let cmdline = read_trimmed("/proc/cmdline")?;
    let channel = open_channel(Duration::from_secs(10))?;
    let mut writer = channel
        .try_clone()
        .map_err(|e| format!("dup the agent channel: {e}"))?;
    let hello = Hello {
        kernel_release: read_trimmed("/proc/sys/kernel/osrelease")?,
        cpus_online: read_trimmed(&format!("{CPU_SYSFS}/online"))?,
        cpus_possible: read_trimmed(&format!("{CPU_SYSFS}/possible"))?,
        uptime_ms: uptime_ms()?,
    };
    send(&mut writer, &AgentMessage::Hello(hello))?;

    let mut events = perf::Events::default();
    let mut journal = journal::Journal::default();
    let mut jobs = jobs::Jobs::default();
    let mut reader = None;
    for line in BufReader::new(channel).lines() {
        let line = line.map_err(|e| format!("read the agent channel: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<HostRequest>(&line) {
            Ok(HostRequest::PowerOff) => {
                send(&mut writer, &AgentMessage::PoweringOff)?;
                return Ok(());
            }
            Ok(HostRequest::FloodChannel) => {
                let junk = [b'y'; 4096];
                loop {
                    writer
                        .write_all(&junk)
                        .map_err(|e| format!("flooding the agent channel: {e}"))?;
                }
            }
            Ok(request) => handle(
                request,
                &mut events,
                &mut jobs,
                &mut reader,
                &mut journal,
                &cmdline,
            ),
            Err(e) => AgentMessage::Error {
                error: format!("bad request {line:?}: {e}"),
            },
        };
        send(&mut writer, &reply)?;
    }
    Err("the agent channel was closed by the host".to_string())
}

/// Carries out one request; every outcome, failures included, is an answer.
fn handle(
    request: HostRequest,
    events: &mut perf::Events,
    jobs: &mut jobs::Jobs,
    reader: &mut Option<bpf_reader::BpfReader>,
    journal: &mut Journal,
    cmdline: &str,
) -> AgentMessage {
    let done = |r: Result<(), String>| {
        r.map_or_else(
            |error| AgentMessage::Error { error },
            |()| AgentMessage::Done,
        )
    };
    match request {
        HostRequest::ReadFile { path } => match fs::read_to_string(&path) {
            Ok(text) => {
                if let Some(pmu) = path
                    .strip_prefix("/sys/bus/event_source/devices/")
                    .and_then(|p| p.strip_suffix("/cpumask"))
                {
                    let cpus = text.trim().to_string();
                    journal.record(
                        journal::now_ns(),
                        GuestEventKind::Cpumask {
                            pmu: pmu.into(),
                            cpus,
                        },
                    );
                }
                AgentMessage::Text { text }
            }
            Err(e) => AgentMessage::Error {
                error: format!("read {path}: {e}"),
            },
        },
        HostRequest::SetCpuOnline { cpu, online } => {
            done(set_cpu_online_recorded(cpu, online, journal))
        }
        HostRequest::LoadModule { name } => done(load_module(
            &Path::new(MODULE_DIR).join(format!("{name}.ko")),
            cmdline,
        )),
        HostRequest::LoadModuleWith { name, params } => {
            let path = Path::new(MODULE_DIR).join(format!("{name}.ko"));
            done(finit_module(&path, &params).map_err(|e| format!("{}: {e}", path.display())))
        }
        HostRequest::UnloadModule { name } => done(unload_module(&name)),
        HostRequest::PerfOpen {
            attr,
            pid,
            cpu,
            group,
        } => {
            let opened = events.open(&attr, pid, cpu, group);
            let result = match &opened {
                Ok(handle) => handle.to_string(),
                Err(e) => perf::errno_name(e.errno),
            };
            journal.record(
                journal::now_ns(),
                GuestEventKind::PerfOpen {
                    pmu_type: attr.type_,
                    config: attr.config,
                    cpu,
                    result,
                },
            );
            match opened {
                Ok(handle) => AgentMessage::PerfOpened { handle },
                Err(e) => errno(e),
            }
        }
        HostRequest::PerfOpenFlags {
            attr,
            pid,
            cpu,
            group,
            flags,
        } => match events.open_flags(&attr, pid, cpu, group, flags) {
            Ok(handle) => AgentMessage::PerfOpened { handle },
            Err(e) => errno(e),
        },
        HostRequest::PerfIoctl { handle, ioctl } => match events.ioctl(handle, &ioctl) {
            Ok(value) => AgentMessage::PerfValues {
                values: vec![value],
            },
            Err(e) => errno(e),
        },
        HostRequest::PerfRead { handle } => match events.read(handle) {
            Ok(values) => AgentMessage::PerfValues { values },
            Err(e) => errno(e),
        },
        HostRequest::PerfClose { handle } => {
            journal.record(journal::now_ns(), GuestEventKind::PerfClose { handle });
            events
                .close(handle)
                .map_or_else(errno, |()| AgentMessage::Done)
        }
        HostRequest::PerfOpenRace {
            attr,
            cpu,
            hotplug_ops,
            toggle_cpus,
            keep,
            software_siblings,
        } => match perf::open_race(
            &attr,
            cpu,
            hotplug_ops,
            &toggle_cpus,
            keep,
            software_siblings,
        ) {
            Ok(result) => AgentMessage::Race(result),
            Err(error) => AgentMessage::Error { error },
        },
        HostRequest::TimeReads {
            target,
            cpu,
            iterations,
        } => match timing::time_reads(&target, cpu, iterations, events) {
            Ok(message) => message,
            Err(error) => AgentMessage::Error { error },
        },
        HostRequest::Hotplug { rounds } => match hotplug(rounds, journal) {
            Ok(rounds) => AgentMessage::Hotplug { rounds },
            Err(error) => AgentMessage::Error { error },
        },
        HostRequest::Mmio {
            base,
            size,
            accesses,
        } => match mmio::run(base, size, &accesses) {
            Ok(values) => AgentMessage::Mmio { values },
            Err(error) => AgentMessage::Error { error },
        },
        HostRequest::Run { argv } => match argv.split_first() {
            Some((program, args)) => {
                match std::process::Command::new(program).args(args).output() {
                    Ok(out) => AgentMessage::Ran {
                        status: out.status.code(),
                        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                    },
                    Err(e) => AgentMessage::Error {
                        error: format!("running {program}: {e}"),
                    },
                }
            }
            None => AgentMessage::Error {
                error: "run: empty argv".into(),
            },
        },
        HostRequest::Events => AgentMessage::Events {
            events: journal.take(),
        },
        HostRequest::ClockSync { base, size, cpu } => {
            match mmio::clock_sync(base, size, cpu, journal::now_ns) {
                Ok((before_ns, after_ns)) => AgentMessage::ClockSync {
                    before_ns,
                    after_ns,
                },
                Err(error) => AgentMessage::Error { error },
            }
        }
        HostRequest::HotplugBatch {
            ops,
            watch_pmus,
            read_handles,
        } => AgentMessage::HotplugBatch(batch::run(&ops, &watch_pmus, &read_handles, events)),
        HostRequest::PerfOps { ops } => AgentMessage::PerfOps {
            results: perf_ops::run(ops, events, journal),
        },
        HostRequest::PerfReadMany { handles } => read_many(events, &handles),
        HostRequest::StartJob { spec } => match jobs.start(&spec) {
            Ok(job) => AgentMessage::JobStarted { job },
            Err(error) => AgentMessage::Error { error },
        },
        HostRequest::StopJob {
            job,
            signal,
            timeout_ms,
        } => match jobs.stop(job, signal, Duration::from_millis(timeout_ms)) {
            Ok(result) => AgentMessage::JobDone(result),
            Err(error) => AgentMessage::Error { error },
        },
        HostRequest::BpfReaderStart {
            handle,
            tracepoints,
        } => {
            if reader.is_some() {
                return AgentMessage::Error {
                    error: "a BPF reader is running already".into(),
                };
            }
            match events.fd(handle) {
                Ok(fd) => {
                    done(bpf_reader::BpfReader::start(fd, &tracepoints).map(|r| *reader = Some(r)))
                }
                Err(e) => errno(e),
            }
        }
        HostRequest::BpfReaderDrain { stop } => {
            let Some(running) = reader.as_ref() else {
                return AgentMessage::Error {
                    error: "no BPF reader is running".into(),
                };
            };
            let drained = running.drain();
            if stop {
                *reader = None;
            }
            match drained {
                Ok((reads, dropped)) => AgentMessage::BpfReads { reads, dropped },
                Err(error) => AgentMessage::Error { error },
            }
        }
        HostRequest::PowerOff | HostRequest::FloodChannel => {
            unreachable!("handled by the request loop")
        }
    }
}

/// A failed perf call, as the host sees it.
fn errno(e: perf::SysError) -> AgentMessage {
    AgentMessage::Errno {
        errno: e.errno,
        name: perf::errno_name(e.errno),
        call: e.call.into(),
    }
}

/// A `PerfReadMany` pass that took longer than this (the vCPU was preempted
/// between two reads, on a loaded host) is made again.
const READ_MANY_SPAN: Duration = Duration::from_micros(500);
/// Passes made at most; the quickest is answered.
const READ_MANY_PASSES: u32 = 8;

/// Reads every handle within microseconds of each other, as the host's
/// checks that add up several events' clocks over one window assume (a
/// read has no side effect on the counts, so a slow pass is simply made
/// again).
fn read_many(events: &mut perf::Events, handles: &[u32]) -> AgentMessage {
    let mut quickest: Option<(Duration, Vec<Vec<u64>>)> = None;
    for _ in 0..READ_MANY_PASSES {
        let start = Instant::now();
        let values = match handles
            .iter()
            .map(|&h| events.read(h))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(values) => values,
            Err(e) => return errno(e),
        };
        let span = start.elapsed();
        if quickest.as_ref().is_none_or(|(best, _)| span < *best) {
            quickest = Some((span, values));
        }
        if span <= READ_MANY_SPAN {
            break;
        }
    }
    let (_, values) = quickest.expect("at least one pass");
    AgentMessage::PerfValuesMany { values }
}

/// Takes one CPU offline or online through sysfs.
pub fn set_cpu_online(cpu: u32, online: bool) -> Result<(), String> {
    let path = format!("{CPU_SYSFS}/cpu{cpu}/online");
    fs::write(&path, if online { "1" } else { "0" }).map_err(|e| {
        format!(
            "taking CPU {cpu} {}: {e}",
            if online { "online" } else { "offline" }
        )
    })
}

/// [`set_cpu_online`], recorded in the journal.
fn set_cpu_online_recorded(cpu: u32, online: bool, journal: &mut Journal) -> Result<(), String> {
    let start = journal::now_ns();
    let result = set_cpu_online(cpu, online);
    let end = journal::now_ns();
    let (took_ns, ok) = (end.saturating_sub(start), result.is_ok());
    let kind = if online {
        GuestEventKind::CpuOnline { cpu, took_ns, ok }
    } else {
        GuestEventKind::CpuOffline { cpu, took_ns, ok }
    };
    journal.record(end, kind);
    result
}

fn unload_module(name: &str) -> Result<(), String> {
    let c_name = CString::new(name).map_err(|_| "NUL in a module name".to_string())?;
    // SAFETY: a valid NUL-terminated name that outlives the call.
    let rc = unsafe { libc::syscall(libc::SYS_delete_module, c_name.as_ptr(), libc::O_NONBLOCK) };
    if rc != 0 {
        return Err(format!(
            "delete_module {name}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn send(writer: &mut fs::File, message: &AgentMessage) -> Result<(), String> {
    let mut line = serde_json::to_string(message).map_err(|e| e.to_string())?;
    line.push('\n');
    writer
        .write_all(line.as_bytes())
        .map_err(|e| format!("write the agent channel: {e}"))
}

fn mount_basics() -> Result<(), String> {
    for (source, target, fstype) in [
        ("proc", "/proc", "proc"),
        ("sysfs", "/sys", "sysfs"),
        ("devtmpfs", "/dev", "devtmpfs"),
    ] {
        fs::create_dir_all(target).map_err(|e| format!("mkdir {target}: {e}"))?;
        let c = |s: &str| CString::new(s).expect("no NUL in a literal");
        let (source, target_c, fstype) = (c(source), c(target), c(fstype));
        // SAFETY: all three are valid NUL-terminated strings that outlive the
        // call, and a NULL data pointer is allowed for these filesystems.
        let rc = unsafe {
            libc::mount(
                source.as_ptr(),
                target_c.as_ptr(),
                fstype.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        let err = std::io::Error::last_os_error();
        // devtmpfs may already be mounted by the kernel (DEVTMPFS_MOUNT).
        if rc != 0 && err.raw_os_error() != Some(libc::EBUSY) {
            return Err(format!("mount {target}: {err}"));
        }
    }
    Ok(())
}

/// Loads a module, passing it the `<module>.<param>=<value>` settings of the
/// kernel command line as modprobe would (`perfbed.device=...`).
fn load_module(path: &Path, cmdline: &str) -> Result<(), String> {
    let name = path
        .file_stem()
        .unwrap_or_default()
        .to_string_lossy()
        .replace('-', "_");
    let prefix = format!("{name}.");
    let params: Vec<&str> = cmdline
        .split_whitespace()
        .filter_map(|arg| arg.strip_prefix(&prefix))
        .collect();
    finit_module(path, &params.join(" ")).map_err(|e| format!("{}: {e}", path.display()))
}

fn finit_module(path: &Path, params: &str) -> Result<(), String> {
    let file = fs::File::open(path).map_err(|e| format!("open {}: {e}", path.display()))?;
    let params = CString::new(params).map_err(|_| "NUL in module parameters".to_string())?;
    use std::os::fd::AsRawFd;
    // SAFETY: finit_module reads the open file and the NUL-terminated params;
    // both stay valid for the duration of the call.
    let rc = unsafe { libc::syscall(libc::SYS_finit_module, file.as_raw_fd(), params.as_ptr(), 0) };
    if rc != 0 {
        return Err(format!("finit_module: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The virtio console appears once its driver has probed, which on a slow
/// (emulated) guest can be a little after `/init` starts.
fn open_channel(patience: Duration) -> Result<fs::File, String> {
    let start = Instant::now();
    loop {
        for path in CHANNEL_DEVICES {
            if let Ok(file) = fs::OpenOptions::new().read(true).write(true).open(path) {
                if path == CONSOLE_DEVICE {
                    set_raw(&file)?;
                }
                return Ok(file);
            }
        }
        if start.elapsed() > patience {
            return Err(format!(
                "none of {CHANNEL_DEVICES:?} appeared within {patience:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The console is a tty: without raw mode it would echo the host's requests
/// back and rewrite newlines.
fn set_raw(file: &fs::File) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: termios is plain data; tcgetattr fills it for a valid fd.
    let mut tio: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open for the lifetime of `file`; tio is a valid termios.
    if unsafe { libc::tcgetattr(fd, &mut tio) } != 0 {
        return Err(format!(
            "tcgetattr {CONSOLE_DEVICE}: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: tio is a valid termios obtained above.
    unsafe { libc::cfmakeraw(&mut tio) };
    // SAFETY: as for tcgetattr.
    if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &tio) } != 0 {
        return Err(format!(
            "tcsetattr {CONSOLE_DEVICE}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Takes every hotpluggable CPU offline one by one, then online again, for
/// `rounds` rounds, checking the kernel's online mask after every step. One
/// CPU stays online: CPU 0 on x86, where it cannot go; on arm64, where
/// every CPU can, the last one, so that CPU 0 goes offline and back in
/// every round.
fn hotplug(rounds: u32, journal: &mut Journal) -> Result<Vec<HotplugRound>, String> {
    let online = parse_cpu_list(&read_trimmed(&format!("{CPU_SYSFS}/online"))?)
        .map_err(|e| e.to_string())?;
    // CPU 0 has no `online` file on x86 unless BOOTPARAM_HOTPLUG_CPU0.
    let mut movable: Vec<u32> = online
        .iter()
        .copied()
        .filter(|cpu| Path::new(&format!("{CPU_SYSFS}/cpu{cpu}/online")).exists())
        .collect();
    // The kernel refuses to take the last online CPU away (EBUSY).
    if movable.len() == online.len() {
        movable.pop();
    }
    let mut results = Vec::new();
    for round in 1..=rounds {
        let mut problems = Vec::new();
        let mut expected = online.clone();
        let start = Instant::now();
        for &cpu in &movable {
            expected.retain(|&c| c != cpu);
            hotplug_step(cpu, false, &expected, &mut problems, journal);
        }
        let offline_us = start.elapsed().as_micros() as u64;
        let start = Instant::now();
        for &cpu in &movable {
            expected.push(cpu);
            expected.sort_unstable();
            hotplug_step(cpu, true, &expected, &mut problems, journal);
        }
        let online_us = start.elapsed().as_micros() as u64;
        results.push(HotplugRound {
            round,
            offline_us,
            online_us,
            problems,
        });
    }
    Ok(results)
}

/// One hotplug step, then the kernel's online mask checked against `expected`.
fn hotplug_step(
    cpu: u32,
    online: bool,
    expected: &[u32],
    problems: &mut Vec<String>,
    journal: &mut Journal,
) {
    let verb = if online { "online" } else { "offline" };
    if let Err(e) = set_cpu_online_recorded(cpu, online, journal) {
        problems.push(e);
    }
    let want = format_cpu_list(expected);
    match read_trimmed(&format!("{CPU_SYSFS}/online")) {
        Ok(got) if got == want => {}
        Ok(got) => problems.push(format!(
            "after CPU {cpu} {verb}: online is {got:?}, expected {want:?}"
        )),
        Err(e) => problems.push(e),
    }
}

pub fn read_trimmed(path: &str) -> Result<String, String> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("read {path}: {e}"))
}

fn uptime_ms() -> Result<u64, String> {
    let text = read_trimmed("/proc/uptime")?;
    let seconds: f64 = text
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad /proc/uptime {text:?}"))?;
    Ok((seconds * 1000.0) as u64)
}

/// Ends the VM. perfbed's guests have no ACPI (QEMU's microvm with
/// `acpi=off`), so there is no power-off: the agent reboots instead, the
/// kernel command line's `reboot=t` makes that an immediate triple fault, and
/// the VMM, started with `-no-reboot`, exits on it. perfbed-vmm announces a
/// power-off register on the command line; the agent writes it first, so
/// that the VMM knows this reset for a power-off and not a crash.
fn power_off() -> ! {
    // SAFETY: sync takes no arguments.
    unsafe { libc::sync() };
    if let Some(address) = fs::read_to_string("/proc/cmdline")
        .ok()
        .and_then(|c| perfbed_agent::power_off_address(&c))
    {
        if let Err(e) = announce_power_off(address) {
            // The reboot that follows then reads as an unexpected reset.
            eprintln!("perfbed-agent: writing the power-off register: {e}");
        }
    }
    // SAFETY: reboot takes no pointers; as PID 1 we may reboot.
    unsafe {
        libc::reboot(libc::RB_AUTOBOOT);
    }
    // reboot() only returns on failure; PID 1 must not exit.
    eprintln!(
        "perfbed-agent: reboot failed: {}",
        std::io::Error::last_os_error()
    );
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Writes the VMM's power-off register at `address` (perfbed_agent's
/// `POWER_OFF_PARAM`), through a `/dev/mem` mapping of its page.
fn announce_power_off(address: u64) -> Result<(), String> {
    let page = mmio::Mapping::new(address, 4096)?;
    let register = page.register(0)?;
    // SAFETY: an aligned register inside the mapping, which outlives the write.
    unsafe { register.write_volatile(0) };
    Ok(())
}
