//! The owner-only policy (thread-per-core): one owner per CPU's slot, enforced; work queued to
//! a CPU runs on its owner when it polls; flushes wait for that, and report a stall when the
//! owner never polls.

#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::Duration;

use qpw_core::{CpuSpec, Error, OwnedPerCpu, PerCpuWork, Policy, Qpw};

/// A work item that moves a CPU's count into a shared total, run by the CPU's owner; and
/// that total.
fn drain_into_total(slots: &OwnedPerCpu<u64>) -> (PerCpuWork, Arc<AtomicU64>) {
    let total = Arc::new(AtomicU64::new(0));
    let (s, t) = (slots.clone(), total.clone());
    let drain = slots
        .work(move |ctx| {
            let mut local = s.lock_work(ctx).expect("run by the owner");
            t.fetch_add(*local, Ordering::Relaxed);
            *local = 0;
        })
        .unwrap();
    (drain, total)
}

fn instance() -> Qpw {
    Qpw::builder()
        .cpus(CpuSpec::Logical(2))
        .policy(Policy::Queue)
        .build()
        .unwrap()
}

#[test]
fn smoke_owner_reaches_its_slot() {
    let qpw = instance();
    let slots = qpw.owned_per_cpu(|cpu| cpu as u64 * 100).unwrap();
    let mut owner = slots.claim(1).unwrap();
    assert_eq!(owner.cpu(), 1);
    assert_eq!(qpw.current_cpu(), Some(1));
    for _ in 0..10 {
        *owner.lock_local().unwrap() += 1;
    }
    let guard = owner.lock_local().unwrap();
    assert_eq!(qpw_core::OwnedGuard::cpu(&guard), 1);
    assert_eq!(*guard, 110);
    drop(guard);
    assert_eq!(owner.poll(), 0);
    assert!(slots.owner_of(1).unwrap().is_some());
    drop(owner);
    assert_eq!(slots.owner_of(1).unwrap(), None);
    assert_eq!(
        qpw.current_cpu(),
        None,
        "dropping the owner unbinds the thread"
    );
}

#[test]
fn remote_mode_is_refused() {
    let qpw = Qpw::builder()
        .cpus(CpuSpec::Logical(2))
        .policy(Policy::RemoteOn("1".parse().unwrap()))
        .build()
        .unwrap();
    let err = qpw.owned_per_cpu(|_| 0u8).unwrap_err();
    assert!(
        matches!(
            err,
            Error::LockNeedsQueueMode {
                cpu: 1,
                lock: "owner-only",
                mode: qpw_core::Mode::Remote,
            }
        ),
        "{err}"
    );
}

#[test]
fn a_second_owner_is_refused_and_named() {
    let qpw = instance();
    let slots = qpw.owned_per_cpu(|_| 0u32).unwrap();
    let (claimed_tx, claimed_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let first = {
        let slots = slots.clone();
        thread::Builder::new()
            .name("first-owner".into())
            .spawn(move || {
                let owner = slots.claim(0).unwrap();
                claimed_tx.send(()).unwrap();
                release_rx.recv().unwrap();
                drop(owner);
            })
            .unwrap()
    };
    claimed_rx.recv().unwrap();

    // Another thread...
    let err = slots.claim(0).unwrap_err();
    match &err {
        Error::AlreadyOwned { cpu: 0, owner } => assert!(owner.contains("first-owner"), "{err}"),
        other => panic!("unexpected {other}"),
    }
    assert!(err
        .to_string()
        .starts_with("cpu 0 is already owned by thread"));

    // ... and the owner itself, from a second handle.
    release_tx.send(()).unwrap();
    first.join().unwrap();
    let mine = slots.claim(0).unwrap();
    assert!(matches!(
        slots.claim(0),
        Err(Error::AlreadyOwned { cpu: 0, .. })
    ));
    drop(mine);
    assert!(slots.claim(0).is_ok(), "a dropped owner gives the slot up");
}

#[test]
fn a_non_owner_access_is_an_error() {
    let qpw = Arc::new(instance());
    let slots = qpw.owned_per_cpu(|_| 0u32).unwrap();

    // No owner yet: a thread bound to the CPU still may not reach the slot.
    {
        let _bound = qpw.bind_current(1).unwrap();
        let err = slots.lock_local().unwrap_err();
        assert!(
            matches!(
                err,
                Error::NotOwner {
                    cpu: 1,
                    owner: None
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("it has no owner"), "{err}");
    }
    // An unbound thread has no CPU of this (logical) instance at all.
    assert!(matches!(slots.lock_local(), Err(Error::Unbound { .. })));

    // With an owner: a bound non-owner is refused, naming the owner.
    let (claimed_tx, claimed_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let owner_thread = {
        let slots = slots.clone();
        thread::Builder::new()
            .name("the-owner".into())
            .spawn(move || {
                let mut owner = slots.claim(1).unwrap();
                *owner.lock_local().unwrap() += 1;
                claimed_tx.send(()).unwrap();
                release_rx.recv().unwrap();
                let total = *owner.lock_local().unwrap();
                total
            })
            .unwrap()
    };
    claimed_rx.recv().unwrap();
    {
        let _bound = qpw.bind_current(1).unwrap();
        match slots.lock_local() {
            Err(Error::NotOwner {
                cpu: 1,
                owner: Some(owner),
            }) => assert!(owner.contains("the-owner"), "{owner}"),
            other => panic!("unexpected {other:?}"),
        }
    }
    // A work item of the instance, run by the CPU's worker thread, is not the owner either.
    let seen = Arc::new(std::sync::Mutex::new(None));
    let work = {
        let (slots, seen) = (slots.clone(), seen.clone());
        qpw.work(move |ctx| {
            *seen.lock().unwrap() = Some(slots.lock_work(ctx).map(|_| ()));
        })
        .unwrap()
    };
    work.queue_on(1).unwrap();
    work.flush(1).unwrap();
    let outcome = seen.lock().unwrap().take().unwrap();
    assert!(
        matches!(
            outcome,
            Err(Error::NotOwner {
                cpu: 1,
                owner: Some(_)
            })
        ),
        "{outcome:?}"
    );

    release_tx.send(()).unwrap();
    assert_eq!(
        owner_thread.join().unwrap(),
        1,
        "no one else touched the slot"
    );
}

/// Work queued to an owned CPU runs on the owner, at its next poll, under its ownership; the
/// flush before that times out as a stall, the flush after it returns.
#[test]
fn queued_work_runs_at_the_owners_next_poll() {
    let qpw = instance();
    let slots = qpw.owned_per_cpu(|_| Vec::<u32>::new()).unwrap();
    let sink = Arc::new(std::sync::Mutex::new(Vec::new()));
    let ran_on = Arc::new(std::sync::Mutex::new(Vec::new()));
    let drain = Arc::new({
        let (slots, sink, ran_on) = (slots.clone(), sink.clone(), ran_on.clone());
        slots
            .clone()
            .work(move |ctx| {
                ran_on
                    .lock()
                    .unwrap()
                    .push((ctx.cpu(), thread::current().name().map(str::to_string)));
                let mut local = slots.lock_work(ctx).expect("run by the owner");
                sink.lock().unwrap().append(&mut local);
            })
            .unwrap()
    });
    assert!(drain.is_queued(0).unwrap());

    let step = Arc::new(Barrier::new(2));
    let owner_thread = {
        let (slots, step) = (slots.clone(), step.clone());
        thread::Builder::new()
            .name("owner-0".into())
            .spawn(move || {
                let mut owner = slots.claim(0).unwrap();
                owner.lock_local().unwrap().extend([1, 2, 3]);
                step.wait(); // 1: filled
                step.wait(); // 2: the drain is queued and has stalled once
                let ran = owner.poll();
                step.wait(); // 3: polled
                owner.lock_local().unwrap().push(4);
                step.wait(); // 4: filled again
                step.wait(); // 5: queued again
                let left = owner.lock_local().unwrap().len(); // runs what waits first
                (ran, left)
            })
            .unwrap()
    };

    step.wait(); // 1
    assert!(drain.queue_on(0).unwrap());
    assert!(!drain.queue_on(0).unwrap(), "coalesced while pending");
    let err = drain
        .flush_timeout(0, Duration::from_millis(50))
        .unwrap_err();
    assert!(matches!(err, Error::Stall { cpu: 0, .. }), "{err}");
    assert!(
        sink.lock().unwrap().is_empty(),
        "nothing ran before the poll"
    );
    step.wait(); // 2
    step.wait(); // 3
    drain.flush(0).unwrap();
    assert_eq!(*sink.lock().unwrap(), [1, 2, 3]);
    step.wait(); // 4
    assert!(drain.queue_on(0).unwrap());
    step.wait(); // 5
    drain.flush(0).unwrap();
    let (ran, left) = owner_thread.join().unwrap();
    assert_eq!(ran, 1);
    assert_eq!(left, 0);
    assert_eq!(*sink.lock().unwrap(), [1, 2, 3, 4]);
    for (cpu, name) in ran_on.lock().unwrap().iter() {
        assert_eq!(*cpu, 0);
        assert_eq!(name.as_deref(), Some("owner-0"), "ran on the owner itself");
    }
}

/// An owner that never polls: every flush with a timeout reports the stall, naming the CPU,
/// and a drain of all CPUs completes the polled CPU and reports the other.
#[test]
fn flush_reports_a_stall_when_the_owner_never_polls() {
    let qpw = instance();
    let slots: OwnedPerCpu<u64> = qpw.owned_per_cpu(|_| 5).unwrap();
    let (drain, drained) = drain_into_total(&slots);
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let owners: Vec<_> = [0usize, 1]
        .into_iter()
        .map(|cpu| {
            let (slots, stop, ready_tx) = (slots.clone(), stop.clone(), ready_tx.clone());
            thread::spawn(move || {
                let mut owner = slots.claim(cpu).unwrap();
                ready_tx.send(()).unwrap();
                // cpu 0 polls; cpu 1 is busy with something else and never does.
                while !stop.load(Ordering::Relaxed) {
                    if cpu == 0 {
                        owner.poll();
                    }
                    thread::sleep(Duration::from_millis(1));
                }
            })
        })
        .collect();
    ready_rx.recv().unwrap();
    ready_rx.recv().unwrap();

    drain.queue_on(1).unwrap();
    let err = drain
        .flush_timeout(1, Duration::from_millis(100))
        .unwrap_err();
    match err {
        Error::Stall {
            cpu: 1,
            waited,
            timeout,
        } => {
            assert!(waited >= timeout);
            assert_eq!(timeout, Duration::from_millis(100));
        }
        other => panic!("unexpected {other}"),
    }
    // cpu 0's owner polls every millisecond, but a busy machine may not run it within a short
    // deadline: then the drain reports cpu 0 too, and is tried again with a deadline four
    // times longer (up to about a minute in all, far beyond any machine's delay). Every try
    // must report cpu 1, whose owner never polls; the one that ends must report only it.
    let mut timeout = Duration::from_millis(200);
    let report = loop {
        let report = drain.drain_all_timeout(|_| true, timeout);
        assert_eq!(report.queued.to_string(), "0-1");
        assert!(
            report
                .errors
                .iter()
                .any(|e| matches!(e, Error::Stall { cpu: 1, .. })),
            "{report:?}"
        );
        let cpu0_stalled = report
            .errors
            .iter()
            .any(|e| matches!(e, Error::Stall { cpu: 0, .. }));
        if !cpu0_stalled || timeout >= Duration::from_secs(40) {
            break report;
        }
        eprintln!("cpu 0's owner did not poll within {timeout:?}; again, longer");
        timeout *= 4;
    };
    assert_eq!(report.errors.len(), 1, "{report:?}");
    assert!(matches!(report.errors[0], Error::Stall { cpu: 1, .. }));
    assert_eq!(drained.load(Ordering::Relaxed), 5, "cpu 0's owner polled");

    stop.store(true, Ordering::Relaxed);
    for owner in owners {
        owner.join().unwrap();
    }
}

/// Owners on every CPU add to their slots and poll; a requester drains all CPUs over and over.
/// Every unit added is drained exactly once.
#[test]
fn stress_owners_and_drains_conserve() {
    const ADDS: u64 = if cfg!(debug_assertions) {
        200_000
    } else {
        2_000_000
    };
    let qpw = instance();
    let slots = qpw.owned_per_cpu(|_| 0u64).unwrap();
    let (drain, drained) = drain_into_total(&slots);
    let drain = Arc::new(drain);
    let done = Arc::new(AtomicBool::new(false));
    let drainer = {
        let (drain, done) = (drain.clone(), done.clone());
        thread::spawn(move || {
            let mut rounds = 0u64;
            while !done.load(Ordering::Relaxed) {
                let report = drain.drain_all_timeout(|_| true, Duration::from_secs(30));
                assert!(report.is_complete(), "{:?}", report.errors);
                rounds += 1;
            }
            rounds
        })
    };
    let finished = Arc::new(AtomicU64::new(0));
    let served = Arc::new(AtomicBool::new(false));
    let owners: Vec<_> = [0usize, 1]
        .into_iter()
        .map(|cpu| {
            let (slots, served, finished) = (slots.clone(), served.clone(), finished.clone());
            thread::spawn(move || {
                let mut owner = slots.claim(cpu).unwrap();
                for _ in 0..ADDS {
                    *owner.lock_local().unwrap() += 1;
                }
                // Keep serving the drains until the drainer has stopped.
                finished.fetch_add(1, Ordering::Relaxed);
                while !served.load(Ordering::Relaxed) {
                    owner.poll();
                    thread::yield_now();
                }
                owner.poll();
                let left = *owner.lock_local().unwrap();
                left
            })
        })
        .collect();
    while finished.load(Ordering::Relaxed) < 2 {
        thread::sleep(Duration::from_millis(1));
    }
    done.store(true, Ordering::Relaxed);
    let rounds = drainer.join().unwrap();
    served.store(true, Ordering::Relaxed);
    let left: u64 = owners.into_iter().map(|o| o.join().unwrap()).sum();
    assert!(rounds > 0);
    assert_eq!(drained.load(Ordering::Relaxed) + left, 2 * ADDS);
}

/// A shutdown closes the owners' mailboxes as it stops the workers: work queued afterwards is
/// refused with `ShutDown` naming the CPU, while an item posted before it is counted in the
/// report, still runs at its owner's next poll, and its flush completes.
#[test]
fn shutdown_closes_the_mailboxes() {
    let qpw = instance();
    let slots: OwnedPerCpu<u64> = qpw.owned_per_cpu(|_| 3).unwrap();
    let (drain, drained) = drain_into_total(&slots);
    let mut owner = slots.claim(1).unwrap();
    assert!(drain.queue_on(1).unwrap());

    let report = qpw.shutdown();
    assert_eq!(report.left_for_owners, 1, "{report:?}");
    assert_eq!(report.ran, 0, "no worker runs a mailbox");
    let err = drain.queue_on(0).unwrap_err();
    assert!(matches!(err, Error::ShutDown { cpu: 0 }), "{err}");
    assert!(err.to_string().contains("cpu 0"), "{err}");
    // A work item made after the shutdown is refused too.
    let late = slots.work(|_| ()).unwrap();
    assert!(matches!(late.queue_on(1), Err(Error::ShutDown { cpu: 1 })));

    assert_eq!(drained.load(Ordering::Relaxed), 0);
    assert_eq!(
        owner.poll(),
        1,
        "the item posted before the shutdown still runs"
    );
    drain.flush(1).unwrap();
    assert_eq!(drained.load(Ordering::Relaxed), 3);
    assert_eq!(*owner.lock_local().unwrap(), 0);
}
