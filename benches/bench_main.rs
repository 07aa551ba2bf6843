//! The qpw criterion benches: one binary, one module per topic, every measurement next to the
//! baseline that qualifies it, all in the same run (STYLE 18).
//!
//! | module | bench (issue 6) | groups |
//! |---|---|---|
//! | [`local`] | 1. the local fast path against a bare thread-local and a bare atomic lock, with issue 7's rseq and owner-only paths | `local` |
//! | [`drain`] | 2. one requester draining every CPU, queue vs remote, 1-128 CPUs | `drain_counter`, `drain_memcg`, `drain_lru` |
//! | [`under_load`] | 3. drains while every CPU loops its fast path, and the fast path while drains happen | `under_load_drain`, `under_load_fastpath` |
//! | [`resctrl`] | 4. a pass over 750 counter files per read path, and the setup apart | `resctrl` |
//! | [`pool`] | 5. hackbench messages/s through each buffer-pool design, 2-16 threads; 5b. the hook alone, 1-4 threads | `pool`, `pool_hook` |
//! | [`reentry`] | 9. the release build's re-entrancy check on the requester's `lock`, against the same call without it (issue 31) | `reentry` |
//! | [`cid`] | 10. state per concurrency id against per-CPU state: the owner's operation and a drain's walk (issue 41) | `cid` |
//!
//! Run everything:
//!
//! ```sh
//! export CARGO_TARGET_DIR=/work/target-bench
//! cargo bench -p qpw-benches --bench bench_main
//! cargo run -p qpw-benches --bin ratios     # the Markdown tables of docs/results.md
//! ```
//!
//! **Quick mode**: `QPW_BENCH_QUICK=1 cargo bench -p qpw-benches --bench bench_main` shrinks
//! every group to 100 ms of warm-up, 300 ms of measurement and 10 samples, so that the whole
//! suite runs in a few minutes: a smoke check, not a measurement. Criterion's usual filters
//! work too (`cargo bench -p qpw-benches --bench bench_main -- drain_memcg`).
//!
//! Scale sweeps use logical CPUs (`CpuSpec::Logical`) multiplexed onto the machine's cores,
//! and the reports say so; the fast-path and under-load benches use the physical CPUs.

use criterion::{criterion_group, criterion_main, Criterion};

mod caches;
mod cid;
mod drain;
mod floor;
mod local;
mod pool;
mod reentry;
mod resctrl;
mod under_load;

fn config() -> Criterion {
    let timing = qpw_benches::Timing::slow_path();
    Criterion::default()
        .warm_up_time(timing.warm_up)
        .measurement_time(timing.measurement)
        .sample_size(timing.samples)
}

criterion_group! {
    name = benches;
    config = config();
    targets = local::bench, drain::bench, under_load::bench, resctrl::bench, pool::bench,
        reentry::bench, cid::bench
}
criterion_main!(benches);

/// Applies `timing` to a group.
fn configure(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    timing: qpw_benches::Timing,
) {
    group
        .warm_up_time(timing.warm_up)
        .measurement_time(timing.measurement)
        .sample_size(timing.samples);
}
