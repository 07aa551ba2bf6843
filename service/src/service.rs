//! A running service: its instance, its serving threads, the metrics thread that scrapes them
//! and the endpoint that serves the metrics; and what it reports when it stops.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use qpw_core::{CpuSet, Qpw};
use serde::Serialize;

use crate::config::Config;
use crate::http::serve_http;
use crate::latency::{histogram, Percentiles};
use crate::metrics::{lock, Metrics};
use crate::scrape::{scrape_fn, start_scraper, ScrapeFn};
use crate::server::{new_state, start_servers, switches, wait_until_bound, Server};

/// A running service.
pub struct Service {
    /// The instance: its CPUs and their modes.
    qpw: Qpw,
    /// One serving thread per serving CPU.
    servers: Vec<Server>,
    /// Set to stop every thread of the service.
    stop: Arc<AtomicBool>,
    /// What the scrapes took, as the endpoint serves it.
    metrics: Arc<Mutex<Metrics>>,
    /// How long each periodic scrape took, in nanoseconds.
    scrape_times: Arc<Mutex<Histogram<u64>>>,
    /// The metrics thread, when scrapes are periodic.
    scraper: Option<JoinHandle<()>>,
    /// One scrape, from whatever thread calls it.
    scrape_once: ScrapeFn,
    /// The endpoint's address and thread, when it has one.
    http: Option<(SocketAddr, JoinHandle<()>)>,
    /// The CPU of the metrics thread, the endpoint and the load generator.
    housekeeping: usize,
    /// Whether one CPU serves and scrapes (no housekeeping CPU apart).
    shared_cpu: bool,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("servers", &self.addrs())
            .field("http", &self.http_addr())
            .finish_non_exhaustive()
    }
}

/// Builds the instance and chooses its CPUs: the first allowed one for housekeeping, every
/// other one to serve (the one CPU does both when there is only one). Returns the instance,
/// the housekeeping CPU and the serving CPUs.
fn build_instance(cfg: &Config) -> Result<(Qpw, usize, CpuSet)> {
    // The last allowed CPU stands for the isolated one: declared so, `Policy::Auto` (the
    // default) runs it in remote mode and the housekeeping CPU in queue mode, as it would
    // on a machine booted with that CPU isolated. The explicit policies ignore it. On one
    // CPU there is nothing apart to isolate.
    let allowed = qpw_core::allowed_cpus().context("cannot read the allowed CPUs")?;
    let mut builder = Qpw::builder().policy(cfg.policy.clone());
    if let (true, Some(last)) = (allowed.len() > 1, allowed.iter().last()) {
        builder = builder.isolated(CpuSet::from_iter([last]));
    }
    let qpw = builder.build().context("cannot build the instance")?;
    let cpus = qpw.cpus().clone();
    let housekeeping = cpus.first().ok_or_else(|| anyhow!("no CPU allowed"))?;
    let serving: CpuSet = if cpus.len() > 1 {
        cpus.difference(&CpuSet::from_iter([housekeeping]))
    } else {
        cpus.clone()
    };
    Ok((qpw, housekeeping, serving))
}

impl Service {
    /// Starts the servers, the metrics thread and, if asked, the HTTP endpoint.
    pub fn start(cfg: &Config) -> Result<Self> {
        if !(0.0..=100_000.0).contains(&cfg.scrape_rate) {
            bail!(
                "scrape rate {}: must be 0 to 100000 per second",
                cfg.scrape_rate
            );
        }
        let (qpw, housekeeping, serving) = build_instance(cfg)?;
        let (state, by_id) = new_state(&qpw, cfg.scrape);
        let stop = Arc::new(AtomicBool::new(false));
        let servers = start_servers(&qpw, &serving, cfg.poll, &state, by_id.as_ref(), &stop)?;
        let servers = wait_until_bound(servers, &stop)?;

        let metrics = Arc::new(Mutex::new(Metrics::new()));
        let scrape_times = Arc::new(Mutex::new(histogram()));
        let scrape_once = scrape_fn(cfg.scrape, &qpw, &state, by_id.as_ref(), &metrics)?;
        let scraper = start_scraper(
            cfg.scrape_rate,
            (&qpw, housekeeping),
            &stop,
            &scrape_once,
            &scrape_times,
        )?;
        let http = match cfg.http_port {
            Some(port) => Some(serve_http(
                port,
                metrics.clone(),
                stop.clone(),
                &qpw,
                housekeeping,
            )?),
            None => None,
        };
        let shared_cpu = qpw.cpus().len() == 1;
        Ok(Self {
            qpw,
            servers,
            stop,
            metrics,
            scrape_times,
            scraper,
            scrape_once,
            http,
            housekeeping,
            shared_cpu,
        })
    }

    /// The serving threads' addresses.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.servers.iter().map(|s| s.addr).collect()
    }

    /// The metrics endpoint's address, when it has one.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().map(|h| h.0)
    }

    /// The housekeeping CPU (metrics, endpoint, load).
    pub fn housekeeping(&self) -> usize {
        self.housekeeping
    }

    /// The serving CPUs.
    pub fn serving_cpus(&self) -> Vec<usize> {
        self.servers.iter().map(|s| s.cpu).collect()
    }

    /// The instance the service runs on (its CPUs, their modes).
    pub fn qpw(&self) -> &Qpw {
        &self.qpw
    }

    /// How the instance runs each CPU.
    pub fn describe(&self) -> String {
        self.qpw.describe()
    }

    /// Scrapes once, now, from the calling thread.
    pub fn scrape_now(&self) -> Result<()> {
        (self.scrape_once)()
    }

    /// Each serving thread's (voluntary, involuntary) context switches so far, summed.
    pub fn serving_switches(&self) -> (u64, u64) {
        self.servers
            .iter()
            .filter_map(|s| switches(s.tid.load(Ordering::Acquire)))
            .fold((0, 0), |(v, i), (a, b)| (v + a, i + b))
    }

    /// Stops everything, scrapes once more, and reports.
    pub fn stop(mut self) -> Result<ServiceReport> {
        self.stop.store(true, Ordering::Release);
        if let Some(s) = self.scraper.take() {
            let _ = s.join();
        }
        let mut served = 0;
        let mut at_server = histogram();
        for s in std::mem::take(&mut self.servers) {
            let (n, hist) = s
                .handle
                .join()
                .map_err(|_| anyhow!("serving thread on cpu {} panicked", s.cpu))??;
            served += n;
            // Same bounds on both sides: the merge cannot fail.
            let _ = at_server.add(&hist);
        }
        // The last scrape takes what came in since the one before.
        (self.scrape_once)()?;
        if let Some((_, h)) = self.http.take() {
            let _ = h.join();
        }
        let m = lock(&self.metrics);
        let times = lock(&self.scrape_times);
        Ok(ServiceReport {
            served,
            scraped: m.scraped.values().sum(),
            scrapes: m.scrapes.get(),
            scrape_p50_us: (!times.is_empty()).then(|| times.value_at_quantile(0.5) as f64 / 1e3),
            scrape_p99_us: (!times.is_empty()).then(|| times.value_at_quantile(0.99) as f64 / 1e3),
            at_server: (!at_server.is_empty()).then(|| Percentiles::of(&at_server)),
            shared_cpu: self.shared_cpu,
        })
    }
}

/// What a service run served and scraped.
#[derive(Debug, Clone, Serialize)]
pub struct ServiceReport {
    /// Requests the serving threads answered (their own count, apart from the per-CPU state).
    pub served: u64,
    /// Requests the scrapes found in the per-CPU state, summed.
    pub scraped: u64,
    /// Scrapes, the last one included.
    pub scrapes: u64,
    /// Scrape duration, median and 99th percentile, in microseconds (periodic scrapes only).
    pub scrape_p50_us: Option<f64>,
    /// See `scrape_p50_us`.
    pub scrape_p99_us: Option<f64>,
    /// Request latency as the serving threads saw it: from the load generator's send to the
    /// reply sent, on one monotonic clock. Unlike the round trip it leaves out the load
    /// generator's receive side, which shares the housekeeping CPU with the scraper; it keeps
    /// the time a request waited in the socket while its serving thread was preempted.
    /// Instrumentation kept by each serving thread, not part of the scraped state.
    pub at_server: Option<Percentiles>,
    /// Whether one CPU served and scraped (no housekeeping CPU apart).
    pub shared_cpu: bool,
}
