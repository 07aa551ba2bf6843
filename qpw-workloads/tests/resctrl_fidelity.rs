//! resctrl's kernel behaviours (FIDELITY 13, 14): assignable counters (ABMC), the `nohz_full`
//! fallback, the hardware rule checked against the CPU a read really runs on, pins that
//! fail, and the overflow worker's period and CPU.
#![cfg(not(loom))]

mod resctrl_common;

use std::time::{Duration, Instant};

use qpw_core::CpuSet;
use qpw_workloads::resctrl::{
    Config, DomainLayout, Event, Executor, ReadPath, ReadValue, Resctrl, ResctrlError,
    ABMC_COUNTERS, MBM_OVERFLOW_INTERVAL,
};
use resctrl_common::emulated;

fn file(r: &Resctrl, group: &str, domain: usize, event: Event) -> qpw_workloads::resctrl::MonFile {
    let path = if group.is_empty() {
        format!("mon_data/mon_L3_{domain:02}/{event}")
    } else {
        format!("mon_groups/{group}/mon_data/mon_L3_{domain:02}/{event}")
    };
    r.open(&path).unwrap()
}

// ---------------------------------------------------------------------------------------------
// ABMC: 32 counters per domain, unassigned events read "Unassigned", assignment starts from 0.

#[test]
fn abmc_counts_only_assigned_events_and_assignment_starts_from_zero() {
    let r = emulated(
        2,
        1,
        Config {
            num_rmids: 40,
            mon_scale: 1,
            assignable_counters: Some(ABMC_COUNTERS),
            ..Config::default()
        },
    );
    assert_eq!(r.assignable_counters(), Some(32));
    // The default group took two counters per domain; fifteen groups take the other thirty.
    assert_eq!(r.free_counters(0).unwrap(), 30);
    for g in 0..15 {
        r.mkdir(&format!("g{g:02}")).unwrap();
    }
    assert_eq!(
        (r.free_counters(0).unwrap(), r.free_counters(1).unwrap()),
        (0, 0)
    );
    // The sixteenth gets none: its bandwidth events read Unassigned on every path, its
    // occupancy (not an assignable event) still reads.
    let late = r.mkdir("late").unwrap();
    let total = file(&r, "late", 1, Event::MbmTotalBytes);
    let local = file(&r, "late", 1, Event::MbmLocalBytes);
    let occupancy = file(&r, "late", 1, Event::LlcOccupancy);
    assert_eq!(r.counter_of(&total), None);
    r.inject_traffic(late, 1, 6400, 640).unwrap();
    r.set_occupancy(late, 1, 4096).unwrap();
    r.run_overflow_now();
    {
        let _bound = r.qpw().bind_current(0).unwrap();
        for path in ReadPath::ALL {
            for f in [&total, &local] {
                let read = r.read_with(f, path).unwrap();
                assert_eq!(read.value, ReadValue::Unassigned, "{path}");
                assert_eq!(read.value.to_string(), "Unassigned");
            }
        }
        let read = r.read_with(&occupancy, ReadPath::Workqueue).unwrap();
        assert_eq!(read.value, ReadValue::Value(4096));
    }

    // No counter is free: assignment is refused, naming the domain and the count.
    let err = r.assign(&total).unwrap_err();
    assert!(
        matches!(err, ResctrlError::NoFreeCounter { domain: 1, max: 32 }),
        "{err}"
    );
    // Free one (g00's total in domain 1) and give it to the late group: it counts from the
    // assignment, not the 6400 bytes moved before.
    let g00 = file(&r, "g00", 1, Event::MbmTotalBytes);
    let freed = r.counter_of(&g00).unwrap();
    r.unassign(&g00).unwrap();
    assert_eq!(r.free_counters(1).unwrap(), 1);
    assert_eq!(r.assign(&total).unwrap(), freed);
    assert_eq!(
        r.assign(&total).unwrap(),
        freed,
        "assigning twice keeps the counter"
    );
    let _bound = r.qpw().bind_current(1).unwrap();
    assert_eq!(
        r.read_with(&total, ReadPath::Local).unwrap().value,
        ReadValue::Value(0)
    );
    r.inject_traffic(late, 1, 640, 0).unwrap();
    assert_eq!(
        r.read_with(&total, ReadPath::Local).unwrap().value,
        ReadValue::Value(640)
    );
    assert_eq!(r.source_bytes(&total), 640);
    assert_eq!(
        r.read_with(&g00, ReadPath::Local).unwrap().value,
        ReadValue::Unassigned
    );

    // g00 moves bytes while untracked; given a counter again, it starts from zero too.
    let g00_rmid = g00.rmid();
    r.inject_traffic(g00_rmid, 1, 1000, 0).unwrap();
    r.unassign(&total).unwrap();
    r.assign(&g00).unwrap();
    assert_eq!(
        r.read_with(&g00, ReadPath::Local).unwrap().value,
        ReadValue::Value(0)
    );

    // What has no assignable counter, and a model that counts everything, refuse.
    assert!(matches!(
        r.assign(&occupancy),
        Err(ResctrlError::NotAssignable {
            event: Event::LlcOccupancy
        })
    ));
    let legacy = emulated(1, 1, Config::default());
    let root = file(&legacy, "", 0, Event::MbmTotalBytes);
    assert!(matches!(
        legacy.assign(&root),
        Err(ResctrlError::NoAssignableCounters)
    ));
    assert_eq!(legacy.free_counters(0).unwrap(), 0);

    // rmdir gives a group's counters back.
    let before = r.free_counters(0).unwrap();
    r.rmdir("g01").unwrap();
    assert_eq!(r.free_counters(0).unwrap(), before + 2);
    assert_eq!(r.violations(), 0);

    let err = Resctrl::new(Config {
        assignable_counters: Some(0),
        ..Config::default()
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("1-1024"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// nohz_full: a domain whose CPUs are all nohz_full is read by smp_call_function_any.

#[test]
fn a_domain_whose_cpus_are_all_nohz_full_is_read_by_interrupt_never_a_worker() {
    // Domain 0 = {0, 1} with 1 nohz_full; domain 1 = {2, 3}, both nohz_full.
    let r = emulated(
        2,
        2,
        Config {
            nohz_full: Some("1-3".parse().unwrap()),
            ..Config::default()
        },
    );
    assert_eq!(r.nohz_full(), &"1-3".parse::<CpuSet>().unwrap());
    assert_eq!(r.housekeeping_cpu(0).unwrap(), 0);
    assert_eq!(
        r.housekeeping_cpu(1).unwrap(),
        2,
        "no housekeeping CPU: the first"
    );
    let far = file(&r, "", 1, Event::MbmTotalBytes);
    let near = file(&r, "", 0, Event::MbmTotalBytes);
    {
        let _bound = r.qpw().bind_current(0).unwrap();
        // The workqueue path: an interrupt for the nohz_full domain, a worker for the other.
        let read = r.read_with(&far, ReadPath::Workqueue).unwrap();
        assert!(
            matches!(read.executor, Executor::Interrupt { cpu: 2, .. }),
            "{:?}",
            read.executor
        );
        let read = r.read_with(&near, ReadPath::Workqueue).unwrap();
        assert_eq!(read.executor, Executor::Worker { cpu: 0 });
        // The local path's fallback from outside the domain takes the same turn.
        let read = r.read_with(&far, ReadPath::Local).unwrap();
        assert!(matches!(read.executor, Executor::Interrupt { .. }));
        let counts = r.path_counts();
        assert_eq!(counts.worker_runs, 1, "only the housekeeping domain's read");
        assert_eq!(
            (
                counts.nohz_fallbacks,
                counts.interrupts,
                counts.local_fallbacks
            ),
            (2, 2, 1)
        );
    }
    {
        // From inside the nohz_full domain, smp_call_function_any reads in place.
        let _bound = r.qpw().bind_current(3).unwrap();
        let read = r.read_with(&far, ReadPath::Workqueue).unwrap();
        assert_eq!(read.executor, Executor::Reader { cpu: 3 });
    }
    {
        // The interrupt path (the RFC) does not read in place on a nohz_full CPU of a domain
        // that has a housekeeping CPU: it interrupts that one.
        let _bound = r.qpw().bind_current(1).unwrap();
        let read = r.read_with(&near, ReadPath::Interrupt).unwrap();
        assert!(
            matches!(read.executor, Executor::Interrupt { cpu: 0, .. }),
            "{:?}",
            read.executor
        );
    }
    assert_eq!(r.path_counts().worker_runs, 1);
    assert_eq!(r.violations(), 0);
}

// ---------------------------------------------------------------------------------------------
// The hardware rule against the CPU the reading thread runs on (sched_getcpu).

#[test]
fn a_read_on_the_wrong_physical_cpu_is_a_violation_on_an_emulated_layout() {
    let r = emulated(2, 1, Config::default());
    let (p0, p1) = (
        r.qpw().physical_cpu(0).unwrap(),
        r.qpw().physical_cpu(1).unwrap(),
    );
    if p0 == p1 {
        eprintln!("skipped: the two logical CPUs share physical cpu {p0}");
        return;
    }
    let f = file(&r, "", 1, Event::MbmTotalBytes);
    let _bound = r.qpw().bind_current(1).unwrap();
    assert_eq!(r.arch_rmid_read(&f), ReadValue::Value(0));
    assert_eq!(r.violations(), 0);
    // Still bound to logical CPU 1 (domain 1), but running on logical CPU 0's physical CPU:
    // its MSRs reach domain 0's counters, not domain 1's.
    qpw_core::pin_current_thread(p0).unwrap();
    assert_eq!(qpw_core::current_cpu(), Some(p0));
    assert_eq!(r.arch_rmid_read(&f), ReadValue::Error);
    assert_eq!(r.violations(), 1);
    // So is a direct read by the local path, which trusts the binding.
    let read = r.read_with(&f, ReadPath::Local).unwrap();
    assert_eq!(read.value, ReadValue::Error);
    assert_eq!(r.violations(), 2);
    qpw_core::pin_current_thread(p1).unwrap();
    assert_eq!(r.arch_rmid_read(&f), ReadValue::Value(0));
    assert_eq!(r.violations(), 2);
}

// ---------------------------------------------------------------------------------------------
// A pin that fails is an error.

/// Makes `sched_setaffinity(0, ..)` (a thread pinning itself) fail with `EPERM` for the
/// calling thread and every thread it starts from now on, with a seccomp filter; pinning
/// another thread by its id (`pthread_setaffinity_np`, as qpw-core pins its workers) still
/// works. The filter goes away with the threads.
#[cfg(target_arch = "x86_64")]
fn forbid_pinning_oneself() {
    // Classic BPF over `struct seccomp_data`: nr at 0, arch at 4, args[0] at 16 (low) and 20.
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    let load = |k| libc::sock_filter {
        code: LD_W_ABS,
        jt: 0,
        jf: 0,
        k,
    };
    // Each test jumps to the next instruction when it matches, else to ALLOW (index 9).
    let jeq = |k, at: u8| libc::sock_filter {
        code: JEQ_K,
        jt: 0,
        jf: 9 - (at + 1),
        k,
    };
    let ret = |k| libc::sock_filter {
        code: RET_K,
        jt: 0,
        jf: 0,
        k,
    };
    let filter = [
        load(4),
        jeq(AUDIT_ARCH_X86_64, 1),
        load(0),
        jeq(libc::SYS_sched_setaffinity as u32, 3),
        load(16),
        jeq(0, 5),
        load(20),
        jeq(0, 7),
        ret(libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        ret(libc::SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: PR_SET_NO_NEW_PRIVS takes plain integers.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    assert_eq!(rc, 0, "no_new_privs: {}", std::io::Error::last_os_error());
    // SAFETY: `prog` points at `filter`, a valid program of `len` instructions, alive for the
    // call (the kernel copies it).
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
            &prog as *const libc::sock_fprog,
        )
    };
    assert_eq!(rc, 0, "seccomp: {}", std::io::Error::last_os_error());
    assert!(qpw_core::pin_current_thread(0).is_err(), "the filter works");
}

#[cfg(target_arch = "x86_64")]
#[test]
fn an_overflow_worker_or_stand_in_that_cannot_pin_itself_is_an_error() {
    // The overflow workers pin themselves: Resctrl::new fails, naming which and where.
    let built = std::thread::spawn(|| {
        forbid_pinning_oneself();
        Resctrl::new(Config {
            overflow_interval: None,
            ..Config::default()
        })
        .map(|_| ())
    })
    .join()
    .unwrap();
    let err = built.unwrap_err();
    assert!(
        matches!(
            err,
            ResctrlError::Pin {
                what: "overflow worker",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("could not pin itself"), "{err}");

    // An idle stand-in started by a reader whose threads cannot pin: the read fails.
    let r = emulated(2, 1, Config::default());
    let far = file(&r, "", 1, Event::MbmTotalBytes);
    let read = std::thread::scope(|s| {
        s.spawn(|| {
            let _bound = r.qpw().bind_current(0).unwrap();
            forbid_pinning_oneself();
            r.read_with(&far, ReadPath::Interrupt)
        })
        .join()
        .unwrap()
    });
    let err = read.unwrap_err();
    assert!(
        matches!(
            err,
            ResctrlError::Pin {
                what: "idle stand-in",
                cpu: 1,
                ..
            }
        ),
        "{err}"
    );
    // From a thread that may pin, the same read works.
    let _bound = r.qpw().bind_current(0).unwrap();
    assert_eq!(
        r.read_with(&far, ReadPath::Interrupt).unwrap().value,
        ReadValue::Value(0)
    );
}

// ---------------------------------------------------------------------------------------------
// The overflow worker: every MBM_OVERFLOW_INTERVAL, on its domain's housekeeping CPU.

/// Waits until every domain's worker has run `n` times on its own; two minutes, far beyond
/// what a busy machine's scheduler needs, only make a worker that never runs a failure.
fn wait_for_periodic_runs(r: &Resctrl, n: u64) {
    let since = Instant::now();
    while (0..r.nr_domains()).any(|d| r.overflow(d).periodic < n) {
        assert!(
            since.elapsed() < Duration::from_secs(120),
            "the overflow workers did not run"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn the_overflow_worker_runs_every_period_on_its_housekeeping_cpu() {
    assert_eq!(MBM_OVERFLOW_INTERVAL, Duration::from_millis(1000));
    assert_eq!(
        Config::default().overflow_interval,
        Some(MBM_OVERFLOW_INTERVAL)
    );

    let period = Duration::from_millis(30);
    let start = Instant::now();
    // Domain 0 = {0, 1} with 0 nohz_full: its worker belongs on CPU 1; domain 1 = {2, 3}: 2.
    let r = Resctrl::new(Config {
        layout: DomainLayout::Emulated {
            domains: 2,
            cpus_per_domain: 2,
        },
        nohz_full: Some("0".parse().unwrap()),
        overflow_interval: Some(period),
        ..Config::default()
    })
    .unwrap();
    wait_for_periodic_runs(&r, 3);
    // The records first, then the time: the workers go on running, so a time taken before the
    // records would let a run that came in between (a test thread the machine held up for a
    // period) exceed the bound below.
    let records = [r.overflow(0), r.overflow(1)];
    let elapsed = start.elapsed();
    for (domain, housekeeping) in [(0, 1), (1, 2)] {
        assert_eq!(r.housekeeping_cpu(domain).unwrap(), housekeeping);
        let runs = &records[domain];
        assert_eq!(runs.cpu, Some(housekeeping), "domain {domain}");
        assert_eq!(
            runs.phys_cpu,
            Some(r.qpw().physical_cpu(housekeeping).unwrap()),
            "domain {domain}: the worker runs on its housekeeping CPU's physical CPU"
        );
        // Never sooner than the period (a late scheduler only makes it later), so never
        // more runs than periods.
        let shortest = runs.shortest_period.unwrap();
        assert!(
            shortest >= period,
            "domain {domain}: {shortest:?} < {period:?}"
        );
        let most = elapsed.as_nanos() / period.as_nanos() + 1;
        assert!(
            u128::from(runs.runs) <= most,
            "{} runs in {elapsed:?}",
            runs.runs
        );
    }
    assert_eq!(r.violations(), 0);

    // On real CPUs, the worker of a two-CPU domain whose first CPU is nohz_full runs on the
    // second one, as sched_getcpu tells.
    let allowed = qpw_core::allowed_cpus().unwrap();
    if !(allowed.contains(0) && allowed.contains(1)) {
        return;
    }
    let r = Resctrl::new(Config {
        layout: DomainLayout::Physical(vec!["0-1".parse().unwrap()]),
        nohz_full: Some("0".parse().unwrap()),
        overflow_interval: Some(period),
        ..Config::default()
    })
    .unwrap();
    wait_for_periodic_runs(&r, 2);
    assert_eq!(r.housekeeping_cpu(0).unwrap(), 1);
    assert_eq!(r.overflow(0).phys_cpu, Some(1));
    assert_eq!(r.violations(), 0);
}
