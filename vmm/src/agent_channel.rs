//! The host end of the agent channel: a Unix socket joined to the virtio
//! console, and the console's queue notifiers, all served from the event
//! loop (an event-manager subscriber).
//!
//! Like QEMU's `-chardev socket,server=on,wait=on`, the VMM listens, waits
//! for one client, and only then starts the guest, so nothing the guest says
//! is lost.
//!
//! Nothing here blocks: the socket is non-blocking, the console buffers a
//! bounded amount of guest output and this subscriber watches the socket for
//! writability only while some waits ([`Console::output_pending`]), and for
//! readability only while the console takes more input
//! ([`Console::input_paused`]). The vCPUs' notifies arrive as eventfds (KVM
//! ioeventfds), so a vCPU never waits for the host's reader: while the
//! reader is slow the guest's writers wait in the guest (back-pressure).
//!
//! No lock is held across the socket's `read(2)` or `write(2)`: output is
//! copied out of the console under the transport's lock (which the vCPUs'
//! register accesses take), written after it is dropped, and only then
//! taken from the console ([`Console::consume_output`]); input is read into
//! a buffer first and handed over after.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use event_manager::{EventOps, EventSet, EventSubscriber, Events};
use vmm_sys_util::eventfd::EventFd;

use crate::devices::virtio::console::Console;
use crate::devices::virtio::mmio::MmioTransport;

const STREAM: u32 = 0;
/// Queue `i`'s notifier is `NOTIFIER + i`.
const NOTIFIER: u32 = 1;

/// Binds `path` (replacing a stale socket) and waits for the one client,
/// or until `stop` (the termination eventfd) becomes readable: `None` then.
/// The wait is a `poll(2)` on both, since std's `accept` retries on `EINTR`
/// and would sleep through SIGTERM.
pub fn accept_one(path: &Path, stop: &EventFd) -> io::Result<Option<UnixStream>> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if meta.file_type().is_socket() {
            std::fs::remove_file(path)?;
        }
    }
    let listener = UnixListener::bind(path)?;
    listener.set_nonblocking(true)?;
    let stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break Some(stream),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds, for the call's length.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if rc < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return Err(io::Error::last_os_error());
        }
        if fds[1].revents & libc::POLLIN != 0 {
            break None;
        }
    };
    // One client only: later connections are refused.
    drop(listener);
    let _ = std::fs::remove_file(path);
    if let Some(stream) = &stream {
        // The accepted socket must not inherit the listener's mode here;
        // `AgentChannel::new` sets what it needs.
        stream.set_nonblocking(false)?;
    }
    Ok(stream)
}

/// Guest output copied out per `write(2)`.
const WRITE_CHUNK: usize = 16 * 1024;

struct State {
    /// The socket's registered interest; `None` once it hung up (or with
    /// no socket).
    watching: Option<EventSet>,
    /// Output copied out of the console for one write.
    out: Vec<u8>,
}

pub struct AgentChannel {
    stream: Option<UnixStream>,
    notifiers: Vec<EventFd>,
    console: Arc<MmioTransport<Console>>,
    state: Mutex<State>,
}

impl AgentChannel {
    /// Serves `console`'s queue notifiers and, with a `stream`, joins it to
    /// the console (made non-blocking; the console's output is written to
    /// it from here).
    pub fn new(
        stream: Option<UnixStream>,
        console: Arc<MmioTransport<Console>>,
    ) -> io::Result<AgentChannel> {
        let notifiers = console.notifiers()?;
        if let Some(stream) = &stream {
            stream.set_nonblocking(true)?;
            console.with_device(|c| c.connect());
        }
        let watching = stream.as_ref().map(|_| EventSet::IN);
        let state = State {
            watching,
            out: vec![0; WRITE_CHUNK],
        };
        Ok(AgentChannel {
            stream,
            notifiers,
            console,
            state: Mutex::new(state),
        })
    }

    /// Writes what the socket takes of the console's output, each chunk
    /// copied out under the transport's lock and written without it; true
    /// if any was written (the console has room for more of the guest's).
    fn write_output(&self, ops: &mut EventOps, state: &mut State) -> bool {
        let Some(stream) = &self.stream else {
            return false;
        };
        let mut wrote = false;
        while state.watching.is_some() {
            let n = self.console.with_device(|c| c.peek_output(&mut state.out));
            if n == 0 {
                break;
            }
            match io::Write::write(&mut &*stream, &state.out[..n]) {
                Ok(0) => self.hang_up(ops, state),
                Ok(written) => {
                    self.console.with_device(|c| c.consume_output(written));
                    wrote = true;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => self.hang_up(ops, state),
            }
        }
        wrote
    }

    fn read_input(&self, ops: &mut EventOps, state: &mut State) {
        let Some(stream) = &self.stream else { return };
        let mut buf = [0u8; 4096];
        match io::Read::read(&mut &*stream, &mut buf) {
            Ok(0) => self.hang_up(ops, state),
            Ok(n) => {
                self.console.with_device(|c| c.push_input(&buf[..n]));
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => self.hang_up(ops, state),
        }
    }

    fn hang_up(&self, ops: &mut EventOps, state: &mut State) {
        if let (Some(stream), Some(watching)) = (&self.stream, state.watching.take()) {
            let _ = ops.remove(Events::with_data(stream, STREAM, watching));
            self.console.with_device(|c| c.disconnect());
            log::info!("the agent socket's client went away; the guest's port is closed");
        }
    }

    /// Lets the console move what it can, then watches the socket for what
    /// the console now waits for.
    fn run_console(&self, ops: &mut EventOps, state: &mut State) {
        let (_, more) = self.console.poll(|_| ());
        // Room made by the write may let the device take more chains.
        if self.write_output(ops, state) || more {
            // Come back after the other ready events (level-triggered).
            if let Some(evt) = self.notifiers.first() {
                let _ = evt.write(1);
            }
        }
        let (Some(stream), Some(watching)) = (&self.stream, state.watching) else {
            return;
        };
        let (pending, paused) = self
            .console
            .with_device(|c| (c.output_pending(), c.input_paused()));
        let mut want = EventSet::empty();
        if !paused {
            want |= EventSet::IN;
        }
        if pending {
            want |= EventSet::OUT;
        }
        if want != watching {
            if ops.modify(Events::with_data(stream, STREAM, want)).is_ok() {
                state.watching = Some(want);
            } else {
                log::error!("cannot change what the agent socket is watched for");
            }
        }
    }
}

impl EventSubscriber for AgentChannel {
    fn init(&self, ops: &mut EventOps) {
        for (i, evt) in self.notifiers.iter().enumerate() {
            if let Err(e) = ops.add(Events::with_data(evt, NOTIFIER + i as u32, EventSet::IN)) {
                log::error!("watching the console's queue {i}: {e:?}");
            }
        }
        if let Some(stream) = &self.stream {
            if let Err(e) = ops.add(Events::with_data(stream, STREAM, EventSet::IN)) {
                log::error!("watching the agent socket: {e:?}");
            }
        }
    }

    fn process(&self, events: Events, ops: &mut EventOps) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let set = events.event_set();
        match events.data() {
            STREAM => {
                if set.contains(EventSet::IN) {
                    self.read_input(ops, &mut state);
                } else if set.intersects(EventSet::HANG_UP | EventSet::ERROR)
                    && !set.contains(EventSet::OUT)
                {
                    self.hang_up(ops, &mut state);
                }
            }
            n => {
                if let Some(evt) = self.notifiers.get((n - NOTIFIER) as usize) {
                    let _ = evt.read();
                }
            }
        }
        self.run_console(ops, &mut state);
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn socket_path(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("perfbed-vmm-accept-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("agent.sock")
    }

    #[test]
    fn the_wait_for_the_client_ends_when_the_termination_eventfd_is_written() {
        let path = socket_path("stop");
        let stop = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let writer = stop.try_clone().unwrap();
        let start = Instant::now();
        let signaller = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            writer.write(1).unwrap();
        });
        let accepted = accept_one(&path, &stop).unwrap();
        signaller.join().unwrap();
        assert!(accepted.is_none(), "no client connected");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "took {:?}",
            start.elapsed()
        );
        assert!(!path.exists(), "the socket file is left behind");
        assert_eq!(
            stop.read().unwrap(),
            1,
            "the event stays for the event loop"
        );
    }

    #[test]
    fn a_client_is_accepted_and_its_stream_is_blocking() {
        let path = socket_path("client");
        let stop = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let client_path = path.clone();
        let client = std::thread::spawn(move || loop {
            if let Ok(stream) = UnixStream::connect(&client_path) {
                return stream;
            }
            std::thread::sleep(Duration::from_millis(10));
        });
        let stream = accept_one(&path, &stop).unwrap().expect("a client");
        let mut client = client.join().unwrap();
        io::Write::write_all(&mut client, b"hi").unwrap();
        let mut buf = [0u8; 2];
        io::Read::read_exact(&mut &stream, &mut buf).unwrap();
        assert_eq!(&buf, b"hi");
    }
}
