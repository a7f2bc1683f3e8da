//! The BPF reader: a program on a raw tracepoint that reads one perf event
//! with `bpf_perf_event_read_value()` wherever the tracepoint fires, and
//! records every read, failures included, for the host to judge.
//!
//! It exercises the read path BPF has into a PMU: the helper calls the perf
//! core's `perf_event_read_local()` with interrupts off, which for a CPU
//! event answers `-EINVAL` unless it runs on the event's CPU (a device-scope
//! event's CPU is its PMU's owner, and follows it; while the PMU is parked,
//! the CPU its events wait on) and there, if the event is scheduled, calls
//! the PMU's `read`: the driver's path that tries its lock first and, in NMI
//! context, does not wait for it. The program runs
//! in the tracepoint's context (for `local_timer_entry`, the timer
//! interrupt), so the `PERF_EVENT_ARRAY` holds the same event at every
//! CPU's index and is read with `BPF_F_CURRENT_CPU`: every CPU's tick tries,
//! and only the owner's succeeds. The shape follows the kernel's
//! samples/bpf/tracex6 (a perf event array read per CPU with
//! `bpf_perf_event_read_value()` from a kprobe) and selftests/bpf's
//! test_pe_preserve_elems; here without libbpf, see `bpf.rs`.

use std::os::fd::{AsRawFd, OwnedFd};

use perfbed_agent::{parse_cpu_list, BpfRead};

use crate::bpf::{self, Helper, Insn, Map, MapType, Reg, Size, F_CURRENT_CPU};
use crate::CPU_SYSFS;

/// What the program pushes per read: `struct bpf_perf_event_value` (value,
/// enabled, running), then the time, the CPU and the helper's return, in
/// the program's stack frame at `RECORD` and in the queue map.
const RECORD_SIZE: usize = 40;
/// The record's place in the frame (r10 is its end).
const RECORD: i16 = -(RECORD_SIZE as i16);
const TIME: i16 = RECORD + 24;
const CPU: i16 = RECORD + 32;
const RET: i16 = RECORD + 36;
/// The dropped counter's key, below the record.
const KEY: i16 = RECORD - 8;
/// `sizeof(struct bpf_perf_event_value)`.
const VALUE_SIZE: i32 = 24;
/// Reads kept between two drains: the tick at 250 Hz on 16 CPUs fills it in
/// 16 s (2.6 MB of kernel memory, taken when the map is created).
const QUEUE_ENTRIES: u32 = 1 << 16;

pub struct BpfReader {
    queue: Map,
    dropped: Map,
    /// Kept to keep the program attached (closing a link detaches it) and
    /// the event referenced (the array holds its file until the map goes).
    _links: Vec<OwnedFd>,
    _prog: OwnedFd,
    _events: Map,
}

impl BpfReader {
    /// Loads the program reading `event` and attaches it to each of
    /// `tracepoints`.
    pub fn start(event: &OwnedFd, tracepoints: &[String]) -> Result<BpfReader, String> {
        let sys = |e: crate::perf::SysError| e.to_string();
        let possible = std::fs::read_to_string(format!("{CPU_SYSFS}/possible"))
            .map_err(|e| format!("reading the possible CPUs: {e}"))?;
        let cpus = parse_cpu_list(possible.trim())
            .map_err(|e| format!("possible CPUs {possible:?}: {e}"))?
            .into_iter()
            .max()
            .map_or(1, |max| max + 1);
        let events = Map::create(MapType::PerfEventArray, 4, 4, cpus).map_err(sys)?;
        let fd = event.as_raw_fd() as u32;
        for cpu in 0..cpus {
            // The kernel reads the event here once: a refusal other than
            // EOPNOTSUPP (inherit, not readable by BPF) is no refusal.
            events
                .update(&cpu.to_ne_bytes(), &fd.to_ne_bytes())
                .map_err(sys)?;
        }
        let queue =
            Map::create(MapType::Queue, 0, RECORD_SIZE as u32, QUEUE_ENTRIES).map_err(sys)?;
        let dropped = Map::create(MapType::Array, 4, 8, 1).map_err(sys)?;
        let program = program(&events, &queue, &dropped);
        let prog = bpf::prog_load(
            bpf::PROG_TYPE_RAW_TRACEPOINT,
            "perfbed_reader",
            &program,
            // bpf_perf_event_read_value() is GPL-only.
            "GPL",
        )?;
        let links = tracepoints
            .iter()
            .map(|tp| bpf::raw_tracepoint_open(tp, &prog).map_err(|e| format!("{tp}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(BpfReader {
            queue,
            dropped,
            _links: links,
            _prog: prog,
            _events: events,
        })
    }

    /// The reads recorded since the last drain, oldest first, and how many
    /// the program could not record since it was loaded.
    pub fn drain(&self) -> Result<(Vec<BpfRead>, u64), String> {
        let sys = |e: crate::perf::SysError| e.to_string();
        let mut reads = Vec::new();
        let mut record = [0u8; RECORD_SIZE];
        // Bounded: the program keeps pushing while this pops.
        for _ in 0..QUEUE_ENTRIES {
            if !self.queue.pop(&mut record).map_err(sys)? {
                break;
            }
            reads.push(decode(&record));
        }
        let mut dropped = [0u8; 8];
        self.dropped
            .lookup(&0u32.to_ne_bytes(), &mut dropped)
            .map_err(sys)?;
        Ok((reads, u64::from_ne_bytes(dropped)))
    }
}

fn decode(record: &[u8; RECORD_SIZE]) -> BpfRead {
    let u64_at = |at: usize| u64::from_ne_bytes(record[at..at + 8].try_into().expect("8 bytes"));
    let u32_at = |at: usize| u32::from_ne_bytes(record[at..at + 4].try_into().expect("4 bytes"));
    let at = |off: i16| (off - RECORD) as usize;
    BpfRead {
        value: u64_at(0),
        enabled: u64_at(8),
        running: u64_at(16),
        time_ns: u64_at(at(TIME)),
        cpu: u32_at(at(CPU)),
        ret: u32_at(at(RET)) as i32,
    }
}

/// The program: read, stamp, push; count a push the full queue refused.
fn program(events: &Map, queue: &Map, dropped: &Map) -> Vec<Insn> {
    use Reg::*;
    let mut p = Vec::new();
    // r0 = bpf_perf_event_read_value(events, BPF_F_CURRENT_CPU, fp + RECORD, 24):
    // it fills the record's first 24 bytes (zeroes on failure).
    p.extend(Insn::load_map(R1, events));
    p.push(Insn::mov32_imm(R2, F_CURRENT_CPU));
    p.push(Insn::mov64(R3, R10));
    p.push(Insn::add64_imm(R3, RECORD.into()));
    p.push(Insn::mov64_imm(R4, VALUE_SIZE));
    p.push(Insn::call(Helper::PerfEventReadValue));
    p.push(Insn::store(Size::W, R10, RET, R0));
    // The time after the read: the reads that succeed are the owner's, one
    // CPU at a time, so their times order them.
    p.push(Insn::call(Helper::KtimeGetNs));
    p.push(Insn::store(Size::DW, R10, TIME, R0));
    p.push(Insn::call(Helper::GetSmpProcessorId));
    p.push(Insn::store(Size::W, R10, CPU, R0));
    // r0 = bpf_map_push_elem(queue, fp + RECORD, 0); done if it took it.
    p.extend(Insn::load_map(R1, queue));
    p.push(Insn::mov64(R2, R10));
    p.push(Insn::add64_imm(R2, RECORD.into()));
    p.push(Insn::mov64_imm(R3, 0));
    p.push(Insn::call(Helper::MapPushElem));
    // The jump to the end, once the end is known.
    let to_exit = p.len();
    p.push(Insn::exit());
    // Otherwise count it: r0 = bpf_map_lookup_elem(dropped, &0); *r0 += 1.
    p.push(Insn::store_imm(Size::W, R10, KEY, 0));
    p.extend(Insn::load_map(R1, dropped));
    p.push(Insn::mov64(R2, R10));
    p.push(Insn::add64_imm(R2, KEY.into()));
    p.push(Insn::call(Helper::MapLookupElem));
    // The verifier insists on the null check.
    p.push(Insn::jeq_imm(R0, 0, 2));
    p.push(Insn::mov64_imm(R1, 1));
    p.push(Insn::atomic_add64(R0, 0, R1));
    let end = p.len();
    p[to_exit] = Insn::jeq_imm(R0, 0, (end - to_exit - 1) as i16);
    p.push(Insn::mov64_imm(R0, 0));
    p.push(Insn::exit());
    p
}
