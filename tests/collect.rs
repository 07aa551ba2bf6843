//! `Qpw::collector` (issue 23): what each CPU's run takes is returned to the collection, once.
//! Threads bound to every CPU add to their CPU's counter while another thread collects again
//! and again; every unit added is either collected exactly once or still in its slot at the
//! end, in queue, remote and fenced mode.

#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use qpw_core::{Policy, Qpw};

const ADDS_PER_THREAD: u64 = if cfg!(debug_assertions) {
    200_000
} else {
    1_000_000
};

fn conserved(policy: Policy) {
    let qpw = Arc::new(Qpw::with_policy(policy.clone()).unwrap());
    let counters = qpw.per_cpu(|_| 0u64);
    let collector = Arc::new(
        qpw.collector(&counters, |_cpu, n| std::mem::take(n))
            .unwrap(),
    );
    let done = Arc::new(AtomicBool::new(false));
    let collecting = {
        let (done, collector) = (done.clone(), collector.clone());
        thread::spawn(move || {
            let (mut total, mut rounds) = (0u64, 0u64);
            while !done.load(Ordering::Relaxed) {
                let (taken, report) = collector.collect_timeout(Duration::from_secs(30));
                assert!(report.is_complete(), "{:?}", report.errors);
                let mut cpus: Vec<usize> = taken.iter().map(|(cpu, _)| *cpu).collect();
                cpus.dedup();
                assert_eq!(cpus.len(), taken.len(), "one value per CPU and collection");
                total += taken.iter().map(|(_, n)| n).sum::<u64>();
                rounds += 1;
            }
            (total, rounds)
        })
    };
    let adders: Vec<_> = qpw
        .cpus()
        .iter()
        .map(|cpu| {
            let (qpw, counters) = (qpw.clone(), counters.clone());
            thread::spawn(move || {
                let _bound = qpw.bind_current(cpu).unwrap();
                for _ in 0..ADDS_PER_THREAD {
                    *counters.lock_local().unwrap() += 1;
                }
            })
        })
        .collect();
    for a in adders {
        a.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let (mut total, rounds) = collecting.join().unwrap();
    let (last, report) = collector.collect_timeout(Duration::from_secs(30));
    assert!(report.is_complete(), "{:?}", report.errors);
    total += last.iter().map(|(_, n)| n).sum::<u64>();
    assert_eq!(
        total,
        ADDS_PER_THREAD * qpw.cpus().len() as u64,
        "{policy:?}: collected over {rounds} collections"
    );
}

#[test]
fn collected_exactly_once_in_queue_mode() {
    conserved(Policy::Queue);
}

#[test]
fn collected_exactly_once_in_remote_mode() {
    conserved(Policy::Remote);
}

#[test]
fn collected_exactly_once_in_fenced_mode() {
    conserved(Policy::Fenced);
}
