//! The hackbench-style load (`perf bench sched messaging`, threads mode).

use std::time::Duration;

#[cfg(not(loom))]
use qpw_core::sync::{
    thread, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering,
};
#[cfg(not(loom))]
use qpw_core::Qpw;

use super::buffer_pool::PoolStats;
#[cfg(not(loom))]
use super::buffer_pool::{Buffer, BufferPool};
use super::design::Design;
#[cfg(not(loom))]
use super::error::{check, PoolError};

/// hackbench's message size (`DATASIZE`, bytes).
pub const HACKBENCH_DATASIZE: usize = 100;
/// Messages a receiver's pipe holds before its senders block, as a pipe's writer blocks when
/// the pipe is full: it bounds the buffers in flight to `receivers x 32` plus one per sender.
pub const HACKBENCH_PIPE_MESSAGES: usize = 32;

/// The hackbench-style load (`perf bench sched messaging`, threads mode): `groups` groups of
/// `fds` senders and `fds` receivers; every sender sends `loops` messages to every receiver of
/// its group, and each message holds a pool buffer from the sender's get to the receiver's put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HackbenchConfig {
    /// Groups (1-64; hackbench's `-g`).
    pub groups: usize,
    /// Senders and receivers per group (1-40; hackbench's `-f`, default 20).
    pub fds: usize,
    /// Messages per sender per receiver (1-100000; hackbench's `-l`).
    pub loops: usize,
    /// Bytes written into each message's buffer (1 to the buffer size;
    /// [`HACKBENCH_DATASIZE`]).
    pub datasize: usize,
}

impl Default for HackbenchConfig {
    fn default() -> Self {
        Self {
            groups: 2,
            fds: 4,
            loops: 100,
            datasize: HACKBENCH_DATASIZE,
        }
    }
}

impl HackbenchConfig {
    /// Sender and receiver threads in all.
    pub fn threads(&self) -> usize {
        self.groups * self.fds * 2
    }

    /// Messages in all.
    pub fn messages(&self) -> u64 {
        (self.groups * self.fds * self.fds * self.loops) as u64
    }
}

/// What one hackbench run did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HackbenchReport {
    /// The pool's design.
    pub design: Design,
    /// Sender and receiver threads.
    pub threads: usize,
    /// Messages delivered.
    pub messages: u64,
    /// Messages whose bytes were not what their sender wrote (a buffer owned twice).
    pub corrupt: u64,
    /// Wall time from the start barrier to the last receiver's end.
    pub elapsed: Duration,
    /// Messages per second.
    pub messages_per_sec: f64,
    /// The pool's counters at the end.
    pub stats: PoolStats,
}

#[cfg(not(loom))]
/// One receiver's mailbox (the pipe).
#[derive(Debug, Default)]
struct Mailbox {
    queue: Mutex<std::collections::VecDeque<(u64, Buffer)>>,
    ready: Condvar,
    space: Condvar,
}

#[cfg(not(loom))]
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(not(loom))]
/// The stamp a sender writes: its id and the message's sequence number, repeated.
fn stamp(tag: u64, bytes: &mut [u8]) {
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (tag >> ((i % 8) * 8)) as u8 ^ i as u8;
    }
}

#[cfg(not(loom))]
fn stamped(tag: u64, bytes: &[u8]) -> bool {
    bytes
        .iter()
        .enumerate()
        .all(|(i, &b)| b == (tag >> ((i % 8) * 8)) as u8 ^ i as u8)
}

#[cfg(not(loom))]
/// Runs the hackbench load on `pool`, threads bound round-robin to `qpw`'s CPUs.
pub fn hackbench(
    qpw: &Qpw,
    pool: &dyn BufferPool,
    config: &HackbenchConfig,
) -> Result<HackbenchReport, PoolError> {
    check("groups", config.groups, 1, 64)?;
    check("fds", config.fds, 1, 40)?;
    check("loops", config.loops, 1, 100_000)?;
    check("datasize", config.datasize, 1, 1 << 20)?;
    let cpus: Vec<usize> = qpw.cpus().iter().collect();
    let mailboxes: Vec<Mailbox> = (0..config.groups * config.fds)
        .map(|_| Mailbox::default())
        .collect();
    let corrupt = AtomicU64::new(0);
    let start_line = AtomicUsize::new(0);
    let go = AtomicBool::new(false);
    let threads = config.threads();
    let per_receiver = config.fds * config.loops;

    let elapsed = thread::scope(|scope| -> Result<Duration, PoolError> {
        let mut handles = Vec::with_capacity(threads);
        for t in 0..threads {
            // Spread both roles over every CPU (sender k and receiver k on neighbouring
            // CPUs), as the scheduler spreads hackbench's tasks, so that each CPU both gets
            // and puts buffers.
            let cpu = cpus[(t + t / 2) % cpus.len()];
            let (mailboxes, corrupt, start_line, go) = (&mailboxes, &corrupt, &start_line, &go);
            let (group, role, k) = (t / (2 * config.fds), t % 2, (t / 2) % config.fds);
            handles.push(scope.spawn(move || -> Result<(), PoolError> {
                let _bound = qpw.bind_current(cpu)?;
                start_line.fetch_add(1, Ordering::AcqRel);
                while !go.load(Ordering::Acquire) {
                    thread::yield_now();
                }
                let first = group * config.fds;
                if role == 0 {
                    // A sender: `loops` messages to every receiver of the group.
                    let sender = (group * config.fds + k) as u64;
                    for seq in 0..config.loops as u64 {
                        for r in 0..config.fds {
                            let mut buffer = loop {
                                match pool.get()? {
                                    Some(b) => break b,
                                    // Every buffer is in flight: let a receiver run.
                                    None => thread::yield_now(),
                                }
                            };
                            let tag = sender << 32 | seq << 8 | r as u64;
                            pool.with_bytes(&mut buffer, &mut |b| {
                                let n = config.datasize.min(b.len());
                                stamp(tag, &mut b[..n])
                            })?;
                            // Write into the pipe, blocking while it is full.
                            let mailbox = &mailboxes[first + r];
                            let mut queue = lock(&mailbox.queue);
                            while queue.len() >= HACKBENCH_PIPE_MESSAGES {
                                queue =
                                    mailbox.space.wait(queue).unwrap_or_else(|e| e.into_inner());
                            }
                            queue.push_back((tag, buffer));
                            drop(queue);
                            mailbox.ready.notify_one();
                        }
                    }
                } else {
                    // A receiver: check and free every message.
                    let mailbox = &mailboxes[first + k];
                    for _ in 0..per_receiver {
                        let (tag, mut buffer) = {
                            let mut queue = lock(&mailbox.queue);
                            loop {
                                if let Some(m) = queue.pop_front() {
                                    mailbox.space.notify_one();
                                    break m;
                                }
                                queue =
                                    mailbox.ready.wait(queue).unwrap_or_else(|e| e.into_inner());
                            }
                        };
                        let mut ok = true;
                        pool.with_bytes(&mut buffer, &mut |b| {
                            let n = config.datasize.min(b.len());
                            ok = stamped(tag, &b[..n])
                        })?;
                        if !ok {
                            corrupt.fetch_add(1, Ordering::Relaxed);
                        }
                        pool.put(buffer)?;
                    }
                }
                Ok(())
            }));
        }
        while start_line.load(Ordering::Acquire) < threads {
            if handles.iter().any(|h| h.is_finished()) {
                break;
            }
            thread::yield_now();
        }
        let start = std::time::Instant::now();
        go.store(true, Ordering::Release);
        let mut first_err = None;
        for h in handles {
            let outcome = h.join().unwrap_or_else(|_| {
                Err(PoolError::Thread {
                    what: "hackbench",
                    reason: "panicked".to_string(),
                })
            });
            if let Err(e) = outcome {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(start.elapsed()),
        }
    })?;

    let messages = config.messages();
    Ok(HackbenchReport {
        design: pool.design(),
        threads,
        messages,
        corrupt: corrupt.load(Ordering::Relaxed),
        elapsed,
        messages_per_sec: messages as f64 / elapsed.as_secs_f64().max(1e-9),
        stats: pool.stats(),
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn stamps_detect_a_foreign_writer() {
        let mut bytes = [0u8; 100];
        stamp(7 << 32 | 5, &mut bytes);
        assert!(stamped(7 << 32 | 5, &bytes));
        assert!(!stamped(8 << 32 | 5, &bytes));
    }
}
