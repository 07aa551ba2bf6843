//! Latency: one clock for every thread of the process, histograms of its nanoseconds, and a
//! distribution's percentiles as the reports give them.

use hdrhistogram::Histogram;
use serde::Serialize;

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every thread of the process, so that a
/// serving thread can tell how long ago the load generator sent the request it just read.
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `timespec` for the duration of the call, and
    // CLOCK_MONOTONIC exists on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Histograms of nanoseconds, 1 ns to 10 s, three significant digits.
pub(crate) fn histogram() -> Histogram<u64> {
    // The bounds are constants that hdrhistogram accepts.
    Histogram::new_with_bounds(1, 10_000_000_000, 3).expect("valid histogram bounds")
}

/// A latency distribution's median, 99th and 99.9th percentile and maximum, in microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Longest.
    pub max_us: f64,
}

impl Percentiles {
    /// The percentiles of a histogram of nanoseconds.
    pub(crate) fn of(hist: &Histogram<u64>) -> Self {
        let us = |v: u64| v as f64 / 1e3;
        Self {
            p50_us: us(hist.value_at_quantile(0.5)),
            p99_us: us(hist.value_at_quantile(0.99)),
            p999_us: us(hist.value_at_quantile(0.999)),
            max_us: us(hist.max()),
        }
    }
}
