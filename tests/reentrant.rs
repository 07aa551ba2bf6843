//! A thread that holds a CPU's lock and asks for it again (issues 24 and 31): the second
//! request is an [`Error::Reentrant`] naming the CPU and both call sites instead of a wait for
//! itself. Each case runs under a watchdog: on the code before the check it hung (remote and
//! fenced mode, and queue mode for a second `lock` in the worker), and so does the test of every
//! lock kind.
//!
//! (a) work that holds its CPU's lock through `lock_work` and calls `lock(ctx.cpu())`;
//! (b) work that holds it and queues itself on `ctx.cpu()`: in remote and fenced mode the
//!     nested run happens at once, in the same thread, and its `lock_work` is refused, which
//!     the nested `queue_on` reports; in queue mode it is posted to the worker, after this run;
//! (c) a caller that holds a CPU's lock through `lock` (or `try_lock`, or a walk's guard) and
//!     runs work for that CPU (`queue_on`, `drain_all`), or asks for it again.
//!
//! These run in release builds too (`.ci/run` runs this file with `--release`): the
//! requester's guards (`lock`, `try_lock`, `lock_work`, the walks') are recorded in a
//! thread-local list in every build, and the requester's calls look there (issue 31). A hold
//! through the owner's calls (`lock_local`, `try_lock_local`, `BoundSlot::lock`) is recorded
//! only in debug builds, so that the owner's path costs what it did: those cases are at the
//! end, and in a release build they check the documented wait instead (a drain's deadline ends
//! it with `LockStall`). On the code before issue 31 the release build of this file hung in
//! (a), (b), (c) and the lock kinds' test (each reported by the watchdog).

#![cfg(not(loom))]

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use qpw_core::{Error, Mode, PerCpu, PerCpuWork, Policy, Qpw};

/// How long a case may take before it counts as hung.
/// Generous: it tells a hang from a slow machine, and a busy CI machine can be very slow.
const WATCHDOG: Duration = Duration::from_secs(120);

/// Runs `case` on its own thread; a case that does not answer within [`WATCHDOG`] hung.
fn watched<R: Send + 'static>(what: &str, case: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(case());
    });
    rx.recv_timeout(WATCHDOG)
        .unwrap_or_else(|_| panic!("{what}: hung (no answer in {WATCHDOG:?})"))
}

/// An instance of `policy`, its last CPU, a per-CPU count and work that adds one to it
/// under `lock_work` (returning at a refusal).
fn counted(policy: Policy) -> (Qpw, usize, PerCpu<u64>, PerCpuWork) {
    let qpw = Qpw::with_policy(policy).unwrap();
    let cpu = qpw.cpus().iter().last().unwrap();
    let state: PerCpu<u64> = qpw.per_cpu(|_| 0);
    let work = {
        let state = state.clone();
        qpw.work(move |ctx| {
            if let Ok(mut n) = state.lock_work(ctx) {
                *n += 1;
            }
        })
        .unwrap()
    };
    (qpw, cpu, state, work)
}

fn policies() -> [(Policy, Mode); 3] {
    [
        (Policy::Queue, Mode::Queue),
        (Policy::Remote, Mode::Remote),
        (Policy::Fenced, Mode::Fenced),
    ]
}

/// (a): `lock(ctx.cpu())` inside `lock_work`.
#[test]
fn lock_inside_lock_work_is_refused_in_every_mode() {
    for (policy, mode) in policies() {
        let what = format!("{mode} mode, lock inside lock_work");
        let outcome = watched(&what.clone(), move || {
            let qpw = Qpw::with_policy(policy).unwrap();
            let cpu = qpw.cpus().iter().last().unwrap();
            let state: PerCpu<u64> = qpw.per_cpu(|_| 0);
            let seen = Arc::new(Mutex::new(None));
            let work = {
                let (state, seen) = (state.clone(), seen.clone());
                qpw.work(move |ctx| {
                    let _held = state.lock_work(ctx).unwrap();
                    let again = state.lock(ctx.cpu()).map(|_| ());
                    *seen.lock().unwrap() = Some(again);
                })
                .unwrap()
            };
            let queued = work.queue_on(cpu);
            work.flush(cpu).unwrap();
            let again = seen.lock().unwrap().take();
            (cpu, queued, again)
        });
        let (cpu, queued, again) = outcome;
        assert!(queued.is_ok(), "{what}: {queued:?}");
        match again {
            Some(Err(Error::Reentrant {
                cpu: c,
                held_at,
                asked_at,
            })) => {
                assert_eq!(c, cpu, "{what}");
                // Both call paths named: the lock_work that holds it, then the lock.
                assert!(
                    held_at.file().ends_with("reentrant.rs"),
                    "{what}: {held_at}"
                );
                assert!(
                    asked_at.file().ends_with("reentrant.rs"),
                    "{what}: {asked_at}"
                );
                assert!(
                    asked_at.line() > held_at.line(),
                    "{what}: {held_at} {asked_at}"
                );
            }
            other => panic!("{what}: the second lock of cpu {cpu}: {other:?}"),
        }
    }
}

/// (b): work that queues itself on its own CPU while it holds the lock.
#[test]
fn work_queued_on_its_own_cpu_while_holding_is_refused_where_it_would_run_at_once() {
    for (policy, mode) in policies() {
        let what = format!("{mode} mode, work queued on its own CPU while holding");
        let outcome = watched(&what.clone(), move || {
            let qpw = Qpw::with_policy(policy).unwrap();
            let cpu = qpw.cpus().iter().last().unwrap();
            let state: PerCpu<u64> = qpw.per_cpu(|_| 0);
            let nested = Arc::new(Mutex::new(Vec::new()));
            let me: Arc<Mutex<Option<qpw_core::PerCpuWork>>> = Arc::new(Mutex::new(None));
            let work = {
                let (state, nested, me) = (state.clone(), nested.clone(), me.clone());
                qpw.work(move |ctx| {
                    let Ok(mut held) = state.lock_work(ctx) else {
                        return; // the nested run: refused (the outer call reports it)
                    };
                    *held += 1;
                    let again = me.lock().unwrap().clone();
                    if *held == 1 {
                        if let Some(again) = again {
                            nested.lock().unwrap().push(again.queue_on(ctx.cpu()));
                        }
                    }
                })
                .unwrap()
            };
            *me.lock().unwrap() = Some(work.clone());
            let outer = work.queue_on(cpu);
            work.flush(cpu).unwrap();
            me.lock().unwrap().take();
            let nested = std::mem::take(&mut *nested.lock().unwrap());
            (cpu, outer, nested)
        });
        let (cpu, outer, nested) = outcome;
        assert!(outer.is_ok(), "{what}: {outer:?}");
        assert_eq!(nested.len(), 1, "{what}: {nested:?}");
        match mode {
            // Posted to the worker, to run after this one: nothing to refuse.
            Mode::Queue => assert!(nested[0].is_ok(), "{what}: {nested:?}"),
            _ => assert!(
                matches!(&nested[0], Err(Error::Reentrant { cpu: c, held_at, .. })
                    if *c == cpu && held_at.file().ends_with("reentrant.rs")),
                "{what}: the nested run: {nested:?}"
            ),
        }
    }
}

/// A guard's drop forgets its thread: taking the lock again afterwards is fine, another
/// thread holding it is not the caller, and another state's lock of the same CPU is not the
/// one held.
#[test]
fn a_released_lock_or_another_threads_hold_is_no_reentry() {
    let qpw = Qpw::with_policy(Policy::Remote).unwrap();
    let cpu = qpw.cpus().iter().last().unwrap();
    let state: PerCpu<u64> = qpw.per_cpu(|_| 0);
    drop(state.lock(cpu).unwrap());
    *state.lock(cpu).unwrap() += 1;
    let (held_tx, held_rx) = mpsc::channel();
    let other = {
        let state = state.clone();
        std::thread::spawn(move || {
            let _held = state.lock(cpu).unwrap();
            held_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(50));
        })
    };
    // Held by the other thread when this one asks (it said so, instead of a sleep that a busy
    // machine can outlast): this waits for it rather than being refused.
    held_rx.recv().unwrap();
    assert_eq!(*state.lock(cpu).unwrap(), 1);
    other.join().unwrap();
    // Another state's lock of the same CPU is another lock (the LRU's drain holds two).
    let second: PerCpu<u64> = qpw.per_cpu(|_| 0);
    let _first = state.lock(cpu).unwrap();
    *second.lock(cpu).unwrap() += 1;
    assert!(state.try_lock(cpu).unwrap().is_none());
}

/// How a lock-kind case asks for the slot it holds through `lock_work`.
#[derive(Debug, Clone, Copy)]
enum Again {
    /// A second `lock_work` of the same run: a requester's call, refused in every build.
    LockWork,
    /// `lock_local`: the owner's call, refused only in debug builds.
    LockLocal,
}

/// Every lock kind refuses a second request of its holder, since the record is kept by the
/// per-CPU state, not by the lock: each of the four under a worker of a queue-mode CPU (the one
/// mode every kind works in; `RseqLock` may only be taken by its own CPU's threads), holding
/// the slot through `lock_work` and asking again as `again` says.
fn every_lock_kind_refuses(again: Again) {
    fn case<L: qpw_core::RawLocalLock + Send + Sync + 'static>(kind: &'static str, again: Again) {
        let what = format!("{kind}, {again:?} inside lock_work");
        let seen = watched(&what.clone(), move || {
            let qpw = Qpw::with_policy(Policy::Queue).unwrap();
            let cpu = qpw.cpus().iter().last().unwrap();
            let state: PerCpu<u64, L> = qpw.per_cpu_with::<L, _>(|_| 0).unwrap();
            let seen = Arc::new(Mutex::new(None));
            let work = {
                let (state, seen) = (state.clone(), seen.clone());
                qpw.work(move |ctx| {
                    let _held = state.lock_work(ctx).unwrap();
                    let second = match again {
                        Again::LockWork => state.lock_work(ctx).map(|_| ()),
                        Again::LockLocal => state.lock_local().map(|_| ()),
                    };
                    *seen.lock().unwrap() = Some((ctx.cpu(), second));
                })
                .unwrap()
            };
            work.queue_on(cpu).unwrap();
            work.flush(cpu).unwrap();
            let seen = seen.lock().unwrap().take();
            seen
        });
        match seen {
            Some((cpu, Err(Error::Reentrant { cpu: c, .. }))) => assert_eq!(c, cpu, "{what}"),
            other => panic!("{what}: {other:?}"),
        }
    }
    case::<qpw_core::FairLock>("FairLock", again);
    case::<qpw_core::RseqLock>("RseqLock", again);
    case::<qpw_core::FencedLock>("FencedLock", again);
    case::<qpw_core::PwLock>("PwLock", again);
}

#[test]
fn every_lock_kind_refuses_a_second_lock_work() {
    every_lock_kind_refuses(Again::LockWork);
}

/// The same asked through `lock_local`, the owner's path: recorded in debug builds only.
#[cfg(debug_assertions)]
#[test]
fn every_lock_kind_refuses_lock_local_inside_lock_work() {
    every_lock_kind_refuses(Again::LockLocal);
}

/// (c): the caller holds the lock through a requester's guard (`lock`, `try_lock`) and runs
/// work for that CPU. In remote and fenced mode the run happens at once in the caller, and its
/// `lock_work` is refused: `queue_on` returns the refusal, `drain_all` reports it for that CPU.
/// In queue mode the run is posted to the worker and waits there for the caller's guard.
#[test]
fn work_run_under_the_callers_own_hold_is_refused() {
    for (policy, mode) in policies() {
        for via_try in [false, true] {
            let what = format!("{mode} mode, work run under the caller's own hold (try {via_try})");
            let policy = policy.clone();
            let (cpu, queued, drained, ran) = watched(&what.clone(), move || {
                let (qpw, cpu, state, work) = counted(policy);
                // Queue mode lets only the CPU's own threads take its lock: bind to it.
                let _bound = (mode == Mode::Queue).then(|| qpw.bind_current(cpu).unwrap());
                let held = if via_try {
                    state.try_lock(cpu).unwrap().expect("nobody else holds it")
                } else {
                    state.lock(cpu).unwrap()
                };
                let queued = work.queue_on(cpu);
                // Queue mode's drain would wait for the worker, which waits for `held`.
                let drained = (mode != Mode::Queue).then(|| work.drain_all(|c| c == cpu));
                drop(held);
                work.flush(cpu).unwrap();
                let ran = *state.lock(cpu).unwrap();
                (cpu, queued, drained, ran)
            });
            match mode {
                Mode::Queue => {
                    assert_eq!(queued, Ok(true), "{what}");
                    assert_eq!(ran, 1, "{what}: the worker ran it once the guard was gone");
                }
                _ => {
                    assert!(
                        matches!(&queued, Err(Error::Reentrant { cpu: c, held_at, .. })
                            if *c == cpu && held_at.file().ends_with("reentrant.rs")),
                        "{what}: queue_on: {queued:?}"
                    );
                    let drained = drained.expect("a drain in remote and fenced mode");
                    assert!(
                        matches!(drained.errors[..], [Error::Reentrant { cpu: c, .. }] if c == cpu),
                        "{what}: drain_all: {drained:?}"
                    );
                    assert_eq!(ran, 0, "{what}: both runs were refused");
                }
            }
        }
    }
}

/// (c): a walk's guard is a requester's: asking for its CPU again from inside the walk is
/// refused, and the walk goes on.
#[test]
fn lock_inside_a_walk_is_refused() {
    for (policy, mode) in policies() {
        let what = format!("{mode} mode, lock inside for_each_locked");
        let seen = watched(&what.clone(), move || {
            let qpw = Qpw::with_policy(policy).unwrap();
            let state: PerCpu<u64> = qpw.per_cpu(|_| 0);
            let mut seen = Vec::new();
            state.for_each_locked(|cpu, _| {
                // Queue mode lets only the CPU's own threads take its lock: bind to it.
                let _bound = (mode == Mode::Queue).then(|| qpw.bind_current(cpu).unwrap());
                seen.push((cpu, state.lock(cpu).map(|_| ())));
            });
            seen
        });
        assert!(!seen.is_empty(), "{what}");
        for (cpu, again) in seen {
            assert!(
                matches!(again, Err(Error::Reentrant { cpu: c, .. }) if c == cpu),
                "{what}: cpu {cpu}: {again:?}"
            );
        }
    }
}

/// A hold through the owner's path (`lock_local`, `BoundSlot::lock`) is recorded only in debug
/// builds: asked for again through a remote run under a drain's deadline, it is refused at once
/// in a debug build and waited for until the deadline in a release build (the crate docs'
/// "Lifecycle and failure" say why).
#[test]
fn an_owner_hold_is_refused_in_debug_and_waited_out_in_release() {
    for (policy, mode) in [
        (Policy::Remote, Mode::Remote),
        (Policy::Fenced, Mode::Fenced),
    ] {
        for bound_slot in [false, true] {
            let what =
                format!("{mode} mode, drain under the owner's hold (bound slot {bound_slot})");
            let policy = policy.clone();
            let (cpu, report) = watched(&what.clone(), move || {
                let (qpw, cpu, state, work) = counted(policy);
                let binding = qpw.bind_current(cpu).unwrap();
                let slot = state.bound_slot(&binding).unwrap();
                let held = if bound_slot {
                    slot.lock()
                } else {
                    state.lock_local().unwrap()
                };
                let report = work.drain_all_timeout(|c| c == cpu, Duration::from_millis(50));
                drop(held);
                (cpu, report)
            });
            let expected = if cfg!(debug_assertions) {
                matches!(report.errors[..], [Error::Reentrant { cpu: c, .. }] if c == cpu)
            } else {
                matches!(report.errors[..], [Error::LockStall { cpu: c, .. }] if c == cpu)
            };
            assert!(expected, "{what}: {report:?}");
        }
    }
}
