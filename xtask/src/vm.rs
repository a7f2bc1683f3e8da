//! Booting a guest under QEMU and talking to its agent.
//!
//! The VM is QEMU's `microvm` machine booting the PVH `vmlinux` directly:
//! the kernel log on the 8250 serial port (saved to `serial.log`), the agent
//! channel on a virtio-serial port over virtio-mmio (a Unix socket on our side). The
//! socket is opened with `wait=on`, so QEMU starts the guest only once we are
//! connected and nothing the agent says can be lost.

use std::fs::{self, File};
use std::io::{BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use perfbed_agent::{parse_agent_message, AgentMessage, Hello, HostRequest, MAX_MESSAGE_LINE};
use perfbed_device::line::{read_line_or_stop, Line};
use perfbed_device::cpus::format_cpu_list;
use perfbed_device::{ControlClient, DeviceConfig};

use crate::cmd;
use crate::l1box::{self, BoxImages};
use crate::monitor;

pub const MAX_CPUS: u8 = 64; // the guest kernel's CONFIG_NR_CPUS
/// Where the monitoring device's registers sit in guest physical memory: a
/// hole below microvm's virtio-mmio (0xfeb00000) and IOAPIC windows.
pub const DEVICE_BASE: u64 = 0xfe00_0000;
pub const MIN_MEMORY_MIB: u32 = 128;
pub const MAX_MEMORY_MIB: u32 = 16384;
/// The device trace's file in a run's folder.
pub const TRACE_FILE: &str = "trace.txt";
/// A failed VM's vCPU state (registers, local APICs), beside the serial log.
pub const CPU_STATE_FILE: &str = "cpu-state.txt";
/// QEMU's human monitor, in the run folder.
const MONITOR_SOCKET: &str = "monitor.sock";

#[derive(Debug, Clone)]
pub struct VmConfig {
    pub qemu: PathBuf,
    /// Firmware search path (`-L`), in order.
    pub firmware_dirs: Vec<PathBuf>,
    pub vmlinux: PathBuf,
    pub initramfs: PathBuf,
    pub cpus: u8,
    pub memory_mib: u32,
    /// Appended to perfbed's own kernel command line.
    pub extra_cmdline: Vec<String>,
    /// Where the serial log, QEMU's own output and the agent transcript go.
    pub run_dir: PathBuf,
    /// How long the guest may take to greet us.
    pub boot_timeout: Duration,
    /// The monitoring device the guest gets.
    pub device: DeviceConfig,
    /// QEMU's gdbstub, if wanted.
    pub gdb: Option<GdbStub>,
    /// Show the serial log and the agent transcript live on stderr, each
    /// line prefixed (`serial|`, `agent>`, `agent<`).
    pub verbose: bool,
    /// Which VMM runs the guest.
    pub host: Host,
}

/// QEMU's gdbstub for the guest.
#[derive(Debug, Clone)]
pub struct GdbStub {
    /// TCP port on 127.0.0.1.
    pub port: u16,
    /// Start with the vCPUs stopped until gdb continues them.
    pub stopped: bool,
    /// Printed once QEMU waits for gdb: how to attach.
    pub hint: String,
}

/// Which VMM runs the guest, and where.
#[derive(Debug, Clone)]
pub enum Host {
    /// perfbed's QEMU with the device shim (`config.qemu`), KVM or TCG.
    Qemu,
    /// perfbed-vmm on this machine's /dev/kvm (a CPU with VT-x/SVM).
    VmmNative { vmm: PathBuf },
    /// perfbed-vmm inside the box (an L1 Linux with KVM under `config.qemu`).
    VmmBox(BoxImages),
}

impl Host {
    pub fn name(&self) -> &'static str {
        match self {
            Host::Qemu => "qemu",
            Host::VmmNative { .. } => "vmm (native KVM)",
            Host::VmmBox(_) => "vmm (in the box)",
        }
    }
}

/// What `--host` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HostChoice {
    /// perfbed-vmm on native KVM where the CPU has VT-x/SVM, else QEMU.
    Auto,
    /// perfbed's QEMU (KVM where usable, else TCG).
    Qemu,
    /// perfbed-vmm: on native KVM where usable, else in the box.
    Vmm,
}

impl HostChoice {
    /// The `--host` value that asks for this (clap's own spelling of it).
    pub fn name(self) -> String {
        use clap::ValueEnum;
        self.to_possible_value().expect("no choice is skipped").get_name().to_string()
    }
}

/// Where perfbed-vmm can run, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Qemu,
    VmmNative,
    VmmBox,
}

/// Resolves `--host` on this machine: `auto` takes native KVM when the CPU
/// has VT-x/SVM, else the QEMU host; `vmm` without it takes the box.
pub fn choose_host(choice: HostChoice, accel: &Accel) -> (Placement, String) {
    match (choice, accel.kvm) {
        (HostChoice::Qemu, _) => (Placement::Qemu, "asked for (--host qemu)".into()),
        (HostChoice::Auto, true) | (HostChoice::Vmm, true) => (Placement::VmmNative, accel.reason.clone()),
        (HostChoice::Auto, false) => {
            (Placement::Qemu, format!("no native KVM for perfbed-vmm: {}; `--host vmm` runs it in the box", accel.reason))
        }
        (HostChoice::Vmm, false) => (
            Placement::VmmBox,
            format!("no native KVM ({}): an L1 Linux with KVM under QEMU TCG runs it", accel.reason),
        ),
    }
}

impl VmConfig {
    pub fn validate(&self) -> Result<()> {
        check_size(self.cpus, self.memory_mib)?;
        self.device.validate().map_err(|e| anyhow!("the device: {e}"))?;
        for (d, cpus) in self.device.domains.iter().enumerate() {
            if let Some(cpu) = cpus.iter().find(|&&c| c >= u32::from(self.cpus)) {
                bail!("domain {d} allows CPU {cpu}, but the guest has CPUs 0-{}", self.cpus - 1);
            }
        }
        check_elf_kernel(&self.vmlinux)?;
        if !self.initramfs.is_file() {
            bail!("initramfs {} is missing; `cargo xtask image` builds it", self.initramfs.display());
        }
        Ok(())
    }
}

/// The VM's shape, checked before anything is built for it.
pub fn check_size(cpus: u8, memory_mib: u32) -> Result<()> {
    if !(1..=MAX_CPUS).contains(&cpus) {
        bail!("--cpus {cpus}: the guest kernel supports 1 to {MAX_CPUS} CPUs");
    }
    if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&memory_mib) {
        bail!("--memory {memory_mib}: give the guest {MIN_MEMORY_MIB} to {MAX_MEMORY_MIB} MiB");
    }
    Ok(())
}

/// The guest boots through PVH, which needs an ELF `vmlinux`: catch a wrong
/// or truncated file here rather than in QEMU's terser words.
pub fn check_elf_kernel(path: &Path) -> Result<()> {
    let mut magic = [0u8; 4];
    let mut file = File::open(path).with_context(|| format!("kernel image {} cannot be opened", path.display()))?;
    if file.read_exact(&mut magic).is_err() || magic != *b"\x7fELF" {
        bail!("kernel image {} is not an ELF vmlinux (perfbed boots a PVH vmlinux, not a bzImage)", path.display());
    }
    Ok(())
}

/// How QEMU runs the guest's CPUs, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accel {
    pub kvm: bool,
    pub reason: String,
}

/// KVM only where the CPU has VT-x/SVM and `/dev/kvm` opens; otherwise TCG.
pub fn choose_accel() -> Accel {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hw = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .flat_map(|l| l.split_whitespace())
        .find(|f| *f == "vmx" || *f == "svm")
        .map(str::to_string);
    let kvm_dev = fs::OpenOptions::new().read(true).write(true).open("/dev/kvm");
    match (hw, kvm_dev) {
        (Some(flag), Ok(_)) => Accel { kvm: true, reason: format!("the CPU has {flag} and /dev/kvm is usable") },
        (Some(flag), Err(e)) => Accel { kvm: false, reason: format!("the CPU has {flag} but /dev/kvm cannot be opened ({e})") },
        (None, Ok(_)) => Accel {
            kvm: false,
            reason: "/dev/kvm exists but the CPU has no VT-x/SVM (a software hypervisor, too slow for a stock kernel)".into(),
        },
        (None, Err(_)) => Accel { kvm: false, reason: "no hardware virtualization and no /dev/kvm".into() },
    }
}

/// The host's TSC frequency in kHz, measured. Under TCG the guest's TSC runs
/// at the host's rate; telling the guest (`tsc_early_khz=`) spares it the TSC
/// calibration that can hang a TCG guest on a busy host.
pub fn host_tsc_khz() -> u64 {
    let measure = || {
        let (t0, c0) = (Instant::now(), tsc());
        thread::sleep(Duration::from_millis(50));
        let (c1, t1) = (tsc(), Instant::now());
        (c1 - c0) as u128 * 1_000_000 / (t1 - t0).as_nanos().max(1)
    };
    // A preemption between a pair of reads skews one sample; the median of
    // three shrugs it off.
    let mut samples = [measure(), measure(), measure()];
    samples.sort_unstable();
    samples[1] as u64
}

fn tsc() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86_64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

pub struct Vm {
    child: Child,
    messages: Receiver<Result<AgentMessage, String>>,
    writer: UnixStream,
    transcript: File,
    pub serial_log: PathBuf,
    qemu_log: PathBuf,
    /// The box's L1 console (its kernel, /init and perfbed-vmm's own lines).
    pub box_log: Option<PathBuf>,
    /// The device's control socket (inject traffic, read its state).
    pub control_socket: PathBuf,
    /// QEMU's human monitor (the guest's QEMU, or the box's).
    monitor_socket: Option<PathBuf>,
    verbose: bool,
    /// Run once before a failing VM is stopped, while the device still
    /// answers (the stress saves the device's trace there).
    before_kill: Option<Box<dyn FnOnce()>>,
    /// The agent channel's socket (QEMU's end).
    agent_socket: PathBuf,
}

/// What booting gave: the agent's greeting and how long it took.
pub struct Booted {
    pub vm: Vm,
    pub hello: Hello,
    /// From the guest starting (our connection) to the agent's greeting.
    pub boot_time: Duration,
    /// From QEMU's start to the agent's greeting (`boot_time` plus QEMU's
    /// own start-up).
    pub since_spawn: Duration,
}

impl Vm {
    pub fn boot(config: &VmConfig, accel: &Accel) -> Result<Booted> {
        config.validate()?;
        fs::create_dir_all(&config.run_dir).with_context(|| format!("creating {}", config.run_dir.display()))?;
        let socket = config.run_dir.join("agent.sock");
        let control_socket = config.run_dir.join("control.sock");
        // perfbed-vmm has no monitor; QEMU's (the guest's, or the box's L1)
        // records the vCPUs' state of a VM that failed.
        let monitor_socket = match config.host {
            Host::VmmNative { .. } => None,
            Host::Qemu | Host::VmmBox(_) => Some(config.run_dir.join(MONITOR_SOCKET)),
        };
        let _ = fs::remove_file(&socket);
        let _ = fs::remove_file(&control_socket);
        let serial_log = config.run_dir.join("serial.log");
        let qemu_log = config.run_dir.join(match config.host {
            Host::VmmNative { .. } => "vmm.log",
            _ => "qemu.log",
        });
        let tsc_khz = host_tsc_khz();

        let mut cmdline = base_cmdline(tsc_khz);
        if let Host::Qemu = config.host {
            // Announced like virtio-mmio devices are: size@base (perfbed-vmm
            // announces its devices itself, the same way).
            cmdline.push(format!("perfbed.device={:#x}@{DEVICE_BASE:#x}", config.device.size()));
        }
        cmdline.extend(config.extra_cmdline.iter().cloned());
        let (mut command, console_log) = match &config.host {
            Host::Qemu => (qemu_command(config, accel, &cmdline, &socket, &control_socket), Some(serial_log.clone())),
            Host::VmmNative { vmm } => {
                let mut vmm = Command::new(vmm);
                vmm.arg("--kernel")
                    .arg(&config.vmlinux)
                    .arg("--initramfs")
                    .arg(&config.initramfs)
                    .args(l1box::vmm_args(config, &cmdline))
                    .arg("--agent-socket")
                    .arg(&socket)
                    .arg("--control-socket")
                    .arg(&control_socket)
                    .arg("--serial-log")
                    .arg(&serial_log);
                (vmm, None)
            }
            Host::VmmBox(images) => {
                let args = l1box::vmm_args(config, &cmdline);
                // The box relays one control connection; xtask serves the
                // usual socket to its several clients over it.
                let relayed = config.run_dir.join("control-box.sock");
                crate::control_proxy::start(&control_socket, &relayed)?;
                let qemu = l1box::qemu_command(config, images, &args, &socket, &relayed, &serial_log, tsc_khz);
                (qemu, Some(config.run_dir.join("box.log")))
            }
        };
        let box_log = match config.host {
            Host::VmmBox(_) => console_log.clone(),
            _ => None,
        };
        if let Some(monitor) = &monitor_socket {
            command.arg("-monitor").arg(monitor::qemu_arg(monitor));
        }
        fs::write(config.run_dir.join("qemu.cmd"), cmd::display(&command) + "\n")?;
        die_with_xtask(&mut command);
        let spawned = Instant::now();
        let mut child = command
            .stdin(Stdio::null())
            .stdout(if console_log.is_some() { Stdio::piped() } else { Stdio::null() })
            .stderr(Stdio::from(File::create(&qemu_log)?))
            .spawn()
            .with_context(|| format!("starting {}", command.get_program().to_string_lossy()))?;

        if let (Some(stdout), Some(path)) = (child.stdout.take(), &console_log) {
            let log = File::create(path)?;
            let verbose = config.verbose;
            thread::spawn(move || copy_serial(stdout, log, verbose));
        }

        let stream = match connect(&socket, &mut child) {
            Ok(stream) => stream,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e.context(format!("the host's output: {}", cmd::tail(&qemu_log, 5))));
            }
        };
        // QEMU runs the guest from the moment we are connected (or, stopped
        // for gdb, once gdb continues it).
        if let Some(gdb) = config.gdb.as_ref().filter(|g| g.stopped) {
            println!("==> the guest is stopped for gdb on 127.0.0.1:{}; attach with:\n      {}", gdb.port, gdb.hint);
        }
        let started = Instant::now();
        let writer = stream.try_clone()?;
        let (tx, messages) = mpsc::channel();
        let transcript = File::create(config.run_dir.join("agent.log"))?;
        let reader_transcript = transcript.try_clone()?;
        let verbose = config.verbose;
        thread::spawn(move || read_agent(stream, reader_transcript, tx, verbose));
        let mut vm = Vm {
            child,
            messages,
            writer,
            transcript,
            serial_log,
            qemu_log,
            box_log,
            control_socket,
            monitor_socket,
            agent_socket: socket,
            before_kill: None,
            verbose,
        };
        match vm.receive(config.boot_timeout, "the agent's greeting") {
            Ok(AgentMessage::Hello(hello)) => {
                Ok(Booted { boot_time: started.elapsed(), since_spawn: spawned.elapsed(), hello, vm })
            }
            Ok(other) => Err(vm.fail(anyhow!("the agent sent {other:?} before its greeting"))),
            Err(e) => Err(e),
        }
    }

    /// QEMU's process id (for its memory use).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one request and waits for its answer.
    pub fn request(&mut self, request: &HostRequest, timeout: Duration) -> Result<AgentMessage> {
        let line = serde_json::to_string(request)? + "\n";
        let _ = write!(self.transcript, "> {line}");
        if self.verbose {
            eprint!("agent> {line}");
        }
        if let Err(e) = self.writer.write_all(line.as_bytes()) {
            // A dead QEMU closes the channel: name that, not the broken pipe.
            let why = match self.wait_briefly() {
                Some(status) => format!("QEMU exited ({status}) while sending {request:?} to the agent ({e})"),
                None => format!("sending {request:?} to the agent: {e}"),
            };
            return Err(self.fail(anyhow!(why)));
        }
        self.receive(timeout, &format!("the answer to {request:?}"))
    }

    /// Sets what runs before a failure stops the VM (see `before_kill`).
    pub fn before_kill(&mut self, hook: Box<dyn FnOnce()>) {
        self.before_kill = Some(hook);
    }

    /// Asks the agent to end the VM and waits for QEMU to exit.
    pub fn power_off(mut self, timeout: Duration) -> Result<()> {
        match self.request(&HostRequest::PowerOff, timeout)? {
            AgentMessage::PoweringOff => {}
            other => return Err(self.fail(anyhow!("the agent answered power-off with {other:?}"))),
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    return Err(self.fail(anyhow!("QEMU exited with {status}")));
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.fail(anyhow!("the guest did not stop within {timeout:?} of powering off")));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn receive(&mut self, timeout: Duration, what: &str) -> Result<AgentMessage> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.messages.recv_timeout(Duration::from_millis(100)) {
                Ok(Ok(message)) => return Ok(message),
                Ok(Err(e)) => return Err(self.fail(anyhow!("the agent channel: {e}"))),
                Err(RecvTimeoutError::Disconnected) => {
                    // The channel closes when QEMU exits; let it finish.
                    let status = self.wait_briefly();
                    let why = match status {
                        Some(s) if self.box_log.is_some() => describe_box_exit(s),
                        Some(s) => format!("QEMU exited ({s})"),
                        None => "the agent channel closed".into(),
                    };
                    return Err(self.fail(anyhow!("{why} while waiting for {what}")));
                }
                Err(RecvTimeoutError::Timeout) if Instant::now() > deadline => {
                    return Err(self.fail(anyhow!("no answer within {timeout:?} while waiting for {what}")));
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    fn wait_briefly(&mut self) -> Option<ExitStatus> {
        for _ in 0..50 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Stops the VM and turns `error` into the full story: what the kernel
    /// log says went wrong and where the logs are.
    fn fail(&mut self, error: anyhow::Error) -> anyhow::Error {
        // The device's trace and the vCPUs' state die with QEMU: keep
        // them first.
        let trace = self.save_device_trace();
        let cpu_state = self.record_cpu_state();
        if let Some(hook) = self.before_kill.take() {
            hook();
        }
        self.stop();
        // Give the serial copier a moment to drain QEMU's last output.
        thread::sleep(Duration::from_millis(100));
        let log = fs::read_to_string(&self.serial_log).unwrap_or_default();
        let mut story = error.to_string();
        if let Some(panic) = log.lines().find(|l| l.contains("Kernel panic")) {
            story = format!("the guest kernel panicked: {}\n{story}", panic.trim());
        }
        let problems = kernel_log_problems(&log);
        if !problems.is_empty() {
            story += &format!("\nkernel log problems:\n  {}", problems.join("\n  "));
        }
        if let Some(box_log) = &self.box_log {
            story += &format!("\n--- the box (L1 console, {}) ---\n{}", box_log.display(), cmd::tail(box_log, 8));
        }
        anyhow!(
            "{story}\n--- last lines of the serial log ---\n{}\n--- QEMU: {} ---\nserial log saved: {}{}{}",
            cmd::tail(&self.serial_log, 15),
            cmd::tail(&self.qemu_log, 3),
            self.serial_log.display(),
            trace.map_or(String::new(), |t| format!("\ndevice trace saved: {}", t.display())),
            cpu_state
        )
    }

    /// The vCPUs' registers and local APICs from QEMU's monitor, saved
    /// beside the serial log; a line for the failure's story.
    fn record_cpu_state(&mut self) -> String {
        let Some(socket) = &self.monitor_socket else { return String::new() };
        if !matches!(self.child.try_wait(), Ok(None)) {
            return String::new();
        }
        let whose = if self.box_log.is_some() { "the box's L1 vCPU" } else { "the guest's vCPUs" };
        match monitor::record_cpu_state(socket, &self.serial_log.with_file_name(CPU_STATE_FILE)) {
            Ok(path) => format!("\nstate of {whose} (registers, local APIC) saved: {}", path.display()),
            Err(e) => format!("\nstate of {whose}: not recorded ({e:#})"),
        }
    }

    /// The device's trace as it is now, saved beside the serial log (best
    /// effort: the device may already be gone).
    fn save_device_trace(&self) -> Option<PathBuf> {
        let text = ControlClient::connect(&self.control_socket).ok()?.trace_text().ok()?;
        let path = self.serial_log.with_file_name(TRACE_FILE);
        fs::write(&path, text).ok()?;
        Some(path)
    }
}

impl Vm {
    /// QEMU's process id.
    pub fn qemu_pid(&self) -> u32 {
        self.child.id()
    }

    /// Writes raw bytes to the agent channel, bypassing the protocol (for
    /// tests of what a broken host side does to the agent).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        let _ = writeln!(self.transcript, "> (raw) {:?}", String::from_utf8_lossy(bytes));
        self.writer.write_all(bytes).context("writing to the agent channel")
    }

    /// Ends QEMU if it still runs, reaps it, and removes the sockets it
    /// leaves behind when it dies without cleaning up (killed, crashed, or
    /// exiting without running the device's destructor). The logs stay.
    fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = self.writer.shutdown(std::net::Shutdown::Both);
        for socket in [Some(&self.agent_socket), Some(&self.control_socket), self.monitor_socket.as_ref()].into_iter().flatten() {
            let _ = fs::remove_file(socket);
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The box's QEMU exit status in perfbed-vmm's terms.
fn describe_box_exit(status: ExitStatus) -> String {
    let Some(code) = status.code() else { return format!("the box's QEMU was killed ({status})") };
    match perfbed_box_init::vmm_status_from_qemu(code) {
        Ok(0) => "perfbed-vmm exited: the guest rebooted".into(),
        Ok(3) => "perfbed-vmm exited with status 3: the guest panicked".into(),
        Ok(vmm) => format!("perfbed-vmm exited with status {vmm} (see box.log)"),
        Err(why) => why,
    }
}

/// Makes the VM's process die with xtask. Killed, or interrupted with
/// Ctrl-C in the middle of a 30-minute stress, xtask runs no destructor,
/// and a 16-vCPU guest left behind would burn the CPUs of every later run.
/// The kernel sends the signal when the thread that spawned the child exits:
/// VMs are booted from xtask's main thread.
fn die_with_xtask(command: &mut Command) {
    let xtask = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec and only
    // makes async-signal-safe system calls (prctl, getppid); it allocates
    // nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // xtask died before the prctl: nobody would send the signal.
            // CAST: a pid is positive.
            if libc::getppid() as u32 != xtask {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        })
    };
}

/// perfbed's QEMU running the guest itself, the device mapped by its shim.
fn qemu_command(config: &VmConfig, accel: &Accel, cmdline: &[String], socket: &Path, control_socket: &Path) -> Command {
    let mut qemu = Command::new(&config.qemu);
    for dir in &config.firmware_dirs {
        qemu.arg("-L").arg(dir);
    }
    qemu.args(["-M", "microvm,x-option-roms=off,acpi=off"]);
    guest_args(&mut qemu, config, accel, &cmdline.join(" "));
    qemu.args(["-chardev", "stdio,id=serial0,signal=off", "-serial", "chardev:serial0"])
        .args(["-device", "virtio-serial-device", "-chardev"])
        .arg(format!("socket,id=agent,path={},server=on,wait=on", socket.display()))
        // A plain port, not a virtconsole: QEMU throttles the guest when our
        // end of the socket is full, where a console port drops the bytes.
        .args(["-device", "virtserialport,chardev=agent,name=perfbed.agent"])
        .arg("-device")
        .arg(device_arg(&config.device, control_socket));
    if let Some(gdb) = &config.gdb {
        qemu.arg("-gdb").arg(format!("tcp:127.0.0.1:{}", gdb.port));
        if gdb.stopped {
            qemu.arg("-S");
        }
    }
    qemu
}

/// perfbed's kernel command line before the device and the caller's extras,
/// for a host whose TSC runs at `tsc_khz`.
pub fn base_cmdline(tsc_khz: u64) -> Vec<String> {
    vec![
        "console=ttyS0".to_string(),
        // A panic reboots at once, and -no-reboot turns that into an exit.
        "panic=-1".into(),
        "reboot=t".into(),
        format!("tsc_early_khz={tsc_khz}"),
        // No clocksource watchdog: a loaded TCG host would make it flap.
        "tsc=reliable".into(),
    ]
}

/// What every QEMU boot of perfbed's images says, whatever the machine: no
/// defaults, no display, exit on reboot, the accelerator, the guest's shape,
/// its kernel, initramfs and command line.
pub fn guest_args(qemu: &mut Command, config: &VmConfig, accel: &Accel, cmdline: &str) {
    qemu.args(["-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"]);
    if accel.kvm {
        qemu.args(["-accel", "kvm", "-cpu", "host"]);
    } else {
        qemu.args(["-accel", "tcg", "-cpu", "max"]);
    }
    qemu.arg("-smp")
        .arg(config.cpus.to_string())
        .arg("-m")
        .arg(config.memory_mib.to_string())
        .arg("-kernel")
        .arg(&config.vmlinux)
        .arg("-initrd")
        .arg(&config.initramfs)
        .arg("-append")
        .arg(cmdline);
}

/// The `-device perfbed,...` argument of perfbed's QEMU (images/qemu/perfbed.c).
fn device_arg(device: &DeviceConfig, control: &Path) -> String {
    let domains: Vec<String> = device.domains.iter().map(|d| format_cpu_list(d)).collect();
    let mut arg = format!(
        "perfbed,addr={DEVICE_BASE:#x},domains={},rmids={},slots={},width={},max-rate={},control={}",
        domains.join(":"),
        device.rmids,
        device.slots,
        device.counter_width,
        device.max_rate,
        control.display()
    );
    // Only when asked: a QEMU from before the property still takes the rest.
    if device.trace_capacity != perfbed_device::TRACE_CAPACITY {
        arg += &format!(",trace-capacity={}", device.trace_capacity);
    }
    arg
}

/// QEMU creates the socket and then waits for us before starting the guest.
fn connect(socket: &Path, child: &mut Child) -> Result<UnixStream> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("QEMU exited ({status}) before the guest started");
        }
        if let Ok(stream) = UnixStream::connect(socket) {
            return Ok(stream);
        }
        if Instant::now() > deadline {
            bail!("QEMU did not open the agent socket {} within 30 s", socket.display());
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Most of the serial console kept in `serial.log`: a guest flooding its
/// console cannot fill the host's disk. The rest is read and dropped, so
/// QEMU never blocks on it.
pub const SERIAL_LOG_LIMIT: u64 = 64 << 20;

/// With `verbose`, each line also goes to stderr, prefixed `serial| `.
fn copy_serial(from: impl Read, to: File, verbose: bool) {
    if verbose {
        copy_capped(from, SerialEcho { to, line: Vec::new() }, SERIAL_LOG_LIMIT);
    } else {
        copy_capped(from, to, SERIAL_LOG_LIMIT);
    }
}

/// The serial log's writer that also echoes every complete line to stderr.
struct SerialEcho {
    to: File,
    line: Vec<u8>,
}

impl Write for SerialEcho {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.to.write(buf)?;
        for &byte in &buf[..n] {
            self.line.push(byte);
            if byte == b'\n' {
                eprint!("serial| {}", String::from_utf8_lossy(&self.line));
                self.line.clear();
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.to.flush()
    }
}

/// Copies `from` to `to` until `from` ends, writing at most `limit` bytes
/// and then one line that says how much was dropped.
fn copy_capped(mut from: impl Read, mut to: impl Write, limit: u64) {
    let mut buf = [0u8; 4096];
    let mut written = 0u64;
    let mut dropped = 0u64;
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 {
            break;
        }
        let keep = (limit - written).min(n as u64) as usize;
        if keep > 0 && to.write_all(&buf[..keep]).is_err() {
            break;
        }
        written += keep as u64;
        dropped += (n - keep) as u64;
        if keep < n && dropped == (n - keep) as u64 {
            let _ = writeln!(to, "\n[perfbed: serial log limit of {limit} bytes reached; the rest of the console is dropped]");
        }
    }
    if dropped > 0 {
        let _ = writeln!(to, "[perfbed: {dropped} bytes of console output dropped]");
    }
}

/// Reads the agent's messages, never holding more than one line of at most
/// [`MAX_MESSAGE_LINE`] bytes: a guest flooding the channel gets the run
/// failed with that said, not the host's memory filled.
fn read_agent(stream: UnixStream, mut transcript: File, tx: mpsc::Sender<Result<AgentMessage, String>>, verbose: bool) {
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        let parsed = match read_line_or_stop(&mut reader, &mut line, MAX_MESSAGE_LINE) {
            Err(_) | Ok(Line::End | Line::Unterminated) => break,
            Ok(Line::Blank) => continue,
            Ok(Line::TooLong) => {
                // Nothing after it can be trusted to be a message.
                let _ = writeln!(transcript, "< (a line longer than {MAX_MESSAGE_LINE} bytes; stopped reading)");
                let _ = tx.send(Err(format!("the agent sent a line longer than {MAX_MESSAGE_LINE} bytes (a guest flooding the channel?)")));
                break;
            }
            Ok(Line::Text) => {
                let _ = writeln!(transcript, "< {}", String::from_utf8_lossy(&line));
                if verbose {
                    eprintln!("agent< {}", String::from_utf8_lossy(&line));
                }
                parse_agent_message(&line)
            }
        };
        if tx.send(parsed).is_err() {
            break;
        }
    }
}

/// Lines of a kernel log that mean something went wrong in the kernel, even
/// if the run carried on: warnings, bugs, oopses, lockdep and RCU reports.
pub fn kernel_log_problems(log: &str) -> Vec<String> {
    const SIGNS: &[&str] = &[
        "WARNING:",
        "BUG:",
        "Oops:",
        "Kernel panic",
        "general protection fault",
        "possible circular locking dependency",
        "possible recursive locking",
        "inconsistent lock state",
        "suspicious RCU usage",
        "self-detected stall",
        "detected stalls",
        "blocked for more than",
        "UBSAN:",
        "list_add corruption",
        "list_del corruption",
    ];
    log.lines().filter(|l| SIGNS.iter().any(|s| l.contains(s))).map(|l| l.trim().to_string()).collect()
}

/// A fresh folder for one boot's logs: `target/perfbed/runs/<time>-<name>`
/// (with the process id, so that two runs started in the same millisecond
/// never share one).
pub fn new_run_dir(workspace: &Path, name: &str) -> PathBuf {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let pid = std::process::id();
    workspace.join("target/perfbed/runs").join(format!("{}-{:03}-{pid}-{name}", now.as_secs(), now.subsec_millis()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_choice_names_the_flag_value_that_asks_for_it() {
        use clap::ValueEnum;
        for choice in HostChoice::value_variants() {
            assert_eq!(HostChoice::from_str(&choice.name(), false), Ok(*choice));
        }
    }

    #[test]
    fn kernel_log_problems_are_found_and_quiet_logs_pass() {
        let quiet = "[    0.1] smpboot: CPU 1 is now offline\n[    0.2] perfbed: loaded\n";
        assert!(kernel_log_problems(quiet).is_empty());
        let hung = "[ 61.0] INFO: task xtask-agent:93 blocked for more than 60 seconds.\n                    [ 62.0] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:\n";
        assert_eq!(kernel_log_problems(hung).len(), 2);
        let noisy = "[ 1.0] ok\n[ 1.1] WARNING: CPU: 1 PID: 5 at kernel/events/core.c:123\n\
                     [ 1.2] ======================================================\n\
                     [ 1.3] WARNING: possible circular locking dependency detected\n\
                     [ 1.4] BUG: scheduling while atomic\n";
        assert_eq!(kernel_log_problems(noisy).len(), 3);
    }

    #[test]
    fn bad_vm_configs_are_refused_with_the_reason() {
        let dir = std::env::temp_dir().join(format!("perfbed-vmcfg-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let elf = dir.join("vmlinux");
        fs::write(&elf, b"\x7fELF and the rest").unwrap();
        let initramfs = dir.join("initramfs.cpio");
        fs::write(&initramfs, b"").unwrap();
        let good = VmConfig {
            qemu: "qemu-system-x86_64".into(),
            firmware_dirs: vec![],
            device: DeviceConfig::default(),
            vmlinux: elf,
            initramfs,
            cpus: 4,
            memory_mib: 512,
            extra_cmdline: vec![],
            run_dir: dir.join("run"),
            boot_timeout: Duration::from_secs(1),
            gdb: None,
            verbose: false,
            host: Host::Qemu,
        };
        good.validate().unwrap();
        let err = |c: VmConfig| c.validate().unwrap_err().to_string();
        assert!(err(VmConfig { cpus: 0, ..good.clone() }).contains("--cpus 0"));
        assert!(err(VmConfig { cpus: 65, ..good.clone() }).contains("1 to 64"));
        assert!(err(VmConfig { memory_mib: 1, ..good.clone() }).contains("--memory 1"));
        assert!(err(VmConfig { cpus: 2, ..good.clone() }).contains("domain 1 allows CPU 2"));
        assert!(err(VmConfig { vmlinux: dir.join("absent"), ..good.clone() }).contains("cannot be opened"));
        let bz = dir.join("bzImage");
        fs::write(&bz, b"MZ\0\0not elf").unwrap();
        assert!(err(VmConfig { vmlinux: bz, ..good.clone() }).contains("not an ELF vmlinux"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_flooding_console_is_capped() {
        let flood = vec![b'x'; 10_000];
        let mut out = Vec::new();
        copy_capped(&flood[..], &mut out, 4096);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with(&"x".repeat(4096)));
        assert!(!text[4096..].contains('x'), "nothing past the limit is kept");
        assert!(text.contains("serial log limit of 4096 bytes reached"), "{}", &text[4096..]);
        assert!(text.contains("[perfbed: 5904 bytes of console output dropped]"), "{}", &text[4096..]);
        let mut out = Vec::new();
        copy_capped(&b"quiet\n"[..], &mut out, 4096);
        assert_eq!(out, b"quiet\n");
    }

    #[test]
    fn measured_tsc_is_plausible() {
        let khz = host_tsc_khz();
        assert!((100_000..10_000_000).contains(&khz), "{khz} kHz");
    }
}
