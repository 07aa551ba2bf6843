//! Design 2: the global list plus a per-CPU cache used under contention, with the adaptive
//! hold of John Johansen's 2023 patch.

use std::fmt;

use qpw_core::{PerCpu, PerCpuGuard, Qpw};

use super::buffer_pool::{Buffer, BufferPool, PoolStats};
use super::counters::Counter;
use super::design::Design;
use super::error::PoolError;
use super::global::GlobalPool;

/// `MAX_LOCAL_COUNT`: buffers a CPU's cache may hold (the 2023 patch).
pub const MAX_LOCAL_COUNT: usize = 2;
/// Added to a CPU's `contention` on each failed trylock.
pub const CONTENTION_STEP: u32 = 3;
/// The most `contention` gets (`hold` grows by at most `1 << 9` per failure).
pub const CONTENTION_MAX: u32 = 9;

/// A CPU's cache in design 2 (`struct aa_local_cache`).
#[derive(Debug, Default)]
struct LocalCache {
    contention: u32,
    hold: u32,
    head: Vec<u32>,
}

impl LocalCache {
    /// `update_contention`: after a failed trylock.
    fn update_contention(&mut self) {
        self.contention = (self.contention + CONTENTION_STEP).min(CONTENTION_MAX);
        self.hold = self.hold.saturating_add(1 << self.contention);
    }

    fn ease(&mut self) {
        self.contention = self.contention.saturating_sub(1);
    }
}

/// Design 2: the global list, plus a per-CPU cache of at most [`MAX_LOCAL_COUNT`] buffers used
/// when the global lock is contended, with the adaptive hold of the 2023 patch.
pub struct CachePool {
    global: GlobalPool,
    caches: PerCpu<LocalCache>,
}

impl fmt::Debug for CachePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachePool")
            .field("slab", &self.global.slab)
            .finish_non_exhaustive()
    }
}

impl CachePool {
    /// A pool of buffers of `size` bytes, at most `capacity`, with a cache per CPU of `qpw`.
    pub fn new(qpw: &Qpw, size: usize, capacity: usize) -> Result<Self, PoolError> {
        Ok(Self {
            global: GlobalPool::new(size, capacity)?,
            caches: qpw.per_cpu(|_| LocalCache::default()),
        })
    }

    /// The calling CPU's cache, counting a wait for it as contention.
    fn cache(&self) -> Result<PerCpuGuard<'_, LocalCache>, PoolError> {
        Ok(match self.caches.try_lock_local()? {
            Some(guard) => guard,
            None => {
                self.global.slab.count(Counter::PercpuWaits);
                self.caches.lock_local()?
            }
        })
    }
}

impl BufferPool for CachePool {
    fn design(&self) -> Design {
        Design::PerCpuCache
    }

    fn get(&self) -> Result<Option<Buffer>, PoolError> {
        let slab = &self.global.slab;
        // Use the per-CPU cached buffers first.
        {
            let mut cache = self.cache()?;
            if let Some(id) = cache.head.pop() {
                cache.hold = cache.hold.saturating_sub(1);
                drop(cache);
                slab.count(Counter::LocalHits);
                return Ok(Some(slab.take(id)));
            }
        }
        // Then the global list: a failed trylock raises this CPU's contention and hold, a
        // successful one eases it (after the global lock is dropped: the per-CPU lock may
        // sleep, and no one should spin on `aa_buffers_lock` meanwhile).
        match self.global.list.try_lock() {
            Some(list) => {
                let buffer = self.global.get_locked(list);
                self.cache()?.ease();
                Ok(buffer)
            }
            None => {
                slab.count(Counter::Contention);
                self.cache()?.update_contention();
                let list = self.global.list.lock();
                Ok(self.global.get_locked(list))
            }
        }
    }

    fn put(&self, buffer: Buffer) -> Result<(), PoolError> {
        let slab = &self.global.slab;
        let id = slab.give(buffer)?;
        let mut cache = self.cache()?;
        let full = cache.head.len() >= MAX_LOCAL_COUNT;
        if cache.hold == 0 || full {
            drop(cache);
            // A full cache must go to the global list; otherwise only if the lock is free.
            let list = if full {
                Some(
                    self.global
                        .list
                        .lock_counted(|| slab.count(Counter::Contention)),
                )
            } else {
                self.global.list.try_lock()
            };
            if let Some(mut list) = list {
                list.free.push(id);
                drop(list);
                self.cache()?.ease();
                return Ok(());
            }
            // Contention on the global list: fall back to the per-CPU cache.
            slab.count(Counter::Contention);
            cache = self.cache()?;
            cache.update_contention();
            if cache.head.len() >= MAX_LOCAL_COUNT {
                // Another thread of this CPU filled it meanwhile.
                drop(cache);
                self.global.list.lock().free.push(id);
                return Ok(());
            }
        }
        cache.head.push(id);
        Ok(())
    }

    fn stats(&self) -> PoolStats {
        self.global.slab.stats(Design::PerCpuCache)
    }

    fn check_conservation(&self) -> Result<(), String> {
        let mut places = match self.global.list.try_lock() {
            Some(l) => vec![("the global list".to_string(), l.free.clone())],
            None => return Err("the global lock is held: a get or put is in flight".into()),
        };
        let mut over = None;
        self.caches.for_each_locked(|cpu, cache| {
            if cache.head.len() > MAX_LOCAL_COUNT {
                over = Some((cpu, cache.head.len()));
            }
            places.push((format!("cpu {cpu}'s cache"), cache.head.clone()));
        });
        if let Some((cpu, n)) = over {
            return Err(format!(
                "cpu {cpu}'s cache holds {n} buffers, more than {MAX_LOCAL_COUNT}"
            ));
        }
        self.global.slab.check(places)
    }

    fn with_bytes(
        &self,
        buffer: &mut Buffer,
        f: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), PoolError> {
        self.global.slab.with_bytes(buffer, f)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use qpw_core::CpuSpec;

    use super::*;

    #[test]
    fn contention_rises_by_three_to_nine_and_hold_by_powers_of_two() {
        let mut cache = LocalCache::default();
        let mut seen = Vec::new();
        for _ in 0..4 {
            cache.update_contention();
            seen.push((cache.contention, cache.hold));
        }
        assert_eq!(seen, [(3, 8), (6, 72), (9, 584), (9, 1096)]);
        cache.ease();
        assert_eq!(cache.contention, 8);
        let mut idle = LocalCache::default();
        idle.ease();
        assert_eq!(idle.contention, 0);
    }

    #[test]
    fn a_put_that_meets_contention_is_cached_and_served_locally() {
        let qpw = Qpw::builder()
            .cpus(CpuSpec::Logical(1))
            .policy(qpw_core::Policy::Remote)
            .build()
            .unwrap();
        let pool = CachePool::new(&qpw, 64, 8).unwrap();
        let _bound = qpw.bind_current(0).unwrap();
        let a = pool.get().unwrap().unwrap();
        let b = pool.get().unwrap().unwrap();
        // Another CPU holds aa_buffers_lock: the first put's trylock fails, which raises the
        // hold; the second stays local without trying.
        let held = pool.global.list.lock();
        pool.put(a).unwrap();
        pool.put(b).unwrap();
        drop(held);
        let s = pool.stats();
        assert_eq!(s.lock_contention, 1);
        pool.check_conservation().unwrap();
        {
            let cache = pool.caches.lock_local().unwrap();
            assert_eq!(cache.head.len(), 2);
            assert_eq!((cache.contention, cache.hold), (3, 8));
        }
        // The next gets are served from the cache, without the global lock.
        let a = pool.get().unwrap().unwrap();
        let b = pool.get().unwrap().unwrap();
        assert_eq!(pool.stats().local_hits, 2);
        // While hold > 0, puts stay local, at most MAX_LOCAL_COUNT of them.
        let c = pool.get().unwrap().unwrap();
        for x in [a, b, c] {
            pool.put(x).unwrap();
        }
        assert_eq!(
            pool.caches.lock_local().unwrap().head.len(),
            MAX_LOCAL_COUNT
        );
        pool.check_conservation().unwrap();
    }
}
