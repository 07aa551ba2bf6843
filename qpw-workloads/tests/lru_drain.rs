//! The LRU workload: batches, `lru_add_drain_all` and its generation, in every mode.

#![cfg(not(loom))]

mod common;
mod mm_common;

use common::{mixed, remote_on};
use proptest::prelude::*;
use qpw_workloads::lru::{Lru, LruConfig, FOLIO_BATCH_SIZE, FOLIO_BATCH_SIZE_BEFORE_2024};
use qpw_workloads::Workload;

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
        let lru = Lru::new(&qpw, LruConfig { batch_size: batch }).unwrap();
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
    assert_eq!(
        lru.lru_len() as u64,
        counters.iter().map(|c| c.local_ops).sum::<u64>()
    );
}

mm_common::stress_tests!(stress);
