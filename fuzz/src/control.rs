//! The control-socket protocol from raw bytes: the same line reading and
//! request handling the socket server uses, on a device with no socket and
//! a clock the input drives.
//!
//! Checked: every complete line gets exactly one reply, which encodes as
//! one line of JSON and decodes back to itself; a refused request leaves
//! the device's state exactly as it was; a request that parses re-encodes to
//! a line that parses to the same request; `wait_landed` only ever sees the
//! pending bytes fall; nothing holds more of a line than the limit.

use std::io::{BufReader, Cursor};

use perfbed_device::control::{apply, parse_request, respond, Reply, Request, Response};
use perfbed_device::line::{read_line, Line};
use perfbed_device::{Device, DeviceConfig};

/// The line limit here: small, so that inputs of a few KiB reach it.
const MAX: usize = 512;

pub fn run(bytes: &[u8]) {
    let Some((&capacity, stream)) = bytes.split_first() else {
        return;
    };
    let mut device = Device::new(DeviceConfig::default()).expect("the default device");
    let mut reader = BufReader::with_capacity(usize::from(capacity).max(1), Cursor::new(stream));
    let mut line = Vec::new();
    let mut now = 0u64;
    loop {
        let kind = read_line(&mut reader, &mut line, MAX).expect("reading memory cannot fail");
        assert!(line.len() <= MAX, "held {} bytes of a line", line.len());
        now += 1_000_000;
        match kind {
            Line::End | Line::Unterminated => return,
            Line::Blank | Line::TooLong => continue,
            Line::Text => {}
        }
        if let Ok(request) = parse_request(&line) {
            let again = serde_json::to_string(&request).expect("a request encodes");
            assert_eq!(parse_request(again.as_bytes()).ok(), Some(request.clone()), "{again}");
        }
        let before = device.state(now);
        match respond(&mut device, now, &line) {
            Reply::Now(response) => {
                check_encoding(&response);
                if !response.ok {
                    assert!(response.error.as_deref().is_some_and(|e| !e.is_empty()), "a refusal says why");
                    assert_eq!(device.state(now), before, "a refused request changed the device: {:?}", String::from_utf8_lossy(&line));
                }
            }
            Reply::Trace { .. } => panic!("respond() left a trace unformatted"),
            Reply::WaitLanded { timeout_ms } => {
                let mut pending = device.pending_bytes(now);
                assert!(pending > 0, "wait_landed deferred with nothing pending");
                // Poll as the server does, in 2 ms steps, for at most 1 s of
                // device time (not timeout_ms: inputs choose huge ones).
                for _ in 0..timeout_ms.min(500) {
                    now += 2_000_000;
                    let p = device.pending_bytes(now);
                    assert!(p <= pending, "pending rose from {pending} to {p}");
                    pending = p;
                    if p == 0 {
                        break;
                    }
                }
                if let Reply::Now(r) = apply(&mut device, now, &Request::WaitLanded { timeout_ms }) {
                    assert_eq!(r.pending_bytes, Some(0));
                }
            }
        }
    }
}

fn check_encoding(response: &Response) {
    let text = serde_json::to_string(response).expect("a response encodes");
    assert!(!text.contains('\n'), "a response is one line");
    let back: Response = serde_json::from_str(&text).expect("a response decodes");
    assert_eq!(&back, response);
}
