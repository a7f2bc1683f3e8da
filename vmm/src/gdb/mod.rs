//! gdb's remote protocol for the guest, through the `gdbstub` crate (as
//! Cloud Hypervisor and Firecracker serve it): a stub thread beside the
//! event loop, serving one gdb at a time on a TCP port of 127.0.0.1 or a
//! Unix socket.
//!
//! - [`target`]: the VM as gdbstub's multi-thread target (a thread per
//!   vCPU): registers, memory, breakpoints, continue and step;
//! - [`hub`]: where the vCPU threads hand their debug exits to the stub;
//! - [`breakpoints`]: `int3`s in guest memory; [`paging`]: a guest virtual
//!   address to a physical one; [`regs`]: KVM's registers as gdb's.
//!
//! When gdb connects, every vCPU is paused (gdb expects a stopped target);
//! when it detaches or goes away, its breakpoints are removed, guest
//! debugging is cleared and every vCPU runs again, and the next gdb may
//! connect. With `stopped`, the vCPUs start paused (before the boot vCPU's
//! first instruction) until a gdb lets them go, as QEMU's `-S`.

pub mod breakpoints;
pub mod hub;
pub mod paging;
pub mod regs;
pub mod target;

use std::io;
use std::net::TcpListener;
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixListener;
use std::thread::{self, JoinHandle};

use gdbstub::common::Signal;
use gdbstub::conn::ConnectionExt;
use gdbstub::stub::run_blocking::{BlockingEventLoop, Event, WaitForStopReasonError};
use gdbstub::stub::{DisconnectReason, GdbStub, MultiThreadStopReason};

use crate::config::GdbListen;
use target::{TargetFailure, VmTarget};

/// Why the stub could not start.
#[derive(Debug, thiserror::Error)]
pub enum GdbError {
    #[error("gdb: listening on {what}: {source}")]
    Listen {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("gdb: starting the stub's thread: {0}")]
    Thread(#[source] io::Error),
}

/// gdb's listening socket, bound before the guest starts.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

type Conn = Box<dyn ConnectionExt<Error = io::Error>>;

impl Listener {
    pub fn bind(listen: &GdbListen) -> Result<Listener, GdbError> {
        let failed = |what: String| move |source| GdbError::Listen { what, source };
        match listen {
            GdbListen::Tcp(port) => {
                let what = format!("127.0.0.1:{port}");
                TcpListener::bind(("127.0.0.1", *port))
                    .map(Listener::Tcp)
                    .map_err(failed(what))
            }
            GdbListen::Unix(path) => {
                let _ = std::fs::remove_file(path);
                UnixListener::bind(path)
                    .map(Listener::Unix)
                    .map_err(failed(path.display().to_string()))
            }
        }
    }

    fn accept(&self) -> io::Result<(Conn, RawFd)> {
        match self {
            Listener::Tcp(l) => {
                let (stream, _) = l.accept()?;
                stream.set_nodelay(true)?;
                let fd = stream.as_raw_fd();
                Ok((Box::new(stream), fd))
            }
            Listener::Unix(l) => {
                let (stream, _) = l.accept()?;
                let fd = stream.as_raw_fd();
                Ok((Box::new(stream), fd))
            }
        }
    }
}

/// Serves gdb on `listener` for the VM behind `target`, one session after
/// another, on a thread of its own.
pub fn serve(listener: Listener, mut target: VmTarget) -> Result<JoinHandle<()>, GdbError> {
    thread::Builder::new()
        .name("gdb".into())
        .spawn(move || loop {
            let (conn, fd) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(e) => {
                    log::error!("gdb: accepting a connection: {e}; the stub stops");
                    return;
                }
            };
            log::info!("gdb: connected; the vCPUs are paused");
            if let Err(e) = target.pause_all() {
                log::error!("gdb: pausing the vCPUs: {e}");
            }
            CONN_FD.with(|c| c.set(fd));
            let ended = GdbStub::new(conn).run_blocking::<StubLoop>(&mut target);
            match ended {
                Ok(DisconnectReason::Disconnect) => log::info!("gdb: detached; the vCPUs run on"),
                Ok(DisconnectReason::Kill) => {
                    log::info!("gdb: kill asked; the vCPUs run on (power the guest off instead)")
                }
                Ok(other) => log::info!("gdb: session ended ({other:?}); the vCPUs run on"),
                Err(e) => log::warn!("gdb: session ended: {e}; the vCPUs run on"),
            }
            target.release();
        })
        .map_err(GdbError::Thread)
}

thread_local! {
    /// The stub thread's current connection, for its poll (gdbstub owns
    /// the stream itself).
    static CONN_FD: std::cell::Cell<RawFd> = const { std::cell::Cell::new(-1) };
}

/// gdbstub's blocking loop while the guest runs: wait for a vCPU's stop or
/// a byte from gdb (its Ctrl-C), whichever comes first.
enum StubLoop {}

impl BlockingEventLoop for StubLoop {
    type Target = VmTarget;
    type Connection = Conn;
    type StopReason = MultiThreadStopReason<u64>;

    fn wait_for_stop_reason(
        target: &mut VmTarget,
        conn: &mut Conn,
    ) -> Result<Event<Self::StopReason>, WaitForStopReasonError<TargetFailure, io::Error>> {
        let conn_fd = CONN_FD.with(std::cell::Cell::get);
        loop {
            if let Some(stop) = target.hub.take_stop() {
                target.pause_all().map_err(WaitForStopReasonError::Target)?;
                return Ok(Event::TargetStopped(VmTarget::stop_reason(stop)));
            }
            let mut fds = [
                libc::pollfd {
                    fd: conn_fd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: target.hub.wake.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfd structs for the call's length; both
            // descriptors stay open across it (gdbstub owns the stream, the
            // hub its eventfd).
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1000) };
            if ready < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(WaitForStopReasonError::Connection(e));
            }
            if fds[0].revents != 0 {
                let byte = conn.read().map_err(WaitForStopReasonError::Connection)?;
                return Ok(Event::IncomingData(byte));
            }
        }
    }

    fn on_interrupt(target: &mut VmTarget) -> Result<Option<Self::StopReason>, TargetFailure> {
        target.pause_all()?;
        Ok(Some(MultiThreadStopReason::SignalWithThread {
            tid: target::tid(0),
            signal: Signal::SIGINT,
        }))
    }
}
