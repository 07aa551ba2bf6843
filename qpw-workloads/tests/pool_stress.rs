//! The buffer pools under the hackbench-style load: conservation for all three designs (no
//! buffer lost, none owned twice), and the memory bound of the per-CPU pools.
#![cfg(not(loom))]

mod common;

use qpw_core::{CpuSpec, Policy, Qpw};
use qpw_workloads::pool::{build, hackbench, BufferPool, Design, HackbenchConfig, PerCpuPools};

const LOOPS: usize = if cfg!(miri) { 5 } else { 300 };

fn run_and_check(qpw: &Qpw, pool: &dyn BufferPool, config: &HackbenchConfig) {
    let report = hackbench(qpw, pool, config).unwrap();
    let s = report.stats;
    assert_eq!(
        report.corrupt,
        0,
        "{}: a buffer was owned twice",
        pool.design()
    );
    assert_eq!(s.violations, 0, "{}", pool.design());
    assert_eq!((s.gets, s.puts), (config.messages(), config.messages()));
    assert_eq!(s.in_use, 0);
    assert!(s.max_in_use <= s.allocated && s.allocated <= s.capacity);
    if let Err(e) = pool.check_conservation() {
        panic!("{}: {e}", pool.design());
    }
}

#[test]
fn stress_conservation_for_every_design_on_real_cpus() {
    let qpw = common::instance_on(CpuSpec::Allowed, Policy::Remote);
    let config = HackbenchConfig {
        groups: 3,
        fds: 4,
        loops: LOOPS,
        ..HackbenchConfig::default()
    };
    for design in Design::ALL {
        let pool = build(design, &qpw, 512, 4096, 16).unwrap();
        run_and_check(&qpw, &*pool, &config);
    }
}

#[test]
fn stress_conservation_for_every_design_on_logical_cpus() {
    let qpw = common::instance_on(CpuSpec::Logical(8), Policy::Remote);
    let config = HackbenchConfig {
        groups: 4,
        fds: 3,
        loops: LOOPS,
        ..HackbenchConfig::default()
    };
    for design in Design::ALL {
        // A tight capacity, so that designs 1 and 2 run dry too.
        let pool = build(design, &qpw, 128, 24, 3).unwrap();
        run_and_check(&qpw, &*pool, &config);
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
        assert!(s.max_in_use <= configured, "{} in use", s.max_in_use);
        assert_eq!(report.corrupt, 0);
        pool.check_conservation().unwrap();
    }
    // With so few buffers and so many senders, they must have waited for returns.
    let s = pool.stats();
    assert!(s.exhausted > 0);
    assert!(s.remote_returns > 0);
}
