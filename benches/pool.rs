//! Bench 5, the buffer pool (seed 004, AppArmor): hackbench-style messaging through each pool
//! design at 2, 4, 8 and 16 threads, each message holding a pool buffer from the sender's get
//! to the receiver's put. One iteration is one whole run on a fresh pool; criterion's
//! throughput is messages per second.
//!
//! The threads are bound round-robin to the machine's physical CPUs (two here), so 16 threads
//! means 8 per core: contention on the global lock then comes as much from a preempted holder
//! as from CPUs racing, which is the userspace hazard the brief names.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use qpw_benches::{pool_shape, Timing, POOL, POOL_THREADS};
use qpw_core::{CpuSpec, Policy, Qpw};
use qpw_workloads::pool::{build, hackbench, Design, HackbenchConfig, HACKBENCH_DATASIZE};

/// AppArmor's buffer: 2 x `PATH_MAX`.
const BUFFER_SIZE: usize = 8192;
/// The most buffers the global designs may allocate (the figures' default).
const CAPACITY: usize = 4096;
/// Buffers per CPU for the per-CPU pools (the figures' default).
const PER_CPU: usize = 64;

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
        };
        group.throughput(Throughput::Elements(config.messages()));
        for design in Design::ALL {
            group.bench_with_input(BenchmarkId::new(design.name(), threads), &(), |b, _| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let pool = build(design, &qpw, BUFFER_SIZE, CAPACITY, PER_CPU)
                            .expect("a pool is built");
                        let report = hackbench(&qpw, &*pool, &config).expect("a hackbench run");
                        assert_eq!(report.corrupt, 0, "{design}: corrupt messages");
                        if let Err(reason) = pool.check_conservation() {
                            panic!("{design}: conservation broken: {reason}");
                        }
                        total += report.elapsed;
                    }
                    total
                })
            });
        }
    }
    group.finish();
}
