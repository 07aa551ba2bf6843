//! A running service: its instance, its serving threads, the metrics thread that scrapes them
//! and the endpoint that serves the metrics; and what it reports when it stops.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use qpw_core::{CpuSet, Qpw};
use serde::Serialize;

use crate::config::{Config, Poll, Scrape};
use crate::http::serve_http;
use crate::latency::{histogram, Percentiles};
use crate::metrics::{lock, Metrics};
use crate::request::grow_receive_buffer;
use crate::scrape::{take, take_counts};
use crate::server::{serve, switches, CpuState, IdStats, Server};

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
    scrape_once: Arc<dyn Fn() -> Result<()> + Send + Sync>,
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

impl Service {
    /// Starts the servers, the metrics thread and, if asked, the HTTP endpoint.
    pub fn start(cfg: &Config) -> Result<Self> {
        if !(0.0..=100_000.0).contains(&cfg.scrape_rate) {
            bail!(
                "scrape rate {}: must be 0 to 100000 per second",
                cfg.scrape_rate
            );
        }
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
        let state = qpw.per_cpu(|_| CpuState {
            requests: 0,
            service_ns: histogram(),
            free: Vec::new(),
        });
        let by_id = (cfg.scrape == Scrape::Cid).then(|| {
            qpw.per_cid(|_| IdStats {
                requests: 0,
                service_ns: histogram(),
            })
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mut servers = Vec::new();
        for cpu in serving.iter() {
            let sock = UdpSocket::bind("127.0.0.1:0").context("cannot bind a UDP socket")?;
            grow_receive_buffer(&sock);
            match cfg.poll {
                Poll::Busy => sock.set_nonblocking(true)?,
                Poll::Block => sock.set_read_timeout(Some(Duration::from_millis(20)))?,
            }
            let addr = sock.local_addr()?;
            let tid = Arc::new(AtomicI32::new(0));
            let (qpw2, state, stop, tid2) = (qpw.clone(), state.clone(), stop.clone(), tid.clone());
            let by_id = by_id.clone();
            let handle = std::thread::Builder::new()
                .name(format!("serve/{cpu}"))
                .spawn(move || serve(&qpw2, cpu, &sock, &state, by_id.as_ref(), &stop, &tid2))?;
            servers.push(Server {
                cpu,
                addr,
                tid,
                handle,
            });
        }
        // Wait for every server to be bound to its CPU and to know its thread id.
        let t0 = Instant::now();
        while servers.iter().any(|s| s.tid.load(Ordering::Acquire) == 0) {
            if t0.elapsed() > Duration::from_secs(5)
                || servers.iter().any(|s| s.handle.is_finished())
            {
                stop.store(true, Ordering::Release);
                for s in servers {
                    if let Ok(Err(e)) = s.handle.join() {
                        return Err(e);
                    }
                }
                bail!("a serving thread did not start");
            }
            std::thread::sleep(Duration::from_millis(1));
        }

        let metrics = Arc::new(Mutex::new(Metrics::new()));
        let scrape_times = Arc::new(Mutex::new(histogram()));
        let scrape_once: Arc<dyn Fn() -> Result<()> + Send + Sync> = match cfg.scrape {
            Scrape::Work => {
                let collector = qpw.collector(&state, |_cpu, s| take(s))?;
                let metrics = metrics.clone();
                Arc::new(move || {
                    let (taken, report) = collector.collect_timeout(Duration::from_secs(5));
                    lock(&metrics).add(taken);
                    report
                        .into_result()
                        .map(|_| ())
                        .map_err(|e| anyhow!("a scrape failed: {e}"))
                })
            }
            Scrape::Walk => {
                let (state, metrics) = (state.clone(), metrics.clone());
                Arc::new(move || {
                    let taken = state.take_each(|_cpu, s| take(s));
                    lock(&metrics).add(taken);
                    Ok(())
                })
            }
            Scrape::Cid => {
                let (by_id, metrics) = (by_id.clone(), metrics.clone());
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
        };
        let scraper = if cfg.scrape_rate > 0.0 {
            let (qpw2, stop, once, times) = (
                qpw.clone(),
                stop.clone(),
                scrape_once.clone(),
                scrape_times.clone(),
            );
            let period = Duration::from_secs_f64(1.0 / cfg.scrape_rate);
            Some(
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
            )
        } else {
            None
        };
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
            shared_cpu: cpus.len() == 1,
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
