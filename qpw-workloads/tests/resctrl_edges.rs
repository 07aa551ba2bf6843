//! resctrl edge cases: configuration ranges, file paths, groups coming and going, the
//! kernel's non-value results, and the figures' shape.
#![cfg(not(loom))]

use qpw_workloads::resctrl::{
    measure_read_paths, Config, DomainLayout, Event, FiguresConfig, FleetLoad, ReadPath, ReadValue,
    Resctrl, ResctrlError,
};

fn small() -> Resctrl {
    Resctrl::new(Config {
        layout: DomainLayout::Emulated {
            domains: 2,
            cpus_per_domain: 1,
        },
        num_rmids: 3,
        overflow_interval: None,
        ..Config::default()
    })
    .unwrap()
}

#[test]
fn smoke_file_paths_round_trip() {
    let r = small();
    r.mkdir("a").unwrap();
    let paths = Resctrl::file_paths(&["a", ""], &Event::ALL, &[0, 1]);
    assert_eq!(paths.len(), 12);
    assert_eq!(paths[0], "mon_groups/a/mon_data/mon_L3_00/mbm_total_bytes");
    assert_eq!(paths[6], "mon_data/mon_L3_00/mbm_total_bytes");
    for p in &paths {
        let f = r.open(p).unwrap();
        assert_eq!(f.path(), p);
    }
    let f = r
        .open("/sys/fs/resctrl/mon_groups/a/mon_data/mon_L3_01/llc_occupancy")
        .unwrap();
    assert_eq!(
        (f.domain(), f.event(), f.rmid()),
        (1, Event::LlcOccupancy, 1)
    );
}

#[test]
fn configuration_out_of_range_names_the_range() {
    let err = |c: Config| Resctrl::new(c).unwrap_err().to_string();
    let e = err(Config {
        num_rmids: 0,
        ..Config::default()
    });
    assert!(e.contains("1-4096"), "{e}");
    let e = err(Config {
        num_rmids: 4097,
        ..Config::default()
    });
    assert!(e.contains("4097") && e.contains("1-4096"), "{e}");
    let e = err(Config {
        counter_width: 63,
        ..Config::default()
    });
    assert!(e.contains("8-62"), "{e}");
    let e = err(Config {
        mon_scale: 0,
        ..Config::default()
    });
    assert!(e.contains("mon_scale"), "{e}");
    let e = err(Config {
        layout: DomainLayout::Emulated {
            domains: 0,
            cpus_per_domain: 8,
        },
        ..Config::default()
    });
    assert!(e.contains("1-256"), "{e}");
    let e = err(Config {
        layout: DomainLayout::Physical(vec![]),
        ..Config::default()
    });
    assert!(e.contains("no L3 domain"), "{e}");
    let e = err(Config {
        layout: DomainLayout::Physical(vec!["0".parse().unwrap(), "0".parse().unwrap()]),
        ..Config::default()
    });
    assert!(e.contains("overlaps"), "{e}");
}

#[test]
fn bad_paths_say_what_is_wrong() {
    let r = small();
    let e = r.open("mon_data/mon_L3_07/mbm_total_bytes").unwrap_err();
    assert!(
        matches!(e, ResctrlError::NoSuchDomain { domain: 7, last: 1 }),
        "{e}"
    );
    let e = r.open("mon_data/mon_L3_00/mbm_fast_bytes").unwrap_err();
    assert!(e.to_string().contains("mbm_fast_bytes"), "{e}");
    let e = r.open("mon_data/L3_00/mbm_total_bytes").unwrap_err();
    assert!(e.to_string().contains("mon_L3_"), "{e}");
    let e = r
        .open("mon_groups/nope/mon_data/mon_L3_00/mbm_total_bytes")
        .unwrap_err();
    assert!(matches!(e, ResctrlError::NoSuchGroup { .. }), "{e}");
    let e = r.open("mon_data").unwrap_err();
    assert!(e.to_string().contains("wrong number of components"), "{e}");
    assert!("fast".parse::<ReadPath>().is_err());
    assert_eq!("cached".parse::<ReadPath>().unwrap(), ReadPath::Cached);
}

#[test]
fn groups_fill_the_rmids_and_removed_groups_cannot_be_read() {
    let r = small();
    assert_eq!(r.mkdir("a").unwrap(), 1);
    assert_eq!(r.mkdir("b").unwrap(), 2);
    assert!(matches!(
        r.mkdir("c"),
        Err(ResctrlError::NoFreeRmid { max: 3 })
    ));
    assert!(matches!(
        r.mkdir("a"),
        Err(ResctrlError::GroupExists { .. })
    ));
    assert!(matches!(
        r.mkdir("x/y"),
        Err(ResctrlError::GroupName { .. })
    ));
    let f = r
        .open("mon_groups/a/mon_data/mon_L3_00/mbm_total_bytes")
        .unwrap();
    r.rmdir("a").unwrap();
    let _bound = r.qpw().bind_current(0).unwrap();
    assert!(matches!(
        r.read_with(&f, ReadPath::Local),
        Err(ResctrlError::GroupRemoved { .. })
    ));
    // The RMID is reused, with fresh counters, and the old handle stays dead.
    r.inject_traffic(1, 0, 0, 0).unwrap_err();
    assert_eq!(r.mkdir("a2").unwrap(), 1);
    r.inject_traffic(1, 0, 640, 0).unwrap();
    assert!(r.read_with(&f, ReadPath::Local).is_err());
    let g = r
        .open("mon_groups/a2/mon_data/mon_L3_00/mbm_total_bytes")
        .unwrap();
    assert_eq!(
        r.read_with(&g, ReadPath::Local).unwrap().value,
        ReadValue::Value(640)
    );
    assert!(matches!(r.rmdir(""), Err(ResctrlError::NoSuchGroup { .. })));
}

#[test]
fn unassigned_and_unavailable_read_as_the_kernel_prints_them() {
    let r = small();
    let f = r.open("mon_data/mon_L3_01/mbm_local_bytes").unwrap();
    let _bound = r.qpw().bind_current(0).unwrap();
    r.set_unassigned(&f, true);
    for path in [ReadPath::Workqueue, ReadPath::Interrupt, ReadPath::Local] {
        let read = r.read_with(&f, path).unwrap();
        assert_eq!(read.value, ReadValue::Unassigned, "{path}");
        assert_eq!(read.value.to_string(), "Unassigned");
    }
    r.set_unassigned(&f, false);
    r.set_unavailable(&f, true);
    let read = r.read_with(&f, ReadPath::Interrupt).unwrap();
    assert_eq!(read.value.to_string(), "Unavailable");
    r.set_unavailable(&f, false);
    assert_eq!(
        r.read_with(&f, ReadPath::Workqueue)
            .unwrap()
            .value
            .to_string(),
        "0"
    );
    assert_eq!(r.hold_stats(ReadPath::Workqueue).non_values, 1);
    assert_eq!(r.violations(), 0);
}

#[test]
fn figures_have_the_shape_the_emulator_expects() {
    let figures = measure_read_paths(&FiguresConfig {
        layout: DomainLayout::Emulated {
            domains: 2,
            cpus_per_domain: 2,
        },
        groups: Some(2),
        passes: 2,
        load: FleetLoad {
            threads_per_cpu: 2,
            interruptible: true,
        },
        ..FiguresConfig::default()
    })
    .unwrap();
    assert!(figures.logical);
    assert_eq!(figures.files, 2 * 3 * 2);
    assert_eq!(figures.load_threads, 3 * 2);
    assert_eq!((figures.reader_cpu, figures.reader_domain), (0, 0));
    assert_eq!(figures.violations, 0);
    let paths: Vec<ReadPath> = figures.paths.iter().map(|p| p.path).collect();
    assert_eq!(paths, ReadPath::ALL);
    let reads = 2 * 12;
    for p in &figures.paths {
        assert_eq!(p.reads, reads, "{}", p.path);
        assert_eq!(p.non_values, 0, "{}", p.path);
        assert_eq!(p.local_files, 6);
        assert!(p.hold_max >= p.hold_avg);
    }
    let [wq, irq, local, cached] = &figures.paths[..] else {
        unreachable!()
    };
    // The workqueue hops for every read; the others never do for the reader's domain.
    assert_eq!(wq.counts.worker_runs, reads);
    assert_eq!(irq.counts.worker_runs, 0);
    assert_eq!(irq.counts.reader_direct, reads / 2);
    assert_eq!(irq.counts.interrupts, reads / 2);
    assert!(irq.interruptions >= reads / 2);
    assert_eq!(local.counts.reader_direct, reads / 2);
    assert_eq!(local.counts.local_fallbacks, reads / 2);
    assert_eq!(cached.counts.cached, reads);
    assert_eq!(cached.counts.worker_runs + cached.counts.interrupts, 0);
    assert_eq!(cached.interruptions, 0);
    assert!(cached.cached_age_max.is_some());
    assert!(wq.cached_age_max.is_none());

    let err = measure_read_paths(&FiguresConfig {
        groups: Some(0),
        ..FiguresConfig::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("1-4095"), "{err}");
}

#[test]
fn fastcat_opens_once_and_reads_pass_after_pass() {
    let r = small();
    let g = r.mkdir("a").unwrap();
    let paths = Resctrl::file_paths(&["a"], &[Event::MbmTotalBytes], &[0, 1]);
    let cat = qpw_workloads::resctrl::Fastcat::open(&r, &paths).unwrap();
    assert_eq!(cat.files().len(), 2);
    let _bound = r.qpw().bind_current(0).unwrap();
    r.set_read_path(ReadPath::Local);
    let mut seen = Vec::new();
    for round in 1..=3u64 {
        r.inject_traffic(g, 0, 64 * round, 0).unwrap();
        let pass = cat
            .pass_with(|f, read| seen.push((f.domain(), read.value)))
            .unwrap();
        assert_eq!((pass.files, pass.non_values), (2, 0));
    }
    let domain0: Vec<_> = seen
        .iter()
        .filter(|(d, _)| *d == 0)
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(
        domain0,
        [64, 192, 384].map(ReadValue::Value),
        "each pass sees the traffic so far"
    );
    // One read per file per pass, all under the mutex, none of them remote for domain 0.
    assert_eq!(r.hold_stats(ReadPath::Local).reads, 6);
    assert_eq!(r.path_counts().reader_direct, 3);
    assert_eq!(r.path_counts().local_fallbacks, 3);
    // A path that does not open fails the whole setup, naming the path.
    let err = qpw_workloads::resctrl::Fastcat::open(&r, &["mon_data/mon_L3_09/llc_occupancy"])
        .unwrap_err();
    assert!(err.to_string().contains("domain 9"), "{err}");
}
