//! The metrics, as the endpoint serves them: requests by serving CPU, scrapes, and the service
//! times' percentiles, in a Prometheus registry, with everything scraped so far.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use hdrhistogram::Histogram;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::latency::histogram;
use crate::scrape::Taken;

/// The `cpu` label of the request counter: the serving CPU (the concurrency id with
/// `--scrape cid`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CpuLabel {
    /// The CPU (or id), in decimal.
    cpu: String,
}

/// The metrics, as the endpoint serves them.
pub(crate) struct Metrics {
    /// Every metric below, registered under the `qpw` prefix.
    registry: Registry,
    /// Requests served, by serving CPU (`qpw_requests`).
    requests: Family<CpuLabel, Counter>,
    /// Scrapes so far (`qpw_scrapes`).
    pub(crate) scrapes: Counter,
    /// Median, 99th percentile and longest service time, in seconds.
    service_p50: Gauge<f64, AtomicU64>,
    /// See `service_p50`.
    service_p99: Gauge<f64, AtomicU64>,
    /// See `service_p50`.
    service_max: Gauge<f64, AtomicU64>,
    /// Everything scraped so far: requests by CPU, service times.
    pub(crate) scraped: BTreeMap<usize, u64>,
    /// See `scraped`.
    service: Histogram<u64>,
}

impl Metrics {
    /// The registry with every metric registered, at zero.
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("qpw");
        let requests = Family::<CpuLabel, Counter>::default();
        registry.register(
            "requests",
            "Requests served, by serving CPU",
            requests.clone(),
        );
        let scrapes = Counter::default();
        registry.register("scrapes", "Scrapes of the per-CPU state", scrapes.clone());
        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let g = Gauge::<f64, AtomicU64>::default();
            registry.register(name, help, g.clone());
            g
        };
        let service_p50 = gauge(&mut registry, "service_seconds_p50", "Median service time");
        let service_p99 = gauge(
            &mut registry,
            "service_seconds_p99",
            "99th percentile service time",
        );
        let service_max = gauge(&mut registry, "service_seconds_max", "Longest service time");
        Self {
            registry,
            requests,
            scrapes,
            service_p50,
            service_p99,
            service_max,
            scraped: BTreeMap::new(),
            service: histogram(),
        }
    }

    /// Adds one scrape's takings: each CPU's requests to its counter, the service times to
    /// the percentiles.
    pub(crate) fn add(&mut self, taken: Vec<(usize, Taken)>) {
        for (cpu, (n, hist)) in taken {
            *self.scraped.entry(cpu).or_default() += n;
            self.requests
                .get_or_create(&CpuLabel {
                    cpu: cpu.to_string(),
                })
                .inc_by(n);
            // Same bounds on both sides: the merge cannot fail.
            let _ = self.service.add(&hist);
        }
        self.scrapes.inc();
        let s = |q: f64| self.service.value_at_quantile(q) as f64 / 1e9;
        self.service_p50.set(s(0.5));
        self.service_p99.set(s(0.99));
        self.service_max.set(self.service.max() as f64 / 1e9);
    }

    /// The registry in the Prometheus text format.
    pub(crate) fn text(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Locks `m`, whether or not a thread panicked holding it: the metrics stay readable.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
