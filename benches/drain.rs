//! Bench 2, drain all: one requester drains every CPU, the whole drain timed (queue and flush
//! in queue mode; the remote runs in remote mode; for the counter also fenced mode, issue 15:
//! remote runs under each CPU's `FencedLock`), over 1 to 128 CPUs.
//!
//! The CPUs are logical ones (`CpuSpec::Logical`) multiplexed onto the machine's cores: at 128
//! CPUs on a 2-core machine, queue mode has 128 worker threads sharing 2 cores, which is not
//! what 128 real CPUs would see (there each kworker has its own core). The caches are filled
//! before every drain, outside the timing, so that every drain has work on every CPU.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode};
use qpw_benches::{Timing, DRAIN_COUNTER, DRAIN_CPUS, DRAIN_LRU, DRAIN_MEMCG, QUEUE_SCHEDULE_ONLY};
use qpw_core::{CpuSpec, Policy, Qpw};

use crate::caches::{Cache, MakeCache};

fn logical(n: usize, policy: Policy) -> Qpw {
    Qpw::builder()
        .cpus(CpuSpec::Logical(n))
        .policy(policy)
        .build()
        .expect("a qpw instance over logical CPUs")
}

/// Times `iters` drains of `cache`, each after a fill; returns the drain time only.
pub(crate) fn time_drains(qpw: &Qpw, cache: &Cache, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        cache.fill(qpw);
        let start = Instant::now();
        let left_alone = cache.drain();
        total += start.elapsed();
        assert_eq!(left_alone, 0, "a drain left CPUs out");
    }
    total
}

/// Times only the posting of `iters` drains of the counter (queue mode): the work is queued to
/// every CPU's worker inside the timing and flushed outside it, as the kernel's queue-side
/// `drain_all_stock` figure counted only the scheduling.
fn time_schedule_only(qpw: &Qpw, cache: &Cache, iters: u64) -> Duration {
    let Cache::Counter { work, .. } = cache else {
        unreachable!("scheduling-only timing is for the counter");
    };
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        cache.fill(qpw);
        let start = Instant::now();
        for cpu in qpw.cpus().iter() {
            work.queue_on(cpu).expect("queue to a managed CPU");
        }
        total += start.elapsed();
        for cpu in qpw.cpus().iter() {
            work.flush(cpu).expect("flush a managed CPU");
        }
    }
    total
}

fn sweep(c: &mut Criterion, group_name: &str, make: &MakeCache, schedule_only: bool) {
    let mut group = c.benchmark_group(group_name);
    crate::configure(&mut group, Timing::slow_path());
    group.sampling_mode(SamplingMode::Flat);
    for n in DRAIN_CPUS {
        for (mode, policy) in [("queue", Policy::Queue), ("remote", Policy::Remote)] {
            let qpw = logical(n, policy);
            let cache = make(&qpw);
            group.bench_with_input(BenchmarkId::new(mode, n), &n, |b, _| {
                b.iter_custom(|iters| time_drains(&qpw, &cache, iters))
            });
            if schedule_only && mode == "queue" {
                group.bench_with_input(BenchmarkId::new(QUEUE_SCHEDULE_ONLY, n), &n, |b, _| {
                    b.iter_custom(|iters| time_schedule_only(&qpw, &cache, iters))
                });
            }
            black_box(cache.drained_total());
        }
        if schedule_only {
            // The counter in fenced mode (issue 15): the drain runs in the requester, as in
            // remote mode, under each CPU's `FencedLock` (a fence of the CPU per lock taken
            // off the requester's own physical CPU).
            let qpw = logical(n, Policy::Fenced);
            let cache = Cache::counter(&qpw);
            group.bench_with_input(BenchmarkId::new("fenced", n), &n, |b, _| {
                b.iter_custom(|iters| time_drains(&qpw, &cache, iters))
            });
            black_box(cache.drained_total());
        }
    }
    group.finish();
}

pub(crate) fn bench(c: &mut Criterion) {
    eprintln!(
        "drain: logical CPUs multiplexed onto {} physical CPU(s)",
        qpw_core::allowed_cpus().map_or(0, |s| s.len())
    );
    sweep(c, DRAIN_COUNTER, &Cache::counter, true);
    sweep(c, DRAIN_MEMCG, &Cache::memcg, false);
    sweep(c, DRAIN_LRU, &Cache::lru, false);
}
