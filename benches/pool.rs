//! Bench 5, the buffer pool (seed 004, AppArmor): hackbench through real pipes at 2, 4, 8 and
//! 16 threads, every `write` and every `read` running AppArmor's file-permission hook first,
//! which gets a pool buffer, writes the file's name into it, matches it and puts it back on the
//! same CPU, on each pool design. One iteration is one whole run on a fresh pool (40000
//! messages, 80000 hooks); criterion's throughput is messages per second.
//!
//! The threads are bound round-robin to the machine's physical CPUs (two here), so 16 threads
//! means 8 per core. Beside each median the bench records, per design and thread count, the
//! pool's counters summed over the iterations (`qpw_pool_stats.txt`): above all the global
//! lock's contention (failed trylocks on `aa_buffers_lock`), which drives design 2's per-CPU
//! cache and its adaptive hold.
//!
//! Bench 5b (`pool_hook`) runs the hook alone, back to back on 1, 2 and 4 threads bound to the
//! CPUs, with no system call between: what each design's get and put cost when that is all the
//! CPUs do, which hackbench dilutes in a pipe `write` and `read` per message.

use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, Throughput};
use qpw_benches::{
    pool_shape, pool_stats_path, Timing, POOL, POOL_HOOK, POOL_HOOKS_PER_THREAD, POOL_HOOK_THREADS,
    POOL_THREADS,
};
use qpw_core::{CpuSpec, Policy, Qpw};
use qpw_workloads::pool::{
    build, hackbench, hooks_alone, BufferPool, Design, HackbenchConfig, PoolStats, Transport,
    HACKBENCH_DATASIZE,
};

/// AppArmor's buffer: 2 x `PATH_MAX`.
const BUFFER_SIZE: usize = 8192;
/// The most buffers the global designs may allocate (the figures' default).
const CAPACITY: usize = 4096;
/// Buffers per CPU for the per-CPU pools (the figures' default).
const PER_CPU: usize = 64;

/// The counters of every run of one benchmark, summed.
#[derive(Debug, Default)]
struct Totals {
    runs: u64,
    contention: u64,
    local_hits: u64,
    remote_returns: u64,
    gets: u64,
}

impl Totals {
    fn add(&mut self, s: &PoolStats) {
        self.runs += 1;
        self.contention += s.lock_contention;
        self.local_hits += s.local_hits;
        self.remote_returns += s.remote_returns;
        self.gets += s.gets;
    }

    /// Saves the totals beside criterion's estimates, for the `ratios` report (not when the
    /// benchmark did not run, filtered out: the last run's record stays).
    fn record(&self, group: &str, design: Design, threads: usize) {
        if self.runs == 0 {
            return;
        }
        let line = format!(
            "{} {} {} {} {}\n",
            self.runs, self.contention, self.local_hits, self.remote_returns, self.gets
        );
        eprintln!(
            "{group}/{design}/{threads}: runs contention local_hits remote_returns gets = {}",
            line.trim()
        );
        let file = pool_stats_path(&qpw_benches::criterion_dir(), group, design.name(), threads);
        let saved = file
            .parent()
            .map(|dir| std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&file, &line)));
        if !matches!(saved, Some(Ok(()))) {
            eprintln!("could not record the pool counters in {}", file.display());
        }
    }
}

/// One run on a fresh pool of `design`: its time, the pool's counters, and the hooks whose
/// buffer was used twice.
type Run<'a> = dyn Fn(&dyn BufferPool) -> (Duration, PoolStats, u64) + 'a;

/// Benchmarks `run` on each design at `threads`, a fresh pool per iteration, conservation
/// checked after each (outside the timing), the counters recorded for the report.
fn bench_designs(
    group: &mut BenchmarkGroup<'_, WallTime>,
    qpw: &Qpw,
    name: &str,
    threads: usize,
    run: &Run<'_>,
) {
    for design in Design::ALL {
        let mut totals = Totals::default();
        group.bench_with_input(BenchmarkId::new(design.name(), threads), &(), |b, _| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let pool = build(design, qpw, BUFFER_SIZE, CAPACITY, PER_CPU)
                        .expect("a pool is built");
                    let (elapsed, stats, corrupt) = run(&*pool);
                    assert_eq!(corrupt, 0, "{design}: a buffer used twice");
                    if let Err(reason) = pool.check_conservation() {
                        panic!("{design}: conservation broken: {reason}");
                    }
                    totals.add(&stats);
                    total += elapsed;
                }
                total
            })
        });
        totals.record(name, design, threads);
    }
}

pub(crate) fn bench(c: &mut Criterion) {
    let qpw = Qpw::builder()
        .cpus(CpuSpec::Allowed)
        .policy(Policy::Remote)
        .build()
        .expect("a qpw instance over the allowed CPUs");
    eprintln!("pool: {}", qpw.describe());
    let mut group = c.benchmark_group(POOL);
    crate::configure(&mut group, Timing::slow_path());
    group.sampling_mode(SamplingMode::Flat);
    for threads in POOL_THREADS {
        let (groups, fds, loops) = pool_shape(threads);
        let config = HackbenchConfig {
            groups,
            fds,
            loops,
            datasize: HACKBENCH_DATASIZE,
            transport: Transport::Pipe,
        };
        group.throughput(Throughput::Elements(config.messages()));
        bench_designs(&mut group, &qpw, POOL, threads, &|pool| {
            let report = hackbench(&qpw, pool, &config).expect("a hackbench run");
            (report.elapsed, report.stats, report.corrupt)
        });
    }
    group.finish();

    // 5b: the hook alone, back to back on every CPU.
    let mut group = c.benchmark_group(POOL_HOOK);
    crate::configure(&mut group, Timing::slow_path());
    group.sampling_mode(SamplingMode::Flat);
    for threads in POOL_HOOK_THREADS {
        group.throughput(Throughput::Elements(
            (threads * POOL_HOOKS_PER_THREAD) as u64,
        ));
        bench_designs(&mut group, &qpw, POOL_HOOK, threads, &|pool| {
            let report =
                hooks_alone(&qpw, pool, threads, POOL_HOOKS_PER_THREAD).expect("a run of hooks");
            (report.elapsed, report.stats, report.corrupt)
        });
    }
    group.finish();
}
