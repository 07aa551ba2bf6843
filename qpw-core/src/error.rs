//! The crate's one error type.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::CpuSet;

/// Everything that can go wrong in qpw-core. Each message names the bad input and, where there
/// is one, the legal range.
///
/// `Clone` and `PartialEq`, so that a report can be copied and compared: the system's own
/// errors are held as an [`OsError`], which compares by kind, OS error number and message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A CPU list such as `0-`, `5-2` or `x` that does not parse.
    #[error("invalid CPU list `{input}`: {reason} (expected a list such as `0,2-5`)")]
    CpuListSyntax {
        /// The list as given.
        input: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A CPU number past what the system can name.
    #[error("cpu {cpu} is out of range: CPU numbers go from 0 to {max}")]
    CpuOutOfRange {
        /// The CPU given.
        cpu: usize,
        /// The largest legal CPU number.
        max: usize,
    },

    /// A CPU the process may not run on (outside `sched_getaffinity`).
    #[error("cpu {cpu} is not in the allowed set {allowed}")]
    CpuNotAllowed {
        /// The CPU given.
        cpu: usize,
        /// The CPUs the process may run on.
        allowed: CpuSet,
    },

    /// A CPU that this framework instance does not manage.
    #[error("cpu {cpu} is not in the managed set {managed}")]
    CpuNotManaged {
        /// The CPU given.
        cpu: usize,
        /// The CPUs the instance manages.
        managed: CpuSet,
    },

    /// An instance needs at least one CPU.
    #[error("the CPU set is empty: an instance needs at least one CPU")]
    EmptyCpuSet,

    /// Too many (or zero) logical CPUs asked for.
    #[error("{count} logical CPUs asked for: the legal range is 1-{max}")]
    LogicalCpuCount {
        /// The count given.
        count: usize,
        /// The largest legal count.
        max: usize,
    },

    /// A mode policy name that is not one of ours.
    #[error(
        "unknown mode `{input}`: expected `auto`, `queue`, `remote`, `fenced`, `isolated`, \
         `remote:<cpu-list>` or `fenced:<cpu-list>`"
    )]
    UnknownMode {
        /// The name as given.
        input: String,
    },

    /// A queue-mode CPU's lock taken by a thread that does not belong to that CPU.
    #[error(
        "cpu {cpu} is in queue mode: its lock may only be taken by that CPU's own threads, \
         and the caller {}",
        match caller { Some(c) => format!("runs on cpu {c}"), None => "is not bound to a CPU of this instance".to_string() }
    )]
    NotLocal {
        /// The CPU whose lock was asked for.
        cpu: usize,
        /// Where the caller runs, when that is known.
        caller: Option<usize>,
    },

    /// A lock that only its own CPU's threads may take, asked for on a remote- or fenced-mode
    /// CPU (whose lock other CPUs take).
    #[error(
        "cpu {cpu} is in {mode} mode, where other CPUs take its lock, but the {lock} lock may \
         only be taken by that CPU's own threads: build the instance with every CPU in queue mode"
    )]
    LockNeedsQueueMode {
        /// The first remote- or fenced-mode CPU.
        cpu: usize,
        /// The lock's name.
        lock: &'static str,
        /// That CPU's mode.
        mode: crate::Mode,
    },

    /// A second thread tried to claim a CPU's owner-only slot.
    #[error(
        "cpu {cpu} is already owned by thread {owner}: an owner-only slot has exactly one owner \
         until its `Owner` handle is dropped"
    )]
    AlreadyOwned {
        /// The CPU asked for.
        cpu: usize,
        /// The owning thread (its name, or its number in qpw's count).
        owner: String,
    },

    /// A thread that does not own a CPU's owner-only slot tried to reach it locally.
    #[error(
        "the calling thread does not own cpu {cpu}'s slot ({}): only its owner may reach it; \
         others queue work to it",
        match owner { Some(o) => format!("thread {o} does"), None => "it has no owner".to_string() }
    )]
    NotOwner {
        /// The CPU whose slot was asked for.
        cpu: usize,
        /// The owning thread, if any.
        owner: Option<String>,
    },

    /// The owner reached its slot while a guard of it was still alive (or had been leaked).
    #[error("cpu {cpu}'s owner-only slot is already borrowed by its owner")]
    AlreadyBorrowed {
        /// The CPU whose slot was asked for.
        cpu: usize,
    },

    /// A `remote:<cpu-list>` or `fenced:<cpu-list>` policy naming a CPU that the instance does
    /// not manage.
    #[error(
        "policy `{policy}` names cpu {cpu}, which is not in the managed set {managed}: list \
         only managed CPUs"
    )]
    PolicyCpuNotManaged {
        /// The policy as given.
        policy: String,
        /// The first CPU of its list that is not managed.
        cpu: usize,
        /// The CPUs the instance manages.
        managed: CpuSet,
    },

    /// `lock_local` (or another access to "the caller's CPU") from a thread that runs on a
    /// CPU the instance does not manage.
    #[error(
        "the calling thread runs on cpu {cpu}, which is not in the managed set {managed}: \
         bind it to a managed CPU with `Qpw::bind_current` first"
    )]
    CallerNotManaged {
        /// The CPU the caller runs on.
        cpu: usize,
        /// The CPUs the instance manages.
        managed: CpuSet,
    },

    /// `lock_local` from a thread whose CPU the instance cannot tell.
    #[error(
        "the calling thread's CPU is unknown to this instance of {managed}: bind it with \
         `Qpw::bind_current` first"
    )]
    Unbound {
        /// The CPUs the instance manages.
        managed: CpuSet,
    },

    /// Queued work that did not complete in time: the target CPU's worker did not get to run.
    #[error(
        "work queued on cpu {cpu} has not run after {waited:?} (timeout {timeout:?}): \
         the CPU's worker did not get the CPU (or, for owner-only state, its owner did not poll)"
    )]
    Stall {
        /// The CPU the work was queued on.
        cpu: usize,
        /// How long the flush waited.
        waited: Duration,
        /// The timeout the flush was given.
        timeout: Duration,
    },

    /// A remote-mode run under a drain's deadline ([`PerCpuWork::drain_all_timeout`]) that
    /// could not take the target CPU's lock before the deadline: another thread held it (or
    /// the caller itself, or the run, which had locked it already). The run gave up at
    /// [`PerCpu::lock_work`], which returned this error to it.
    ///
    /// [`PerCpuWork::drain_all_timeout`]: crate::PerCpuWork::drain_all_timeout
    /// [`PerCpu::lock_work`]: crate::PerCpu::lock_work
    #[error(
        "the remote run for cpu {cpu} gave up after waiting {waited:?} for the CPU's lock \
         (drain deadline {timeout:?}): a thread held it, possibly the caller itself"
    )]
    LockStall {
        /// The CPU whose lock was busy.
        cpu: usize,
        /// How long the drain had run when the run gave up.
        waited: Duration,
        /// The drain's timeout.
        timeout: Duration,
    },

    /// The calling thread already holds `cpu`'s lock of this per-CPU state and asked for it
    /// again: it would wait for itself for ever. Typically a remote run that takes
    /// [`PerCpu::lock`] of its own CPU inside [`PerCpu::lock_work`], or work that queues itself
    /// on its own CPU while it holds the lock (in remote and fenced mode the nested run happens
    /// at once, in the same thread). Detected in every build when the thread holds the lock
    /// through a requester's guard (`lock`, `try_lock`, `lock_work`, a walk) and asks through
    /// a requester's call; when the hold or the request is the owner's (`lock_local`,
    /// `try_lock_local`, `BoundSlot::lock`), only in debug builds (`debug_assertions`), where
    /// every guard records its thread, and a release build waits, as a `Mutex` would (the
    /// crate docs' "Lifecycle and failure" say why).
    ///
    /// [`PerCpu::lock`]: crate::PerCpu::lock
    /// [`PerCpu::lock_work`]: crate::PerCpu::lock_work
    #[error(
        "cpu {cpu}'s lock is already held by this thread (taken at {held_at}) and was asked for \
         again at {asked_at}: it would wait for itself (lock, lock_work or lock_local while a \
         guard of it is alive, or work queued on its own CPU from inside a run that holds it)"
    )]
    Reentrant {
        /// The CPU whose lock the thread holds and asked for again.
        cpu: usize,
        /// Where the thread took the lock it holds (the call of `lock`, `lock_work`,
        /// `lock_local` or `BoundSlot::lock` that made the live guard).
        held_at: &'static std::panic::Location<'static>,
        /// Where it asked for it again.
        asked_at: &'static std::panic::Location<'static>,
    },

    /// The calling thread already holds concurrency id `id`'s slot of a
    /// [`PerCid`](crate::PerCid) (through a guard, or a walk's closure) and asked for it again:
    /// it would wait for itself. Refused in every build.
    #[error(
        "concurrency id {id}'s slot is already held by this thread (taken at {held_at}) and was          asked for again at {asked_at}: it would wait for itself (lock_local or a walk while a          guard of it is alive, or from inside a walk's closure)"
    )]
    IdReentrant {
        /// The id whose slot the thread holds and asked for again.
        id: usize,
        /// Where the thread took the slot it holds.
        held_at: &'static std::panic::Location<'static>,
        /// Where it asked for it again.
        asked_at: &'static std::panic::Location<'static>,
    },

    /// A work item panicked while it ran: `runs` runs of it panicked since the last report,
    /// the first with `message`.
    #[error(
        "work on cpu {cpu} panicked: {message}{}",
        if *runs > 1 { format!(" ({runs} runs panicked since the last report; this is the first)") } else { String::new() }
    )]
    WorkPanicked {
        /// The CPU the work ran for.
        cpu: usize,
        /// The first panic's message.
        message: String,
        /// How many runs panicked (1 unless the item ran several times between two flushes).
        runs: usize,
    },

    /// A flush that would wait for the calling thread itself: the caller is the thread that
    /// runs `cpu`'s queue (its worker, running a work item, or the owner of owner-only state,
    /// polling), and the flush needs a run that is still waiting in that queue.
    #[error(
        "cannot flush work for cpu {cpu} from the thread that runs cpu {cpu}'s queue: it would \
         wait for itself (the work runs once the current item returns)"
    )]
    SelfFlush {
        /// The CPU whose queue the caller runs.
        cpu: usize,
    },

    /// Work queued after the instance began to shut down.
    #[error("work for cpu {cpu} refused: the instance is shutting down")]
    ShutDown {
        /// The CPU the work was meant for.
        cpu: usize,
    },

    /// A `SCHED_FIFO` priority outside 1-99.
    #[error("SCHED_FIFO priority {priority} is out of range: the legal range is 1-99")]
    PriorityOutOfRange {
        /// The priority given.
        priority: i32,
    },

    /// `SCHED_FIFO` refused by the system.
    #[error(
        "cannot set SCHED_FIFO priority {priority}: {source} (needs root, CAP_SYS_NICE or an \
         RLIMIT_RTPRIO of at least {priority})"
    )]
    SchedFifo {
        /// The priority asked for.
        priority: i32,
        /// The system's answer.
        source: OsError,
    },

    /// `sched_setaffinity` or `sched_getaffinity` failed.
    #[error("cannot set the CPU affinity to cpu {cpu}: {source}")]
    Affinity {
        /// The CPU asked for.
        cpu: usize,
        /// The system's answer.
        source: OsError,
    },

    /// A worker thread could not be started.
    #[error("cannot start the worker thread for cpu {cpu}: {source}")]
    Spawn {
        /// The worker's CPU.
        cpu: usize,
        /// The system's answer.
        source: OsError,
    },

    /// A sysfs file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Topology {
        /// The file.
        path: PathBuf,
        /// The system's answer.
        source: OsError,
    },

    /// A sysfs file whose contents do not parse.
    #[error("{}: {source}", path.display())]
    TopologySyntax {
        /// The file.
        path: PathBuf,
        /// Why it does not parse.
        source: Box<Error>,
    },
}

impl Error {
    /// Whether this is a stall: a drain or flush that did not complete in time, because a
    /// queue-mode worker (or an owner) did not run the work ([`Error::Stall`]) or a remote run
    /// could not take the CPU's lock ([`Error::LockStall`]).
    pub fn is_stall(&self) -> bool {
        matches!(self, Error::Stall { .. } | Error::LockStall { .. })
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error from the operating system, as [`Error`] holds it: a shared [`std::io::Error`]
/// that can be cloned and compared (by kind, OS error number and message).
#[derive(Clone)]
pub struct OsError(Arc<std::io::Error>);

impl OsError {
    /// The error as the standard library reports it.
    pub fn io(&self) -> &std::io::Error {
        &self.0
    }

    /// The OS error number (`errno`), if there is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        self.0.raw_os_error()
    }

    /// The error's kind.
    pub fn kind(&self) -> std::io::ErrorKind {
        self.0.kind()
    }
}

impl From<std::io::Error> for OsError {
    fn from(error: std::io::Error) -> Self {
        Self(Arc::new(error))
    }
}

impl PartialEq for OsError {
    fn eq(&self, other: &Self) -> bool {
        self.kind() == other.kind()
            && self.raw_os_error() == other.raw_os_error()
            && self.0.to_string() == other.0.to_string()
    }
}

impl fmt::Debug for OsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for OsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for OsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}
