//! The owner's poll ([`Binding::poll`], issue 34): an owner of a fenced-mode CPU that spends
//! its time on something else answers the requesters from its loop, so that they need not
//! fence its CPU.
//!
//! Smoke: nobody calls, the poll is quiet. Edge cases: a call is answered by the next poll,
//! and one made while the thread runs elsewhere than its binding's CPU is not (only a thread
//! running there may answer). Stress: a requester scrapes an owner that serves and polls,
//! and every unit served is taken exactly once. No timing is asserted; the counts of
//! [`fence_counts`] are process-wide, so the tests of this file take turns.
//!
//! Where restartable sequences are unavailable every fenced lock is the atomic fallback,
//! nobody calls a CPU, and every poll is quiet: the tests check that instead.

#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;

use qpw_core::fenced_lock::fence_counts;
use qpw_core::{FencedLock, LocalLockKind, PerCpu, Policy, Polled, Qpw};

/// The counts of `fence_counts` are the process's: one test at a time.
static TURN: Mutex<()> = Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether requesters call fenced CPUs here (restartable sequences work).
fn calls() -> bool {
    FencedLock::kind() == LocalLockKind::Rseq
}

/// A fenced-mode instance over the allowed CPUs, its per-CPU state, the owner's CPU and
/// another; `None` (saying so) on one CPU, where there is no other CPU for what `needs` it.
fn two_cpus(needs: &str) -> Option<(Qpw, PerCpu<u64>, usize, usize)> {
    let qpw = Qpw::with_policy(Policy::Fenced).unwrap();
    let mut cpus = qpw.cpus().iter();
    let (Some(owner), Some(other)) = (cpus.next(), cpus.next()) else {
        eprintln!("skipped: one CPU, no other CPU for {needs}");
        return None;
    };
    drop(cpus);
    let state = qpw.per_cpu(|_| 0u64);
    Some((qpw, state, owner, other))
}

/// Once the calls of the other tests (the CPUs' beacons are the process's) are answered, a
/// CPU nobody calls polls quiet, in every mode.
#[test]
fn smoke_nobody_calls_so_the_poll_is_quiet() {
    let _turn = turn();
    for policy in [Policy::Fenced, Policy::Remote, Policy::Queue] {
        let qpw = Qpw::with_policy(policy.clone()).unwrap();
        let cpu = qpw.cpus().first().unwrap();
        let binding = qpw.bind_current(cpu).unwrap();
        let state = qpw.per_cpu(|_| 0u64);
        let _ = binding.poll();
        for _ in 0..1000 {
            *state.lock_local().unwrap() += 1;
            assert_eq!(binding.poll(), Polled::Quiet, "{policy}");
        }
    }
}

/// A requester on another CPU takes the owner's lock (a flag, a call); the owner's next poll
/// answers the call, and the one after it has nothing left to answer.
#[test]
fn a_call_is_answered_by_the_next_poll() {
    let _turn = turn();
    let Some((qpw, state, owner_cpu, other)) = two_cpus("the requester") else {
        return;
    };
    let binding = qpw.bind_current(owner_cpu).unwrap();
    *state.lock_local().unwrap() += 1;
    // Nobody calls now (an earlier test's call, if any, answered first).
    let _ = binding.poll();
    assert_eq!(binding.poll(), Polled::Quiet);
    thread::scope(|s| {
        s.spawn(|| {
            let _bound = qpw.bind_current(other).unwrap();
            *state.lock(owner_cpu).unwrap() += 1; // no answer comes: the fence
        });
    });
    let expected = if calls() {
        Polled::Answered
    } else {
        Polled::Quiet
    };
    assert_eq!(binding.poll(), expected);
    assert_eq!(binding.poll(), Polled::Quiet);
    assert_eq!(*state.lock_local().unwrap(), 2);
}

/// A thread whose binding says one CPU but which runs on another (its pinning undone) cannot
/// answer for its binding's CPU: its poll finds the call and says so; pinned back, it
/// answers.
#[test]
fn a_poll_from_another_cpu_does_not_answer() {
    let _turn = turn();
    let Some((qpw, state, owner_cpu, other)) = two_cpus("the poll from elsewhere") else {
        return;
    };
    let binding = qpw.bind_current(owner_cpu).unwrap();
    let _ = binding.poll(); // an earlier test's call, if any
    let owner_phys = qpw.physical_cpu(owner_cpu).unwrap();
    qpw_core::pin_current_thread(qpw.physical_cpu(other).unwrap()).unwrap();
    *state.lock(owner_cpu).unwrap() += 1; // from here, elsewhere: a flag, a call, a fence
    let (away, back) = if calls() {
        (Polled::Elsewhere, Polled::Answered)
    } else {
        (Polled::Quiet, Polled::Quiet)
    };
    assert_eq!(binding.poll(), away);
    assert_eq!(binding.poll(), away, "a refused call is still pending");
    qpw_core::pin_current_thread(owner_phys).unwrap();
    assert_eq!(binding.poll(), back);
    assert_eq!(binding.poll(), Polled::Quiet);
    assert_eq!(*state.lock_local().unwrap(), 1);
}

/// An owner that serves (adds to its CPU's slot) and polls between requests, and a requester
/// on another CPU that scrapes it again and again with `take_each`: every unit is taken
/// exactly once, and the owner's polls answered some of the scrapes' flags before the
/// scraper fenced (the scraper goes on past its scrapes until the owner has answered a
/// waiting scrape, so that an owner kept off its CPU a while by the machine's other work does
/// not fail the test; 120 s without one is a hang).
#[test]
fn stress_a_polling_owner_under_scrapes() {
    let _turn = turn();
    const SCRAPES: u64 = if cfg!(debug_assertions) { 300 } else { 3000 };
    let Some((qpw, state, owner_cpu, other)) = two_cpus("the scraper") else {
        return;
    };
    let (ready, done) = (AtomicBool::new(false), AtomicBool::new(false));
    let polls_answered = AtomicU64::new(0);
    let before = fence_counts();
    let (taken, scrapes, served) = thread::scope(|s| {
        let owner = s.spawn(|| {
            let binding = qpw.bind_current(owner_cpu).unwrap();
            let mine = state.bound_slot(&binding).unwrap();
            let (mut turns, mut served) = (0u64, 0u64);
            ready.store(true, Ordering::Release);
            while !done.load(Ordering::Acquire) {
                // Serve a request now and then; poll in between, as a server does.
                if turns % 64 == 0 {
                    *mine.lock() += 1;
                    served += 1;
                }
                turns += 1;
                if binding.poll() == Polled::Answered {
                    polls_answered.fetch_add(1, Ordering::Relaxed);
                }
            }
            served
        });
        let _bound = qpw.bind_current(other).unwrap();
        while !ready.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        let (mut taken, mut scrapes) = (0u64, 0u64);
        let start = std::time::Instant::now();
        loop {
            for (_, n) in state.take_each(|_, n| std::mem::take(n)) {
                taken += n;
            }
            scrapes += 1;
            let answered = polls_answered.load(Ordering::Relaxed) > 0
                && fence_counts().since(&before).answered > 0;
            if !calls()
                || (scrapes >= SCRAPES && answered)
                || start.elapsed() > std::time::Duration::from_secs(120)
            {
                break;
            }
        }
        done.store(true, Ordering::Release);
        (taken, scrapes, owner.join().unwrap())
    });
    let left: u64 = state.take_each(|_, n| *n).iter().map(|(_, n)| n).sum();
    assert_eq!(taken + left, served);
    let counts = fence_counts().since(&before);
    let polls_answered = polls_answered.into_inner();
    eprintln!("{scrapes} scrapes: {counts:?}, {polls_answered} answers from polls");
    if calls() {
        assert!(polls_answered > 0, "no poll answered: {counts:?}");
        assert!(counts.answered > 0, "no scrape was answered: {counts:?}");
    } else {
        assert_eq!(polls_answered, 0);
    }
}

/// A requester whose wait went unanswered (the owner was not polling) stops waiting for that
/// CPU; once the owner polls, answers are seen again (after a fence, or while a requester
/// holds the lock), the requesters wait again, and are answered. The requester goes on past
/// its takes until one was answered: the owner must have run to answer, and on a busy machine
/// its CPU may be another's for a while (30 000 takes, a quarter of a second, went by beside
/// `stress-ng --cpu 2` with no answer); 120 s without one is a hang.
#[test]
fn requesters_wait_again_for_an_owner_that_starts_polling() {
    let _turn = turn();
    const TAKES: u64 = 300;
    let Some((qpw, state, owner_cpu, other)) = two_cpus("the requester") else {
        return;
    };
    let (ready, done) = (AtomicBool::new(false), AtomicBool::new(false));
    let (takes, counts) = thread::scope(|s| {
        let _bound = qpw.bind_current(other).unwrap();
        // Nobody polls: a wait goes unanswered, and the next requesters do not wait.
        for _ in 0..3 {
            *state.lock(owner_cpu).unwrap() += 1;
        }
        let owner = s.spawn(|| {
            let binding = qpw.bind_current(owner_cpu).unwrap();
            ready.store(true, Ordering::Release);
            while !done.load(Ordering::Acquire) {
                binding.poll();
            }
        });
        while !ready.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        let before = fence_counts();
        let start = std::time::Instant::now();
        let mut takes = 0;
        loop {
            *state.lock(owner_cpu).unwrap() += 1;
            takes += 1;
            let answered = fence_counts().since(&before).answered > 0;
            if !calls()
                || (takes >= TAKES && answered)
                || start.elapsed() > std::time::Duration::from_secs(120)
            {
                break;
            }
        }
        let counts = fence_counts().since(&before);
        done.store(true, Ordering::Release);
        owner.join().unwrap();
        (takes, counts)
    });
    eprintln!("{takes} takes after the owner began to poll: {counts:?}");
    assert_eq!(*state.lock(owner_cpu).unwrap(), takes + 3);
    if calls() {
        assert!(counts.answered > 0, "{counts:?}");
    }
}
