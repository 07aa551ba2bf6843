//! The memcg workload: stocks, charges against limits, and `drain_all_stock` with each
//! strategy, in every mode.

#![cfg(not(loom))]

mod common;
mod mm_common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{mixed, remote};
use proptest::prelude::*;
use qpw_core::Qpw;
use qpw_workloads::memcg::{
    Charge, Memcg, MemcgConfig, StockDrainStrategy, StockDrainWait, MEMCG_CHARGE_BATCH,
    NR_MEMCG_STOCK, UNLIMITED,
};
use qpw_workloads::{Workload, WorkloadError};

/// root 0 -> {1 (unlimited) -> {3, 4}, 2 (limit 200)}.
fn small(strategy: StockDrainStrategy) -> MemcgConfig {
    MemcgConfig {
        parents: vec![None, Some(0), Some(0), Some(1), Some(1)],
        limits: vec![UNLIMITED, UNLIMITED, 200, UNLIMITED, UNLIMITED],
        strategy,
        ..MemcgConfig::default()
    }
}

#[test]
fn smoke() {
    let qpw = mixed();
    let memcg = Memcg::new(&qpw, MemcgConfig::default()).unwrap();
    assert_eq!((NR_MEMCG_STOCK, MEMCG_CHARGE_BATCH), (7, 64));
    assert_eq!(memcg.nr_memcgs(), 13);
    assert_eq!(memcg.leaves().len(), 10);
    for cpu in 0..2 {
        let _bound = qpw.bind_current(cpu).unwrap();
        assert_eq!(memcg.try_charge(3, 1).unwrap(), Charge::Counter);
        assert_eq!(memcg.try_charge(3, 1).unwrap(), Charge::Stock);
    }
    assert_eq!(memcg.usage(3), 2 * MEMCG_CHARGE_BATCH);
    assert_eq!(memcg.usage(1), 2 * MEMCG_CHARGE_BATCH);
    assert_eq!(memcg.usage(2), 0);
    assert_eq!(memcg.stocked(3), 2 * (MEMCG_CHARGE_BATCH - 2));
    memcg.check_conservation().unwrap();

    let outcome = memcg.drain_all_stock(0).unwrap();
    assert_eq!((outcome.queued, outcome.ran_remote), (1, 1));
    // Asynchronous: cpu 1's stock was drained here, remotely; cpu 0's when its worker runs.
    assert_eq!(memcg.stocked_per_cpu()[1], (1, 0));
    memcg.flush_stock_work().unwrap();
    assert_eq!((memcg.usage(3), memcg.stocked(3), memcg.held(3)), (4, 0, 4));
    assert!(memcg.flushing_cpus().is_empty());
    memcg.check_conservation().unwrap();
}

#[test]
fn seven_slots_then_eviction() {
    let qpw = mixed();
    let memcg = Memcg::new(&qpw, MemcgConfig::default()).unwrap();
    let _bound = qpw.bind_current(0).unwrap();
    let leaves = memcg.leaves().to_vec();
    for &leaf in &leaves[..NR_MEMCG_STOCK] {
        memcg.try_charge(leaf, 1).unwrap();
    }
    assert!(leaves[..NR_MEMCG_STOCK]
        .iter()
        .all(|&m| memcg.stocked(m) == MEMCG_CHARGE_BATCH - 1));
    // The eighth memcg evicts the first slot's.
    memcg.try_charge(leaves[7], 1).unwrap();
    assert_eq!(memcg.stocked(leaves[0]), 0);
    assert_eq!(memcg.stocked(leaves[7]), MEMCG_CHARGE_BATCH - 1);
    assert_eq!(memcg.usage(leaves[0]), 1);
    memcg.check_conservation().unwrap();
}

#[test]
fn drain_all_stock_only_visits_cpus_caching_a_descendant() {
    let qpw = remote(3);
    let memcg = Memcg::new(&qpw, small(StockDrainStrategy::PerCpuWork)).unwrap();
    for (cpu, m) in [(0, 3), (1, 2), (2, 4)] {
        let _bound = qpw.bind_current(cpu).unwrap();
        memcg.try_charge(m, 1).unwrap();
    }
    // Descendants of 1 are 3 and 4: cpus 0 and 2.
    let outcome = memcg.drain_all_stock(1).unwrap();
    assert_eq!((outcome.ran_remote, outcome.skipped_cpus), (2, 1));
    assert_eq!((memcg.stocked(3), memcg.stocked(4)), (0, 0));
    assert_eq!(memcg.stocked(2), MEMCG_CHARGE_BATCH - 1);
    let skipped: Vec<_> = memcg.counters().iter().map(|c| c.drains_skipped).collect();
    assert_eq!(skipped, [0, 1, 0]);
    memcg.check_conservation().unwrap();
}

#[test]
fn the_callers_own_stock_is_drained_directly() {
    let qpw = mixed();
    let memcg = Memcg::new(&qpw, MemcgConfig::default()).unwrap();
    let _bound = qpw.bind_current(0).unwrap(); // a queue-mode CPU
    memcg.try_charge(3, 1).unwrap();
    let outcome = memcg.drain_all_stock(0).unwrap();
    // Not queued to cpu 0's worker: drained here, before the (asynchronous) drain returned.
    assert_eq!(
        (outcome.queued, outcome.ran_remote, outcome.skipped_cpus),
        (0, 0, 1)
    );
    assert_eq!(memcg.stocked_per_cpu(), [(0, 0), (1, 0)]);
    assert!(memcg.flushing_cpus().is_empty());
    assert_eq!(memcg.counters()[0].drains_queued, 0);
}

#[test]
fn drain_all_stock_returns_at_once_while_another_drain_runs() {
    let qpw = mixed();
    let memcg = Memcg::new(&qpw, MemcgConfig::default()).unwrap();
    {
        let _bound = qpw.bind_current(1).unwrap();
        memcg.try_charge(3, 1).unwrap();
    }
    let running = memcg.hold_drain();
    let outcome = memcg.drain_all_stock(0).unwrap();
    assert!(outcome.skipped);
    assert_eq!((outcome.queued, outcome.ran_remote), (0, 0));
    assert_eq!(memcg.stocked(3), MEMCG_CHARGE_BATCH - 1);
    drop(running);
    let outcome = memcg.drain_all_stock(0).unwrap();
    assert!(!outcome.skipped);
    assert_eq!(memcg.stocked(3), 0);
}

#[test]
fn a_drain_from_another_thread_is_skipped_while_one_runs() {
    let qpw = mixed();
    let memcg = Memcg::new(&qpw, MemcgConfig::default()).unwrap();
    let running = memcg.hold_drain();
    let skipped = std::thread::scope(|s| {
        s.spawn(|| memcg.drain_all_stock(0).unwrap())
            .join()
            .unwrap()
    });
    assert!(skipped.skipped);
    drop(running);
}

#[test]
fn skip_isolated_strands_pages_and_reports_them() {
    let (qpw, _root, last) = mm_common::physical_isolated("memcg-skip");
    let memcg = Memcg::new(&qpw, small(StockDrainStrategy::SkipIsolated)).unwrap();
    assert_eq!(memcg.isolated_cpus().as_slice(), [last]);
    for cpu in qpw.cpus().iter() {
        let _bound = qpw.bind_current(cpu).unwrap();
        memcg.try_charge(3, 2).unwrap();
    }
    // Drain from a housekeeping CPU: on a physical instance an unbound caller belongs to
    // whichever CPU it runs on, and the caller's own stock is always drained directly.
    let Some(housekeeping) = qpw.cpus().iter().find(|&c| c != last) else {
        eprintln!("one CPU only: no housekeeping CPU to drain from");
        return;
    };
    let _requester = qpw.bind_current(housekeeping).unwrap();
    let outcome = memcg.drain_all_stock(0).unwrap();
    assert!(!outcome.skipped);
    memcg.flush_stock_work().unwrap();
    // The isolated CPU was left alone with its 62 pages charged.
    assert_eq!(memcg.stocked(3), MEMCG_CHARGE_BATCH - 2);
    let counters = memcg.counters();
    let isolated = counters.iter().find(|c| c.cpu == last).unwrap();
    assert_eq!(isolated.stranded, MEMCG_CHARGE_BATCH - 2);
    assert_eq!(isolated.drains_skipped, 1);
    assert_eq!(isolated.drains_remote + isolated.drains_queued, 0);
    for other in counters.iter().filter(|c| c.cpu != last) {
        assert_eq!(other.stranded, 0);
    }
    // Again: stranded again (its FLUSHING bit is still set), and counted again.
    memcg.drain_all_stock(0).unwrap();
    let isolated = memcg
        .counters()
        .into_iter()
        .find(|c| c.cpu == last)
        .unwrap();
    assert_eq!(isolated.stranded, 2 * (MEMCG_CHARGE_BATCH - 2));
    memcg.check_conservation().unwrap();

    // The same isolated CPU with the per-CPU work strategy: drained remotely.
    let memcg = Memcg::new(&qpw, small(StockDrainStrategy::PerCpuWork)).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _bound = qpw.bind_current(last).unwrap();
            memcg.try_charge(3, 2).unwrap();
        });
    });
    let outcome = memcg.drain_all_stock(0).unwrap();
    assert_eq!(outcome.ran_remote, 1);
    assert_eq!(memcg.stocked(3), 0);
}

/// Runs `body` while a thread of `cpu` holds that CPU's stock lock, as a task preempted (or
/// interrupted) inside `consume_stock` would: the CPU's drain work cannot run meanwhile. The
/// thread lets go when `body` returns, or panics.
fn with_stock_held<R>(qpw: &Qpw, memcg: &Memcg, cpu: usize, body: impl FnOnce() -> R) -> R {
    std::thread::scope(|s| {
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        s.spawn(move || {
            let _bound = qpw.bind_current(cpu).unwrap();
            let _held = memcg.hold_local_stock().unwrap();
            held_tx.send(()).unwrap();
            // Until `body` returns (or its thread unwinds and drops the sender).
            let _ = release_rx.recv();
        });
        held_rx.recv().unwrap();
        let result = body();
        drop(release_tx);
        result
    })
}

#[test]
fn drain_all_stock_does_not_wait_for_the_work_it_queues() {
    let qpw = mixed();
    let memcg = Memcg::new(&qpw, MemcgConfig::default()).unwrap();
    {
        let _bound = qpw.bind_current(0).unwrap();
        memcg.try_charge(3, 1).unwrap(); // 63 pages stocked on cpu 0, a queue-mode CPU
    }
    with_stock_held(&qpw, &memcg, 0, || {
        // cpu 0's worker cannot drain while the stock is held, and the drain returns anyway:
        // no stall however long it would wait, the work still queued, the bit still set.
        let outcome = memcg.drain(false, Some(Duration::from_millis(100)));
        assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
        assert_eq!((outcome.queued, outcome.skipped_cpus), (1, 1));
        assert_eq!(memcg.usage(3), MEMCG_CHARGE_BATCH);
        assert_eq!(memcg.flushing_cpus().as_slice(), [0]);
        // A second drain trusts the queued one: it skips cpu 0 (FLUSHING_CACHED_CHARGE).
        let outcome = memcg.drain_all_stock(0).unwrap();
        assert_eq!((outcome.queued, outcome.skipped_cpus), (0, 2));
    });
    memcg.flush_stock_work().unwrap();
    assert_eq!((memcg.usage(3), memcg.stocked(3)), (1, 0));
    assert!(memcg.flushing_cpus().is_empty());
    let counters = memcg.counters();
    assert_eq!(
        (counters[0].drains_queued, counters[0].drains_skipped),
        (1, 1)
    );
    memcg.check_conservation().unwrap();
}

#[test]
fn the_flush_option_waits_for_the_queued_work() {
    let qpw = mixed();
    let config = MemcgConfig {
        wait: StockDrainWait::Flush,
        ..MemcgConfig::default()
    };
    let memcg = Memcg::new(&qpw, config).unwrap();
    {
        let _bound = qpw.bind_current(0).unwrap();
        memcg.try_charge(3, 1).unwrap();
    }
    with_stock_held(&qpw, &memcg, 0, || {
        // The worker cannot run: the drain waits for it, and gives up as a stall.
        let outcome = memcg.drain(false, Some(Duration::from_millis(100)));
        assert!(
            matches!(outcome.errors[..], [qpw_core::Error::Stall { cpu: 0, .. }]),
            "{:?}",
            outcome.errors
        );
        // The next drain skips cpu 0 (its bit is set) but still waits for the queued work.
        let outcome = memcg.drain(false, Some(Duration::from_millis(100)));
        assert_eq!((outcome.queued, outcome.skipped_cpus), (0, 2));
        assert!(
            matches!(outcome.errors[..], [qpw_core::Error::Stall { cpu: 0, .. }]),
            "{:?}",
            outcome.errors
        );
    });
    let outcome = memcg.drain_all_stock(0).unwrap();
    assert!(outcome.errors.is_empty());
    assert_eq!((memcg.usage(3), memcg.stocked(3)), (1, 0));
    memcg.check_conservation().unwrap();
}

#[test]
fn a_refill_that_cannot_take_the_lock_uncharges_directly() {
    let qpw = remote(2);
    let memcg = Memcg::new(&qpw, MemcgConfig::default()).unwrap();
    let _bound = qpw.bind_current(1).unwrap();
    memcg.try_charge(3, 1).unwrap();
    assert_eq!((memcg.usage(3), memcg.stocked(3)), (64, 63));
    {
        // As an interrupt arriving while the task holds the stock: the trylocks fail.
        let _held = memcg.hold_local_stock().unwrap();
        // refill_stock: straight back to the page counters, the stock untouched.
        memcg.uncharge(3, 1).unwrap();
        assert_eq!(memcg.usage(3), 63);
        // consume_stock fails although the stock has pages: a batch from the counters, whose
        // surplus cannot go into the stock either.
        assert_eq!(memcg.try_charge(3, 1).unwrap(), Charge::Counter);
        assert_eq!(memcg.usage(3), 64);
    }
    assert_eq!((memcg.stocked(3), memcg.held(3)), (63, 1));
    memcg.check_conservation().unwrap();
}

/// Needs two allowed CPUs (one housekeeping, one isolated in a fake sysfs tree).
#[test]
fn a_skipped_isolated_cpu_keeps_a_stale_flushing_bit() {
    let (qpw, _root, last) = mm_common::physical_isolated("memcg-stale");
    let Some(housekeeping) = qpw.cpus().iter().find(|&c| c != last) else {
        eprintln!("one CPU only: no housekeeping CPU to drain from");
        return;
    };
    let memcg = Memcg::new(&qpw, small(StockDrainStrategy::SkipIsolated)).unwrap();
    let on = |cpu: usize, f: &(dyn Fn() + Sync)| {
        std::thread::scope(|s| {
            s.spawn(|| {
                let _bound = qpw.bind_current(cpu).unwrap();
                f();
            });
        })
    };
    on(last, &|| {
        memcg.try_charge(3, 2).unwrap();
    });
    // A housekeeping drain takes the isolated CPU on (sets its bit) and leaves it alone.
    on(housekeeping, &|| {
        memcg.drain_all_stock(0).unwrap();
    });
    assert_eq!(memcg.flushing_cpus().as_slice(), [last]);
    assert_eq!(memcg.stocked(3), MEMCG_CHARGE_BATCH - 2);
    // Stale: even the isolated CPU's own drain skips its stock (the bit is tested first).
    on(last, &|| {
        let outcome = memcg.drain_all_stock(0).unwrap();
        assert_eq!(outcome.skipped_cpus, qpw.cpus().len());
    });
    assert_eq!(memcg.stocked(3), MEMCG_CHARGE_BATCH - 2);
    assert_eq!(memcg.flushing_cpus().as_slice(), [last]);
    // Until the CPU runs the drain work itself.
    on(last, &|| memcg.drain_local_stock().unwrap());
    assert!(memcg.flushing_cpus().is_empty());
    assert_eq!(memcg.stocked(3), 0);
    // Now its own drain drains it directly, and leaves no bit behind.
    on(last, &|| {
        memcg.try_charge(3, 2).unwrap();
        memcg.drain_all_stock(0).unwrap();
    });
    assert_eq!(memcg.stocked(3), 0);
    assert!(memcg.flushing_cpus().is_empty());
    memcg.check_conservation().unwrap();
}

#[test]
fn charges_past_the_limit_fail_after_one_drain() {
    let qpw = mixed();
    let memcg = Memcg::new(&qpw, small(StockDrainStrategy::PerCpuWork)).unwrap();
    {
        let _bound = qpw.bind_current(1).unwrap();
        memcg.try_charge(2, 100).unwrap(); // > a batch: no stock
        memcg.try_charge(2, 1).unwrap(); // a batch: 63 stocked on cpu 1
    }
    assert_eq!(memcg.usage(2), 164);
    let _bound = qpw.bind_current(0).unwrap();
    // 164 + 99 > 200, but 101 + 99 fits once cpu 1's stock is drained.
    assert_eq!(memcg.try_charge(2, 99).unwrap(), Charge::Counter);
    assert_eq!((memcg.usage(2), memcg.stocked(2)), (200, 0));
    assert_eq!(
        memcg.try_charge(2, 1).unwrap(),
        Charge::NoMem { over_limit: 2 }
    );
    memcg.uncharge(2, 10).unwrap();
    assert_eq!(memcg.try_charge(2, 10).unwrap(), Charge::Stock);
    let err = memcg.uncharge(2, 1000).unwrap_err();
    assert!(
        matches!(
            err,
            WorkloadError::NotCharged {
                memcg: 2,
                nr_pages: 1000,
                held: 200
            }
        ),
        "{err}"
    );
    memcg.check_conservation().unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Charge { cpu: usize, memcg: usize, nr: u64 },
    Uncharge { cpu: usize, memcg: usize, nr: u64 },
    Drain { caller: Option<usize>, root: usize },
    Process { cpu: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, 1..5usize, 1..90u64).prop_map(|(cpu, memcg, nr)| Op::Charge { cpu, memcg, nr }),
        3 => (0..2usize, 1..5usize, 1..90u64).prop_map(|(cpu, memcg, nr)| Op::Uncharge { cpu, memcg, nr }),
        1 => (prop::option::of(0..2usize), 0..5usize).prop_map(|(caller, root)| Op::Drain { caller, root }),
        2 => (0..2usize).prop_map(|cpu| Op::Process { cpu }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random charges, uncharges and drains against a model that knows only what tasks hold:
    /// a charge succeeds exactly when it fits under the limit once stocks are drained, the
    /// counters always equal held plus stocked pages, and a drain empties every stock below
    /// its root.
    #[test]
    fn matches_the_sequential_model(slots in 1..4usize, ops in prop::collection::vec(op(), 1..60)) {
        let qpw = mixed();
        // Synchronous drains, so that a drain (and a charge that needs one) sees the stocks
        // empty when it returns, as the model assumes.
        let config = MemcgConfig {
            stock_slots: slots,
            wait: StockDrainWait::Flush,
            ..small(StockDrainStrategy::PerCpuWork)
        };
        let memcg = Memcg::new(&qpw, config).unwrap();
        // Pages this test's own charges hold, and pages process_op's tasks hold, per memcg.
        let mut api: BTreeMap<usize, u64> = BTreeMap::new();
        let mut tasks: BTreeMap<usize, u64> = BTreeMap::new();
        let below = |m: usize, root: usize| m == root || root == 0 || (root == 1 && (m == 3 || m == 4));
        for op in ops {
            match op {
                Op::Charge { cpu, memcg: m, nr } => {
                    let _bound = qpw.bind_current(cpu).unwrap();
                    let held2 = api.get(&2).copied().unwrap_or(0) + tasks.get(&2).copied().unwrap_or(0);
                    let fits = m != 2 || held2 + nr <= 200;
                    let charge = memcg.try_charge(m, nr).unwrap();
                    if fits {
                        prop_assert!(matches!(charge, Charge::Stock | Charge::Counter), "{:?}", charge);
                        *api.entry(m).or_default() += nr;
                    } else {
                        prop_assert_eq!(charge, Charge::NoMem { over_limit: 2 });
                    }
                }
                Op::Uncharge { cpu, memcg: m, nr } => {
                    let _bound = qpw.bind_current(cpu).unwrap();
                    let total = api.get(&m).copied().unwrap_or(0) + tasks.get(&m).copied().unwrap_or(0);
                    let ours = api.get(&m).copied().unwrap_or(0);
                    if nr <= ours {
                        prop_assert!(memcg.uncharge(m, nr).is_ok());
                        api.insert(m, ours - nr);
                    } else if nr > total {
                        let refused = matches!(memcg.uncharge(m, nr), Err(WorkloadError::NotCharged { .. }));
                        prop_assert!(refused);
                    }
                    // (Between the two would take pages process_op's tasks hold: not issued.)
                }
                Op::Drain { caller, root } => {
                    let _bound = caller.map(|cpu| qpw.bind_current(cpu).unwrap());
                    let outcome = memcg.drain_all_stock(root).unwrap();
                    prop_assert!(!outcome.skipped);
                    for m in (1..5).filter(|&m| below(m, root)) {
                        prop_assert_eq!(memcg.stocked(m), 0);
                    }
                }
                Op::Process { cpu } => {
                    let _bound = qpw.bind_current(cpu).unwrap();
                    let before: u64 = (1..5).map(|m| memcg.held(m)).sum();
                    memcg.process_op().unwrap();
                    let after: u64 = (1..5).map(|m| memcg.held(m)).sum();
                    prop_assert!(after.abs_diff(before) <= 4, "{} -> {}", before, after);
                    for m in 1..5 {
                        let ours = api.get(&m).copied().unwrap_or(0);
                        tasks.insert(m, memcg.held(m) - ours);
                    }
                }
            }
            for m in 1..5 {
                let expected = api.get(&m).copied().unwrap_or(0) + tasks.get(&m).copied().unwrap_or(0);
                prop_assert_eq!(memcg.held(m), expected);
            }
            prop_assert_eq!(memcg.check_conservation(), Ok(()));
        }
    }
}

fn stress(policy: &str, strategy: StockDrainStrategy) -> (Vec<qpw_workloads::CpuCounters>, Memcg) {
    let (qpw, _root) = mm_common::instance(policy, mm_common::STRESS_CPUS);
    let memcg = Memcg::new(
        &qpw,
        MemcgConfig {
            strategy,
            ..MemcgConfig::default()
        },
    )
    .unwrap();
    let (counters, _) = mm_common::stress(&qpw, &memcg, 20_000);
    let isolated = memcg.isolated_cpus().clone();
    let skipping = strategy == StockDrainStrategy::SkipIsolated;
    mm_common::check_drained_by_mode(&qpw, &counters, |cpu| !(skipping && isolated.contains(cpu)));
    (counters, memcg)
}

mm_common::stress_tests!(|policy| {
    stress(policy, StockDrainStrategy::PerCpuWork);
});

#[test]
fn stress_isolated_skipping_isolated_cpus() {
    let (counters, memcg) = stress("isolated", StockDrainStrategy::SkipIsolated);
    // The isolated CPUs were never drained, not even by the final forced drain (the strategy,
    // not the force, decides), and the pages they kept were counted.
    assert!(!memcg.isolated_cpus().is_empty());
    for c in counters
        .iter()
        .filter(|c| memcg.isolated_cpus().contains(c.cpu))
    {
        assert_eq!(c.drains_remote + c.drains_queued, 0, "cpu {}", c.cpu);
        assert!(c.drains_skipped > 0, "cpu {}", c.cpu);
        assert!(c.stranded > 0, "cpu {}", c.cpu);
    }
}
