//! The three buffer-pool designs through their one API: smoke, then each design's own
//! behaviour, then the error cases.
#![cfg(not(loom))]

mod common;

use common::remote;
use qpw_core::CpuSpec;
use qpw_workloads::pool::{
    build, hackbench, pool_figures, BufferPool, Design, GlobalPool, HackbenchConfig, PerCpuPools,
    PoolError, PoolFiguresConfig, RESERVE_COUNT,
};

#[test]
fn smoke_get_write_put_for_every_design() {
    let qpw = remote(2);
    let _bound = qpw.bind_current(0).unwrap();
    for design in Design::ALL {
        let pool = build(design, &qpw, 256, 64, 8).unwrap();
        let mut b = pool.get().unwrap().unwrap();
        pool.with_bytes(&mut b, &mut |bytes| {
            assert_eq!(bytes.len(), 256);
            bytes[0] = 42;
        })
        .unwrap();
        pool.put(b).unwrap();
        let s = pool.stats();
        assert_eq!((s.design, s.gets, s.puts, s.in_use), (design, 1, 1, 0));
        assert_eq!(s.violations, 0);
        pool.check_conservation().unwrap();
    }
}

#[test]
fn global_pool_keeps_its_reserve_and_allocates_past_it() {
    let qpw = remote(1);
    let _bound = qpw.bind_current(0).unwrap();
    let pool = GlobalPool::new(64, 16).unwrap();
    let held: Vec<_> = (0..4).map(|_| pool.get().unwrap().unwrap()).collect();
    for b in held {
        pool.put(b).unwrap();
    }
    assert_eq!(pool.stats().allocated, 4);
    // The list holds 4 > RESERVE_COUNT: the next gets come from it until the reserve.
    let again: Vec<_> = (0..4 - RESERVE_COUNT)
        .map(|_| pool.get().unwrap().unwrap())
        .collect();
    assert_eq!(pool.stats().allocated, 4);
    let extra = pool.get().unwrap().unwrap();
    assert_eq!(pool.stats().allocated, 5);
    for b in again.into_iter().chain([extra]) {
        pool.put(b).unwrap();
    }
    pool.check_conservation().unwrap();
}

#[test]
fn a_bounded_pool_runs_dry_and_a_lost_buffer_is_found() {
    let qpw = remote(1);
    let _bound = qpw.bind_current(0).unwrap();
    let pool = GlobalPool::new(64, 2).unwrap();
    let a = pool.get().unwrap().unwrap();
    let b = pool.get().unwrap().unwrap();
    assert!(pool.get().unwrap().is_none());
    assert_eq!(pool.stats().exhausted, 1);
    pool.put(a).unwrap();
    let err = pool.check_conservation().unwrap_err();
    assert!(err.contains(&format!("buffer {} is lost", b.id())), "{err}");
    assert!(err.contains("still handed out"), "{err}");
    pool.put(b).unwrap();
    pool.check_conservation().unwrap();
}

#[test]
fn a_buffer_from_another_pool_is_refused() {
    let qpw = remote(1);
    let _bound = qpw.bind_current(0).unwrap();
    let one = GlobalPool::new(64, 4).unwrap();
    let two = GlobalPool::new(64, 4).unwrap();
    let b = one.get().unwrap().unwrap();
    let id = b.id();
    let err = two.put(b).unwrap_err();
    assert!(
        matches!(err, PoolError::ForeignBuffer { id: i } if i == id),
        "{err}"
    );
    // The token was consumed by the refused put: pool one has lost it, and says so.
    assert!(one.check_conservation().is_err());
}

#[test]
fn per_cpu_pools_return_remote_frees_to_the_owner_lock_free() {
    let qpw = remote(2);
    let pool = PerCpuPools::new(&qpw, 64, 2).unwrap();
    let (a, b) = {
        let _bound = qpw.bind_current(0).unwrap();
        let a = pool.get().unwrap().unwrap();
        let b = pool.get().unwrap().unwrap();
        // cpu 0's two buffers are out: its pool is dry, whatever cpu 1 has.
        assert!(pool.get().unwrap().is_none());
        (a, b)
    };
    {
        let _bound = qpw.bind_current(1).unwrap();
        pool.put(a).unwrap();
        pool.put(b).unwrap();
    }
    let s = pool.stats();
    assert_eq!((s.remote_returns, s.exhausted, s.allocated), (2, 1, 4));
    pool.check_conservation().unwrap();
    let _bound = qpw.bind_current(0).unwrap();
    let a = pool.get().unwrap().unwrap();
    let b = pool.get().unwrap().unwrap();
    pool.put(a).unwrap();
    pool.put(b).unwrap();
    assert_eq!(pool.stats().remote_returns, 2);
    pool.check_conservation().unwrap();
}

#[test]
fn an_unbound_thread_of_a_logical_instance_is_refused() {
    let qpw = remote(2);
    let pool = build(Design::PerCpuCache, &qpw, 64, 8, 2).unwrap();
    assert!(matches!(pool.get(), Err(PoolError::Qpw(_))));
}

#[test]
fn ranges_are_named() {
    let qpw = remote(1);
    let e = GlobalPool::new(0, 4).unwrap_err().to_string();
    assert!(
        e.contains("buffer size 0") && e.contains("1-1048576"),
        "{e}"
    );
    let e = PerCpuPools::new(&qpw, 64, 0).unwrap_err().to_string();
    assert!(e.contains("buffers per CPU"), "{e}");
    let pool = GlobalPool::new(64, 4).unwrap();
    let e = hackbench(
        &qpw,
        &pool,
        &HackbenchConfig {
            groups: 0,
            ..HackbenchConfig::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("groups 0") && e.contains("1-64"), "{e}");
}

#[test]
fn figures_sweep_designs_and_thread_counts() {
    let figures = pool_figures(&PoolFiguresConfig {
        cpus: CpuSpec::Logical(2),
        groups: vec![1, 2],
        fds: 2,
        loops: 20,
        ..PoolFiguresConfig::default()
    })
    .unwrap();
    assert!(figures.logical);
    assert_eq!(figures.runs.len(), 6);
    for (i, run) in figures.runs.iter().enumerate() {
        assert_eq!(run.design, Design::ALL[i / 2]);
        let groups = [1, 2][i % 2];
        assert_eq!(run.threads, groups * 2 * 2);
        assert_eq!(run.messages, (groups * 2 * 2 * 20) as u64);
        assert_eq!(run.stats.gets, 2 * run.messages);
        assert_eq!(run.hooks, 2 * run.messages);
        assert_eq!(run.corrupt, 0);
        assert!(run.messages_per_sec > 0.0);
    }
}
