//! The pcp workload: per-CPU page lists, `drain_all_pages` global and per zone, in every mode.

#![cfg(not(loom))]

mod common;
mod mm_common;

use common::{mixed, remote};
use proptest::prelude::*;
use qpw_workloads::pcp::{Pcp, PcpConfig, PCP_BATCH, PCP_HIGH};
use qpw_workloads::{Workload, WorkloadError};

fn small() -> PcpConfig {
    PcpConfig {
        batch: 4,
        high: 8,
        zones: 2,
        pages_per_zone: 32,
    }
}

#[test]
fn smoke() {
    let qpw = mixed();
    let pcp = Pcp::new(&qpw, PcpConfig::default()).unwrap();
    assert_eq!((PCP_BATCH, PCP_HIGH), (63, 378));
    for cpu in 0..2 {
        let _bound = qpw.bind_current(cpu).unwrap();
        for _ in 0..100 {
            pcp.process_op().unwrap();
        }
    }
    // Every CPU pulled a batch from each zone.
    for (cpu, count) in pcp.pcp_counts() {
        assert!(count >= PCP_BATCH, "cpu {cpu}: {count}");
    }
    pcp.check_conservation().unwrap();
    let outcome = pcp.drain_all_pages(None).unwrap();
    assert_eq!((outcome.queued, outcome.ran_remote), (1, 1));
    assert_eq!(pcp.pcp_counts(), [(0, 0), (1, 0)]);
    pcp.check_conservation().unwrap();
}

#[test]
fn only_cpus_with_pages_in_the_zone_are_drained() {
    let qpw = remote(3);
    let pcp = Pcp::new(&qpw, small()).unwrap();
    for (cpu, zone) in [(0, 0), (2, 1)] {
        let _bound = qpw.bind_current(cpu).unwrap();
        let page = pcp.rmqueue_pcplist(zone).unwrap().unwrap();
        pcp.free_unref_page(page).unwrap();
    }
    let outcome = pcp.drain_all_pages(Some(1)).unwrap();
    assert_eq!((outcome.ran_remote, outcome.skipped_cpus), (1, 2));
    assert_eq!(pcp.pcp_counts(), [(0, 4), (1, 0), (2, 0)]);
    assert_eq!(pcp.zone_free(1), 32);
    let outcome = pcp.drain_all_pages(None).unwrap();
    assert_eq!((outcome.ran_remote, outcome.skipped_cpus), (1, 2));
    assert_eq!(pcp.zone_free(0), 32);
    pcp.check_conservation().unwrap();
}

#[test]
fn a_global_drain_returns_while_one_runs_and_a_zone_drain_waits() {
    let qpw = mixed();
    let pcp = Pcp::new(&qpw, small()).unwrap();
    {
        let _bound = qpw.bind_current(1).unwrap();
        let page = pcp.rmqueue_pcplist(0).unwrap().unwrap();
        pcp.free_unref_page(page).unwrap();
    }
    let running = pcp.hold_drain();
    // Global: returns at once, nothing drained.
    let outcome = pcp.drain_all_pages(None).unwrap();
    assert!(outcome.skipped);
    assert_eq!(pcp.pcp_counts()[1], (1, 4));
    std::thread::scope(|s| {
        let zone_drain = s.spawn(|| pcp.drain_all_pages(Some(0)).unwrap());
        // The zone drain cannot finish while the mutex is held: it waits, it does not skip.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!zone_drain.is_finished(), "the zone drain did not wait");
        drop(running);
        let outcome = zone_drain.join().unwrap();
        assert!(!outcome.skipped);
        assert_eq!(outcome.ran_remote, 1);
    });
    assert_eq!(pcp.pcp_counts()[1], (1, 0));
    pcp.check_conservation().unwrap();
}

#[test]
fn bad_input_is_named() {
    let qpw = mixed();
    let err = Pcp::new(&qpw, PcpConfig { high: 2, ..small() })
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "pcp->high = 2 is out of range: the legal range is 4-1048576"
    );
    let pcp = Pcp::new(&qpw, small()).unwrap();
    let _bound = qpw.bind_current(0).unwrap();
    let err = pcp.free_unref_page(64).unwrap_err().to_string();
    assert_eq!(err, "page = 64 is out of range: the legal range is 0-63");
    let err = pcp.drain_all_pages(Some(7)).unwrap_err().to_string();
    assert_eq!(err, "zone = 7 is out of range: the legal range is 0-1");
}

#[test]
fn a_double_free_is_refused_and_changes_nothing() {
    let qpw = mixed();
    let pcp = Pcp::new(&qpw, small()).unwrap();
    let _bound = qpw.bind_current(0).unwrap();
    let page = pcp.rmqueue_pcplist(1).unwrap().unwrap();
    pcp.free_unref_page(page).unwrap();
    let before = (pcp.pcp_counts(), pcp.zone_free(1));
    let err = pcp.free_unref_page(page).unwrap_err();
    assert!(
        matches!(err, WorkloadError::NotAllocated { kind: "page", id, .. } if id == u64::from(page)),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "page {page} is not allocated: a double free, or never handed out by rmqueue_pcplist"
        )
    );
    assert_eq!((pcp.pcp_counts(), pcp.zone_free(1)), before);
    pcp.check_conservation().unwrap();
    // A page still in its zone's free list was never handed out: refused too.
    assert!(matches!(
        pcp.free_unref_page(0),
        Err(WorkloadError::NotAllocated { id: 0, .. })
    ));
    pcp.check_conservation().unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { cpu: usize, zone: usize },
    Free { cpu: usize, pick: usize },
    Drain { zone: Option<usize> },
    Process { cpu: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, 0..2usize).prop_map(|(cpu, zone)| Op::Alloc { cpu, zone }),
        4 => (0..2usize, any::<usize>()).prop_map(|(cpu, pick)| Op::Free { cpu, pick }),
        1 => prop::option::of(0..2usize).prop_map(|zone| Op::Drain { zone }),
        1 => (0..2usize).prop_map(|cpu| Op::Process { cpu }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random allocations, frees and drains against a counting model of the lists and the
    /// zones' free pages (refill a batch when empty, return a batch at high).
    #[test]
    fn matches_the_sequential_model(ops in prop::collection::vec(op(), 1..120)) {
        let qpw = mixed();
        let config = small();
        let pcp = Pcp::new(&qpw, config.clone()).unwrap();
        let mut lists = [[0usize; 2]; 2]; // [cpu][zone]
        let mut free = [32usize; 2];
        let mut held: Vec<u32> = Vec::new();
        // process_op's side: operations done and the zones of the pages its tasks hold, per CPU.
        let mut done = [0usize; 2];
        let mut tasks: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
        // The model's rmqueue and free; `alloc` says whether a page came out.
        let alloc = |lists: &mut [[usize; 2]; 2], free: &mut [usize; 2], cpu: usize, zone: usize| {
            if lists[cpu][zone] == 0 {
                let take = free[zone].min(config.batch);
                free[zone] -= take;
                lists[cpu][zone] += take;
            }
            let got = lists[cpu][zone] > 0;
            if got {
                lists[cpu][zone] -= 1;
            }
            got
        };
        let release = |lists: &mut [[usize; 2]; 2], free: &mut [usize; 2], cpu: usize, zone: usize| {
            lists[cpu][zone] += 1;
            if lists[cpu][zone] >= config.high {
                lists[cpu][zone] -= config.batch;
                free[zone] += config.batch;
            }
        };
        for op in ops {
            match op {
                Op::Alloc { cpu, zone } => {
                    let _bound = qpw.bind_current(cpu).unwrap();
                    let page = pcp.rmqueue_pcplist(zone).unwrap();
                    if alloc(&mut lists, &mut free, cpu, zone) {
                        let page = page.expect("the model has a page");
                        prop_assert_eq!(page as usize / 32, zone);
                        prop_assert!(!held.contains(&page));
                        held.push(page);
                    } else {
                        prop_assert_eq!(page, None);
                    }
                }
                Op::Free { cpu, pick } if !held.is_empty() => {
                    let _bound = qpw.bind_current(cpu).unwrap();
                    let page = held.swap_remove(pick % held.len());
                    pcp.free_unref_page(page).unwrap();
                    release(&mut lists, &mut free, cpu, page as usize / 32);
                }
                Op::Free { .. } => {}
                Op::Drain { zone } => {
                    let busy = (0..2)
                        .filter(|&c| zone.map_or(lists[c].iter().sum::<usize>(), |z| lists[c][z]) > 0)
                        .count();
                    let outcome = pcp.drain_all_pages(zone).unwrap();
                    prop_assert_eq!(outcome.queued + outcome.ran_remote, busy);
                    for list in lists.iter_mut() {
                        for z in (0..2).filter(|&z| zone.is_none_or(|zone| zone == z)) {
                            free[z] += std::mem::take(&mut list[z]);
                        }
                    }
                }
                Op::Process { cpu } => {
                    // Eight allocations (zone by round), then eight frees, newest first.
                    let _bound = qpw.bind_current(cpu).unwrap();
                    pcp.process_op().unwrap();
                    done[cpu] += 1;
                    let n = done[cpu];
                    if n % 16 < 8 {
                        let zone = (n / 16) % 2;
                        if alloc(&mut lists, &mut free, cpu, zone) {
                            tasks[cpu].push(zone);
                        }
                    } else if let Some(zone) = tasks[cpu].pop() {
                        release(&mut lists, &mut free, cpu, zone);
                    }
                }
            }
            let counts: Vec<usize> = pcp.pcp_counts().into_iter().map(|(_, n)| n).collect();
            prop_assert_eq!(counts, vec![lists[0].iter().sum::<usize>(), lists[1].iter().sum()]);
            prop_assert_eq!((pcp.zone_free(0), pcp.zone_free(1)), (free[0], free[1]));
            prop_assert_eq!(pcp.check_conservation(), Ok(()));
        }
    }
}

fn stress(policy: &str) {
    let (qpw, _root) = mm_common::instance(policy, mm_common::STRESS_CPUS);
    let pcp = Pcp::new(&qpw, PcpConfig::default()).unwrap();
    let (counters, _) = mm_common::stress(&qpw, &pcp, 20_000);
    mm_common::check_drained_by_mode(&qpw, &counters, |_| true);
    assert!(pcp.pcp_counts().iter().all(|&(_, n)| n == 0));
}

mm_common::stress_tests!(stress);
