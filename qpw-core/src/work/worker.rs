//! Where queued runs go: a CPU's [`Worker`], its queue and, in queue mode, the thread that runs
//! it (the kworker); an owner-only slot's mailbox is the same queue with no thread of its own,
//! run by the owner when it polls. The [`WorkerPool`] starts an instance's workers on first use
//! and stops them together.
//!
//! # Memory
//!
//! An item reserves one place in the queue of each worker it posts to, so that posting never
//! allocates, and gives it back when its last handle is dropped (the queue shrinks when it has
//! far more room than its items need).

use std::collections::VecDeque;

use super::{lock, wait, Unclaimed, WorkSlot};
use crate::instance::{set_binding, Registration};
use crate::sync::{thread, thread_token, Arc, AtomicBool, Condvar, Mutex, Ordering, NO_THREAD};
use crate::{Error, Result, ShutdownReport};

#[derive(Default)]
struct Queue {
    items: VecDeque<Arc<WorkSlot>>,
    /// Slots of live items registered with this queue. The queue also holds slots of items
    /// dropped while queued, so its capacity is kept at `registered + items.len()` at least:
    /// every live slot can be pushed without an allocation.
    registered: usize,
    stopped: bool,
}

/// A CPU's worker: a thread pinned to the CPU, named `qpw/<cpu>`, asleep on its condition
/// variable whenever its queue is empty (the kworker). Also an owner-only slot's mailbox: the
/// same queue, run by the owner thread when it polls.
pub(crate) struct Worker {
    cpu: usize,
    /// The CPU's slot index in its instance.
    idx: usize,
    /// The physical CPU the worker is pinned to.
    #[cfg_attr(not(loom), allow(dead_code))]
    phys: usize,
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Set by every post, cleared by [`run_pending`](Self::run_pending) before it looks at
    /// the queue: what an owner thread checks on its hot path to learn that work is waiting
    /// (a mailbox has no thread of its own).
    posted: AtomicBool,
    /// The [`thread_token`] of the thread that runs this queue: the worker thread, or a
    /// mailbox's owner while it has one. Only that thread ever stores its own token here, so
    /// a relaxed load that finds the caller's token was stored by the caller.
    runner: std::sync::atomic::AtomicU64,
    /// Set when the shutdown that stops this worker will not join it (the last handle was
    /// dropped, or the shutdown runs on this very worker): no report will carry the panics of
    /// its last runs, so it keeps them for the items' flushes as usual.
    detached: std::sync::atomic::AtomicBool,
}

impl Worker {
    fn new(cpu: usize, idx: usize, phys: usize) -> Self {
        Self {
            cpu,
            idx,
            phys,
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            posted: AtomicBool::new(false),
            runner: std::sync::atomic::AtomicU64::new(NO_THREAD),
            detached: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A queue that no thread runs: an owner thread empties it with
    /// [`run_pending`](Self::run_pending) (the owner-only policy). With no thread of its
    /// own, it never registers one, so its slot index is never read.
    pub(crate) fn mailbox(cpu: usize, phys: usize) -> Arc<Self> {
        Arc::new(Self::new(cpu, usize::MAX, phys))
    }

    /// The flag every post sets after it pushed, so an item is never left behind unseen (at
    /// worst a poll finds nothing to do): what an owner checks on its hot path.
    pub(crate) fn posted_flag(&self) -> &AtomicBool {
        &self.posted
    }

    /// Records the thread with `token` as the one that runs this queue.
    fn set_runner(&self, token: u64) {
        self.runner
            .store(token, std::sync::atomic::Ordering::Relaxed);
    }

    /// Makes the calling thread, whose token is `token`, the one that runs `mailbox`, until
    /// the returned scope ends (a new owner).
    pub(crate) fn runner_scope(mailbox: &Arc<Self>, token: u64) -> RunnerScope {
        mailbox.set_runner(token);
        RunnerScope {
            mailbox: mailbox.clone(),
        }
    }

    /// Whether the calling thread is the one that runs this queue.
    pub(super) fn run_by_caller(&self) -> bool {
        self.runner.load(std::sync::atomic::Ordering::Relaxed) == thread_token()
    }

    /// Runs every item queued so far, in the calling thread; returns how many ran. Items
    /// posted while it runs are run too. Panics are kept for the flushers.
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
            slot.run_queued(Unclaimed::Keep);
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

    /// Reserves room for one more slot.
    pub(super) fn register(&self) {
        let mut queue = lock(&self.queue);
        queue.registered += 1;
        let need = queue.registered;
        // Capacity >= len + registered >= registered + (slots of dropped items still queued).
        queue.items.reserve(need);
    }

    /// Gives back the room of a slot whose item was dropped, shrinking the queue when it has
    /// far more room than it can ever need.
    pub(super) fn unregister(&self) {
        let mut queue = lock(&self.queue);
        queue.registered -= 1;
        let keep = queue.registered + queue.items.len();
        if queue.items.capacity() > 2 * keep + 16 {
            queue.items.shrink_to(keep);
        }
    }

    /// Posts `slot`; `Ok(false)` when it was already pending.
    pub(super) fn post(&self, slot: &Arc<WorkSlot>) -> Result<bool> {
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
        set_binding(Some(Registration {
            instance,
            cpu: self.cpu,
            idx: self.idx,
        }));
        self.set_runner(thread_token());
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
            // A shutdown that will read the report takes the panics no flush waits for.
            let reported = stopping && !self.detached.load(std::sync::atomic::Ordering::Acquire);
            if stopping {
                report.ran += 1;
            }
            let unclaimed = if reported {
                Unclaimed::Return
            } else {
                Unclaimed::Keep
            };
            if let Some(message) = slot.run_queued(unclaimed) {
                report.panicked.push((self.cpu, message));
            }
        }
    }
}

/// A mailbox's runner for as long as an owner holds it; see [`Worker::runner_scope`].
pub(crate) struct RunnerScope {
    mailbox: Arc<Worker>,
}

impl RunnerScope {
    /// The owner lets go: nobody runs the mailbox until the next claim.
    pub(crate) fn end(&self) {
        self.mailbox.set_runner(NO_THREAD);
    }
}

#[derive(Default)]
struct PoolState {
    workers: Vec<Option<Arc<Worker>>>,
    threads: Vec<(Arc<Worker>, thread::JoinHandle<ShutdownReport>)>,
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
        let worker = Arc::new(Worker::new(cpu, idx, phys));
        let runner = worker.clone();
        // The thread's id, for the pin hook (a cgroup v2 partition takes threads by id). Not
        // under loom, which pins nothing and whose threads must not block outside its model.
        #[cfg(not(loom))]
        let (tid_tx, tid_rx) = std::sync::mpsc::sync_channel(1);
        let handle = thread::Builder::new()
            .name(format!("qpw/{cpu}"))
            .spawn(move || {
                #[cfg(not(loom))]
                // SAFETY: `gettid` has no preconditions and cannot fail.
                let _ = tid_tx.send(unsafe { libc::gettid() });
                runner.run(instance)
            })
            .map_err(|source| Error::Spawn {
                cpu,
                source: source.into(),
            })?;
        #[cfg(not(loom))]
        let tid = tid_rx.recv().unwrap_or(0);
        #[cfg(loom)]
        let tid = 0;
        // Pin and set the priority from here, so that failures are ours to report; the thread
        // cannot have run any work yet, since none can be queued before we return.
        if let Err(e) = configure_worker(&handle, tid, phys, self.priority) {
            lock(&worker.queue).stopped = true;
            worker.wake.notify_all();
            let _ = handle.join();
            return Err(e);
        }
        pool.workers[idx] = Some(worker.clone());
        pool.threads.push((worker.clone(), handle));
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

    /// Stops every worker, which exits once its queue is empty, and closes every mailbox,
    /// leaving what waits in it to its owner's next poll. With `join`, waits for the workers
    /// to exit and reports what they ran, except the calling thread's own worker if it is one
    /// (it cannot wait for itself: it finishes its queue after the current item returns);
    /// without, leaves them to finish on their own. A second call finds nothing to stop.
    pub(crate) fn shutdown(&self, join: bool) -> ShutdownReport {
        let (workers, threads, mailboxes) = {
            let mut pool = lock(&self.state);
            pool.stopped = true;
            (
                std::mem::take(&mut pool.workers),
                std::mem::take(&mut pool.threads),
                std::mem::take(&mut pool.mailboxes),
            )
        };
        for (worker, _) in &threads {
            if !join || worker.run_by_caller() {
                worker
                    .detached
                    .store(true, std::sync::atomic::Ordering::Release);
            }
        }
        for worker in workers.into_iter().flatten() {
            worker.stop();
        }
        let mut report = ShutdownReport::default();
        for mailbox in mailboxes {
            report.left_for_owners += mailbox.stop();
        }
        for (worker, handle) in threads {
            if !join || worker.run_by_caller() {
                continue; // detached: dropping the handle lets the thread finish alone
            }
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
    tid: libc::pid_t,
    phys: usize,
    priority: Option<i32>,
) -> Result<()> {
    use std::os::unix::thread::JoinHandleExt;
    let thread = handle.as_pthread_t();
    crate::affinity::pin_thread(thread, tid, phys)?;
    if let Some(priority) = priority {
        crate::affinity::set_thread_fifo(thread, priority)?;
    }
    Ok(())
}

#[cfg(loom)]
fn configure_worker(
    _handle: &thread::JoinHandle<ShutdownReport>,
    _tid: libc::pid_t,
    _phys: usize,
    _priority: Option<i32>,
) -> Result<()> {
    Ok(())
}
