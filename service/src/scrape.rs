//! The scrape: what it takes from each serving CPU (or concurrency id) for the metrics.

use hdrhistogram::Histogram;

use crate::server::CpuState;

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
