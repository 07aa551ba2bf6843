//! Building the mm workloads by name, as the emulator does, and driving them through the
//! `Workload` trait alone.

#![cfg(not(loom))]

mod common;

use common::{mixed, remote};
use qpw_workloads::{build, WorkloadError, WorkloadKind, WorkloadOptions};

#[test]
fn smoke() {
    let qpw = mixed();
    for name in ["lru", "memcg", "slub", "pcp"] {
        let kind: WorkloadKind = name.parse().unwrap();
        assert_eq!(kind.to_string(), name);
        let workload = build(kind, &qpw, &WorkloadOptions::default()).unwrap();
        assert_eq!(workload.name(), name);
        for cpu in 0..2 {
            let _bound = qpw.bind_current(cpu).unwrap();
            for _ in 0..100 {
                workload.process_op().unwrap();
            }
        }
        let outcome = workload.drain(true, None);
        assert!(
            !outcome.skipped && outcome.errors.is_empty(),
            "{name}: {outcome:?}"
        );
        assert_eq!((outcome.queued, outcome.ran_remote), (1, 1), "{name}");
        workload.check_conservation().unwrap();
        let counters = workload.counters();
        assert_eq!(
            counters
                .iter()
                .map(|c| (c.cpu, c.local_ops))
                .collect::<Vec<_>>(),
            [(0, 100), (1, 100)],
            "{name}"
        );
        assert_eq!(
            (counters[0].drains_queued, counters[1].drains_remote),
            (1, 1),
            "{name}"
        );
    }
}

#[test]
fn an_unbound_thread_gets_an_error_not_a_panic() {
    let qpw = remote(2);
    for kind in WorkloadKind::ALL {
        let workload = build(kind, &qpw, &WorkloadOptions::default()).unwrap();
        let err = workload.process_op().unwrap_err();
        assert!(
            matches!(err, qpw_core::Error::Unbound { .. }),
            "{kind}: {err}"
        );
    }
}

#[test]
fn unknown_names_and_bad_sizes_are_named() {
    let err = "slab".parse::<WorkloadKind>().unwrap_err().to_string();
    assert_eq!(
        err,
        "unknown workload `slab`: expected one of lru, memcg, slub, pcp"
    );
    let qpw = remote(1);
    let mut options = WorkloadOptions::default();
    options.slub.batch_max = 0;
    let err = build(WorkloadKind::Slub, &qpw, &options).unwrap_err();
    assert!(matches!(
        err,
        WorkloadError::Parameter {
            name: "PCS_BATCH_MAX",
            value: 0,
            ..
        }
    ));
    assert_eq!(
        err.to_string(),
        "PCS_BATCH_MAX = 0 is out of range: the legal range is 1-4096"
    );
}
