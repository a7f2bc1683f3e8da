//! gdb's connections from the host to perfbed-vmm's stub in L1.
//!
//! QEMU serves gdb's TCP port on the host and carries it on a virtio-serial
//! port; unlike the agent's and the control socket's single connections,
//! gdb may come and go (detach, attach again). Linux tells a port's reader
//! whether the host side is connected (`poll` has `POLLHUP` while it is
//! not), so each host connection gets a connection of its own to the stub:
//! made when the host side connects, closed when it goes (the stub then
//! removes its breakpoints and lets the vCPUs run, as on a detach).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration;

/// Relays every gdb connection on `port` to the stub at `socket`, on a
/// thread of its own, for L1's life.
pub fn start(port: PathBuf, socket: PathBuf) -> Result<(), String> {
    let port = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&port)
        .map_err(|e| format!("opening {}: {e}", port.display()))?;
    thread::spawn(move || loop {
        wait_for_host(&port);
        match connect(&socket) {
            Ok(stub) => {
                eprintln!(
                    "perfbed-box: gdb connected; relaying it to {}",
                    socket.display()
                );
                if let Err(e) = session(&port, stub) {
                    eprintln!("perfbed-box: gdb relay: {e}");
                }
                eprintln!("perfbed-box: gdb's connection ended");
            }
            Err(e) => {
                eprintln!("perfbed-box: gdb: connecting to {}: {e}", socket.display());
                thread::sleep(Duration::from_secs(1));
            }
        }
    });
    Ok(())
}

/// Polls `fds` for at most `timeout_ms`; an interrupted poll is no error.
fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<()> {
    // SAFETY: `fds` is a valid array of pollfd for its length; the
    // descriptors are open for the call.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

fn pollfd(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Returns once the host side of `port` is connected.
fn wait_for_host(port: &File) {
    loop {
        let mut fds = [pollfd(port.as_raw_fd())];
        if poll(&mut fds, 1000).is_ok() && fds[0].revents & libc::POLLHUP == 0 {
            return;
        }
        // POLLHUP comes at once while the host side is away.
        thread::sleep(Duration::from_millis(50));
    }
}

fn connect(socket: &Path) -> io::Result<UnixStream> {
    let mut tries = 0;
    loop {
        match UnixStream::connect(socket) {
            Ok(stream) => return Ok(stream),
            // perfbed-vmm may not be listening yet.
            Err(_) if tries < 100 => {
                tries += 1;
                thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Copies both ways until the host side goes or the stub closes.
fn session(mut port: &File, mut stub: UnixStream) -> io::Result<()> {
    let mut buf = [0u8; 4096];
    loop {
        let mut fds = [pollfd(port.as_raw_fd()), pollfd(stub.as_raw_fd())];
        poll(&mut fds, 1000)?;
        if fds[0].revents & libc::POLLIN != 0 {
            let n = port.read(&mut buf)?;
            if n == 0 {
                // No data and no host: gdb went away.
                return Ok(());
            }
            stub.write_all(&buf[..n])?;
        } else if fds[0].revents & libc::POLLHUP != 0 {
            return Ok(());
        }
        if fds[1].revents != 0 {
            let n = stub.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            port.write_all(&buf[..n])?;
        }
    }
}
