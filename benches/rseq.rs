//! Issue 7, the fast local paths, each next to the baselines its acceptance names, all in one
//! group (`rseq_fast_paths`) so that the ratios come from one run:
//!
//! | function | what | compared with |
//! |---|---|---|
//! | `tls_cell` | baseline: a bare thread-local `Cell` increment | |
//! | `atomic_lock` | baseline: a bare atomic lock (CAS to take, release store to drop) + increment | |
//! | `rseq_cpu` | baseline: the bare rseq `cpu_id` read (`qpw_core::rseq::current_cpu`) | |
//! | `rseq_lock` | a bare `RseqLock` of the caller's (pinned) CPU + increment | `atomic_lock`: at most 1.0x |
//! | `percpu_rseq_unbound` | `PerCpu<u64, RseqLock>::lock_local` + increment + unlock, unbound thread | `rseq_cpu + atomic_lock`: at most 1.3x |
//! | `percpu_fair_unbound` | the same with the default `FairLock` | (for reference) |
//! | `owner_local` | `Owner::lock_local` + increment (owner-only policy) | `tls_cell`: at most 1.5x |
//!
//! Alone: `cargo bench -p qpw-benches --bench bench_main -- rseq_fast_paths`. Measured once on
//! the development VM (criterion medians, 2 cores, other builds running): `rseq_lock` 0.57x
//! `atomic_lock`, `percpu_rseq_unbound` 0.84x `rseq_cpu + atomic_lock`, `owner_local` 1.44x
//! `tls_cell`.

use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};

use criterion::Criterion;
use qpw_benches::Timing;
use qpw_core::{CpuSpec, Policy, Qpw, RawLocalLock, RseqLock};

/// The group's name.
pub(crate) const GROUP: &str = "rseq_fast_paths";

thread_local! {
    static COUNTER: Cell<u64> = const { Cell::new(0) };
}

/// The bare atomic lock: compare-and-swap to take, a release store to drop.
struct SpinWord(AtomicBool);

impl SpinWord {
    #[inline]
    fn lock(&self) {
        while self
            .0
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
    }

    #[inline]
    fn unlock(&self) {
        self.0.store(false, Ordering::Release);
    }
}

pub(crate) fn bench(c: &mut Criterion) {
    let timing = Timing::fast_path();
    let mut group = c.benchmark_group(GROUP);
    group
        .warm_up_time(timing.warm_up)
        .measurement_time(timing.measurement)
        .sample_size(timing.samples);
    eprintln!("{GROUP}: {}", qpw_core::rseq::status());

    group.bench_function("tls_cell", |b| {
        b.iter(|| COUNTER.with(|c| c.set(black_box(c.get()) + 1)))
    });

    let word = SpinWord(AtomicBool::new(false));
    let mut n = 0u64;
    group.bench_function("atomic_lock", |b| {
        b.iter(|| {
            word.lock();
            n = black_box(n) + 1;
            word.unlock();
        })
    });

    // `b.iter` black-boxes the result itself: a second `black_box` around the 16-byte
    // `Option<usize>` inflated this read several times over (see `local.rs`).
    group.bench_function("rseq_cpu", |b| b.iter(qpw_core::rseq::current_cpu));

    let qpw = Qpw::builder()
        .cpus(CpuSpec::Allowed)
        .policy(Policy::Queue)
        .build()
        .expect("a queue-mode instance over the allowed CPUs");
    let cpu = qpw.cpus().iter().next().expect("at least one allowed CPU");

    // The bare rseq lock must run on its own CPU (elsewhere it takes the fenced path).
    {
        let _bound = qpw.bind_current(cpu).expect("bind to an allowed CPU");
        let lock = RseqLock::for_cpu(cpu);
        let mut n = 0u64;
        group.bench_function("rseq_lock", |b| {
            b.iter(|| {
                lock.lock();
                n = black_box(n) + 1;
                // SAFETY: taken on the line above by this thread, released once.
                unsafe { lock.unlock() };
            })
        });
    }

    let rseq = qpw
        .per_cpu_with::<RseqLock, _>(|_| 0u64)
        .expect("an rseq-locked PerCpu in queue mode");
    group.bench_function("percpu_rseq_unbound", |b| {
        b.iter(|| {
            *rseq
                .lock_local()
                .expect("a thread of a physical instance has a CPU") += 1
        })
    });
    let fair = qpw.per_cpu(|_| 0u64);
    group.bench_function("percpu_fair_unbound", |b| {
        b.iter(|| {
            *fair
                .lock_local()
                .expect("a thread of a physical instance has a CPU") += 1
        })
    });

    let owned = qpw
        .owned_per_cpu(|_| 0u64)
        .expect("an owner-only PerCpu in queue mode");
    {
        let mut owner = owned.claim(cpu).expect("claim an allowed CPU");
        group.bench_function("owner_local", |b| {
            b.iter(|| *owner.lock_local().expect("the owner's own slot") += 1)
        });
    }

    group.finish();
}
