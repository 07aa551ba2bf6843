//! The load generator: requests at a fixed rate, each reply matched to its request by sequence
//! number, and the round trips it saw.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use qpw_core::Qpw;
use serde::Serialize;

use crate::latency::{histogram, now_ns, Percentiles};
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
    let progress = Arc::new(Progress::default());
    let bind = cpu.map(|(c, q)| (c, q.clone()));
    let receiver = start_receiver(rx, progress.clone(), bind.clone())?;
    let _bound = bind.as_ref().map(|(c, q)| q.bind_current(*c));
    let sent = send(&sock, targets, rate, duration, &progress.issued);
    wait_for_stragglers(&progress.matched, sent);
    progress.done.store(true, Ordering::Release);
    let replies = receiver
        .join()
        .map_err(|_| anyhow!("the load's receiver panicked"))?;
    let round_trip = Percentiles::of(&replies.round_trips);
    Ok(LoadReport {
        sent,
        received: progress.matched.load(Ordering::Acquire),
        duplicates: replies.duplicates,
        stray: replies.stray,
        p50_us: round_trip.p50_us,
        p99_us: round_trip.p99_us,
        p999_us: round_trip.p999_us,
        max_us: round_trip.max_us,
    })
}

/// What the sender and the receiver share.
#[derive(Debug, Default)]
struct Progress {
    /// Set when the sender has stopped waiting for replies: the receiver stops.
    done: AtomicBool,
    /// Sequence numbers handed out so far (set before each send, so that a reply can never
    /// come back for a number not yet counted).
    issued: AtomicU64,
    /// Replies matched so far.
    matched: AtomicU64,
}

/// Sends a request every `1 / rate` seconds for `duration`, to `targets` in turn, each with
/// its sequence number and send time; a request that falls behind goes at once. Returns how
/// many were sent.
fn send(
    sock: &UdpSocket,
    targets: &[SocketAddr],
    rate: f64,
    duration: Duration,
    issued: &AtomicU64,
) -> u64 {
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
    sent
}

/// Waits for the replies still due, for as long as they keep coming: until `matched` reaches
/// `sent`, or [`STRAGGLERS`] pass without a new one.
fn wait_for_stragglers(matched: &AtomicU64, sent: u64) {
    let (mut last, mut last_change) = (matched.load(Ordering::Acquire), Instant::now());
    while last < sent && last_change.elapsed() < STRAGGLERS {
        std::thread::sleep(Duration::from_millis(5));
        let now = matched.load(Ordering::Acquire);
        if now != last {
            (last, last_change) = (now, Instant::now());
        }
    }
}

/// Starts the receiver, named `load-rx` and bound like the sender: it reads the replies on
/// `rx`, matches each to its request, and counts each first reply in `progress.matched`,
/// until `progress.done`.
fn start_receiver(
    rx: UdpSocket,
    progress: Arc<Progress>,
    bind: Option<(usize, Qpw)>,
) -> Result<JoinHandle<Replies>> {
    Ok(std::thread::Builder::new()
        .name("load-rx".into())
        .spawn(move || {
            let _bound = bind.as_ref().map(|(c, q)| q.bind_current(*c));
            let mut replies = Replies::new();
            let mut buf = [0u8; 64];
            while !progress.done.load(Ordering::Acquire) {
                let Ok(n) = rx.recv(&mut buf) else { continue };
                let now = now_ns();
                if replies.record(&buf[..n], now, &progress.issued) {
                    progress.matched.fetch_add(1, Ordering::Release);
                }
            }
            replies
        })?)
}

/// The receiver's record of the replies, each matched to its request by sequence number.
#[derive(Debug)]
struct Replies {
    /// The round trip of each request's first reply, in nanoseconds.
    round_trips: Histogram<u64>,
    /// Whether each sequence number has had its reply.
    replied: Vec<bool>,
    /// Replies to a request that had already had one.
    duplicates: u64,
    /// Datagrams that were not a reply to a request sent.
    stray: u64,
}

impl Replies {
    /// No reply yet.
    fn new() -> Self {
        Self {
            round_trips: histogram(),
            replied: Vec::new(),
            duplicates: 0,
            stray: 0,
        }
    }

    /// Records a datagram received at `now` (nanoseconds, [`now_ns`]): true if it is the first
    /// reply to one of the `issued` requests, false if it is a duplicate or stray.
    fn record(&mut self, bytes: &[u8], now: u64, issued: &AtomicU64) -> bool {
        // Is it a reply to a request of ours? The bytes come from the network: check the
        // length and the sequence number before using them.
        let Some((seq, sent_at)) = parse_request(bytes) else {
            self.stray += 1;
            return false;
        };
        if seq >= issued.load(Ordering::Acquire) {
            self.stray += 1;
            return false;
        }
        let idx = seq as usize;
        if self.replied.len() <= idx {
            self.replied.resize(idx + 1, false);
        }
        // Yes: the first reply to it counts, a second one is a duplicate.
        if std::mem::replace(&mut self.replied[idx], true) {
            self.duplicates += 1;
            return false;
        }
        self.round_trips
            .saturating_record(now.saturating_sub(sent_at).max(1));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's bytes, as `send` writes them.
    fn request(seq: u64, sent_at: u64) -> [u8; REQUEST_BYTES] {
        let mut req = [0u8; REQUEST_BYTES];
        req[..8].copy_from_slice(&seq.to_le_bytes());
        req[8..].copy_from_slice(&sent_at.to_le_bytes());
        req
    }

    #[test]
    fn a_reply_counts_once_and_only_for_a_request_sent() {
        let issued = AtomicU64::new(3);
        let mut replies = Replies::new();
        assert!(replies.record(&request(2, 1_000), 3_000, &issued));
        assert!(
            !replies.record(&request(2, 1_000), 4_000, &issued),
            "a duplicate"
        );
        assert!(
            !replies.record(&request(3, 1_000), 4_000, &issued),
            "not sent yet"
        );
        assert!(
            !replies.record(&request(0, 1_000)[..8], 4_000, &issued),
            "too short"
        );
        assert!(replies.record(&request(0, 1_000), 5_000, &issued));
        assert_eq!((replies.duplicates, replies.stray), (1, 2));
        assert_eq!(replies.round_trips.len(), 2);
        // The longest round trip is the second reply's (sent at 1000, back at 5000), to the
        // histogram's precision.
        let longest = replies.round_trips.max();
        assert!(replies.round_trips.equivalent(longest, 4_000), "{longest}");
    }
}
