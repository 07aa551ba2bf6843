//! The buffers of one pool, their owner flags and the pool's counters.
//!
//! Each buffer's owner flag sits with its bytes in a slot of its own cache lines: a packed
//! array of flags would make two CPUs that use two different buffers share a line.

use std::fmt;

use qpw_core::sync::{AtomicBool, AtomicUsize, Ordering, UnsafeCell};

use super::buffer_pool::{Buffer, PoolStats};
use super::counters::{Counter, Counters};
use super::design::Design;
use super::error::PoolError;

/// 128 bytes of a buffer, on their own cache-line pair: a buffer is whole lines, so that the
/// hook's writes at its end never share a line with the allocation after it (which false
/// sharing would charge to whichever design happened to place the two side by side).
#[repr(C, align(128))]
#[derive(Clone, Copy)]
struct Line([u8; LINE]);

/// The bytes of a [`Line`].
const LINE: usize = 128;

/// One buffer: its owner flag and its bytes, alone on their cache lines, so that two CPUs
/// using two buffers never share a line.
#[repr(align(128))]
struct Slot {
    owned: AtomicBool,
    bytes: UnsafeCell<Vec<Line>>,
}

/// The buffers of one pool, handed out as [`Buffer`] tokens, and the pool's counters.
pub(super) struct Slab {
    id: u64,
    size: usize,
    slots: Box<[Slot]>,
    next: AtomicUsize,
    pub(super) counters: Counters,
}

// SAFETY: a buffer's bytes are reached only through `with_bytes`, which needs `&mut Buffer`,
// and a `Buffer` token for an id exists at most once (the slab mints each id once, pools move
// tokens, never copy them), so the bytes are never shared between threads.
unsafe impl Sync for Slab {}
// SAFETY: the bytes are plain `Vec<Line>`s of bytes, which may move between threads.
unsafe impl Send for Slab {}

impl fmt::Debug for Slab {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slab")
            .field("size", &self.size)
            .field("capacity", &self.slots.len())
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
            slots: (0..capacity)
                .map(|_| Slot {
                    owned: AtomicBool::new(false),
                    bytes: UnsafeCell::new(Vec::new()),
                })
                .collect(),
            next: AtomicUsize::new(0),
            counters: Counters::new(),
        }
    }

    pub(super) fn allocated(&self) -> usize {
        self.next.load(Ordering::Relaxed).min(self.slots.len())
    }

    /// Counts one `counter` on the calling thread's CPU.
    #[inline]
    pub(super) fn count(&self, counter: Counter) {
        self.counters.add(counter);
    }

    /// A new buffer (`kmalloc`), or `None` at capacity.
    pub(super) fn alloc(&self) -> Option<u32> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = self.slots.get(id)?;
        let ptr = slot.bytes.get_mut();
        // SAFETY: `id` was just minted by the `fetch_add` above, so no token, list or other
        // thread knows it yet: this is the only access.
        unsafe { ptr.deref() }.resize(self.size.div_ceil(LINE), Line([0; LINE]));
        Some(id as u32)
    }

    /// Hands `id` out as a token.
    #[inline]
    pub(super) fn take(&self, id: u32) -> Buffer {
        if self.slots[id as usize].owned.swap(true, Ordering::Acquire) {
            self.count(Counter::Violations);
        }
        self.count(Counter::Gets);
        Buffer { id, pool: self.id }
    }

    /// Takes a token back; its id goes to a list.
    #[inline]
    pub(super) fn give(&self, buffer: Buffer) -> Result<u32, PoolError> {
        let Some(slot) = self
            .slots
            .get(buffer.id as usize)
            .filter(|_| buffer.pool == self.id)
        else {
            return Err(PoolError::ForeignBuffer { id: buffer.id });
        };
        if !slot.owned.swap(false, Ordering::Release) {
            self.count(Counter::Violations);
        }
        self.count(Counter::Puts);
        Ok(buffer.id)
    }

    pub(super) fn with_bytes(
        &self,
        buffer: &mut Buffer,
        f: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), PoolError> {
        let Some(slot) = self
            .slots
            .get(buffer.id as usize)
            .filter(|_| buffer.pool == self.id)
        else {
            return Err(PoolError::ForeignBuffer { id: buffer.id });
        };
        let ptr = slot.bytes.get_mut();
        // SAFETY: the token is unique for its id and mutably borrowed for this call, so no
        // other access to these bytes exists until `f` returns.
        let lines = unsafe { ptr.deref() };
        debug_assert!(lines.len() * LINE >= self.size);
        // SAFETY: (1) `Line` is `repr(C)` around `[u8; 128]` and 128 bytes in size, so the
        // vector's lines are `lines.len() * 128` initialised, contiguous bytes, of which the
        // first `size` are this buffer's (`alloc` made `size.div_ceil(128)` lines); (2) `u8`
        // needs no alignment; (3) the slice borrows `lines` mutably and lives no longer.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u8>(), self.size) };
        f(bytes);
        Ok(())
    }

    pub(super) fn stats(&self, design: Design) -> PoolStats {
        let c = |counter| self.counters.total(counter);
        let (gets, puts) = (c(Counter::Gets), c(Counter::Puts));
        PoolStats {
            design,
            gets,
            puts,
            exhausted: c(Counter::Exhausted),
            lock_contention: c(Counter::Contention),
            percpu_lock_waits: c(Counter::PercpuWaits),
            cas_retries: c(Counter::CasRetries),
            local_hits: c(Counter::LocalHits),
            remote_returns: c(Counter::RemoteReturns),
            in_use: gets.saturating_sub(puts),
            allocated: self.allocated() as u64,
            capacity: self.slots.len() as u64,
            buffer_size: self.size as u64,
            violations: c(Counter::Violations),
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
            let owned = self.slots[id].owned.load(Ordering::Relaxed);
            return Err(format!(
                "buffer {id} is lost: in no list ({})",
                if owned {
                    "still handed out"
                } else {
                    "and not handed out"
                }
            ));
        }
        let violations = self.counters.total(Counter::Violations);
        if violations != 0 {
            return Err(format!("{violations} double hand-outs or double returns"));
        }
        Ok(())
    }
}
