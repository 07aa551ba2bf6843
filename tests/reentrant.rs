//! A thread that holds a CPU's lock and asks for it again (issue 24): in debug builds every
//! guard records its thread and call site, and the second request is an [`Error::Reentrant`]
//! naming the CPU and both call sites instead of a wait for itself. Each case runs under a
//! watchdog: on the code before the check it hung (remote and fenced mode, and queue mode for
//! a second `lock` in the worker), and so does the test of every lock kind.
//!
//! (a) work that holds its CPU's lock through `lock_work` and calls `lock(ctx.cpu())`;
//! (b) work that holds it and queues itself on `ctx.cpu()`: in remote and fenced mode the
//!     nested run happens at once, in the same thread, and its `lock_work` is refused, which
//!     the nested `queue_on` reports; in queue mode it is posted to the worker, after this run.
//!
//! Release builds do not record holders (the owner's path stays as it was): there the same code
//! waits, as a `Mutex` would, and the crate docs say so. So these tests run in debug builds,
//! which is what `cargo test --workspace` builds.

#![cfg(all(not(loom), debug_assertions))]

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use qpw_core::{Error, Mode, PerCpu, Policy, Qpw};

/// How long a case may take before it counts as hung.
const WATCHDOG: Duration = Duration::from_secs(20);

/// Runs `case` on its own thread; a case that does not answer within [`WATCHDOG`] hung.
fn watched<R: Send + 'static>(what: &str, case: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(case());
    });
    rx.recv_timeout(WATCHDOG)
        .unwrap_or_else(|_| panic!("{what}: hung (no answer in {WATCHDOG:?})"))
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

/// A guard's drop forgets its thread: taking the lock again afterwards is fine, and another
/// thread holding it is not the caller.
#[test]
fn a_released_lock_or_another_threads_hold_is_no_reentry() {
    let qpw = Qpw::with_policy(Policy::Remote).unwrap();
    let cpu = qpw.cpus().iter().last().unwrap();
    let state: PerCpu<u64> = qpw.per_cpu(|_| 0);
    drop(state.lock(cpu).unwrap());
    *state.lock(cpu).unwrap() += 1;
    let other = {
        let state = state.clone();
        std::thread::spawn(move || {
            let _held = state.lock(cpu).unwrap();
            std::thread::sleep(Duration::from_millis(50));
        })
    };
    std::thread::sleep(Duration::from_millis(10));
    // Held by the other thread: this waits for it rather than being refused.
    assert_eq!(*state.lock(cpu).unwrap(), 1);
    other.join().unwrap();
}

/// The record is kept by the per-CPU slot, not by the lock, so every lock kind refuses a
/// second request of its holder: each of the four under a worker of a queue-mode CPU (the one
/// mode every kind works in; `RseqLock` may only be taken by its own CPU's threads), holding
/// the slot through `lock_work` and asking again through `lock_local`.
#[test]
fn every_lock_kind_refuses_its_holder() {
    fn case<L: qpw_core::RawLocalLock + Send + Sync + 'static>(kind: &'static str) {
        let what = format!("{kind}, lock_local inside lock_work");
        let again = watched(&what.clone(), move || {
            let qpw = Qpw::with_policy(Policy::Queue).unwrap();
            let cpu = qpw.cpus().iter().last().unwrap();
            let state: PerCpu<u64, L> = qpw.per_cpu_with::<L, _>(|_| 0).unwrap();
            let seen = Arc::new(Mutex::new(None));
            let work = {
                let (state, seen) = (state.clone(), seen.clone());
                qpw.work(move |ctx| {
                    let _held = state.lock_work(ctx).unwrap();
                    let again = state.lock_local().map(|_| ());
                    *seen.lock().unwrap() = Some((ctx.cpu(), again));
                })
                .unwrap()
            };
            work.queue_on(cpu).unwrap();
            work.flush(cpu).unwrap();
            let again = seen.lock().unwrap().take();
            again
        });
        match again {
            Some((cpu, Err(Error::Reentrant { cpu: c, .. }))) => assert_eq!(c, cpu, "{what}"),
            other => panic!("{what}: {other:?}"),
        }
    }
    case::<qpw_core::FairLock>("FairLock");
    case::<qpw_core::RseqLock>("RseqLock");
    case::<qpw_core::FencedLock>("FencedLock");
    case::<qpw_core::PwLock>("PwLock");
}
