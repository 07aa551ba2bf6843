//! What the mm workload tests share: instances in each policy, and the stress driver.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use qpw_core::{CpuSpec, FakeSysfs, Mode, Policy, Qpw};
use qpw_workloads::{CpuCounters, Workload};

/// Logical CPUs for the stress tests: more than this machine's two, so that CPUs share a core
/// and their threads really interleave.
pub const STRESS_CPUS: usize = 4;

/// Drains every stress thread waits for half-way through its operations.
pub const MID_DRAINS: u64 = 20;

/// A fake sysfs tree under the temporary directory, removed on drop.
pub struct FakeRoot(pub PathBuf);

impl Drop for FakeRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fake sysfs tree whose online CPUs are the allowed ones and whose last allowed CPU is
/// isolated.
pub fn fake_sysfs(tag: &str) -> (FakeRoot, usize) {
    let allowed = qpw_core::allowed_cpus().expect("read the allowed CPUs");
    let last = allowed.last().expect("at least one allowed CPU");
    let root = std::env::temp_dir().join(format!(
        "qpw-mm-{tag}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    FakeSysfs::new(&format!("0-{last}"))
        .isolated(&last.to_string())
        .write(&root)
        .expect("write the fake sysfs tree");
    (FakeRoot(root), last)
}

/// An instance of the allowed (physical) CPUs under [`Policy::Isolated`], over a fake sysfs
/// tree (kept alive by the returned root) whose last allowed CPU is isolated; returns that CPU
/// too.
pub fn physical_isolated(tag: &str) -> (Qpw, FakeRoot, usize) {
    let (root, last) = fake_sysfs(tag);
    let qpw = Qpw::builder()
        .cpus(CpuSpec::Allowed)
        .policy(Policy::Isolated)
        .sysfs_root(&root.0)
        .build()
        .unwrap();
    (qpw, root, last)
}

/// An instance of `n` logical CPUs in `policy` ("queue", "remote", "fenced" or "isolated"); for
/// "isolated", the logical CPUs on the last allowed physical CPU are remote, the others queued.
pub fn instance(policy: &str, n: usize) -> (Qpw, Option<FakeRoot>) {
    let builder = Qpw::builder().cpus(CpuSpec::Logical(n));
    match policy {
        "queue" => (builder.policy(Policy::Queue).build().unwrap(), None),
        "remote" => (builder.policy(Policy::Remote).build().unwrap(), None),
        "fenced" => (builder.policy(Policy::Fenced).build().unwrap(), None),
        "isolated" => {
            let (root, _) = fake_sysfs(&format!("{policy}{n}"));
            let qpw = builder
                .policy(Policy::Isolated)
                .sysfs_root(&root.0)
                .build()
                .unwrap();
            assert!(
                !qpw.cpus_in(Mode::Remote).is_empty(),
                "the fake isolated CPU gave no remote-mode CPU: {}",
                qpw.describe()
            );
            (qpw, Some(root))
        }
        other => panic!("no policy {other}"),
    }
}

/// Runs `ops` process-context operations on every CPU of `qpw` (one thread bound to each)
/// while another thread drains `workload` over and over; then drains once more, forced, and
/// checks the conservation law and the counters. Returns the counters and the drains done.
pub fn stress(qpw: &Qpw, workload: &dyn Workload, ops: u64) -> (Vec<CpuCounters>, u64) {
    let running = AtomicBool::new(true);
    let drains = AtomicU64::new(0);
    std::thread::scope(|s| {
        let drains = &drains;
        let workers: Vec<_> = qpw
            .cpus()
            .iter()
            .map(|cpu| {
                s.spawn(move || {
                    let _bound = qpw.bind_current(cpu).unwrap();
                    for i in 0..ops {
                        workload.process_op().unwrap();
                        // Half-way, wait for some drains, so that drains certainly meet caches
                        // in use (however the scheduler runs the threads).
                        if i == ops / 2 {
                            while drains.load(Ordering::Relaxed) < MID_DRAINS {
                                std::thread::yield_now();
                            }
                        }
                    }
                })
            })
            .collect();
        let drainer = s.spawn(|| {
            let mut n = 0u64;
            while running.load(Ordering::Relaxed) {
                let outcome = workload.drain(n % 8 == 7, None);
                assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
                n += 1;
                drains.store(n, Ordering::Relaxed);
            }
        });
        for worker in workers {
            worker.join().unwrap();
        }
        running.store(false, Ordering::Relaxed);
        drainer.join().unwrap();
    });
    let drains = drains.load(Ordering::Relaxed);
    assert!(drains >= MID_DRAINS);
    let outcome = workload.drain(true, None);
    assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
    assert!(!outcome.skipped);
    workload.check_conservation().unwrap();

    let counters = workload.counters();
    assert_eq!(counters.len(), qpw.cpus().len());
    for c in &counters {
        assert_eq!(c.local_ops, ops, "cpu {}", c.cpu);
    }
    (counters, drains + 1)
}

/// Checks that every CPU `drained(cpu)` picks was drained (the final forced drain of [`stress`]
/// saw to that) in the way its mode says, and never the other way.
pub fn check_drained_by_mode(qpw: &Qpw, counters: &[CpuCounters], drained: impl Fn(usize) -> bool) {
    for c in counters.iter().filter(|c| drained(c.cpu)) {
        match qpw.mode(c.cpu).unwrap() {
            Mode::Queue => {
                assert_eq!(
                    c.drains_remote, 0,
                    "queue-mode cpu {} drained remotely",
                    c.cpu
                );
                assert!(c.drains_queued > 0, "cpu {} never drained", c.cpu);
            }
            mode @ (Mode::Remote | Mode::Fenced) => {
                assert_eq!(
                    c.drains_queued, 0,
                    "{mode}-mode cpu {} had queued drains",
                    c.cpu
                );
                assert!(c.drains_remote > 0, "cpu {} never drained", c.cpu);
            }
        }
    }
}

/// Expands to the four stress tests of a workload, `stress_queue`, `stress_remote`,
/// `stress_fenced` and `stress_isolated`, each calling `$stress` with its policy's name (see
/// [`instance`]).
macro_rules! stress_tests {
    ($stress:expr) => {
        #[test]
        fn stress_queue() {
            ($stress)("queue");
        }

        #[test]
        fn stress_remote() {
            ($stress)("remote");
        }

        #[test]
        fn stress_fenced() {
            ($stress)("fenced");
        }

        #[test]
        fn stress_isolated() {
            ($stress)("isolated");
        }
    };
}
pub(crate) use stress_tests;
