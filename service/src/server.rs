//! The serving threads: one per serving CPU, bound to it, answering each request with its
//! echo and keeping the CPU's count, service times and reply buffers in the per-CPU state;
//! their start, and the wait until every one is bound.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use qpw_core::{CpuSet, PerCid, PerCpu, Qpw};

use crate::config::{Poll, Scrape};
use crate::latency::{histogram, now_ns};
use crate::request::{grow_receive_buffer, parse_request};

/// One serving CPU's state.
#[derive(Debug)]
pub(crate) struct CpuState {
    /// Requests served since the last scrape.
    pub(crate) requests: u64,
    /// Service time of each, in nanoseconds, since the last scrape.
    pub(crate) service_ns: Histogram<u64>,
    /// Reply buffers to reuse.
    pub(crate) free: Vec<Vec<u8>>,
}

/// One concurrency id's counts and service times (`--scrape cid`).
#[derive(Debug)]
pub(crate) struct IdStats {
    /// Requests served since the last scrape.
    pub(crate) requests: u64,
    /// Service time of each, in nanoseconds, since the last scrape.
    pub(crate) service_ns: Histogram<u64>,
}

/// A serving thread: its CPU, its address, its thread id (for its context switches), and
/// what it served.
pub(crate) struct Server {
    pub(crate) cpu: usize,
    pub(crate) addr: SocketAddr,
    pub(crate) tid: Arc<AtomicI32>,
    pub(crate) handle: JoinHandle<Result<(u64, Histogram<u64>)>>,
}

/// The serving CPUs' state, empty; and with `--scrape cid`, the counts and service times per
/// concurrency id, empty too.
pub(crate) fn new_state(qpw: &Qpw, scrape: Scrape) -> (PerCpu<CpuState>, Option<PerCid<IdStats>>) {
    let state = qpw.per_cpu(|_| CpuState {
        requests: 0,
        service_ns: histogram(),
        free: Vec::new(),
    });
    let by_id = (scrape == Scrape::Cid).then(|| {
        qpw.per_cid(|_| IdStats {
            requests: 0,
            service_ns: histogram(),
        })
    });
    (state, by_id)
}

/// Starts one serving thread per serving CPU, named `serve/CPU`, each on its own UDP socket
/// on the loopback address, waiting for requests as `poll` says. Returns at once: each thread
/// binds itself to its CPU ([`wait_until_bound`] waits for that).
pub(crate) fn start_servers(
    qpw: &Qpw,
    serving: &CpuSet,
    poll: Poll,
    state: &PerCpu<CpuState>,
    by_id: Option<&PerCid<IdStats>>,
    stop: &Arc<AtomicBool>,
) -> Result<Vec<Server>> {
    let mut servers = Vec::new();
    for cpu in serving.iter() {
        let sock = UdpSocket::bind("127.0.0.1:0").context("cannot bind a UDP socket")?;
        grow_receive_buffer(&sock);
        match poll {
            Poll::Busy => sock.set_nonblocking(true)?,
            Poll::Block => sock.set_read_timeout(Some(Duration::from_millis(20)))?,
        }
        let addr = sock.local_addr()?;
        let tid = Arc::new(AtomicI32::new(0));
        let (qpw2, state, stop, tid2) = (qpw.clone(), state.clone(), stop.clone(), tid.clone());
        let by_id = by_id.cloned();
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
    Ok(servers)
}

/// Waits for every server to be bound to its CPU and to know its thread id, and gives them
/// back. If one stops first, or they are not all bound within 5 s, it stops them all and
/// returns the first one's error, or else "a serving thread did not start".
pub(crate) fn wait_until_bound(servers: Vec<Server>, stop: &AtomicBool) -> Result<Vec<Server>> {
    let t0 = Instant::now();
    while servers.iter().any(|s| s.tid.load(Ordering::Acquire) == 0) {
        if t0.elapsed() > Duration::from_secs(5) || servers.iter().any(|s| s.handle.is_finished()) {
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
    Ok(servers)
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

/// A serving thread: bound to `cpu`, answers each request with its echo, keeping its CPU's
/// count, service time and reply buffers in the per-CPU state. Returns how many it served,
/// and each request's latency at the server (send to reply,
/// [`ServiceReport::at_server`](crate::ServiceReport::at_server)).
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
