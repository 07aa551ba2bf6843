//! Per-CPU work (`struct pw_struct`): the work item, its slot on each CPU, and how a run is
//! queued, run and flushed. The workers that run it in queue mode (and the owners' mailboxes)
//! are in `work/worker.rs`, the drain-all helper and its report in `work/drain.rs`.
//!
//! # The protocol
//!
//! Each work item has one [`WorkSlot`] per CPU, made when the item is made, so queuing
//! allocates nothing. A slot's state is `{pending, queued, done}` under the slot's mutex:
//!
//! - **queue** (queue mode): under the worker's queue lock, refuse if the worker is stopping;
//!   then under the slot lock, return `false` if `pending` (coalesced, as `queue_work_on` does);
//!   else set `pending`, bump `queued`, and push the slot onto the worker's queue, whose capacity
//!   was reserved for every slot registered with it (a slot is on the queue at most once, so the
//!   push never allocates); then wake the worker.
//! - **run** (the worker): pop a slot; under the slot lock clear `pending` and note
//!   `seq = queued`; run the function with no lock of ours held; under the slot lock set
//!   `done = seq`, record a panic if there was one, and wake the flushers. A re-queue while the
//!   function runs sets `pending` again and so runs it once more, as the kernel clears
//!   `WORK_STRUCT_PENDING` before calling the function.
//! - **flush**: under the slot lock note `target = queued` and sleep until `done >= target`: it
//!   returns only after every run queued before it has finished. In remote mode `queued` never
//!   moves, so the flush returns at once (the kernel's `pw_flush` is a no-op there).
//!
//! Remote mode runs the function in the caller, at once, through the instance's
//! [`RunGate`](crate::gate::RunGate) (so that a shutdown refuses it, or waits for it), and
//! `queue_on` returns `true`, or the run's panic.
//!
//! # Panics: reported once, to the call they belong to
//!
//! A remote run's panic is returned by the call that ran it (`queue_on`, or the `drain_all`
//! report). A queued run's panic is kept in its slot, counted, and reported by the first flush
//! that covers the run (`flush`, `flush_timeout`, or a `drain_all` of that CPU), then
//! forgotten. A run that panics while [`Qpw::shutdown`](crate::Qpw::shutdown) waits for its
//! worker, with no flush waiting for the run, is reported in the
//! [`ShutdownReport`](crate::ShutdownReport) instead (a drop of the last handle reports
//! nothing, so there the panic waits for a flush as usual). A panic still unreported when the
//! item is dropped is printed to stderr. So every panic is reported exactly once.

mod drain;
mod worker;

use std::cell::Cell;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use crate::instance::Inner;
use crate::sync::{Arc, Condvar, Mutex, MutexGuard, SharedFn};
use crate::{Error, Result};
pub use drain::DrainReport;
pub(crate) use worker::{RunnerScope, Worker, WorkerPool};

pub(crate) type WorkFn = dyn Fn(&WorkCtx) + Send + Sync;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Our critical sections never run user code, so a poisoned lock still guards consistent
    // state: take it anyway.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn wait<'a, T>(cond: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cond.wait(guard).unwrap_or_else(|e| e.into_inner())
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<&'static str>() {
        Ok(s) => s.to_string(),
        Err(payload) => match payload.downcast::<String>() {
            Ok(s) => *s,
            Err(_) => "(a panic payload that is not a string)".to_string(),
        },
    }
}

/// What a running work item knows about itself.
#[derive(Debug)]
pub struct WorkCtx {
    pub(crate) instance: u64,
    cpu: usize,
    remote: bool,
    queued: bool,
    /// The drain's (start, timeout), for a remote run under
    /// [`PerCpuWork::drain_all_timeout`]: [`PerCpu::lock_work`](crate::PerCpu::lock_work)
    /// waits for the lock until then.
    limit: Option<(Instant, Duration)>,
    /// Set by `lock_work` when it gave up at the deadline: how long the drain had run.
    stalled: Cell<Option<Duration>>,
    /// Set by `lock_work` when the thread already held the lock ([`Error::Reentrant`]).
    reentered: std::cell::RefCell<Option<Error>>,
}

impl WorkCtx {
    fn new(
        instance: u64,
        cpu: usize,
        queued: bool,
        remote: bool,
        limit: Option<(Instant, Duration)>,
    ) -> Self {
        Self {
            instance,
            cpu,
            remote,
            queued,
            limit,
            stalled: Cell::new(None),
            reentered: std::cell::RefCell::new(None),
        }
    }

    /// The CPU this run is for (`pw_get_cpu`): the worker's CPU in queue mode, the target CPU
    /// in remote mode (never the caller's).
    #[inline]
    pub fn cpu(&self) -> usize {
        self.cpu
    }

    /// Whether this run happens on a thread that does not belong to its CPU: a remote-mode
    /// run in a caller that is not one of [`cpu`](Self::cpu)'s threads. The kernel's
    /// `pw_is_cpu_remote(pw_get_cpu(w))`, and the same answer as
    /// [`Qpw::is_cpu_remote`](crate::Qpw::is_cpu_remote) gives for this CPU in the same thread
    /// at the start of the run: a remote-mode run in a thread bound to the target CPU is not
    /// remote, and a queued run (on the CPU's worker or owner) never is.
    #[inline]
    pub fn is_remote(&self) -> bool {
        self.remote
    }

    /// Whether this run was posted to the CPU's queue and is run by its worker (or, for
    /// owner-only state, its owner), rather than run at once in the caller of `queue_on` or
    /// `drain_all` (remote mode). Unlike [`is_remote`](Self::is_remote), it does not depend on
    /// where the caller runs.
    #[inline]
    pub fn is_queued(&self) -> bool {
        self.queued
    }

    /// When the run must give up waiting for a lock, if it runs under a drain's deadline.
    pub(crate) fn deadline(&self) -> Option<(Instant, Duration)> {
        self.limit
    }

    /// Records that a lock wait gave up at the deadline, after the drain had run `waited`.
    pub(crate) fn note_stall(&self, waited: Duration) {
        self.stalled.set(Some(waited));
    }

    /// Records that `lock_work` found the lock already held by this thread.
    pub(crate) fn note_reentry(&self, error: Error) {
        *self.reentered.borrow_mut() = Some(error);
    }
}

#[derive(Debug, Default)]
struct SlotState {
    pending: bool,
    queued: u64,
    done: u64,
    /// Threads inside `flush` for this slot.
    flushers: usize,
    /// The first message and the number of the panics no flush has reported yet.
    panic: Option<(String, usize)>,
}

/// One work item on one CPU.
pub(crate) struct WorkSlot {
    instance: u64,
    cpu: usize,
    func: SharedFn<WorkFn>,
    state: Mutex<SlotState>,
    done: Condvar,
}

/// Where a queued run's panic goes, when no flush is waiting for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unclaimed {
    /// Kept for the next flush.
    Keep,
    /// Returned, for the shutdown report.
    Return,
}

impl WorkSlot {
    fn new(inner: &Inner, cpu: usize, func: &SharedFn<WorkFn>) -> Arc<Self> {
        Arc::new(WorkSlot {
            instance: inner.id,
            cpu,
            func: func.clone(),
            state: Mutex::new(SlotState::default()),
            done: Condvar::new(),
        })
    }

    /// Runs the function once for its queue (a worker or an owner's poll), catching a panic.
    /// Returns the panic's message if it panicked and `unclaimed` says to return it (a
    /// shutdown, with no flush waiting); otherwise the panic is kept for the flushes.
    fn run_queued(&self, unclaimed: Unclaimed) -> Option<String> {
        let ctx = WorkCtx::new(self.instance, self.cpu, true, false, None);
        let seq = {
            let mut state = lock(&self.state);
            state.pending = false;
            state.queued
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| (self.func)(&ctx)));
        let mut state = lock(&self.state);
        state.done = seq;
        let returned = match outcome {
            Ok(()) => None,
            Err(payload) => {
                let message = panic_message(payload);
                if unclaimed == Unclaimed::Return && state.flushers == 0 {
                    Some(message)
                } else {
                    match &mut state.panic {
                        Some((_, runs)) => *runs += 1,
                        none => *none = Some((message, 1)),
                    }
                    None
                }
            }
        };
        drop(state);
        self.done.notify_all();
        returned
    }

    /// Runs the function now, in the caller (remote mode), catching a panic, which it returns
    /// as the call's error; as is a lock wait that gave up at the deadline.
    fn run_here(&self, remote: bool, limit: Option<(Instant, Duration)>) -> Result<()> {
        let ctx = WorkCtx::new(self.instance, self.cpu, false, remote, limit);
        match catch_unwind(AssertUnwindSafe(|| (self.func)(&ctx))) {
            Err(payload) => Err(Error::WorkPanicked {
                cpu: self.cpu,
                message: panic_message(payload),
                runs: 1,
            }),
            Ok(()) => match (ctx.reentered.borrow_mut().take(), ctx.stalled.get(), limit) {
                (Some(reentry), _, _) => Err(reentry),
                (None, Some(waited), Some((_, timeout))) => Err(Error::LockStall {
                    cpu: self.cpu,
                    waited,
                    timeout,
                }),
                _ => Ok(()),
            },
        }
    }

    /// Waits until every run queued so far has finished; `limit` is (start, timeout).
    /// `runs_queue` says whether the caller is the thread that runs this slot's queue, which
    /// must not wait for a run still in it.
    fn flush(&self, limit: Option<(Instant, Duration)>, runs_queue: bool) -> Result<()> {
        let mut state = lock(&self.state);
        let target = state.queued;
        if state.done < target && runs_queue {
            return Err(Error::SelfFlush { cpu: self.cpu });
        }
        state.flushers += 1;
        while state.done < target {
            state = match limit {
                None => wait(&self.done, state),
                Some((start, timeout)) => {
                    let waited = start.elapsed();
                    let Some(left) = timeout.checked_sub(waited).filter(|d| !d.is_zero()) else {
                        state.flushers -= 1;
                        return Err(Error::Stall {
                            cpu: self.cpu,
                            waited,
                            timeout,
                        });
                    };
                    let (guard, _) = self
                        .done
                        .wait_timeout(state, left)
                        .unwrap_or_else(|e| e.into_inner());
                    guard
                }
            };
        }
        state.flushers -= 1;
        match state.panic.take() {
            Some((message, runs)) => Err(Error::WorkPanicked {
                cpu: self.cpu,
                message,
                runs,
            }),
            None => Ok(()),
        }
    }
}

/// A per-CPU work item: the kernel's per-CPU `struct pw_struct`, one slot per managed CPU,
/// made by [`Qpw::work`](crate::Qpw::work) or [`Qpw::work_on_cpu`](crate::Qpw::work_on_cpu).
/// A handle: clones are cheap and share the item.
///
/// ```
/// use qpw_core::{CpuSpec, Policy, Qpw};
///
/// let qpw = Qpw::builder().cpus(CpuSpec::Logical(2)).policy(Policy::Queue).build()?;
/// let stock = qpw.per_cpu(|_| 7u32);
/// let drained = stock.clone();
/// let drain = qpw.work(move |ctx| {
///     if let Ok(mut n) = drained.lock_work(ctx) {
///         *n = 0;
///     }
/// })?;
///
/// assert!(drain.queue_on(1)?); // queue mode: posted to cpu 1's worker
/// drain.flush(1)?; // ... and waited for
/// let mut left = Vec::new();
/// stock.for_each_locked(|cpu, n| left.push((cpu, *n)));
/// assert_eq!(left, [(0, 7), (1, 0)]);
/// # Ok::<(), qpw_core::Error>(())
/// ```
///
/// Dropping the last handle does not cancel runs already queued: they run, and a panic of theirs
/// that no flush collected is printed to stderr.
#[derive(Clone)]
pub struct PerCpuWork {
    shared: Arc<Shared>,
}

/// What the handles of one item share.
struct Shared {
    inner: Arc<Inner>,
    slots: Box<[Arc<WorkSlot>]>,
    /// The queue each CPU's runs are posted to (its worker, or its owner's mailbox); `None`
    /// where they run in the caller.
    workers: Box<[Option<Arc<Worker>>]>,
    on_cpu: bool,
}

impl Drop for Shared {
    fn drop(&mut self) {
        for worker in self.workers.iter().flatten() {
            worker.unregister();
        }
        for slot in self.slots.iter() {
            if let Some((message, runs)) = lock(&slot.state).panic.take() {
                eprintln!(
                    "qpw: a work item dropped with {runs} unreported panic(s) on cpu {}, the \
                     first: {message}",
                    slot.cpu
                );
            }
        }
    }
}

impl fmt::Debug for PerCpuWork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerCpuWork")
            .field("cpus", &self.shared.inner.managed)
            .field("on_cpu", &self.shared.on_cpu)
            .finish_non_exhaustive()
    }
}

impl PerCpuWork {
    pub(crate) fn new(inner: Arc<Inner>, func: SharedFn<WorkFn>, on_cpu: bool) -> Result<Self> {
        let mut slots = Vec::with_capacity(inner.managed.len());
        let mut workers: Vec<Option<Arc<Worker>>> = Vec::with_capacity(inner.managed.len());
        for (idx, cpu) in inner.managed.iter().enumerate() {
            let queued = on_cpu || inner.modes[idx] == crate::Mode::Queue;
            let worker = if queued {
                match inner.worker(idx) {
                    Ok(worker) => Some(worker),
                    Err(e) => {
                        // Give back what the earlier CPUs reserved.
                        for worker in workers.iter().flatten() {
                            worker.unregister();
                        }
                        return Err(e);
                    }
                }
            } else {
                None
            };
            if let Some(worker) = &worker {
                worker.register();
            }
            slots.push(WorkSlot::new(&inner, cpu, &func));
            workers.push(worker);
        }
        Ok(Self::from_parts(inner, slots, workers, on_cpu))
    }

    /// An item whose runs are posted to the given mailboxes, one per managed CPU, which their
    /// owner threads empty when they poll (the owner-only policy).
    pub(crate) fn with_mailboxes(
        inner: Arc<Inner>,
        func: SharedFn<WorkFn>,
        mailboxes: &[Arc<Worker>],
    ) -> Self {
        let slots = inner
            .managed
            .iter()
            .map(|cpu| WorkSlot::new(&inner, cpu, &func))
            .collect();
        let workers = mailboxes
            .iter()
            .map(|mailbox| {
                mailbox.register();
                Some(mailbox.clone())
            })
            .collect();
        Self::from_parts(inner, slots, workers, true)
    }

    fn from_parts(
        inner: Arc<Inner>,
        slots: Vec<Arc<WorkSlot>>,
        workers: Vec<Option<Arc<Worker>>>,
        on_cpu: bool,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                inner,
                slots: slots.into(),
                workers: workers.into(),
                on_cpu,
            }),
        }
    }

    /// Whether this item must run on its CPU and so is queued in every mode.
    pub fn is_on_cpu(&self) -> bool {
        self.shared.on_cpu
    }

    /// Whether runs for `cpu` go to its worker (`true`) or happen in the caller (`false`).
    pub fn is_queued(&self, cpu: usize) -> Result<bool> {
        Ok(self.shared.workers[self.shared.inner.idx(cpu)?].is_some())
    }

    /// Runs the work for `cpu` (`pw_queue_on`).
    ///
    /// - In queue mode (and for [on-CPU](Self::is_on_cpu) items), posts it to the CPU's
    ///   worker and returns `Ok(false)` if it was already pending there (coalesced). A panic
    ///   of the run is reported by the flush that waits for it.
    /// - In remote mode, runs it now, in the caller, and returns `Ok(true)` once it has run,
    ///   or [`Error::WorkPanicked`] if it panicked: the panic is this call's, and no later
    ///   flush or drain reports it again.
    ///
    /// [`Error::ShutDown`] once the instance has begun to shut down, in every mode. Allocates
    /// nothing.
    ///
    /// A remote run takes the target CPU's lock in the caller, with no deadline. If the caller
    /// (or the run itself, a second time) already holds that lock through a requester's guard
    /// (`lock`, `try_lock`, `lock_work`, a walk), the run's `lock_work` is refused and this
    /// call returns [`Error::Reentrant`], in every build; through the owner's guard
    /// (`lock_local`, `BoundSlot::lock`) that happens in debug builds only, and a release
    /// build waits for itself, as with a `Mutex`:
    /// [`drain_all_timeout`](Self::drain_all_timeout) bounds that wait.
    #[inline]
    pub fn queue_on(&self, cpu: usize) -> Result<bool> {
        let shared = &*self.shared;
        let idx = shared.inner.idx(cpu)?;
        match &shared.workers[idx] {
            Some(worker) => worker.post(&shared.slots[idx]),
            None => self.run_remote(idx, cpu, None).map(|()| true),
        }
    }

    /// A remote run of slot `idx`, through the instance's gate.
    fn run_remote(&self, idx: usize, cpu: usize, limit: Option<(Instant, Duration)>) -> Result<()> {
        let inner = &*self.shared.inner;
        let Some(_pass) = inner.gate.enter() else {
            return Err(Error::ShutDown { cpu });
        };
        let remote = inner.current_cpu() != Some(cpu);
        self.shared.slots[idx].run_here(remote, limit)
    }

    /// Waits until every run queued for `cpu` so far has finished (`pw_flush`); a no-op for
    /// runs done remotely. Reports the panics of the runs it covers that no earlier flush
    /// reported ([`Error::WorkPanicked`], with how many). [`Error::SelfFlush`] when the caller
    /// is the thread that runs `cpu`'s queue (a work item on `cpu`'s worker, or an owner
    /// polling) and a run it would wait for is still in that queue: it would wait for itself.
    pub fn flush(&self, cpu: usize) -> Result<()> {
        self.flush_idx(self.shared.inner.idx(cpu)?, None)
    }

    /// Like [`flush`](Self::flush), but gives up after `timeout` with [`Error::Stall`], naming
    /// the CPU and the time waited: what a requester sees when the target's worker cannot get
    /// the CPU (a `SCHED_FIFO` task that never yields).
    pub fn flush_timeout(&self, cpu: usize, timeout: Duration) -> Result<()> {
        let idx = self.shared.inner.idx(cpu)?;
        self.flush_idx(idx, Some((Instant::now(), timeout)))
    }

    fn flush_idx(&self, idx: usize, limit: Option<(Instant, Duration)>) -> Result<()> {
        let shared = &*self.shared;
        let runs_queue = shared.workers[idx]
            .as_ref()
            .is_some_and(|worker| worker.run_by_caller());
        shared.slots[idx].flush(limit, runs_queue)
    }
}
