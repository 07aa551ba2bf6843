//! The hackbench load (`perf bench sched messaging`, threads mode), with AppArmor's hook on
//! every send and every receive.
//!
//! `groups` groups of `fds` senders and `fds` receivers; each receiver has its own pipe (or
//! socketpair), and every sender of a group writes `loops` messages of [`HACKBENCH_DATASIZE`]
//! bytes to every receiver of the group, which reads them all: the kernel's part of each
//! message is a `write` and a `read`, with the wake-ups that blocking on a full or empty pipe
//! brings. As under AppArmor, each of those system calls runs the file-permission hook first
//! ([`hook::file_permission`](super::hook)), which gets a pool buffer, uses it and puts it back
//! on the same CPU: the pool sees two get/put pairs per message, each within one hook on one
//! CPU, and never a buffer held across a message's flight (an earlier version of this load
//! carried each buffer from the sender's get to the receiver's put through a
//! mutex-and-condvar mailbox, whose futex wake-up per message cost far more than the pool).
//!
//! The threads are bound round-robin to the instance's CPUs, both roles spread over every CPU,
//! so that each CPU's pool or cache serves senders and receivers alike.

use std::time::Duration;

#[cfg(not(loom))]
use std::io::{Read, Write};

#[cfg(not(loom))]
use qpw_core::Qpw;

#[cfg(not(loom))]
use super::bound_threads::run_bound;
#[cfg(not(loom))]
use super::buffer_pool::BufferPool;
use super::buffer_pool::PoolStats;
use super::design::Design;
#[cfg(not(loom))]
use super::error::{check, PoolError};
#[cfg(not(loom))]
use super::hook::file_permission;
#[cfg(not(loom))]
use super::transport::Channel;

/// hackbench's message size (`DATASIZE`, bytes).
pub const HACKBENCH_DATASIZE: usize = 100;

/// What the messages travel through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Transport {
    /// A pipe per receiver (`perf bench sched messaging --pipe`, `hackbench -p`): seed 004's
    /// profile shows `pipe_read` and `pipe_write`.
    #[default]
    Pipe,
    /// A `AF_UNIX` `SOCK_STREAM` socketpair per receiver (hackbench's default).
    Socketpair,
}

impl Transport {
    /// The transport's name as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Pipe => "pipe",
            Transport::Socketpair => "socketpair",
        }
    }
}

/// One hackbench run's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HackbenchConfig {
    /// Groups (1-64; hackbench's `-g`).
    pub groups: usize,
    /// Senders and receivers per group (1-40; hackbench's `-f`, default 20).
    pub fds: usize,
    /// Messages per sender per receiver (1-100000; hackbench's `-l`).
    pub loops: usize,
    /// Bytes per message (1-4096; [`HACKBENCH_DATASIZE`]).
    pub datasize: usize,
    /// Pipes or socketpairs.
    pub transport: Transport,
}

impl Default for HackbenchConfig {
    fn default() -> Self {
        Self {
            groups: 2,
            fds: 4,
            loops: 100,
            datasize: HACKBENCH_DATASIZE,
            transport: Transport::Pipe,
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

    /// Hook runs in all: one per message sent and one per message received.
    pub fn hooks(&self) -> u64 {
        2 * self.messages()
    }
}

/// What one hackbench run did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HackbenchReport {
    /// The pool's design.
    pub design: Design,
    /// The transport.
    pub transport: Transport,
    /// Sender and receiver threads.
    pub threads: usize,
    /// Messages delivered.
    pub messages: u64,
    /// Hook runs (each a get, a use and a put of one buffer on one CPU).
    pub hooks: u64,
    /// Hook runs whose buffer did not read back what the hook wrote (a buffer handed out to
    /// two hooks at once).
    pub corrupt: u64,
    /// Wall time from the start barrier to the last thread's end.
    pub elapsed: Duration,
    /// Messages per second.
    pub messages_per_sec: f64,
    /// The pool's counters at the end.
    pub stats: PoolStats,
}

/// What one thread holds: a sender its own write ends of every channel of its group, a
/// receiver the read end of its own channel (index `k` within the group).
#[cfg(not(loom))]
#[derive(Debug)]
enum Ends {
    Sender(Vec<std::fs::File>),
    Receiver { k: usize, pipe: std::fs::File },
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
    check("datasize", config.datasize, 1, 4096)?;
    let io = |what: &'static str| {
        move |e: std::io::Error| PoolError::Thread {
            what,
            reason: e.to_string(),
        }
    };
    let cpus: Vec<usize> = qpw.cpus().iter().collect();
    let mut channels = (0..config.groups * config.fds)
        .map(|_| Channel::new(config.transport))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io("pipe or socketpair"))?;
    let threads = config.threads();
    // Thread t: group t / (2 fds); even t send, odd t receive; sender k and receiver k on
    // neighbouring CPUs, as the scheduler spreads hackbench's tasks. Every sender takes its
    // own write ends first, then the channels' own are closed.
    let mut placement = Vec::with_capacity(threads);
    for t in 0..threads {
        let (first, k) = ((t / (2 * config.fds)) * config.fds, (t / 2) % config.fds);
        let ends = if t % 2 == 0 {
            let group = &channels[first..first + config.fds];
            Ends::Sender(
                group
                    .iter()
                    .map(Channel::writer)
                    .collect::<Result<_, _>>()
                    .map_err(io("dup"))?,
            )
        } else {
            let pipe = channels[first + k].take_reader().map_err(io("read end"))?;
            Ends::Receiver { k, pipe }
        };
        placement.push((cpus[(t + t / 2) % cpus.len()], first, ends));
    }
    channels.iter_mut().for_each(Channel::close_writer);

    let per_receiver = config.fds * config.loops;
    let channels = &channels;
    let work = placement
        .into_iter()
        .map(|(cpu, first, ends)| (cpu, (first, ends)))
        .collect();
    let (elapsed, corrupt) = run_bound(qpw, "hackbench", work, |(first, ends)| {
        let message = [0x5a_u8; 4096];
        let message = &message[..config.datasize];
        let mut damaged = 0;
        match &ends {
            Ends::Sender(out) => {
                for _ in 0..config.loops {
                    for (r, mut pipe) in out.iter().enumerate() {
                        // write(2): the file-permission hook, then the write.
                        let name = &channels[first + r].writer_name;
                        damaged += u64::from(!file_permission(pool, name)?);
                        pipe.write_all(message).map_err(io("write"))?;
                    }
                }
            }
            Ends::Receiver { k, pipe } => {
                let name = &channels[first + *k].reader_name;
                let mut pipe = pipe;
                let mut into = [0u8; 4096];
                for _ in 0..per_receiver {
                    // read(2): the file-permission hook, then the read.
                    damaged += u64::from(!file_permission(pool, name)?);
                    pipe.read_exact(&mut into[..config.datasize])
                        .map_err(io("read"))?;
                }
            }
        }
        // The thread's ends close with it, done or failed: a receiver sees end-of-file once
        // every sender of its group is gone, a sender `EPIPE` once its receiver is.
        drop(ends);
        Ok(damaged)
    })?;

    let messages = config.messages();
    Ok(HackbenchReport {
        design: pool.design(),
        transport: config.transport,
        threads,
        messages,
        hooks: config.hooks(),
        corrupt,
        elapsed,
        messages_per_sec: messages as f64 / elapsed.as_secs_f64().max(1e-9),
        stats: pool.stats(),
    })
}
