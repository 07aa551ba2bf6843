//! [`PerCid`]: state per concurrency id (rseq `mm_cid`), issue 41.
//!
//! Smoke: threads count into their ids' slots and a walk sums them. Edge cases: a re-entered
//! slot is refused, a held slot is not waited for by `try_lock_local`, a panic inside a walk
//! releases what it held, the state outlives its instance's shutdown, and the walk visits no
//! more slots than ids were used (with `mm_cid`: no more than the CPUs the process may use,
//! however many threads came and went). Stress: threads that move between CPUs (their
//! affinity changed while they work) and that end and start again (so ids are freed and
//! reused) count while a drainer empties every slot over and over; every count is conserved.

#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use qpw_core::cid::{self, IdSource};
use qpw_core::{CidGuard, CpuSet, Error, Qpw};

#[test]
fn smoke_threads_count_into_their_ids() {
    let qpw = Qpw::new().unwrap();
    let hits = qpw.per_cid(|_| 0u64);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..10_000 {
                    *hits.lock_local().unwrap() += 1;
                }
            });
        }
    });
    let mut total = 0;
    hits.read_each(|_, n| total += n).unwrap();
    assert_eq!(total, 40_000);
    println!("{}; {hits:?}; {}", cid::status(), qpw.describe());
    assert!(qpw
        .describe()
        .contains(&format!("PerCid ids from {}", cid::source())));
}

#[test]
fn a_re_entered_slot_is_refused_and_a_held_one_is_not_waited_for() {
    let qpw = Qpw::new().unwrap();
    let state = qpw.per_cid(|_| 0u32);
    let guard = state.lock_local().unwrap();
    let id = CidGuard::id(&guard);
    // The same thread again: refused, not a wait for itself.
    assert!(
        matches!(
            state.lock_local(),
            Err(Error::IdReentrant { id: i, .. }) if i == id
        ) || cid::current() != Some(id)
    );
    assert!(matches!(
        state.for_each_locked(|_, _| {}),
        Err(Error::IdReentrant { .. })
    ));
    // Another thread with that id (or any): try_lock_local never waits.
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = state.try_lock_local().unwrap();
        });
    });
    drop(guard);
    // Inside a walk, the walk's own slot is held.
    state
        .for_each_locked(|_, _| {
            assert!(matches!(
                state.for_each_locked(|_, _| {}),
                Err(Error::IdReentrant { .. })
            ));
        })
        .unwrap();
}

#[test]
fn a_panic_inside_a_walk_releases_what_it_held() {
    let qpw = Qpw::new().unwrap();
    let state = qpw.per_cid(|_| 0u32);
    *state.lock_local().unwrap() += 1;
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        state
            .for_each_locked(|_, _| panic!("a scrape that fails"))
            .unwrap();
    }));
    assert!(caught.is_err());
    // Nothing is left held, by this thread or any.
    *state.lock_local().unwrap() += 1;
    std::thread::scope(|s| {
        s.spawn(|| *state.lock_local().unwrap() += 1);
    });
    let mut total = 0;
    state.read_each(|_, n| total += n).unwrap();
    assert_eq!(total, 3);
}

#[test]
fn the_state_outlives_its_instances_shutdown() {
    let qpw = Qpw::new().unwrap();
    let state = qpw.per_cid(|_| 0u32);
    let _ = qpw.shutdown();
    *state.lock_local().unwrap() += 1;
    assert_eq!(state.take_each(std::mem::take).unwrap()[0].1, 1);
}

/// Threads that move between CPUs while they count, and that end and start again, against a
/// drainer: conservation, and with `mm_cid` no more slots than CPUs the process may use.
#[test]
fn stress_conservation_under_migration_and_thread_turnover() {
    const GENERATIONS: usize = 6;
    const THREADS: usize = 3;
    const OPS: u64 = if cfg!(debug_assertions) {
        20_000
    } else {
        200_000
    };
    let qpw = Qpw::new().unwrap();
    let state = qpw.per_cid(|_| 0u64);
    let allowed = qpw_core::allowed_cpus().unwrap();
    let cpus: Vec<usize> = allowed.iter().collect();
    let added = AtomicU64::new(0);
    let drained = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let taken = state.take_each(std::mem::take).unwrap();
                drained.fetch_add(taken.iter().map(|(_, n)| n).sum(), Ordering::Relaxed);
            }
        });
        for generation in 0..GENERATIONS {
            // Each generation's threads end before the next starts: their ids go back to
            // the kernel, which hands them to the next.
            std::thread::scope(|g| {
                for t in 0..THREADS {
                    let (state, added, cpus) = (&state, &added, &cpus);
                    g.spawn(move || {
                        for i in 0..OPS {
                            if i % 1000 == 0 {
                                // Move: one CPU, then all of them, in turn.
                                let k = (i / 1000) as usize + t + generation;
                                let set = if k.is_multiple_of(2) {
                                    CpuSet::from_iter([cpus[k / 2 % cpus.len()]])
                                } else {
                                    cpus.iter().copied().collect()
                                };
                                qpw_core::set_current_affinity(&set).unwrap();
                            }
                            *state.lock_local().unwrap() += 1;
                            added.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            });
        }
        stop.store(true, Ordering::Relaxed);
    });
    let rest: u64 = state
        .take_each(std::mem::take)
        .unwrap()
        .iter()
        .map(|(_, n)| n)
        .sum();
    let (added, drained) = (added.into_inner(), drained.into_inner());
    println!(
        "{added} added, {drained} drained during, {rest} after; {} slots for {} threads in all \
         ({}; {} CPUs allowed); {}",
        state.slots(),
        GENERATIONS * THREADS + 1,
        cid::status(),
        allowed.len(),
        qpw.describe()
    );
    if std::env::var_os(EXPECT_FALLBACK).is_some() {
        assert_eq!(cid::source(), IdSource::Cpu, "{}", cid::status());
    }
    assert_eq!(drained + rest, added, "every count is conserved");
    assert_eq!(added, (GENERATIONS * THREADS) as u64 * OPS);
    match cid::source() {
        // The kernel hands out ids below the CPUs the process may use (it bounds them by the
        // process's allowed CPUs), however many threads came and went.
        IdSource::MmCid => assert!(
            state.slots() <= allowed.len(),
            "{} slots with {} CPUs allowed",
            state.slots(),
            allowed.len()
        ),
        IdSource::Cpu => assert!(state.ids() <= allowed.last().unwrap() + 1),
    }
}

/// Set in the child of `fallback_in_a_child_without_rseq`.
const EXPECT_FALLBACK: &str = "QPW_EXPECT_CID_FALLBACK";

/// Without glibc's rseq registration (`GLIBC_TUNABLES=glibc.pthread.rseq=0`) the ids are CPU
/// numbers, `cid::status` and `Qpw::describe` say so and why, and the stress's counts are
/// conserved all the same.
#[test]
fn fallback_in_a_child_without_rseq() {
    if std::env::var_os(EXPECT_FALLBACK).is_some() {
        return; // we are the child: do not recurse
    }
    let stdout = qpw_tests::run_without_rseq(
        "stress_conservation_under_migration_and_thread_turnover",
        EXPECT_FALLBACK,
    );
    assert!(
        stdout.contains("concurrency ids: CPU numbers (fallback: glibc did not register rseq")
            && stdout.contains("PerCid ids from CPU numbers (glibc did not register rseq"),
        "the child does not report the fallback:\n{stdout}"
    );
}
