//! The claim the project rests on (FIDELITY 1): draining a CPU in queue mode preempts the thread
//! that runs there once per drain; in remote mode it never does.
//!
//! A probe thread spins on the target CPU while another CPU drains it `DRAINS` times, one
//! non-coalesced item each (`queue_on` then `flush`, with a pause between drains so the worker
//! is asleep again before the next one). The figure is the probe's involuntary context
//! switches (`nonvoluntary_ctxt_switches` of its `/proc` status) over the drains: a vCPU the
//! hypervisor does not run leaves that counter alone, so unlike counting gaps in the probe's
//! loop it sees only what our kernel did to the probe.
//!
//! With permission for `SCHED_FIFO` (root here) the probe is `SCHED_FIFO` 50 and the workers
//! `SCHED_FIFO` 60: the worker preempts the probe at once, and nothing of `SCHED_OTHER` (other
//! processes on this shared machine) can, so the counts are exact up to RT throttling and other
//! RT threads. Without it both are `SCHED_OTHER`, other processes preempt the probe too, and
//! the claim shows as a difference between the modes, where the machine lets it show: the
//! probe alone, without drains, for as long as a run took, counts the others' preemptions, and
//! where they are a tenth of the drains or more they can hide the difference (this machine
//! counted hundreds a second with a build beside the test), so the pair of runs proves nothing
//! and is not judged. The root pass of the suite makes the exact check.

#![cfg(not(loom))]

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use qpw_core::{Policy, Qpw};
use qpw_tests::{involuntary_switches, rt_throttling, Spinner, SpinnerClass};

/// Drains per mode: enough that one preemption per drain stands far above the noise.
const DRAINS: u64 = 100;
/// The probe's priority, and the workers' (above it, as a kworker's wake-up preempts a task).
const PROBE_PRIO: i32 = 50;
const WORKER_PRIO: i32 = 60;

/// How long the probe may spin at most: only a test that hangs gets there (the spinner stops
/// when its test ends, failed or not).
const SPIN_MAX: Duration = Duration::from_secs(60);

/// The probe's involuntary switches over `DRAINS` drains of `target` from this thread, and how
/// long the drains took.
fn preemptions_per_run(policy: Policy, target: usize, fifo: bool) -> (u64, Duration) {
    let builder = Qpw::builder().policy(policy.clone());
    let builder = if fifo {
        builder.worker_priority(WORKER_PRIO)
    } else {
        builder
    };
    let qpw = builder.build().expect("build the instance");
    let stock = Arc::new(qpw.per_cpu(|_| 0u64));
    let s = stock.clone();
    let drain = qpw
        .work(move |ctx| *s.lock_work(ctx).unwrap() += 1)
        .unwrap();
    // Start the target's worker and let it get to sleep before the probe takes the CPU.
    drain.queue_on(target).unwrap();
    drain.flush(target).unwrap();
    thread::sleep(Duration::from_millis(5));

    let probe = Spinner::start(target, PROBE_PRIO, SPIN_MAX);
    assert_eq!(
        probe.class != SpinnerClass::Other,
        fifo,
        "the probe's class changed between runs"
    );
    let before = involuntary_switches(probe.tid);
    let start = Instant::now();
    for _ in 0..DRAINS {
        assert!(
            drain.queue_on(target).unwrap(),
            "{policy}: a drain coalesced"
        );
        drain.flush(target).unwrap();
        thread::sleep(Duration::from_millis(1));
    }
    let preemptions = involuntary_switches(probe.tid) - before;
    let took = start.elapsed();
    probe.stop();

    let mut ran = 0;
    stock.for_each_locked(|cpu, n| {
        if cpu == target {
            ran = *n;
        }
    });
    assert_eq!(ran, DRAINS + 1, "{policy}: every drain ran");
    eprintln!("{policy}: {preemptions} probe preemptions over {DRAINS} drains in {took:?}");
    (preemptions, took)
}

/// The probe's involuntary switches on `target` over `how_long` without any drain: what the
/// rest of the machine does to it.
fn preemptions_by_others(target: usize, how_long: Duration) -> u64 {
    let probe = Spinner::start(target, PROBE_PRIO, SPIN_MAX);
    let before = involuntary_switches(probe.tid);
    thread::sleep(how_long);
    let others = involuntary_switches(probe.tid) - before;
    probe.stop();
    eprintln!("without drains: {others} probe preemptions in {how_long:?}");
    others
}

#[test]
fn queue_mode_preempts_the_probe_once_per_drain_remote_mode_never() {
    let allowed = qpw_core::allowed_cpus().unwrap();
    let target = allowed.last().unwrap();
    let Some(requester) = allowed.iter().find(|&c| c != target) else {
        eprintln!(
            "only one CPU allowed: the requester would share the probe's CPU; nothing to test"
        );
        return;
    };
    qpw_core::pin_current_thread(requester).unwrap();
    let fifo = qpw_core::set_current_fifo(PROBE_PRIO).is_ok();
    if fifo {
        // Only the permission was asked; the requester itself stays SCHED_OTHER.
        // SAFETY: `param` is a valid `sched_param`; 0 is SCHED_OTHER's only priority.
        let rc = unsafe {
            let param = libc::sched_param { sched_priority: 0 };
            libc::sched_setscheduler(0, libc::SCHED_OTHER, &param)
        };
        assert_eq!(rc, 0, "back to SCHED_OTHER");
    } else {
        eprintln!("SCHED_FIFO not permitted here: probe and workers run SCHED_OTHER");
    }
    eprintln!("RT throttling: {}", rt_throttling());

    // Without SCHED_FIFO any runnable thread of the machine can preempt the probe too, in
    // either mode: a burst of someone else's work during one run can hide the difference, so
    // a pair of runs is tried again, up to three times, before the claim counts as broken. A
    // pair during which the others' preemptions alone (the probe without drains, as long as
    // the longer run) reach a tenth of the drains is not judged: such noise, as uneven between
    // runs as it is on a busy machine, can take the difference either way.
    let tries = if fifo { 1 } else { 3 };
    // The last pair judged, and the last one seen.
    let mut judged = None;
    let mut last = (0, 0);
    for _ in 0..tries {
        let (queue, q_took) = preemptions_per_run(Policy::Queue, target, fifo);
        let (remote, r_took) = preemptions_per_run(Policy::Remote, target, fifo);
        last = (queue, remote);
        if !fifo && preemptions_by_others(target, q_took.max(r_took)) >= DRAINS / 10 {
            continue;
        }
        judged = Some(last);
        if fifo || queue >= remote + DRAINS / 2 {
            break;
        }
    }
    qpw_core::set_current_affinity(&allowed).unwrap();
    let Some((queue, remote)) = judged else {
        eprintln!(
            "others preempted the SCHED_OTHER probe {} times or more in each try: the \
             difference between the modes (last: queue {}, remote {}) is not decided here; it \
             is with SCHED_FIFO (as root)",
            DRAINS / 10,
            last.0,
            last.1
        );
        return;
    };

    if fifo {
        // Exact but for RT throttling and other RT threads: a few preemptions at most.
        let slack = DRAINS / 10;
        assert!(
            (DRAINS - slack..=DRAINS + slack).contains(&queue),
            "queue mode: {queue} preemptions over {DRAINS} drains, expected about one each"
        );
        assert!(
            remote <= slack,
            "remote mode: {remote} preemptions over {DRAINS} drains, expected about none"
        );
    } else {
        assert!(
            queue >= remote + DRAINS / 2,
            "queue mode: {queue} preemptions, remote mode: {remote}, over {DRAINS} drains each: \
             expected about one more per drain in queue mode"
        );
    }
}
