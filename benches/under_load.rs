//! Bench 3, a remote drain under local load, on the machine's physical CPUs:
//!
//! - `under_load_drain`: one drain of every CPU, timed, with every CPU idle (`idle`) and with a
//!   thread bound to every CPU running its local fast path in a loop (`loaded`); the requester
//!   is the bench thread, unbound, so it shares the cores with the loops.
//! - `under_load_fastpath`: the local fast path, timed on the last CPU by a thread bound
//!   there, with no drains (`idle`) and while a requester pinned to the first CPU drains every
//!   CPU back to back (`loaded`). In queue mode the interference is the last CPU's worker
//!   preempting the loop; in remote mode it is the requester taking the loop's lock and cache
//!   line from the other CPU.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode};
use qpw_benches::{Timing, IDLE, LOADED, UNDER_LOAD_DRAIN, UNDER_LOAD_FAST_PATH};
use qpw_core::{CpuSpec, Policy, Qpw};

use crate::caches::{Cache, MakeCache};

fn physical(policy: Policy) -> Qpw {
    Qpw::builder()
        .cpus(CpuSpec::Allowed)
        .policy(policy)
        .build()
        .expect("a qpw instance over the allowed CPUs")
}

/// Drain time, idle and with every CPU looping its fast path.
fn drain_under_load(c: &mut Criterion, target: &str, make: &MakeCache) {
    let mut group = c.benchmark_group(UNDER_LOAD_DRAIN);
    crate::configure(&mut group, Timing::slow_path());
    group.sampling_mode(SamplingMode::Flat);
    for (mode, policy) in [("queue", Policy::Queue), ("remote", Policy::Remote)] {
        let qpw = physical(policy);
        let cache = make(&qpw);
        let function = format!("{target}_{mode}");
        group.bench_with_input(BenchmarkId::new(&function, IDLE), &(), |b, _| {
            b.iter_custom(|iters| crate::drain::time_drains(&qpw, &cache, iters))
        });

        let stop = AtomicBool::new(false);
        thread::scope(|s| {
            for cpu in qpw.cpus().iter() {
                let (qpw, cache, stop) = (&qpw, &cache, &stop);
                s.spawn(move || {
                    let _bound = qpw.bind_current(cpu).expect("bind a loader");
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..64 {
                            cache.local_op();
                        }
                    }
                });
            }
            group.bench_with_input(BenchmarkId::new(&function, LOADED), &(), |b, _| {
                b.iter_custom(|iters| crate::drain::time_drains(&qpw, &cache, iters))
            });
            stop.store(true, Ordering::Relaxed);
        });
    }
    group.finish();
}

/// The fast path on the last CPU, with and without back-to-back drains from the first.
fn fast_path_under_drains(c: &mut Criterion, target: &str, make: &MakeCache) {
    let mut group = c.benchmark_group(UNDER_LOAD_FAST_PATH);
    crate::configure(&mut group, Timing::fast_path());
    for (mode, policy) in [("queue", Policy::Queue), ("remote", Policy::Remote)] {
        let qpw = physical(policy);
        let cpus = qpw.cpus().as_slice().to_vec();
        let (Some(&housekeeping), Some(&measured)) = (cpus.first(), cpus.last()) else {
            continue;
        };
        if housekeeping == measured {
            eprintln!(
                "{UNDER_LOAD_FAST_PATH}: one CPU only; the requester shares it with the loop"
            );
        }
        let cache = make(&qpw);
        let function = format!("{target}_{mode}");
        let (stop, draining) = (AtomicBool::new(false), AtomicBool::new(false));
        let drains = AtomicU64::new(0);
        thread::scope(|s| {
            let (cache, stop, draining, drains) = (&cache, &stop, &draining, &drains);
            s.spawn(move || {
                qpw_core::pin_current_thread(housekeeping).expect("pin the requester");
                while !stop.load(Ordering::Relaxed) {
                    if draining.load(Ordering::Relaxed) {
                        cache.drain();
                        drains.fetch_add(1, Ordering::Relaxed);
                    } else {
                        thread::sleep(Duration::from_millis(1));
                    }
                }
            });

            let _bound = qpw
                .bind_current(measured)
                .expect("bind the measured thread");
            let time_ops = |iters: u64| {
                let start = Instant::now();
                for _ in 0..iters {
                    cache.local_op();
                }
                start.elapsed()
            };
            group.bench_with_input(BenchmarkId::new(&function, IDLE), &(), |b, _| {
                b.iter_custom(time_ops)
            });
            draining.store(true, Ordering::Relaxed);
            let start = Instant::now();
            group.bench_with_input(BenchmarkId::new(&function, LOADED), &(), |b, _| {
                b.iter_custom(time_ops)
            });
            draining.store(false, Ordering::Relaxed);
            record_drain_rate(&function, drains.load(Ordering::Relaxed), start.elapsed());
            stop.store(true, Ordering::Relaxed);
        });
    }
    group.finish();
}

/// Saves how many drains ran during a loaded fast-path bench (warm-up and analysis included:
/// a rate, not a count per sample), for the `ratios` report; a bench filtered out by the
/// command line has run none and records nothing.
fn record_drain_rate(function: &str, drains: u64, elapsed: Duration) {
    if drains == 0 {
        return;
    }
    let path = qpw_benches::drain_rate_path(&qpw_benches::criterion_dir(), function);
    let line = format!("{drains} {:.3}\n", elapsed.as_secs_f64());
    eprintln!(
        "{UNDER_LOAD_FAST_PATH}/{function}: {drains} drains in {:.2} s",
        elapsed.as_secs_f64()
    );
    if let Some(dir) = path.parent() {
        if std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&path, line))
            .is_err()
        {
            eprintln!("could not record the drain rate in {}", path.display());
        }
    }
}

pub(crate) fn bench(c: &mut Criterion) {
    // The LRU is left out: its loop would grow the global LRU without bound.
    let targets: [(&str, &MakeCache); 2] = [("counter", &Cache::counter), ("memcg", &Cache::memcg)];
    for (target, make) in targets {
        drain_under_load(c, target, make);
        fast_path_under_drains(c, target, make);
    }
}
