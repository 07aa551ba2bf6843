//! `CpuSpec::Allowed` (what `Qpw::new()` manages) is the set the process may run on, even when
//! the program pins its main thread before it builds its instance (issue 26, point 1: the set
//! used to be the main thread's mask at the first call, kept, so a program that pinned its
//! main thread to CPU 0 first managed only CPU 0, and `bind_current(1)` failed for good).
//!
//! The check runs in a child process, so that no earlier call of this process can have read the
//! set before the pinning.

#![cfg(not(loom))]

use qpw_core::{CpuSet, Qpw};

/// Set in the child: the set the parent expects, as a CPU list.
const EXPECT: &str = "QPW_EXPECT_ALLOWED";

#[test]
fn pinning_the_main_thread_first_does_not_narrow_the_managed_cpus() {
    if let Ok(expected) = std::env::var(EXPECT) {
        child(&expected);
        return;
    }
    let allowed = qpw_core::allowed_cpus().unwrap();
    if allowed.len() < 2 {
        eprintln!("skipped: needs two CPUs");
        return;
    }
    // The child inherits the spawning thread's mask: give it the whole set.
    qpw_core::set_current_affinity(&allowed).unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "pinning_the_main_thread_first_does_not_narrow_the_managed_cpus",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(EXPECT, allowed.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// In the child: pin the main thread (and this one) to the first CPU, then build.
fn child(expected: &str) {
    let expected = CpuSet::parse(expected).unwrap();
    let first = expected.first().unwrap();
    let last = expected.iter().last().unwrap();
    let only_first = CpuSet::from_iter([first]);
    // SAFETY: `cpu_set_t` is plain data; all-zero bytes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `first` is below CPU_SETSIZE; `set` is valid and writable; `getpid` is the main
    // thread's tid.
    let rc = unsafe {
        libc::CPU_SET(first, &mut set);
        libc::sched_setaffinity(libc::getpid(), std::mem::size_of_val(&set), &set)
    };
    assert_eq!(rc, 0, "pin the main thread");
    qpw_core::set_current_affinity(&only_first).unwrap();

    let qpw = Qpw::new().unwrap();
    assert_eq!(*qpw.cpus(), expected, "{}", qpw.describe());
    assert_eq!(qpw_core::allowed_cpus().unwrap(), expected);
    let _bound = qpw.bind_current(last).unwrap();
    assert_eq!(qpw_core::current_cpu(), Some(last));
}
