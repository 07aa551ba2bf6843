//! A latency-sensitive service built on qpw-core, as a service developer would write it: a UDP
//! request/response server with one thread pinned per serving CPU, per-CPU state (a request
//! counter, a latency histogram, a free list of buffers) in a [`PerCpu`], and a metrics thread
//! on a housekeeping CPU that scrapes every CPU's state through the library at a set rate and
//! serves it as Prometheus text over HTTP. A load generator sends requests at a fixed rate and
//! records each round trip.
//!
//! The question it answers: what each mode costs the requests when the metrics are scraped.
//! The scrape takes each CPU's counts and histogram with [`Qpw::collector`], per-CPU *work*:
//! in queue mode it runs on the serving CPU's worker (a context switch on the serving thread's
//! CPU per scrape, as the kernel's `queue_work_on` + `flush_work`), in remote and fenced mode
//! in the metrics thread under the serving CPU's lock. `--scrape walk` uses
//! [`PerCpu::take_each`] instead, the walk the crate recommends for scrapes in every mode.
//!
//! The serving CPUs are every allowed CPU but the first (the housekeeping CPU, which runs the
//! metrics thread, the HTTP endpoint and the load generator); the last one stands for the
//! isolated CPU, declared so with [`qpw_core::Builder::isolated`]: the default policy
//! ([`Policy::Auto`]) runs it in remote mode and the housekeeping CPU in queue mode. On one CPU
//! everything shares it, and the run says so.

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use qpw_core::{CpuSet, PerCpu, Policy, Qpw};
use serde::Serialize;

pub mod plot;

/// A request: a sequence number and the client's send time ([`now_ns`]). The server echoes it.
const REQUEST_BYTES: usize = 16;

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every thread of the process, so that a
/// serving thread can tell how long ago the load generator sent the request it just read.
fn now_ns() -> u64 {
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
fn histogram() -> Histogram<u64> {
    // The bounds are constants that hdrhistogram accepts.
    Histogram::new_with_bounds(1, 10_000_000_000, 3).expect("valid histogram bounds")
}

/// How the metrics thread reaches the serving CPUs' state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Scrape {
    /// Per-CPU work ([`Qpw::collector`]): queued to the CPU's worker in queue mode, run in the
    /// metrics thread in remote and fenced mode.
    Work,
    /// [`PerCpu::take_each`]: the metrics thread takes each CPU's lock itself, in every mode.
    Walk,
    /// The counts and service times kept per concurrency id instead ([`qpw_core::PerCid`]:
    /// rseq's `mm_cid`, one slot per thread that runs at once), and the metrics thread walks
    /// the ids used ([`qpw_core::PerCid::take_each`]) from its own CPU, in every mode; the
    /// reply buffers stay per CPU. The metrics' `cpu` label is then the id.
    Cid,
}

impl std::str::FromStr for Scrape {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "work" => Ok(Self::Work),
            "walk" => Ok(Self::Walk),
            "cid" => Ok(Self::Cid),
            _ => Err(format!("--scrape {s}: must be `work`, `walk` or `cid`")),
        }
    }
}

/// How a serving thread waits for its next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Poll {
    /// It spins on a non-blocking socket, as a latency-sensitive service on a dedicated CPU
    /// does: the CPU is never idle, so anything else that runs there preempts it.
    Busy,
    /// It sleeps in `recv` between requests: other work on the CPU runs while it sleeps.
    Block,
}

impl std::str::FromStr for Poll {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "busy" => Ok(Self::Busy),
            "block" => Ok(Self::Block),
            _ => Err(format!("--poll {s}: must be `busy` or `block`")),
        }
    }
}

/// The modes a comparison runs, by name: queue, remote, fenced, and `auto` (the default
/// policy: remote on isolated CPUs, queue elsewhere).
pub fn policy(name: &str) -> Result<Policy> {
    match name {
        "queue" => Ok(Policy::Queue),
        "remote" => Ok(Policy::Remote),
        "fenced" => Ok(Policy::Fenced),
        "auto" | "default" => Ok(Policy::Auto),
        _ => bail!("mode {name:?}: must be queue, remote, fenced or auto"),
    }
}

/// One serving CPU's state.
#[derive(Debug)]
struct CpuState {
    /// Requests served since the last scrape.
    requests: u64,
    /// Service time of each, in nanoseconds, since the last scrape.
    service_ns: Histogram<u64>,
    /// Reply buffers to reuse.
    free: Vec<Vec<u8>>,
}

/// One concurrency id's counts and service times (`--scrape cid`).
#[derive(Debug)]
struct IdStats {
    requests: u64,
    service_ns: Histogram<u64>,
}

/// What one scrape takes from one CPU (or id).
type Taken = (u64, Histogram<u64>);

fn take(state: &mut CpuState) -> Taken {
    take_counts(&mut state.requests, &mut state.service_ns)
}

fn take_counts(requests: &mut u64, service_ns: &mut Histogram<u64>) -> Taken {
    let hist = service_ns.clone();
    service_ns.reset();
    (std::mem::take(requests), hist)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CpuLabel {
    cpu: String,
}

/// The metrics, as the endpoint serves them.
struct Metrics {
    registry: Registry,
    requests: Family<CpuLabel, Counter>,
    scrapes: Counter,
    service_p50: Gauge<f64, AtomicU64>,
    service_p99: Gauge<f64, AtomicU64>,
    service_max: Gauge<f64, AtomicU64>,
    /// Everything scraped so far: requests by CPU, service times.
    scraped: BTreeMap<usize, u64>,
    service: Histogram<u64>,
}

impl Metrics {
    fn new() -> Self {
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

    fn add(&mut self, taken: Vec<(usize, Taken)>) {
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

    fn text(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// A serving thread: its CPU, its address, its thread id (for its context switches), and
/// what it served.
struct Server {
    cpu: usize,
    addr: SocketAddr,
    tid: Arc<AtomicI32>,
    handle: JoinHandle<Result<(u64, Histogram<u64>)>>,
}

/// What a service run is asked to do.
#[derive(Debug, Clone)]
pub struct Config {
    /// The mode policy.
    pub policy: Policy,
    /// Scrapes per second (0: none until the end).
    pub scrape_rate: f64,
    /// How the scrape reaches the CPUs.
    pub scrape: Scrape,
    /// How the serving threads wait for requests.
    pub poll: Poll,
    /// Serve the metrics over HTTP on this loopback port (0: any free port); `None`: no
    /// endpoint.
    pub http_port: Option<u16>,
}

/// A running service.
pub struct Service {
    qpw: Qpw,
    servers: Vec<Server>,
    stop: Arc<AtomicBool>,
    metrics: Arc<Mutex<Metrics>>,
    scrape_times: Arc<Mutex<Histogram<u64>>>,
    scraper: Option<JoinHandle<()>>,
    scrape_once: Arc<dyn Fn() -> Result<()> + Send + Sync>,
    http: Option<(SocketAddr, JoinHandle<()>)>,
    housekeeping: usize,
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

/// Reads a thread's voluntary and involuntary context switches.
pub fn switches(tid: i32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    let get = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    Some((
        get("voluntary_ctxt_switches:")?,
        get("nonvoluntary_ctxt_switches:")?,
    ))
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
    fn of(hist: &Histogram<u64>) -> Self {
        let us = |v: u64| v as f64 / 1e3;
        Self {
            p50_us: us(hist.value_at_quantile(0.5)),
            p99_us: us(hist.value_at_quantile(0.99)),
            p999_us: us(hist.value_at_quantile(0.999)),
            max_us: us(hist.max()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A serving thread: bound to `cpu`, answers each request with its echo, keeping its CPU's
/// count, service time and reply buffers in the per-CPU state. Returns how many it served,
/// and each request's latency at the server (send to reply, [`ServiceReport::at_server`]).
///
/// Between requests it polls its binding ([`qpw_core::Binding::poll`]): in fenced mode a
/// scrape calls its CPU, and the poll's answer spares the CPU the scrape's `membarrier` fence
/// (an interrupt here). Elsewhere the poll is one load that finds nothing.
fn serve(
    qpw: &Qpw,
    cpu: usize,
    sock: &UdpSocket,
    state: &PerCpu<CpuState>,
    by_id: Option<&qpw_core::PerCid<IdStats>>,
    stop: &AtomicBool,
    tid: &AtomicI32,
) -> Result<(u64, Histogram<u64>)> {
    let bound = qpw
        .bind_current(cpu)
        .with_context(|| format!("cannot bind the server to cpu {cpu}"))?;
    // SAFETY: `gettid` has no preconditions.
    tid.store(unsafe { libc::gettid() }, Ordering::Release);
    let mut rx = [0u8; 64];
    let mut served = 0;
    let mut at_server = histogram();
    while !stop.load(Ordering::Acquire) {
        // A scrape waiting for this CPU's answer? (Seldom: one load when none is.)
        bound.poll();
        let (n, from) = match sock.recv_from(&mut rx) {
            Ok(got) => got,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                std::hint::spin_loop();
                continue;
            }
            Err(e) => return Err(e).context("recv_from"),
        };
        let start = Instant::now();
        let mut reply = state.lock_local()?.free.pop().unwrap_or_default();
        reply.clear();
        reply.extend_from_slice(&rx[..n]);
        // A reply that cannot be sent is the client's loss, not the server's: counted served.
        let _ = sock.send_to(&reply, from);
        let service_ns = start.elapsed().as_nanos().max(1) as u64;
        let mut s = state.lock_local()?;
        s.free.push(reply);
        match by_id {
            // `--scrape cid`: the counts go to this thread's id's slot.
            Some(by_id) => {
                drop(s);
                let mut id = by_id.lock_local()?;
                id.requests += 1;
                let _ = id.service_ns.record(service_ns);
            }
            None => {
                s.requests += 1;
                let _ = s.service_ns.record(service_ns);
            }
        }
        served += 1;
        // The send time comes from the network: a datagram that is not a request has none,
        // and a time in the future counts as no wait.
        if let Some((_, sent_at)) = parse_request(&rx[..n]) {
            at_server.saturating_record(now_ns().saturating_sub(sent_at).max(1));
        }
    }
    Ok((served, at_server))
}

/// The HTTP endpoint: `GET /metrics` (any path) answers the registry in the Prometheus text
/// format.
fn serve_http(
    port: u16,
    metrics: Arc<Mutex<Metrics>>,
    stop: Arc<AtomicBool>,
    qpw: &Qpw,
    housekeeping: usize,
) -> Result<(SocketAddr, JoinHandle<()>)> {
    let server = tiny_http::Server::http(("127.0.0.1", port))
        .map_err(|e| anyhow!("cannot serve HTTP on 127.0.0.1:{port}: {e}"))?;
    let addr = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| anyhow!("the HTTP server has no IP address"))?;
    let qpw = qpw.clone();
    let handle = std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || {
            let _bound = qpw.bind_current(housekeeping);
            while !stop.load(Ordering::Acquire) {
                let Ok(Some(req)) = server.recv_timeout(Duration::from_millis(50)) else {
                    continue;
                };
                let body = lock(&metrics).text();
                let header = tiny_http::Header::from_bytes(
                    &b"Content-Type"[..],
                    &b"application/openmetrics-text; version=1.0.0; charset=utf-8"[..],
                );
                let mut resp = tiny_http::Response::from_string(body);
                if let Ok(h) = header {
                    resp.add_header(h);
                }
                let _ = req.respond(resp);
            }
        })?;
    Ok((addr, handle))
}

/// What the load generator saw.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// Requests sent.
    pub sent: u64,
    /// Requests that got a reply, each counted once (by its sequence number).
    pub received: u64,
    /// Replies to a request that had already had one: a server that answered twice.
    pub duplicates: u64,
    /// Datagrams that were not a reply to a request sent (too short, or an unknown sequence
    /// number): ignored.
    pub stray: u64,
    /// Round trip, microseconds: median, 99th, 99.9th percentile and longest.
    pub p50_us: f64,
    /// See `p50_us`.
    pub p99_us: f64,
    /// See `p50_us`.
    pub p999_us: f64,
    /// See `p50_us`.
    pub max_us: f64,
}

/// How long the load generator waits, after its last request, for the next reply while some
/// are missing: a reply later than this is counted as missing. Long enough for a serving
/// thread starved by the machine (a `SCHED_FIFO` thread of another program on its CPU holds
/// it up to `sched_rt_runtime_us`, 0.95 s by default) to answer what its socket holds; a run
/// whose every request got its reply does not wait at all.
const STRAGGLERS: Duration = Duration::from_secs(2);

/// Asks for a receive buffer of 4 MiB (the kernel caps it at `net.core.rmem_max`), so that a
/// socket whose reader is preempted for a while queues its datagrams rather than dropping them:
/// a late request shows in the round trips instead of vanishing. Best effort: a refusal leaves
/// the default.
fn grow_receive_buffer(sock: &UdpSocket) {
    use std::os::fd::AsRawFd as _;
    let bytes: libc::c_int = 4 << 20;
    // SAFETY: (1) the descriptor is the socket's, open for the duration of the call; (2) the
    // option value points to a `c_int` that lives across the call, and its size is given.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Sends `rate` requests per second for `duration` to `targets` in turn, from a thread bound
/// to `cpu` when given, and records each round trip. After the last request it waits for the
/// replies still due, until every request has one or none has come for two seconds. Each
/// reply is matched to its request by sequence number, so a reply counts once however often
/// it comes.
pub fn load(
    targets: &[SocketAddr],
    rate: f64,
    duration: Duration,
    cpu: Option<(usize, &Qpw)>,
) -> Result<LoadReport> {
    if targets.is_empty() {
        bail!("no server to send to");
    }
    if !(1.0..=1_000_000.0).contains(&rate) {
        bail!("request rate {rate}: must be 1 to 1000000 per second");
    }
    let sock = UdpSocket::bind("127.0.0.1:0").context("cannot bind the client's socket")?;
    grow_receive_buffer(&sock);
    sock.set_read_timeout(Some(Duration::from_millis(20)))?;
    let rx = sock.try_clone()?;
    let done = Arc::new(AtomicBool::new(false));
    // Sequence numbers handed out so far (set before each send, so that a reply can never
    // come back for a number not yet counted), and replies matched so far.
    let issued = Arc::new(AtomicU64::new(0));
    let matched = Arc::new(AtomicU64::new(0));
    let bind = cpu.map(|(c, q)| (c, q.clone()));
    let receiver = {
        let (done, bind, issued, matched) =
            (done.clone(), bind.clone(), issued.clone(), matched.clone());
        std::thread::Builder::new()
            .name("load-rx".into())
            .spawn(move || {
                let _bound = bind.as_ref().map(|(c, q)| q.bind_current(*c));
                let mut hist = histogram();
                let mut replied: Vec<bool> = Vec::new();
                let (mut duplicates, mut stray) = (0u64, 0u64);
                let mut buf = [0u8; 64];
                while !done.load(Ordering::Acquire) {
                    let Ok(n) = rx.recv(&mut buf) else { continue };
                    let now = now_ns();
                    // Is it a reply to a request of ours? The bytes come from the network:
                    // check the length and the sequence number before using them.
                    let Some((seq, sent_at)) = parse_request(&buf[..n]) else {
                        stray += 1;
                        continue;
                    };
                    if seq >= issued.load(Ordering::Acquire) {
                        stray += 1;
                        continue;
                    }
                    let idx = seq as usize;
                    if replied.len() <= idx {
                        replied.resize(idx + 1, false);
                    }
                    // Yes: the first reply to it counts, a second one is a duplicate.
                    if std::mem::replace(&mut replied[idx], true) {
                        duplicates += 1;
                        continue;
                    }
                    hist.saturating_record(now.saturating_sub(sent_at).max(1));
                    matched.fetch_add(1, Ordering::Release);
                }
                (hist, duplicates, stray)
            })?
    };
    let _bound = bind.as_ref().map(|(c, q)| q.bind_current(*c));
    let period = Duration::from_secs_f64(1.0 / rate);
    let mut next = Instant::now();
    let end = next + duration;
    let mut sent = 0u64;
    let mut seq = 0u64;
    let mut req = [0u8; REQUEST_BYTES];
    while next < end {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        req[..8].copy_from_slice(&seq.to_le_bytes());
        req[8..].copy_from_slice(&now_ns().to_le_bytes());
        let target = targets[(seq % targets.len() as u64) as usize];
        issued.store(seq + 1, Ordering::Release);
        if sock.send_to(&req, target).is_ok() {
            sent += 1;
        }
        seq += 1;
        next += period;
    }
    // Wait for the replies still due, for as long as they keep coming.
    let (mut last, mut last_change) = (matched.load(Ordering::Acquire), Instant::now());
    while last < sent && last_change.elapsed() < STRAGGLERS {
        std::thread::sleep(Duration::from_millis(5));
        let now = matched.load(Ordering::Acquire);
        if now != last {
            (last, last_change) = (now, Instant::now());
        }
    }
    done.store(true, Ordering::Release);
    let (hist, duplicates, stray) = receiver
        .join()
        .map_err(|_| anyhow!("the load's receiver panicked"))?;
    let us = |v: u64| v as f64 / 1e3;
    Ok(LoadReport {
        sent,
        received: matched.load(Ordering::Acquire),
        duplicates,
        stray,
        p50_us: us(hist.value_at_quantile(0.5)),
        p99_us: us(hist.value_at_quantile(0.99)),
        p999_us: us(hist.value_at_quantile(0.999)),
        max_us: us(hist.max()),
    })
}

/// A request's (or its echo's) sequence number and send time, if `bytes` has the request's
/// length.
fn parse_request(bytes: &[u8]) -> Option<(u64, u64)> {
    let bytes: &[u8; REQUEST_BYTES] = bytes.try_into().ok()?;
    let (seq, sent_at) = bytes.split_at(8);
    Some((
        u64::from_le_bytes(seq.try_into().ok()?),
        u64::from_le_bytes(sent_at.try_into().ok()?),
    ))
}

/// One cell of a comparison: one mode at one scrape rate.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// The mode policy's name.
    pub mode: String,
    /// How the instance ran each CPU.
    pub qpw: String,
    /// Requests per second sent.
    pub request_rate: f64,
    /// Scrapes per second asked for.
    pub scrape_rate: f64,
    /// How the scrape reached the CPUs.
    pub scrape: Scrape,
    /// How the serving threads waited for requests.
    pub poll: Poll,
    /// Seconds of load.
    pub seconds: f64,
    /// The load generator's figures.
    pub load: LoadReport,
    /// The service's figures.
    pub service: ServiceReport,
    /// The serving threads' voluntary and involuntary context switches during the load, per
    /// scrape.
    pub voluntary_per_scrape: f64,
    /// See `voluntary_per_scrape`.
    pub involuntary_per_scrape: f64,
    /// Fenced mode: the scrapes' flags on the serving CPUs' locks settled by a `membarrier`
    /// fence (an interrupt on the serving CPU), per scrape; the others were answered by the
    /// serving threads ([`qpw_core::fenced_lock::fence_counts`], over the load). 0 in the
    /// other modes.
    pub fences_per_scrape: f64,
    /// See `fences_per_scrape`: the flags the serving CPUs answered, per scrape.
    pub answers_per_scrape: f64,
    /// Whether the scraped counts equal the requests served: the library's part, no count
    /// lost or taken twice by the scrapes.
    pub nothing_lost: bool,
    /// Whether every request served got exactly one reply at the load generator (replies
    /// equal to requests served, no duplicate): the sockets' part. A request dropped before
    /// the server (its socket full) is neither served nor replied, and shows as `sent` above
    /// `served`.
    pub replies_match: bool,
}

impl RunResult {
    /// What disagrees, if anything: the scraped counts against the requests served, or the
    /// replies against them.
    pub fn mismatch(&self) -> Option<String> {
        let (l, s) = (&self.load, &self.service);
        let mut what = Vec::new();
        if !self.nothing_lost {
            what.push(format!(
                "scraped {} requests but served {}",
                s.scraped, s.served
            ));
        }
        if !self.replies_match {
            what.push(format!(
                "served {} requests but {} got a reply ({} duplicate replies)",
                s.served, l.received, l.duplicates
            ));
        }
        (!what.is_empty()).then(|| {
            format!(
                "{} at {}/s: {}",
                self.mode,
                self.scrape_rate,
                what.join(", ")
            )
        })
    }
}

/// Runs the service under load for `duration` in one mode at one scrape rate, and checks that
/// the scrapes counted every request served exactly once.
pub fn run_one(
    mode: &str,
    request_rate: f64,
    scrape_rate: f64,
    scrape: Scrape,
    poll: Poll,
    duration: Duration,
) -> Result<RunResult> {
    let svc = Service::start(&Config {
        policy: policy(mode)?,
        scrape_rate,
        scrape,
        poll,
        http_port: None,
    })?;
    let before = svc.serving_switches();
    let fences_before = qpw_core::fenced_lock::fence_counts();
    let hk = svc.housekeeping();
    let load = load(&svc.addrs(), request_rate, duration, Some((hk, &svc.qpw)));
    let after = svc.serving_switches();
    let fences = qpw_core::fenced_lock::fence_counts().since(&fences_before);
    let qpw = svc.describe();
    let service = svc.stop()?;
    let load = load?;
    let scrapes = service.scrapes.max(1) as f64;
    Ok(RunResult {
        mode: mode.to_string(),
        qpw,
        request_rate,
        scrape_rate,
        scrape,
        poll,
        seconds: duration.as_secs_f64(),
        nothing_lost: service.scraped == service.served,
        replies_match: load.received == service.served && load.duplicates == 0,
        voluntary_per_scrape: after.0.saturating_sub(before.0) as f64 / scrapes,
        involuntary_per_scrape: after.1.saturating_sub(before.1) as f64 / scrapes,
        fences_per_scrape: fences.fenced as f64 / scrapes,
        answers_per_scrape: fences.answered as f64 / scrapes,
        load,
        service,
    })
}

/// A duration as the project's tools write them: `2s`, `500ms`, `1m`, or plain seconds.
pub fn duration(name: &str, text: &str) -> Result<Duration> {
    let t = text.trim();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let scale = match unit {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        _ => f64::NAN,
    };
    match num.parse::<f64>() {
        Ok(v) if scale.is_finite() && v * scale >= 0.01 && v * scale <= 3600.0 => {
            Ok(Duration::from_secs_f64(v * scale))
        }
        _ => bail!(
            "{name} {text}: must be a duration of 10ms to 1h, written like 2, 2s, 500ms or 1m"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_request_sized_datagram_is_read_as_a_reply() {
        let mut req = [0u8; REQUEST_BYTES];
        req[..8].copy_from_slice(&7u64.to_le_bytes());
        req[8..].copy_from_slice(&1234u64.to_le_bytes());
        assert_eq!(parse_request(&req), Some((7, 1234)));
        assert_eq!(parse_request(&req[..REQUEST_BYTES - 1]), None);
        assert_eq!(parse_request(&[0u8; REQUEST_BYTES + 1]), None);
        assert_eq!(parse_request(&[]), None);
    }

    #[test]
    fn durations_and_modes_are_checked() {
        assert_eq!(duration("-D", "2s").unwrap(), Duration::from_secs(2));
        assert_eq!(duration("-D", "500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(duration("-D", "3").unwrap(), Duration::from_secs(3));
        for bad in ["", "x", "2h", "0", "-1s", "5000s"] {
            let e = duration("--duration", bad).unwrap_err().to_string();
            assert!(
                e.starts_with("--duration") && e.contains("10ms to 1h"),
                "{e}"
            );
        }
        assert!(policy("queue").is_ok() && policy("auto").is_ok());
        assert!(policy("fast")
            .unwrap_err()
            .to_string()
            .contains("queue, remote, fenced or auto"));
        assert_eq!("walk".parse::<Scrape>(), Ok(Scrape::Walk));
        assert_eq!("cid".parse::<Scrape>(), Ok(Scrape::Cid));
        assert!("both".parse::<Scrape>().is_err());
    }
}
