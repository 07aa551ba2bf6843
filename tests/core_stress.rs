//! Conservation under concurrency: threads bound to every CPU add to their CPU's counter while
//! another thread drains all CPUs again and again; every unit added is counted exactly once,
//! either drained or still in a slot, in every policy.

#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use qpw_core::{CpuSpec, Policy, Qpw};

const ADDS_PER_THREAD: u64 = if cfg!(debug_assertions) {
    300_000
} else {
    2_000_000
};
const THREADS_PER_CPU: usize = 2;

fn stress(qpw: Qpw) {
    let qpw = Arc::new(qpw);
    let counters = Arc::new(qpw.per_cpu(|_| 0u64));
    let drained = Arc::new(AtomicU64::new(0));
    let (c, d) = (counters.clone(), drained.clone());
    let drain = qpw
        .work(move |ctx| {
            let mut local = c.lock_work(ctx).unwrap();
            d.fetch_add(*local, Ordering::Relaxed);
            *local = 0;
        })
        .unwrap();

    let done = Arc::new(AtomicBool::new(false));
    let drainer = {
        let done = done.clone();
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

    let adders: Vec<_> = qpw
        .cpus()
        .iter()
        .flat_map(|cpu| std::iter::repeat_n(cpu, THREADS_PER_CPU))
        .enumerate()
        .map(|(i, cpu)| {
            let (qpw, counters) = (qpw.clone(), counters.clone());
            thread::spawn(move || {
                let _bound = qpw.bind_current(cpu).unwrap();
                for n in 0..ADDS_PER_THREAD {
                    // Mix blocking and non-blocking local acquisitions.
                    if (n + i as u64).is_multiple_of(7) {
                        if let Some(mut slot) = counters.try_lock_local().unwrap() {
                            *slot += 1;
                            continue;
                        }
                    }
                    *counters.lock_local().unwrap() += 1;
                }
            })
        })
        .collect();
    for adder in adders {
        adder.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let rounds = drainer.join().unwrap();
    assert!(rounds > 0);
    eprintln!("{}: {rounds} drain rounds", qpw.describe());

    let mut left = 0;
    counters.for_each_locked(|_, n| left += *n);
    let added = ADDS_PER_THREAD * (qpw.cpus().len() * THREADS_PER_CPU) as u64;
    assert_eq!(
        drained.load(Ordering::Relaxed) + left,
        added,
        "{}: {rounds} drain rounds",
        qpw.describe()
    );
}

#[test]
fn stress_queue() {
    stress(qpw_tests::instance(Policy::Queue));
}

#[test]
fn stress_remote() {
    stress(qpw_tests::instance(Policy::Remote));
}

#[test]
fn stress_isolated() {
    stress(qpw_tests::instance(Policy::Isolated));
}

#[test]
fn stress_logical_mixed() {
    stress(
        Qpw::builder()
            .cpus(CpuSpec::Logical(6))
            .policy(Policy::RemoteOn("1,4-5".parse().unwrap()))
            .build()
            .unwrap(),
    );
}
