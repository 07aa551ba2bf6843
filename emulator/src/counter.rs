//! `counter`: the emulator's built-in minimal workload.
//!
//! It is not a kernel subsystem; it exists so that the probes and experiments can run, and be
//! tested, with a real drain through `qpw_core` whatever state the kernel-style workloads of
//! `qpw-workloads` are in. Its shape is theirs, reduced to one number:
//!
//! - each CPU caches a count of "pages" charged locally, under that CPU's local lock
//!   ([`PerCpu::lock_local`], the kernel's `pw_lock_local`);
//! - when the cache reaches [`BATCH`] it is flushed to a global total (a shared lock, as a full
//!   LRU batch goes to `lru_lock`);
//! - a requester drain moves every CPU's cached count to the global total with a per-CPU work
//!   item ([`Qpw::work`], `pw_queue_on` + `pw_flush`): queued to the CPU's worker in queue mode,
//!   run by the requester under the CPU's lock in remote mode.
//!
//! Conservation: every operation is counted once, either in a CPU's cache or in the global
//! total.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use qpw_core::{PerCpu, PerCpuWork, Qpw};
use qpw_workloads::{CpuCounters, DrainOutcome, Workload};

/// Cached operations at which a CPU flushes its cache itself (the LRU's folio batch size,
/// `FOLIO_BATCH_SIZE = 31`, borrowed for flavour).
pub const BATCH: u64 = 31;

#[derive(Debug, Default)]
struct Cache {
    cached: u64,
    ops: u64,
}

#[derive(Debug, Default)]
struct Stats {
    drains_remote: AtomicU64,
    drains_queued: AtomicU64,
    drains_skipped: AtomicU64,
}

/// The built-in minimal workload.
pub struct Counter {
    cache: Arc<PerCpu<Cache>>,
    /// Whether each CPU's cache holds anything: read without the lock by the requester, as the
    /// kernel peeks at `folio_batch_count()` before queuing a drain.
    nonempty: Arc<Vec<AtomicBool>>,
    global: Arc<Mutex<u64>>,
    drain: PerCpuWork,
    stats: Arc<Vec<Stats>>,
    /// Index of each CPU in the per-CPU vectors.
    cpus: Vec<usize>,
    drain_lock: Mutex<()>,
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counter")
            .field("cpus", &self.cpus)
            .finish_non_exhaustive()
    }
}

impl Counter {
    /// A counter cache on every CPU of `qpw`.
    pub fn new(qpw: &Qpw) -> qpw_core::Result<Self> {
        let cpus: Vec<usize> = qpw.cpus().iter().collect();
        let cache = Arc::new(qpw.per_cpu(|_| Cache::default()));
        let nonempty: Arc<Vec<AtomicBool>> =
            Arc::new(cpus.iter().map(|_| AtomicBool::new(false)).collect());
        let global = Arc::new(Mutex::new(0u64));
        let index = cpus.clone();
        let (c, n, g) = (cache.clone(), nonempty.clone(), global.clone());
        let drain = qpw.work(move |ctx| {
            // Take the CPU's cache under its lock and move it to the global total.
            let Ok(mut local) = c.lock_work(ctx) else {
                return; // a remote run past its drain's deadline: the drain reports it
            };
            let moved = std::mem::take(&mut local.cached);
            if let Ok(i) = index.binary_search(&ctx.cpu()) {
                n[i].store(false, Ordering::Relaxed);
            }
            drop(local);
            *g.lock().unwrap_or_else(|e| e.into_inner()) += moved;
        })?;
        let stats = Arc::new(cpus.iter().map(|_| Stats::default()).collect());
        Ok(Self {
            cache,
            nonempty,
            global,
            drain,
            stats,
            cpus,
            drain_lock: Mutex::new(()),
        })
    }

    fn index(&self, cpu: usize) -> Option<usize> {
        self.cpus.binary_search(&cpu).ok()
    }
}

impl Workload for Counter {
    fn name(&self) -> &'static str {
        "counter"
    }

    fn process_op(&self) -> qpw_core::Result<()> {
        let mut local = self.cache.lock_local()?;
        local.ops += 1;
        local.cached += 1;
        let cpu = qpw_core::PerCpuGuard::cpu(&local);
        // Is the cache full? Yes: flush it to the global total ourselves.
        let flushed = if local.cached >= BATCH {
            std::mem::take(&mut local.cached)
        } else {
            0
        };
        if let Some(i) = self.index(cpu) {
            self.nonempty[i].store(local.cached > 0, Ordering::Relaxed);
        }
        drop(local);
        if flushed > 0 {
            *self.global.lock().unwrap_or_else(|e| e.into_inner()) += flushed;
        }
        Ok(())
    }

    fn drain(&self, force: bool, timeout: Option<Duration>) -> DrainOutcome {
        // One drain at a time, as `lru_add_drain_all` serialises on its mutex.
        let _serial = self.drain_lock.lock().unwrap_or_else(|e| e.into_inner());
        let needs = |cpu: usize| {
            let i = self.index(cpu);
            let needed = force || i.is_some_and(|i| self.nonempty[i].load(Ordering::Relaxed));
            if !needed {
                if let Some(i) = i {
                    self.stats[i].drains_skipped.fetch_add(1, Ordering::Relaxed);
                }
            }
            needed
        };
        let report = match timeout {
            Some(t) => self.drain.drain_all_timeout(needs, t),
            None => self.drain.drain_all(needs),
        };
        for cpu in report.queued.iter() {
            if let Some(i) = self.index(cpu) {
                self.stats[i].drains_queued.fetch_add(1, Ordering::Relaxed);
            }
        }
        for cpu in report.ran_remote.iter() {
            if let Some(i) = self.index(cpu) {
                self.stats[i].drains_remote.fetch_add(1, Ordering::Relaxed);
            }
        }
        DrainOutcome::from_report(report)
    }

    fn counters(&self) -> Vec<CpuCounters> {
        let mut out: Vec<CpuCounters> = Vec::with_capacity(self.cpus.len());
        self.cache.for_each_locked(|cpu, c| {
            let s = self.index(cpu).map(|i| &self.stats[i]);
            let load = |a: Option<&AtomicU64>| a.map_or(0, |a| a.load(Ordering::Relaxed));
            out.push(CpuCounters {
                cpu,
                local_ops: c.ops,
                drains_remote: load(s.map(|s| &s.drains_remote)),
                drains_queued: load(s.map(|s| &s.drains_queued)),
                drains_skipped: load(s.map(|s| &s.drains_skipped)),
                stranded: 0,
            });
        });
        out
    }

    fn check_conservation(&self) -> Result<(), String> {
        let mut ops = 0;
        let mut cached = 0;
        self.cache.for_each_locked(|_, c| {
            ops += c.ops;
            cached += c.cached;
        });
        let global = *self.global.lock().unwrap_or_else(|e| e.into_inner());
        if ops == global + cached {
            Ok(())
        } else {
            Err(format!(
                "counter: {ops} operations, but {global} in the global total and {cached} cached"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qpw_core::{CpuSpec, Policy};

    fn exercise(policy: Policy) {
        let qpw = Qpw::builder()
            .cpus(CpuSpec::Logical(2))
            .policy(policy)
            .build()
            .unwrap();
        let w = Counter::new(&qpw).unwrap();
        for cpu in 0..2 {
            let _b = qpw.bind_current(cpu).unwrap();
            for _ in 0..(BATCH + 5) {
                w.process_op().unwrap();
            }
        }
        w.check_conservation().unwrap();
        let out = w.drain(false, Some(Duration::from_secs(5)));
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        assert_eq!(out.queued + out.ran_remote, 2);
        w.check_conservation().unwrap();
        // Now empty: an unforced drain skips both CPUs, a forced one reaches both.
        let out = w.drain(false, None);
        assert_eq!(out.skipped_cpus, 2);
        let out = w.drain(true, None);
        assert_eq!(out.queued + out.ran_remote, 2);
        let c = w.counters();
        assert_eq!(c[0].local_ops, BATCH + 5);
        assert_eq!(c[1].drains_skipped, 1);
        w.check_conservation().unwrap();
    }

    #[test]
    fn drains_conserve_in_queue_mode() {
        exercise(Policy::Queue);
    }

    #[test]
    fn drains_conserve_in_remote_mode() {
        exercise(Policy::Remote);
    }
}
