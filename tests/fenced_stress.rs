//! Fenced mode under load, as the policy makes it: [`Policy::Fenced`], whose
//! [`Qpw::per_cpu`] slots are each behind a [`FencedLock`]. Several threads per CPU add to
//! their CPU's slot (the owner path: a restartable sequence), some bound (through a
//! `BoundSlot`), some unbound that move themselves between CPUs (sometimes while holding, so
//! the release is a plain store from elsewhere), some yielding while holding (a preempted
//! holder);
//! meanwhile two requesters drain every CPU back to back from wherever they run, one through
//! remote-mode work (`drain_all`, run in the requester) and one through `for_each_locked`.
//! Conservation: every unit added is drained exactly once, over about 10^6 operations.
//!
//! The stress runs twice: with the owners' answers on (a requester whose owner answers its
//! flag does not fence) and forced off (every requester fences).
//!
//! Checked by mutation: with the requester's CPU fence removed (`RseqLock::fence_cpu` a
//! no-op) the stress fails three runs out of three, draining units twice.
//!
//! `fallback_in_a_child_without_rseq` runs the stress in a child process with
//! `GLIBC_TUNABLES=glibc.pthread.rseq=0` and checks that the child reports the fallback and
//! passes.

#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use qpw_core::{FencedLock, LocalLockKind, Mode, Policy, Qpw};

/// About 10^6 operations in all on two CPUs (three threads each) in release builds.
const OPS_PER_THREAD: u64 = if cfg!(debug_assertions) {
    20_000
} else {
    170_000
};
const THREADS_PER_CPU: usize = 3;
/// Set in the child of `fallback_in_a_child_without_rseq`.
const EXPECT_FALLBACK: &str = "QPW_EXPECT_FENCED_FALLBACK";

#[test]
fn smoke_fenced_lock_in_remote_mode() {
    let qpw = Qpw::with_policy(Policy::Remote).unwrap();
    let counters = qpw.per_cpu_with::<FencedLock, _>(|_| 0u64).unwrap();
    for _ in 0..1000 {
        *counters.lock_local().unwrap() += 1;
    }
    let mut total = 0;
    counters.for_each_locked(|_, n| total += std::mem::take(n));
    assert_eq!(total, 1000);
    assert!(
        qpw.describe().contains("RseqLock uses"),
        "{}",
        qpw.describe()
    );
}

/// The stress with the owners' answers on (the default), then forced off (every requester
/// fences), in one test because the switch is process-wide.
#[test]
fn stress_fenced_drains_with_preemption_and_migration() {
    stress(true);
    stress(false);
    qpw_core::fenced_lock::set_acks(true);
}

fn stress(acks: bool) {
    qpw_core::fenced_lock::set_acks(acks);
    let counts_before = qpw_core::fenced_lock::fence_counts();
    let status = qpw_core::rseq::status();
    println!("rseq status: {status}");
    if std::env::var_os(EXPECT_FALLBACK).is_some() {
        assert_eq!(FencedLock::kind(), LocalLockKind::Fair, "{status}");
        println!("fallback in use: {}", FencedLock::kind());
    }

    let allowed = qpw_core::allowed_cpus().unwrap();
    let qpw = Arc::new(Qpw::with_policy(Policy::Fenced).unwrap());
    assert_eq!(qpw.cpus_in(Mode::Fenced), *qpw.cpus(), "{}", qpw.describe());
    let counters = Arc::new(qpw.per_cpu(|_| 0u64));
    let drained = Arc::new(AtomicU64::new(0));
    let drain = {
        let (c, d) = (counters.clone(), drained.clone());
        Arc::new(
            qpw.work(move |ctx| {
                let mut local = c.lock_work(ctx).unwrap();
                d.fetch_add(std::mem::take(&mut *local), Ordering::Relaxed);
            })
            .unwrap(),
        )
    };

    let done = Arc::new(AtomicBool::new(false));
    // Requester 1: remote-mode work, run in this thread under each CPU's lock.
    let by_work = {
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
    // Requester 2: the slots directly, every CPU in turn.
    let by_walk = {
        let (done, c, d) = (done.clone(), counters.clone(), drained.clone());
        thread::spawn(move || {
            let mut rounds = 0u64;
            while !done.load(Ordering::Relaxed) {
                c.for_each_locked(|_, n| {
                    d.fetch_add(std::mem::take(n), Ordering::Relaxed);
                });
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
                // Every third thread is bound, and takes its slot through a `BoundSlot` (the
                // look-up done once); the others move themselves around.
                let bound = (i % 3 == 0).then(|| qpw.bind_current(cpu).unwrap());
                let mine = bound.as_ref().map(|b| counters.bound_slot(b).unwrap());
                let mut churn = qpw_tests::Churn::new(i, allowed, i % 3 != 0);
                for _ in 0..OPS_PER_THREAD {
                    churn.before_op();
                    let mut slot = match &mine {
                        Some(mine) => mine.lock(),
                        None => counters.lock_local().unwrap(),
                    };
                    *slot += 1;
                    churn.while_holding();
                    drop(slot);
                }
                churn.migrations
            })
        })
        .collect();

    let migrations: u64 = adders.into_iter().map(|a| a.join().unwrap()).sum();
    done.store(true, Ordering::Relaxed);
    let rounds = (by_work.join().unwrap(), by_walk.join().unwrap());
    // A last walk takes whatever the rounds came too early for.
    counters.for_each_locked(|_, n| {
        drained.fetch_add(std::mem::take(n), Ordering::Relaxed);
    });
    let added = OPS_PER_THREAD * (qpw.cpus().len() * THREADS_PER_CPU) as u64;
    let settled = qpw_core::fenced_lock::fence_counts().since(&counts_before);
    println!(
        "{}; {} lock; answers {}; {added} adds, {migrations} migrations, drain rounds \
         {rounds:?}; flags settled: {settled:?}",
        qpw.describe(),
        FencedLock::kind(),
        if acks { "on" } else { "off" },
    );
    if !acks {
        assert_eq!(
            settled.answered, 0,
            "answers are off, yet a flag was settled by one"
        );
    }
    assert!(rounds.0 > 0 && rounds.1 > 0, "{rounds:?}");
    assert_eq!(drained.load(Ordering::Relaxed), added);
}

/// The stress again in a child process where glibc does not register rseq: the child must
/// report the fallback and pass.
#[test]
fn fallback_in_a_child_without_rseq() {
    if std::env::var_os(EXPECT_FALLBACK).is_some() {
        return; // we are the child: do not recurse
    }
    let stdout = qpw_tests::run_without_rseq(
        "stress_fenced_drains_with_preemption_and_migration",
        EXPECT_FALLBACK,
    );
    assert!(
        stdout.contains("rseq lock: fallback to the atomic FairLock")
            && stdout.contains("fallback in use: fair")
            && stdout.contains("with locks on the atomic fallback"),
        "the child does not report the fallback (rseq::status and describe):\n{stdout}"
    );
}

/// A drain deadline bounds a fenced drain whose CPU's lock stays held (issue 26): the drain
/// returns while the holder still holds, reports the lock stall, and says how long it took and
/// whether it overran its deadline. (No time is asserted: the holder holds until the drain has
/// returned, whatever that takes.)
#[test]
fn a_deadline_bounds_a_fenced_drain_and_the_report_says_how_long_it_took() {
    let qpw = Arc::new(Qpw::with_policy(Policy::Fenced).unwrap());
    let Some(target) = qpw.cpus().iter().last() else {
        return;
    };
    let counters = Arc::new(qpw.per_cpu(|_| 0u64));
    let drain = {
        let c = counters.clone();
        qpw.work(move |ctx| {
            if let Ok(mut n) = c.lock_work(ctx) {
                *n = 0;
            }
        })
        .unwrap()
    };
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let holder = {
        let (qpw, counters) = (qpw.clone(), counters.clone());
        thread::spawn(move || {
            let _bound = qpw.bind_current(target).unwrap();
            let slot = counters.lock_local().unwrap();
            held_tx.send(()).unwrap();
            // Hold until the drain has returned (or a minute, so that a broken drain cannot
            // hang the suite).
            let _ = done_rx.recv_timeout(Duration::from_secs(60));
            drop(slot);
        })
    };
    held_rx.recv().unwrap();
    let timeout = Duration::from_millis(20);
    let report = drain.drain_all_timeout(|cpu| cpu == target, timeout);
    done_tx.send(()).unwrap();
    holder.join().unwrap();
    assert!(
        report
            .errors
            .iter()
            .any(|e| matches!(e, qpw_core::Error::LockStall { cpu, .. } if *cpu == target)),
        "{report:?}"
    );
    assert_eq!(report.timeout, Some(timeout));
    assert!(
        report.elapsed >= timeout,
        "it gave up before its deadline: {report:?}"
    );
    assert_eq!(report.overran(), report.elapsed > timeout);
}
