//! The buffer pools under hackbench with AppArmor's hook on every send and receive: each hook
//! gets a buffer and puts it back on its own CPU, so every buffer goes back to the pool it came
//! from (or where the design's rules move it), none is lost or owned twice, and conservation
//! holds after every run, for both transports, on real and on logical CPUs.
#![cfg(not(loom))]

mod common;

use qpw_core::{CpuSpec, Policy, Qpw};
use qpw_workloads::pool::{
    build, hackbench, hooks_alone, BufferPool, Design, HackbenchConfig, PerCpuPools, Transport,
};

const LOOPS: usize = if cfg!(miri) { 5 } else { 300 };

/// One run, then what must hold after any run: every hook's get paired with a put, nothing in
/// use, no buffer owned twice, every buffer in exactly one place.
fn run_and_check(qpw: &Qpw, pool: &dyn BufferPool, config: &HackbenchConfig) {
    let report = hackbench(qpw, pool, config).unwrap();
    let s = report.stats;
    let design = pool.design();
    assert_eq!(report.hooks, 2 * config.messages(), "{design}");
    assert_eq!((s.gets, s.puts), (report.hooks, report.hooks), "{design}");
    assert_eq!(s.in_use, 0, "{design}");
    assert_eq!(
        report.corrupt, 0,
        "{design}: a buffer was used by two hooks at once"
    );
    assert_eq!(s.violations, 0, "{design}");
    assert!(s.allocated <= s.capacity, "{design}");
    if let Err(e) = pool.check_conservation() {
        panic!("{design}: {e}");
    }
    match design {
        // Got and put on one CPU: always back to that CPU's own pool, never a remote return,
        // and every get served there.
        Design::PerCpuPools => {
            assert_eq!(s.remote_returns, 0);
            assert_eq!(s.local_hits, s.gets);
        }
        // The global list or the CPU's cache: the global design never serves locally.
        Design::GlobalLock => assert_eq!(s.local_hits, 0),
        Design::PerCpuCache => assert!(s.local_hits <= s.gets),
    }
}

#[test]
fn stress_every_hook_pairs_its_get_and_put_on_real_cpus() {
    let qpw = common::instance_on(CpuSpec::Allowed, Policy::Remote);
    for transport in [Transport::Pipe, Transport::Socketpair] {
        let config = HackbenchConfig {
            groups: 3,
            fds: 4,
            loops: LOOPS,
            transport,
            ..HackbenchConfig::default()
        };
        for design in Design::ALL {
            let pool = build(design, &qpw, 512, 4096, 16).unwrap();
            run_and_check(&qpw, &*pool, &config);
        }
    }
}

#[test]
fn stress_every_hook_pairs_its_get_and_put_on_logical_cpus() {
    let qpw = common::instance_on(CpuSpec::Logical(8), Policy::Remote);
    let config = HackbenchConfig {
        groups: 4,
        fds: 3,
        loops: LOOPS,
        ..HackbenchConfig::default()
    };
    for design in Design::ALL {
        // A tight capacity, so that designs 1 and 2 may run dry too.
        let pool = build(design, &qpw, 128, 24, 3).unwrap();
        run_and_check(&qpw, &*pool, &config);
    }
}

#[test]
fn conservation_holds_after_every_run_of_one_pool() {
    // One pool through many runs: whatever a run leaves in caches and lists, the next starts
    // from it, and every run ends conserved.
    let qpw = common::instance_on(CpuSpec::Logical(4), Policy::Remote);
    for design in Design::ALL {
        let pool = build(design, &qpw, 256, 64, 4).unwrap();
        for (i, groups) in [1, 3, 2].into_iter().enumerate() {
            let config = HackbenchConfig {
                groups,
                fds: 2,
                loops: LOOPS / 3,
                transport: if i % 2 == 0 {
                    Transport::Pipe
                } else {
                    Transport::Socketpair
                },
                ..HackbenchConfig::default()
            };
            let before = pool.stats();
            let report = hackbench(&qpw, &*pool, &config).unwrap();
            let s = report.stats;
            assert_eq!(s.gets - before.gets, config.hooks(), "{design} run {i}");
            assert_eq!(s.puts - before.puts, config.hooks(), "{design} run {i}");
            assert_eq!((s.in_use, s.violations, report.corrupt), (0, 0, 0));
            pool.check_conservation()
                .unwrap_or_else(|e| panic!("{design} run {i}: {e}"));
        }
    }
}

#[test]
fn per_cpu_pools_never_hold_more_than_configured() {
    let qpw = common::instance_on(CpuSpec::Logical(4), Policy::Remote);
    let per_cpu = 2;
    let pool = PerCpuPools::new(&qpw, 256, per_cpu).unwrap();
    let configured = (4 * per_cpu) as u64;
    for groups in [1, 3, 6] {
        let config = HackbenchConfig {
            groups,
            fds: 4,
            loops: LOOPS / 3,
            ..HackbenchConfig::default()
        };
        let report = hackbench(&qpw, &pool, &config).unwrap();
        let s = report.stats;
        assert_eq!(s.allocated, configured);
        assert_eq!(s.capacity, configured);
        assert_eq!((report.corrupt, s.remote_returns), (0, 0));
        pool.check_conservation().unwrap();
    }
}

#[test]
fn the_cache_design_never_caches_more_than_its_bound() {
    // Many threads per CPU, a global lock they contend for: whatever the contention makes the
    // cache keep, conservation (which checks `MAX_LOCAL_COUNT` per CPU) holds after the run.
    let qpw = common::instance_on(CpuSpec::Logical(2), Policy::Remote);
    let pool = build(Design::PerCpuCache, &qpw, 128, 4096, 1).unwrap();
    run_and_check(
        &qpw,
        &*pool,
        &HackbenchConfig {
            groups: 4,
            fds: 4,
            loops: LOOPS / 2,
            ..HackbenchConfig::default()
        },
    );
}

#[test]
fn the_hook_alone_pairs_every_get_and_put_too() {
    let qpw = common::instance_on(CpuSpec::Allowed, Policy::Remote);
    for design in Design::ALL {
        let pool = build(design, &qpw, 8192, 4096, 4).unwrap();
        let report = hooks_alone(&qpw, &*pool, 4, LOOPS * 10).unwrap();
        let s = report.stats;
        assert_eq!(report.hooks, (4 * LOOPS * 10) as u64);
        assert_eq!(
            (s.gets, s.puts, s.in_use),
            (report.hooks, report.hooks, 0),
            "{design}"
        );
        assert_eq!((report.corrupt, s.violations), (0, 0), "{design}");
        if design == Design::PerCpuPools {
            assert_eq!((s.remote_returns, s.local_hits), (0, s.gets));
        }
        pool.check_conservation()
            .unwrap_or_else(|e| panic!("{design}: {e}"));
    }
    let err = hooks_alone(
        &qpw,
        &*build(Design::GlobalLock, &qpw, 64, 4, 1).unwrap(),
        0,
        1,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("threads 0") && err.contains("1-64"), "{err}");
}
