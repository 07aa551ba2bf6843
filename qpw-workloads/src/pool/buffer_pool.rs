//! The one API of the three designs: the [`BufferPool`] trait, the [`Buffer`] token it hands
//! out, and the [`PoolStats`] it keeps.

use std::fmt;

use super::design::Design;
use super::error::PoolError;

/// A buffer handed out by a pool: a unique token (not `Clone`), whose bytes are reached with
/// [`BufferPool::with_bytes`]. Give it back with [`BufferPool::put`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a buffer that is not put back is lost to the pool"]
pub struct Buffer {
    pub(super) id: u32,
    pub(super) pool: u64,
}

impl Buffer {
    /// The buffer's id in its pool.
    pub fn id(&self) -> u32 {
        self.id
    }
}

/// A pool's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// The design.
    pub design: Design,
    /// Buffers handed out.
    pub gets: u64,
    /// Buffers given back.
    pub puts: u64,
    /// Gets that found no buffer (a bounded pool with everything in use).
    pub exhausted: u64,
    /// Failed trylocks on the global lock (`aa_buffers_lock`).
    pub lock_contention: u64,
    /// Waits for a per-CPU lock held by another thread of the same CPU (userspace has no
    /// `preempt_disable`, so threads sharing a CPU contend for its cache).
    pub percpu_lock_waits: u64,
    /// Failed compare-and-swaps pushing onto a return stack (lock-free retries).
    pub cas_retries: u64,
    /// Gets served from a per-CPU cache or pool without the global lock.
    pub local_hits: u64,
    /// Puts that went to another CPU's return stack.
    pub remote_returns: u64,
    /// Buffers handed out and not given back now.
    pub in_use: u64,
    /// Buffers allocated so far (the memory bound).
    pub allocated: u64,
    /// The most buffers the pool may ever allocate.
    pub capacity: u64,
    /// Bytes per buffer (`allocated x buffer_size` is the pool's memory).
    pub buffer_size: u64,
    /// Buffers handed out while already out, or returned while already in (must be 0).
    pub violations: u64,
}

/// The one API of the three designs (`aa_get_buffer` / `aa_put_buffer`). The calling thread
/// must be on a CPU of the pool's instance (bound with
/// [`Qpw::bind_current`](qpw_core::Qpw::bind_current)).
pub trait BufferPool: Send + Sync + fmt::Debug {
    /// The design.
    fn design(&self) -> Design;
    /// Takes a buffer (`aa_get_buffer`); `Ok(None)` when the pool is at its capacity with
    /// every buffer in use (try again after a put).
    fn get(&self) -> Result<Option<Buffer>, PoolError>;
    /// Gives a buffer back (`aa_put_buffer`).
    fn put(&self, buffer: Buffer) -> Result<(), PoolError>;
    /// The counters.
    fn stats(&self) -> PoolStats;
    /// Checks that every allocated buffer is in exactly one place and none is in use; call
    /// when no get or put is in flight.
    fn check_conservation(&self) -> Result<(), String>;
    /// Runs `f` on `buffer`'s bytes.
    fn with_bytes(
        &self,
        buffer: &mut Buffer,
        f: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), PoolError>;
}
