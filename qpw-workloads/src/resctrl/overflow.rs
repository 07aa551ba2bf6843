//! The per-domain overflow worker (`mbm_handle_overflow`, every `MBM_OVERFLOW_INTERVAL`) and
//! read path 4, the cache it keeps (the per-group rate files).

use std::time::{Duration, Instant};

use qpw_core::sync::{AtomicU64, Ordering};

use super::event::Event;
use super::file::MonFile;
use super::hardware::Executing;
use super::model::{lock, Resctrl, Shared, Startup};
use super::value::{Executor, MonRead, ReadValue};

/// The overflow worker's last sample of one counter.
#[derive(Debug, Default)]
pub(super) struct CacheEntry {
    /// [`ReadValue`]'s status (0: a value).
    pub(super) status: AtomicU64,
    pub(super) value: AtomicU64,
    pub(super) rate: AtomicU64,
    /// Nanoseconds since the epoch, plus one; 0: never sampled.
    pub(super) at: AtomicU64,
}

/// The overflow workers' control and record, per domain.
#[derive(Debug)]
pub(super) struct OverflowCtl {
    /// Runs asked for by [`Resctrl::run_overflow_now`], and done.
    pub(super) requested: Vec<u64>,
    pub(super) done: Vec<u64>,
    /// Per domain: what its worker has done.
    pub(super) record: Vec<OverflowRuns>,
    /// When each domain's worker last ran.
    last_run: Vec<Option<Instant>>,
    pub(super) stop: bool,
}

impl OverflowCtl {
    pub(super) fn new(domains: usize) -> Self {
        Self {
            requested: vec![0; domains],
            done: vec![0; domains],
            record: vec![OverflowRuns::default(); domains],
            last_run: vec![None; domains],
            stop: false,
        }
    }
}

/// What one domain's overflow worker has done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OverflowRuns {
    /// Runs in all.
    pub runs: u64,
    /// Runs that its period started (not [`Resctrl::run_overflow_now`]).
    pub periodic: u64,
    /// The shortest time between a periodic run and the run before it: never below the
    /// period.
    pub shortest_period: Option<Duration>,
    /// The CPU of the model its last run executed for (the domain's housekeeping CPU).
    pub cpu: Option<usize>,
    /// The physical CPU its last run executed on (`sched_getcpu`).
    pub phys_cpu: Option<usize>,
}

impl Resctrl {
    /// Path 4: the overflow worker's latest value and rate, and its age.
    pub(super) fn read_cached(&self, file: &MonFile) -> MonRead {
        let hw = &self.shared.hw;
        self.shared.counts.cached.fetch_add(1, Ordering::Relaxed);
        let entry = &hw.cache[hw.idx(file.domain, file.rmid, file.event)];
        let at = entry.at.load(Ordering::Acquire);
        if at == 0 {
            return MonRead {
                value: ReadValue::Unavailable,
                executor: Executor::Cache,
                rate: None,
                age: None,
                waited: None,
            };
        }
        let age = Duration::from_nanos(hw.now_ns().saturating_sub(at - 1));
        let value = ReadValue::decode(
            entry.status.load(Ordering::Relaxed),
            entry.value.load(Ordering::Relaxed),
        );
        MonRead {
            value,
            executor: Executor::Cache,
            rate: (file.event.is_mbm() && value.value().is_some())
                .then(|| entry.rate.load(Ordering::Relaxed)),
            age: Some(age),
            waited: None,
        }
    }

    /// Runs every domain's overflow worker once now and waits for all of them.
    pub fn run_overflow_now(&self) {
        let shared = &self.shared;
        let targets: Vec<u64> = {
            let mut ctl = lock(&shared.overflow);
            for r in ctl.requested.iter_mut() {
                *r += 1;
            }
            ctl.requested.clone()
        };
        shared.overflow_cv.notify_all();
        let mut ctl = lock(&shared.overflow);
        while !ctl.stop && ctl.done.iter().zip(&targets).any(|(d, t)| d < t) {
            ctl = shared
                .overflow_cv
                .wait(ctl)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// How many times `domain`'s overflow worker has run.
    pub fn overflow_runs(&self, domain: usize) -> u64 {
        self.overflow(domain).runs
    }

    /// What `domain`'s overflow worker has done (all zero for a domain that does not exist).
    pub fn overflow(&self, domain: usize) -> OverflowRuns {
        lock(&self.shared.overflow)
            .record
            .get(domain)
            .copied()
            .unwrap_or_default()
    }
}

impl Shared {
    /// The per-domain overflow worker, pinned on `phys` (its housekeeping CPU `cpu`, which
    /// [`Startup`] hears about, a failed pin included): every interval (or when asked),
    /// `mbm_handle_overflow`.
    pub(super) fn overflow_worker(
        &self,
        domain: usize,
        cpu: usize,
        phys: usize,
        startup: &Startup,
    ) {
        if let Err(e) = qpw_core::pin_current_thread(phys) {
            startup.report(Err(e.to_string()));
            return;
        }
        startup.report(Ok(()));
        let mut next = self.interval.map(|i| Instant::now() + i);
        loop {
            let (target, periodic) = {
                let mut ctl = lock(&self.overflow);
                loop {
                    if ctl.stop {
                        return;
                    }
                    if ctl.requested[domain] > ctl.done[domain] {
                        break (ctl.requested[domain], false);
                    }
                    match next {
                        Some(deadline) => {
                            let now = Instant::now();
                            if now >= deadline {
                                break (ctl.requested[domain], true);
                            }
                            ctl = self
                                .overflow_cv
                                .wait_timeout(ctl, deadline - now)
                                .map(|(g, _)| g)
                                .unwrap_or_else(|e| e.into_inner().0);
                        }
                        None => {
                            ctl = self
                                .overflow_cv
                                .wait(ctl)
                                .unwrap_or_else(|e| e.into_inner())
                        }
                    }
                }
            };
            let on = Executing::now(cpu);
            let started = Instant::now();
            self.mbm_handle_overflow(domain, Some(on));
            next = self.interval.map(|i| Instant::now() + i);
            let mut ctl = lock(&self.overflow);
            ctl.done[domain] = ctl.done[domain].max(target);
            let since = ctl.last_run[domain].replace(started);
            let record = &mut ctl.record[domain];
            record.runs += 1;
            record.cpu = Some(on.cpu);
            record.phys_cpu = on.phys;
            if periodic {
                record.periodic += 1;
                if let Some(previous) = since {
                    let gap = started.duration_since(previous);
                    record.shortest_period =
                        Some(record.shortest_period.map_or(gap, |s| s.min(gap)));
                }
            }
            drop(ctl);
            self.overflow_cv.notify_all();
        }
    }

    /// `mbm_handle_overflow` for one domain: under `rdtgroup_mutex`, read every active
    /// group's counters (folding wraps), and keep each one's value and rate for the cache.
    pub(super) fn mbm_handle_overflow(&self, domain: usize, on: Option<Executing>) {
        let _state = lock(&self.rdtgroup_mutex);
        let hw = &self.hw;
        for rmid in 0..hw.nr_rmids {
            if !hw.active[rmid].load(Ordering::Acquire) {
                continue;
            }
            for event in Event::ALL {
                let value = hw.rmid_read(on, domain, rmid as u32, event);
                let now = hw.now_ns();
                let entry = &hw.cache[hw.idx(domain, rmid as u32, event)];
                let prev_at = entry.at.load(Ordering::Relaxed);
                let prev_was_value = entry.status.load(Ordering::Relaxed) == 0;
                // The rate over the period, when this sample and the last are both values.
                let rate = match value {
                    ReadValue::Value(v) if prev_at != 0 && prev_was_value && event.is_mbm() => {
                        let prev = entry.value.load(Ordering::Relaxed);
                        let dt = now.saturating_sub(prev_at - 1).max(1);
                        u128::from(v.saturating_sub(prev)) * 1_000_000_000 / u128::from(dt)
                    }
                    _ => 0,
                };
                // A non-value (an unassigned counter, say) is what the rate file shows too.
                let (status, v) = value.encode();
                entry.rate.store(rate as u64, Ordering::Relaxed);
                entry.status.store(status, Ordering::Relaxed);
                entry.value.store(v, Ordering::Relaxed);
                entry.at.store(now + 1, Ordering::Release);
            }
        }
    }
}
