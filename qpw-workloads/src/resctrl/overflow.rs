//! The per-domain overflow worker (`mbm_handle_overflow`, every `MBM_OVERFLOW_INTERVAL`) and
//! read path 4, the cache it keeps (the per-group rate files).

use std::time::{Duration, Instant};

use qpw_core::sync::{AtomicU64, Ordering};

use super::event::Event;
use super::file::MonFile;
use super::model::{lock, Resctrl, Shared};
use super::value::{Executor, MonRead, ReadValue};

/// The overflow worker's last sample of one counter.
#[derive(Debug, Default)]
pub(super) struct CacheEntry {
    pub(super) value: AtomicU64,
    pub(super) rate: AtomicU64,
    /// Nanoseconds since the epoch, plus one; 0: never sampled.
    pub(super) at: AtomicU64,
}

#[derive(Debug)]
pub(super) struct OverflowCtl {
    pub(super) requested: Vec<u64>,
    pub(super) done: Vec<u64>,
    pub(super) runs: Vec<u64>,
    pub(super) stop: bool,
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
        MonRead {
            value: ReadValue::Value(entry.value.load(Ordering::Relaxed)),
            executor: Executor::Cache,
            rate: file
                .event
                .is_mbm()
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
        lock(&self.shared.overflow)
            .runs
            .get(domain)
            .copied()
            .unwrap_or(0)
    }
}

impl Shared {
    /// The per-domain overflow worker: every interval (or when asked), `mbm_handle_overflow`.
    pub(super) fn overflow_worker(&self, domain: usize, cpu: usize, phys: usize) {
        let _ = qpw_core::pin_current_thread(phys);
        let mut next = self.interval.map(|i| Instant::now() + i);
        loop {
            let target = {
                let mut ctl = lock(&self.overflow);
                loop {
                    if ctl.stop {
                        return;
                    }
                    if ctl.requested[domain] > ctl.done[domain] {
                        break;
                    }
                    match next {
                        Some(deadline) => {
                            let now = Instant::now();
                            if now >= deadline {
                                break;
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
                ctl.requested[domain]
            };
            let on = if self.hw.logical {
                Some(cpu)
            } else {
                qpw_core::current_cpu()
            };
            self.mbm_handle_overflow(domain, on);
            next = self.interval.map(|i| Instant::now() + i);
            let mut ctl = lock(&self.overflow);
            ctl.done[domain] = ctl.done[domain].max(target);
            ctl.runs[domain] += 1;
            drop(ctl);
            self.overflow_cv.notify_all();
        }
    }

    /// `mbm_handle_overflow` for one domain: under `rdtgroup_mutex`, read every active
    /// group's counters (folding wraps), and keep each one's value and rate for the cache.
    pub(super) fn mbm_handle_overflow(&self, domain: usize, on: Option<usize>) {
        let _state = lock(&self.rdtgroup_mutex);
        let hw = &self.hw;
        for rmid in 0..hw.nr_rmids {
            if !hw.active[rmid].load(Ordering::Acquire) {
                continue;
            }
            for event in Event::ALL {
                let value = hw.rmid_read(on, domain, rmid as u32, event);
                let ReadValue::Value(v) = value else {
                    continue;
                };
                let now = hw.now_ns();
                let entry = &hw.cache[hw.idx(domain, rmid as u32, event)];
                let prev_at = entry.at.load(Ordering::Relaxed);
                if prev_at != 0 && event.is_mbm() {
                    let prev = entry.value.load(Ordering::Relaxed);
                    let dt = now.saturating_sub(prev_at - 1).max(1);
                    let rate = u128::from(v.saturating_sub(prev)) * 1_000_000_000 / u128::from(dt);
                    entry.rate.store(rate as u64, Ordering::Relaxed);
                }
                entry.value.store(v, Ordering::Relaxed);
                entry.at.store(now + 1, Ordering::Release);
            }
        }
    }
}
