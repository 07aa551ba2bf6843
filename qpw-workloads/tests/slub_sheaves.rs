//! The SLUB workload: sheaves, `flush_all` in chunks, and the must-run-on-CPU rcu flush.

#![cfg(not(loom))]

mod common;
mod mm_common;

use std::collections::BTreeSet;

use common::{instance_on, mixed, remote_on};
use proptest::prelude::*;
use qpw_core::{CpuSpec, Mode, Policy};
use qpw_workloads::slub::{Slub, SlubConfig, PCS_BATCH_MAX};
use qpw_workloads::{Workload, WorkloadError};

#[test]
fn smoke() {
    let qpw = mixed();
    let slub = Slub::new(&qpw, SlubConfig::default()).unwrap();
    let mut objects = Vec::new();
    for cpu in 0..2 {
        let _bound = qpw.bind_current(cpu).unwrap();
        objects.extend((0..10).map(|_| slub.kmem_cache_alloc().unwrap().unwrap()));
    }
    // Each CPU refilled a sheaf of 64 and took 10.
    assert_eq!(slub.sheaf_lens(), [(0, 54, 0), (1, 54, 0)]);
    assert_eq!(objects.iter().collect::<BTreeSet<_>>().len(), 20);
    slub.check_conservation().unwrap();
    let outcome = slub.flush_all();
    assert_eq!((outcome.queued, outcome.ran_remote), (1, 1));
    assert_eq!(slub.sheaf_lens(), [(0, 0, 0), (1, 0, 0)]);
    assert_eq!(slub.slab_free(), 16384 - 20);
    slub.check_conservation().unwrap();
}

#[test]
fn flush_all_queues_only_to_cpus_with_used_sheaves() {
    let qpw = remote_on(3, "2");
    let slub = Slub::new(&qpw, SlubConfig::default()).unwrap();
    {
        let _bound = qpw.bind_current(1).unwrap();
        let object = slub.kmem_cache_alloc().unwrap().unwrap();
        slub.kmem_cache_free(object).unwrap();
    }
    let outcome = slub.flush_all();
    assert_eq!(
        (outcome.queued, outcome.ran_remote, outcome.skipped_cpus),
        (1, 0, 2)
    );
    let skipped: Vec<_> = slub.counters().iter().map(|c| c.drains_skipped).collect();
    assert_eq!(skipped, [1, 0, 1]);
    // Nothing used any more: nobody gets work.
    let outcome = slub.flush_all();
    assert_eq!(outcome.skipped_cpus, 3);
    // A forced flush reaches every CPU.
    let outcome = slub.drain(true, None);
    assert_eq!((outcome.queued, outcome.ran_remote), (2, 1));
}

#[test]
fn the_main_sheaf_is_flushed_in_chunks_of_pcs_batch_max() {
    assert_eq!(PCS_BATCH_MAX, 32);
    let qpw = mixed();
    let capacity = 3 * PCS_BATCH_MAX - 10; // 86: chunks of 32, 32 and 22
    let slub = Slub::new(
        &qpw,
        SlubConfig {
            sheaf_capacity: capacity,
            ..SlubConfig::default()
        },
    )
    .unwrap();
    {
        let _bound = qpw.bind_current(1).unwrap();
        let objects: Vec<_> = (0..capacity)
            .map(|_| slub.kmem_cache_alloc().unwrap().unwrap())
            .collect();
        for object in objects {
            slub.kmem_cache_free(object).unwrap();
        }
    }
    assert_eq!(slub.sheaf_lens()[1], (1, capacity, 0));
    slub.flush_all();
    assert_eq!(slub.flush_chunks(), 3);
    slub.check_conservation().unwrap();
}

#[test]
fn full_sheaves_go_to_the_barn() {
    let qpw = mixed();
    let slub = Slub::new(
        &qpw,
        SlubConfig {
            sheaf_capacity: 4,
            batch_max: 2,
            objects: 64,
        },
    )
    .unwrap();
    let _bound = qpw.bind_current(0).unwrap();
    let objects: Vec<_> = (0..16)
        .map(|_| slub.kmem_cache_alloc().unwrap().unwrap())
        .collect();
    for object in objects {
        slub.kmem_cache_free(object).unwrap();
    }
    // 16 frees: main (4) + spare (4) + two full sheaves in the barn (8).
    assert_eq!(slub.sheaf_lens()[0], (0, 4, 4));
    assert_eq!(slub.barn_full(), 2);
    // The next allocations come from main, then the spare, then the barn.
    let _: Vec<_> = (0..9)
        .map(|_| slub.kmem_cache_alloc().unwrap().unwrap())
        .collect();
    assert_eq!(slub.barn_full(), 1);
    slub.check_conservation().unwrap();
}

#[test]
fn a_double_free_is_refused_and_changes_nothing() {
    let qpw = mixed();
    let slub = Slub::new(&qpw, SlubConfig::default()).unwrap();
    let _bound = qpw.bind_current(1).unwrap();
    let object = slub.kmem_cache_alloc().unwrap().unwrap();
    slub.kmem_cache_free(object).unwrap();
    let before = slub.sheaf_lens();
    for second_free in [Slub::kmem_cache_free, Slub::kfree_rcu] {
        let err = second_free(&slub, object).unwrap_err();
        assert!(
            matches!(err, WorkloadError::NotAllocated { kind: "object", id, .. } if id == u64::from(object)),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "object {object} is not allocated: a double free, or never handed out by \
                 kmem_cache_alloc"
            )
        );
    }
    assert_eq!(slub.sheaf_lens(), before);
    slub.check_conservation().unwrap();
    // An object that was never handed out (still in the slabs) is refused the same way.
    let never = (0..16384).find(|&o| o != object).unwrap();
    assert!(matches!(
        slub.kmem_cache_free(never),
        Err(WorkloadError::NotAllocated { .. })
    ));
    slub.check_conservation().unwrap();
}

/// Needs two real CPUs: the rcu flush must run on each CPU even in remote mode, as
/// `sched_getcpu()` in the work tells.
#[test]
fn the_rcu_flush_runs_on_its_cpu_even_in_remote_mode() {
    let qpw = instance_on(CpuSpec::Allowed, Policy::Remote);
    assert!(qpw.cpus_in(Mode::Queue).is_empty());
    let slub = Slub::new(&qpw, SlubConfig::default()).unwrap();
    std::thread::scope(|s| {
        for cpu in qpw.cpus().iter() {
            let (qpw, slub) = (&qpw, &slub);
            s.spawn(move || {
                let _bound = qpw.bind_current(cpu).unwrap();
                let object = slub.kmem_cache_alloc().unwrap().unwrap();
                slub.kfree_rcu(object).unwrap();
            });
        }
    });
    let flush = slub.flush_rcu_sheaves_on_cache();
    assert!(
        flush.outcome.errors.is_empty(),
        "{:?}",
        flush.outcome.errors
    );
    assert_eq!(flush.outcome.queued, qpw.cpus().len());
    assert_eq!(flush.outcome.ran_remote, 0);
    for (cpu, ran_on) in &flush.ran_on {
        assert_eq!(
            *ran_on,
            Some(*cpu),
            "flush_rcu_sheaf for cpu {cpu} ran elsewhere"
        );
    }
    // Queued drains, counted as such although the CPUs are in remote mode.
    for c in slub.counters() {
        assert_eq!((c.drains_queued, c.drains_remote), (1, 0), "cpu {}", c.cpu);
    }
    // The rcu sheaves went through a grace period back to the slabs.
    slub.flush_all();
    assert_eq!(slub.slab_free(), 16384);
    slub.check_conservation().unwrap();

    // flush_all, by contrast, runs here, in the requester.
    let _bound = qpw.bind_current(qpw.cpus().first().unwrap()).unwrap();
    let object = slub.kmem_cache_alloc().unwrap().unwrap();
    slub.kmem_cache_free(object).unwrap();
    drop(_bound);
    let outcome = slub.flush_all();
    assert_eq!((outcome.queued, outcome.ran_remote), (0, 1));
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(usize),
    Free(usize, usize),
    FreeRcu(usize, usize),
    FlushAll,
    FlushRcu,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize).prop_map(Op::Alloc),
        3 => (0..2usize, any::<usize>()).prop_map(|(c, i)| Op::Free(c, i)),
        1 => (0..2usize, any::<usize>()).prop_map(|(c, i)| Op::FreeRcu(c, i)),
        1 => Just(Op::FlushAll),
        1 => Just(Op::FlushRcu),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random allocations and frees on two CPUs against a model of what the test holds: an
    /// allocation never hands out an object already held, the cache runs dry only when every
    /// free object sits in a sheaf, a flush empties every main and spare sheaf, and the
    /// conservation law holds after every step.
    #[test]
    fn matches_the_sequential_model(
        capacity in 1..6usize,
        batch_max in 1..4usize,
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let objects = 24;
        let qpw = mixed();
        let slub = Slub::new(&qpw, SlubConfig { sheaf_capacity: capacity, batch_max, objects }).unwrap();
        let mut held: Vec<u32> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc(cpu) => {
                    let _bound = qpw.bind_current(cpu).unwrap();
                    match slub.kmem_cache_alloc().unwrap() {
                        Some(object) => {
                            prop_assert!(!held.contains(&object), "object {} handed out twice", object);
                            held.push(object);
                        }
                        None => prop_assert_eq!(slub.slab_free(), 0),
                    }
                }
                Op::Free(cpu, i) | Op::FreeRcu(cpu, i) if !held.is_empty() => {
                    let _bound = qpw.bind_current(cpu).unwrap();
                    let object = held.swap_remove(i % held.len());
                    if matches!(op, Op::Free(..)) {
                        slub.kmem_cache_free(object).unwrap();
                    } else {
                        slub.kfree_rcu(object).unwrap();
                    }
                }
                Op::Free(..) | Op::FreeRcu(..) => {}
                Op::FlushAll => {
                    let outcome = slub.flush_all();
                    prop_assert!(outcome.errors.is_empty());
                    prop_assert!(slub.sheaf_lens().iter().all(|&(_, main, spare)| main == 0 && spare == 0));
                }
                Op::FlushRcu => {
                    let flush = slub.flush_rcu_sheaves_on_cache();
                    prop_assert_eq!(flush.outcome.queued, 2);
                    slub.flush_all();
                    // Everything not held is back in the slabs or in full barn sheaves.
                    prop_assert_eq!(
                        slub.slab_free() + slub.barn_full() * capacity,
                        objects - held.len()
                    );
                }
            }
            prop_assert_eq!(slub.check_conservation(), Ok(()));
        }
    }
}

fn stress(policy: &str) {
    let (qpw, _root) = mm_common::instance(policy, mm_common::STRESS_CPUS);
    let slub = Slub::new(&qpw, SlubConfig::default()).unwrap();
    let (counters, _) = mm_common::stress(&qpw, &slub, 20_000);
    mm_common::check_drained_by_mode(&qpw, &counters, |_| true);
    let flush = slub.flush_rcu_sheaves_on_cache();
    assert!(flush.outcome.errors.is_empty());
    slub.check_conservation().unwrap();
}

mm_common::stress_tests!(stress);
