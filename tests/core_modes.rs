//! qpw-core on real CPUs: where the work runs in each mode, stalls, fairness, panics, shutdown
//! and bad input.

#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use qpw_core::{CpuSet, CpuSpec, Error, Mode, Policy, Qpw};
use qpw_tests::{instance, involuntary_switches, rt_throttling, Gate, Spinner, SpinnerClass};

/// The last allowed CPU (the "target") and another one to request from, if there is one.
fn target_and_requester() -> (usize, Option<usize>) {
    let allowed = qpw_core::allowed_cpus().unwrap();
    let target = allowed.last().unwrap();
    let requester = allowed.iter().find(|&c| c != target);
    (target, requester)
}

#[test]
fn smoke_queue_and_remote() {
    for policy in [Policy::Queue, Policy::Remote] {
        let qpw = instance(policy);
        let counters = Arc::new(qpw.per_cpu(|_| 0u64));
        let c = counters.clone();
        let work = qpw
            .work(move |ctx| *c.lock_work(ctx).unwrap() += 1)
            .unwrap();
        for cpu in qpw.cpus().iter() {
            work.queue_on(cpu).unwrap();
            work.flush(cpu).unwrap();
        }
        let mut total = 0;
        counters.for_each_locked(|_, n| total += *n);
        assert_eq!(total as usize, qpw.cpus().len());
    }
}

#[test]
fn queue_mode_runs_on_the_target_cpu() {
    let qpw = instance(Policy::Queue);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let work = qpw
        .work(move |ctx| {
            let name = thread::current().name().map(str::to_string);
            s.lock()
                .unwrap()
                .push((ctx.cpu(), qpw_core::current_cpu(), name, ctx.is_remote()));
            assert!(ctx.is_queued());
        })
        .unwrap();
    for cpu in qpw.cpus().iter() {
        assert!(work.is_queued(cpu).unwrap());
        assert!(work.queue_on(cpu).unwrap());
        work.flush(cpu).unwrap();
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), qpw.cpus().len());
    for (cpu, ran_on, name, remote) in seen.iter() {
        assert_eq!(*ran_on, Some(*cpu), "work for cpu {cpu} ran elsewhere");
        assert_eq!(name.as_deref(), Some(format!("qpw/{cpu}").as_str()));
        assert!(!remote);
    }
}

#[test]
fn remote_mode_runs_in_the_caller_before_queue_on_returns() {
    let qpw = instance(Policy::Remote);
    let ran = Arc::new(Mutex::new(None));
    let r = ran.clone();
    let work = qpw
        .work(move |ctx| {
            assert!(!ctx.is_queued(), "a remote-mode run happens in the caller");
            *r.lock().unwrap() = Some((ctx.cpu(), thread::current().id(), ctx.is_remote()));
        })
        .unwrap();
    let me = thread::current().id();
    // Bound to the first CPU: runs for it happen on one of its own threads, so they are not
    // remote (`pw_is_cpu_remote`); runs for the others are.
    let home = qpw.cpus().first().unwrap();
    let _bound = qpw.bind_current(home).unwrap();
    for cpu in qpw.cpus().iter() {
        *ran.lock().unwrap() = None;
        assert!(!work.is_queued(cpu).unwrap());
        assert!(work.queue_on(cpu).unwrap());
        // No flush: the run must already have happened, here.
        assert_eq!(*ran.lock().unwrap(), Some((cpu, me, cpu != home)));
        work.flush(cpu).unwrap();
    }
}

#[test]
fn queue_on_coalesces_while_pending() {
    let qpw = qpw_tests::one_queue_cpu();
    let gate = Gate::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let (g, r) = (gate.clone(), runs.clone());
    let blocker = qpw.work(move |_| g.wait()).unwrap();
    let counted = qpw
        .work(move |_| {
            r.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    // Hold the worker busy so that `counted` stays pending.
    assert!(blocker.queue_on(0).unwrap());
    assert!(counted.queue_on(0).unwrap());
    assert!(
        !counted.queue_on(0).unwrap(),
        "a pending item is not queued twice"
    );
    assert!(!counted.queue_on(0).unwrap());
    gate.open();
    counted.flush(0).unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Once it ran, it can be queued again.
    assert!(counted.queue_on(0).unwrap());
    counted.flush(0).unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A queue-mode flush against a `SCHED_FIFO` spinner that owns the target CPU stalls; the same
/// drain in remote mode completes.
///
/// RT throttling (`sched_rt_runtime_us`, 950000 of each 1 s period by default) hands the CPU to
/// `SCHED_OTHER` tasks when RT tasks have used their budget, and the CPU's budget is shared with
/// every other RT thread there (other tests, other processes). So a queue-mode drain may complete
/// because the spinner was throttled, not because anything is wrong. The spinner's involuntary
/// context switches tell the two apart: a worker that ran while the spinner never left the CPU
/// is a failure; a spinner that was preempted means the attempt proves nothing and is repeated.
#[test]
fn fifo_spinner_stalls_queue_mode_but_not_remote_mode() {
    let (target, requester) = target_and_requester();
    let Some(requester) = requester else {
        eprintln!(
            "only one CPU allowed: a spinner would starve the requester too; nothing to test"
        );
        return;
    };
    qpw_core::pin_current_thread(requester).unwrap();
    eprintln!("RT throttling: {}", rt_throttling());

    for policy in [Policy::Queue, Policy::Remote] {
        let qpw = instance(policy.clone());
        let stock = Arc::new(qpw.per_cpu(|_| 64u32));
        let s = stock.clone();
        let drain = qpw.work(move |ctx| *s.lock_work(ctx).unwrap() = 0).unwrap();
        let left = || {
            let mut left = 0;
            stock.for_each_locked(|cpu, n| {
                if cpu == target {
                    left = *n
                }
            });
            left
        };
        let mut attempts = 0;
        loop {
            attempts += 1;
            if policy == Policy::Queue {
                // Let the worker get to sleep on its CPU before the spinner takes it.
                drain.queue_on(target).unwrap();
                drain.flush(target).unwrap();
                stock.for_each_locked(|_, n| *n = 64);
            }

            let spinner = Spinner::start(target, 50, Duration::from_secs(3));
            // Without SCHED_FIFO (an ordinary user: no CAP_SYS_NICE, RLIMIT_RTPRIO 0) nothing
            // can keep the worker off its CPU for sure: a SCHED_IDLE worker against a
            // SCHED_OTHER spinner still gets a slice now and then. The stall is then not shown,
            // only that the drain completes in both modes.
            let can_starve = spinner.class != SpinnerClass::Other;
            if !can_starve {
                eprintln!(
                    "SCHED_FIFO not permitted here: the queue-mode stall cannot be shown; \
                     checking only that the drain completes in both modes"
                );
            }
            let switches = involuntary_switches(spinner.tid);
            drain.queue_on(target).unwrap();
            let outcome = drain.flush_timeout(target, Duration::from_millis(150));
            let preempted = involuntary_switches(spinner.tid) - switches;
            spinner.stop();

            match policy {
                Policy::Queue if !can_starve => {
                    if outcome.is_err() {
                        drain.flush(target).unwrap();
                    }
                }
                Policy::Queue if outcome.is_ok() && preempted > 0 && attempts < 5 => {
                    eprintln!(
                        "attempt {attempts}: the spinner was preempted {preempted} times (RT \
                         throttling or a higher RT thread) and the worker ran; again"
                    );
                    continue;
                }
                Policy::Queue => {
                    match outcome {
                        Err(Error::Stall {
                            cpu,
                            waited,
                            timeout,
                        }) => {
                            assert_eq!(cpu, target);
                            assert!(waited >= timeout);
                        }
                        other => panic!(
                            "expected a stall on cpu {target}, got {other:?} (the spinner was \
                             preempted {preempted} times; attempt {attempts})"
                        ),
                    }
                    // Once the spinner is gone, the worker runs and the flush completes.
                    drain.flush(target).unwrap();
                }
                _ => outcome.unwrap(),
            }
            break;
        }
        assert_eq!(left(), 0, "{policy}: the drain ran");
    }
    qpw_core::set_current_affinity(&qpw_core::allowed_cpus().unwrap()).unwrap();
}

/// A `SCHED_OTHER` thread of the target CPU takes and drops the local lock non-stop; queue-mode
/// drains still complete (fair hand-off), and nothing is lost.
#[test]
fn queue_mode_drain_completes_against_a_tight_locker() {
    let (target, requester) = target_and_requester();
    if let Some(requester) = requester {
        qpw_core::pin_current_thread(requester).unwrap();
    }
    let qpw = Arc::new(instance(Policy::Queue));
    let cache = Arc::new(qpw.per_cpu(|_| 0u64));
    let drained = Arc::new(AtomicUsize::new(0));
    let (c, d) = (cache.clone(), drained.clone());
    let drain = qpw
        .work(move |ctx| {
            let mut local = c.lock_work(ctx).unwrap();
            d.fetch_add(*local as usize, Ordering::SeqCst);
            *local = 0;
        })
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let locker = {
        let (qpw, cache, stop) = (qpw.clone(), cache.clone(), stop.clone());
        thread::spawn(move || {
            let _bound = qpw.bind_current(target).unwrap();
            let mut added = 0usize;
            while !stop.load(Ordering::Relaxed) {
                *cache.lock_local().unwrap() += 1;
                added += 1;
            }
            added
        })
    };

    const DRAINS: usize = 20;
    let start = Instant::now();
    for _ in 0..DRAINS {
        drain.queue_on(target).unwrap();
        // A liveness bound, not a timing claim: a starved worker would never finish. A minute,
        // far beyond what a busy machine's scheduler takes to run the worker.
        drain
            .flush_timeout(target, Duration::from_secs(60))
            .expect("the drain completes despite the tight locker");
    }
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    let added = locker.join().unwrap();
    eprintln!(
        "{DRAINS} queue-mode drains against a tight locker: {:?} on average",
        elapsed / DRAINS as u32
    );

    let mut left = 0;
    cache.for_each_locked(|_, n| left += *n as usize);
    assert_eq!(drained.load(Ordering::SeqCst) + left, added);
    qpw_core::set_current_affinity(&qpw_core::allowed_cpus().unwrap()).unwrap();
}

#[test]
fn a_panicking_item_is_reported_and_the_worker_lives_on() {
    for policy in [Policy::Queue, Policy::Remote] {
        let qpw = instance(policy.clone());
        let cpu = qpw.cpus().last().unwrap();
        let armed = Arc::new(AtomicBool::new(true));
        let a = armed.clone();
        let flaky = qpw
            .work(move |ctx| {
                if a.swap(false, Ordering::SeqCst) {
                    panic!("boom on cpu {}", ctx.cpu());
                }
            })
            .unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        let next = qpw
            .work(move |_| {
                r.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();

        // A queued run's panic is reported by the flush that waits for it; a remote run's by
        // the `queue_on` that ran it (and not again by the flush).
        let queued = flaky.queue_on(cpu);
        next.queue_on(cpu).unwrap();
        let flushed = flaky.flush(cpu);
        let reported = match policy {
            Policy::Remote => {
                flushed.unwrap();
                queued
            }
            _ => {
                assert!(queued.unwrap());
                flushed.map(|()| true)
            }
        };
        match reported {
            Err(Error::WorkPanicked {
                cpu: c,
                message,
                runs: 1,
            }) => {
                assert_eq!(c, cpu);
                assert_eq!(message, format!("boom on cpu {cpu}"));
            }
            other => panic!("{policy}: expected the panic to be reported, got {other:?}"),
        }
        // Reported once; the next item on the same worker ran; the item works again.
        next.flush(cpu).unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{policy}");
        flaky.queue_on(cpu).unwrap();
        flaky.flush(cpu).unwrap();
    }
}

#[test]
fn shutdown_runs_every_pending_item_and_refuses_new_ones() {
    let qpw = qpw_tests::one_queue_cpu();
    let gate = Gate::new();
    let started = Arc::new(AtomicBool::new(false));
    let (g, s) = (gate.clone(), started.clone());
    let blocker = qpw
        .work(move |_| {
            s.store(true, Ordering::SeqCst);
            g.wait();
        })
        .unwrap();
    let ran = Arc::new(Mutex::new(Vec::new()));
    let items: Vec<_> = (0..3)
        .map(|i| {
            let ran = ran.clone();
            qpw.work(move |_| ran.lock().unwrap().push(i)).unwrap()
        })
        .collect();

    blocker.queue_on(0).unwrap();
    while !started.load(Ordering::SeqCst) {
        thread::yield_now();
    }
    for item in &items {
        assert!(item.queue_on(0).unwrap());
    }
    // Open the gate only once the shutdown has begun: the probe's re-queue is coalesced
    // (it stays pending) until the worker is told to stop, and refused after.
    let probe = qpw.work(|_| {}).unwrap();
    assert!(probe.queue_on(0).unwrap());
    let opener = {
        let gate = gate.clone();
        thread::spawn(move || {
            loop {
                match probe.queue_on(0) {
                    Err(Error::ShutDown { cpu: 0 }) => break,
                    Ok(false) => thread::sleep(Duration::from_millis(1)),
                    other => panic!("unexpected {other:?}"),
                }
            }
            gate.open();
        })
    };
    let report = qpw.shutdown();
    opener.join().unwrap();
    assert_eq!(
        report.ran, 4,
        "three items and the probe ran during shutdown"
    );
    assert!(report.panicked.is_empty());
    assert_eq!(*ran.lock().unwrap(), [0, 1, 2]);
    assert!(matches!(
        items[0].queue_on(0),
        Err(Error::ShutDown { cpu: 0 })
    ));
}

/// The drop of the last handle stops the instance without waiting (it may run on a worker, or
/// in a thread holding a lock the work needs): the work already queued still runs, and a flush
/// waits for it.
#[test]
fn dropping_the_instance_runs_pending_work() {
    let qpw = instance(Policy::Queue);
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let work = qpw
        .work(move |_| {
            thread::sleep(Duration::from_millis(5));
            r.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let n = qpw.cpus().len();
    for cpu in qpw.cpus().iter() {
        work.queue_on(cpu).unwrap();
    }
    let cpus = qpw.cpus().clone();
    drop(qpw);
    for cpu in cpus.iter() {
        assert_eq!(work.queue_on(cpu), Err(Error::ShutDown { cpu }));
        work.flush(cpu).unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), n);
}

#[test]
fn isolated_policy_puts_isolated_cpus_in_remote_mode() {
    let (dir, last) = qpw_tests::fake_isolated_last();
    let qpw = Qpw::builder()
        .policy(Policy::Isolated)
        .sysfs_root(dir.path())
        .build()
        .unwrap();
    for cpu in qpw.cpus().iter() {
        let expect = if cpu == last {
            Mode::Remote
        } else {
            Mode::Queue
        };
        assert_eq!(qpw.mode(cpu).unwrap(), expect);
    }
    assert!(qpw.describe().contains(&format!("remote on {last}")));
    let work = qpw.work(|_| {}).unwrap();
    assert!(!work.is_queued(last).unwrap());
    let pinned = qpw.work_on_cpu(|_| {}).unwrap();
    assert!(
        pinned.is_queued(last).unwrap(),
        "on-CPU work stays queued in remote mode"
    );
}

#[test]
fn work_on_cpu_runs_on_its_cpu_in_remote_mode() {
    let qpw = instance(Policy::Remote);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let work = qpw
        .work_on_cpu(move |ctx| {
            s.lock()
                .unwrap()
                .push((ctx.cpu(), qpw_core::current_cpu(), ctx.is_remote()))
        })
        .unwrap();
    for cpu in qpw.cpus().iter() {
        work.queue_on(cpu).unwrap();
        work.flush(cpu).unwrap();
    }
    for (cpu, ran_on, remote) in seen.lock().unwrap().iter() {
        assert_eq!(*ran_on, Some(*cpu));
        assert!(!remote);
    }
}

#[test]
fn logical_cpus_are_reported_as_such() {
    let qpw = Qpw::builder()
        .cpus(CpuSpec::Logical(128))
        .policy(Policy::Remote)
        .build()
        .unwrap();
    assert!(qpw.is_logical());
    assert_eq!(qpw.cpus().len(), 128);
    assert!(qpw
        .describe()
        .starts_with("128 logical CPUs multiplexed onto physical CPUs"));
    let allowed = qpw_core::allowed_cpus().unwrap();
    assert_eq!(
        qpw.physical_cpu(127).unwrap(),
        allowed.as_slice()[127 % allowed.len()]
    );
    let counters = Arc::new(qpw.per_cpu(|_| 1u32));
    let c = counters.clone();
    let drain = qpw.work(move |ctx| *c.lock_work(ctx).unwrap() = 0).unwrap();
    let report = drain.drain_all(|cpu| cpu % 2 == 0).into_result().unwrap();
    assert_eq!(report.ran_remote.len(), 64);
    assert_eq!(report.skipped.len(), 64);
    let mut left = 0;
    counters.for_each_locked(|_, n| left += *n);
    assert_eq!(left, 64);
}

#[test]
fn bad_input_gets_a_clear_error() {
    for (list, needle) in [
        ("0-", "`0-`"),
        ("5-2", "runs backwards"),
        ("x", "`x` is not a CPU number"),
        (
            "4096",
            "cpu 4096 is out of range: CPU numbers go from 0 to 1023",
        ),
    ] {
        let err = list.parse::<CpuSet>().unwrap_err().to_string();
        assert!(err.contains(needle), "{list}: {err}");
    }

    let allowed = qpw_core::allowed_cpus().unwrap();
    let outside = (0..1000).find(|&c| !allowed.contains(c)).unwrap();
    let err = Qpw::builder()
        .cpus(CpuSpec::List(CpuSet::from_iter([outside])))
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("cpu {outside} is not in the allowed set {allowed}")
    );

    let qpw = instance(Policy::Queue);
    let err = qpw.bind_current(outside).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("cpu {outside} is not in the managed set {}", qpw.cpus())
    );
    let err = qpw_core::pin_current_thread(outside).unwrap_err();
    assert!(matches!(err, Error::CpuNotAllowed { cpu, .. } if cpu == outside));

    let err = "fast".parse::<Policy>().unwrap_err().to_string();
    assert_eq!(
        err,
        "unknown mode `fast`: expected `auto`, `queue`, `remote`, `fenced`, `isolated`, \
         `remote:<cpu-list>` or `fenced:<cpu-list>`"
    );

    let work = qpw.work(|_| {}).unwrap();
    assert!(matches!(
        work.queue_on(outside),
        Err(Error::CpuNotManaged { cpu, .. }) if cpu == outside
    ));
    let err = Qpw::builder().worker_priority(0).build().unwrap_err();
    assert_eq!(
        err.to_string(),
        "SCHED_FIFO priority 0 is out of range: the legal range is 1-99"
    );
    let err = Qpw::builder()
        .cpus(CpuSpec::Logical(0))
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "0 logical CPUs asked for: the legal range is 1-1024"
    );
}

#[test]
fn worker_priority_is_applied_or_refused_clearly() {
    match Qpw::builder().worker_priority(10).build() {
        Ok(qpw) => {
            let policies = Arc::new(Mutex::new(Vec::new()));
            let p = policies.clone();
            let work = qpw
                .work(move |_| {
                    // SAFETY: `sched_getscheduler(0)` has no preconditions.
                    let policy = unsafe { libc::sched_getscheduler(0) };
                    p.lock().unwrap().push(policy);
                })
                .unwrap();
            for cpu in qpw.cpus().iter() {
                work.queue_on(cpu).unwrap();
                work.flush(cpu).unwrap();
            }
            assert!(policies
                .lock()
                .unwrap()
                .iter()
                .all(|&p| p == libc::SCHED_FIFO));
        }
        Err(e) => {
            assert!(matches!(e, Error::SchedFifo { priority: 10, .. }), "{e}");
            eprintln!("SCHED_FIFO not permitted here: {e}");
        }
    }
}
