//! The load generator: requests at a fixed rate, each reply matched to its request by sequence
//! number, and the round trips it saw.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use qpw_core::Qpw;
use serde::Serialize;

use crate::latency::{histogram, now_ns};
use crate::request::{grow_receive_buffer, parse_request, REQUEST_BYTES};

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
