//! The control socket, end to end over a real Unix socket.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use perfbed_device::regs::{self, Event};
use perfbed_device::{ClientError, ControlClient, DeviceConfig, Request, Response, SharedDevice};

fn socket_path() -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("perfbed-test-{}-{n}.sock", std::process::id()))
}

/// Sends one raw line and returns the parsed response.
fn raw(
    stream: &mut UnixStream,
    reader: &mut BufReader<UnixStream>,
    line: &str,
) -> serde_json::Value {
    stream.write_all(line.as_bytes()).unwrap();
    stream.write_all(b"\n").unwrap();
    let mut response = String::new();
    assert!(
        reader.read_line(&mut response).unwrap() > 0,
        "server closed the connection"
    );
    serde_json::from_str(&response).unwrap()
}

#[test]
fn inject_wait_state_and_errors() {
    let device = SharedDevice::new(DeviceConfig::default()).unwrap();
    let path = socket_path();
    let server = device.serve_control(&path).unwrap();

    // The guest side: vCPU 0 owns domain 0 and assigns slot 0.
    device.mmio_write(0, regs::domain_reg(0, regs::DOM_OWNER), 8, 0);
    device.mmio_write(
        0,
        regs::slot_ctl(0, 0),
        8,
        regs::slot_ctl_value(Event::MbmTotalBytes, 5),
    );

    let mut client = ControlClient::connect(&path).unwrap();
    client.inject(0, 5, Event::MbmTotalBytes, 1 << 20).unwrap();
    client.inject(1, 2, Event::MbmLocalBytes, 4096).unwrap();
    client.set_occupancy(0, 5, 64 * 1000).unwrap();
    client.wait_landed(5000).unwrap();
    let state = client.state().unwrap();
    assert_eq!(state.pending_bytes, 0);
    assert_eq!(state.truth(0, 5, Event::MbmTotalBytes), 1 << 20);
    assert_eq!(state.truth(1, 2, Event::MbmLocalBytes), 4096);
    assert_eq!(state.domains[0].slots[0].register, (1 << 20) / 64);
    assert_eq!(
        device.mmio_read(0, regs::slot_count(0, 0), 8),
        (1 << 20) / 64
    );
    assert_eq!(device.mmio_read(0, regs::occupancy(0, 5), 8), 1000);
    assert_eq!(
        device.mmio_read(1, regs::slot_count(0, 0), 8),
        regs::COUNTER_ERROR
    );
    let state = client.state().unwrap();
    assert_eq!(state.domains[0].violations_by_vcpu.get(&1), Some(&1));
    assert_eq!(state.domains[0].counter_reads_by_vcpu.get(&0), Some(&2));
    let trace = client.trace().unwrap();
    assert_eq!(trace.len(), 5);
    assert_eq!(trace[4].vcpu, 1);
    // Slot-level truth through the socket: the one ongoing assignment.
    let a = client.assignments(0).unwrap();
    assert_eq!(a.records.len(), 1);
    assert_eq!(
        (
            a.records[0].slot,
            a.records[0].rmid,
            a.records[0].released_ns
        ),
        (0, 5, None)
    );
    assert_eq!(a.records[0].counted_bytes, 1 << 20);
    assert!(client.assignments(1).unwrap().records.is_empty());

    // A refused request is an error reply; the client maps it to Refused.
    match client.inject(2, 0, Event::MbmTotalBytes, 1) {
        Err(ClientError::Refused(msg)) => assert!(msg.contains("no domain 2"), "{msg}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(matches!(
        client.set_rate(0, 0, Event::MbmTotalBytes, u64::MAX),
        Err(ClientError::Refused(_))
    ));

    // Raw lines on one connection: garbage, bad values, then a valid request.
    let mut stream = UnixStream::connect(&path).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    for bad in [
        "this is not json",
        "{\"op\":\"explode\"}",
        "{\"op\":\"inject\",\"domain\":99,\"rmid\":0,\"event\":\"mbm_total_bytes\",\"bytes\":1}",
        "{\"op\":\"inject\",\"domain\":-1,\"rmid\":0,\"event\":\"mbm_total_bytes\",\"bytes\":1}",
        "{\"op\":\"inject\",\"domain\":0,\"rmid\":0,\"event\":\"llc_occupancy\",\"bytes\":1}",
        "{\"op\":\"inject\",\"domain\":0,\"rmid\":0,\"event\":\"bogus\",\"bytes\":1}",
        "{\"op\":\"set_occupancy\",\"domain\":0,\"rmid\":8,\"bytes\":1}",
        "[1,2,3]",
        "\u{0}\u{1}\u{7f}",
    ] {
        let reply = raw(&mut stream, &mut reader, bad);
        assert_eq!(reply["ok"], false, "{bad} -> {reply}");
        assert!(
            reply["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{reply}"
        );
    }
    stream.write_all(b"\xff\xfe\n").unwrap();
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.contains("\"ok\":false"), "{line}");
    let reply = raw(
        &mut stream,
        &mut reader,
        "{\"op\":\"inject\",\"domain\":0,\"rmid\":5,\"event\":2,\"bytes\":64}",
    );
    assert_eq!(reply, serde_json::json!({"ok": true}));
    let reply = raw(&mut stream, &mut reader, "{\"op\":\"wait_landed\"}");
    assert_eq!(reply, serde_json::json!({"ok": true, "pending_bytes": 0}));
    let reply = raw(&mut stream, &mut reader, "{\"op\":\"state\"}");
    assert_eq!(reply["ok"], true);
    assert_eq!(
        reply["state"]["domains"][0]["truth"][0]["bytes"],
        (1u64 << 20) + 64
    );
    assert_eq!(
        reply["state"]["domains"][0]["truth"][0]["event"],
        "mbm_total_bytes"
    );

    // reset_stats clears the statistics, not the truth.
    client.reset_stats().unwrap();
    let state = client.state().unwrap();
    assert_eq!(state.domains[0].violations, 0);
    assert_eq!(state.trace_len, 1, "only the reset is left in the trace");
    assert_eq!(state.truth(0, 5, Event::MbmTotalBytes), (1 << 20) + 64);

    // A wait that cannot finish in time times out with what is pending.
    client
        .set_rate(1, 0, Event::MbmLocalBytes, 2 << 30)
        .unwrap();
    client.inject(1, 1, Event::MbmLocalBytes, 1000).unwrap();
    let response = client
        .request(&Request::WaitLanded { timeout_ms: 30 })
        .unwrap();
    assert!(!response.ok);
    assert_eq!(response.pending_bytes, Some(1000));
    assert!(response.error.unwrap().contains("timeout"));
    client.set_rate(1, 0, Event::MbmLocalBytes, 0).unwrap();
    client.wait_landed(5000).unwrap();
    // A caller's patience beyond the server's limit (an hour, for a guest
    // held in gdb) is capped, not refused.
    client.wait_landed(3_600_000).unwrap();

    drop(server);
    assert!(!path.exists(), "the socket file is removed");
    let mut buf = String::new();
    assert_eq!(
        reader.read_line(&mut buf).unwrap_or(0),
        0,
        "open connections are shut down"
    );
}

#[test]
fn requests_round_trip_on_the_wire() {
    let req = Request::SetRate {
        domain: 1,
        rmid: 2,
        event: Event::MbmLocalBytes,
        bytes_per_sec: 7,
    };
    let json = serde_json::to_string(&req).unwrap();
    assert_eq!(
        json,
        r#"{"op":"set_rate","domain":1,"rmid":2,"event":"mbm_local_bytes","bytes_per_sec":7}"#
    );
    assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), req);
    assert_eq!(
        serde_json::from_str::<Request>(r#"{"op":"reset_stats"}"#).unwrap(),
        Request::ResetStats
    );
    assert!(serde_json::from_str::<Request>(r#"{"op":"wait_landed","timeout":5}"#).is_err());
    assert_eq!(
        serde_json::from_str::<Request>(r#"{"op":"assignments","since":3}"#).unwrap(),
        Request::Assignments { since: 3 }
    );
    assert_eq!(
        serde_json::from_str::<Request>(r#"{"op":"assignments"}"#).unwrap(),
        Request::Assignments { since: 0 }
    );
    assert!(serde_json::from_str::<Request>(r#"{"op":"assignments","from":3}"#).is_err());
    let ok: Response = serde_json::from_str(r#"{"ok":true}"#).unwrap();
    assert!(ok.ok && ok.error.is_none() && ok.state.is_none());
}

#[test]
fn several_clients_and_the_cli() {
    let device = SharedDevice::new(DeviceConfig::default()).unwrap();
    let path = socket_path();
    let _server = device.serve_control(&path).unwrap();
    let mut a = ControlClient::connect(&path).unwrap();
    let mut b = ControlClient::connect(&path).unwrap();
    a.inject(0, 0, Event::MbmTotalBytes, 10).unwrap();
    b.inject(0, 0, Event::MbmTotalBytes, 20).unwrap();
    a.wait_landed(5000).unwrap();
    assert_eq!(b.state().unwrap().truth(0, 0, Event::MbmTotalBytes), 30);
    drop(a);
    assert_eq!(b.state().unwrap().truth(0, 0, Event::MbmTotalBytes), 30);

    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_perfbed"))
            .args(["ctl", "--socket"])
            .arg(&path)
            .args(args)
            .output()
            .unwrap()
    };
    let out = cli(&[
        "inject",
        "--domain",
        "1",
        "--rmid",
        "3",
        "--event",
        "mbm_local_bytes",
        "--bytes",
        "640",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(cli(&["wait", "--timeout-ms", "5000"]).status.success());
    let out = cli(&["state"]);
    assert!(out.status.success());
    let response: Response = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        response.state.unwrap().truth(1, 3, Event::MbmLocalBytes),
        640
    );
    let out = cli(&["occupancy", "--domain", "5", "--rmid", "0", "--bytes", "1"]);
    assert_eq!(out.status.code(), Some(1), "refused: {out:?}");
    let out = cli(&["inject", "--domain", "x"]);
    assert_eq!(out.status.code(), Some(2), "bad flag: {out:?}");
    let out = cli(&[
        "rate",
        "--domain",
        "0",
        "--rmid",
        "0",
        "--event",
        "mbm_total_bytes",
        "--bytes-per-sec",
        "1",
        "--bogus",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(2), "unknown flag: {out:?}");
    let out = cli(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn trace_lines_follow_from_a_record_number_and_the_old_trace_request_still_works() {
    let device = SharedDevice::new(DeviceConfig {
        trace_capacity: 8,
        ..DeviceConfig::default()
    })
    .unwrap();
    let path = socket_path();
    let _server = device.serve_control(&path).unwrap();
    let mut client = ControlClient::connect(&path).unwrap();
    device.mmio_write(0, regs::domain_reg(0, regs::DOM_OWNER), 8, 1);
    client.inject(0, 2, Event::MbmTotalBytes, 640).unwrap();
    let first = client.trace_lines(0).unwrap();
    assert_eq!(
        (
            first.first_seq,
            first.next_seq,
            first.dropped,
            first.lines.len()
        ),
        (0, 3, 0, 3)
    );
    assert!(
        first.header.starts_with(perfbed_device::TRACE_MAGIC),
        "{}",
        first.header
    );
    assert!(
        first.lines[1].contains(" owner dom=0 from=none to=1 cpu=0"),
        "{}",
        first.lines[1]
    );
    assert!(
        first.lines[2].contains(" inject dom=0 rmid=2 event=mbm_total_bytes bytes=640"),
        "{}",
        first.lines[2]
    );
    // A follower asks for what came after; nothing new is an empty answer.
    assert!(client.trace_lines(first.next_seq).unwrap().lines.is_empty());
    for _ in 0..10 {
        device.mmio_read(1, regs::slot_count(0, 0), 8);
    }
    let next = client.trace_lines(first.next_seq).unwrap();
    // 10 new records, but the ring keeps 8: the follower sees the gap.
    assert_eq!(
        (
            next.first_seq,
            next.next_seq,
            next.dropped,
            next.lines.len()
        ),
        (5, 13, 5, 8)
    );
    let text = client.trace_text().unwrap();
    assert_eq!(
        text.lines()
            .filter(|l| l.contains(" dropped count=5"))
            .count(),
        1,
        "{text}"
    );
    // The old JSON request: accesses only, and now how many were dropped.
    let raw = client.request_line(r#"{"op":"trace"}"#).unwrap();
    let reply: serde_json::Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(reply["trace"].as_array().map(Vec::len), Some(8));
    assert_eq!(reply["trace_dropped"], 5);
    assert_eq!(reply["trace"][0]["kind"], "read");
}

#[test]
fn set_allowed_changes_the_register_and_refuses_bad_lists() {
    let device = SharedDevice::new(DeviceConfig::default()).unwrap();
    let path = socket_path();
    let _server = device.serve_control(&path).unwrap();
    let mut client = ControlClient::connect(&path).unwrap();
    client.set_allowed(1, &[3]).unwrap();
    assert_eq!(
        device.mmio_read(0, regs::domain_reg(1, regs::DOM_ALLOWED_CPUS), 8),
        0b1000
    );
    assert_eq!(
        device.mmio_read(0, regs::domain_reg(1, regs::DOM_CONFIG_STATUS), 8),
        regs::CONFIG_STATUS_ALLOWED
    );
    let state = client.state().unwrap();
    assert_eq!(
        (
            state.domains[1].allowed_cpu_list.as_str(),
            state.domains[1].irq.allowed_changes
        ),
        ("3", 1)
    );
    let mut stream = UnixStream::connect(&path).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    for bad in [
        r#"{"op":"set_allowed","domain":1,"cpus":"3-1"}"#,
        r#"{"op":"set_allowed","domain":9,"cpus":"0"}"#,
        r#"{"op":"set_allowed","domain":0,"cpus":"64"}"#,
        r#"{"op":"set_allowed","domain":0}"#,
    ] {
        let reply = raw(&mut stream, &mut reader, bad);
        assert_eq!(reply["ok"], false, "{bad}: {reply}");
    }
    assert_eq!(
        client.state().unwrap().domains[1].allowed_cpus,
        vec![3],
        "refused requests changed nothing"
    );
}
