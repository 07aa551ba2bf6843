//! A pool of fixed-size buffers in three designs, behind one get/put API, driven by a
//! hackbench-style load (seed 004).
//!
//! # The problem
//!
//! AppArmor needs large scratch buffers (`aa_get_buffer`/`aa_put_buffer`, 2 x `PATH_MAX`) on
//! every file permission check. They used to sit in per-CPU caches, used with preemption off;
//! commit df323337e507 ("apparmor: Use a memory pool instead per-CPU caches") replaced those by
//! one global list under `aa_buffers_lock`, for PREEMPT_RT (no long preempt-off sections, no
//! `GFP_ATOMIC`) and for memory on large machines. In 2023 hackbench on a 192-thread EPYC spent
//! its time in `native_queued_spin_lock_slowpath` behind `apparmor_file_permission` and lost up
//! to 30 % (Swapnil Sapkal, Mathieu Desnoyers). Two fixes were on the table:
//!
//! 1. [`GlobalPool`]: the design of df323337e507. Take from the list while it holds more than
//!    `RESERVE_COUNT` = 2 buffers, else allocate a new one; every put goes back to the list.
//! 2. [`CachePool`]: John Johansen's "apparmor: cache buffers on percpu list if there is lock
//!    contention" (2023): a put whose `spin_trylock` fails keeps the buffer on a per-CPU list
//!    (at most `MAX_LOCAL_COUNT` = 2), a get looks there first; each failed trylock raises the
//!    CPU's `contention` by 3 up to 9 and its `hold` by `1 << contention` (8, 64, 512), each
//!    successful one lowers `contention` by 1, and while `hold` is non-zero puts stay local.
//! 3. [`PerCpuPools`]: Mathieu Desnoyers' proposal: true per-CPU pools, each buffer owned by one
//!    CPU; a buffer freed on another CPU goes back to its owner lock-free (a push onto the
//!    owner's return stack), and the owner takes the whole stack back with one atomic swap when
//!    its own list runs dry. Memory is bounded by construction: `cpus x per_cpu` buffers.
//!
//! # Userspace translation
//!
//! `get_cpu_ptr()` becomes the qpw local lock of the calling thread's CPU ([`qpw_core::PerCpu`]),
//! since userspace cannot disable preemption; the global `aa_buffers_lock` is a spinlock that
//! yields after a short spin (a pure spinlock would spin against a preempted holder). Buffers
//! live in a slab and are handed out as unique [`Buffer`] tokens; every hand-out and return
//! flips the buffer's owner flag, so a buffer owned twice or returned twice is counted as a
//! violation ([`PoolStats::violations`]), and [`BufferPool::check_conservation`] checks that
//! every allocated buffer is in exactly one place.
//!
//! The load ([`hackbench`]) follows `perf bench sched messaging` in threads mode: groups of
//! senders and receivers, each message a pool buffer from the sender's get to the receiver's
//! put, each receiver's pipe blocking its senders when it holds [`HACKBENCH_PIPE_MESSAGES`],
//! and both roles spread over every CPU so that each CPU gets and puts, and buffers freed on
//! another CPU than the one that took them are common, as they are under the kernel's
//! scheduler.
//!
//! Where we deviate from the 2023 patch, on purpose: the patch decrements the unsigned `hold`
//! on every cached get, which wraps it to `UINT_MAX` when it is already 0; we saturate at 0. And
//! the patch caches a put without checking `count` while `hold` is non-zero; the brief's bound
//! of 2 cached buffers per CPU is kept on every path.

use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use qpw_core::sync::{thread, AtomicBool, AtomicU64, AtomicUsize, MutPtr, Ordering, UnsafeCell};
#[cfg(not(loom))]
use qpw_core::sync::{Condvar, Mutex, MutexGuard};
use qpw_core::{CpuSpec, PerCpu, PerCpuGuard, Qpw};

/// `RESERVE_COUNT`: buffers the global list keeps back (security/apparmor/lsm.c).
pub const RESERVE_COUNT: usize = 2;
/// `MAX_LOCAL_COUNT`: buffers a CPU's cache may hold (the 2023 patch).
pub const MAX_LOCAL_COUNT: usize = 2;
/// Added to a CPU's `contention` on each failed trylock.
pub const CONTENTION_STEP: u32 = 3;
/// The most `contention` gets (`hold` grows by at most `1 << 9` per failure).
pub const CONTENTION_MAX: u32 = 9;
/// hackbench's message size (`DATASIZE`, bytes).
pub const HACKBENCH_DATASIZE: usize = 100;
/// Messages a receiver's pipe holds before its senders block, as a pipe's writer blocks when
/// the pipe is full: it bounds the buffers in flight to `receivers x 32` plus one per sender.
pub const HACKBENCH_PIPE_MESSAGES: usize = 32;

/// Which design a pool is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Design {
    /// One global list under one spinlock (df323337e507).
    GlobalLock,
    /// The global list plus a per-CPU cache used under contention (the 2023 patch).
    PerCpuCache,
    /// Per-CPU pools with lock-free return to the owning CPU (Desnoyers).
    PerCpuPools,
}

impl Design {
    /// Every design.
    pub const ALL: [Design; 3] = [Design::GlobalLock, Design::PerCpuCache, Design::PerCpuPools];

    /// The design's short name.
    pub fn name(self) -> &'static str {
        match self {
            Design::GlobalLock => "global",
            Design::PerCpuCache => "percpu-cache",
            Design::PerCpuPools => "percpu-pools",
        }
    }
}

impl fmt::Display for Design {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything that can go wrong with a pool; messages name the bad input and the range.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// A parameter out of range.
    #[error("{what} {value} is out of range: the legal range is {lo}-{hi}")]
    Range {
        /// The parameter.
        what: &'static str,
        /// The value given.
        value: usize,
        /// The smallest legal value.
        lo: usize,
        /// The largest legal value.
        hi: usize,
    },
    /// The calling thread is not on a CPU of the pool's instance.
    #[error(transparent)]
    Qpw(#[from] qpw_core::Error),
    /// A buffer from another pool.
    #[error("buffer {id} belongs to another pool")]
    ForeignBuffer {
        /// The buffer's id.
        id: u32,
    },
    /// A hackbench thread panicked or could not start.
    #[error("hackbench {what} thread failed: {reason}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// Why.
        reason: String,
    },
}

/// A buffer handed out by a pool: a unique token (not `Clone`), whose bytes are reached with
/// [`BufferPool::with_bytes`]. Give it back with [`BufferPool::put`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a buffer that is not put back is lost to the pool"]
pub struct Buffer {
    id: u32,
    pool: u64,
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
    /// The most buffers in use at once.
    pub max_in_use: u64,
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
/// must be on a CPU of the pool's instance (bound with [`Qpw::bind_current`]).
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

/// The buffers of one pool, handed out as [`Buffer`] tokens.
struct Slab {
    id: u64,
    size: usize,
    data: Box<[UnsafeCell<Vec<u8>>]>,
    owned: Box<[AtomicBool]>,
    next: AtomicUsize,
    gets: AtomicU64,
    puts: AtomicU64,
    in_use: AtomicU64,
    max_in_use: AtomicU64,
    violations: AtomicU64,
    exhausted: AtomicU64,
    contention: AtomicU64,
    percpu_waits: AtomicU64,
    cas_retries: AtomicU64,
    local_hits: AtomicU64,
    remote_returns: AtomicU64,
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
    fn new(size: usize, capacity: usize) -> Self {
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

    fn allocated(&self) -> usize {
        self.next.load(Ordering::Relaxed).min(self.data.len())
    }

    /// A new buffer (`kmalloc`), or `None` at capacity.
    fn alloc(&self) -> Option<u32> {
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
    fn take(&self, id: u32) -> Buffer {
        if self.owned[id as usize].swap(true, Ordering::Acquire) {
            self.violations.fetch_add(1, Ordering::Relaxed);
        }
        self.gets.fetch_add(1, Ordering::Relaxed);
        let now = self.in_use.fetch_add(1, Ordering::Relaxed) + 1;
        self.max_in_use.fetch_max(now, Ordering::Relaxed);
        Buffer { id, pool: self.id }
    }

    /// Takes a token back; its id goes to a list.
    fn give(&self, buffer: Buffer) -> Result<u32, PoolError> {
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

    fn with_bytes(
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

    fn stats(&self, design: Design) -> PoolStats {
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
    fn check(&self, places: impl IntoIterator<Item = (String, Vec<u32>)>) -> Result<(), String> {
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

/// `aa_buffers_lock`: a spinlock whose waiters yield after a short spin (a waiter may share
/// its CPU with the preempted holder). Counts failed first attempts as contention.
struct SpinLock<T> {
    locked: AtomicBool,
    data: UnsafeCell<T>,
}

// SAFETY: the data is reached only through a guard, made only by the thread that set `locked`
// from false to true, so one thread at a time has it: like a mutex, that needs `T: Send`.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: moving the lock moves the `T`, which `T: Send` allows.
unsafe impl<T: Send> Send for SpinLock<T> {}

impl<T> SpinLock<T> {
    fn new(data: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            data: UnsafeCell::new(data),
        }
    }

    /// `spin_trylock`.
    #[inline]
    fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            .then(|| SpinGuard::new(self))
    }

    /// `spin_lock`.
    fn lock(&self) -> SpinGuard<'_, T> {
        let mut spins = 0u32;
        loop {
            if let Some(guard) = self.try_lock() {
                return guard;
            }
            while self.locked.load(Ordering::Relaxed) {
                spins += 1;
                if spins < 64 {
                    qpw_core::sync::spin_loop();
                } else {
                    thread::yield_now();
                }
            }
        }
    }

    /// `spin_lock`, counting a failed first attempt as contention.
    fn lock_counted(&self, contention: &AtomicU64) -> SpinGuard<'_, T> {
        match self.try_lock() {
            Some(guard) => guard,
            None => {
                contention.fetch_add(1, Ordering::Relaxed);
                self.lock()
            }
        }
    }
}

struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
    ptr: ManuallyDrop<MutPtr<T>>,
    _not_send: PhantomData<*const ()>,
}

impl<'a, T> SpinGuard<'a, T> {
    fn new(lock: &'a SpinLock<T>) -> Self {
        Self {
            ptr: ManuallyDrop::new(lock.data.get_mut()),
            lock,
            _not_send: PhantomData,
        }
    }
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock, so no other guard exists.
        unsafe { MutPtr::deref(&self.ptr) }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only borrow through the guard.
        unsafe { MutPtr::deref(&self.ptr) }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: dropped once, here, before the unlock, never used again.
        unsafe { ManuallyDrop::drop(&mut self.ptr) };
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// The global list and its count (`aa_global_buffers`, `buffer_count`).
#[derive(Debug, Default)]
struct GlobalList {
    free: Vec<u32>,
}

/// Design 1: one global list under one spinlock (df323337e507).
pub struct GlobalPool {
    slab: Slab,
    list: SpinLock<GlobalList>,
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
    fn get_locked(&self, mut list: SpinGuard<'_, GlobalList>) -> Option<Buffer> {
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
        let id = self.list.lock_counted(&self.slab.contention).free.pop();
        match id {
            Some(id) => Some(self.slab.take(id)),
            None => {
                self.slab.exhausted.fetch_add(1, Ordering::Relaxed);
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
        let list = self.list.lock_counted(&self.slab.contention);
        Ok(self.get_locked(list))
    }

    fn put(&self, buffer: Buffer) -> Result<(), PoolError> {
        let id = self.slab.give(buffer)?;
        self.list.lock_counted(&self.slab.contention).free.push(id);
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
                self.global
                    .slab
                    .percpu_waits
                    .fetch_add(1, Ordering::Relaxed);
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
                slab.local_hits.fetch_add(1, Ordering::Relaxed);
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
                slab.contention.fetch_add(1, Ordering::Relaxed);
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
                Some(self.global.list.lock_counted(&slab.contention))
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
            slab.contention.fetch_add(1, Ordering::Relaxed);
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

/// End of a return stack.
const NIL: usize = usize::MAX;

/// One CPU's return stack head, on its own cache line.
#[repr(align(128))]
#[derive(Debug)]
struct ReturnHead(AtomicUsize);

/// Design 3: per-CPU pools of `per_cpu` buffers each, owned for life by one CPU; a buffer put
/// on another CPU is pushed lock-free onto its owner's return stack (Desnoyers).
pub struct PerCpuPools {
    slab: Slab,
    qpw_cpus: Vec<usize>,
    /// Per buffer: the index of its owning CPU.
    home: Box<[usize]>,
    /// Per buffer: the next buffer on a return stack.
    next: Box<[AtomicUsize]>,
    /// Per CPU: the head of its return stack.
    returns: Box<[ReturnHead]>,
    local: PerCpu<Vec<u32>>,
    per_cpu: usize,
}

impl fmt::Debug for PerCpuPools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerCpuPools")
            .field("slab", &self.slab)
            .field("per_cpu", &self.per_cpu)
            .finish_non_exhaustive()
    }
}

impl PerCpuPools {
    /// Per-CPU pools of `per_cpu` buffers of `size` bytes for every CPU of `qpw`, all
    /// allocated now: the pool never holds more than `cpus x per_cpu`.
    pub fn new(qpw: &Qpw, size: usize, per_cpu: usize) -> Result<Self, PoolError> {
        check("buffer size", size, 1, 1 << 20)?;
        check("buffers per CPU", per_cpu, 1, 1 << 16)?;
        let cpus: Vec<usize> = qpw.cpus().iter().collect();
        let capacity = cpus.len() * per_cpu;
        check("total buffers", capacity, 1, 1 << 20)?;
        let slab = Slab::new(size, capacity);
        let mut home = Vec::with_capacity(capacity);
        let mut lists: Vec<Vec<u32>> = vec![Vec::with_capacity(per_cpu); cpus.len()];
        for (idx, list) in lists.iter_mut().enumerate() {
            for _ in 0..per_cpu {
                let id = slab.alloc().ok_or(PoolError::Range {
                    what: "total buffers",
                    value: capacity,
                    lo: 1,
                    hi: 1 << 20,
                })?;
                home.push(idx);
                list.push(id);
            }
        }
        let mut lists = lists.into_iter();
        let local = qpw.per_cpu(|_| lists.next().unwrap_or_default());
        Ok(Self {
            slab,
            home: home.into(),
            next: (0..capacity).map(|_| AtomicUsize::new(NIL)).collect(),
            returns: cpus
                .iter()
                .map(|_| ReturnHead(AtomicUsize::new(NIL)))
                .collect(),
            qpw_cpus: cpus,
            local,
            per_cpu,
        })
    }

    fn idx_of(&self, cpu: usize) -> usize {
        self.qpw_cpus.iter().position(|&c| c == cpu).unwrap_or(0)
    }

    /// Takes this CPU's whole return stack back into its list (one swap), walking the links.
    fn reclaim(&self, idx: usize, list: &mut Vec<u32>) {
        let mut id = self.returns[idx].0.swap(NIL, Ordering::Acquire);
        while id != NIL {
            list.push(id as u32);
            id = self.next[id].load(Ordering::Relaxed);
        }
    }

    /// Pushes `id` onto the return stack of CPU index `idx`, lock-free.
    fn push_return(&self, idx: usize, id: u32) {
        let head = &self.returns[idx].0;
        let mut old = head.load(Ordering::Relaxed);
        loop {
            self.next[id as usize].store(old, Ordering::Relaxed);
            match head.compare_exchange_weak(old, id as usize, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => {
                    self.slab.cas_retries.fetch_add(1, Ordering::Relaxed);
                    old = now;
                }
            }
        }
    }

    fn lock_local(&self) -> Result<PerCpuGuard<'_, Vec<u32>>, PoolError> {
        Ok(match self.local.try_lock_local()? {
            Some(guard) => guard,
            None => {
                self.slab.percpu_waits.fetch_add(1, Ordering::Relaxed);
                self.local.lock_local()?
            }
        })
    }
}

impl BufferPool for PerCpuPools {
    fn design(&self) -> Design {
        Design::PerCpuPools
    }

    fn get(&self) -> Result<Option<Buffer>, PoolError> {
        let mut list = self.lock_local()?;
        if list.is_empty() {
            // Dry: take back what other CPUs returned.
            let idx = self.idx_of(PerCpuGuard::cpu(&list));
            self.reclaim(idx, &mut list);
        }
        match list.pop() {
            Some(id) => {
                drop(list);
                self.slab.local_hits.fetch_add(1, Ordering::Relaxed);
                Ok(Some(self.slab.take(id)))
            }
            None => {
                self.slab.exhausted.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
        }
    }

    fn put(&self, buffer: Buffer) -> Result<(), PoolError> {
        let id = self.slab.give(buffer)?;
        let home = self.home[id as usize];
        let mut list = self.lock_local()?;
        if self.idx_of(PerCpuGuard::cpu(&list)) == home {
            list.push(id);
            return Ok(());
        }
        drop(list);
        // Freed on another CPU: back to the owner, lock-free.
        self.slab.remote_returns.fetch_add(1, Ordering::Relaxed);
        self.push_return(home, id);
        Ok(())
    }

    fn stats(&self) -> PoolStats {
        self.slab.stats(Design::PerCpuPools)
    }

    fn check_conservation(&self) -> Result<(), String> {
        let mut places = Vec::new();
        let mut wrong_home = None;
        self.local.for_each_locked(|cpu, list| {
            let idx = self.idx_of(cpu);
            if let Some(&id) = list.iter().find(|&&id| self.home[id as usize] != idx) {
                wrong_home = Some((id, cpu));
            }
            places.push((format!("cpu {cpu}'s pool"), list.clone()));
        });
        if let Some((id, cpu)) = wrong_home {
            return Err(format!(
                "buffer {id} sits in cpu {cpu}'s pool, not its owner's"
            ));
        }
        for (idx, head) in self.returns.iter().enumerate() {
            let mut ids = Vec::new();
            let mut id = head.0.load(Ordering::Acquire);
            while id != NIL {
                if ids.len() > self.next.len() {
                    return Err(format!("cpu index {idx}'s return stack has a cycle"));
                }
                if self.home[id] != idx {
                    return Err(format!(
                        "buffer {id} is on the return stack of a CPU not its owner"
                    ));
                }
                ids.push(id as u32);
                id = self.next[id].load(Ordering::Relaxed);
            }
            places.push((format!("cpu {}'s return stack", self.qpw_cpus[idx]), ids));
        }
        self.slab.check(places)
    }

    fn with_bytes(
        &self,
        buffer: &mut Buffer,
        f: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), PoolError> {
        self.slab.with_bytes(buffer, f)
    }
}

fn check(what: &'static str, value: usize, lo: usize, hi: usize) -> Result<(), PoolError> {
    if (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(PoolError::Range {
            what,
            value,
            lo,
            hi,
        })
    }
}

/// Builds a pool of `design` over `qpw`'s CPUs: `capacity` bounds designs 1 and 2,
/// `per_cpu` sizes design 3.
pub fn build(
    design: Design,
    qpw: &Qpw,
    size: usize,
    capacity: usize,
    per_cpu: usize,
) -> Result<Box<dyn BufferPool>, PoolError> {
    Ok(match design {
        Design::GlobalLock => Box::new(GlobalPool::new(size, capacity)?),
        Design::PerCpuCache => Box::new(CachePool::new(qpw, size, capacity)?),
        Design::PerCpuPools => Box::new(PerCpuPools::new(qpw, size, per_cpu)?),
    })
}

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
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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

/// What to measure with [`pool_figures`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolFiguresConfig {
    /// The CPUs (default: the allowed ones).
    pub cpus: CpuSpec,
    /// The designs, in order (default: all three).
    pub designs: Vec<Design>,
    /// Group counts to sweep (threads = groups x fds x 2; default 1, 2, 4).
    pub groups: Vec<usize>,
    /// Senders and receivers per group (default 4).
    pub fds: usize,
    /// Messages per sender per receiver (default 200).
    pub loops: usize,
    /// Buffer size in bytes (default 8192: AppArmor's 2 x `PATH_MAX`).
    pub buffer_size: usize,
    /// The most buffers designs 1 and 2 may allocate (default 4096).
    pub capacity: usize,
    /// Buffers per CPU for design 3 (default 64).
    pub per_cpu: usize,
}

impl Default for PoolFiguresConfig {
    fn default() -> Self {
        Self {
            cpus: CpuSpec::Allowed,
            designs: Design::ALL.to_vec(),
            groups: vec![1, 2, 4],
            fds: 4,
            loops: 200,
            buffer_size: 8192,
            capacity: 4096,
            per_cpu: 64,
        }
    }
}

/// The pool figures: one hackbench run per design and group count.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolFigures {
    /// The framework instance's description (physical or logical CPUs).
    pub cpus: String,
    /// Whether the CPUs are logical.
    pub logical: bool,
    /// Per design (outer) and group count (inner).
    pub runs: Vec<HackbenchReport>,
}

#[cfg(not(loom))]
/// Runs hackbench on each design at each group count, on a fresh pool each time, and checks
/// conservation after each run.
pub fn pool_figures(config: &PoolFiguresConfig) -> Result<PoolFigures, PoolError> {
    let qpw = Qpw::builder()
        .cpus(config.cpus.clone())
        .policy(qpw_core::Policy::Remote)
        .build()?;
    let mut runs = Vec::new();
    for &design in &config.designs {
        for &groups in &config.groups {
            let pool = build(
                design,
                &qpw,
                config.buffer_size,
                config.capacity,
                config.per_cpu,
            )?;
            let report = hackbench(
                &qpw,
                &*pool,
                &HackbenchConfig {
                    groups,
                    fds: config.fds,
                    loops: config.loops,
                    datasize: HACKBENCH_DATASIZE.min(config.buffer_size),
                },
            )?;
            if let Err(reason) = pool.check_conservation() {
                return Err(PoolError::Thread {
                    what: "conservation check",
                    reason,
                });
            }
            runs.push(report);
        }
    }
    Ok(PoolFigures {
        cpus: qpw.describe(),
        logical: qpw.is_logical(),
        runs,
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
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
    fn spinlock_counts_only_failed_first_attempts() {
        let lock = SpinLock::new(0u32);
        let contention = AtomicU64::new(0);
        *lock.lock_counted(&contention) += 1;
        assert_eq!(contention.load(Ordering::Relaxed), 0);
        let held = lock.try_lock().unwrap();
        assert!(lock.try_lock().is_none());
        drop(held);
        assert_eq!(*lock.lock(), 1);
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

    #[test]
    fn stamps_detect_a_foreign_writer() {
        let mut bytes = [0u8; 100];
        stamp(7 << 32 | 5, &mut bytes);
        assert!(stamped(7 << 32 | 5, &bytes));
        assert!(!stamped(8 << 32 | 5, &bytes));
    }
}
