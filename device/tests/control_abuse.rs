//! The control socket under abuse: malformed and hostile requests, many
//! clients, clients that go away mid-request. Each bad
//! request gets an error reply that says why, changes nothing, and the
//! socket keeps serving.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::Duration;

use common::{assert_refused, serve, snapshot, Raw};
use perfbed_device::control::{MAX_CONNECTIONS, MAX_WAIT_MS};
use perfbed_device::regs::Event;
use perfbed_device::ControlClient;

#[test]
fn bad_requests_are_refused_with_a_reason_and_change_nothing() {
    let (device, _server, path) = serve();
    let mut client = ControlClient::connect(&path).unwrap();
    client.inject(0, 1, Event::MbmTotalBytes, 4096).unwrap();
    client.set_occupancy(1, 2, 640).unwrap();
    client.wait_landed(5000).unwrap();
    let before = snapshot(&device);

    let too_long_wait = format!(r#"{{"op":"wait_landed","timeout_ms":{}}}"#, MAX_WAIT_MS + 1);
    let cases: &[(&[u8], &str)] = &[
        // Malformed JSON.
        (b"{", "bad request"),
        (b"{\"op\":\"inject\",", "bad request"),
        (b"{\"op\":\"state\"}}", "trailing characters"),
        (b"nul", "bad request"),
        (b"\"state\"", "bad request"),
        (b"{\"op\":\"state\"} {\"op\":\"state\"}", "trailing characters"),
        (b"\xff\xfe\xfd", "bad request"),
        (b"{\"op\":\"sta\\u0000te\"}", "unknown variant"),
        (&[b'['; 4096], "bad request"),
        // Unknown ops and fields, missing fields, wrong types.
        (b"{\"op\":\"explode\"}", "unknown variant"),
        (b"{\"op\":\"inject\",\"domain\":0,\"rmid\":1,\"event\":\"mbm_total_bytes\",\"bytes\":1,\"extra\":1}", "unknown field"),
        (b"{\"op\":\"state\",\"extra\":1}", "unknown field"),
        (b"{\"op\":\"reset_stats\",\"all\":true}", "unknown field"),
        (b"{\"op\":\"inject\",\"domain\":0,\"rmid\":1,\"event\":\"mbm_total_bytes\"}", "missing field `bytes`"),
        (b"{\"domain\":0}", "missing field `op`"),
        (b"{\"op\":\"inject\",\"domain\":\"0\",\"rmid\":1,\"event\":\"mbm_total_bytes\",\"bytes\":1}", "invalid type"),
        (b"{\"op\":\"inject\",\"domain\":0,\"rmid\":1,\"event\":\"mbm_total_bytes\",\"bytes\":null}", "invalid type"),
        (b"{\"op\":\"inject\",\"domain\":0,\"domain\":1,\"rmid\":1,\"event\":\"mbm_total_bytes\",\"bytes\":1}", "duplicate field"),
        // Numbers out of range.
        (b"{\"op\":\"inject\",\"domain\":4294967296,\"rmid\":1,\"event\":\"mbm_total_bytes\",\"bytes\":1}", "invalid value"),
        (b"{\"op\":\"inject\",\"domain\":-1,\"rmid\":1,\"event\":\"mbm_total_bytes\",\"bytes\":1}", "invalid value"),
        (b"{\"op\":\"inject\",\"domain\":0,\"rmid\":1,\"event\":\"mbm_total_bytes\",\"bytes\":18446744073709551616}", "bad request"),
        (b"{\"op\":\"inject\",\"domain\":0,\"rmid\":1,\"event\":\"mbm_total_bytes\",\"bytes\":1.5}", "invalid type"),
        (b"{\"op\":\"inject\",\"domain\":0,\"rmid\":1,\"event\":\"mbm_total_bytes\",\"bytes\":1e400}", "bad request"),
        (b"{\"op\":\"inject\",\"domain\":0,\"rmid\":1,\"event\":9,\"bytes\":1}", "unknown event id 9"),
        (too_long_wait.as_bytes(), "above the limit"),
        // Well-formed, but refused by the device.
        (b"{\"op\":\"inject\",\"domain\":2,\"rmid\":1,\"event\":\"mbm_total_bytes\",\"bytes\":1}", "no domain 2"),
        (b"{\"op\":\"inject\",\"domain\":0,\"rmid\":8,\"event\":\"mbm_total_bytes\",\"bytes\":1}", "no RMID 8"),
        (b"{\"op\":\"inject\",\"domain\":0,\"rmid\":1,\"event\":\"llc_occupancy\",\"bytes\":1}", "not a cumulative event"),
        (b"{\"op\":\"set_rate\",\"domain\":0,\"rmid\":1,\"event\":\"mbm_total_bytes\",\"bytes_per_sec\":18446744073709551615}", "exceed the max rate"),
        (b"{\"op\":\"set_occupancy\",\"domain\":4294967295,\"rmid\":0,\"bytes\":1}", "no domain"),
    ];
    let mut raw = Raw::connect(&path);
    for (request, because) in cases {
        let reply = raw.send(request);
        assert_refused(&reply, because, request);
        assert_eq!(
            snapshot(&device),
            before,
            "{} changed the device",
            String::from_utf8_lossy(request)
        );
    }
    // The same connection still serves.
    assert_eq!(raw.send(b"{\"op\":\"state\"}")["ok"], true);
    assert_eq!(
        client.state().unwrap().truth(0, 1, Event::MbmTotalBytes),
        4096
    );
}

#[test]
fn clients_that_leave_mid_request_change_nothing() {
    let (device, _server, path) = serve();
    let before = snapshot(&device);
    // A whole request, but no newline: the client closes before finishing.
    for partial in [
        &br#"{"op":"inject","domain":0,"rmid":1,"event":"mbm_total_bytes","bytes":64}"#[..],
        br#"{"op":"inject","domain":0,"rm"#,
        br#"{"op":"reset_stats"}"#,
    ] {
        let mut stream = UnixStream::connect(&path).unwrap();
        stream.write_all(partial).unwrap();
        drop(stream);
    }
    // A request sent whole, then the client leaves without reading the
    // reply: it is carried out, and the failed reply harms nothing.
    let mut stream = UnixStream::connect(&path).unwrap();
    stream
        .write_all(b"{\"op\":\"state\"}\n{\"op\":\"trace\"}\n")
        .unwrap();
    stream.shutdown(std::net::Shutdown::Both).unwrap();
    drop(stream);
    thread::sleep(Duration::from_millis(100));
    assert_eq!(snapshot(&device), before);
    let mut client = ControlClient::connect(&path).unwrap();
    client.inject(0, 1, Event::MbmTotalBytes, 64).unwrap();
    client.wait_landed(5000).unwrap();
    assert_eq!(
        client.state().unwrap().truth(0, 1, Event::MbmTotalBytes),
        64
    );
}

#[test]
fn sixty_four_clients_at_once() {
    let (device, _server, path) = serve();
    let clients: Vec<_> = (0..64u32)
        .map(|i| {
            let path = path.clone();
            thread::spawn(move || {
                let mut client = ControlClient::connect(&path).unwrap();
                for _ in 0..10 {
                    client
                        .inject(i % 2, i % 8, Event::MbmLocalBytes, 100)
                        .unwrap();
                    client.state().unwrap();
                }
                let mut raw = Raw::connect(&path);
                assert_refused(&raw.send(b"{\"op\":\"nope\"}"), "unknown variant", b"nope");
                client.wait_landed(10_000).unwrap();
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let state = snapshot(&device);
    let total: u64 = (0..2)
        .flat_map(|d| (0..8).map(move |r| (d, r)))
        .map(|(d, r)| state.truth(d, r, Event::MbmLocalBytes))
        .sum();
    assert_eq!(total, 64 * 10 * 100);
    assert_eq!(state.pending_bytes, 0);
}

#[test]
fn one_connection_too_many_is_told_so() {
    let (_device, _server, path) = serve();
    let mut open: Vec<Raw> = (0..MAX_CONNECTIONS).map(|_| Raw::connect(&path)).collect();
    // Every one of them is served (which also makes sure all are accepted).
    for raw in &mut open {
        assert_eq!(raw.send(b"{\"op\":\"reset_stats\"}")["ok"], true);
    }
    let mut extra = Raw::connect(&path);
    assert_refused(&extra.reply(), "too many connections", b"(connection 129)");
    // One goes away; a new one is served again.
    drop(open.pop());
    thread::sleep(Duration::from_millis(200));
    let mut again = Raw::connect(&path);
    assert_eq!(again.send(b"{\"op\":\"state\"}")["ok"], true);
}
