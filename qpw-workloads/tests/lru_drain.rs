//! The LRU workload: batches, `lru_add_drain_all` and its generation, in every mode.

#![cfg(not(loom))]

mod common;
mod mm_common;

use std::time::Duration;

use common::{mixed, remote_on};
use proptest::prelude::*;
use qpw_workloads::lru::{
    Folio, Lru, LruConfig, BH_LRU_SIZE, FOLIO_BATCH_SIZE, FOLIO_BATCH_SIZE_BEFORE_2024,
};
use qpw_workloads::{Workload, WorkloadError};

#[test]
fn smoke() {
    let qpw = mixed();
    let lru = Lru::new(&qpw, LruConfig::default()).unwrap();
    assert_eq!(lru.batch_size(), FOLIO_BATCH_SIZE);
    for cpu in 0..2 {
        let _bound = qpw.bind_current(cpu).unwrap();
        for _ in 0..40 {
            lru.folio_add_lru().unwrap();
        }
    }
    // 40 = 31 moved + 9 waiting, on each CPU.
    assert_eq!(lru.lru_len(), 62);
    assert_eq!(lru.batch_lens(), [(0, 9), (1, 9)]);
    let outcome = lru.lru_add_drain_all();
    assert_eq!((outcome.queued, outcome.ran_remote), (1, 1));
    assert!(!outcome.skipped && outcome.errors.is_empty());
    assert_eq!(lru.lru_len(), 80);
    lru.check_conservation().unwrap();
    let counters = lru.counters();
    assert_eq!(
        (counters[0].drains_queued, counters[1].drains_remote),
        (1, 1)
    );
}

#[test]
fn the_pre_2024_batch_size_moves_sooner() {
    let qpw = mixed();
    let lru = Lru::new(
        &qpw,
        LruConfig {
            batch_size: FOLIO_BATCH_SIZE_BEFORE_2024,
            ..LruConfig::default()
        },
    )
    .unwrap();
    let _bound = qpw.bind_current(1).unwrap();
    for _ in 0..16 {
        lru.folio_add_lru().unwrap();
    }
    assert_eq!((lru.lru_len(), lru.batch_lens()[1]), (15, (1, 1)));
}

#[test]
fn only_cpus_with_non_empty_batches_get_work() {
    let qpw = remote_on(4, "2-3");
    let lru = Lru::new(&qpw, LruConfig::default()).unwrap();
    for cpu in [1, 3] {
        let _bound = qpw.bind_current(cpu).unwrap();
        lru.folio_add_lru().unwrap();
    }
    let outcome = lru.lru_add_drain_all();
    assert_eq!(
        (outcome.queued, outcome.ran_remote, outcome.skipped_cpus),
        (1, 1, 2)
    );
    let counters = lru.counters();
    let drained: Vec<_> = counters
        .iter()
        .map(|c| (c.cpu, c.drains_queued + c.drains_remote, c.drains_skipped))
        .collect();
    assert_eq!(drained, [(0, 0, 1), (1, 1, 0), (2, 0, 1), (3, 1, 0)]);
    assert_eq!(lru.lru_len(), 2);
}

#[test]
fn the_callers_own_batch_is_drained_directly() {
    let qpw = mixed();
    let lru = Lru::new(&qpw, LruConfig::default()).unwrap();
    let _bound = qpw.bind_current(0).unwrap();
    let folio = lru.folio_add_lru().unwrap();
    let outcome = lru.lru_add_drain_all();
    // Nothing left for the per-CPU work: the caller's batch went first.
    assert_eq!(
        (outcome.queued, outcome.ran_remote, outcome.skipped_cpus),
        (0, 0, 2)
    );
    assert!(lru.on_lru(folio));
}

#[test]
fn a_drain_skips_when_a_newer_generation_already_drained() {
    let qpw = mixed();
    let lru = Lru::new(&qpw, LruConfig::default()).unwrap();
    {
        let _bound = qpw.bind_current(1).unwrap();
        lru.folio_add_lru().unwrap();
    }
    // Our caller snapshots the generation, then "waits on the mutex" while another drain
    // starts after the snapshot and runs.
    let ours = lru.drain_generation();
    let other = lru.lru_add_drain_all();
    assert!(!other.skipped);
    assert_eq!(other.ran_remote, 1);
    {
        let _bound = qpw.bind_current(1).unwrap();
        lru.folio_add_lru().unwrap(); // added after our call began: not our business
    }
    let outcome = lru.lru_add_drain_all_from(ours, false, None);
    assert!(outcome.skipped);
    assert_eq!((outcome.queued, outcome.ran_remote), (0, 0));
    assert_eq!(lru.batch_lens()[1], (1, 1));

    // lru_cache_disable never skips.
    let forced = lru.lru_add_drain_all_from(ours, true, None);
    assert!(!forced.skipped);
    assert_eq!((forced.queued, forced.ran_remote), (1, 1));
    assert_eq!(lru.batch_lens()[1], (1, 0));

    // A current snapshot does not skip.
    let fresh = lru.drain_generation();
    assert!(!lru.lru_add_drain_all_from(fresh, false, None).skipped);
    lru.check_conservation().unwrap();
}

#[test]
fn unbound_callers_cannot_add() {
    let qpw = mixed();
    let lru = Lru::new(&qpw, LruConfig::default()).unwrap();
    let err = lru.folio_add_lru().unwrap_err().to_string();
    assert!(err.contains("bind it"), "{err}");
    // ... but can drain.
    assert!(lru.lru_add_drain_all().errors.is_empty());
}

fn config(batch_size: usize) -> LruConfig {
    LruConfig {
        batch_size,
        ..LruConfig::default()
    }
}

/// Adds folios on the calling thread's CPU until one reaches the LRU; returns it.
fn a_folio_on_the_lru(lru: &Lru) -> Folio {
    loop {
        let folio = lru.folio_add_lru().unwrap();
        if lru.on_lru(folio) {
            return folio;
        }
    }
}

#[test]
fn a_rotation_goes_through_while_the_cpu_holds_its_add_lock() {
    let qpw = mixed();
    let lru = Lru::new(&qpw, config(4)).unwrap();
    for cpu in 0..2 {
        let _bound = qpw.bind_current(cpu).unwrap();
        let folio = a_folio_on_the_lru(&lru);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            // A task of this CPU inside folio_add_lru (cpu_fbatches.lock) is "interrupted" by
            // the end of writeback, which batches a rotation under lock_irq: it must not wait.
            // (Held inside the scope, so that a failure lets the other thread go.)
            let _held = lru.hold_fbatches_lock().unwrap();
            s.spawn(|| {
                let _bound = qpw.bind_current(cpu).unwrap();
                done_tx.send(lru.folio_rotate_reclaimable(folio)).unwrap();
            });
            // A deadlock detector, not a timing: the rotation takes no lock we hold.
            let rotated = done_rx
                .recv_timeout(Duration::from_secs(30))
                .expect("folio_rotate_reclaimable waited for cpu_fbatches.lock");
            assert!(rotated.unwrap(), "cpu {cpu}");
        });
    }
    assert_eq!(lru.move_batch_lens(), [(0, 0, 1), (1, 0, 1)]);
}

#[test]
fn the_drain_takes_the_batches_under_both_locks_in_both_modes() {
    let qpw = mixed();
    let lru = Lru::new(&qpw, config(4)).unwrap();
    for cpu in 0..2 {
        let _bound = qpw.bind_current(cpu).unwrap();
        let folio = a_folio_on_the_lru(&lru);
        assert!(lru.folio_rotate_reclaimable(folio).unwrap());
        assert!(lru.folio_deactivate(folio).unwrap());
        // Not on the LRU yet: nothing to rotate (!folio_test_lru).
        let batched = lru.folio_add_lru().unwrap();
        assert!(!lru.folio_rotate_reclaimable(batched).unwrap());
    }
    assert_eq!(lru.move_batch_lens(), [(0, 1, 1), (1, 1, 1)]);
    assert_eq!(lru.lru_moves(), (0, 0));
    let outcome = lru.lru_add_drain_all();
    assert_eq!((outcome.queued, outcome.ran_remote), (1, 1));
    assert_eq!(lru.move_batch_lens(), [(0, 0, 0), (1, 0, 0)]);
    assert_eq!(lru.lru_moves(), (2, 2));
    assert_eq!(lru.batch_lens(), [(0, 0), (1, 0)]);
    lru.check_conservation().unwrap();

    // A full lru_move_tail batch moves at once, like any other.
    let _bound = qpw.bind_current(1).unwrap();
    let folio = a_folio_on_the_lru(&lru);
    for _ in 0..4 {
        lru.folio_rotate_reclaimable(folio).unwrap();
    }
    assert_eq!(lru.lru_moves(), (2, 6));
    assert_eq!(lru.move_batch_lens()[1], (1, 0, 0));
    lru.check_conservation().unwrap();
}

#[test]
fn the_bh_lru_is_invalidated_by_queued_work_in_both_modes() {
    let qpw = mixed();
    let lru = Lru::new(&qpw, LruConfig::default()).unwrap();
    for cpu in 0..2 {
        let _bound = qpw.bind_current(cpu).unwrap();
        assert!(!lru.bh_lookup(10).unwrap()); // a miss: installed
        assert!(lru.bh_lookup(10).unwrap()); // a hit
    }
    assert_eq!(lru.bh_lens(), [(0, 1), (1, 1)]);
    assert_eq!(lru.bh_refs(10), 2);
    // No folio anywhere: the buffer heads alone make both CPUs need a drain, and both are
    // queued, the remote-mode one too.
    let outcome = lru.lru_add_drain_all();
    assert_eq!(
        (outcome.queued, outcome.ran_remote, outcome.skipped_cpus),
        (2, 0, 0)
    );
    assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
    assert_eq!(lru.bh_lens(), [(0, 0), (1, 0)]);
    assert_eq!(lru.bh_refs(10), 0);
    let drains: Vec<_> = lru
        .counters()
        .iter()
        .map(|c| (c.drains_queued, c.drains_remote))
        .collect();
    assert_eq!(drains, [(1, 0), (1, 0)]);

    // Folios and a buffer head on the remote-mode CPU: the batches are drained here, the
    // buffer heads on the CPU, by its worker.
    {
        let _bound = qpw.bind_current(1).unwrap();
        lru.folio_add_lru().unwrap();
        lru.bh_lookup(11).unwrap();
    }
    let outcome = lru.lru_add_drain_all();
    assert_eq!(
        (outcome.queued, outcome.ran_remote, outcome.skipped_cpus),
        (1, 1, 1)
    );
    assert_eq!((lru.bh_lens()[1], lru.bh_refs(11)), ((1, 0), 0));
    assert_eq!(lru.batch_lens()[1], (1, 0));
    let cpu1 = lru.counters()[1];
    assert_eq!((cpu1.drains_queued, cpu1.drains_remote), (2, 1));
    lru.check_conservation().unwrap();
}

#[test]
fn the_bh_lru_keeps_sixteen_and_drops_the_least_recent() {
    let qpw = mixed();
    let lru = Lru::new(&qpw, LruConfig::default()).unwrap();
    let _bound = qpw.bind_current(0).unwrap();
    for block in 0..BH_LRU_SIZE as u32 {
        lru.bh_lookup(block).unwrap();
    }
    assert!(lru.bh_lookup(0).unwrap()); // block 0 is now the most recent
    lru.bh_lookup(100).unwrap(); // evicts block 1, the least recent
    assert_eq!(lru.bh_lens()[0], (0, BH_LRU_SIZE));
    assert_eq!(
        (lru.bh_refs(0), lru.bh_refs(1), lru.bh_refs(100)),
        (1, 0, 1)
    );
    lru.check_conservation().unwrap();
}

/// Needs a fake sysfs tree whose last allowed CPU is isolated.
#[test]
fn isolated_cpus_cache_no_buffer_heads() {
    let (qpw, _root, last) = mm_common::physical_isolated("lru-bh");
    let lru = Lru::new(&qpw, LruConfig::default()).unwrap();
    assert_eq!(lru.isolated_cpus().as_slice(), [last]);
    for cpu in qpw.cpus().iter() {
        std::thread::scope(|s| {
            s.spawn(|| {
                let _bound = qpw.bind_current(cpu).unwrap();
                assert!(!lru.bh_lookup(5).unwrap());
                // A hit on a housekeeping CPU, another miss on the isolated one.
                assert_eq!(lru.bh_lookup(5).unwrap(), cpu != last, "cpu {cpu}");
            });
        });
    }
    let cached: Vec<_> = lru.bh_lens().into_iter().filter(|&(_, n)| n > 0).collect();
    assert!(cached.iter().all(|&(cpu, n)| cpu != last && n == 1));
    lru.check_conservation().unwrap();
}

#[test]
fn bad_folios_and_blocks_are_named() {
    let qpw = mixed();
    let lru = Lru::new(&qpw, LruConfig::default()).unwrap();
    let _bound = qpw.bind_current(0).unwrap();
    let err = lru
        .folio_rotate_reclaimable(Folio { cpu: 7, seq: 1 })
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "folio (7, 1) was never added: folios are (cpu, n) with cpu in {0,1} and n from 1"
    );
    let err = lru.folio_deactivate(Folio { cpu: 0, seq: 0 }).unwrap_err();
    assert!(matches!(err, WorkloadError::NoSuchFolio { .. }), "{err}");
    // Not added yet, but could be: simply not on the LRU.
    assert!(!lru.folio_deactivate(Folio { cpu: 1, seq: 9 }).unwrap());
    let err = lru.bh_lookup(1024).unwrap_err().to_string();
    assert_eq!(
        err,
        "block = 1024 is out of range: the legal range is 0-1023"
    );
}

#[derive(Debug, Clone)]
enum Op {
    Add(usize),
    Drain(Option<usize>),
    Disable,
    StaleDrain,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..2usize).prop_map(Op::Add),
        1 => prop::option::of(0..2usize).prop_map(Op::Drain),
        1 => Just(Op::Disable),
        1 => Just(Op::StaleDrain),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random adds and drains against a model of the batches: the same lengths, the same LRU
    /// size, the same CPUs drained, and the conservation law after every step.
    #[test]
    fn matches_the_sequential_model(batch in 1..6usize, ops in prop::collection::vec(op(), 1..80)) {
        let qpw = mixed();
        let lru = Lru::new(&qpw, config(batch)).unwrap();
        let mut batches = [0usize; 2];
        let mut on_lru = 0usize;
        for op in ops {
            match op {
                Op::Add(cpu) => {
                    let _bound = qpw.bind_current(cpu).unwrap();
                    lru.folio_add_lru().unwrap();
                    batches[cpu] += 1;
                    if batches[cpu] == batch {
                        on_lru += batch;
                        batches[cpu] = 0;
                    }
                }
                Op::Drain(caller) => {
                    let _bound = caller.map(|cpu| qpw.bind_current(cpu).unwrap());
                    if let Some(cpu) = caller {
                        on_lru += std::mem::take(&mut batches[cpu]);
                    }
                    let busy = batches.iter().filter(|&&n| n > 0).count();
                    let outcome = lru.lru_add_drain_all();
                    prop_assert!(!outcome.skipped);
                    prop_assert_eq!(outcome.queued + outcome.ran_remote, busy);
                    prop_assert_eq!(outcome.skipped_cpus, 2 - busy);
                    on_lru += batches.iter().sum::<usize>();
                    batches = [0; 2];
                }
                Op::Disable => {
                    let outcome = lru.lru_cache_disable();
                    prop_assert_eq!(outcome.queued + outcome.ran_remote, 2);
                    on_lru += batches.iter().sum::<usize>();
                    batches = [0; 2];
                }
                Op::StaleDrain => {
                    let stale = lru.drain_generation();
                    lru.lru_add_drain_all();
                    on_lru += batches.iter().sum::<usize>();
                    batches = [0; 2];
                    prop_assert!(lru.lru_add_drain_all_from(stale, false, None).skipped);
                }
            }
            prop_assert_eq!(lru.batch_lens(), vec![(0, batches[0]), (1, batches[1])]);
            prop_assert_eq!(lru.lru_len(), on_lru);
            prop_assert_eq!(lru.check_conservation(), Ok(()));
        }
    }
}

fn stress(policy: &str) {
    let (qpw, _root) = mm_common::instance(policy, mm_common::STRESS_CPUS);
    let lru = Lru::new(&qpw, LruConfig::default()).unwrap();
    let (counters, _) = mm_common::stress(&qpw, &lru, 20_000);
    mm_common::check_drained_by_mode(&qpw, &counters, |_| true);
    // Every operation added a folio, or rotated or deactivated one; the final drain moved every
    // batch, so each is on the LRU or counted there.
    let (deactivated, rotated) = lru.lru_moves();
    assert!(deactivated > 0 && rotated > 0);
    assert_eq!(
        lru.lru_len() as u64 + deactivated + rotated,
        counters.iter().map(|c| c.local_ops).sum::<u64>()
    );
    assert!(lru.move_batch_lens().iter().all(|&(_, d, r)| d + r == 0));
}

mm_common::stress_tests!(stress);
