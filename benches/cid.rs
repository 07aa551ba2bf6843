//! Issue 41, state per concurrency id ([`PerCid`](qpw_core::PerCid)) against per-CPU state, in
//! one run (group `cid`):
//!
//! | bench | what |
//! |---|---|
//! | `owner/atomic_lock` | the baseline: a bare uncontended atomic lock and an increment |
//! | `owner/percpu_remote` | `PerCpu::lock_local` + increment, remote mode (a `FairLock` per CPU), unbound thread |
//! | `owner/per_cid` | `PerCid::lock_local` + increment (a `FairLock` per id) |
//! | `drain/percpu/<cpus>` | one requester's `take_each` over a `PerCpu` of that many CPUs (logical CPUs multiplexed onto this machine's, as a host of that size would have) |
//! | `drain/per_cid/<threads>` | the same walk over a `PerCid` that that many threads have used: the ids they ran with |
//!
//! The walks' counts (slots made, slots visited per drain) are printed to stderr beside the
//! times: on a 2-CPU machine `mm_cid` gives at most 2 ids however many threads run.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};

use criterion::{BenchmarkId, Criterion};
use qpw_benches::Timing;
use qpw_core::{CpuSpec, Policy, Qpw};

use crate::local::looped;

/// The group's name.
pub(crate) const CID: &str = "cid";

/// The drains' sizes: CPUs of the per-CPU state, and threads that used the per-id state.
const SIZES: [usize; 4] = [1, 2, 4, 8];
/// A host's CPU count for the per-CPU walk beside 8 threads: what issue 41's example has.
const HOST_CPUS: usize = 256;

pub(crate) fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group(CID);
    crate::configure(&mut group, Timing::fast_path());

    let word = AtomicBool::new(false);
    let mut counter = 0u64;
    group.bench_function("owner/atomic_lock", |b| {
        b.iter_custom(|iters| {
            looped(iters, || {
                while word
                    .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_err()
                {}
                counter += 1;
                word.store(false, Ordering::Release);
            })
        })
    });
    black_box(counter);

    let qpw = Qpw::with_policy(Policy::Remote).expect("an instance of the allowed CPUs");
    let percpu = qpw.per_cpu(|_| 0u64);
    group.bench_function("owner/percpu_remote", |b| {
        b.iter_custom(|iters| looped(iters, || *percpu.lock_local().unwrap() += 1))
    });
    let per_cid = qpw.per_cid(|_| 0u64);
    group.bench_function("owner/per_cid", |b| {
        b.iter_custom(|iters| looped(iters, || *per_cid.lock_local().unwrap() += 1))
    });

    crate::configure(&mut group, Timing::slow_path());
    for cpus in SIZES.into_iter().chain([HOST_CPUS]) {
        let qpw = Qpw::builder()
            .cpus(CpuSpec::Logical(cpus))
            .policy(Policy::Remote)
            .build()
            .expect("a logical instance");
        let state = qpw.per_cpu(|_| 0u64);
        group.bench_with_input(BenchmarkId::new("drain/percpu", cpus), &cpus, |b, _| {
            b.iter_custom(|iters| looped(iters, || state.take_each(|_, n| std::mem::take(n))))
        });
        eprintln!("cid: per-CPU state of {cpus} CPUs: {cpus} slots, {cpus} visited per drain");
    }
    for threads in SIZES {
        let state = qpw.per_cid(|_| 0u64);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for _ in 0..1000 {
                        *state.lock_local().unwrap() += 1;
                    }
                });
            }
        });
        group.bench_with_input(
            BenchmarkId::new("drain/per_cid", threads),
            &threads,
            |b, _| {
                b.iter_custom(|iters| looped(iters, || state.take_each(std::mem::take).unwrap()))
            },
        );
        eprintln!(
            "cid: per-id state used by {threads} threads ({}): {} slots made, {} ids walked, \
             {} bytes",
            qpw_core::cid::status(),
            state.slots(),
            state.ids(),
            state.memory()
        );
    }
    group.finish();
}
