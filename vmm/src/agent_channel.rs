//! The host end of the agent channel: a Unix socket joined to the virtio
//! console, served from the event loop.
//!
//! Like QEMU's `-chardev socket,server=on,wait=on`, the VMM listens, waits
//! for one client, and only then starts the guest, so nothing the guest says
//! is lost. Guest output is written to the socket by the console itself
//! (from the vCPU that notified); host input arrives here.

use std::io;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use event_manager::{EventOps, EventSet, EventSubscriber, Events};
use vmm_sys_util::eventfd::EventFd;

use crate::devices::virtio::console::Console;
use crate::devices::virtio::mmio::MmioTransport;

const STREAM: u32 = 1;
const RESUME: u32 = 2;

/// Binds `path` (replacing a stale socket) and waits for the one client.
pub fn accept_one(path: &Path) -> io::Result<UnixStream> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if meta.file_type().is_socket() {
            std::fs::remove_file(path)?;
        }
    }
    let listener = UnixListener::bind(path)?;
    let (stream, _) = listener.accept()?;
    // One client only: later connections are refused.
    drop(listener);
    let _ = std::fs::remove_file(path);
    Ok(stream)
}

struct State {
    connected: bool,
    paused: bool,
}

pub struct AgentChannel {
    stream: UnixStream,
    resume: EventFd,
    console: Arc<MmioTransport<Console>>,
    state: Mutex<State>,
}

impl AgentChannel {
    /// Joins `stream` to the console: its write half becomes the console's
    /// output. `resume` is the eventfd the console writes when paused input
    /// may flow again.
    pub fn new(stream: UnixStream, resume: EventFd, console: Arc<MmioTransport<Console>>) -> io::Result<AgentChannel> {
        let output = stream.try_clone()?;
        console.poll(|c| c.connect(Box::new(output)));
        Ok(AgentChannel { stream, resume, console, state: Mutex::new(State { connected: true, paused: false }) })
    }

    fn stream_events(&self) -> Events {
        Events::with_data(&self.stream, STREAM, EventSet::IN | EventSet::HANG_UP | EventSet::ERROR)
    }

    fn read_input(&self, ops: &mut EventOps, state: &mut State) {
        let mut buf = [0u8; 4096];
        // Non-blocking for this call only: the console writes to the same
        // socket from vCPU threads and wants blocking writes.
        // SAFETY: `buf` is valid for `buf.len()` bytes and the fd is open.
        let n = unsafe { libc::recv(self.stream.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n > 0 {
            let mut paused = false;
            self.console.poll(|c| paused = c.push_input(&buf[..n as usize]));
            if paused && !state.paused {
                state.paused = true;
                let _ = ops.remove(self.stream_events());
            }
            return;
        }
        if n < 0 {
            let err = io::Error::last_os_error();
            if matches!(err.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)) {
                return;
            }
        }
        self.hang_up(ops, state);
    }

    fn hang_up(&self, ops: &mut EventOps, state: &mut State) {
        if state.connected {
            state.connected = false;
            if !state.paused {
                let _ = ops.remove(self.stream_events());
            }
            self.console.poll(|c| c.disconnect());
            eprintln!("perfbed-vmm: the agent socket's client went away; guest output on the console is dropped");
        }
    }
}

impl EventSubscriber for AgentChannel {
    fn init(&self, ops: &mut EventOps) {
        if let Err(e) = ops.add(self.stream_events()) {
            eprintln!("perfbed-vmm: watching the agent socket: {e:?}");
        }
        if let Err(e) = ops.add(Events::with_data(&self.resume, RESUME, EventSet::IN)) {
            eprintln!("perfbed-vmm: watching the console's resume event: {e:?}");
        }
    }

    fn process(&self, events: Events, ops: &mut EventOps) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match events.data() {
            STREAM if events.event_set().contains(EventSet::IN) => self.read_input(ops, &mut state),
            STREAM => self.hang_up(ops, &mut state),
            RESUME => {
                let _ = self.resume.read();
                if state.paused {
                    state.paused = false;
                    if state.connected {
                        let _ = ops.add(self.stream_events());
                    }
                }
            }
            _ => {}
        }
    }
}
