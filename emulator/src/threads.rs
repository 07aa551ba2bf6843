//! The steps the probes ([`crate::oslat`], [`crate::cyclictest`]) take alike with their measuring
//! threads: wait for them at a barrier, time the measuring window while showing progress, and
//! join them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};

use crate::load::Phase;
use crate::progress::Progress;

/// The calling thread's involuntary context switches so far (`getrusage(RUSAGE_THREAD)`): how often
/// our kernel preempted it. A vCPU the hypervisor does not run leaves this alone, so unlike a gap
/// in a probe's loop it counts only what this machine's scheduler did to the thread.
pub fn involuntary_switches() -> u64 {
    context_switches().1
}

/// The calling thread's voluntary and involuntary context switches so far
/// (`getrusage(RUSAGE_THREAD)`): how often it gave up its CPU (slept: on a lock's futex, for
/// instance) and how often our kernel took the CPU from it.
pub fn context_switches() -> (u64, u64) {
    // SAFETY: `rusage` is plain data; all-zero bytes are a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable `rusage`; RUSAGE_THREAD cannot fail for the caller.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    (
        u64::try_from(ru.ru_nvcsw).unwrap_or(0),
        u64::try_from(ru.ru_nivcsw).unwrap_or(0),
    )
}

/// Waits until `arrived` counts `n` threads, until one of `threads` has ended (a thread that
/// failed never arrives, so waiting on would never end), or until the run is asked to stop (a
/// signal during the set-up of thousands of threads).
pub fn wait_for<T>(arrived: &AtomicUsize, n: usize, threads: &[JoinHandle<T>]) {
    while arrived.load(Ordering::SeqCst) < n
        && !threads.iter().any(|h| h.is_finished())
        && !crate::rt::interrupted()
    {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Lets the threads measure for `duration` (`None`: until stopped), redrawing `progress`, until
/// the time is up, `stop` is set, SIGINT arrives, or `cut_short` says so; then sets `stop`,
/// stops `phase` (the load) and clears the progress line. Returns whether SIGINT ended the
/// window.
///
/// Between checks the calling thread sleeps in [`crate::signals::wait`]: until the end, a
/// signal, or a probe thread's wake-up, and only as often as the progress line is redrawn when
/// there is one, so that a main thread sharing a measured CPU does not disturb it.
pub fn measure_for(
    duration: Option<Duration>,
    stop: &AtomicBool,
    cut_short: impl Fn() -> bool,
    progress: &Progress,
    phase: &Phase,
) -> bool {
    let end = duration.and_then(|d| Instant::now().checked_add(d));
    let mut interrupted = false;
    while end.is_none_or(|e| Instant::now() < e) && !stop.load(Ordering::SeqCst) {
        if crate::rt::interrupted() {
            interrupted = true;
            break;
        }
        if cut_short() {
            break;
        }
        progress.tick();
        let redraw = progress
            .enabled()
            .then(|| Instant::now() + Duration::from_millis(200));
        let next = match (end, redraw) {
            (Some(e), Some(r)) => Some(e.min(r)),
            (e, r) => e.or(r),
        };
        crate::signals::wait(next);
    }
    stop.store(true, Ordering::SeqCst);
    phase.stop();
    progress.finish();
    interrupted
}

/// Joins the threads in order and returns their results; the first error (or `panicked`, for a
/// thread that panicked) ends it.
pub fn join_all<T>(threads: Vec<JoinHandle<Result<T>>>, panicked: &str) -> Result<Vec<T>> {
    let mut results = Vec::with_capacity(threads.len());
    for h in threads {
        results.push(h.join().map_err(|_| anyhow!("{panicked}"))??);
    }
    Ok(results)
}
