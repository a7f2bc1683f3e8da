//! The box's `/init`: load KVM, run perfbed-vmm, relay its sockets to the
//! host through virtio-serial ports, end L1 with its exit status.
//!
//! See the library (`src/lib.rs`) for the contract with xtask.

mod gdb_relay;

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

mod stall_watch;

use perfbed_box_init::{
    decode_args, terminate_before_agent, wants_gdb, BOX_FAILED, DEBUG_EXIT_PORT, GDB_SOCKET,
    GUEST_INITRAMFS, GUEST_KERNEL, MODULE_ORDER, PORT_AGENT, PORT_CONTROL, PORT_GDB, PORT_SERIAL,
    VMM_PATH,
};

const AGENT_SOCKET: &str = "/run/agent.sock";
const CONTROL_SOCKET: &str = "/run/control.sock";

fn main() {
    let status = match run() {
        Ok(status) => status,
        Err(e) => {
            eprintln!("perfbed-box: {e}");
            BOX_FAILED
        }
    };
    end_l1(status);
}

fn run() -> Result<u8, String> {
    let started = Instant::now();
    for (source, target, fstype) in [
        ("proc", "/proc", "proc"),
        ("sysfs", "/sys", "sysfs"),
        ("devtmpfs", "/dev", "devtmpfs"),
    ] {
        mount(source, target, fstype)?;
    }
    fs::create_dir_all("/run").map_err(|e| format!("creating /run: {e}"))?;
    load_modules()?;
    wait_for(Path::new("/dev/kvm"), Duration::from_secs(10))?;
    let cmdline =
        fs::read_to_string("/proc/cmdline").map_err(|e| format!("reading /proc/cmdline: {e}"))?;
    let args =
        decode_args(&cmdline).ok_or("no perfbed-vmm arguments on the kernel command line")?;
    if args.first().map(String::as_str) == Some("--bench-exits") {
        // The exit benchmark needs no guest and no ports: its figures go to
        // the console.
        let status = Command::new(VMM_PATH)
            .args(&args)
            .status()
            .map_err(|e| format!("starting {VMM_PATH}: {e}"))?;
        return Ok(status.code().map_or(BOX_FAILED, |c| c as u8));
    }
    let agent_port = find_port(PORT_AGENT)?;
    let control_port = find_port(PORT_CONTROL)?;
    let serial_port = find_port(PORT_SERIAL)?;
    let gdb_port = if wants_gdb(&args) {
        Some(find_port(PORT_GDB)?)
    } else {
        None
    };
    let uptime = fs::read_to_string("/proc/uptime").unwrap_or_default();
    eprintln!(
        "perfbed-box: L1 ready: uptime {} s, /init took {} ms; starting perfbed-vmm",
        uptime.split_whitespace().next().unwrap_or("?"),
        started.elapsed().as_millis()
    );

    let mut vmm = Command::new(VMM_PATH)
        .args(["--kernel", GUEST_KERNEL, "--initramfs", GUEST_INITRAMFS])
        .args(&args)
        .args([
            "--agent-socket",
            AGENT_SOCKET,
            "--control-socket",
            CONTROL_SOCKET,
        ])
        .arg("--serial-log")
        .arg(&serial_port)
        .spawn()
        .map_err(|e| format!("starting {VMM_PATH}: {e}"))?;
    stall_watch::spawn(vmm.id());
    if let Some(port) = gdb_port {
        gdb_relay::start(port, PathBuf::from(GDB_SOCKET))?;
    }

    // The VMM serves the control socket before it waits for the agent
    // socket's client, and starts the guest once we connect there.
    let control = connect(Path::new(CONTROL_SOCKET), &mut vmm)?;
    relay(control, &control_port)?;
    if terminate_before_agent(&args) {
        // The signal test: perfbed-vmm now waits for our connection.
        wait_for(Path::new(AGENT_SOCKET), Duration::from_secs(30))?;
        eprintln!(
            "perfbed-box: sending SIGTERM to perfbed-vmm while it waits for the agent's client"
        );
        // SAFETY: kill(2) on our child's pid, not yet reaped.
        unsafe { libc::kill(vmm.id() as libc::pid_t, libc::SIGTERM) };
    } else {
        let agent = connect(Path::new(AGENT_SOCKET), &mut vmm)?;
        relay(agent, &agent_port)?;
    }

    let status = vmm
        .wait()
        .map_err(|e| format!("waiting for perfbed-vmm: {e}"))?;
    eprintln!("perfbed-box: perfbed-vmm exited: {status}");
    Ok(status.code().map_or(BOX_FAILED, |c| c as u8))
}

fn mount(source: &str, target: &str, fstype: &str) -> Result<(), String> {
    fs::create_dir_all(target).map_err(|e| format!("creating {target}: {e}"))?;
    let c = |s: &str| CString::new(s).map_err(|e| e.to_string());
    let (source_c, target_c, fstype_c) = (c(source)?, c(target)?, c(fstype)?);
    // SAFETY: three NUL-terminated strings that outlive the call, no data.
    let rc = unsafe {
        libc::mount(
            source_c.as_ptr(),
            target_c.as_ptr(),
            fstype_c.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    let err = io::Error::last_os_error();
    if rc != 0 && err.raw_os_error() != Some(libc::EBUSY) {
        return Err(format!("mount {target}: {err}"));
    }
    Ok(())
}

/// Loads `/lib/modules/order`'s modules: `<file> [params]` a line.
fn load_modules() -> Result<(), String> {
    let order = fs::read_to_string(format!("/{MODULE_ORDER}"))
        .map_err(|e| format!("reading /{MODULE_ORDER}: {e}"))?;
    for line in order.lines().filter(|l| !l.trim().is_empty()) {
        let (file, params) = line.split_once(' ').unwrap_or((line, ""));
        let path = format!("/lib/modules/{file}");
        let module = File::open(&path).map_err(|e| format!("opening {path}: {e}"))?;
        let params_c = CString::new(params).map_err(|e| e.to_string())?;
        // SAFETY: finit_module reads the open file and the NUL-terminated
        // parameters, both valid for the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_finit_module,
                module.as_raw_fd(),
                params_c.as_ptr(),
                0,
            )
        };
        let err = io::Error::last_os_error();
        if rc != 0 && err.raw_os_error() != Some(libc::EEXIST) {
            return Err(format!("loading {path} ({params}): {err}"));
        }
    }
    Ok(())
}

fn wait_for(path: &Path, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    while !path.exists() {
        if Instant::now() > deadline {
            return Err(format!(
                "{} did not appear within {timeout:?}",
                path.display()
            ));
        }
        thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The `/dev/vportNpM` whose sysfs `name` is `name`.
fn find_port(name: &str) -> Result<PathBuf, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(entries) = fs::read_dir("/sys/class/virtio-ports") {
            for entry in entries.flatten() {
                let port_name = fs::read_to_string(entry.path().join("name")).unwrap_or_default();
                if port_name.trim() == name {
                    let dev = Path::new("/dev").join(entry.file_name());
                    wait_for(&dev, Duration::from_secs(5))?;
                    return Ok(dev);
                }
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "no virtio-serial port named {name} (is virtio_console loaded?)"
            ));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn connect(socket: &Path, vmm: &mut std::process::Child) -> Result<UnixStream, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(stream) = UnixStream::connect(socket) {
            return Ok(stream);
        }
        if let Ok(Some(status)) = vmm.try_wait() {
            return Err(format!(
                "perfbed-vmm exited ({status}) before serving {}",
                socket.display()
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "perfbed-vmm did not serve {} within 30 s",
                socket.display()
            ));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Copies both ways between `socket` and the virtio-serial `port` until the
/// socket closes. While the host side of the port is not connected, reads
/// of the port return 0 at once: those are waited out, not taken as the end.
fn relay(socket: UnixStream, port: &Path) -> Result<(), String> {
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(port)
            .map_err(|e| format!("opening {}: {e}", port.display()))
    };
    // A port opens once at a time: both directions share one descriptor.
    let mut port_out = open()?;
    let mut port_in = port_out.try_clone().map_err(|e| e.to_string())?;
    let (mut socket_in, mut socket_out) = (socket.try_clone().map_err(|e| e.to_string())?, socket);
    thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            match port_in.read(&mut buf) {
                Ok(0) => thread::sleep(Duration::from_millis(20)),
                Ok(n) => {
                    if socket_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = socket_in.read(&mut buf) {
            if n == 0 {
                break;
            }
            // With the host side away the bytes have no reader: drop them.
            let _ = port_out.write_all(&buf[..n]);
        }
    });
    Ok(())
}

/// Ends L1: a clean reboot (QEMU runs with `-no-reboot`, so it exits 0) when
/// perfbed-vmm succeeded, else QEMU's `isa-debug-exit` with the status.
fn end_l1(status: u8) -> ! {
    // SAFETY: sync takes no arguments.
    unsafe { libc::sync() };
    if status != 0 {
        // SAFETY: ioperm for one port, as PID 1 (root); then one byte out to
        // the port it granted.
        unsafe {
            if libc::ioperm(u64::from(DEBUG_EXIT_PORT), 1, 1) == 0 {
                std::arch::asm!("out dx, al", in("dx") DEBUG_EXIT_PORT, in("al") status, options(nomem, nostack));
            }
        }
        eprintln!("perfbed-box: isa-debug-exit did not end QEMU; rebooting");
    }
    // SAFETY: reboot takes no pointers; PID 1 may reboot.
    unsafe { libc::reboot(libc::RB_AUTOBOOT) };
    loop {
        thread::sleep(Duration::from_secs(1));
    }
}
