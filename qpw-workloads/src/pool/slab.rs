//! The buffers of one pool, their owner flags and the pool's counters.

use std::fmt;

use qpw_core::sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering, UnsafeCell};

use super::buffer_pool::{Buffer, PoolStats};
use super::design::Design;
use super::error::PoolError;

/// The buffers of one pool, handed out as [`Buffer`] tokens.
pub(super) struct Slab {
    pub(super) id: u64,
    pub(super) size: usize,
    pub(super) data: Box<[UnsafeCell<Vec<u8>>]>,
    pub(super) owned: Box<[AtomicBool]>,
    pub(super) next: AtomicUsize,
    pub(super) gets: AtomicU64,
    pub(super) puts: AtomicU64,
    pub(super) in_use: AtomicU64,
    pub(super) max_in_use: AtomicU64,
    pub(super) violations: AtomicU64,
    pub(super) exhausted: AtomicU64,
    pub(super) contention: AtomicU64,
    pub(super) percpu_waits: AtomicU64,
    pub(super) cas_retries: AtomicU64,
    pub(super) local_hits: AtomicU64,
    pub(super) remote_returns: AtomicU64,
}

// SAFETY: a buffer's bytes are reached only through `with_bytes`, which needs `&mut Buffer`,
// and a `Buffer` token for an id exists at most once (the slab mints each id once, pools move
// tokens, never copy them), so the bytes are never shared between threads.
unsafe impl Sync for Slab {}
// SAFETY: the bytes are plain `Vec<u8>`s, which may move between threads.
unsafe impl Send for Slab {}

impl fmt::Debug for Slab {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slab")
            .field("size", &self.size)
            .field("capacity", &self.data.len())
            .field("allocated", &self.allocated())
            .finish_non_exhaustive()
    }
}

fn next_pool_id() -> u64 {
    static NEXT: qpw_core::sync::signal_safe::AtomicU64 =
        qpw_core::sync::signal_safe::AtomicU64::new(1);
    NEXT.fetch_add(1, qpw_core::sync::signal_safe::Ordering::Relaxed)
}

impl Slab {
    pub(super) fn new(size: usize, capacity: usize) -> Self {
        Self {
            id: next_pool_id(),
            size,
            data: (0..capacity).map(|_| UnsafeCell::new(Vec::new())).collect(),
            owned: (0..capacity).map(|_| AtomicBool::new(false)).collect(),
            next: AtomicUsize::new(0),
            gets: AtomicU64::new(0),
            puts: AtomicU64::new(0),
            in_use: AtomicU64::new(0),
            max_in_use: AtomicU64::new(0),
            violations: AtomicU64::new(0),
            exhausted: AtomicU64::new(0),
            contention: AtomicU64::new(0),
            percpu_waits: AtomicU64::new(0),
            cas_retries: AtomicU64::new(0),
            local_hits: AtomicU64::new(0),
            remote_returns: AtomicU64::new(0),
        }
    }

    pub(super) fn allocated(&self) -> usize {
        self.next.load(Ordering::Relaxed).min(self.data.len())
    }

    /// A new buffer (`kmalloc`), or `None` at capacity.
    pub(super) fn alloc(&self) -> Option<u32> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if id >= self.data.len() {
            return None;
        }
        let ptr = self.data[id].get_mut();
        // SAFETY: `id` was just minted by the `fetch_add` above, so no token, list or other
        // thread knows it yet: this is the only access.
        unsafe { ptr.deref() }.resize(self.size, 0);
        Some(id as u32)
    }

    /// Hands `id` out as a token.
    pub(super) fn take(&self, id: u32) -> Buffer {
        if self.owned[id as usize].swap(true, Ordering::Acquire) {
            self.violations.fetch_add(1, Ordering::Relaxed);
        }
        self.gets.fetch_add(1, Ordering::Relaxed);
        let now = self.in_use.fetch_add(1, Ordering::Relaxed) + 1;
        self.max_in_use.fetch_max(now, Ordering::Relaxed);
        Buffer { id, pool: self.id }
    }

    /// Takes a token back; its id goes to a list.
    pub(super) fn give(&self, buffer: Buffer) -> Result<u32, PoolError> {
        if buffer.pool != self.id || buffer.id as usize >= self.data.len() {
            return Err(PoolError::ForeignBuffer { id: buffer.id });
        }
        if !self.owned[buffer.id as usize].swap(false, Ordering::Release) {
            self.violations.fetch_add(1, Ordering::Relaxed);
        }
        self.puts.fetch_add(1, Ordering::Relaxed);
        self.in_use.fetch_sub(1, Ordering::Relaxed);
        Ok(buffer.id)
    }

    pub(super) fn with_bytes(
        &self,
        buffer: &mut Buffer,
        f: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), PoolError> {
        if buffer.pool != self.id || buffer.id as usize >= self.data.len() {
            return Err(PoolError::ForeignBuffer { id: buffer.id });
        }
        let ptr = self.data[buffer.id as usize].get_mut();
        // SAFETY: the token is unique for its id and mutably borrowed for this call, so no
        // other access to these bytes exists until `f` returns.
        f(unsafe { ptr.deref() });
        Ok(())
    }

    pub(super) fn stats(&self, design: Design) -> PoolStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PoolStats {
            design,
            gets: l(&self.gets),
            puts: l(&self.puts),
            exhausted: l(&self.exhausted),
            lock_contention: l(&self.contention),
            percpu_lock_waits: l(&self.percpu_waits),
            cas_retries: l(&self.cas_retries),
            local_hits: l(&self.local_hits),
            remote_returns: l(&self.remote_returns),
            in_use: l(&self.in_use),
            max_in_use: l(&self.max_in_use),
            allocated: self.allocated() as u64,
            capacity: self.data.len() as u64,
            buffer_size: self.size as u64,
            violations: l(&self.violations),
        }
    }

    /// Every allocated id exactly once in `places`, and none owned.
    pub(super) fn check(
        &self,
        places: impl IntoIterator<Item = (String, Vec<u32>)>,
    ) -> Result<(), String> {
        let allocated = self.allocated();
        let mut seen: Vec<Option<String>> = vec![None; allocated];
        for (place, ids) in places {
            for id in ids {
                let Some(slot) = seen.get_mut(id as usize) else {
                    return Err(format!("{place} holds buffer {id}, never allocated"));
                };
                if let Some(first) = slot {
                    return Err(format!("buffer {id} is both in {first} and in {place}"));
                }
                *slot = Some(place.clone());
            }
        }
        if let Some(id) = seen.iter().position(Option::is_none) {
            let owned = self.owned[id].load(Ordering::Relaxed);
            return Err(format!(
                "buffer {id} is lost: in no list ({})",
                if owned {
                    "still handed out"
                } else {
                    "and not handed out"
                }
            ));
        }
        let violations = self.violations.load(Ordering::Relaxed);
        if violations != 0 {
            return Err(format!("{violations} double hand-outs or double returns"));
        }
        Ok(())
    }
}
