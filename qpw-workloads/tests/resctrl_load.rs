//! resctrl with the domain CPUs loaded as a fleet machine's are (several busy threads per
//! CPU): the path mix of a loaded run, the interrupt path reaching the thread that runs, and
//! the load's own limits.
#![cfg(not(loom))]

use std::time::Duration;

use qpw_core::sync::{Arc, AtomicBool, AtomicU64, Ordering};
use qpw_core::CpuSet;
use qpw_workloads::resctrl::{
    measure_read_paths, Config, DomainLayout, Executor, FiguresConfig, FleetLoad, ReadPath,
    ReadValue, Resctrl, ResctrlError, MAX_THREADS_PER_CPU,
};

/// Two domains of one real CPU each when CPUs 0 and 1 are allowed (the faithful layout: each
/// load thread really runs on its CPU), else two emulated ones.
fn two_domains() -> DomainLayout {
    let allowed = qpw_core::allowed_cpus().unwrap();
    if allowed.contains(0) && allowed.contains(1) {
        DomainLayout::Physical(vec![CpuSet::from_iter([0]), CpuSet::from_iter([1])])
    } else {
        DomainLayout::Emulated {
            domains: 2,
            cpus_per_domain: 1,
        }
    }
}

fn loaded_run(interruptible: bool) -> qpw_workloads::resctrl::ResctrlFigures {
    measure_read_paths(&FiguresConfig {
        layout: two_domains(),
        groups: Some(4),
        passes: 2,
        load: FleetLoad {
            threads_per_cpu: 3,
            interruptible,
        },
        ..FiguresConfig::default()
    })
    .unwrap()
}

#[test]
fn smoke_a_loaded_run_reads_every_file_by_its_path() {
    let figures = loaded_run(true);
    // The reader is on domain 0's CPU; the other domain's CPU carries the load.
    assert_eq!(figures.loaded_cpus.len(), 1);
    assert_ne!(figures.loaded_cpus[0], figures.reader_cpu);
    assert_eq!(figures.load_threads, 3);
    assert_eq!(figures.violations, 0);
    let reads = 2 * 4 * 3 * 2; // passes x groups x events x domains
    let remote = reads / 2; // the other domain's half
    let [wq, irq, local, cached] = &figures.paths[..] else {
        panic!("four paths expected, got {:?}", figures.paths);
    };
    for p in &figures.paths {
        assert_eq!((p.reads, p.non_values), (reads, 0), "{}", p.path);
    }

    // Workqueue: every read is a worker hop, own domain included; nothing is interrupted.
    assert_eq!(wq.counts.worker_runs, reads);
    assert_eq!(wq.remote_reads, reads);
    assert_eq!((wq.counts.interrupts, wq.interruptions), (0, 0));

    // Interrupt: the own domain is read directly, the loaded one by interrupting a load
    // thread (the one running: never the idle stand-in while load threads are registered),
    // exactly once per read even when a call had to be re-sent; no worker runs.
    assert_eq!(irq.counts.worker_runs, 0);
    assert_eq!(irq.counts.reader_direct, remote);
    assert_eq!(irq.counts.interrupts, remote);
    assert_eq!(irq.remote_reads, remote);
    assert_eq!(irq.interruptions, remote);
    assert_eq!(irq.stand_in_interruptions, 0);

    // Local: direct in the own domain, the workqueue for the other.
    assert_eq!(local.counts.reader_direct, remote);
    assert_eq!(local.counts.local_fallbacks, remote);
    assert_eq!(local.counts.worker_runs, remote);
    assert_eq!(local.interruptions, 0);

    // Cached: nothing runs anywhere else.
    assert_eq!(cached.counts.cached, reads);
    assert_eq!(cached.remote_reads, 0);
    assert_eq!(cached.counts.worker_runs + cached.counts.interrupts, 0);
    assert_eq!(cached.interruptions, 0);
}

#[test]
fn without_registered_load_threads_the_interrupt_goes_to_an_idle_stand_in() {
    let figures = loaded_run(false);
    assert_eq!(figures.load_threads, 3);
    let irq = figures
        .paths
        .iter()
        .find(|p| p.path == ReadPath::Interrupt)
        .unwrap();
    let remote = 2 * 4 * 3;
    assert_eq!(irq.counts.interrupts, remote);
    assert_eq!(irq.stand_in_interruptions, remote);
    assert!(figures
        .notes
        .iter()
        .any(|n| n.contains("not interruptible")));
}

/// The bit of `sig` in a `/proc/.../status` signal mask line.
fn has_pending(tid: i32, sig: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigPnd:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .unwrap();
    mask & (1 << (sig - 1)) != 0
}

/// Two threads registered on CPU 1: the first says it runs, then stops taking the signal (as
/// a thread that lost its CPU would not run its handler). The interrupt sent to it is not
/// claimed, so once the second thread says it runs, the call is re-sent to that one, which
/// runs it; the first never does.
#[test]
fn an_interrupt_not_claimed_in_time_goes_to_the_thread_running_now() {
    let r = Arc::new(
        Resctrl::new(Config {
            layout: DomainLayout::Emulated {
                domains: 2,
                cpus_per_domain: 1,
            },
            overflow_interval: None,
            call_timeout: Duration::from_secs(30),
            retarget_after: Duration::from_micros(200),
            retargets: u32::MAX,
            ..Config::default()
        })
        .unwrap(),
    );
    let file = r.open("mon_data/mon_L3_01/mbm_total_bytes").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let go = Arc::new(AtomicBool::new(false));
    let (first_ready, second_ready) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let sig = qpw_core::cross_call::signal();

    let first_tid = Arc::new(AtomicU64::new(0));
    let first = {
        let (r, stop, ready, tid) = (
            r.clone(),
            stop.clone(),
            first_ready.clone(),
            first_tid.clone(),
        );
        std::thread::spawn(move || {
            let _bound = r.qpw().bind_current(1).unwrap();
            let me = r.register_current_thread(1).unwrap();
            me.running_now();
            // SAFETY: `sigset_t` is plain data; the mask change affects only this thread.
            let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
            // SAFETY: `set` is a valid `sigset_t`; `sig` a valid signal number.
            unsafe {
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, sig);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            // SAFETY: `gettid` has no preconditions.
            tid.store(unsafe { libc::gettid() } as u64, Ordering::Release);
            ready.store(true, Ordering::Release);
            while !stop.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            // SAFETY: as above; the pending signals now run the handler, which finds no call.
            unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
            me.calls()
        })
    };
    while !first_ready.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    let second = {
        let (r, stop, go, ready) = (r.clone(), stop.clone(), go.clone(), second_ready.clone());
        std::thread::spawn(move || {
            let _bound = r.qpw().bind_current(1).unwrap();
            let me = r.register_current_thread(1).unwrap();
            ready.store(true, Ordering::Release);
            while !go.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            while !stop.load(Ordering::Acquire) {
                me.running_now();
                std::hint::spin_loop();
            }
            me.calls()
        })
    };
    while !second_ready.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    let reader = {
        let r = r.clone();
        std::thread::spawn(move || {
            let _bound = r.qpw().bind_current(0).unwrap();
            r.read_with(&file, ReadPath::Interrupt)
        })
    };
    // Wait until the call has reached the first thread (its signal pending, blocked), then
    // let the second say it runs.
    let first_tid = first_tid.load(Ordering::Acquire) as i32;
    while !has_pending(first_tid, sig) {
        std::thread::yield_now();
    }
    go.store(true, Ordering::Release);
    let read = reader.join().unwrap().unwrap();
    assert_eq!(read.value, ReadValue::Value(0));
    assert!(
        matches!(read.executor, Executor::Interrupt { cpu: 1, .. }),
        "{:?}",
        read.executor
    );
    stop.store(true, Ordering::Release);
    let first_calls = first.join().unwrap();
    let second_calls = second.join().unwrap();
    assert_eq!((first_calls, second_calls), (0, 1));
    assert!(r.path_counts().retargets >= 1);
    assert_eq!(r.path_counts().interrupts, 1);
    assert_eq!(r.violations(), 0);
}

#[test]
fn load_and_registrations_beyond_their_limits_are_refused() {
    let err = measure_read_paths(&FiguresConfig {
        layout: two_domains(),
        groups: Some(1),
        passes: 1,
        load: FleetLoad {
            threads_per_cpu: MAX_THREADS_PER_CPU + 1,
            interruptible: true,
        },
        ..FiguresConfig::default()
    })
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("load threads per cpu 17") && msg.contains("0-16"),
        "{msg}"
    );

    let r = Resctrl::new(Config {
        overflow_interval: None,
        ..Config::default()
    })
    .unwrap();
    let registered: Vec<_> = (0..MAX_THREADS_PER_CPU)
        .map(|_| r.register_current_thread(1).unwrap())
        .collect();
    let err = r.register_current_thread(1).unwrap_err();
    assert!(
        matches!(err, ResctrlError::TooManyThreads { cpu: 1, max } if max == MAX_THREADS_PER_CPU),
        "{err}"
    );
    drop(registered);
    drop(r.register_current_thread(1).unwrap());
}
