//! The per-CPU caches the drain benches drain: a plain per-CPU counter made with qpw-core
//! only, and the real mm workloads (memcg stock, LRU batches) through their common
//! [`Workload`] interface.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use qpw_core::{PerCpu, PerCpuWork, Qpw};
use qpw_workloads::{Workload, WorkloadKind, WorkloadOptions};

/// Process-context operations per CPU that fill a workload's cache before a drain (any
/// non-empty cache is drained whole; a few operations make every CPU's non-empty).
const FILL_OPS: usize = 4;

/// Pages a counter "stock" holds before a drain (the memcg charge batch, 64).
const COUNTER_FILL: u64 = 64;

/// How a bench makes its cache on an instance.
pub(crate) type MakeCache = dyn Fn(&Qpw) -> Cache;

/// A cache that every CPU fills on its fast path and a requester drains.
pub(crate) enum Cache {
    /// A per-CPU `u64` drained into a global sum: qpw-core only, no workload logic.
    Counter {
        stock: Arc<PerCpu<u64>>,
        sink: Arc<AtomicU64>,
        work: PerCpuWork,
    },
    /// An mm workload from qpw-workloads.
    Workload(Arc<dyn Workload>),
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cache::Counter { .. } => f.write_str("Cache::Counter"),
            Cache::Workload(w) => write!(f, "Cache::Workload({})", w.name()),
        }
    }
}

impl Cache {
    /// The per-CPU counter: the drain moves each CPU's count into one global atomic.
    pub(crate) fn counter(qpw: &Qpw) -> Self {
        let (stock, sink, work) = counter_parts(qpw, Arc::new(qpw.per_cpu(|_| 0u64)));
        Cache::Counter { stock, sink, work }
    }

    /// An mm workload with the kernel's default sizes (`qpw_workloads::build`).
    pub(crate) fn workload(kind: WorkloadKind, qpw: &Qpw) -> Self {
        let workload = qpw_workloads::build(kind, qpw, &WorkloadOptions::default())
            .expect("the workload is built");
        Cache::Workload(workload)
    }

    /// The memcg charge stock (`mm/memcontrol.c`).
    pub(crate) fn memcg(qpw: &Qpw) -> Self {
        Self::workload(WorkloadKind::Memcg, qpw)
    }

    /// The LRU folio batches (`mm/swap.c`).
    pub(crate) fn lru(qpw: &Qpw) -> Self {
        Self::workload(WorkloadKind::Lru, qpw)
    }

    /// One fast-path operation on the calling thread's CPU (the thread is bound, or the
    /// instance is physical): an increment under the local lock, or the workload's process
    /// operation (charge a page, add a folio).
    #[inline]
    pub(crate) fn local_op(&self) {
        match self {
            Cache::Counter { stock, .. } => {
                if let Ok(mut local) = stock.lock_local() {
                    *local += 1;
                }
            }
            Cache::Workload(w) => {
                let _ = w.process_op();
            }
        }
    }

    /// Makes every CPU's cache non-empty, from the calling thread (outside any timing).
    pub(crate) fn fill(&self, qpw: &Qpw) {
        match self {
            Cache::Counter { stock, .. } => stock.for_each_locked(|_, n| *n += COUNTER_FILL),
            Cache::Workload(w) => {
                // Visit the CPUs grouped by the physical CPU they run on, so that the thread
                // migrates once per physical CPU, not once per logical one.
                let mut cpus: Vec<(usize, usize)> = qpw
                    .cpus()
                    .iter()
                    .map(|cpu| (qpw.physical_cpu(cpu).expect("managed"), cpu))
                    .collect();
                cpus.sort_unstable();
                for (_, cpu) in cpus {
                    let _bound = qpw.bind_current(cpu).expect("bind to a managed CPU");
                    for _ in 0..FILL_OPS {
                        w.process_op()
                            .expect("a process operation on a bound thread");
                    }
                }
            }
        }
    }

    /// One drain of every CPU (queue and flush, or run remotely), waiting for all of it;
    /// returns how many CPUs it left alone (0 unless the bench is broken). A workload's drain
    /// is forced (`drain(true, None)`): it never skips the whole drain and reaches every CPU;
    /// a requester that has a CPU of the instance drains its own directly, as the kernel's
    /// `drain_local_stock` does. Panics if a CPU's drain failed.
    #[inline]
    pub(crate) fn drain(&self) -> usize {
        match self {
            Cache::Counter { work, .. } => {
                let report = work.drain_all(|_| true);
                assert!(report.is_complete(), "drain failed: {:?}", report.errors);
                report.skipped.len()
            }
            Cache::Workload(w) => {
                let outcome = w.drain(true, None);
                assert!(
                    outcome.errors.is_empty() && !outcome.skipped,
                    "drain failed: {outcome:?}"
                );
                outcome.skipped_cpus
            }
        }
    }

    /// What the counter's drains have collected so far (0 for a workload): read once at the
    /// end so that the drains cannot be optimised away.
    pub(crate) fn drained_total(&self) -> u64 {
        match self {
            Cache::Counter { sink, .. } => sink.load(Ordering::Relaxed),
            Cache::Workload(_) => 0,
        }
    }
}

/// The sink and the drain work item of a per-CPU counter.
fn counter_parts(
    qpw: &Qpw,
    stock: Arc<PerCpu<u64>>,
) -> (Arc<PerCpu<u64>>, Arc<AtomicU64>, PerCpuWork) {
    let sink = Arc::new(AtomicU64::new(0));
    let (s, k) = (stock.clone(), sink.clone());
    let work = qpw
        .work(move |ctx| {
            let Ok(mut local) = s.lock_work(ctx) else {
                return; // a remote run past its drain's deadline: the drain reports it
            };
            k.fetch_add(*local, Ordering::Relaxed);
            *local = 0;
        })
        .expect("the drain work item is made");
    (stock, sink, work)
}
