//! Threads bound to CPUs that start together and are timed together: what both loads
//! ([`hackbench`](super::hackbench) and [`hooks_alone`](super::hooks_alone)) run on.

use std::time::{Duration, Instant};

use qpw_core::sync::{thread, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use qpw_core::Qpw;

use super::error::PoolError;

/// Runs `body(item)` on one thread per `(cpu, item)` of `work`, each bound to its CPU of `qpw`
/// and released at once when all are ready; returns the time from the release to the last
/// thread's end, and the sum of what the bodies returned. The first error of any thread (a
/// binding refused, a body failed, a panic, named `what`) is the result instead.
pub(super) fn run_bound<T: Send>(
    qpw: &Qpw,
    what: &'static str,
    work: Vec<(usize, T)>,
    body: impl Fn(T) -> Result<u64, PoolError> + Sync,
) -> Result<(Duration, u64), PoolError> {
    let threads = work.len();
    let sum = AtomicU64::new(0);
    let start_line = AtomicUsize::new(0);
    let go = AtomicBool::new(false);
    thread::scope(|scope| {
        let handles: Vec<_> = work
            .into_iter()
            .map(|(cpu, item)| {
                let (sum, start_line, go, body) = (&sum, &start_line, &go, &body);
                scope.spawn(move || -> Result<(), PoolError> {
                    let _bound = qpw.bind_current(cpu)?;
                    start_line.fetch_add(1, Ordering::AcqRel);
                    while !go.load(Ordering::Acquire) {
                        thread::yield_now();
                    }
                    sum.fetch_add(body(item)?, Ordering::Relaxed);
                    Ok(())
                })
            })
            .collect();
        // A thread that failed to bind has returned already: release the others anyway, so
        // that they finish (and report) rather than wait forever.
        while start_line.load(Ordering::Acquire) < threads {
            if handles.iter().any(|h| h.is_finished()) {
                break;
            }
            thread::yield_now();
        }
        let start = Instant::now();
        go.store(true, Ordering::Release);
        let mut first_err = None;
        for h in handles {
            let outcome = h.join().unwrap_or_else(|_| {
                Err(PoolError::Thread {
                    what,
                    reason: "panicked".to_string(),
                })
            });
            if let Err(e) = outcome {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok((start.elapsed(), sum.load(Ordering::Relaxed))),
        }
    })
}
