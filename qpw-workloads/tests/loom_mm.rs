//! Loom models of the LRU drain, the memcg stock drain (synchronous in remote mode, asynchronous
//! with its FLUSHING bit in queue mode), the SLUB flush and the pcp drain. Run
//! with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p qpw-workloads loom_`.
//!
//! The world is shrunk to two logical CPUs, batches of 2 folios, stocks of 2 slots of 2
//! pages, sheaves of 2 objects flushed one at a time, pcp batches of 2: the drain protocols (generation, mutex, hints, per-CPU work) do not depend on those
//! sizes, only on how the parties interleave. Loom allows five threads, the main one included,
//! and each queue-mode CPU brings its worker, so the models keep at most one queue-mode CPU.
//! Every model drops its `Qpw` inside the model (which joins the workers) and ends in a
//! conservation assertion.

#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;

use qpw_core::{CpuSpec, Policy, Qpw};
use qpw_workloads::lru::{Lru, LruConfig};
use qpw_workloads::memcg::{Memcg, MemcgConfig, StockDrainStrategy, StockDrainWait, UNLIMITED};
use qpw_workloads::pcp::{Pcp, PcpConfig};
use qpw_workloads::slub::{Slub, SlubConfig};
use qpw_workloads::Workload;

fn instance(policy: Policy) -> Arc<Qpw> {
    Arc::new(
        Qpw::builder()
            .cpus(CpuSpec::Logical(2))
            .policy(policy)
            .build()
            .expect("build the instance"),
    )
}

/// Batches of 2 instead of 31: the drain logic does not depend on the size.
fn tiny_lru(qpw: &Qpw) -> Arc<Lru> {
    let config = LruConfig {
        batch_size: 2,
        ..LruConfig::default()
    };
    Arc::new(Lru::new(qpw, config).expect("build the LRU"))
}

/// Runs an LRU model with room for more branches per execution than loom's default 1000: an
/// LRU drain reads three hints per CPU and takes three locks per CPU (the two batch locks and
/// the buffer-head LRU's), and each remote-mode CPU brings the worker of the buffer-head
/// invalidation. No spinning is involved: every wait in qpw-core blocks.
fn lru_model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 20_000;
    builder.check(f);
}

/// Two slots of at most 2 pages instead of 7 of 64, over root -> {1, 2}: the stock and drain
/// logic do not depend on the sizes.
fn tiny_memcg(qpw: &Qpw) -> Arc<Memcg> {
    let config = MemcgConfig {
        stock_slots: 2,
        charge_batch: 2,
        parents: vec![None, Some(0), Some(0)],
        limits: vec![UNLIMITED; 3],
        strategy: StockDrainStrategy::PerCpuWork,
        wait: StockDrainWait::Async,
    };
    Arc::new(Memcg::new(qpw, config).expect("build the memcg tree"))
}

/// Each of two threads adds a folio on its own CPU, leaves the CPU, and calls
/// `lru_add_drain_all`. Whichever drain skips on the generation, each caller finds its folio
/// on the LRU when its drain returns: the generation skip never loses a folio added before the
/// call.
#[test]
fn loom_lru_generation_skip_never_loses_a_folio() {
    generation_skip(Policy::Remote);
}

/// The same with cpu 0 in queue mode: a drain that skips on the generation relies on the drain
/// that bumped it having *flushed* its queued work, which it does before it lets go of the
/// drain mutex.
#[test]
fn loom_lru_generation_skip_waits_for_the_queued_work() {
    generation_skip(Policy::RemoteOn("1".parse().unwrap()));
}

fn generation_skip(policy: Policy) {
    lru_model(move || {
        let qpw = instance(policy.clone());
        let lru = tiny_lru(&qpw);
        let add_then_drain = {
            let (qpw, lru) = (qpw.clone(), lru.clone());
            move |cpu: usize| {
                let folio = {
                    let _bound = qpw.bind_current(cpu).unwrap();
                    lru.folio_add_lru().unwrap()
                };
                let outcome = lru.lru_add_drain_all();
                assert!(outcome.errors.is_empty());
                assert!(
                    lru.on_lru(folio),
                    "folio {folio:?} missed by a drain that returned"
                );
            }
        };
        let other = {
            let add_then_drain = add_then_drain.clone();
            thread::spawn(move || add_then_drain(1))
        };
        add_then_drain(0);
        other.join().unwrap();
        drop(add_then_drain);

        assert_eq!(lru.lru_len(), 2);
        lru.check_conservation().unwrap();
    });
}

/// A thread of a queue-mode CPU fills and overflows its batch while an unbound requester
/// drains; the worker and the owner interleave under the CPU's lock. The requester's own
/// folio (added on the remote-mode CPU before its call) is on the LRU when the drain returns,
/// and at the end every folio is in exactly one place.
#[test]
fn loom_lru_queued_drain_against_the_owner() {
    lru_model(|| {
        let qpw = instance(Policy::RemoteOn("1".parse().unwrap()));
        let lru = tiny_lru(&qpw);
        let owner = {
            let (qpw, lru) = (qpw.clone(), lru.clone());
            thread::spawn(move || {
                let _bound = qpw.bind_current(0).unwrap();
                lru.folio_add_lru().unwrap();
                lru.folio_add_lru().unwrap();
                lru.folio_add_lru().unwrap();
            })
        };
        let mine = {
            let _bound = qpw.bind_current(1).unwrap();
            lru.folio_add_lru().unwrap()
        };
        let outcome = lru.lru_add_drain_all();
        assert!(outcome.errors.is_empty());
        assert!(lru.on_lru(mine));
        owner.join().unwrap();

        lru.check_conservation().unwrap();
        let batched: usize = lru.batch_lens().iter().map(|&(_, n)| n).sum();
        assert_eq!(lru.lru_len() + batched, 4);
    });
}

/// The owner charges and uncharges through its stock while a requester drains it remotely:
/// no page is lost or counted twice, and after a final drain the counters equal what tasks
/// hold.
#[test]
fn loom_memcg_remote_drain_against_the_owner() {
    loom::model(|| {
        let qpw = instance(Policy::Remote);
        let memcg = tiny_memcg(&qpw);
        let owner = {
            let (qpw, memcg) = (qpw.clone(), memcg.clone());
            thread::spawn(move || {
                let _bound = qpw.bind_current(1).unwrap();
                memcg.try_charge(1, 1).unwrap();
                memcg.uncharge(1, 1).unwrap();
            })
        };
        let outcome = memcg.drain_all_stock(0).unwrap();
        assert!(outcome.errors.is_empty());
        owner.join().unwrap();

        memcg.check_conservation().unwrap();
        memcg.drain_all_stock(0).unwrap();
        assert_eq!((memcg.usage(1), memcg.stocked(1), memcg.held(1)), (0, 0, 0));
        memcg.check_conservation().unwrap();
    });
}

/// Two requesters race for `percpu_charge_mutex` while the owner of a queue-mode CPU charges:
/// a requester that loses the race returns at once, one that wins drains through the worker,
/// and the conservation law holds at the end.
#[test]
fn loom_memcg_concurrent_drains_and_queued_work() {
    loom::model(|| {
        let qpw = instance(Policy::RemoteOn("1".parse().unwrap()));
        let memcg = tiny_memcg(&qpw);
        let owner = {
            let (qpw, memcg) = (qpw.clone(), memcg.clone());
            thread::spawn(move || {
                let _bound = qpw.bind_current(0).unwrap();
                memcg.try_charge(2, 1).unwrap();
            })
        };
        let rival = {
            let memcg = memcg.clone();
            thread::spawn(move || memcg.drain_all_stock(0).unwrap())
        };
        let mine = memcg.drain_all_stock(0).unwrap();
        let theirs = rival.join().unwrap();
        owner.join().unwrap();
        assert!(mine.errors.is_empty() && theirs.errors.is_empty());

        // The drains do not wait for cpu 0's worker: wait for it before counting.
        memcg.flush_stock_work().unwrap();
        memcg.check_conservation().unwrap();
        assert_eq!(memcg.held(2), 1);
        assert!(memcg.usage(2) >= 1 && memcg.usage(2) <= 2);
    });
}

/// Two requesters drain asynchronously (the kernel's `drain_all_stock`: queue, do not flush) a
/// queue-mode CPU whose stock holds a page; its worker runs the drain whenever it gets to.
/// Whichever way they interleave with each other and with the worker (one loses the mutex,
/// or finds the FLUSHING bit set, or finds the stock already drained), the CPU's drain work
/// runs exactly once, the page stocked before both calls is uncharged once it has, and no
/// FLUSHING bit is left behind.
#[test]
fn loom_memcg_async_drains_coalesce_on_the_flushing_bit() {
    loom::model(|| {
        let qpw = instance(Policy::RemoteOn("1".parse().unwrap()));
        let memcg = tiny_memcg(&qpw);
        {
            let _bound = qpw.bind_current(0).unwrap();
            memcg.try_charge(1, 1).unwrap(); // 2 charged, 1 stocked on cpu 0
        }
        let rival = {
            let memcg = memcg.clone();
            thread::spawn(move || memcg.drain_all_stock(0).unwrap())
        };
        let mine = memcg.drain_all_stock(0).unwrap();
        let theirs = rival.join().unwrap();
        assert!(mine.errors.is_empty() && theirs.errors.is_empty());
        assert_eq!(mine.queued + theirs.queued, 1);

        memcg.flush_stock_work().unwrap();
        assert!(memcg.flushing_cpus().is_empty());
        assert_eq!(memcg.counters()[0].drains_queued, 1);
        assert_eq!((memcg.usage(1), memcg.stocked(1), memcg.held(1)), (1, 0, 1));
        memcg.check_conservation().unwrap();
    });
}

/// The owner of a queue-mode CPU refills its stock while an asynchronous drain takes the CPU
/// on and its worker drains it: the worker clears the FLUSHING bit under the stock lock, so a
/// refill after the drain is never hidden behind a stale bit. Once the queued work has run, a
/// new drain (flushed) reaches the CPU and empties every stock.
#[test]
fn loom_memcg_async_drain_against_the_owner() {
    loom::model(|| {
        let qpw = instance(Policy::RemoteOn("1".parse().unwrap()));
        let memcg = tiny_memcg(&qpw);
        {
            let _bound = qpw.bind_current(0).unwrap();
            memcg.try_charge(1, 1).unwrap();
        }
        let owner = {
            let (qpw, memcg) = (qpw.clone(), memcg.clone());
            thread::spawn(move || {
                let _bound = qpw.bind_current(0).unwrap();
                memcg.uncharge(1, 1).unwrap(); // back into the stock
            })
        };
        let outcome = memcg.drain_all_stock(0).unwrap();
        assert!(outcome.errors.is_empty());
        owner.join().unwrap();
        memcg.flush_stock_work().unwrap();
        assert!(memcg.flushing_cpus().is_empty());
        memcg.check_conservation().unwrap();

        memcg.drain_all_stock(0).unwrap();
        memcg.flush_stock_work().unwrap();
        assert_eq!((memcg.usage(1), memcg.stocked(1), memcg.held(1)), (0, 0, 0));
        memcg.check_conservation().unwrap();
    });
}

/// The owner allocates and frees through its sheaves while a requester flushes them remotely,
/// one object per hold of the lock: every object stays in exactly one place.
#[test]
fn loom_slub_chunked_flush_against_the_owner() {
    loom::model(|| {
        // Sheaves of 2 flushed one object at a time instead of 64 in chunks of 32: the chunked
        // flush does not depend on the sizes. The rcu flush's work item starts a worker on
        // each CPU: with both CPUs in remote mode those two are the only workers, and the
        // model stays within loom's five threads.
        let qpw = instance(Policy::Remote);
        let config = SlubConfig {
            sheaf_capacity: 2,
            batch_max: 1,
            objects: 4,
        };
        let slub = Arc::new(Slub::new(&qpw, config).expect("build the cache"));
        let owner = {
            let (qpw, slub) = (qpw.clone(), slub.clone());
            thread::spawn(move || {
                let _bound = qpw.bind_current(1).unwrap();
                let object = slub.kmem_cache_alloc().unwrap().unwrap();
                slub.kmem_cache_free(object).unwrap();
            })
        };
        let outcome = slub.flush_all();
        assert!(outcome.errors.is_empty());
        owner.join().unwrap();

        slub.check_conservation().unwrap();
        slub.flush_all();
        assert_eq!(slub.slab_free(), 4);
        slub.check_conservation().unwrap();
    });
}

/// The owner allocates a page and frees it while a requester drains the pcp lists remotely:
/// every page stays in exactly one place, and a final drain returns them all to the zone.
#[test]
fn loom_pcp_remote_drain_against_the_owner() {
    loom::model(|| {
        // Batches of 2 instead of 63: the drain does not depend on the size.
        let qpw = instance(Policy::Remote);
        let config = PcpConfig {
            batch: 2,
            high: 2,
            zones: 1,
            pages_per_zone: 4,
        };
        let pcp = Arc::new(Pcp::new(&qpw, config).expect("build the lists"));
        let owner = {
            let (qpw, pcp) = (qpw.clone(), pcp.clone());
            thread::spawn(move || {
                let _bound = qpw.bind_current(0).unwrap();
                pcp.process_op().unwrap(); // allocates a page for a task
            })
        };
        let outcome = pcp.drain_all_pages(Some(0)).unwrap();
        assert!(outcome.errors.is_empty());
        owner.join().unwrap();

        pcp.check_conservation().unwrap();
        pcp.drain_all_pages(None).unwrap();
        assert_eq!(pcp.zone_free(0), 3); // the task holds one
        pcp.check_conservation().unwrap();
    });
}
