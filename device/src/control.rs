//! The control socket: a Unix stream socket speaking JSON lines.
//!
//! One request per line, one response line per request. Requests are tagged
//! by `op` (see [`Request`]); responses are `{"ok": true, ...payload}` or
//! `{"ok": false, "error": "..."}`. A bad line gets an error response and the
//! connection keeps serving. `device/README.md` documents the protocol.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::device::{Assignments, Device, DeviceError, DeviceState, TraceEntry, TraceSnapshot};
use crate::host::SharedDevice;
use crate::line::{read_line, Line};
use crate::regs::Event;

/// Longest request line accepted; a longer one is refused and skipped
/// without being held in memory.
pub const MAX_LINE: usize = 64 * 1024;
/// Default `wait_landed` timeout.
pub const DEFAULT_WAIT_MS: u64 = 10_000;
/// Longest `wait_landed` timeout (10 minutes): a connection is never held
/// for longer than a run could last.
pub const MAX_WAIT_MS: u64 = 600_000;
/// Most connections served at once; one more is told so and closed.
pub const MAX_CONNECTIONS: usize = 128;
/// How often the accept loop checks whether it should stop.
const ACCEPT_POLL: Duration = Duration::from_millis(20);
/// Longest sleep between two polls of `wait_landed`.
const WAIT_POLL: Duration = Duration::from_millis(2);

fn default_wait_ms() -> u64 {
    DEFAULT_WAIT_MS
}

/// A control request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Queue `bytes` of a cumulative event for (domain, rmid).
    Inject {
        /// Domain.
        domain: u32,
        /// RMID.
        rmid: u32,
        /// `mbm_total_bytes` or `mbm_local_bytes`.
        event: Event,
        /// Bytes.
        bytes: u64,
    },
    /// Set (or clear, with 0) a steady rate.
    SetRate {
        /// Domain.
        domain: u32,
        /// RMID.
        rmid: u32,
        /// `mbm_total_bytes` or `mbm_local_bytes`.
        event: Event,
        /// Bytes per second.
        bytes_per_sec: u64,
    },
    /// Set the LLC occupancy of (domain, rmid).
    SetOccupancy {
        /// Domain.
        domain: u32,
        /// RMID.
        rmid: u32,
        /// Bytes.
        bytes: u64,
    },
    /// Change a domain's allowed CPUs while the guest runs: the device
    /// raises its configuration-changed interrupt.
    SetAllowed {
        /// Domain.
        domain: u32,
        /// The new set as a kernel CPU list (`"0-1,3"`; `""` for none).
        cpus: String,
    },
    /// Wait until all injected traffic has landed.
    WaitLanded {
        /// Give up after this long (default 10 s).
        #[serde(default = "default_wait_ms")]
        timeout_ms: u64,
    },
    /// Snapshot of the device.
    State,
    /// Clear violations, read counts, bad-access counts and the trace.
    ResetStats,
    /// The register accesses the trace holds (JSON; see `trace_lines` for
    /// every record).
    Trace,
    /// The trace as text lines, from record number `since` on (0: all
    /// kept); `perfbed ctl trace --follow` asks again with the `next_seq`
    /// of the last answer.
    TraceLines {
        /// First record number wanted.
        #[serde(default)]
        since: u64,
    },
    /// The register accesses from record number `since` on, with the
    /// numbers that say whether any were lost: what a check replays
    /// against the slot-level truth.
    TraceAccesses {
        /// First record number wanted.
        #[serde(default)]
        since: u64,
    },
    /// Slot-level truth: every slot assignment numbered `since` and later
    /// (0: all kept), ended or ongoing, with the bytes it counted.
    Assignments {
        /// First assignment number wanted.
        #[serde(default)]
        since: u64,
    },
    /// The host's vCPUs (registers, local APICs, pending events) as text,
    /// in the format of QEMU's `info registers -a` and `info lapic N`:
    /// answered by a host that serves the socket with a [`CpuStateSource`]
    /// (perfbed-vmm), refused elsewhere.
    CpuState,
}

/// What a host gives for [`Request::CpuState`]: the text of its vCPUs'
/// state, or why it has none. The device knows nothing of how it is made.
pub type CpuStateSource = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// The `trace_accesses` payload.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceAccesses {
    /// Number of the oldest record the ring still had: above the `since`
    /// asked for, the records in between were lost to the ring's bound.
    pub first_seq: u64,
    /// Number the next record will get.
    pub next_seq: u64,
    /// The accesses numbered `since` and later, oldest first.
    pub accesses: Vec<TraceEntry>,
}

/// The `trace_lines` payload.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceLines {
    /// The trace file's header line (the device's shape, the counts).
    pub header: String,
    /// Number of the oldest record the device still holds.
    pub first_seq: u64,
    /// Number the next record will get: the next `since`.
    pub next_seq: u64,
    /// Records lost to overflow since the last reset.
    pub dropped: u64,
    /// One line per record, oldest first.
    pub lines: Vec<String>,
}

/// A control response.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// Whether the request succeeded.
    pub ok: bool,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Bytes not landed yet (`wait_landed`, both on success and on timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_bytes: Option<u64>,
    /// The snapshot (`state`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<DeviceState>,
    /// The trace (`trace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<Vec<TraceEntry>>,
    /// Records the trace lost to overflow (`trace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_dropped: Option<u64>,
    /// The trace as lines (`trace_lines`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_lines: Option<TraceLines>,
    /// Accesses from a record number on (`trace_accesses`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_accesses: Option<TraceAccesses>,
    /// Slot assignments (`assignments`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignments: Option<Assignments>,
    /// The host's vCPUs as text (`cpu_state`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_state: Option<String>,
}

impl Response {
    fn ok() -> Response {
        Response {
            ok: true,
            ..Response::default()
        }
    }

    fn error(message: impl Into<String>) -> Response {
        Response {
            ok: false,
            error: Some(message.into()),
            ..Response::default()
        }
    }
}

/// How a trace snapshot is answered: which request asked for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    /// `trace`: the accesses, with the ring's losses.
    Entries,
    /// `trace_lines`: text lines.
    Lines,
    /// `trace_accesses`: the accesses with their record numbers' span.
    Accesses,
}

/// What a request line comes to, decided without blocking.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one per request, moved straight out
pub enum Reply {
    /// The response, ready now.
    Now(Response),
    /// `trace` or `trace_lines`: the records copied under the device's
    /// lock, to be turned into the response outside it ([`Reply::format`]):
    /// formatting up to the trace's capacity of records would hold every
    /// vCPU's register access for that long.
    Trace {
        /// The snapshot.
        snapshot: TraceSnapshot,
        /// Which request asked for it.
        format: TraceFormat,
    },
    /// `wait_landed` with traffic still pending: the caller polls
    /// [`Device::pending_bytes`] until it lands or `timeout_ms` pass.
    WaitLanded {
        /// The request's timeout.
        timeout_ms: u64,
    },
}

/// Parses one request line (without its newline); a bad one gives the
/// error message that says why.
pub fn parse_request(line: &[u8]) -> Result<Request, String> {
    let request =
        serde_json::from_slice::<Request>(line).map_err(|e| format!("bad request: {e}"))?;
    match request {
        Request::WaitLanded { timeout_ms } if timeout_ms > MAX_WAIT_MS => {
            return Err(format!(
                "bad request: timeout_ms {timeout_ms} is above the limit of {MAX_WAIT_MS}"
            ));
        }
        // serde's `deny_unknown_fields` does not reach an internally tagged
        // unit variant: check that `op` is its only field.
        Request::State | Request::ResetStats | Request::Trace | Request::CpuState => {
            let fields: serde_json::Map<String, serde_json::Value> =
                serde_json::from_slice(line).map_err(|e| format!("bad request: {e}"))?;
            if let Some(field) = fields.keys().find(|k| *k != "op") {
                return Err(format!(
                    "bad request: unknown field `{field}`: this op takes none"
                ));
            }
        }
        _ => {}
    }
    Ok(request)
}

/// Carries out `request` on `device` at `now_ns`. Pure: no clock, no I/O,
/// no lock; a refused request leaves the device as it was (but for time).
pub fn apply(device: &mut Device, now_ns: u64, request: &Request) -> Reply {
    let done = |r: Result<(), DeviceError>| {
        Reply::Now(match r {
            Ok(()) => Response::ok(),
            Err(e) => Response::error(e.to_string()),
        })
    };
    match *request {
        Request::Inject {
            domain,
            rmid,
            event,
            bytes,
        } => done(device.inject(now_ns, domain, rmid, event, bytes)),
        Request::SetRate {
            domain,
            rmid,
            event,
            bytes_per_sec,
        } => done(device.set_rate(now_ns, domain, rmid, event, bytes_per_sec)),
        Request::SetOccupancy {
            domain,
            rmid,
            bytes,
        } => done(device.set_occupancy(domain, rmid, bytes)),
        Request::SetAllowed { domain, ref cpus } => match crate::cpus::parse_cpu_list(cpus) {
            Ok(list) => done(device.set_allowed(now_ns, domain, &list)),
            Err(e) => Reply::Now(Response::error(format!("cpus {cpus:?}: {e}"))),
        },
        Request::WaitLanded { timeout_ms } => match device.pending_bytes(now_ns) {
            0 => Reply::Now(Response {
                pending_bytes: Some(0),
                ..Response::ok()
            }),
            _ => Reply::WaitLanded { timeout_ms },
        },
        Request::State => Reply::Now(Response {
            state: Some(device.state(now_ns)),
            ..Response::ok()
        }),
        Request::ResetStats => {
            device.reset_stats();
            Reply::Now(Response::ok())
        }
        Request::Trace => Reply::Trace {
            snapshot: device.trace_since(0),
            format: TraceFormat::Entries,
        },
        Request::TraceLines { since } => Reply::Trace {
            snapshot: device.trace_since(since),
            format: TraceFormat::Lines,
        },
        Request::TraceAccesses { since } => Reply::Trace {
            snapshot: device.trace_since(since),
            format: TraceFormat::Accesses,
        },
        Request::Assignments { since } => Reply::Now(Response {
            assignments: Some(device.assignments(now_ns, since)),
            ..Response::ok()
        }),
        // The device has no vCPUs; a host that has answers before it.
        Request::CpuState => Reply::Now(Response::error(NO_CPU_STATE)),
    }
}

/// The refusal of [`Request::CpuState`] by a host that gives none.
const NO_CPU_STATE: &str =
    "this host gives no vCPU state on its control socket (QEMU's is on its monitor)";

/// The response to a request line: [`Request::CpuState`] from `cpu_state`
/// (outside the device's lock), any other from the device.
fn answer_line(device: &SharedDevice, cpu_state: Option<&CpuStateSource>, line: &[u8]) -> Response {
    match (parse_request(line), cpu_state) {
        (Ok(Request::CpuState), Some(source)) => match source() {
            Ok(text) => Response {
                cpu_state: Some(text),
                ..Response::ok()
            },
            Err(why) => Response::error(why),
        },
        _ => handle_line(device, line),
    }
}

impl Reply {
    /// Turns a trace snapshot into its response (the work done outside the
    /// device's lock); other replies are returned as they are.
    pub fn format(self) -> Reply {
        match self {
            Reply::Trace { snapshot, format } => Reply::Now(trace_response(&snapshot, format)),
            other => other,
        }
    }
}

/// The response of a snapshot in the format its request asked for.
fn trace_response(snapshot: &TraceSnapshot, format: TraceFormat) -> Response {
    match format {
        TraceFormat::Lines => Response {
            trace_lines: Some(TraceLines {
                header: snapshot.header(),
                first_seq: snapshot.first_seq,
                next_seq: snapshot.next_seq,
                dropped: snapshot.dropped,
                lines: snapshot.lines(),
            }),
            ..Response::ok()
        },
        TraceFormat::Entries => Response {
            trace: Some(snapshot.accesses()),
            trace_dropped: Some(snapshot.dropped),
            ..Response::ok()
        },
        TraceFormat::Accesses => Response {
            trace_accesses: Some(TraceAccesses {
                first_seq: snapshot.first_seq,
                next_seq: snapshot.next_seq,
                accesses: snapshot.accesses(),
            }),
            ..Response::ok()
        },
    }
}

/// The reply to one request line (without its newline) at `now_ns`,
/// formatted.
pub fn respond(device: &mut Device, now_ns: u64, line: &[u8]) -> Reply {
    match parse_request(line) {
        Ok(request) => apply(device, now_ns, &request).format(),
        Err(message) => Reply::Now(Response::error(message)),
    }
}

/// The response to one request line, waiting (without holding the lock)
/// if it asks to. The line is parsed before the device is locked.
pub fn handle_line(device: &SharedDevice, line: &[u8]) -> Response {
    match parse_request(line) {
        Ok(request) => handle(device, &request),
        Err(message) => Response::error(message),
    }
}

/// Carries out one request on the device, waiting if it asks to. Under the
/// device's lock only the request itself runs (a trace is copied there);
/// formatting and waiting happen outside it.
pub fn handle(device: &SharedDevice, request: &Request) -> Response {
    match device.with(|d, now| apply(d, now, request)) {
        Reply::Now(response) => response,
        Reply::Trace { snapshot, format } => trace_response(&snapshot, format),
        Reply::WaitLanded { timeout_ms } => wait_landed(device, timeout_ms),
    }
}

/// Polls until nothing is pending, never holding the lock while sleeping.
fn wait_landed(device: &SharedDevice, timeout_ms: u64) -> Response {
    let start = Instant::now();
    let timeout = Duration::from_millis(timeout_ms);
    loop {
        let pending = device.with(|d, now| d.pending_bytes(now));
        if pending == 0 {
            return Response {
                pending_bytes: Some(0),
                ..Response::ok()
            };
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Response {
                pending_bytes: Some(pending),
                ..Response::error(format!(
                    "timeout after {timeout_ms} ms: {pending} bytes still pending"
                ))
            };
        }
        thread::sleep(WAIT_POLL.min(timeout - waited));
    }
}

/// A response as one line, newline included.
fn encode(response: &Response) -> Vec<u8> {
    let mut out = serde_json::to_vec(response).unwrap_or_else(|e| {
        format!("{{\"ok\":false,\"error\":\"cannot encode response: {e}\"}}").into_bytes()
    });
    out.push(b'\n');
    out
}

/// Serves one connection until the client closes it (or the server stops).
/// A line the client did not finish (no newline before it closed) is not a
/// request: it is dropped unanswered and changes nothing.
fn serve_connection(
    device: &SharedDevice,
    cpu_state: Option<&CpuStateSource>,
    stream: UnixStream,
) -> io::Result<()> {
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        let response = match read_line(&mut reader, &mut line, MAX_LINE)? {
            Line::End | Line::Unterminated => return Ok(()),
            Line::Blank => continue,
            Line::TooLong => Response::error(format!(
                "request longer than {MAX_LINE} bytes: refused (and skipped up to its newline)"
            )),
            Line::Text => answer_line(device, cpu_state, &line),
        };
        writer.write_all(&encode(&response))?;
    }
}

type Connections = Arc<Mutex<HashMap<u64, UnixStream>>>;

impl SharedDevice {
    /// Starts serving the control socket at `path` (a stale socket file there
    /// is replaced). Dropping the returned server stops it.
    pub fn serve_control(&self, path: &Path) -> io::Result<ControlServer> {
        ControlServer::start(self.clone(), path, None)
    }
}

/// A running control socket. Dropping it stops accepting, shuts down open
/// connections, and removes the socket file.
#[derive(Debug)]
pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    connections: Connections,
}

impl ControlServer {
    /// Binds `path` (replacing a stale socket file) and starts serving;
    /// `cpu_state` answers [`Request::CpuState`] (a host with vCPUs to show).
    pub fn start(
        device: SharedDevice,
        path: &Path,
        cpu_state: Option<CpuStateSource>,
    ) -> io::Result<ControlServer> {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if meta.file_type().is_socket() {
                std::fs::remove_file(path)?;
            }
        }
        let listener = UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let connections: Connections = Arc::default();
        let accept = {
            let stop = stop.clone();
            let connections = connections.clone();
            thread::Builder::new()
                .name("perfbed-control".into())
                .spawn(move || accept_loop(device, cpu_state, listener, stop, connections))?
        };
        Ok(ControlServer {
            path: path.to_path_buf(),
            stop,
            accept: Some(accept),
            connections,
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn accept_loop(
    device: SharedDevice,
    cpu_state: Option<CpuStateSource>,
    listener: UnixListener,
    stop: Arc<AtomicBool>,
    connections: Connections,
) {
    let next_id = AtomicU64::new(0);
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((mut stream, _)) => {
                let id = next_id.fetch_add(1, Ordering::Relaxed);
                if stream.set_nonblocking(false).is_err() {
                    continue;
                }
                let open = connections.lock().map_or(0, |map| map.len());
                if open >= MAX_CONNECTIONS {
                    let busy = Response::error(format!(
                        "too many connections ({open} open): try again later"
                    ));
                    // Best effort: the client may not even read it.
                    let _ = stream.set_write_timeout(Some(ACCEPT_POLL));
                    let _ = stream.write_all(&encode(&busy));
                    continue;
                }
                if let Ok(clone) = stream.try_clone() {
                    if let Ok(mut map) = connections.lock() {
                        map.insert(id, clone);
                    }
                }
                let device = device.clone();
                let cpu_state = cpu_state.clone();
                let conns = connections.clone();
                let spawned = thread::Builder::new()
                    .name(format!("perfbed-control-{id}"))
                    .spawn(move || {
                        let _ = serve_connection(&device, cpu_state.as_ref(), stream);
                        if let Ok(mut map) = conns.lock() {
                            map.remove(&id);
                        }
                    });
                if spawned.is_err() {
                    if let Ok(mut map) = connections.lock() {
                        map.remove(&id);
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(ACCEPT_POLL),
            Err(_) => thread::sleep(ACCEPT_POLL),
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(handle) = self.accept.take() {
            let _ = handle.join();
        }
        if let Ok(mut map) = self.connections.lock() {
            for (_, stream) in map.drain() {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Why a client request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Socket I/O failed.
    #[error("control socket: {0}")]
    Io(#[from] io::Error),
    /// A request could not be encoded or a response decoded.
    #[error("control socket: bad JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The server closed the connection.
    #[error("control socket: the server closed the connection")]
    Closed,
    /// The server refused the request.
    #[error("refused: {0}")]
    Refused(String),
    /// A successful response lacked its payload.
    #[error("control socket: response without {0}")]
    MissingPayload(&'static str),
}

/// A connection to a control socket.
#[derive(Debug)]
pub struct ControlClient {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl ControlClient {
    /// Connects to the control socket at `path`.
    pub fn connect(path: &Path) -> Result<ControlClient, ClientError> {
        let stream = UnixStream::connect(path)?;
        Ok(ControlClient {
            writer: stream.try_clone()?,
            reader: BufReader::new(stream),
        })
    }

    /// Sends a raw line (without its newline) and returns the raw response
    /// line (without its newline).
    pub fn request_line(&mut self, line: &str) -> Result<String, ClientError> {
        let mut out = line.as_bytes().to_vec();
        out.push(b'\n');
        self.writer.write_all(&out)?;
        let mut response = String::new();
        if self.reader.read_line(&mut response)? == 0 {
            return Err(ClientError::Closed);
        }
        Ok(response.trim_end().to_string())
    }

    /// Sends `request` and returns the server's response (`ok` or not).
    pub fn request(&mut self, request: &Request) -> Result<Response, ClientError> {
        let line = serde_json::to_string(request)?;
        let response = self.request_line(&line)?;
        Ok(serde_json::from_str(&response)?)
    }

    /// Sends `request`; a refusal becomes [`ClientError::Refused`].
    pub fn call(&mut self, request: &Request) -> Result<Response, ClientError> {
        let response = self.request(request)?;
        if response.ok {
            Ok(response)
        } else {
            Err(ClientError::Refused(
                response.error.unwrap_or_else(|| "no reason given".into()),
            ))
        }
    }

    /// Queues `bytes` of `event` for (`domain`, `rmid`).
    pub fn inject(
        &mut self,
        domain: u32,
        rmid: u32,
        event: Event,
        bytes: u64,
    ) -> Result<(), ClientError> {
        self.call(&Request::Inject {
            domain,
            rmid,
            event,
            bytes,
        })
        .map(drop)
    }

    /// Sets a steady rate (0 clears it).
    pub fn set_rate(
        &mut self,
        domain: u32,
        rmid: u32,
        event: Event,
        bytes_per_sec: u64,
    ) -> Result<(), ClientError> {
        self.call(&Request::SetRate {
            domain,
            rmid,
            event,
            bytes_per_sec,
        })
        .map(drop)
    }

    /// Sets the LLC occupancy of (`domain`, `rmid`).
    pub fn set_occupancy(&mut self, domain: u32, rmid: u32, bytes: u64) -> Result<(), ClientError> {
        self.call(&Request::SetOccupancy {
            domain,
            rmid,
            bytes,
        })
        .map(drop)
    }

    /// Changes domain `domain`'s allowed CPUs to `cpus` (may be empty).
    pub fn set_allowed(&mut self, domain: u32, cpus: &[u32]) -> Result<(), ClientError> {
        self.call(&Request::SetAllowed {
            domain,
            cpus: crate::cpus::format_cpu_list(cpus),
        })
        .map(drop)
    }

    /// Waits until all injected traffic has landed, at most `timeout_ms`
    /// and never more than the server takes ([`MAX_WAIT_MS`]): a caller's
    /// patience for a guest held in gdb is an hour, traffic lands in
    /// seconds.
    pub fn wait_landed(&mut self, timeout_ms: u64) -> Result<(), ClientError> {
        self.call(&Request::WaitLanded {
            timeout_ms: timeout_ms.min(MAX_WAIT_MS),
        })
        .map(drop)
    }

    /// A snapshot of the device.
    pub fn state(&mut self) -> Result<DeviceState, ClientError> {
        self.call(&Request::State)?
            .state
            .ok_or(ClientError::MissingPayload("state"))
    }

    /// The host's vCPUs as text ([`Request::CpuState`]).
    pub fn cpu_state(&mut self) -> Result<String, ClientError> {
        self.call(&Request::CpuState)?
            .cpu_state
            .ok_or(ClientError::MissingPayload("cpu_state"))
    }

    /// Clears the statistics and the trace.
    pub fn reset_stats(&mut self) -> Result<(), ClientError> {
        self.call(&Request::ResetStats).map(drop)
    }

    /// The recorded register accesses.
    pub fn trace(&mut self) -> Result<Vec<TraceEntry>, ClientError> {
        self.call(&Request::Trace)?
            .trace
            .ok_or(ClientError::MissingPayload("trace"))
    }

    /// Slot-level truth: the assignments numbered `since` and later.
    pub fn assignments(&mut self, since: u64) -> Result<Assignments, ClientError> {
        self.call(&Request::Assignments { since })?
            .assignments
            .ok_or(ClientError::MissingPayload("assignments"))
    }

    /// The register accesses from record number `since` on.
    pub fn trace_accesses(&mut self, since: u64) -> Result<TraceAccesses, ClientError> {
        self.call(&Request::TraceAccesses { since })?
            .trace_accesses
            .ok_or(ClientError::MissingPayload("trace_accesses"))
    }

    /// The trace as lines, from record number `since` on.
    pub fn trace_lines(&mut self, since: u64) -> Result<TraceLines, ClientError> {
        self.call(&Request::TraceLines { since })?
            .trace_lines
            .ok_or(ClientError::MissingPayload("trace_lines"))
    }

    /// The whole trace as a trace file's text: the header, a `dropped`
    /// line when the ring overflowed, then one line per record.
    pub fn trace_text(&mut self) -> Result<String, ClientError> {
        let t = self.trace_lines(0)?;
        Ok(crate::device::trace_file(&t.header, t.dropped, &t.lines))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceConfig;

    /// A trace request copies the records under the lock and is formatted
    /// after it: `apply` (what runs under the lock) must not format.
    #[test]
    fn trace_requests_are_formatted_outside_the_lock() {
        let mut device = Device::new(DeviceConfig::default()).unwrap();
        for i in 0..100 {
            device.read(i, 0, 0, 8);
        }
        let requests = [
            (Request::Trace, TraceFormat::Entries),
            (Request::TraceLines { since: 0 }, TraceFormat::Lines),
            (Request::TraceAccesses { since: 50 }, TraceFormat::Accesses),
        ];
        for (request, format) in requests {
            let reply = apply(&mut device, 1000, &request);
            let Reply::Trace {
                snapshot,
                format: asked,
            } = &reply
            else {
                panic!("{request:?} was answered under the lock: {reply:?}")
            };
            assert_eq!(*asked, format);
            assert!(snapshot.records.len() >= 50);
            let Reply::Now(response) = reply.format() else {
                panic!("not formatted")
            };
            match format {
                TraceFormat::Lines => {
                    assert!(response.trace_lines.is_some_and(|t| t.lines.len() >= 100))
                }
                TraceFormat::Entries => assert_eq!(response.trace.map(|t| t.len()), Some(100)),
                // Records 50..100 of the reads (the ring started at 0).
                TraceFormat::Accesses => {
                    let t = response.trace_accesses.expect("trace_accesses payload");
                    assert_eq!((t.first_seq, t.next_seq, t.accesses.len()), (0, 100, 50));
                    assert_eq!(t.accesses[0].time_ns, 50);
                }
            }
        }
    }

    /// `cpu_state` is the host's to answer: from its source when it serves
    /// one (outside the device), refused by a host that has none.
    #[test]
    fn cpu_state_is_answered_by_the_hosts_source_or_refused() {
        let device = SharedDevice::new(DeviceConfig::default()).unwrap();
        let line = br#"{"op":"cpu_state"}"#;
        let refused = answer_line(&device, None, line);
        assert_eq!(
            (refused.ok, refused.error.as_deref()),
            (false, Some(NO_CPU_STATE))
        );
        let source: CpuStateSource = Arc::new(|| Ok("### info registers -a\nCPU#0\n".into()));
        let answered = answer_line(&device, Some(&source), line);
        assert!(answered.ok);
        assert_eq!(
            answered.cpu_state.as_deref(),
            Some("### info registers -a\nCPU#0\n")
        );
        let failing: CpuStateSource = Arc::new(|| Err("not yet".into()));
        assert_eq!(
            answer_line(&device, Some(&failing), line).error.as_deref(),
            Some("not yet")
        );
        // Other requests still reach the device; a stray field is refused.
        assert!(answer_line(&device, Some(&source), br#"{"op":"state"}"#)
            .state
            .is_some());
        assert!(!answer_line(&device, Some(&source), br#"{"op":"cpu_state","x":1}"#).ok);
    }
}
