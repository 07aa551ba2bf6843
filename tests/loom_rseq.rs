//! Loom models of [`RseqLock`]'s protocol, with the kernel's side of restartable sequences
//! mocked (see "Under loom" in `qpw-core/src/rseq_lock/loom_mock.rs`: a sequence may be aborted
//! at any preemption point by another sequence of its CPU or by a CPU fence, and is then
//! restarted).
//! Run with
//! `RUSTFLAGS="--cfg loom -C debug-assertions" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p qpw-tests --test loom_rseq`
//! (a few seconds of checking on the 2-core development VM; see `.ci/loom`).
//!
//! Two mock CPUs and one or two increments per thread: the protocol does not depend on how
//! many CPUs or increments there are, only on how the parties interleave.
//!
//! The mock commits a sequence's `HELD` without looking at the word again, so only an abort
//! stops a stale commit; the last tests show that the model with a fenced taker fails when
//! the taker leaves out its CPU fence or the check after it (`rseq::mock::with_mutation`).
//! The other models have no fenced taker racing an owner, so those steps do not matter to
//! them (the migrated holder's total is read through the fenced path, but only after the
//! other threads are joined).

#![cfg(loom)]

mod loom_common;

use loom::cell::UnsafeCell;
use loom::sync::Mutex;
use loom::thread;
use std::sync::Arc;

use qpw_core::rseq::mock::{migrate_to, with_mutation, Mutation};
use qpw_core::{CpuSpec, Policy, Qpw, RawLocalLock, RseqLock};

/// The conservation assertion's message, which the mutation tests look for.
const CONSERVATION: &str = loom_common::LOOM_CONSERVATION;

/// A counter behind an `RseqLock` of CPU 0; loom's cell tracking flags any two accesses that
/// the lock failed to order.
struct Counter {
    lock: RseqLock,
    value: UnsafeCell<u32>,
}

// SAFETY: `value` is only touched between `lock.lock()` and `lock.unlock()`.
unsafe impl Sync for Counter {}

impl Counter {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            lock: RseqLock::for_cpu(0),
            value: UnsafeCell::new(0),
        })
    }

    /// Takes the lock (from wherever the thread runs), adds one, and, if `then` says so,
    /// migrates before releasing.
    fn increment(&self, migrate_before_unlock: Option<usize>) {
        self.lock.lock();
        // SAFETY: the lock is held.
        self.value.with_mut(|v| unsafe { *v += 1 });
        if let Some(cpu) = migrate_before_unlock {
            migrate_to(Some(cpu));
        }
        // SAFETY: taken above by this thread.
        unsafe { self.lock.unlock() };
    }

    /// Adds one under the lock this thread already holds, then releases it.
    fn add_and_release(&self) {
        // SAFETY: the caller holds the lock.
        self.value.with_mut(|v| unsafe { *v += 1 });
        // SAFETY: taken by this thread, released once.
        unsafe { self.lock.unlock() };
    }

    fn value(&self) -> u32 {
        self.lock.lock();
        // SAFETY: the lock is held.
        let v = self.value.with(|v| unsafe { *v });
        // SAFETY: taken just above.
        unsafe { self.lock.unlock() };
        v
    }
}

/// A thread that runs on `cpu` and increments `counter` once, migrating to
/// `migrate_before_unlock` (if any) while it holds the lock.
fn spawn_increment(
    counter: &Arc<Counter>,
    cpu: usize,
    migrate_before_unlock: Option<usize>,
) -> thread::JoinHandle<()> {
    let counter = counter.clone();
    thread::spawn(move || {
        migrate_to(Some(cpu));
        counter.increment(migrate_before_unlock);
    })
}

/// Two threads of CPU 0 take the lock by restartable sequence; each sequence may be aborted by
/// the other's, and a loser sleeps until the winner's release hands it over.
#[test]
fn loom_rseq_same_cpu_waiter() {
    loom::model(|| {
        let counter = Counter::new();
        migrate_to(Some(0));
        // The main thread holds the lock while the other arrives: the other spins once, then
        // registers and sleeps (or finds the lock already handed over).
        counter.lock.lock();
        let waiter = spawn_increment(&counter, 0, None);
        counter.add_and_release();
        waiter.join().unwrap();
        assert_eq!(counter.value(), 2);
    });
}

/// The hand-over: a thread of CPU 0 releases while a waiter of CPU 0 sleeps, then at once
/// tries to take the lock again (the tight loop that would starve a worker). Either the waiter
/// had not registered yet, or the release handed the lock to it (`HANDOFF`), which the
/// releaser's new sequence cannot take; every increment lands once.
#[test]
fn loom_rseq_handoff_against_a_retaking_releaser() {
    loom::model(|| {
        let counter = Counter::new();
        migrate_to(Some(0));
        counter.lock.lock();
        let waiter = spawn_increment(&counter, 0, None);
        counter.add_and_release();
        counter.increment(None);
        waiter.join().unwrap();
        assert_eq!(counter.value(), 3);
    });
}

/// Checks a race between a spawned thread that runs on `spawned_cpu` and increments (migrating
/// to `spawned_migrates_to` while it holds the lock, if given) and the main thread, which
/// increments on CPU 0; then reads the total from `reader_cpu`: both increments, once each.
fn race_with_cpu_0(spawned_cpu: usize, spawned_migrates_to: Option<usize>, reader_cpu: usize) {
    loom::model(move || {
        let counter = Counter::new();
        let other = spawn_increment(&counter, spawned_cpu, spawned_migrates_to);
        migrate_to(Some(0));
        counter.increment(None);
        other.join().unwrap();
        migrate_to(Some(reader_cpu));
        assert_eq!(counter.value(), 2, "{CONSERVATION}");
    });
}

/// Two threads of CPU 0 race for a free lock: the sequences exclude each other.
#[test]
fn loom_rseq_same_cpu_race() {
    race_with_cpu_0(0, None, 0);
}

/// A holder takes the lock on CPU 0, migrates to CPU 1 and releases from there with a plain
/// store, while a thread of CPU 0 competes: the release reaches it, and so does the data (read
/// from CPU 1: the fenced path).
#[test]
fn loom_rseq_migrated_holder() {
    race_with_cpu_0(0, Some(1), 1);
}

/// A thread of CPU 1 takes CPU 0's lock through the fenced path (`CAS`, fence the CPU,
/// check) while a thread of CPU 0 takes it by sequence: never both.
#[test]
fn loom_rseq_fenced_taker_vs_owner() {
    race_with_cpu_0(1, None, 0);
}

/// Runs the fenced taker's race with its path broken as `mutation` says, and checks that loom
/// finds two holders at once (unordered accesses to the counter) or a lost increment.
fn assert_fenced_taker_race_caught(mutation: Mutation) {
    loom_common::assert_loom_catches(&mutation, loom_common::Failure::TwoHolders, || {
        with_mutation(mutation, || race_with_cpu_0(1, None, 0))
    });
}

/// Without the fence, a sequence of CPU 0 that loaded `FREE` before the taker's `CAS`
/// commits after the taker's check.
#[test]
fn loom_rseq_fenced_taker_vs_owner_needs_the_fence() {
    assert_fenced_taker_race_caught(Mutation::SkipFence);
}

/// Without the check, the taker claims a lock that a sequence committed between its `CAS`
/// and its fence.
#[test]
fn loom_rseq_fenced_taker_vs_owner_needs_the_check() {
    assert_fenced_taker_race_caught(Mutation::SkipCheck);
}

/// Without the waiter's fence, the taker that waits for the owner's hold sleeps while the
/// owner's release sequence, which loaded the waiter count before the taker registered,
/// commits `FREE` and wakes nobody.
#[test]
fn loom_rseq_fenced_taker_vs_owner_needs_the_waiters_fence() {
    let mutation = Mutation::SkipWaiterFence;
    loom_common::assert_loom_catches(&mutation, loom_common::Failure::LostWake, || {
        with_mutation(mutation, || race_with_cpu_0(1, None, 0))
    });
}

/// The framework around it: a queue-mode CPU whose slot is behind an `RseqLock`; a bound
/// thread fills it while a drain queued to the CPU's worker empties it. Every item ends in the
/// sink exactly once.
#[test]
fn loom_rseq_per_cpu_with_queued_drain() {
    loom::model(|| {
        let qpw = Arc::new(
            Qpw::builder()
                .cpus(CpuSpec::Logical(1))
                .policy(Policy::Queue)
                .build()
                .unwrap(),
        );
        let cache = Arc::new(
            qpw.per_cpu_with::<RseqLock, _>(|_| Vec::<u32>::new())
                .unwrap(),
        );
        let sink = Arc::new(Mutex::new(Vec::<u32>::new()));
        let drain = {
            let (cache, sink) = (cache.clone(), sink.clone());
            qpw.work(move |ctx| {
                let mut local = cache.lock_work(ctx).unwrap();
                sink.lock().unwrap().append(&mut local);
            })
            .unwrap()
        };
        let producer = {
            let (qpw, cache) = (qpw.clone(), cache.clone());
            thread::spawn(move || {
                let _bound = qpw.bind_current(0).unwrap();
                cache.lock_local().unwrap().push(1);
            })
        };
        drain.queue_on(0).unwrap();
        drain.flush(0).unwrap();
        producer.join().unwrap();
        drain.queue_on(0).unwrap();
        drain.flush(0).unwrap();
        assert_eq!(*sink.lock().unwrap(), [1]);
    });
}
