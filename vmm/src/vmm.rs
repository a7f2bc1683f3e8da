//! [`Vmm`]: a VM built by [`crate::builder::VmmBuilder`], run until the
//! guest resets, something fails, or the VMM is told to stop; every vCPU is
//! out of KVM and joined before the exit report.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::ThreadId;
use std::time::Duration;

use event_manager::{EventManager, EventOps, EventSet, EventSubscriber, Events, SubscriberOps};
use kvm_ioctls::{Cap, Kvm, VmFd};
use perfbed_device::host::Ticker;
use perfbed_device::{ControlServer, SharedDevice};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::agent_channel::{accept_one, AgentChannel};
use crate::boot::cmdline::CmdlineError;
use crate::boot::LoadError;
use crate::config::{ConfigurationError, VmmConfig};
use crate::device_manager::{DeviceManager, DeviceManagerError};
use crate::devices::bus::BusError;
use crate::devices::virtio::mmio::TransportError;
use crate::gdb::hub::Hub;
use crate::gdb::target::VmTarget;
use crate::gdb::{GdbError, Listener};
use crate::memory::MemoryError;
use crate::stats::{rss_beyond, Stats};
use crate::vcpu::handle::{
    self, stop_all_but, stop_and_join, HandleError, Start, VcpuControl, VcpuHandle,
};
use crate::vcpu::{DebugExits, SharedVcpu, Vcpu, VcpuEnd, VcpuError};

/// How long the end of a run waits for every vCPU to leave KVM and end.
pub const VCPU_STOP_PATIENCE: Duration = Duration::from_secs(5);
/// How long the panic path waits for them (within the panic report's own
/// patience).
const PANIC_VCPU_STOP_PATIENCE: Duration = Duration::from_millis(1000);

/// Why the VMM could not be built or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    #[error(transparent)]
    Config(#[from] ConfigurationError),
    #[error("KVM: {what}: {source}")]
    Kvm {
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("KVM lacks {0:?}, which the VMM needs")]
    MissingCapability(Cap),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Boot(#[from] LoadError),
    #[error(transparent)]
    Cmdline(#[from] CmdlineError),
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    #[error("placing a device: {0}")]
    Bus(#[from] BusError),
    #[error("the monitoring device: {0}")]
    Device(#[from] perfbed_device::ConfigError),
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error(transparent)]
    DeviceManager(#[from] DeviceManagerError),
    #[error(transparent)]
    VcpuHandle(#[from] HandleError),
    #[error(transparent)]
    Gdb(#[from] GdbError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the GDT: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
    #[error("the event loop: {0}")]
    EventLoop(String),
    #[error("{0}")]
    VcpuFailed(String),
}

pub(crate) fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> VmmError {
    let what = what.into();
    move |source| VmmError::Io { what, source }
}

pub(crate) fn kvm_error(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmmError {
    move |source| VmmError::Kvm { what, source }
}

/// How the guest ended (each has its [`crate::exit_status::ExitStatus`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestEnd {
    /// The agent wrote the power-off register, then reset (its power-off is
    /// a reboot).
    PoweredOff,
    /// It panicked (the serial console showed the panic banner) and reset.
    Panicked,
    /// It reset or shut down with neither: a triple fault, or a reboot the
    /// agent did not make.
    UnexpectedReset,
    /// The VMM got SIGTERM or SIGINT and stopped the guest.
    Terminated,
    /// KVM could not run a vCPU (the reason).
    KvmFailure(String),
}

/// How a run ended, from the first vCPU end (`None`: a termination signal),
/// whether the agent wrote its power-off register, and whether the guest
/// panicked.
pub fn guest_end(
    end: Option<VcpuEnd>,
    powered_off: bool,
    panicked: bool,
) -> Result<GuestEnd, VmmError> {
    match end {
        None => Ok(GuestEnd::Terminated),
        // A panic wins: a panicking kernel never writes the port, but a
        // port written before a panic is still a panic.
        Some(VcpuEnd::Reset) if panicked => Ok(GuestEnd::Panicked),
        Some(VcpuEnd::Reset) if powered_off => Ok(GuestEnd::PoweredOff),
        Some(VcpuEnd::Reset) => Ok(GuestEnd::UnexpectedReset),
        Some(VcpuEnd::KvmFailure(why)) => Ok(GuestEnd::KvmFailure(why)),
        Some(VcpuEnd::Failed(why)) => Err(VmmError::VcpuFailed(why)),
        Some(VcpuEnd::Stopped) => Err(VmmError::VcpuFailed(
            "a vCPU stopped with no one asking".into(),
        )),
    }
}

/// A built VM, ready to run.
pub struct Vmm {
    pub(crate) config: VmmConfig,
    pub(crate) memory: GuestMemoryMmap,
    pub(crate) vcpus: Vec<Vcpu>,
    /// The buses and every device on them, for the whole run.
    pub(crate) devices: DeviceManager,
    pub(crate) panicked: Arc<AtomicBool>,
    pub(crate) device: SharedDevice,
    /// Lets time pass for the device's interrupts; stopped with the VM.
    pub(crate) _perfbed_ticker: Ticker,
    pub(crate) stats: Arc<Stats>,
    // Kept for the VM's lifetime: dropping them would close the VM.
    pub(crate) _vm: VmFd,
    pub(crate) _kvm: Kvm,
}

/// Host address ranges of the guest's RAM.
pub(crate) fn guest_ram_ranges(memory: &GuestMemoryMmap) -> Vec<(u64, u64)> {
    memory
        .iter()
        .filter_map(|r| {
            memory
                .get_host_address(r.start_addr())
                .ok()
                .map(|h| (h as u64, r.len()))
        })
        .collect()
}

impl Vmm {
    /// Serves the control socket, waits for the agent socket's client (if
    /// any), runs the vCPUs and the event loop until the guest resets, a
    /// vCPU fails, or SIGTERM/SIGINT arrives; then stops every vCPU, joins
    /// it, and prints the exit report.
    pub fn run(self) -> Result<GuestEnd, VmmError> {
        // The control socket answers `cpu_state` once the vCPUs run.
        let vcpu_controls: Arc<OnceLock<Vec<Arc<VcpuControl>>>> = Arc::default();
        let _control = match &self.config.endpoints.control_socket {
            Some(path) => Some(
                ControlServer::start(
                    self.device.clone(),
                    path,
                    Some(handle::control_source(vcpu_controls.clone())),
                )
                .map_err(io_error(format!(
                    "serving the control socket {}",
                    path.display()
                )))?,
            ),
            None => None,
        };
        // Bound before the guest waits for its agent, so that gdb can
        // connect as soon as the VMM runs.
        let gdb = match &self.config.endpoints.gdb {
            Some(config) => {
                let listener = Listener::bind(&config.listen)?;
                let hub = Arc::new(Hub::new().map_err(io_error("creating gdb's eventfd"))?);
                log::info!(
                    "gdb: listening on {:?}{}",
                    config.listen,
                    if config.stopped {
                        ", the vCPUs stopped until gdb continues"
                    } else {
                        ""
                    }
                );
                Some((listener, hub, config.stopped))
            }
            None => None,
        };
        let mut events: EventManager<Arc<dyn EventSubscriber + Send + Sync>> =
            EventManager::new().map_err(|e| VmmError::EventLoop(format!("{e:?}")))?;
        let terminate = crate::termination::watch().map_err(io_error("watching for SIGTERM"))?;
        let terminate_wait = terminate
            .try_clone()
            .map_err(io_error("cloning an eventfd"))?;
        let terminated = Arc::new(AtomicBool::new(false));
        events.add_subscriber(Arc::new(Wake {
            evt: terminate,
            flag: Some(terminated.clone()),
        }));
        let stream = match &self.config.endpoints.agent_socket {
            Some(path) => {
                log::info!(
                    "waiting for a client on the agent socket {}",
                    path.display()
                );
                let accepted = accept_one(path, &terminate_wait).map_err(io_error(format!(
                    "accepting on the agent socket {}",
                    path.display()
                )))?;
                if accepted.is_none() {
                    // No vCPU has started: nothing to stop or join.
                    log::info!("terminated by a signal while waiting for the agent's client");
                    report(
                        &self.stats,
                        &self.devices,
                        &self.memory,
                        (0, self.vcpus.len()),
                    );
                    return Ok(GuestEnd::Terminated);
                }
                accepted
            }
            None => None,
        };
        let devices = Arc::new(self.devices);
        if let Some(console) = devices.console() {
            let channel = AgentChannel::new(stream, console.clone())
                .map_err(io_error("joining the agent socket to the console"))?;
            events.add_subscriber(Arc::new(channel));
        }
        if let Some(serial) = devices.serial() {
            events.add_subscriber(serial.clone());
        }

        let ended: Arc<Mutex<Option<VcpuEnd>>> = Arc::new(Mutex::new(None));
        let ended_evt =
            EventFd::new(libc::EFD_NONBLOCK).map_err(io_error("creating an eventfd"))?;
        let wake = ended_evt
            .try_clone()
            .map_err(io_error("cloning an eventfd"))?;
        events.add_subscriber(Arc::new(Wake {
            evt: wake,
            flag: None,
        }));
        let vcpus = self.vcpus.len();
        let mut handles = Vec::with_capacity(vcpus);
        let mut shared: Vec<SharedVcpu> = Vec::with_capacity(vcpus);
        let debugger = gdb
            .as_ref()
            .map(|(_, hub, _)| hub.clone() as Arc<dyn DebugExits>);
        let start = match &gdb {
            Some((_, _, true)) => Start::Paused,
            _ => Start::Running,
        };
        for vcpu in self.vcpus {
            let index = u32::from(vcpu.index());
            let runner = vcpu.into_runner(
                devices.io_bus().clone(),
                devices.mmio_bus().clone(),
                self.stats.clone(),
                debugger.clone(),
            );
            // Some exactly when there is a debugger, which is when gdb below needs them.
            shared.extend(runner.shared());
            let (ended, evt) = (
                ended.clone(),
                ended_evt
                    .try_clone()
                    .map_err(io_error("cloning an eventfd"))?,
            );
            let on_end = move |end: &VcpuEnd| {
                // A stop is the VMM's own doing, not the run's end.
                if *end != VcpuEnd::Stopped {
                    ended
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(end.clone());
                    let _ = evt.write(1);
                }
            };
            match VcpuHandle::spawn_with(index, runner, on_end, start) {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    stop_and_join(handles, VCPU_STOP_PATIENCE);
                    return Err(e.into());
                }
            }
        }
        let controls: Vec<Arc<VcpuControl>> = handles.iter().map(VcpuHandle::control).collect();
        let _ = vcpu_controls.set(controls.clone());
        if let Some((listener, hub, _)) = gdb {
            let target = VmTarget::new(
                shared,
                controls.clone(),
                self.memory.clone(),
                devices.mmio_bus().clone(),
                hub,
            );
            if let Err(e) = crate::gdb::serve(listener, target) {
                stop_and_join(handles, VCPU_STOP_PATIENCE);
                return Err(e.into());
            }
        }

        let on_panic = (self.stats.clone(), devices.clone(), self.memory.clone());
        crate::panic_report::install(Arc::new(move |panicking: ThreadId| {
            let (stats, devices, memory) = &on_panic;
            let joined = stop_all_but(&controls, panicking, PANIC_VCPU_STOP_PATIENCE);
            report(stats, devices, memory, (joined, controls.len()));
        }));

        let end = loop {
            events
                .run_with_timeout(500)
                .map_err(|e| VmmError::EventLoop(format!("{e:?}")))?;
            // What the vCPUs left for the host: a partial line of serial
            // output, the first accesses to an unhandled address.
            devices.drain();
            if let Some(end) = ended.lock().unwrap_or_else(|p| p.into_inner()).take() {
                break Some(end);
            }
            if terminated.load(Ordering::SeqCst) {
                log::info!("terminated by a signal; stopping the vCPUs");
                break None;
            }
        };
        if let Some(why) = unexpected(
            end.as_ref(),
            devices.powered_off(),
            self.panicked.load(Ordering::SeqCst),
        ) {
            handle::report(vcpu_controls.get().map_or(&[][..], Vec::as_slice), &why);
        }
        let (joined, errors) = stop_and_join(handles, VCPU_STOP_PATIENCE);
        for e in &errors {
            log::error!("stopping the vCPUs: {e}");
        }
        report(&self.stats, &devices, &self.memory, (joined.len(), vcpus));
        if let Some(e) = errors.into_iter().next() {
            return Err(e.into());
        }
        guest_end(
            end,
            devices.powered_off(),
            self.panicked.load(Ordering::SeqCst),
        )
    }
}

/// Why the vCPUs' state is worth keeping at the end of a run that ended
/// with `end`: a KVM failure or a reset nobody asked for.
fn unexpected(end: Option<&VcpuEnd>, powered_off: bool, panicked: bool) -> Option<String> {
    match guest_end(end.cloned(), powered_off, panicked) {
        Ok(GuestEnd::KvmFailure(why)) => Some(format!("KVM failure: {why}")),
        Ok(GuestEnd::UnexpectedReset) => {
            Some("the guest reset with neither the agent's power-off nor a panic".into())
        }
        _ => None,
    }
}

/// Wakes the event loop when its eventfd is written (a vCPU ended the run,
/// or a termination signal came, which also sets `flag`).
struct Wake {
    evt: EventFd,
    flag: Option<Arc<AtomicBool>>,
}

impl EventSubscriber for Wake {
    fn init(&self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.evt, EventSet::IN)) {
            log::error!("watching an eventfd for the end of the run: {e:?}");
        }
    }

    fn process(&self, _events: Events, _ops: &mut EventOps) {
        let _ = self.evt.read();
        if let Some(flag) = &self.flag {
            flag.store(true, Ordering::SeqCst);
        }
    }
}

/// The exit report: the serial log flushed, then the run's figures, one
/// `perfbed-vmm: stat key=value` line each.
fn report(
    stats: &Stats,
    devices: &DeviceManager,
    memory: &GuestMemoryMmap,
    (joined, vcpus): (usize, usize),
) {
    devices.flush();
    let (first_run, first_exit) = stats.boot_times();
    let mut lines = vec![
        format!("start_to_first_kvm_run_us={}", first_run / 1000),
        format!("start_to_first_exit_us={}", first_exit / 1000),
        format!("io_exits={}", stats.io_exits.load(Ordering::Relaxed)),
        format!("mmio_exits={}", stats.mmio_exits.load(Ordering::Relaxed)),
    ];
    lines.extend(devices.figures());
    // Every vCPU out of KVM_RUN and its thread ended before these lines.
    lines.push(format!("vcpus_joined={joined}"));
    lines.push(format!("vcpus={vcpus}"));
    if let Some(rss) = rss_beyond(&guest_ram_ranges(memory)) {
        lines.push(format!("rss_beyond_guest_ram_kib={}", rss / 1024));
    }
    for line in lines {
        // The report, not a log record: printed at any log level.
        eprintln!("perfbed-vmm: stat {line}");
    }
    for line in devices.recorded_accesses() {
        eprintln!("perfbed-vmm: access {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reset_is_a_power_off_only_after_the_agents_write_and_a_panic_wins() {
        let reset = || Some(VcpuEnd::Reset);
        assert_eq!(
            guest_end(reset(), true, false).unwrap(),
            GuestEnd::PoweredOff
        );
        assert_eq!(
            guest_end(reset(), false, false).unwrap(),
            GuestEnd::UnexpectedReset
        );
        assert_eq!(guest_end(reset(), false, true).unwrap(), GuestEnd::Panicked);
        assert_eq!(guest_end(reset(), true, true).unwrap(), GuestEnd::Panicked);
        assert_eq!(guest_end(None, true, true).unwrap(), GuestEnd::Terminated);
        assert_eq!(
            guest_end(Some(VcpuEnd::KvmFailure("entry".into())), true, false).unwrap(),
            GuestEnd::KvmFailure("entry".into())
        );
        assert!(matches!(
            guest_end(Some(VcpuEnd::Failed("EFAULT".into())), false, false),
            Err(VmmError::VcpuFailed(_))
        ));
        assert!(guest_end(Some(VcpuEnd::Stopped), false, false).is_err());
    }

    #[test]
    fn the_vcpus_are_captured_at_a_kvm_failure_or_an_unasked_reset_only() {
        let reset = Some(VcpuEnd::Reset);
        assert!(unexpected(reset.as_ref(), false, false).is_some_and(|why| why.contains("reset")));
        let failed = Some(VcpuEnd::KvmFailure("vCPU 1: KVM internal error".into()));
        assert_eq!(
            unexpected(failed.as_ref(), true, false).as_deref(),
            Some("KVM failure: vCPU 1: KVM internal error")
        );
        assert_eq!(
            unexpected(reset.as_ref(), true, false),
            None,
            "the agent's power-off"
        );
        assert_eq!(
            unexpected(reset.as_ref(), false, true),
            None,
            "a panic has its own report"
        );
        assert_eq!(unexpected(None, false, false), None, "a termination signal");
        assert_eq!(
            unexpected(Some(&VcpuEnd::Failed("EFAULT".into())), false, false),
            None,
            "the host's error"
        );
    }
}
