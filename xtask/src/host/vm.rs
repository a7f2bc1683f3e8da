//! A booted guest, whatever its host: the host's process started as its
//! file says, the agent's channel (a Unix socket on our side, opened before
//! the guest starts so that nothing the agent says is lost), requests and
//! answers, power-off, and the whole story of a VM that failed.
//!
//! Under the QEMU host the VM is QEMU's `microvm` machine booting the PVH
//! `vmlinux` directly: the kernel log on the 8250 serial port (saved to
//! `serial.log`), the agent channel on a virtio-serial port over
//! virtio-mmio. The socket is opened with `wait=on`, so QEMU starts the
//! guest only once we are connected.

use std::fs::{self, File};
use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use perfbed_agent::{parse_agent_message, AgentMessage, Hello, HostRequest, MAX_MESSAGE_LINE};
use perfbed_device::line::{read_line_or_stop, Line};
use perfbed_device::ControlClient;

use super::cmdline::{base_cmdline, host_tsc_khz, kernel_hz, GuestClock, INSTRUCTION_CLOCK_KHZ};
use super::config::{device_gsis, device_param, VmConfig};
use super::console::{copy_serial, kernel_log_problems, Pausable};
use super::symbols::{self, SystemMap};
use super::{cpu_state, monitor, qemu, qemu_virt, the_box, vmm, Accel, Host};
use crate::build::image::arch::Arch;
use crate::cmd;

/// The device trace's file in a run's folder.
pub const TRACE_FILE: &str = "trace.txt";
/// A failed VM's vCPU state (registers, local APICs), beside the serial log.
pub const CPU_STATE_FILE: &str = "cpu-state.txt";
/// The same, [`CPU_STATE_GAP`] later: what stayed the same is stuck.
pub const CPU_STATE_AGAIN_FILE: &str = "cpu-state-again.txt";
/// Between the two snapshots of a failed VM's vCPUs: many timer periods.
const CPU_STATE_GAP: Duration = Duration::from_secs(1);
/// Written into the run folder when the diagnosis of a failed box run says
/// the box itself was stuck (its lines inside); read by [`box_hung`].
pub const BOX_STUCK_FILE: &str = "box-stuck.txt";
/// How many times a box scenario runs again after the box itself hung
/// ([`box_hung`]): the tests in `test::RERUN_ON_BOX_HANG` and the bench's
/// perfbed-vmm rows. The box hangs in about one `run --host vmm` in five to
/// ten on a 2-core host (2026-12-03), so one rerun left CI red once in
/// twenty-odd runs.
pub const BOX_HANG_RERUNS: u32 = 2;
/// QEMU's human monitor, in the run folder.
const MONITOR_SOCKET: &str = "monitor.sock";
/// How often the box's QEMU main loop is woken ([`monitor::Heartbeat`]).
const HEARTBEAT_PERIOD: Duration = Duration::from_secs(1);
/// How many questions the box's QEMU monitor answered, and its silences,
/// written when the VM stops.
const HEARTBEATS_FILE: &str = "heartbeats.txt";
/// Every thread's backtrace of the box's QEMU, taken when its monitor went
/// silent for 20 s.
const QEMU_THREADS_FILE: &str = "box-qemu-threads.txt";
/// A silence of the box's QEMU monitor this long means its main loop was
/// blocked: the box itself was stuck, whatever the guest did (nothing in
/// L1 holds QEMU's main loop that long).
const BOX_SILENCE: Duration = Duration::from_secs(30);

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
    /// Where the device's registers are in the guest's physical memory.
    pub device_base: u64,
    /// The guest's architecture (some of the kernel's answers are its own).
    pub arch: Arch,
    /// QEMU's human monitor (the guest's QEMU, or the box's).
    monitor_socket: Option<PathBuf>,
    /// The kernels a snapshot's RIP may be in, each with its `System.map`:
    /// the guest's, and in the box L1's.
    system_maps: Vec<(&'static str, PathBuf)>,
    /// The guest's loaded modules whose symbols a snapshot's RIP may be
    /// in: (`name.ko`, the `.ko`, where its text was loaded).
    module_maps: Vec<(String, PathBuf, u64)>,
    verbose: bool,
    /// Run once before a failing VM is stopped, while the device still
    /// answers (the stress saves the device's trace there).
    before_kill: Option<Box<dyn FnOnce()>>,
    /// The agent channel's socket (QEMU's end).
    agent_socket: PathBuf,
    /// While set, the reader thread reads nothing (see `pause_reading`).
    reading_paused: Arc<AtomicBool>,
    /// In the box, while set, the guest's serial console is not read (see
    /// `pause_serial`); `None` where the host writes serial.log itself.
    serial_paused: Option<Arc<AtomicBool>>,
    /// In the box: questions to its QEMU's monitor ([`monitor::Heartbeat`]),
    /// and the silences they met once stopped.
    heartbeat: Option<monitor::Heartbeat>,
    monitor_silences: Vec<monitor::Silence>,
    /// Names the host process's exit status in its own terms (QEMU's, or
    /// perfbed-vmm's table, natively or through the box).
    describe_exit: fn(ExitStatus) -> String,
    /// The host is perfbed-vmm (natively or in the box): its control socket
    /// gives its vCPUs' state.
    vmm_host: bool,
}

/// QEMU's exit status, as it is.
fn describe_qemu_exit(status: ExitStatus) -> String {
    format!("QEMU exited ({status})")
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
        fs::create_dir_all(&config.run_dir)
            .with_context(|| format!("creating {}", config.run_dir.display()))?;
        let socket = config.run_dir.join("agent.sock");
        let control_socket = config.control_socket();
        // perfbed-vmm has no monitor; QEMU's (the guest's, or the box's L1)
        // records the vCPUs' state of a VM that failed.
        let monitor_socket = match config.host {
            Host::VmmNative { .. } => None,
            Host::Qemu | Host::QemuVirt | Host::VmmBox(_) => {
                Some(config.run_dir.join(MONITOR_SOCKET))
            }
        };
        let _ = fs::remove_file(&socket);
        let _ = fs::remove_file(&control_socket);
        let serial_log = config.run_dir.join("serial.log");
        let qemu_log = config.run_dir.join(match config.host {
            Host::VmmNative { .. } => "vmm.log",
            _ => "qemu.log",
        });
        // Only perfbed's QEMU on TCG runs the guest without hardware
        // virtualisation: the box's L1 is TCG, but its L2 runs on KVM.
        let tcg = matches!(config.host, Host::Qemu) && !accel.kvm;
        if config.instruction_clock && !tcg {
            bail!("an instruction clock needs TCG, but this QEMU would run the guest on KVM");
        }
        let tsc_khz = match config.host {
            // An arm64 guest has no TSC; its clock is the architected timer.
            Host::QemuVirt => 0,
            _ if config.instruction_clock => INSTRUCTION_CLOCK_KHZ,
            _ => host_tsc_khz(),
        };
        let mut cmdline = match config.host {
            Host::QemuVirt => qemu_virt::cmdline(),
            _ => base_cmdline(&GuestClock {
                tsc_khz,
                hz: kernel_hz(&config.vmlinux),
                tcg,
            }),
        };
        if let Host::Qemu = config.host {
            // Announced like virtio-mmio devices are: size@base:irqs
            // (perfbed-vmm announces its devices itself, the same way).
            cmdline.push(device_param(
                config.device.size(),
                device_gsis(config.device.domains.len()),
            ));
        }
        cmdline.extend(config.extra_cmdline.iter().cloned());
        let (mut command, console_log) = match &config.host {
            Host::Qemu => (
                qemu::command(config, accel, &cmdline, &socket, &control_socket),
                Some(serial_log.clone()),
            ),
            Host::QemuVirt => (
                qemu_virt::command(config, &cmdline, &socket, &control_socket),
                Some(serial_log.clone()),
            ),
            Host::VmmNative { vmm } => (
                vmm::command(vmm, config, &cmdline, &socket, &control_socket, &serial_log),
                None,
            ),
            Host::VmmBox(images) => (
                the_box::command(
                    config,
                    images,
                    &cmdline,
                    &socket,
                    &control_socket,
                    &serial_log,
                    tsc_khz,
                )?,
                Some(config.run_dir.join("box.log")),
            ),
        };
        let box_log = match config.host {
            Host::VmmBox(_) => console_log.clone(),
            _ => None,
        };
        let mut system_maps = vec![(
            "the guest's kernel",
            config.vmlinux.with_file_name("System.map"),
        )];
        if let Host::VmmBox(images) = &config.host {
            system_maps.push(("L1's kernel", images.system_map.clone()));
        }
        if let Some(monitor) = &monitor_socket {
            command.arg("-monitor").arg(monitor::qemu_arg(monitor));
        }
        fs::write(
            config.run_dir.join("qemu.cmd"),
            cmd::display(&command) + "\n",
        )?;
        die_with_xtask(&mut command);
        let spawned = Instant::now();
        let mut child = command
            .stdin(Stdio::null())
            .stdout(if console_log.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::from(File::create(&qemu_log)?))
            .spawn()
            .with_context(|| format!("starting {}", command.get_program().to_string_lossy()))?;

        let heartbeat = match (&config.host, &monitor_socket) {
            (Host::VmmBox(_), Some(monitor)) => Some(monitor::Heartbeat::start(
                monitor.clone(),
                HEARTBEAT_PERIOD,
                Some(monitor::SilenceBacktrace {
                    pid: child.id(),
                    out: config.run_dir.join(QEMU_THREADS_FILE),
                }),
            )),
            _ => None,
        };

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
        // The box serves the guest's serial console once the agent's
        // client came (that socket waits for us): long before perfbed-vmm
        // starts in L1 and its guest prints.
        let serial_paused = match &config.host {
            Host::VmmBox(_) => {
                let serial = match connect(&the_box::serial_socket(&serial_log), &mut child) {
                    Ok(serial) => serial,
                    Err(e) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err(e.context("the box's serial console socket"));
                    }
                };
                let paused = Arc::new(AtomicBool::new(false));
                let reader = Pausable::new(serial, paused.clone());
                let log = File::create(&serial_log)?;
                let verbose = config.verbose;
                thread::spawn(move || copy_serial(reader, log, verbose));
                Some(paused)
            }
            _ => None,
        };
        // QEMU runs the guest from the moment we are connected (or, stopped
        // for gdb, once gdb continues it).
        if let Some(gdb) = config.gdb.as_ref().filter(|g| g.stopped) {
            if let Some(log) = &box_log {
                // The box's port takes gdb at once, but nothing answers it
                // until L1 has booted and perfbed-vmm listens.
                if let Err(e) =
                    wait_for_line(log, the_box::GDB_READY, config.boot_timeout, &mut child)
                {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(e);
                }
            }
            println!(
                "==> the guest is stopped for gdb on 127.0.0.1:{}; attach with:\n      {}",
                gdb.port, gdb.hint
            );
        }
        let started = Instant::now();
        let writer = stream.try_clone()?;
        let (tx, messages) = mpsc::channel();
        let transcript = File::create(config.run_dir.join("agent.log"))?;
        let reader_transcript = transcript.try_clone()?;
        let verbose = config.verbose;
        let reading_paused = Arc::new(AtomicBool::new(false));
        let paused = reading_paused.clone();
        thread::spawn(move || read_agent(stream, reader_transcript, tx, verbose, &paused));
        let mut vm = Vm {
            child,
            messages,
            writer,
            transcript,
            serial_log,
            qemu_log,
            box_log,
            control_socket,
            device_base: match config.host {
                Host::QemuVirt => qemu_virt::DEVICE_BASE,
                _ => super::config::DEVICE_BASE,
            },
            arch: config.host.arch(),
            monitor_socket,
            system_maps,
            module_maps: Vec::new(),
            agent_socket: socket,
            before_kill: None,
            verbose,
            reading_paused,
            serial_paused,
            heartbeat,
            monitor_silences: Vec::new(),
            vmm_host: !matches!(config.host, Host::Qemu | Host::QemuVirt),
            describe_exit: match config.host {
                Host::Qemu | Host::QemuVirt => describe_qemu_exit,
                Host::VmmNative { .. } => vmm::describe_exit,
                Host::VmmBox(_) => the_box::describe_exit,
            },
        };
        match vm.receive(config.boot_timeout, "the agent's greeting") {
            Ok(AgentMessage::Hello(hello)) => Ok(Booted {
                boot_time: started.elapsed(),
                since_spawn: spawned.elapsed(),
                hello,
                vm,
            }),
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
                Some(status) => format!(
                    "{} while sending {request:?} to the agent ({e})",
                    (self.describe_exit)(status)
                ),
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
                    let why = (self.describe_exit)(status);
                    return Err(self.fail(anyhow!("after the power-off, {why}")));
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.fail(anyhow!(
                    "the guest did not stop within {timeout:?} of powering off"
                )));
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
                        Some(s) => (self.describe_exit)(s),
                        None => "the agent channel closed".into(),
                    };
                    return Err(self.fail(anyhow!("{why} while waiting for {what}")));
                }
                Err(RecvTimeoutError::Timeout) if Instant::now() > deadline => {
                    return Err(self.fail(anyhow!(
                        "no answer within {timeout:?} while waiting for {what}"
                    )));
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
        let mut vcpus = self.ask_vmm_vcpus();
        let cpu_state = self.record_cpu_state();
        if let Some(hook) = self.before_kill.take() {
            hook();
        }
        self.stop();
        // Give the serial copier a moment to drain QEMU's last output.
        thread::sleep(Duration::from_millis(100));
        if vcpus.is_empty() {
            vcpus = self.logged_vmm_vcpus();
        }
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
            let text = fs::read_to_string(box_log).unwrap_or_default();
            let marker = self.serial_log.with_file_name(BOX_STUCK_FILE);
            if let Some(line) = the_box::l1_timer_missing(&text) {
                if !marker.exists() {
                    let _ = fs::write(&marker, format!("L1's kernel: {line}\n"));
                }
                story += &format!("\nL1's own kernel says its timer did not fire: {line}\nso the box itself is stuck (docs/box-verification.md)");
            }
            if let Some(s) = self
                .monitor_silences
                .iter()
                .find(|s| s.seconds() >= BOX_SILENCE.as_secs_f64())
            {
                let line = format!(
                    "the box's QEMU monitor answered nothing for {:.0} s (from {:.0} s after QEMU's start): its main loop was blocked",
                    s.seconds(),
                    s.from_s
                );
                if !marker.exists() {
                    let _ = fs::write(&marker, format!("{line}\n"));
                }
                story +=
                    &format!("\n{line}, so the box itself is stuck (docs/box-verification.md)");
            }
            story += &format!(
                "\n--- the box (L1 console, {}) ---\n{}",
                box_log.display(),
                cmd::tail(box_log, 8)
            );
        }
        anyhow!(
            "{story}\n--- last lines of the serial log ---\n{}\n--- QEMU: {} ---\nserial log saved: {}{}{}",
            cmd::tail(&self.serial_log, 15),
            cmd::tail(&self.qemu_log, 3),
            self.serial_log.display(),
            trace.map_or(String::new(), |t| format!("\ndevice trace saved: {}", t.display())),
            vcpus + &cpu_state
        )
    }

    /// perfbed-vmm's vCPUs as they are now, asked of its control socket and
    /// saved in the run folder; the story's lines (none on QEMU, or once
    /// perfbed-vmm has exited).
    fn ask_vmm_vcpus(&mut self) -> String {
        if !self.vmm_host || !matches!(self.child.try_wait(), Ok(None)) {
            return String::new();
        }
        let out = self.serial_log.with_file_name(vmm::VCPU_STATE_FILE);
        match vmm::request_vcpu_state(&self.control_socket, &out) {
            Ok(path) => self.decoded_vmm_vcpus(&path, "asked when the run failed"),
            Err(e) => format!("\nperfbed-vmm's vCPUs: not recorded ({e:#})"),
        }
    }

    /// The capture perfbed-vmm printed itself as it ended the run (a KVM
    /// failure, an unexpected reset), saved in the run folder.
    fn logged_vmm_vcpus(&self) -> String {
        if !self.vmm_host {
            return String::new();
        }
        let Some(run_dir) = self.serial_log.parent() else {
            return String::new();
        };
        match vmm::save_logged_vcpu_state(run_dir) {
            Some((path, why)) => self.decoded_vmm_vcpus(&path, &why),
            None => String::new(),
        }
    }

    /// Where perfbed-vmm's capture is, and what it says, one line a vCPU.
    fn decoded_vmm_vcpus(&self, path: &Path, why: &str) -> String {
        let cpus = cpu_state::parse(&fs::read_to_string(path).unwrap_or_default());
        let mut story = format!("\nperfbed-vmm's vCPUs ({why}) saved: {}", path.display());
        for line in cpu_state::describe(&cpus) {
            story += &format!("\n  {line}");
        }
        story + &self.name_rips(cpus.iter().filter_map(|c| c.rip))
    }

    /// The vCPUs' registers and local APICs from QEMU's monitor, saved
    /// beside the serial log; a line for the failure's story.
    fn record_cpu_state(&mut self) -> String {
        // The snapshot must see the hang as it is, and have the monitor.
        self.stop_heartbeat();
        let Some(socket) = &self.monitor_socket else {
            return String::new();
        };
        if !matches!(self.child.try_wait(), Ok(None)) {
            return String::new();
        }
        let whose = if self.box_log.is_some() {
            "the box's L1 vCPU"
        } else {
            "the guest's vCPUs"
        };
        let first = match monitor::record_cpu_state(
            socket,
            &self.serial_log.with_file_name(CPU_STATE_FILE),
        ) {
            Ok(path) => path,
            Err(e) => return format!("\nstate of {whose}: not recorded ({e:#})"),
        };
        let mut story = format!(
            "\nstate of {whose} (registers, local APIC) saved: {}",
            first.display()
        );
        thread::sleep(CPU_STATE_GAP);
        let Ok(again) = monitor::record_cpu_state(
            socket,
            &self.serial_log.with_file_name(CPU_STATE_AGAIN_FILE),
        ) else {
            return story;
        };
        let read = |p: &Path| cpu_state::parse(&fs::read_to_string(p).unwrap_or_default());
        let (first, again) = (read(&first), read(&again));
        for line in cpu_state::describe(&first) {
            story += &format!("\n  {line}");
        }
        let stuck = cpu_state::stuck_interrupts(&first, &again, &format!("{CPU_STATE_GAP:?}"));
        let gap = format!("{CPU_STATE_GAP:?} later");
        let expired =
            cpu_state::expired_timer_pending(&[("first snapshot", &first), (&gap, &again)]);
        for line in stuck.iter().chain(&expired) {
            story += &format!("\n{whose}, {line}");
        }
        story += &self.name_rips(first.iter().chain(&again).filter_map(|c| c.rip));
        let stuck_timer = cpu_state::timer_stuck_in_both(&first, &again);
        if !stuck_timer.is_empty() || !stuck.is_empty() {
            story += &format!(
                "\n{whose}: the timer interrupt stayed pending and untaken across both snapshots (vCPUs {stuck_timer:?})"
            );
        } else if !expired.is_empty() {
            story += &format!(
                "\n{whose}: its expired timer was pending in one snapshot only, so the snapshots alone do not show it stuck"
            );
        }
        // In the box, an expired timer of L1's own that L1 has not taken
        // (interrupts off) in either snapshot is the box's hang too: a
        // perfbed-vmm that blocked would leave L1 idle, taking its timer.
        // One snapshot is weaker evidence than two, so it only buys the
        // listed tests their reruns (`test::RERUN_ON_BOX_HANG`).
        let l1_timer_untaken = !(stuck.is_empty() && stuck_timer.is_empty() && expired.is_empty());
        if l1_timer_untaken && self.box_log.is_some() {
            let lines: Vec<&String> = stuck.iter().chain(&expired).collect();
            let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
            let _ = fs::write(self.serial_log.with_file_name(BOX_STUCK_FILE), text);
            story += "\nso the box itself is stuck: L1 (QEMU TCG emulating SVM for L1's KVM, on L1's one vCPU) is not taking its own timer interrupt, whatever the guest inside was doing (docs/box-verification.md)";
        }
        story
    }

    /// Names a hung vCPU's RIP in the guest's module `ko` too, loaded with
    /// its text at `text_base` (`/proc/modules`, asked while the guest
    /// answered).
    pub fn add_module_symbols(&mut self, ko: &Path, text_base: u64) {
        let name = ko.file_name().map_or_else(
            || ko.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        self.module_maps.push((name, ko.to_path_buf(), text_base));
    }

    /// A line for each distinct RIP: the function it is in, in each kernel
    /// it may belong to, or the module (a map that cannot be read is said
    /// so).
    fn name_rips(&self, rips: impl Iterator<Item = u64>) -> String {
        let mut maps = Vec::new();
        let mut story = String::new();
        for (kernel, path) in &self.system_maps {
            match SystemMap::load(path) {
                Ok(map) => maps.push((kernel.to_string(), map)),
                Err(e) => story += &format!("\nno symbols for {kernel}: {e:#}"),
            }
        }
        for (module, ko, base) in &self.module_maps {
            match SystemMap::of_module(ko, *base) {
                Ok(map) => maps.push((module.clone(), map)),
                Err(e) => story += &format!("\nno symbols for {module}: {e:#}"),
            }
        }
        if maps.is_empty() {
            return story;
        }
        let maps: Vec<(&str, &SystemMap)> = maps.iter().map(|(k, m)| (k.as_str(), m)).collect();
        let mut seen = Vec::new();
        for rip in rips {
            if !seen.contains(&rip) {
                seen.push(rip);
                story += &format!("\n{}", symbols::describe(rip, &maps));
            }
        }
        story
    }

    /// The device's trace as it is now, saved beside the serial log (best
    /// effort: the device may already be gone).
    fn save_device_trace(&self) -> Option<PathBuf> {
        let text = ControlClient::connect(&self.control_socket)
            .ok()?
            .trace_text()
            .ok()?;
        let path = self.serial_log.with_file_name(TRACE_FILE);
        fs::write(&path, text).ok()?;
        Some(path)
    }
}

/// The diagnosis of a box run in `run_dir` that failed because the box
/// itself was stuck (L1 not taking its own timer interrupt), if the failure
/// was diagnosed so; `None` for every other failure.
pub fn box_hung(run_dir: &Path) -> Option<String> {
    fs::read_to_string(run_dir.join(BOX_STUCK_FILE))
        .ok()
        .filter(|t| !t.trim().is_empty())
}

/// Copies the regular files of a failed attempt's run folder to a sibling
/// `<folder>-<why>` (replacing an older copy), so a rerun keeps its logs.
pub fn keep_run_dir(run_dir: &Path, why: &str) -> Result<PathBuf> {
    let name = run_dir
        .file_name()
        .map_or("run".into(), |n| n.to_string_lossy().into_owned());
    let kept = run_dir.with_file_name(format!("{name}-{why}"));
    let _ = fs::remove_dir_all(&kept);
    fs::create_dir_all(&kept).with_context(|| format!("creating {}", kept.display()))?;
    for entry in fs::read_dir(run_dir)?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            fs::copy(entry.path(), kept.join(entry.file_name()))?;
        }
    }
    Ok(kept)
}

impl Vm {
    /// QEMU's process id.
    pub fn qemu_pid(&self) -> u32 {
        self.child.id()
    }

    /// Writes raw bytes to the agent channel, bypassing the protocol (for
    /// tests of what a broken host side does to the agent).
    /// Stops (or resumes) reading the agent channel, as a slow host would:
    /// what the guest sends meanwhile waits in the sockets and the VMM, then
    /// in the guest. Requests can still be sent (`send_raw`); their answers
    /// come with `next_message` once reading resumes.
    pub fn pause_reading(&self, paused: bool) {
        self.reading_paused.store(paused, Ordering::SeqCst);
    }

    /// Stops (or resumes) reading the guest's serial console, as a host
    /// whose log sink stalls would. Only in the box (xtask reads its serial
    /// socket); `false` where the host writes serial.log itself.
    pub fn pause_serial(&self, paused: bool) -> bool {
        match &self.serial_paused {
            Some(flag) => {
                flag.store(paused, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    /// The agent's next message (the answer to a request sent with
    /// `send_raw`).
    pub fn next_message(&mut self, timeout: Duration, what: &str) -> Result<AgentMessage> {
        self.receive(timeout, what)
    }

    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        let _ = writeln!(
            self.transcript,
            "> (raw) {:?}",
            String::from_utf8_lossy(bytes)
        );
        self.writer
            .write_all(bytes)
            .context("writing to the agent channel")
    }

    /// Ends QEMU if it still runs, reaps it, and removes the sockets it
    /// leaves behind when it dies without cleaning up (killed, crashed, or
    /// exiting without running the device's destructor). The logs stay.
    /// Stops the box's heartbeat, if any, and writes how often it was
    /// answered to the run folder.
    fn stop_heartbeat(&mut self) {
        if let Some(mut heartbeat) = self.heartbeat.take() {
            heartbeat.stop();
            self.monitor_silences = heartbeat.silences();
            let mut text = format!(
                "{} questions answered by the box's QEMU monitor (one a second)\n",
                heartbeat.answered()
            );
            for s in &self.monitor_silences {
                text += &format!(
                    "no answer from {:.1} s to {:.1} s ({:.1} s){}\n",
                    s.from_s,
                    s.to_s,
                    s.seconds(),
                    if s.open { ", to the end" } else { "" }
                );
            }
            let _ = fs::write(self.serial_log.with_file_name(HEARTBEATS_FILE), text);
        }
    }

    fn stop(&mut self) {
        self.stop_heartbeat();
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = self.writer.shutdown(std::net::Shutdown::Both);
        for socket in [
            Some(&self.agent_socket),
            Some(&self.control_socket),
            self.monitor_socket.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            let _ = fs::remove_file(socket);
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until the host's log `path` has a line containing `needle`.
fn wait_for_line(path: &Path, needle: &str, timeout: Duration, child: &mut Child) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if fs::read_to_string(path).is_ok_and(|log| log.contains(needle)) {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            bail!(
                "the host exited ({status}) before {needle:?} in {}",
                path.display()
            );
        }
        if Instant::now() > deadline {
            bail!("no {needle:?} in {} within {timeout:?}", path.display());
        }
        thread::sleep(Duration::from_millis(200));
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

/// QEMU creates the socket and then waits for us before starting the guest.
pub fn connect(socket: &Path, child: &mut Child) -> Result<UnixStream> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("QEMU exited ({status}) before the guest started");
        }
        if let Ok(stream) = UnixStream::connect(socket) {
            return Ok(stream);
        }
        if Instant::now() > deadline {
            bail!(
                "QEMU did not open the socket {} within 30 s",
                socket.display()
            );
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Reads the agent's messages, never holding more than one line of at most
/// [`MAX_MESSAGE_LINE`] bytes: a guest flooding the channel gets the run
/// failed with that said, not the host's memory filled.
fn read_agent(
    stream: UnixStream,
    mut transcript: File,
    tx: mpsc::Sender<Result<AgentMessage, String>>,
    verbose: bool,
    paused: &AtomicBool,
) {
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        while paused.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(20));
        }
        let parsed = match read_line_or_stop(&mut reader, &mut line, MAX_MESSAGE_LINE) {
            Err(_) | Ok(Line::End | Line::Unterminated) => break,
            Ok(Line::Blank) => continue,
            Ok(Line::TooLong) => {
                // Nothing after it can be trusted to be a message.
                let _ = writeln!(
                    transcript,
                    "< (a line longer than {MAX_MESSAGE_LINE} bytes; stopped reading)"
                );
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
