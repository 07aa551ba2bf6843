//! Loom model of resctrl's counter assignment (ABMC, `mbm_event` mode) against reads. Run with
//! `bash .ci/loom` (or `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p
//! qpw-workloads --test resctrl_loom`).
//!
//! The world: one emulated domain of one CPU, two groups' worth of RMIDs, one assignable
//! counter (instead of 32: the protocol does not depend on how many), 8-bit counters of 1-byte
//! chunks. Loom allows five threads, the main one included: the model's own two (the CPU's
//! worker and the domain's overflow worker, both idle here), a thread moving bytes as the
//! hardware counts them, and one re-assigning the counter, while the main thread reads.

#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;

use qpw_workloads::resctrl::{Config, DomainLayout, ReadPath, ReadValue, Resctrl};

/// Bytes each of the traffic thread's two steps moves.
const STEP: u64 = 3;

/// The counter is taken from the default group's `mbm_total_bytes`, given to its
/// `mbm_local_bytes`, and back, while the hardware counts (without any lock, as hardware does)
/// and the main thread reads the total. Every read is `Unassigned` or a count of no more bytes
/// than were moved; after the last assignment, a read is exactly what the hardware counted
/// since that assignment (the counter restarted from zero there, from one snapshot of the
/// count however the traffic interleaves), and the event that lost the counter reads
/// `Unassigned`. The counters' table ends full, with one counter.
#[test]
fn loom_counter_assignment_against_reads() {
    loom::model(|| {
        let r = Arc::new(
            Resctrl::new(Config {
                layout: DomainLayout::Emulated {
                    domains: 1,
                    cpus_per_domain: 1,
                },
                num_rmids: 2,
                counter_width: 8,
                mon_scale: 1,
                overflow_interval: None,
                assignable_counters: Some(1),
                ..Config::default()
            })
            .expect("build the model"),
        );
        let total = r.open("mon_data/mon_L3_00/mbm_total_bytes").unwrap();
        let local = r.open("mon_data/mon_L3_00/mbm_local_bytes").unwrap();
        // The one counter went to the default group's first event.
        assert_eq!(r.counter_of(&total), Some(0));
        assert_eq!(r.counter_of(&local), None);

        let traffic = {
            let r = r.clone();
            thread::spawn(move || {
                for _ in 0..2 {
                    r.inject_traffic(0, 0, STEP, STEP).unwrap();
                }
            })
        };
        let reassign = {
            let (r, total, local) = (r.clone(), total.clone(), local.clone());
            thread::spawn(move || {
                r.unassign(&total).unwrap();
                r.assign(&local).unwrap();
                r.unassign(&local).unwrap();
                r.assign(&total).unwrap();
            })
        };

        let bound = r.qpw().bind_current(0).unwrap();
        for _ in 0..2 {
            match r.read_with(&total, ReadPath::Local).unwrap().value {
                ReadValue::Unassigned => {}
                ReadValue::Value(v) => {
                    assert!(
                        v <= 2 * STEP,
                        "{v} bytes counted, at most {} moved",
                        2 * STEP
                    );
                }
                other => panic!("a read of an assignable counter gave {other:?}"),
            }
        }
        traffic.join().unwrap();
        reassign.join().unwrap();

        // The counter is back on the total: what it reads is exactly what the hardware
        // counted since that assignment, and the local event reads Unassigned.
        assert_eq!(r.free_counters(0).unwrap(), 0);
        let read = r.read_with(&total, ReadPath::Local).unwrap().value;
        assert_eq!(read, ReadValue::Value(r.source_bytes(&total)));
        assert!(r.source_bytes(&total) <= 2 * STEP);
        assert_eq!(
            r.read_with(&local, ReadPath::Local).unwrap().value,
            ReadValue::Unassigned
        );
        assert_eq!(r.violations(), 0);
        drop(bound);
    });
}
