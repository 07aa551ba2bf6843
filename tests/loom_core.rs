//! Loom models of qpw-core's protocols. Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p qpw-tests --test loom_core`
//! (see `.ci/loom`).
//!
//! The world is shrunk to one or two logical CPUs and one item per thread: the protocols do
//! not depend on how many CPUs or items there are, only on how two parties interleave. Loom
//! allows five threads, the main one included, and each queue-mode CPU brings its worker.

#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

use qpw_core::{CpuSpec, Error, Policy, Qpw};

fn instance(cpus: usize, policy: Policy) -> Qpw {
    Qpw::builder()
        .cpus(CpuSpec::Logical(cpus))
        .policy(policy)
        .build()
        .expect("build the instance")
}

/// The owner's `lock_local` against a remote `lock` on the same slot: both updates land, and
/// loom's cell tracking sees no overlapping access.
#[test]
fn loom_local_lock_vs_remote_lock() {
    loom::model(|| {
        let qpw = Arc::new(instance(2, Policy::Remote));
        let slots = Arc::new(qpw.per_cpu(|_| 0u32));
        let owner = {
            let (qpw, slots) = (qpw.clone(), slots.clone());
            thread::spawn(move || {
                let _bound = qpw.bind_current(1).unwrap();
                *slots.lock_local().unwrap() += 1;
            })
        };
        *slots.lock(1).unwrap() += 10;
        owner.join().unwrap();
        let mut total = 0;
        slots.for_each_locked(|_, n| total += *n);
        assert_eq!(total, 11);
    });
}

/// Two producers of one queue-mode CPU each add an item and then queue the drain and flush it.
/// Whatever the interleaving (coalesced while pending, re-queued while running), each
/// producer's flush returns only after a run that saw its item; at the end every item is in
/// the sink exactly once.
#[test]
fn loom_queue_on_flush_with_concurrent_requeue() {
    loom::model(|| {
        let qpw = Arc::new(instance(1, Policy::Queue));
        let cache = Arc::new(qpw.per_cpu(|_| Vec::<u32>::new()));
        let sink = Arc::new(Mutex::new(Vec::<u32>::new()));
        let drain = {
            let (cache, sink) = (cache.clone(), sink.clone());
            Arc::new(
                qpw.work(move |ctx| {
                    let mut local = cache.lock_work(ctx).unwrap();
                    sink.lock().unwrap().append(&mut local);
                })
                .unwrap(),
            )
        };
        let produce = {
            let (qpw, cache, sink, drain) =
                (qpw.clone(), cache.clone(), sink.clone(), drain.clone());
            move |item: u32| {
                let _bound = qpw.bind_current(0).unwrap();
                cache.lock_local().unwrap().push(item);
                drain.queue_on(0).unwrap();
                drain.flush(0).unwrap();
                assert!(
                    sink.lock().unwrap().contains(&item),
                    "flush returned before a run that saw item {item}"
                );
            }
        };
        let other = {
            let produce = produce.clone();
            thread::spawn(move || produce(1))
        };
        produce(2);
        other.join().unwrap();

        let mut all = sink.lock().unwrap().clone();
        all.sort_unstable();
        assert_eq!(all, [1, 2]);
        let mut left = 0;
        cache.for_each_locked(|_, v| left += v.len());
        assert_eq!(left, 0);
    });
}

/// Work queued while the instance shuts down either is refused or runs before the shutdown
/// returns: nothing is dropped silently.
#[test]
fn loom_worker_shutdown_with_pending_work() {
    loom::model(|| {
        let qpw = instance(1, Policy::Queue);
        let runs = Arc::new(AtomicUsize::new(0));
        let work = {
            let runs = runs.clone();
            Arc::new(
                qpw.work(move |_| {
                    runs.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap(),
            )
        };
        assert!(work.queue_on(0).unwrap());
        let racer = {
            let work = work.clone();
            thread::spawn(move || match work.queue_on(0) {
                Ok(true) => 1,
                Ok(false) => 0, // coalesced with the pending run
                Err(Error::ShutDown { cpu: 0 }) => 0,
                Err(e) => panic!("unexpected {e}"),
            })
        };
        let report = qpw.shutdown();
        let accepted = racer.join().unwrap();
        // Everything accepted has run by now: the first item, and the racer's if accepted
        // before the stop (an accepted item is queued before the stop, so the worker sees it).
        assert_eq!(runs.load(Ordering::SeqCst), 1 + accepted);
        assert!(report.ran <= 1 + accepted);
    });
}

/// One queue-mode CPU and one remote-mode CPU in the same instance: owners of both CPUs add
/// items while a requester drains all; every item ends in the sink exactly once.
#[test]
fn loom_queue_and_remote_cpus_in_one_instance() {
    loom::model(|| {
        let qpw = Arc::new(instance(2, Policy::RemoteOn("1".parse().unwrap())));
        let cache = Arc::new(qpw.per_cpu(|_| Vec::<u32>::new()));
        let sink = Arc::new(Mutex::new(Vec::<u32>::new()));
        let drain = {
            let (cache, sink) = (cache.clone(), sink.clone());
            qpw.work(move |ctx| {
                let mut local = cache.lock_work(ctx).unwrap();
                sink.lock().unwrap().append(&mut local);
            })
            .unwrap()
        };
        let owners: Vec<_> = [0usize, 1]
            .into_iter()
            .map(|cpu| {
                let (qpw, cache) = (qpw.clone(), cache.clone());
                thread::spawn(move || {
                    let _bound = qpw.bind_current(cpu).unwrap();
                    cache.lock_local().unwrap().push(cpu as u32 + 1);
                })
            })
            .collect();
        let report = drain.drain_all(|_| true);
        assert!(report.is_complete());
        assert_eq!(report.queued.to_string(), "0");
        assert_eq!(report.ran_remote.to_string(), "1");
        for owner in owners {
            owner.join().unwrap();
        }
        // A final drain picks up whatever the first one came too early for.
        assert!(drain.drain_all(|_| true).is_complete());
        let mut all = sink.lock().unwrap().clone();
        all.sort_unstable();
        assert_eq!(all, [1, 2]);
    });
}

/// `shutdown` racing a remote-mode `queue_on` (issue 13, case 1): the run is either refused
/// with `ShutDown`, or accepted and finished by the time `shutdown` returns. Never a run after
/// the shutdown, never one lost, and a `queue_on` after it is refused.
#[test]
fn loom_shutdown_races_remote_queue_on() {
    loom::model(|| {
        let qpw = instance(1, Policy::Remote);
        let runs = Arc::new(AtomicUsize::new(0));
        let work = {
            let runs = runs.clone();
            qpw.work(move |_| {
                runs.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap()
        };
        let racer = {
            let work = work.clone();
            thread::spawn(move || match work.queue_on(0) {
                Ok(true) => 1,
                Err(Error::ShutDown { cpu: 0 }) => 0,
                other => panic!("unexpected {other:?}"),
            })
        };
        let report = qpw.shutdown();
        let seen_at_return = runs.load(Ordering::SeqCst);
        let accepted = racer.join().unwrap();
        assert_eq!(
            seen_at_return, accepted,
            "an accepted remote run finishes before shutdown returns; a refused one never runs"
        );
        assert_eq!(report.ran, 0, "no worker in remote mode");
        assert_eq!(work.queue_on(0), Err(Error::ShutDown { cpu: 0 }));
        assert_eq!(runs.load(Ordering::SeqCst), accepted);
    });
}
