//! Bench 9 (issue 31): what the release build's re-entrancy check costs a requester.
//!
//! `PerCpu::lock` of a remote-mode CPU now looks in the thread's list of the locks it holds
//! through a requester's guard, adds its guard there, and takes it out at the drop
//! (`qpw-core/src/held.rs`). The baseline is the same call without the list,
//! `PerCpu::lock_unrecorded` (a hidden method that is `lock` as it was before issue 31): the
//! same state, the same CPU, the same loop, in the same run, so that the ratio is the list's
//! cost and nothing else. Uncontended, from one thread, on logical CPUs (no pinning needed:
//! remote mode lets any thread take any CPU's lock): the cheapest requester's path there is,
//! so the ratio is the largest the check can make (a drain adds a work call and a gate, a
//! fenced CPU a flag and a fence, to the same absolute cost).
//!
//! Two pairs: with no other requester's guard alive (the list is empty: one load and a test),
//! and with one alive, of another per-CPU state (the check scans the list).

use criterion::Criterion;
use qpw_benches::{Timing, REENTRY};
use qpw_core::{CpuSpec, Policy, Qpw};

use crate::local::looped;

pub(crate) fn bench(c: &mut Criterion) {
    let qpw = Qpw::builder()
        .cpus(CpuSpec::Logical(2))
        .policy(Policy::Remote)
        .build()
        .expect("a remote-mode instance of two logical CPUs");
    let state = qpw.per_cpu(|_| 0u64);
    let other = qpw.per_cpu(|_| 0u64);
    let mut group = c.benchmark_group(REENTRY);
    crate::configure(&mut group, Timing::fast_path());
    group.bench_function("lock_unrecorded", |b| {
        b.iter_custom(|iters| {
            looped(iters, || {
                *state.lock_unrecorded(1).expect("cpu 1's lock") += 1;
            })
        })
    });
    group.bench_function("lock", |b| {
        b.iter_custom(|iters| {
            looped(iters, || {
                *state.lock(1).expect("cpu 1's lock") += 1;
            })
        })
    });
    group.bench_function("lock_unrecorded_one_held", |b| {
        let _held = other
            .lock_unrecorded(0)
            .expect("cpu 0's lock of another state");
        b.iter_custom(|iters| {
            looped(iters, || {
                *state.lock_unrecorded(1).expect("cpu 1's lock") += 1;
            })
        })
    });
    group.bench_function("lock_one_held", |b| {
        let _held = other.lock(0).expect("cpu 0's lock of another state");
        b.iter_custom(|iters| {
            looped(iters, || {
                *state.lock(1).expect("cpu 1's lock") += 1;
            })
        })
    });
    group.finish();
}
