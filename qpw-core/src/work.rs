//! Per-CPU work (`struct pw_struct`), the workers that run it in queue mode, and the drain-all
//! helper.
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
//! Remote mode runs the function in the caller, at once, and `queue_on` returns `true`.

use std::collections::VecDeque;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use crate::instance::{set_binding, Inner};
use crate::sync::{thread, Arc, AtomicBool, Condvar, Mutex, MutexGuard, Ordering, SharedFn};
use crate::{CpuSet, Error, Result, ShutdownReport};

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
}

impl WorkCtx {
    /// The CPU this run is for (`pw_get_cpu`): the worker's CPU in queue mode, the target CPU
    /// in remote mode (never the caller's).
    #[inline]
    pub fn cpu(&self) -> usize {
        self.cpu
    }

    /// Whether this run happens in the caller, on another CPU, under the target's lock.
    #[inline]
    pub fn is_remote(&self) -> bool {
        self.remote
    }
}

#[derive(Debug, Default)]
struct SlotState {
    pending: bool,
    queued: u64,
    done: u64,
    /// The message of a panic no flush has reported yet.
    panic: Option<String>,
}

/// One work item on one CPU.
pub(crate) struct WorkSlot {
    instance: u64,
    cpu: usize,
    func: SharedFn<WorkFn>,
    state: Mutex<SlotState>,
    done: Condvar,
}

impl WorkSlot {
    /// Runs the function once, catching a panic; returns the panic's message.
    fn run(&self, remote: bool) -> Result<(), String> {
        let ctx = WorkCtx {
            instance: self.instance,
            cpu: self.cpu,
            remote,
        };
        if remote {
            return catch_unwind(AssertUnwindSafe(|| (self.func)(&ctx))).map_err(|payload| {
                let message = panic_message(payload);
                lock(&self.state).panic = Some(message.clone());
                message
            });
        }

        let seq = {
            let mut state = lock(&self.state);
            state.pending = false;
            state.queued
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| (self.func)(&ctx)));
        let mut state = lock(&self.state);
        state.done = seq;
        let outcome = outcome.map_err(|payload| {
            let message = panic_message(payload);
            state.panic = Some(message.clone());
            message
        });
        drop(state);
        self.done.notify_all();
        outcome
    }

    /// Waits until every run queued so far has finished; `limit` is (start, timeout).
    fn flush(&self, limit: Option<(Instant, Duration)>) -> Result<()> {
        let mut state = lock(&self.state);
        let target = state.queued;
        while state.done < target {
            state = match limit {
                None => wait(&self.done, state),
                Some((start, timeout)) => {
                    let waited = start.elapsed();
                    let Some(left) = timeout.checked_sub(waited).filter(|d| !d.is_zero()) else {
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
        match state.panic.take() {
            Some(message) => Err(Error::WorkPanicked {
                cpu: self.cpu,
                message,
            }),
            None => Ok(()),
        }
    }
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Arc<WorkSlot>>,
    /// Slots registered with this worker: the most the queue can ever hold.
    registered: usize,
    stopped: bool,
}

/// A CPU's worker: a thread pinned to the CPU, named `qpw/<cpu>`, asleep on its condition
/// variable whenever its queue is empty (the kworker).
pub(crate) struct Worker {
    cpu: usize,
    /// The physical CPU the worker is pinned to.
    #[cfg_attr(not(loom), allow(dead_code))]
    phys: usize,
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Set by every post, cleared by [`run_pending`](Self::run_pending) before it looks at
    /// the queue: what an owner thread checks on its hot path to learn that work is waiting
    /// (a mailbox has no thread of its own).
    posted: AtomicBool,
}

impl Worker {
    /// A queue that no thread runs: an owner thread empties it with
    /// [`run_pending`](Self::run_pending) (the owner-only policy).
    pub(crate) fn mailbox(cpu: usize, phys: usize) -> Arc<Self> {
        Arc::new(Self {
            cpu,
            phys,
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            posted: AtomicBool::new(false),
        })
    }

    /// The flag every post sets after it pushed, so an item is never left behind unseen (at
    /// worst a poll finds nothing to do): what an owner checks on its hot path.
    pub(crate) fn posted_flag(&self) -> &AtomicBool {
        &self.posted
    }

    /// Runs every item queued so far, in the calling thread; returns how many ran. Items
    /// posted while it runs are run too. Panics are kept for the flushers, as a worker does.
    pub(crate) fn run_pending(&self) -> usize {
        let mut ran = 0;
        loop {
            self.posted.store(false, Ordering::Relaxed);
            // Order the clear before the look at the queue (a post pushes, then sets the flag:
            // either we see its item, or the flag stays set for the next poll).
            crate::sync::fence(Ordering::SeqCst);
            let Some(slot) = lock(&self.queue).items.pop_front() else {
                return ran;
            };
            let _ = slot.run(false);
            ran += 1;
        }
    }

    /// Refuses every post from now on ([`Error::ShutDown`]) and wakes the worker, which exits
    /// once its queue is empty; returns how many items wait in the queue.
    fn stop(&self) -> usize {
        let mut queue = lock(&self.queue);
        queue.stopped = true;
        let waiting = queue.items.len();
        drop(queue);
        self.wake.notify_all();
        waiting
    }

    fn register(&self) {
        let mut queue = lock(&self.queue);
        queue.registered += 1;
        let need = queue.registered - queue.items.len();
        queue.items.reserve(need);
    }

    /// Posts `slot`; `Ok(false)` when it was already pending.
    fn post(&self, slot: &Arc<WorkSlot>) -> Result<bool> {
        let mut queue = lock(&self.queue);
        if queue.stopped {
            return Err(Error::ShutDown { cpu: self.cpu });
        }
        {
            let mut state = lock(&slot.state);
            if state.pending {
                return Ok(false);
            }
            state.pending = true;
            state.queued += 1;
        }
        debug_assert!(queue.items.len() < queue.items.capacity());
        queue.items.push_back(slot.clone());
        drop(queue);
        self.posted.store(true, Ordering::Release);
        self.wake.notify_one();
        Ok(true)
    }

    fn run(&self, instance: u64) -> ShutdownReport {
        set_binding(Some((instance, self.cpu)));
        #[cfg(loom)]
        crate::rseq::mock::migrate_to(Some(self.phys));
        let mut report = ShutdownReport::default();
        loop {
            let (slot, stopping) = {
                let mut queue = lock(&self.queue);
                loop {
                    if let Some(slot) = queue.items.pop_front() {
                        break (slot, queue.stopped);
                    }
                    if queue.stopped {
                        return report;
                    }
                    queue = wait(&self.wake, queue);
                }
            };
            let outcome = slot.run(false);
            if stopping {
                report.ran += 1;
                if let Err(message) = outcome {
                    report.panicked.push((self.cpu, message));
                }
            }
        }
    }
}

#[derive(Default)]
struct PoolState {
    workers: Vec<Option<Arc<Worker>>>,
    threads: Vec<thread::JoinHandle<ShutdownReport>>,
    /// The owner-only policy's mailboxes, which no worker runs but a shutdown closes too.
    mailboxes: Vec<Arc<Worker>>,
    stopped: bool,
}

/// The workers of one instance, started on first use and stopped together.
pub(crate) struct WorkerPool {
    priority: Option<i32>,
    state: Mutex<PoolState>,
}

impl WorkerPool {
    pub(crate) fn new(priority: Option<i32>) -> Self {
        Self {
            priority,
            state: Mutex::new(PoolState::default()),
        }
    }

    /// The worker of slot `idx`, starting it (pinned to `phys`) if it has none yet.
    pub(crate) fn get(
        &self,
        instance: u64,
        idx: usize,
        cpu: usize,
        phys: usize,
        nr_slots: usize,
    ) -> Result<Arc<Worker>> {
        let mut pool = lock(&self.state);
        if pool.workers.len() < nr_slots {
            pool.workers.resize(nr_slots, None);
        }
        if let Some(worker) = &pool.workers[idx] {
            return Ok(worker.clone());
        }
        if pool.stopped {
            return Err(Error::ShutDown { cpu });
        }
        let worker = Arc::new(Worker {
            cpu,
            phys,
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            posted: AtomicBool::new(false),
        });
        let runner = worker.clone();
        let handle = thread::Builder::new()
            .name(format!("qpw/{cpu}"))
            .spawn(move || runner.run(instance))
            .map_err(|source| Error::Spawn { cpu, source })?;
        // Pin and set the priority from here, so that failures are ours to report; the thread
        // cannot have run any work yet, since none can be queued before we return.
        if let Err(e) = configure_worker(&handle, phys, self.priority) {
            lock(&worker.queue).stopped = true;
            worker.wake.notify_all();
            let _ = handle.join();
            return Err(e);
        }
        pool.workers[idx] = Some(worker.clone());
        pool.threads.push(handle);
        Ok(worker)
    }

    /// Makes a shutdown close `mailboxes` too (at once, if it has happened already).
    pub(crate) fn adopt_mailboxes(&self, mailboxes: impl IntoIterator<Item = Arc<Worker>>) {
        let mut pool = lock(&self.state);
        for mailbox in mailboxes {
            if pool.stopped {
                mailbox.stop();
            } else {
                pool.mailboxes.push(mailbox);
            }
        }
    }

    /// Stops every worker after its queue is empty, and joins it; closes every mailbox,
    /// leaving what waits in it to its owner's next poll.
    pub(crate) fn shutdown(&self) -> ShutdownReport {
        let (workers, threads, mailboxes) = {
            let mut pool = lock(&self.state);
            pool.stopped = true;
            (
                std::mem::take(&mut pool.workers),
                std::mem::take(&mut pool.threads),
                std::mem::take(&mut pool.mailboxes),
            )
        };
        for worker in workers.into_iter().flatten() {
            worker.stop();
        }
        let mut report = ShutdownReport::default();
        for mailbox in mailboxes {
            report.left_for_owners += mailbox.stop();
        }
        for handle in threads {
            if let Ok(part) = handle.join() {
                report.ran += part.ran;
                report.panicked.extend(part.panicked);
            }
        }
        report
    }
}

#[cfg(not(loom))]
fn configure_worker(
    handle: &thread::JoinHandle<ShutdownReport>,
    phys: usize,
    priority: Option<i32>,
) -> Result<()> {
    use std::os::unix::thread::JoinHandleExt;
    let thread = handle.as_pthread_t();
    crate::affinity::pin_thread(thread, phys)?;
    if let Some(priority) = priority {
        crate::affinity::set_thread_fifo(thread, priority)?;
    }
    Ok(())
}

#[cfg(loom)]
fn configure_worker(
    _handle: &thread::JoinHandle<ShutdownReport>,
    _phys: usize,
    _priority: Option<i32>,
) -> Result<()> {
    Ok(())
}

/// A per-CPU work item: the kernel's per-CPU `struct pw_struct`, one slot per managed CPU,
/// made by [`Qpw::work`](crate::Qpw::work) or [`Qpw::work_on_cpu`](crate::Qpw::work_on_cpu).
///
/// ```
/// use std::sync::Arc;
/// use qpw_core::{CpuSpec, Policy, Qpw};
///
/// let qpw = Qpw::builder().cpus(CpuSpec::Logical(2)).policy(Policy::Queue).build()?;
/// let stock = Arc::new(qpw.per_cpu(|_| 7u32));
/// let drained = stock.clone();
/// let drain = qpw.work(move |ctx| *drained.lock_work(ctx) = 0)?;
///
/// assert!(drain.queue_on(1)?); // queue mode: posted to cpu 1's worker
/// drain.flush(1)?; // ... and waited for
/// let mut left = Vec::new();
/// stock.for_each_locked(|cpu, n| left.push((cpu, *n)));
/// assert_eq!(left, [(0, 7), (1, 0)]);
/// # Ok::<(), qpw_core::Error>(())
/// ```
pub struct PerCpuWork {
    inner: Arc<Inner>,
    slots: Box<[Arc<WorkSlot>]>,
    /// The worker each CPU's runs are posted to; `None` where they run in the caller.
    workers: Box<[Option<Arc<Worker>>]>,
    on_cpu: bool,
}

impl fmt::Debug for PerCpuWork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerCpuWork")
            .field("cpus", &self.inner.managed)
            .field("on_cpu", &self.on_cpu)
            .finish_non_exhaustive()
    }
}

impl PerCpuWork {
    pub(crate) fn new(inner: Arc<Inner>, func: SharedFn<WorkFn>, on_cpu: bool) -> Result<Self> {
        let mut slots = Vec::with_capacity(inner.managed.len());
        let mut workers = Vec::with_capacity(inner.managed.len());
        for (idx, cpu) in inner.managed.iter().enumerate() {
            let queued = on_cpu || inner.modes[idx] == crate::Mode::Queue;
            let worker = if queued {
                let worker = inner.worker(idx)?;
                worker.register();
                Some(worker)
            } else {
                None
            };
            slots.push(Arc::new(WorkSlot {
                instance: inner.id,
                cpu,
                func: func.clone(),
                state: Mutex::new(SlotState::default()),
                done: Condvar::new(),
            }));
            workers.push(worker);
        }
        Ok(Self {
            inner,
            slots: slots.into(),
            workers: workers.into(),
            on_cpu,
        })
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
            .map(|cpu| {
                Arc::new(WorkSlot {
                    instance: inner.id,
                    cpu,
                    func: func.clone(),
                    state: Mutex::new(SlotState::default()),
                    done: Condvar::new(),
                })
            })
            .collect();
        let workers = mailboxes
            .iter()
            .map(|mailbox| {
                mailbox.register();
                Some(mailbox.clone())
            })
            .collect();
        Self {
            inner,
            slots,
            workers,
            on_cpu: true,
        }
    }

    /// Whether this item must run on its CPU and so is queued in every mode.
    pub fn is_on_cpu(&self) -> bool {
        self.on_cpu
    }

    /// Whether runs for `cpu` go to its worker (`true`) or happen in the caller (`false`).
    pub fn is_queued(&self, cpu: usize) -> Result<bool> {
        Ok(self.workers[self.inner.idx(cpu)?].is_some())
    }

    /// Runs the work for `cpu` (`pw_queue_on`): in queue mode posts it to the CPU's worker and
    /// returns `false` if it was already pending there; in remote mode runs it now, in the
    /// caller, and returns `true` once it has run. Allocates nothing.
    #[inline]
    pub fn queue_on(&self, cpu: usize) -> Result<bool> {
        let idx = self.inner.idx(cpu)?;
        match &self.workers[idx] {
            Some(worker) => worker.post(&self.slots[idx]),
            None => {
                // A panic is kept for the next flush to report, like a queued one.
                let _ = self.slots[idx].run(true);
                Ok(true)
            }
        }
    }

    /// Waits until every run queued for `cpu` so far has finished (`pw_flush`); a no-op for
    /// runs done remotely. Reports a panic of any run not reported yet.
    pub fn flush(&self, cpu: usize) -> Result<()> {
        self.slots[self.inner.idx(cpu)?].flush(None)
    }

    /// Like [`flush`](Self::flush), but gives up after `timeout` with [`Error::Stall`], naming
    /// the CPU and the time waited: what a requester sees when the target's worker cannot get
    /// the CPU (a `SCHED_FIFO` task that never yields).
    pub fn flush_timeout(&self, cpu: usize, timeout: Duration) -> Result<()> {
        self.slots[self.inner.idx(cpu)?].flush(Some((Instant::now(), timeout)))
    }

    /// Runs the work on every CPU for which `needs(cpu)` is true, then flushes each: the shape
    /// of `lru_add_drain_all`, `drain_all_stock` and `flush_all`. Never gives up.
    pub fn drain_all(&self, needs: impl FnMut(usize) -> bool) -> DrainReport {
        self.drain(needs, None)
    }

    /// Like [`drain_all`](Self::drain_all), with one deadline for the whole drain: CPUs whose
    /// work has not finished by then are reported as [`Error::Stall`].
    pub fn drain_all_timeout(
        &self,
        needs: impl FnMut(usize) -> bool,
        timeout: Duration,
    ) -> DrainReport {
        self.drain(needs, Some((Instant::now(), timeout)))
    }

    fn drain(
        &self,
        mut needs: impl FnMut(usize) -> bool,
        limit: Option<(Instant, Duration)>,
    ) -> DrainReport {
        let mut report = DrainReport::default();
        let mut touched = Vec::new();
        for (idx, cpu) in self.inner.managed.iter().enumerate() {
            if !needs(cpu) {
                report.skipped.insert(cpu);
                continue;
            }
            let outcome = match &self.workers[idx] {
                Some(worker) => worker.post(&self.slots[idx]).map(|_| true),
                None => {
                    let _ = self.slots[idx].run(true);
                    Ok(false)
                }
            };
            match outcome {
                Ok(true) => {
                    report.queued.insert(cpu);
                    touched.push(idx);
                }
                Ok(false) => {
                    report.ran_remote.insert(cpu);
                    touched.push(idx);
                }
                Err(e) => report.errors.push(e),
            }
        }
        for idx in touched {
            if let Err(e) = self.slots[idx].flush(limit) {
                report.errors.push(e);
            }
        }
        report
    }
}

/// What a [`PerCpuWork::drain_all`] did, CPU by CPU.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct DrainReport {
    /// CPUs whose work was posted to their worker (and flushed).
    pub queued: CpuSet,
    /// CPUs whose work ran in the caller, under their lock.
    pub ran_remote: CpuSet,
    /// CPUs that did not need the work.
    pub skipped: CpuSet,
    /// What went wrong: stalls, panics, refusals; at most one per CPU.
    pub errors: Vec<Error>,
}

impl DrainReport {
    /// Whether every CPU that needed the work got it done.
    pub fn is_complete(&self) -> bool {
        self.errors.is_empty()
    }

    /// The report, or its first error.
    pub fn into_result(mut self) -> Result<Self> {
        if self.errors.is_empty() {
            Ok(self)
        } else {
            Err(self.errors.swap_remove(0))
        }
    }
}
