//! resctrl read paths: smoke, then what each path does and does not do, then agreement with
//! the hardware across counter wraps.
#![cfg(not(loom))]

mod resctrl_common;

use qpw_core::sync::{Arc, AtomicBool, Ordering};

use qpw_core::CpuSet;
use qpw_workloads::resctrl::{Config, DomainLayout, Event, Executor, ReadPath, ReadValue, Resctrl};
use resctrl_common::emulated;

/// Two domains of one real CPU each (CPUs 0 and 1), or `None` on a machine without both.
fn two_real_domains(config: Config) -> Option<Resctrl> {
    let allowed = qpw_core::allowed_cpus().unwrap();
    if !(allowed.contains(0) && allowed.contains(1)) {
        eprintln!("skipped: needs CPUs 0 and 1, allowed {allowed}");
        return None;
    }
    let layout = DomainLayout::Physical(vec![CpuSet::from_iter([0]), CpuSet::from_iter([1])]);
    Some(
        Resctrl::new(Config {
            layout,
            overflow_interval: None,
            ..config
        })
        .unwrap(),
    )
}

#[test]
fn smoke_every_path_reads_what_the_hardware_counted() {
    let r = emulated(2, 2, Config::default());
    let g = r.mkdir("g0").unwrap();
    r.inject_traffic(g, 1, 64 * 1000, 64 * 600).unwrap();
    r.set_occupancy(g, 1, 64 * 77).unwrap();
    r.run_overflow_now();
    let _bound = r.qpw().bind_current(0).unwrap();
    for path in ReadPath::ALL {
        for event in Event::ALL {
            let file = r
                .open(&format!("mon_groups/g0/mon_data/mon_L3_01/{event}"))
                .unwrap();
            let read = r.read_with(&file, path).unwrap();
            assert_eq!(
                read.value,
                ReadValue::Value(r.source_bytes(&file)),
                "{path} {event}"
            );
        }
    }
    let total = r
        .open("mon_groups/g0/mon_data/mon_L3_01/mbm_total_bytes")
        .unwrap();
    assert_eq!(r.source_bytes(&total), 64_000);
    assert_eq!(r.violations(), 0);
}

#[test]
fn a_read_from_outside_the_domain_is_caught() {
    // Logical layout: the thread's binding says where it runs.
    let r = emulated(2, 1, Config::default());
    let file = r.open("mon_data/mon_L3_01/mbm_total_bytes").unwrap();
    {
        let _bound = r.qpw().bind_current(0).unwrap();
        assert_eq!(r.arch_rmid_read(&file), ReadValue::Error);
    }
    assert_eq!(r.violations(), 1);
    // An unbound thread runs nowhere the model knows of: caught too.
    assert_eq!(r.arch_rmid_read(&file), ReadValue::Error);
    assert_eq!(r.violations(), 2);
    // From inside the domain the read is fine.
    let _bound = r.qpw().bind_current(1).unwrap();
    assert_eq!(r.arch_rmid_read(&file), ReadValue::Value(0));
    assert_eq!(r.violations(), 2);

    // Physical layout: sched_getcpu decides.
    let Some(r) = two_real_domains(Config::default()) else {
        return;
    };
    let file = r.open("mon_data/mon_L3_01/mbm_local_bytes").unwrap();
    qpw_core::pin_current_thread(0).unwrap();
    assert_eq!(r.arch_rmid_read(&file), ReadValue::Error);
    assert_eq!(r.violations(), 1);
    qpw_core::pin_current_thread(1).unwrap();
    assert_eq!(r.arch_rmid_read(&file), ReadValue::Value(0));
    assert_eq!(r.violations(), 1);
    qpw_core::set_current_affinity(&qpw_core::allowed_cpus().unwrap()).unwrap();
}

#[test]
fn workqueue_hops_through_the_worker_even_from_inside_the_domain() {
    let r = emulated(2, 2, Config::default());
    let file = r.open("mon_data/mon_L3_00/mbm_total_bytes").unwrap();
    let _bound = r.qpw().bind_current(1).unwrap(); // in domain 0, not its housekeeping CPU
    let read = r.read_with(&file, ReadPath::Workqueue).unwrap();
    assert_eq!(read.executor, Executor::Worker { cpu: 0 });
    let counts = r.path_counts();
    assert_eq!(counts.worker_runs, 1);
    assert_eq!(counts.reader_direct, 0);
    let stats = r.hold_stats(ReadPath::Workqueue);
    assert_eq!(stats.reads, 1);
}

#[test]
fn local_reads_directly_in_the_domain_and_falls_back_outside() {
    let r = emulated(2, 2, Config::default());
    let here = r.open("mon_data/mon_L3_00/mbm_total_bytes").unwrap();
    let there = r.open("mon_data/mon_L3_01/mbm_total_bytes").unwrap();
    let _bound = r.qpw().bind_current(1).unwrap();
    let read = r.read_with(&here, ReadPath::Local).unwrap();
    assert_eq!(read.executor, Executor::Reader { cpu: 1 });
    assert_eq!(r.path_counts().worker_runs, 0);
    assert_eq!(r.path_counts().reader_direct, 1);
    let read = r.read_with(&there, ReadPath::Local).unwrap();
    assert_eq!(read.executor, Executor::Worker { cpu: 2 });
    let counts = r.path_counts();
    assert_eq!((counts.worker_runs, counts.local_fallbacks), (1, 1));
    assert_eq!(r.violations(), 0);
}

#[test]
fn interrupt_runs_on_a_domain_cpu_by_interrupting_the_thread_there() {
    let Some(r) = two_real_domains(Config::default()) else {
        return;
    };
    let r = Arc::new(r);
    let g = r.mkdir("busy").unwrap();
    r.inject_traffic(g, 1, 6400, 640).unwrap();
    let file = r
        .open("mon_groups/busy/mon_data/mon_L3_01/mbm_total_bytes")
        .unwrap();

    // The thread running on CPU 1: busy, registered, and counting its interruptions.
    let ready = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let (rr, rd, st) = (r.clone(), ready.clone(), stop.clone());
    let target = std::thread::spawn(move || {
        let _bound = rr.qpw().bind_current(1).unwrap();
        let target = rr.register_current_thread(1).unwrap();
        rd.store(true, Ordering::Release);
        while !st.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        (target.calls(), target.last_phys_cpu())
    });
    while !ready.load(Ordering::Acquire) {
        std::thread::yield_now();
    }

    let _bound = r.qpw().bind_current(0).unwrap();
    let read = r.read_with(&file, ReadPath::Interrupt).unwrap();
    assert_eq!(read.value, ReadValue::Value(6400));
    assert_eq!(
        read.executor,
        Executor::Interrupt {
            cpu: 1,
            phys_cpu: Some(1)
        }
    );
    assert_eq!(r.interruptions_on(1), 1);
    assert_eq!(r.path_counts().worker_runs, 0);

    // From inside the domain the reader's own CPU is preferred: no interruption.
    let own = r
        .open("mon_groups/busy/mon_data/mon_L3_00/mbm_total_bytes")
        .unwrap();
    let read = r.read_with(&own, ReadPath::Interrupt).unwrap();
    assert_eq!(read.executor, Executor::Reader { cpu: 0 });
    assert_eq!(r.interruptions_on(1), 1);

    stop.store(true, Ordering::Release);
    let (calls, phys) = target.join().unwrap();
    assert_eq!(calls, 1);
    assert_eq!(phys, Some(1));
    assert_eq!(r.violations(), 0);
}

#[test]
fn interrupt_without_a_registered_thread_uses_an_idle_stand_in() {
    let r = emulated(2, 1, Config::default());
    let file = r.open("mon_data/mon_L3_01/mbm_local_bytes").unwrap();
    let _bound = r.qpw().bind_current(0).unwrap();
    for _ in 0..3 {
        let read = r.read_with(&file, ReadPath::Interrupt).unwrap();
        assert!(matches!(read.executor, Executor::Interrupt { cpu: 1, .. }));
        assert_eq!(read.value, ReadValue::Value(0));
    }
    assert_eq!(r.interruptions_on(1), 3);
    assert_eq!(r.path_counts().interrupts, 3);
    assert_eq!(r.violations(), 0);
}

#[test]
fn cached_does_no_cross_cpu_work_and_says_how_old() {
    let r = emulated(2, 1, Config::default());
    let g = r.mkdir("c").unwrap();
    let file = r
        .open("mon_groups/c/mon_data/mon_L3_01/mbm_total_bytes")
        .unwrap();
    let _bound = r.qpw().bind_current(0).unwrap();
    // Nothing sampled yet.
    let read = r.read_with(&file, ReadPath::Cached).unwrap();
    assert_eq!(read.value, ReadValue::Unavailable);

    r.inject_traffic(g, 1, 64 * 100, 0).unwrap();
    r.run_overflow_now();
    let runs = r.overflow_runs(1);
    let before = r.path_counts();
    let irqs = r.interruptions_on(1);
    r.inject_traffic(g, 1, 64 * 5, 0).unwrap();
    let read = r.read_with(&file, ReadPath::Cached).unwrap();
    // The value of the last overflow run, not what the hardware counts now.
    assert_eq!(read.value, ReadValue::Value(6400));
    assert_eq!(r.source_bytes(&file), 6720);
    assert_eq!(read.executor, Executor::Cache);
    assert!(read.age.is_some());
    assert!(read.rate.is_some());
    let after = r.path_counts();
    assert_eq!(after.worker_runs, before.worker_runs);
    assert_eq!(after.interrupts, before.interrupts);
    assert_eq!(after.reader_direct, before.reader_direct);
    assert_eq!(after.cached, before.cached + 1);
    assert_eq!(r.interruptions_on(1), irqs);
    assert_eq!(r.overflow_runs(1), runs);
}

/// Every path stays monotone and exact across many wraps of a 24-bit counter, as long as some
/// read (the overflow worker's at least) comes once per wrap; the cache lags by at most one
/// overflow period.
#[test]
fn values_are_monotone_and_agree_with_the_hardware_across_wraps() {
    let r = emulated(
        2,
        1,
        Config {
            counter_width: 24,
            mon_scale: 1,
            ..Config::default()
        },
    );
    let g = r.mkdir("wrap").unwrap();
    let _bound = r.qpw().bind_current(0).unwrap();
    let files: Vec<_> = [0, 1]
        .into_iter()
        .flat_map(|d| {
            [Event::MbmTotalBytes, Event::MbmLocalBytes].map(|e| {
                r.open(&format!("mon_groups/wrap/mon_data/mon_L3_{d:02}/{e}"))
                    .unwrap()
            })
        })
        .collect();
    let step = (1u64 << 24) * 3 / 5; // below one wrap
    let mut last = vec![[0u64; 4]; files.len()];
    let mut sampled = vec![0u64; files.len()];
    for round in 0..40 {
        for d in 0..2 {
            r.inject_traffic(g, d, step, step / 2).unwrap();
        }
        // The overflow worker runs every other round: at most one wrap between its reads.
        if round % 2 == 0 {
            r.run_overflow_now();
            for (i, f) in files.iter().enumerate() {
                sampled[i] = r.source_bytes(f);
            }
        }
        for (i, file) in files.iter().enumerate() {
            let truth = r.source_bytes(file);
            for (p, path) in ReadPath::ALL.into_iter().enumerate() {
                let Some(v) = r.read_with(file, path).unwrap().value.value() else {
                    panic!("{path}: no value");
                };
                assert!(
                    v >= last[i][p],
                    "{path} went backwards: {} -> {v}",
                    last[i][p]
                );
                last[i][p] = v;
                if path == ReadPath::Cached {
                    assert_eq!(v, sampled[i], "cached lags more than one period");
                    assert!(truth - v <= 2 * step);
                } else {
                    assert_eq!(v, truth, "{path} round {round}");
                }
            }
        }
    }
    assert!(
        r.source_bytes(&files[0]) > 20 << 24,
        "the counter wrapped many times"
    );
    assert_eq!(r.violations(), 0);
}

#[test]
fn two_wraps_between_reads_lose_exactly_one_wrap() {
    // The reason for the overflow worker: mbm_overflow_count assumes one wrap at most.
    let r = emulated(
        1,
        1,
        Config {
            counter_width: 24,
            mon_scale: 1,
            ..Config::default()
        },
    );
    let file = r.open("mon_data/mon_L3_00/mbm_total_bytes").unwrap();
    let _bound = r.qpw().bind_current(0).unwrap();
    r.inject_traffic(0, 0, (1 << 24) + 1000, 0).unwrap();
    let v = r
        .read_with(&file, ReadPath::Local)
        .unwrap()
        .value
        .value()
        .unwrap();
    assert_eq!(v, 1000);
    assert_eq!(r.source_bytes(&file) - v, 1 << 24);
}

#[test]
fn amd_width_counts_far_without_an_overflow_run() {
    let r = emulated(
        1,
        1,
        Config {
            counter_width: 24 + qpw_workloads::resctrl::MBM_CNTR_WIDTH_OFFSET_AMD,
            mon_scale: 1,
            ..Config::default()
        },
    );
    let file = r.open("mon_data/mon_L3_00/mbm_total_bytes").unwrap();
    let _bound = r.qpw().bind_current(0).unwrap();
    r.inject_traffic(0, 0, 5 << 24, 0).unwrap();
    let v = r.read_with(&file, ReadPath::Local).unwrap().value.value();
    assert_eq!(v, Some(5 << 24));
}
