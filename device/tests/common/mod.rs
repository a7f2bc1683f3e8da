//! Helpers shared by the control-socket tests.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use perfbed_device::{ControlServer, DeviceConfig, DeviceState, SharedDevice};

pub fn socket_path() -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("perfbed-abuse-{}-{n}.sock", std::process::id()))
}

pub fn serve() -> (SharedDevice, ControlServer, PathBuf) {
    let device = SharedDevice::new(DeviceConfig::default()).unwrap();
    let path = socket_path();
    let server = device.serve_control(&path).unwrap();
    (device, server, path)
}

/// A raw connection: send lines, read reply lines.
pub struct Raw {
    pub stream: UnixStream,
    pub reader: BufReader<UnixStream>,
}

impl Raw {
    pub fn connect(path: &Path) -> Raw {
        let stream = UnixStream::connect(path).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Raw {
            reader: BufReader::new(stream.try_clone().unwrap()),
            stream,
        }
    }

    pub fn reply(&mut self) -> serde_json::Value {
        let mut line = String::new();
        assert!(
            self.reader.read_line(&mut line).unwrap() > 0,
            "the server closed the connection"
        );
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("reply {line:?} is not JSON: {e}"))
    }

    pub fn send(&mut self, line: &[u8]) -> serde_json::Value {
        self.stream.write_all(line).unwrap();
        self.stream.write_all(b"\n").unwrap();
        self.reply()
    }
}

/// The device's state with the clock left out: what a request may change.
pub fn snapshot(device: &SharedDevice) -> DeviceState {
    let mut state = device.with(|d, now| d.state(now));
    state.now_ns = 0;
    state
}

pub fn assert_refused(reply: &serde_json::Value, because: &str, request: &[u8]) {
    let shown = String::from_utf8_lossy(&request[..request.len().min(120)]).into_owned();
    assert_eq!(reply["ok"], false, "{shown} -> {reply}");
    let error = reply["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{shown}: no error text in {reply}"));
    assert!(
        error.contains(because),
        "{shown}: error {error:?} does not say {because:?}"
    );
}
