//! Many control-socket clients over one relayed connection.
//!
//! The box carries the device's control socket to the host over a single
//! virtio-serial port: one connection, which QEMU's socket chardev gives to
//! one client at a time. xtask talks to the device from several places at
//! once (the checks, and a traffic thread beside them), so for the box it
//! serves the usual control socket itself and passes each request line over
//! the one upstream connection, waiting for its one reply line before the
//! next: the protocol is strictly request, reply.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// The upstream connection, opened at the first request.
struct Upstream {
    path: PathBuf,
    conn: Option<(UnixStream, BufReader<UnixStream>)>,
}

impl Upstream {
    /// Sends one request line and returns its reply line.
    fn call(&mut self, line: &str) -> std::io::Result<String> {
        if self.conn.is_none() {
            let stream = connect(&self.path)?;
            let reader = BufReader::new(stream.try_clone()?);
            self.conn = Some((stream, reader));
        }
        let (stream, reader) = self.conn.as_mut().expect("connected above");
        let result = (|| {
            stream.write_all(line.as_bytes())?;
            stream.write_all(b"\n")?;
            let mut reply = String::new();
            if reader.read_line(&mut reply)? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the box closed the control connection",
                ));
            }
            Ok(reply)
        })();
        if result.is_err() {
            self.conn = None;
        }
        result
    }
}

/// The box's end may take a moment to accept (QEMU starts it with the VM).
fn connect(path: &Path) -> std::io::Result<UnixStream> {
    let start = Instant::now();
    loop {
        match UnixStream::connect(path) {
            Ok(stream) => return Ok(stream),
            Err(e) if start.elapsed() > Duration::from_secs(30) => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Serves `listen` for as long as the process runs, passing each request
/// over one connection to `upstream`.
pub fn start(listen: &Path, upstream: &Path) -> Result<()> {
    let _ = std::fs::remove_file(listen);
    let listener = UnixListener::bind(listen)
        .with_context(|| format!("serving the control socket {}", listen.display()))?;
    let upstream = Arc::new(Mutex::new(Upstream {
        path: upstream.to_path_buf(),
        conn: None,
    }));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { break };
            let upstream = Arc::clone(&upstream);
            std::thread::spawn(move || serve(client, &upstream));
        }
    });
    Ok(())
}

fn serve(client: UnixStream, upstream: &Mutex<Upstream>) {
    let Ok(mut writer) = client.try_clone() else {
        return;
    };
    for line in BufReader::new(client).lines() {
        let Ok(line) = line else { return };
        let reply = upstream
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .call(&line);
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => format!(
                "{}\n",
                serde_json::json!({ "ok": false, "error": format!("the box's control relay: {e}") })
            ),
        };
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}
