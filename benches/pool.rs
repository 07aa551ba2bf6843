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

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use qpw_benches::{pool_shape, pool_stats_path, Timing, POOL, POOL_THREADS};
use qpw_core::{CpuSpec, Policy, Qpw};
use qpw_workloads::pool::{
    build, hackbench, Design, HackbenchConfig, PoolStats, Transport, HACKBENCH_DATASIZE,
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
    fn record(&self, design: Design, threads: usize) {
        if self.runs == 0 {
            return;
        }
        let line = format!(
            "{} {} {} {} {}\n",
            self.runs, self.contention, self.local_hits, self.remote_returns, self.gets
        );
        eprintln!(
            "{POOL}/{design}/{threads}: runs contention local_hits remote_returns gets = {}",
            line.trim()
        );
        let file = pool_stats_path(&qpw_benches::criterion_dir(), design.name(), threads);
        let saved = file
            .parent()
            .map(|dir| std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&file, &line)));
        if !matches!(saved, Some(Ok(()))) {
            eprintln!("could not record the pool counters in {}", file.display());
        }
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
        for design in Design::ALL {
            let mut totals = Totals::default();
            group.bench_with_input(BenchmarkId::new(design.name(), threads), &(), |b, _| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let pool = build(design, &qpw, BUFFER_SIZE, CAPACITY, PER_CPU)
                            .expect("a pool is built");
                        let report = hackbench(&qpw, &*pool, &config).expect("a hackbench run");
                        assert_eq!(report.corrupt, 0, "{design}: a buffer used twice");
                        if let Err(reason) = pool.check_conservation() {
                            panic!("{design}: conservation broken: {reason}");
                        }
                        totals.add(&report.stats);
                        total += report.elapsed;
                    }
                    total
                })
            });
            totals.record(design, threads);
        }
    }
    group.finish();
}
