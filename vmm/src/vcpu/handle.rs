//! vCPU threads and their handles: kick, pause, resume, stop and join.
//!
//! A vCPU thread spends its life inside `KVM_RUN`, which only returns on an
//! exit the VMM must handle or on a signal. A kick is the pair Firecracker
//! and Cloud Hypervisor use: the request is published first (a state under
//! the handle's mutex), then [`KICK_SIGNAL`] is sent to the thread. Its
//! handler runs on the vCPU thread and sets `kvm_run.immediate_exit`, so
//! that whichever comes first wins and nothing is lost:
//! - the thread is inside `KVM_RUN`: the signal makes it return `EINTR`;
//! - the thread is between runs: it clears `immediate_exit`, *then* reads
//!   the request before entering again; a request published after that
//!   read comes with a signal whose `immediate_exit` makes the next
//!   `KVM_RUN` return at once.
//!
//! A snapshot of the vCPU's state is asked the same way (a flag published,
//! then the kick): the thread takes it at its checkpoint, running or
//! parked, and goes on as it was. A thread whose guest ended the run takes
//! one before it ends, so the state that ended it can still be read.
//!
//! A vCPU may also park itself: a runner whose step returns
//! [`Step::Park`] (a debug exit, for gdb) is paused as if asked, and stays
//! parked until someone resumes it.
//!
//! The machinery is generic over [`Runnable`] so that it can be tested
//! without KVM (the tests' runner blocks in `nanosleep` the way a vCPU
//! blocks in `KVM_RUN`).

use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once, OnceLock};
use std::thread::{self, JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

use perfbed_device::control::CpuStateSource;

use super::snapshot::{render, VcpuSnapshot, BEGIN_MARKER, END_MARKER};

/// How long a capture waits for each vCPU's thread to take its snapshot.
pub const SNAPSHOT_PATIENCE: Duration = Duration::from_secs(2);

/// The kick signal's offset from `SIGRTMIN` (real-time signals are not
/// used by the C runtime).
pub const KICK_SIGNAL_OFFSET: i32 = 0;

/// How a vCPU's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VcpuEnd {
    /// The guest reset the machine (reboot, triple fault, or a panic's
    /// reboot): the end of the VM.
    Reset,
    /// KVM could not run the guest: a failed entry, an internal
    /// (emulation) error, or an exit the VMM does not handle.
    KvmFailure(String),
    /// `KVM_RUN` itself failed (the host's side).
    Failed(String),
    /// The VMM stopped it (the end of the run, a panic, SIGTERM).
    Stopped,
}

/// What one guest entry came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Go on: an exit handled, or `EINTR` from a kick.
    Go,
    /// Park this vCPU until it is resumed (it stopped for the debugger).
    Park,
    /// The run is over.
    End(VcpuEnd),
}

/// What a vCPU thread runs: one guest entry at a time.
pub trait Runnable: Send + 'static {
    /// Enters the guest once and handles the exit.
    fn step(&mut self) -> Step;
    /// The byte that makes the next entry return at once
    /// (`kvm_run.immediate_exit`); it must stay valid while the thread runs.
    fn immediate_exit(&mut self) -> *mut u8;
    /// The vCPU's state, read between entries (why not, if it cannot be).
    fn snapshot(&mut self) -> Result<VcpuSnapshot, String>;
}

/// Why a handle's request did not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandleError {
    #[error("vCPU {index}: installing the kick signal's handler: {errno}")]
    SignalHandler { index: u32, errno: i32 },
    #[error("vCPU {index}: starting its thread: {why}")]
    Spawn { index: u32, why: String },
    #[error("vCPU {index}: sending the kick signal: errno {errno}")]
    Kick { index: u32, errno: i32 },
    #[error("vCPU {index} did not {what} within {waited:?}")]
    Timeout {
        index: u32,
        what: &'static str,
        waited: Duration,
    },
    #[error("vCPU {index} has already ended ({end:?})")]
    Ended { index: u32, end: VcpuEnd },
    #[error("vCPU {index}'s thread panicked")]
    Panicked { index: u32 },
}

/// How a vCPU thread starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Entering the guest at once.
    Running,
    /// Parked before its first entry, until resumed (gdb's "stopped at the
    /// first instruction").
    Paused,
}

/// What the VMM asks of a vCPU thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Request {
    Run,
    Pause,
    Stop,
}

#[derive(Debug)]
struct State {
    request: Request,
    /// The thread is parked at its checkpoint on a pause.
    paused: bool,
    /// The thread has left its loop (and will touch KVM no more).
    ended: Option<VcpuEnd>,
    /// The thread's pthread while it is alive, for the kick.
    pthread: Option<libc::pthread_t>,
    /// A snapshot is asked for and not taken yet.
    snapshot_asked: bool,
    /// The snapshot taken on the last request.
    snapshot: Option<Result<VcpuSnapshot, String>>,
    /// The one taken as the guest ended the run (kept apart: a request
    /// that comes after the loop ended, before the thread did, is never
    /// served and must find it).
    last: Option<Result<VcpuSnapshot, String>>,
}

/// What the thread does after its checkpoint.
enum Checkpoint {
    Enter,
    Stop,
    Snapshot,
}

/// The part of a handle the vCPU thread and anyone holding it share: the
/// panic report can stop every vCPU with it without owning the threads.
pub struct VcpuControl {
    index: u32,
    state: Mutex<State>,
    changed: Condvar,
    thread: Mutex<Option<ThreadId>>,
}

impl VcpuControl {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    /// The vCPU's thread, once it started.
    pub fn thread_id(&self) -> Option<ThreadId> {
        *self.thread.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes `request` and kicks the thread out of the guest.
    fn request(&self, request: Request) -> Result<(), HandleError> {
        let mut state = self.state();
        if state.request == Request::Stop {
            // Stopping is final.
            return Ok(());
        }
        state.request = request;
        self.changed.notify_all();
        // Kicked under the lock: the thread clears `pthread` under it too
        // before it ends, so the pthread_t is never that of a gone thread.
        if let (Some(pthread), None) = (state.pthread, &state.ended) {
            let kicked = Pthread(pthread).kill(SIGRTMIN() + KICK_SIGNAL_OFFSET);
            kicked.map_err(|e| HandleError::Kick {
                index: self.index,
                errno: e.errno(),
            })?;
        }
        Ok(())
    }

    /// Kicks the vCPU out of the guest for good: its thread ends with
    /// [`VcpuEnd::Stopped`] (or whatever end it had reached already).
    pub fn stop(&self) -> Result<(), HandleError> {
        self.request(Request::Stop)
    }

    /// Waits until the thread has ended, at most `patience`.
    pub fn wait_ended(&self, patience: Duration) -> Result<VcpuEnd, HandleError> {
        self.wait_until(patience, "end", |state| state.ended.clone().map(Ok))
    }

    /// Waits (at most `patience`) until `outcome` has an answer from the
    /// state.
    fn wait_until<T>(
        &self,
        patience: Duration,
        what: &'static str,
        outcome: impl Fn(&State) -> Option<Result<T, HandleError>>,
    ) -> Result<T, HandleError> {
        let deadline = Instant::now() + patience;
        let mut state = self.state();
        loop {
            if let Some(result) = outcome(&state) {
                return result;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(HandleError::Timeout {
                    index: self.index,
                    what,
                    waited: patience,
                });
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The thread's checkpoint between guest entries: parks while paused,
    /// leaves to stop or to take a snapshot.
    fn checkpoint(&self, immediate_exit: *mut u8) -> Checkpoint {
        // Cleared before the request is read (see the module's doc).
        // SAFETY: the runner keeps the byte valid while its thread runs, and
        // only this thread and its own signal handler write it.
        unsafe { immediate_exit.write_volatile(0) };
        let mut state = self.state();
        loop {
            if state.snapshot_asked && state.request != Request::Stop {
                state.snapshot_asked = false;
                return Checkpoint::Snapshot;
            }
            match state.request {
                Request::Run => {
                    if state.paused {
                        state.paused = false;
                        self.changed.notify_all();
                    }
                    return Checkpoint::Enter;
                }
                Request::Stop => return Checkpoint::Stop,
                Request::Pause => {
                    if !state.paused {
                        state.paused = true;
                        self.changed.notify_all();
                    }
                    state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
                }
            }
        }
    }

    /// Kicks the vCPU out of the guest and parks it, and waits (at most
    /// `patience`) until it is parked.
    pub fn pause(&self, patience: Duration) -> Result<(), HandleError> {
        self.request(Request::Pause)?;
        let index = self.index;
        self.wait_until(patience, "pause", |state| match &state.ended {
            Some(end) => Some(Err(HandleError::Ended {
                index,
                end: end.clone(),
            })),
            None => state.paused.then_some(Ok(())),
        })
    }

    /// Lets a paused vCPU run again.
    pub fn resume(&self) -> Result<(), HandleError> {
        self.request(Request::Run)
    }

    /// The vCPU's state, taken by its thread at its next checkpoint (it is
    /// kicked out of the guest for it, and goes on as it was), waiting at
    /// most `patience`; for a vCPU whose thread has ended, the state it
    /// ended in (a guest's end) or the end.
    pub fn snapshot(
        &self,
        patience: Duration,
    ) -> Result<Result<VcpuSnapshot, String>, HandleError> {
        {
            let mut state = self.state();
            if state.ended.is_none() {
                state.snapshot = None;
                state.snapshot_asked = true;
                self.changed.notify_all();
                if let Some(pthread) = state.pthread {
                    Pthread(pthread)
                        .kill(SIGRTMIN() + KICK_SIGNAL_OFFSET)
                        .map_err(|e| HandleError::Kick {
                            index: self.index,
                            errno: e.errno(),
                        })?;
                }
            }
        }
        let index = self.index;
        self.wait_until(patience, "take a snapshot", |state| {
            match (&state.snapshot, &state.ended, &state.last) {
                (Some(taken), _, _) => Some(Ok(taken.clone())),
                (None, Some(_), Some(last)) => Some(Ok(last.clone())),
                (None, Some(end), None) => Some(Err(HandleError::Ended {
                    index,
                    end: end.clone(),
                })),
                (None, None, _) => None,
            }
        })
    }

    fn put_snapshot(&self, taken: Result<VcpuSnapshot, String>) {
        self.state().snapshot = Some(taken);
        self.changed.notify_all();
    }

    fn put_last(&self, taken: Result<VcpuSnapshot, String>) {
        self.state().last = Some(taken);
    }

    /// Whether the thread is parked.
    pub fn is_paused(&self) -> bool {
        self.state().paused
    }

    /// Parks the calling vCPU thread at its next checkpoint (its runner
    /// asked to, [`Step::Park`]); a stop already asked for wins.
    fn park_self(&self) {
        let mut state = self.state();
        if state.request == Request::Run {
            state.request = Request::Pause;
        }
    }

    fn end(&self, end: VcpuEnd) {
        let mut state = self.state();
        state.pthread = None;
        state.paused = false;
        // Only a guest's end leaves its state to read.
        state.snapshot = None;
        state.ended = Some(end);
        self.changed.notify_all();
    }
}

/// A `pthread_t` to kick.
struct Pthread(libc::pthread_t);

// SAFETY: only built from the pthread of a live vCPU thread, under the
// control's lock, which the thread takes to clear it before it ends.
unsafe impl Killable for Pthread {
    fn pthread_handle(&self) -> libc::pthread_t {
        self.0
    }
}

/// A running vCPU thread.
pub struct VcpuHandle {
    control: Arc<VcpuControl>,
    thread: Option<JoinHandle<()>>,
}

thread_local! {
    /// This thread's `immediate_exit` byte, for the kick signal's handler.
    static KICK_TARGET: Cell<*mut u8> = const { Cell::new(ptr::null_mut()) };
}

extern "C" fn on_kick(
    _signal: libc::c_int,
    _info: *mut libc::siginfo_t,
    _context: *mut libc::c_void,
) {
    // Async-signal-safe: a const-initialized thread-local and one store.
    let target = KICK_TARGET.with(Cell::get);
    if !target.is_null() {
        // SAFETY: set by this thread's run loop to its runner's byte, which
        // stays valid until the loop clears the pointer.
        unsafe { target.write_volatile(1) };
    }
}

fn install_kick_handler() -> Result<(), i32> {
    static INSTALL: Once = Once::new();
    static ERRNO: AtomicI32 = AtomicI32::new(0);
    INSTALL.call_once(|| {
        if let Err(e) = register_signal_handler(SIGRTMIN() + KICK_SIGNAL_OFFSET, on_kick) {
            ERRNO.store(e.errno(), Ordering::SeqCst);
        }
    });
    match ERRNO.load(Ordering::SeqCst) {
        0 => Ok(()),
        errno => Err(errno),
    }
}

impl VcpuHandle {
    /// Starts vCPU `index`'s thread running `runner`; `on_end` runs on that
    /// thread once the loop is over (the guest's reset or a failure, or a
    /// stop), after KVM is left for good.
    pub fn spawn(
        index: u32,
        runner: impl Runnable,
        on_end: impl FnOnce(&VcpuEnd) + Send + 'static,
    ) -> Result<VcpuHandle, HandleError> {
        VcpuHandle::spawn_with(index, runner, on_end, Start::Running)
    }

    /// [`VcpuHandle::spawn`], parked before its first entry when `start`
    /// says so.
    pub fn spawn_with(
        index: u32,
        mut runner: impl Runnable,
        on_end: impl FnOnce(&VcpuEnd) + Send + 'static,
        start: Start,
    ) -> Result<VcpuHandle, HandleError> {
        install_kick_handler().map_err(|errno| HandleError::SignalHandler { index, errno })?;
        let control = Arc::new(VcpuControl {
            index,
            state: Mutex::new(State {
                request: match start {
                    Start::Running => Request::Run,
                    Start::Paused => Request::Pause,
                },
                paused: false,
                ended: None,
                pthread: None,
                snapshot_asked: false,
                snapshot: None,
                last: None,
            }),
            changed: Condvar::new(),
            thread: Mutex::new(None),
        });
        let shared = control.clone();
        let thread = thread::Builder::new()
            .name(format!("vcpu{index}"))
            .spawn(move || {
                let immediate_exit = runner.immediate_exit();
                KICK_TARGET.with(|t| t.set(immediate_exit));
                {
                    // SAFETY: pthread_self has no preconditions.
                    let me = unsafe { libc::pthread_self() };
                    shared.state().pthread = Some(me);
                    *shared.thread.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(thread::current().id());
                }
                let end = loop {
                    match shared.checkpoint(immediate_exit) {
                        Checkpoint::Enter => {}
                        Checkpoint::Stop => break VcpuEnd::Stopped,
                        Checkpoint::Snapshot => {
                            shared.put_snapshot(runner.snapshot());
                            continue;
                        }
                    }
                    match runner.step() {
                        Step::Go => {}
                        Step::Park => shared.park_self(),
                        Step::End(end) => {
                            // The state the guest ended the run in.
                            shared.put_last(runner.snapshot());
                            break end;
                        }
                    }
                };
                KICK_TARGET.with(|t| t.set(ptr::null_mut()));
                on_end(&end);
                shared.end(end);
            })
            .map_err(|e| HandleError::Spawn {
                index,
                why: e.to_string(),
            })?;
        Ok(VcpuHandle {
            control,
            thread: Some(thread),
        })
    }

    pub fn index(&self) -> u32 {
        self.control.index
    }

    /// What the panic path needs to stop this vCPU.
    pub fn control(&self) -> Arc<VcpuControl> {
        self.control.clone()
    }

    /// Kicks the vCPU out of the guest and parks it, and waits (at most
    /// `patience`) until it is parked.
    pub fn pause(&self, patience: Duration) -> Result<(), HandleError> {
        self.control.pause(patience)
    }

    /// Lets a paused vCPU run again.
    pub fn resume(&self) -> Result<(), HandleError> {
        self.control.resume()
    }

    /// Whether the thread is parked.
    pub fn is_paused(&self) -> bool {
        self.control.is_paused()
    }

    /// Kicks the vCPU out of the guest for good.
    pub fn stop(&self) -> Result<(), HandleError> {
        self.control.stop()
    }

    /// Waits (at most `patience`) for the thread to end, joins it and says
    /// how it ended.
    pub fn join(mut self, patience: Duration) -> Result<VcpuEnd, HandleError> {
        let end = self.control.wait_ended(patience)?;
        if let Some(thread) = self.thread.take() {
            thread.join().map_err(|_| HandleError::Panicked {
                index: self.control.index,
            })?;
        }
        Ok(end)
    }
}

/// Stops every vCPU, then joins each within `patience` (for all of them
/// together): the vCPUs that ended, and the errors of those that did not.
pub fn stop_and_join(
    handles: Vec<VcpuHandle>,
    patience: Duration,
) -> (Vec<(u32, VcpuEnd)>, Vec<HandleError>) {
    let mut errors = Vec::new();
    for handle in &handles {
        if let Err(e) = handle.stop() {
            errors.push(e);
        }
    }
    let deadline = Instant::now() + patience;
    let mut joined = Vec::new();
    for handle in handles {
        let index = handle.index();
        match handle.join(deadline.saturating_duration_since(Instant::now())) {
            Ok(end) => joined.push((index, end)),
            Err(e) => errors.push(e),
        }
    }
    (joined, errors)
}

/// The panic path's stop: every vCPU but the one on thread `panicking`
/// (which will never get back to its checkpoint: it is the one waiting for
/// the report) is kicked out of KVM, then waited for, within `patience` for
/// all. How many ended; the others are logged.
pub fn stop_all_but(
    controls: &[Arc<VcpuControl>],
    panicking: ThreadId,
    patience: Duration,
) -> usize {
    let others: Vec<&Arc<VcpuControl>> = controls
        .iter()
        .filter(|c| c.thread_id() != Some(panicking))
        .collect();
    for control in &others {
        if let Err(e) = control.stop() {
            log::error!("{e}");
        }
    }
    let deadline = Instant::now() + patience;
    others
        .iter()
        .filter(
            |c| match c.wait_ended(deadline.saturating_duration_since(Instant::now())) {
                Ok(_) => true,
                Err(e) => {
                    log::error!("{e}");
                    false
                }
            },
        )
        .count()
}

/// Every vCPU's state as [`render`]'s text: each live vCPU is kicked out
/// of the guest for it (and goes on), an ended one gives the state its
/// guest ended the run in.
pub fn capture(controls: &[Arc<VcpuControl>]) -> String {
    let taken: Vec<Result<VcpuSnapshot, String>> = controls
        .iter()
        .map(|c| {
            c.snapshot(SNAPSHOT_PATIENCE)
                .map_err(|e| e.to_string())
                .and_then(|s| s)
        })
        .collect();
    render(&taken)
}

/// Prints [`capture`] to stderr between [`BEGIN_MARKER`] and
/// [`END_MARKER`] (at any log level), saying why it was taken.
pub fn report(controls: &[Arc<VcpuControl>], why: &str) {
    eprintln!("{BEGIN_MARKER}: {why}\n{}{END_MARKER}", capture(controls));
}

/// The control socket's answer to `cpu_state`, once the vCPUs exist
/// (`vcpus` is set when they are spawned).
pub fn control_source(vcpus: Arc<OnceLock<Vec<Arc<VcpuControl>>>>) -> CpuStateSource {
    Arc::new(move || match vcpus.get() {
        Some(controls) => Ok(capture(controls)),
        None => Err("the vCPUs have not started yet (the VMM waits for the agent's client)".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// Blocks the way `KVM_RUN` does: until a signal interrupts it or
    /// `immediate_exit` is set before it starts; `ends_after` entries in,
    /// the "guest" resets.
    struct Sleeper {
        immediate_exit: Box<u8>,
        entries: Arc<AtomicU32>,
        ends_after: Option<u32>,
        /// Entries after which the runner asks to park (a debug exit).
        parks_at: Vec<u32>,
    }

    impl Sleeper {
        fn new(ends_after: Option<u32>) -> (Sleeper, Arc<AtomicU32>) {
            let entries = Arc::new(AtomicU32::new(0));
            (
                Sleeper {
                    immediate_exit: Box::new(0),
                    entries: entries.clone(),
                    ends_after,
                    parks_at: Vec::new(),
                },
                entries,
            )
        }
    }

    impl Runnable for Sleeper {
        fn step(&mut self) -> Step {
            let n = self.entries.fetch_add(1, Ordering::SeqCst) + 1;
            if self.ends_after.is_some_and(|last| n >= last) {
                return Step::End(VcpuEnd::Reset);
            }
            if self.parks_at.contains(&n) {
                return Step::Park;
            }
            // As KVM_RUN in a halted guest: back with EINTR on a signal, or
            // at once with immediate_exit set (KVM reads it after the
            // signal check, so neither can slip in between; the 1 ms naps
            // stand in for that).
            loop {
                // SAFETY: our own byte; the signal handler writes it too.
                if unsafe { ptr::read_volatile(&*self.immediate_exit) } != 0 {
                    return Step::Go;
                }
                let nap = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 1_000_000,
                };
                // SAFETY: valid timespec, no remainder wanted.
                if unsafe { libc::nanosleep(&nap, ptr::null_mut()) } != 0 {
                    return Step::Go;
                }
            }
        }

        fn immediate_exit(&mut self) -> *mut u8 {
            &mut *self.immediate_exit
        }

        /// The number of entries so far, as RIP.
        fn snapshot(&mut self) -> Result<VcpuSnapshot, String> {
            let mut taken = VcpuSnapshot::default();
            taken.regs.rip = u64::from(self.entries.load(Ordering::SeqCst));
            Ok(taken)
        }
    }

    const PATIENCE: Duration = Duration::from_secs(10);

    #[test]
    fn a_stop_kicks_a_blocked_vcpu_out_and_join_reports_it() {
        let (runner, entries) = Sleeper::new(None);
        let ended = Arc::new(Mutex::new(None));
        let seen = ended.clone();
        let handle = VcpuHandle::spawn(0, runner, move |end| {
            *seen.lock().unwrap() = Some(end.clone())
        })
        .unwrap();
        while entries.load(Ordering::SeqCst) == 0 {
            thread::sleep(Duration::from_millis(1));
        }
        thread::sleep(Duration::from_millis(20)); // well inside the "guest"
        handle.stop().unwrap();
        assert_eq!(handle.join(PATIENCE), Ok(VcpuEnd::Stopped));
        assert_eq!(*ended.lock().unwrap(), Some(VcpuEnd::Stopped), "on_end ran");
    }

    #[test]
    fn pause_parks_the_vcpu_and_resume_lets_it_enter_again() {
        let (runner, entries) = Sleeper::new(None);
        let handle = VcpuHandle::spawn(1, runner, |_| {}).unwrap();
        while entries.load(Ordering::SeqCst) == 0 {
            thread::sleep(Duration::from_millis(1));
        }
        handle.pause(PATIENCE).unwrap();
        assert!(handle.is_paused());
        let parked_at = entries.load(Ordering::SeqCst);
        thread::sleep(Duration::from_millis(50));
        assert_eq!(
            entries.load(Ordering::SeqCst),
            parked_at,
            "a paused vCPU entered the guest"
        );
        handle.resume().unwrap();
        let deadline = Instant::now() + PATIENCE;
        while entries.load(Ordering::SeqCst) == parked_at {
            assert!(
                Instant::now() < deadline,
                "the resumed vCPU never entered again"
            );
            thread::sleep(Duration::from_millis(1));
        }
        assert!(!handle.is_paused());
        // Paused again, then stopped while parked.
        handle.pause(PATIENCE).unwrap();
        handle.stop().unwrap();
        assert_eq!(handle.join(PATIENCE), Ok(VcpuEnd::Stopped));
    }

    #[test]
    fn a_vcpu_started_paused_never_enters_until_resumed() {
        let (runner, entries) = Sleeper::new(None);
        let handle = VcpuHandle::spawn_with(4, runner, |_| {}, Start::Paused).unwrap();
        handle.pause(PATIENCE).unwrap();
        thread::sleep(Duration::from_millis(50));
        assert_eq!(
            entries.load(Ordering::SeqCst),
            0,
            "it entered the guest while paused"
        );
        handle.resume().unwrap();
        let deadline = Instant::now() + PATIENCE;
        while entries.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the resumed vCPU never entered");
            thread::sleep(Duration::from_millis(1));
        }
        handle.stop().unwrap();
        assert_eq!(handle.join(PATIENCE), Ok(VcpuEnd::Stopped));
    }

    #[test]
    fn a_runner_that_parks_stays_parked_until_resumed() {
        let (mut runner, entries) = Sleeper::new(None);
        runner.parks_at = vec![1];
        let handle = VcpuHandle::spawn(5, runner, |_| {}).unwrap();
        let deadline = Instant::now() + PATIENCE;
        while !handle.is_paused() {
            assert!(
                Instant::now() < deadline,
                "the runner's park was not honoured"
            );
            thread::sleep(Duration::from_millis(1));
        }
        thread::sleep(Duration::from_millis(50));
        assert_eq!(
            entries.load(Ordering::SeqCst),
            1,
            "a parked vCPU entered again"
        );
        handle.resume().unwrap();
        while entries.load(Ordering::SeqCst) < 2 {
            assert!(Instant::now() < deadline, "the resumed vCPU never entered");
            thread::sleep(Duration::from_millis(1));
        }
        handle.stop().unwrap();
        assert_eq!(handle.join(PATIENCE), Ok(VcpuEnd::Stopped));
    }

    #[test]
    fn kicks_are_never_lost_between_entries() {
        // Many stop requests at random points of the loop: every one must
        // end the thread, whether it lands in the "guest" or between.
        for round in 0..200u64 {
            let (runner, entries) = Sleeper::new(None);
            let handle = VcpuHandle::spawn(2, runner, |_| {}).unwrap();
            if round % 2 == 0 {
                while entries.load(Ordering::SeqCst) == 0 {
                    std::hint::spin_loop();
                }
            }
            handle.stop().unwrap();
            assert_eq!(handle.join(PATIENCE), Ok(VcpuEnd::Stopped), "round {round}");
        }
    }

    #[test]
    fn a_guest_end_is_reported_and_later_requests_are_harmless() {
        let (runner, _) = Sleeper::new(Some(1));
        let handle = VcpuHandle::spawn(3, runner, |_| {}).unwrap();
        let control = handle.control();
        assert_eq!(control.wait_ended(PATIENCE), Ok(VcpuEnd::Reset));
        assert!(matches!(
            handle.pause(PATIENCE),
            Err(HandleError::Ended { index: 3, .. })
        ));
        handle.stop().unwrap();
        assert_eq!(handle.join(PATIENCE), Ok(VcpuEnd::Reset));
    }

    #[test]
    fn the_panic_path_stops_all_but_the_panicking_vcpu() {
        let handles: Vec<VcpuHandle> = (0..3)
            .map(|i| VcpuHandle::spawn(i, Sleeper::new(None).0, |_| {}).unwrap())
            .collect();
        let controls: Vec<Arc<VcpuControl>> = handles.iter().map(VcpuHandle::control).collect();
        let deadline = Instant::now() + PATIENCE;
        while controls.iter().any(|c| c.thread_id().is_none()) {
            assert!(Instant::now() < deadline, "the threads never started");
            thread::sleep(Duration::from_millis(1));
        }
        // As if vCPU 1's thread had panicked.
        let panicking = controls[1].thread_id().unwrap();
        assert_eq!(stop_all_but(&controls, panicking, PATIENCE), 2);
        assert_eq!(controls[0].wait_ended(Duration::ZERO), Ok(VcpuEnd::Stopped));
        assert!(matches!(
            controls[1].wait_ended(Duration::from_millis(50)),
            Err(HandleError::Timeout { index: 1, .. })
        ));
        let (joined, errors) = stop_and_join(handles, PATIENCE);
        assert!(errors.is_empty() && joined.len() == 3);
    }

    #[test]
    fn stop_and_join_ends_every_vcpu() {
        let handles: Vec<VcpuHandle> = (0..8)
            .map(|i| VcpuHandle::spawn(i, Sleeper::new(None).0, |_| {}).unwrap())
            .collect();
        let (joined, errors) = stop_and_join(handles, PATIENCE);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            joined.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            (0..8).collect::<Vec<_>>()
        );
        assert!(joined.iter().all(|(_, end)| *end == VcpuEnd::Stopped));
    }

    #[test]
    fn a_snapshot_is_taken_running_or_parked_and_the_vcpu_goes_on_as_it_was() {
        let (runner, entries) = Sleeper::new(None);
        let handle = VcpuHandle::spawn(0, runner, |_| {}).unwrap();
        while entries.load(Ordering::SeqCst) == 0 {
            thread::sleep(Duration::from_millis(1));
        }
        thread::sleep(Duration::from_millis(20)); // well inside the "guest"
        let control = handle.control();
        let taken = control.snapshot(PATIENCE).unwrap().unwrap();
        assert!(
            taken.regs.rip >= 1,
            "taken after an entry: {}",
            taken.regs.rip
        );
        let deadline = Instant::now() + PATIENCE;
        while u64::from(entries.load(Ordering::SeqCst)) <= taken.regs.rip {
            assert!(
                Instant::now() < deadline,
                "the vCPU did not enter again after its snapshot"
            );
            thread::sleep(Duration::from_millis(1));
        }
        handle.pause(PATIENCE).unwrap();
        let parked_at = entries.load(Ordering::SeqCst);
        let taken = control.snapshot(PATIENCE).unwrap().unwrap();
        assert_eq!(taken.regs.rip, u64::from(parked_at));
        thread::sleep(Duration::from_millis(30));
        assert!(handle.is_paused(), "a snapshot resumed a paused vCPU");
        assert_eq!(entries.load(Ordering::SeqCst), parked_at);
        handle.stop().unwrap();
        assert_eq!(handle.join(PATIENCE), Ok(VcpuEnd::Stopped));
        assert!(matches!(
            control.snapshot(PATIENCE),
            Err(HandleError::Ended {
                end: VcpuEnd::Stopped,
                ..
            })
        ));
    }

    #[test]
    fn a_vcpu_whose_guest_ended_the_run_keeps_the_state_it_ended_in() {
        let (runner, _entries) = Sleeper::new(Some(1));
        let handle = VcpuHandle::spawn(0, runner, |_| {}).unwrap();
        let control = handle.control();
        assert_eq!(control.wait_ended(PATIENCE), Ok(VcpuEnd::Reset));
        assert_eq!(control.snapshot(PATIENCE).unwrap().unwrap().regs.rip, 1);
        assert_eq!(handle.join(PATIENCE), Ok(VcpuEnd::Reset));
    }

    /// The VMM asks for every vCPU's state as soon as one ends the run
    /// (`on_end` tells it): the ended one's request comes after its loop,
    /// before its thread ends, and must get the state it ended in (it got
    /// "has already ended" before `last` was kept apart).
    #[test]
    fn a_request_between_a_guests_end_and_the_threads_end_gets_the_last_state() {
        let (runner, _entries) = Sleeper::new(Some(1));
        let (in_on_end, wait_in_on_end) = std::sync::mpsc::channel();
        let (go, wait_go) = std::sync::mpsc::channel::<()>();
        let handle = VcpuHandle::spawn(0, runner, move |_| {
            in_on_end.send(()).unwrap();
            wait_go.recv().unwrap();
        })
        .unwrap();
        wait_in_on_end.recv_timeout(PATIENCE).unwrap();
        let control = handle.control();
        let asking = thread::spawn(move || control.snapshot(PATIENCE));
        thread::sleep(Duration::from_millis(50)); // the request is published
        go.send(()).unwrap();
        let taken = asking
            .join()
            .unwrap()
            .expect("the state it ended in")
            .unwrap();
        assert_eq!(taken.regs.rip, 1);
        assert_eq!(handle.join(PATIENCE), Ok(VcpuEnd::Reset));
    }
}
