//! The rseq lock under forced preemption and migration: several threads per CPU, some bound,
//! some unbound that move themselves between CPUs (sometimes while holding the lock, so that
//! the release is a plain store from another CPU), `sched_yield` inside critical sections (so
//! that same-CPU waiters find a preempted holder and must sleep), while drains queued to every
//! CPU's worker empty the slots. Conservation: every unit added is drained exactly once.
//!
//! `fallback_in_a_child_without_rseq` runs the same stress in a child process with
//! `GLIBC_TUNABLES=glibc.pthread.rseq=0` and checks that the child reports the fallback (the
//! atomic lock and `sched_getcpu`) and passes.

#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use qpw_core::{CpuSet, Error, LocalLockKind, Policy, Qpw, RseqLock};

const OPS_PER_THREAD: u64 = if cfg!(debug_assertions) {
    40_000
} else {
    400_000
};
const THREADS_PER_CPU: usize = 3;
/// Set in the child of `fallback_in_a_child_without_rseq`.
const EXPECT_FALLBACK: &str = "QPW_EXPECT_RSEQ_FALLBACK";

#[test]
fn smoke_rseq_lock_local_and_refusals() {
    let qpw = Qpw::with_policy(Policy::Queue).unwrap();
    let counters = qpw.per_cpu_with::<RseqLock, _>(|_| 0u64).unwrap();
    for _ in 0..1000 {
        *counters.lock_local().unwrap() += 1;
        if let Some(mut slot) = counters.try_lock_local().unwrap() {
            *slot += 1;
        }
    }
    assert!(
        qpw.describe().contains("RseqLock uses"),
        "{}",
        qpw.describe()
    );

    // Another CPU may take a remote-mode CPU's lock: the rseq lock is refused there.
    let remote = Qpw::builder()
        .cpus(qpw_core::CpuSpec::Logical(2))
        .policy(Policy::RemoteOn("1".parse().unwrap()))
        .build()
        .unwrap();
    let err = remote.per_cpu_with::<RseqLock, _>(|_| 0u64).unwrap_err();
    assert!(
        matches!(
            err,
            Error::LockNeedsQueueMode {
                cpu: 1,
                lock: "rseq",
                mode: qpw_core::Mode::Remote,
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().starts_with("cpu 1 is in remote mode"),
        "{err}"
    );
    // The fair lock has no such restriction.
    assert!(remote
        .per_cpu_with::<qpw_core::FairLock, _>(|_| 0u64)
        .is_ok());
}

#[test]
fn stress_rseq_lock_with_preemption_and_migration() {
    let status = qpw_core::rseq::status();
    println!("rseq status: {status}");
    if std::env::var_os(EXPECT_FALLBACK).is_some() {
        assert_eq!(RseqLock::kind(), LocalLockKind::Fair, "{status}");
        assert!(!qpw_core::rseq::available(), "{status}");
        println!("fallback in use: {}", RseqLock::kind());
    }

    let allowed = qpw_core::allowed_cpus().unwrap();
    let qpw = Arc::new(Qpw::with_policy(Policy::Queue).unwrap());
    let counters = Arc::new(qpw.per_cpu_with::<RseqLock, _>(|_| 0u64).unwrap());
    let drained = Arc::new(AtomicU64::new(0));
    let drain = {
        let (c, d) = (counters.clone(), drained.clone());
        Arc::new(
            qpw.work(move |ctx| {
                let mut local = c.lock_work(ctx).unwrap();
                d.fetch_add(*local, Ordering::Relaxed);
                *local = 0;
            })
            .unwrap(),
        )
    };

    let done = Arc::new(AtomicBool::new(false));
    let drainer = {
        let (done, drain) = (done.clone(), drain.clone());
        thread::spawn(move || {
            let mut rounds = 0u64;
            while !done.load(Ordering::Relaxed) {
                let report = drain.drain_all_timeout(|_| true, Duration::from_secs(60));
                assert!(report.is_complete(), "{:?}", report.errors);
                rounds += 1;
            }
            rounds
        })
    };

    let adders: Vec<_> = qpw
        .cpus()
        .iter()
        .flat_map(|cpu| std::iter::repeat_n(cpu, THREADS_PER_CPU))
        .enumerate()
        .map(|(i, cpu)| {
            let (qpw, counters, allowed) = (qpw.clone(), counters.clone(), allowed.clone());
            thread::spawn(move || {
                // Every third thread is bound (pinned, registered); the others are unbound and
                // move themselves around.
                let _bound = (i % 3 == 0).then(|| qpw.bind_current(cpu).unwrap());
                let mut churn = qpw_tests::Churn::new(i, allowed, i % 3 != 0);
                let mut added = 0u64;
                for n in 0..OPS_PER_THREAD {
                    churn.before_op();
                    if (n + i as u64).is_multiple_of(5) {
                        if let Some(mut slot) = counters.try_lock_local().unwrap() {
                            *slot += 1;
                            added += 1;
                            continue;
                        }
                    }
                    let mut slot = counters.lock_local().unwrap();
                    *slot += 1;
                    added += 1;
                    churn.while_holding();
                    drop(slot);
                }
                (added, churn.migrations)
            })
        })
        .collect();

    let (mut added, mut migrations) = (0, 0);
    for adder in adders {
        let (a, m) = adder.join().unwrap();
        added += a;
        migrations += m;
    }
    done.store(true, Ordering::Relaxed);
    let rounds = drainer.join().unwrap();
    // A last drain takes whatever the rounds came too early for.
    assert!(drain.drain_all(|_| true).is_complete());
    println!(
        "{}; {} lock; {added} adds, {migrations} migrations, {rounds} drain rounds",
        qpw.describe(),
        RseqLock::kind()
    );
    assert_eq!(
        added,
        OPS_PER_THREAD * (qpw.cpus().len() * THREADS_PER_CPU) as u64
    );
    assert_eq!(drained.load(Ordering::Relaxed), added);

    // Nothing left behind either: read every slot with no lock at all, once every other
    // handle is gone.
    drop(drain);
    let qpw = Arc::try_unwrap(qpw).expect("the only handle left");
    let report = qpw.shutdown();
    assert!(report.panicked.is_empty(), "{:?}", report.panicked);
    let mut counters = Arc::try_unwrap(counters).expect("the only handle left");
    let left: u64 = counters
        .iter_mut()
        .expect("the only handle left")
        .map(|(_, n)| *n)
        .sum();
    assert_eq!(left, 0);
}

/// A `SCHED_FIFO` worker against a `SCHED_OTHER` thread of the same CPU that takes and drops
/// the rseq lock non-stop: the worker must not spin against the preempted holder, and the
/// release must hand it the lock, so the drain completes. Skipped (with a message) where
/// `SCHED_FIFO` is not permitted.
#[test]
fn fifo_worker_drains_against_a_looping_same_cpu_holder() {
    let cpu = qpw_core::allowed_cpus().unwrap().last().unwrap();
    let qpw = match Qpw::builder()
        .cpus(qpw_core::CpuSpec::List(CpuSet::from_iter([cpu])))
        .policy(Policy::Queue)
        .worker_priority(10)
        .build()
    {
        Ok(qpw) => Arc::new(qpw),
        Err(e @ Error::SchedFifo { .. }) => {
            println!("skipped: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let counters = Arc::new(qpw.per_cpu_with::<RseqLock, _>(|_| 0u64).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let looper = {
        let (qpw, counters, stop) = (qpw.clone(), counters.clone(), stop.clone());
        thread::spawn(move || {
            let _bound = qpw.bind_current(cpu).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                *counters.lock_local().unwrap() += 1;
                n += 1;
            }
            n
        })
    };
    let drained = Arc::new(AtomicU64::new(0));
    let drain = {
        let (c, d) = (counters.clone(), drained.clone());
        qpw.work(move |ctx| {
            let mut local = c.lock_work(ctx).unwrap();
            d.fetch_add(*local, Ordering::Relaxed);
            *local = 0;
        })
        .unwrap()
    };
    thread::sleep(Duration::from_millis(20));
    for _ in 0..20 {
        drain.queue_on(cpu).unwrap();
        drain.flush_timeout(cpu, Duration::from_secs(30)).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let n = looper.join().unwrap();
    drain.queue_on(cpu).unwrap();
    drain.flush(cpu).unwrap();
    assert_eq!(drained.load(Ordering::Relaxed), n);
}

/// The stress again in a child process where glibc does not register rseq: the child must
/// report the fallback and pass.
#[test]
fn fallback_in_a_child_without_rseq() {
    if std::env::var_os(EXPECT_FALLBACK).is_some() {
        return; // we are the child: do not recurse
    }
    let stdout = qpw_tests::run_without_rseq(
        "stress_rseq_lock_with_preemption_and_migration",
        EXPECT_FALLBACK,
    );
    assert!(
        stdout.contains("cpu: sched_getcpu (fallback")
            && stdout.contains("rseq lock: fallback to the atomic FairLock")
            && stdout.contains("fallback in use: fair"),
        "the child does not report the fallback:\n{stdout}"
    );
}
