//! Design 1: one global list under one spinlock (commit df323337e507).

use std::fmt;

use super::buffer_pool::{Buffer, BufferPool, PoolStats};
use super::counters::Counter;
use super::design::Design;
use super::error::{check, PoolError};
use super::slab::Slab;
use super::spinlock::{SpinGuard, SpinLock};

/// `RESERVE_COUNT`: buffers the global list keeps back (security/apparmor/lsm.c).
pub const RESERVE_COUNT: usize = 2;

/// The global list and its count (`aa_global_buffers`, `buffer_count`).
#[derive(Debug, Default)]
pub(super) struct GlobalList {
    pub(super) free: Vec<u32>,
}

/// Design 1: one global list under one spinlock (df323337e507).
pub struct GlobalPool {
    pub(super) slab: Slab,
    pub(super) list: SpinLock<GlobalList>,
}

impl fmt::Debug for GlobalPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GlobalPool")
            .field("slab", &self.slab)
            .finish_non_exhaustive()
    }
}

impl GlobalPool {
    /// A pool of buffers of `size` bytes, allocating at most `capacity` of them.
    pub fn new(size: usize, capacity: usize) -> Result<Self, PoolError> {
        check("buffer size", size, 1, 1 << 20)?;
        check("capacity", capacity, 1, 1 << 20)?;
        Ok(Self {
            slab: Slab::new(size, capacity),
            list: SpinLock::new(GlobalList::default()),
        })
    }

    /// The body of `aa_get_buffer` once `aa_buffers_lock` is held.
    pub(super) fn get_locked(&self, mut list: SpinGuard<'_, GlobalList>) -> Option<Buffer> {
        if list.free.len() > RESERVE_COUNT {
            let id = list.free.pop()?;
            drop(list);
            return Some(self.slab.take(id));
        }
        drop(list);
        // Keep the reserve: allocate a new buffer (kmalloc, outside the lock).
        if let Some(id) = self.slab.alloc() {
            return Some(self.slab.take(id));
        }
        // At capacity: dip into the reserve (the patch's `try_again` path).
        let id = self
            .list
            .lock_counted(|| self.slab.count(Counter::Contention))
            .free
            .pop();
        match id {
            Some(id) => Some(self.slab.take(id)),
            None => {
                self.slab.count(Counter::Exhausted);
                None
            }
        }
    }
}

impl BufferPool for GlobalPool {
    fn design(&self) -> Design {
        Design::GlobalLock
    }

    fn get(&self) -> Result<Option<Buffer>, PoolError> {
        let list = self
            .list
            .lock_counted(|| self.slab.count(Counter::Contention));
        Ok(self.get_locked(list))
    }

    fn put(&self, buffer: Buffer) -> Result<(), PoolError> {
        let id = self.slab.give(buffer)?;
        self.list
            .lock_counted(|| self.slab.count(Counter::Contention))
            .free
            .push(id);
        Ok(())
    }

    fn stats(&self) -> PoolStats {
        self.slab.stats(Design::GlobalLock)
    }

    fn check_conservation(&self) -> Result<(), String> {
        let free = match self.list.try_lock() {
            Some(l) => l.free.clone(),
            None => return Err("the global lock is held: a get or put is in flight".into()),
        };
        self.slab.check([("the global list".to_string(), free)])
    }

    fn with_bytes(
        &self,
        buffer: &mut Buffer,
        f: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), PoolError> {
        self.slab.with_bytes(buffer, f)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use qpw_core::sync::{thread, AtomicBool, Ordering};

    use super::*;

    #[test]
    fn a_get_or_put_that_finds_the_lock_held_counts_one_contention() {
        let pool = GlobalPool::new(64, 8).unwrap();
        // Uncontended: no count.
        let b = pool.get().unwrap().unwrap();
        pool.put(b).unwrap();
        assert_eq!(pool.stats().lock_contention, 0);
        // Another thread holds aa_buffers_lock: one failed trylock each, then they wait.
        let held = pool.list.lock();
        let started = AtomicBool::new(false);
        thread::scope(|s| {
            let other = s.spawn(|| {
                started.store(true, Ordering::Release);
                let b = pool.get().unwrap().unwrap();
                pool.put(b)
            });
            while !started.load(Ordering::Acquire) {
                thread::yield_now();
            }
            // The get has failed its trylock once it is counted: keep the lock until then (or
            // for long enough that a get which does not count has surely tried).
            let since = std::time::Instant::now();
            while pool.stats().lock_contention == 0 && since.elapsed().as_secs() < 5 {
                thread::yield_now();
            }
            drop(held);
            other.join().unwrap().unwrap();
        });
        let s = pool.stats();
        assert_eq!(
            s.lock_contention, 1,
            "the get's failed trylock, not the free put's"
        );
        assert_eq!((s.gets, s.puts), (2, 2));
        pool.check_conservation().unwrap();
    }
}
