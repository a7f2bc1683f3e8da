//! A 10 MiB request line: refused with an error reply, skipped without
//! being held in memory, and the connection goes on. (Its own test binary,
//! so that the peak-memory measure sees no other test.)

mod common;

use std::io::Write;
use std::thread;

use common::{assert_refused, serve, snapshot, Raw};
use perfbed_device::control::MAX_LINE;

/// Peak resident memory of this process, in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_10_mib_line_is_refused_without_being_buffered() {
    let (device, _server, path) = serve();
    let before = snapshot(&device);
    let mut raw = Raw::connect(&path);
    let peak_before = peak_rss_kib();
    // A valid request's start, then 10 MiB more of the same line, written
    // from one small buffer.
    let writer = {
        let mut stream = raw.stream.try_clone().unwrap();
        thread::spawn(move || {
            stream
                .write_all(
                    br#"{"op":"inject","domain":0,"rmid":1,"event":"mbm_total_bytes","bytes":1"#,
                )
                .unwrap();
            let chunk = vec![b' '; 64 * 1024];
            for _ in 0..160 {
                stream.write_all(&chunk).unwrap();
            }
            stream.write_all(b"}\n").unwrap();
        })
    };
    let reply = raw.reply();
    writer.join().unwrap();
    assert_refused(
        &reply,
        &format!("request longer than {MAX_LINE} bytes"),
        b"(10 MiB line)",
    );
    assert_eq!(
        snapshot(&device),
        before,
        "the long line was not carried out"
    );
    let grew = peak_rss_kib().saturating_sub(peak_before);
    assert!(
        grew < 4 * 1024,
        "peak memory grew by {grew} KiB reading a 10 MiB line"
    );
    // The connection goes on with the next line.
    let reply =
        raw.send(br#"{"op":"inject","domain":0,"rmid":1,"event":"mbm_total_bytes","bytes":1}"#);
    assert_eq!(reply["ok"], true, "{reply}");
}
