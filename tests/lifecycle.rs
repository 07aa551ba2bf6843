//! qpw-core at its edges (issue 13): shutdown, deadlines, re-entrant work, panics, drop order
//! and bad input. One test per case, each run under a watchdog where the old behaviour hung.

#![cfg(not(loom))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::Duration;

use qpw_core::{CpuSet, CpuSpec, Error, PerCpuWork, Policy, Qpw};
use qpw_tests::{within, Gate};

/// Long enough never to fire on a healthy run of this VM, short enough for CI.
const WATCHDOG: Duration = Duration::from_secs(60);

fn logical(n: usize, policy: Policy) -> Qpw {
    Qpw::builder()
        .cpus(CpuSpec::Logical(n))
        .policy(policy)
        .build()
        .unwrap()
}

fn counting_work(qpw: &Qpw) -> (PerCpuWork, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let work = qpw
        .work(move |_| {
            r.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    (work, runs)
}

/// Case 1: after `shutdown` (or the drop of the last handle), remote-mode work is refused
/// like queue-mode work, in `queue_on` and in `drain_all`, and does not run.
#[test]
fn case01_remote_work_after_shutdown_is_refused() {
    let qpw = logical(2, Policy::Remote);
    let (work, runs) = counting_work(&qpw);
    assert!(work.queue_on(1).unwrap());
    qpw.shutdown();
    assert!(qpw.is_shut_down());
    let err = work.queue_on(1).unwrap_err();
    assert_eq!(err, Error::ShutDown { cpu: 1 });
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // The same after the last handle is dropped.
    let qpw = logical(2, Policy::Remote);
    let (work, runs) = counting_work(&qpw);
    let other = qpw.clone();
    drop(qpw);
    assert!(work.queue_on(0).unwrap(), "a handle is still alive");
    drop(other);
    assert_eq!(work.queue_on(0), Err(Error::ShutDown { cpu: 0 }));
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A mixed instance: every CPU refused, none run.
    let qpw = logical(2, Policy::RemoteOn("1".parse().unwrap()));
    let (work, runs) = counting_work(&qpw);
    qpw.shutdown();
    let report = work.drain_all(|_| true);
    assert!(report.ran_remote.is_empty(), "{report:?}");
    assert_eq!(report.errors.len(), 2, "{report:?}");
    assert_eq!(
        report.errors,
        [Error::ShutDown { cpu: 0 }, Error::ShutDown { cpu: 1 }]
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Case 2: `drain_all_timeout` keeps its one deadline in remote mode when the target CPU's lock
/// is held, by another thread or by the caller itself: it returns with a stall for that CPU
/// (the holder lets go only after the drain has returned, so an unkept deadline hangs).
#[test]
fn case02_remote_drain_keeps_its_deadline() {
    within(WATCHDOG, "case02", || {
        let qpw = Arc::new(logical(2, Policy::Remote));
        let stock = qpw.per_cpu(|_| 5u32);
        let s = stock.clone();
        let drain = qpw
            .work(move |ctx| {
                if let Ok(mut n) = s.lock_work(ctx) {
                    *n = 0;
                }
            })
            .unwrap();

        // Another thread of cpu 1 holds its lock until the drain has returned.
        let (gate, held) = (Gate::new(), Gate::new());
        let holder = {
            let (qpw, stock, gate, held) = (qpw.clone(), stock.clone(), gate.clone(), held.clone());
            thread::spawn(move || {
                let _bound = qpw.bind_current(1).unwrap();
                let _guard = stock.lock_local().unwrap();
                held.open();
                gate.wait();
            })
        };
        held.wait();
        let report = drain.drain_all_timeout(|_| true, Duration::from_millis(150));
        gate.open();
        holder.join().unwrap();
        assert_eq!(report.ran_remote.to_string(), "0-1");
        assert!(
            matches!(report.errors[..], [Error::LockStall { cpu: 1, waited, timeout }]
                if waited >= timeout && timeout == Duration::from_millis(150)),
            "{report:?}"
        );
        assert!(report.errors[0].is_stall());
        let mut left = Vec::new();
        stock.read_each(|cpu, n| left.push((cpu, *n)));
        assert_eq!(left, [(0, 0), (1, 5)], "cpu 1's run gave up");

        // The caller itself holds it.
        let guard = stock.lock(1).unwrap();
        let report = drain.drain_all_timeout(|cpu| cpu == 1, Duration::from_millis(100));
        drop(guard);
        assert!(
            matches!(report.errors[..], [Error::LockStall { cpu: 1, .. }]),
            "{report:?}"
        );
        // Without the holder, the same drain completes.
        assert!(drain
            .drain_all_timeout(|_| true, Duration::from_secs(30))
            .is_complete());
    });
}

/// Case 3: work that flushes its own CPU (itself, or another item queued to the same CPU) is
/// refused with a clear error instead of deadlocking the worker; the same for owner-only work
/// flushed from the owner's poll. The instance then drops cleanly.
#[test]
fn case03_work_that_flushes_its_own_cpu_is_refused() {
    within(WATCHDOG, "case03", || {
        let qpw = logical(1, Policy::Queue);
        let me: Arc<OnceLock<PerCpuWork>> = Arc::new(OnceLock::new());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (m, s) = (me.clone(), seen.clone());
        let work = qpw
            .work(move |ctx| {
                let outcome = m.get().unwrap().flush(ctx.cpu());
                s.lock().unwrap().push(outcome.map_err(|e| e.to_string()));
            })
            .unwrap();
        let work = me.get_or_init(|| work);
        work.queue_on(0).unwrap();
        work.flush(0).unwrap();
        let outcome = seen.lock().unwrap().pop().unwrap();
        assert_eq!(outcome, Err(Error::SelfFlush { cpu: 0 }.to_string()));

        // Another item, queued to the same CPU by the running one, then flushed.
        let other = qpw.work(|_| ()).unwrap();
        let (o, s) = (other.clone(), seen.clone());
        let outer = qpw
            .work(move |ctx| {
                o.queue_on(ctx.cpu()).unwrap();
                let outcome = o.flush(ctx.cpu());
                s.lock().unwrap().push(outcome.map_err(|e| e.to_string()));
            })
            .unwrap();
        outer.queue_on(0).unwrap();
        outer.flush(0).unwrap();
        other.flush(0).unwrap(); // ran after `outer` returned
        let outcome = seen.lock().unwrap().pop().unwrap();
        assert_eq!(outcome, Err(Error::SelfFlush { cpu: 0 }.to_string()));
        drop(qpw);
    });
}

/// Case 3, owner-only: an item that flushes itself from the owner's poll is refused too.
#[test]
fn case03_owner_work_that_flushes_itself_is_refused() {
    within(WATCHDOG, "case03-owner", || {
        let qpw = logical(1, Policy::Queue);
        let slots = qpw.owned_per_cpu(|_| 0u32).unwrap();
        let me: Arc<OnceLock<PerCpuWork>> = Arc::new(OnceLock::new());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (m, s) = (me.clone(), seen.clone());
        let first = Arc::new(AtomicUsize::new(1));
        let work = slots
            .work(move |ctx| {
                if first.swap(0, Ordering::SeqCst) == 1 {
                    let me = m.get().unwrap();
                    me.queue_on(ctx.cpu()).unwrap(); // pending again: a flush would wait for it
                    s.lock().unwrap().push(me.flush(ctx.cpu()));
                }
            })
            .unwrap();
        let work = me.get_or_init(|| work);
        let mut owner = slots.claim(0).unwrap();
        work.queue_on(0).unwrap();
        assert_eq!(owner.poll(), 2, "the re-queued run ran in the same poll");
        assert_eq!(*seen.lock().unwrap(), [Err(Error::SelfFlush { cpu: 0 })]);
        work.flush(0).unwrap();
        // The same owner, outside a poll, with a run pending: it would wait for itself too.
        work.queue_on(0).unwrap();
        assert_eq!(work.flush(0), Err(Error::SelfFlush { cpu: 0 }));
        assert_eq!(owner.poll(), 1);
        work.flush(0).unwrap();
        drop(owner);
        drop(qpw);
    });
}

/// Case 4: a panic of remote-mode work is reported by the call it happened in (`queue_on`
/// here), and not again by a later, clean drain.
#[test]
fn case04_a_remote_panic_belongs_to_its_call() {
    let qpw = logical(2, Policy::Remote);
    let armed = Arc::new(AtomicUsize::new(1));
    let a = armed.clone();
    let work = qpw
        .work(move |ctx| {
            if a.swap(0, Ordering::SeqCst) == 1 {
                panic!("boom on cpu {}", ctx.cpu());
            }
        })
        .unwrap();
    let err = work.queue_on(1).unwrap_err();
    assert_eq!(
        err,
        Error::WorkPanicked {
            cpu: 1,
            message: "boom on cpu 1".into(),
            runs: 1
        }
    );
    let report = work.drain_all(|_| true);
    assert!(report.is_complete(), "{:?}", report.errors);

    // A panic in a drain's remote run is that drain's, once.
    armed.store(1, Ordering::SeqCst);
    let report = work.drain_all(|_| true);
    assert_eq!(report.ran_remote.to_string(), "0-1");
    assert!(
        matches!(
            &report.errors[..],
            [Error::WorkPanicked {
                cpu: 0,
                runs: 1,
                ..
            }]
        ),
        "{report:?}"
    );
    assert!(work.drain_all(|_| true).is_complete());
}

/// Case 5: dropping the instance while holding a guard that queued work needs returns; the
/// work runs once the guard is released.
#[test]
fn case05_dropping_the_instance_while_holding_a_guard() {
    within(WATCHDOG, "case05", || {
        let qpw = logical(1, Policy::Queue);
        let stock = qpw.per_cpu(|_| 5u32);
        let s = stock.clone();
        let drain = qpw.work(move |ctx| *s.lock_work(ctx).unwrap() = 0).unwrap();
        let bound = qpw.bind_current(0).unwrap();
        let guard = stock.lock_local().unwrap();
        drain.queue_on(0).unwrap();
        drop(qpw);
        assert_eq!(*guard, 5, "the drop returned before the run");
        assert_eq!(drain.queue_on(0), Err(Error::ShutDown { cpu: 0 }));
        drop(guard);
        drain.flush(0).unwrap();
        assert_eq!(*stock.lock_local().unwrap(), 0);
        drop(bound);
    });
}

/// Case 6: the last handle of the instance dropped on one of its own workers: no panic, the
/// run completes.
#[test]
fn case06_dropping_the_last_handle_on_its_own_worker() {
    within(WATCHDOG, "case06", || {
        let holder: Arc<Mutex<Option<Qpw>>> = Arc::new(Mutex::new(None));
        let qpw = logical(1, Policy::Queue);
        let h = holder.clone();
        let work = qpw.work(move |_| drop(h.lock().unwrap().take())).unwrap();
        *holder.lock().unwrap() = Some(qpw);
        work.queue_on(0).unwrap();
        assert_eq!(work.flush(0), Ok(()), "the drop did not panic");
        assert!(holder.lock().unwrap().is_none());
        assert_eq!(work.queue_on(0), Err(Error::ShutDown { cpu: 0 }));

        // An explicit shutdown from the worker: it does not wait for itself either.
        let qpw = logical(2, Policy::Queue);
        let seen = Arc::new(Mutex::new(None));
        let (q, s) = (qpw.clone(), seen.clone());
        let work = qpw
            .work(move |_| *s.lock().unwrap() = Some(q.shutdown()))
            .unwrap();
        work.queue_on(1).unwrap();
        assert_eq!(work.flush(1), Ok(()));
        let report = seen.lock().unwrap().take().unwrap();
        assert_eq!(report.ran, 0, "{report:?}");
        assert!(qpw.is_shut_down());
    });
}

/// Case 8: bindings dropped out of order leave the thread as it was before the first.
#[test]
fn case08_bindings_dropped_out_of_order() {
    let qpw = logical(2, Policy::Queue);
    let before = qpw_core::current_affinity().unwrap();
    let b0 = qpw.bind_current(0).unwrap();
    let b1 = qpw.bind_current(1).unwrap();
    drop(b0);
    assert_eq!(qpw.current_cpu(), Some(1), "the newest binding still holds");
    drop(b1);
    assert_eq!(qpw.current_cpu(), None);
    assert_eq!(qpw_core::current_affinity().unwrap(), before);
}

/// Case 8, owner claims: two claims by one thread given up out of order.
#[test]
fn case08_owner_claims_dropped_out_of_order() {
    let qpw = logical(2, Policy::Queue);
    let before = qpw_core::current_affinity().unwrap();
    let slots = qpw.owned_per_cpu(|_| 0u32).unwrap();
    let o0 = slots.claim(0).unwrap();
    let o1 = slots.claim(1).unwrap();
    drop(o0);
    assert_eq!(qpw.current_cpu(), Some(1));
    drop(o1);
    assert_eq!(qpw.current_cpu(), None);
    assert_eq!(qpw_core::current_affinity().unwrap(), before);
}

/// Case 9: a `remote:<list>` policy naming CPUs the instance does not manage is refused.
#[test]
fn case09_remote_on_an_unmanaged_cpu_is_refused() {
    let err = Qpw::builder()
        .cpus(CpuSpec::Logical(2))
        .policy(Policy::RemoteOn("1,7".parse().unwrap()))
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "policy `remote:1,7` names cpu 7, which is not in the managed set 0-1: list only \
         managed CPUs"
    );
    assert!(matches!(err, Error::PolicyCpuNotManaged { cpu: 7, .. }));
}

/// Case 10: a sysfs root is read only by the policies that need the topology.
#[test]
fn case10_sysfs_root_is_read_only_when_needed() {
    let missing = std::env::temp_dir().join("qpw-no-such-sysfs-root");
    for policy in [
        Policy::Queue,
        Policy::Remote,
        Policy::RemoteOn(CpuSet::new()),
    ] {
        Qpw::builder()
            .cpus(CpuSpec::Logical(2))
            .policy(policy.clone())
            .sysfs_root(&missing)
            .build()
            .unwrap_or_else(|e| panic!("{policy}: {e}"));
    }
}

/// Case 10: `WorkCtx::is_remote` and `Qpw::is_cpu_remote` give the same answer inside a run.
#[test]
fn case10_is_remote_agrees_with_is_cpu_remote() {
    let qpw = logical(2, Policy::Remote);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (q, s) = (qpw.clone(), seen.clone());
    let work = qpw
        .work(move |ctx| {
            let other = q.is_cpu_remote(ctx.cpu()).unwrap();
            s.lock().unwrap().push((ctx.is_remote(), other));
        })
        .unwrap();
    work.queue_on(1).unwrap(); // an unbound caller: remote
    {
        let _bound = qpw.bind_current(1).unwrap();
        work.queue_on(1).unwrap(); // a thread of cpu 1: not remote
    }
    let seen = seen.lock().unwrap();
    assert_eq!(*seen, [(true, true), (false, false)]);
}

/// Case 10: re-locking the same CPU inside remote work waits for itself; under a drain's
/// deadline the run gives up at the deadline instead of deadlocking.
#[test]
fn case10_relocking_inside_remote_work_stalls_under_a_deadline() {
    within(WATCHDOG, "case10-relock", || {
        let qpw = logical(2, Policy::Remote);
        let stock = qpw.per_cpu(|_| 0u32);
        let s = stock.clone();
        let work = qpw
            .work(move |ctx| {
                let _first = s.lock_work(ctx).unwrap();
                assert!(s.lock_work(ctx).is_err());
            })
            .unwrap();
        let report = work.drain_all_timeout(|cpu| cpu == 1, Duration::from_millis(100));
        assert!(
            matches!(report.errors[..], [Error::LockStall { cpu: 1, .. }]),
            "{report:?}"
        );
    });
}

/// Case 10: `is_cpu_remote` of a CPU the instance does not manage is an error, not `false`.
#[test]
fn case10_is_cpu_remote_of_an_unmanaged_cpu_is_an_error() {
    let qpw = logical(2, Policy::Remote);
    assert_eq!(qpw.is_cpu_remote(1), Ok(true));
    assert_eq!(
        qpw.is_cpu_remote(99),
        Err(Error::CpuNotManaged {
            cpu: 99,
            managed: "0-1".parse().unwrap()
        })
    );
}

/// Case 10: `lock_local` from a thread running on a CPU the instance does not manage says
/// that it is the caller's CPU.
#[test]
fn case10_lock_local_from_an_unmanaged_cpu_names_the_caller() {
    let allowed = qpw_core::allowed_cpus().unwrap();
    if allowed.len() < 2 {
        eprintln!("one CPU allowed: no unmanaged CPU to run on; nothing to test");
        return;
    }
    let (managed, other) = (allowed.as_slice()[0], allowed.as_slice()[1]);
    let qpw = Qpw::builder()
        .cpus(CpuSpec::List(CpuSet::from_iter([managed])))
        .policy(Policy::Queue)
        .build()
        .unwrap();
    let stock = qpw.per_cpu(|_| 0u32);
    let text = thread::scope(|scope| {
        scope
            .spawn(|| {
                qpw_core::pin_current_thread(other).unwrap();
                stock.lock_local().unwrap_err().to_string()
            })
            .join()
            .unwrap()
    });
    assert_eq!(
        text,
        Error::CallerNotManaged {
            cpu: other,
            managed: CpuSet::from_iter([managed])
        }
        .to_string()
    );
    assert!(
        text.starts_with(&format!("the calling thread runs on cpu {other}")),
        "{text}"
    );
}
