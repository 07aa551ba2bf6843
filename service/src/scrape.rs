//! The scrape: what it takes from each serving CPU (or concurrency id) for the metrics, the
//! function that takes it for each `--scrape` kind, and the metrics thread that calls that
//! function at the set rate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use hdrhistogram::Histogram;
use qpw_core::{PerCid, PerCpu, Qpw};

use crate::config::Scrape;
use crate::metrics::{lock, Metrics};
use crate::server::{CpuState, IdStats};

/// One scrape of every serving CPU (or id) into the metrics, from whatever thread calls it.
pub(crate) type ScrapeFn = Arc<dyn Fn() -> Result<()> + Send + Sync>;

/// What one scrape takes from one CPU (or id).
pub(crate) type Taken = (u64, Histogram<u64>);

/// Takes a serving CPU's counts and service times, leaving them empty.
pub(crate) fn take(state: &mut CpuState) -> Taken {
    take_counts(&mut state.requests, &mut state.service_ns)
}

/// Takes a count and a histogram, leaving a zero and an empty histogram of the same bounds.
pub(crate) fn take_counts(requests: &mut u64, service_ns: &mut Histogram<u64>) -> Taken {
    let hist = service_ns.clone();
    service_ns.reset();
    (std::mem::take(requests), hist)
}

/// The scrape for `kind`, which adds what it takes to `metrics`.
pub(crate) fn scrape_fn(
    kind: Scrape,
    qpw: &Qpw,
    state: &PerCpu<CpuState>,
    by_id: Option<&PerCid<IdStats>>,
    metrics: &Arc<Mutex<Metrics>>,
) -> Result<ScrapeFn> {
    Ok(match kind {
        Scrape::Work => by_work(qpw, state, metrics)?,
        Scrape::Walk => by_walk(state, metrics),
        Scrape::Cid => by_id_walk(by_id, metrics),
    })
}

/// `--scrape work`: per-CPU work through a collector, for 5 s at most: a CPU whose run has not
/// run by then fails the scrape, and what that run takes goes to the next scrape.
fn by_work(qpw: &Qpw, state: &PerCpu<CpuState>, metrics: &Arc<Mutex<Metrics>>) -> Result<ScrapeFn> {
    let collector = qpw.collector(state, |_cpu, s| take(s))?;
    let metrics = metrics.clone();
    Ok(Arc::new(move || {
        let (taken, report) = collector.collect_timeout(Duration::from_secs(5));
        lock(&metrics).add(taken);
        report
            .into_result()
            .map(|_| ())
            .map_err(|e| anyhow!("a scrape failed: {e}"))
    }))
}

/// `--scrape walk`: the calling thread takes each CPU's lock in turn.
fn by_walk(state: &PerCpu<CpuState>, metrics: &Arc<Mutex<Metrics>>) -> ScrapeFn {
    let (state, metrics) = (state.clone(), metrics.clone());
    Arc::new(move || {
        let taken = state.take_each(|_cpu, s| take(s));
        lock(&metrics).add(taken);
        Ok(())
    })
}

/// `--scrape cid`: the calling thread walks the concurrency ids used. Without the per-id
/// counts there is nothing to take.
fn by_id_walk(by_id: Option<&PerCid<IdStats>>, metrics: &Arc<Mutex<Metrics>>) -> ScrapeFn {
    let (by_id, metrics) = (by_id.cloned(), metrics.clone());
    Arc::new(move || {
        let Some(by_id) = &by_id else {
            return Ok(());
        };
        let taken = by_id
            .take_each(|s| take_counts(&mut s.requests, &mut s.service_ns))
            .map_err(|e| anyhow!("a scrape failed: {e}"))?;
        lock(&metrics).add(taken);
        Ok(())
    })
}

/// Starts the metrics thread, named `metrics` and bound to the housekeeping CPU: it calls
/// `once` `rate` times a second until `stop`, printing a failed scrape's error, recording each
/// scrape's duration in `times`, and starting late rather than in a burst when it falls
/// behind. At rate 0 there is no thread (`None`): the scrape waits for the end.
pub(crate) fn start_scraper(
    rate: f64,
    (qpw, housekeeping): (&Qpw, usize),
    stop: &Arc<AtomicBool>,
    once: &ScrapeFn,
    times: &Arc<Mutex<Histogram<u64>>>,
) -> Result<Option<JoinHandle<()>>> {
    if rate <= 0.0 {
        return Ok(None);
    }
    let (qpw2, stop, once, times) = (qpw.clone(), stop.clone(), once.clone(), times.clone());
    let period = Duration::from_secs_f64(1.0 / rate);
    Ok(Some(
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                let _bound = qpw2.bind_current(housekeeping);
                let mut next = Instant::now();
                while !stop.load(Ordering::Acquire) {
                    next += period;
                    let t = Instant::now();
                    if let Err(e) = once() {
                        eprintln!("service: {e}");
                    }
                    let _ = lock(&times).record(t.elapsed().as_nanos().max(1) as u64);
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    } else {
                        next = now; // behind: do not burst to catch up
                    }
                }
            })?,
    ))
}
