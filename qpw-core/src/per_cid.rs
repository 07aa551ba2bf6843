//! [`PerCid<T>`]: state kept per *concurrency id* (rseq's `mm_cid`), one slot for each thread
//! that runs at once rather than one for each CPU of the host.
//!
//! # The problem
//!
//! [`PerCpu`](crate::PerCpu) has a slot per CPU and walks them all. A service with 8 threads
//! on a 256-CPU host (a container with a CPU quota, a pod pinned to a few cores) then carries
//! 256 slots, and every scrape or drain visits 256 locks for 8 threads' worth of data. The
//! kernel already hands each running thread a small dense id, unique among the process's
//! threads that run at the same moment ([`cid`](crate::cid), `mm_cid`, Linux 6.3): index by
//! it, and the slots and the walks scale with the threads that run.
//!
//! # The mechanism
//!
//! - **Slots made on first use.** The table holds one pointer per id the kernel could give
//!   (the CPUs it could ever run: `mm_cid` is always below that), null until a thread with
//!   that id takes its slot; the slot (a [`FairLock`] and the `T`, on its own cache line) is
//!   made then, from the `init` function, and published with a compare-and-swap, so that of
//!   two threads that make it at once one wins and the other drops its copy, which held
//!   nothing yet. The table also keeps the highest id used so far, plus one: walks visit the
//!   ids below it that have a slot, so at most as many as ran at once.
//! - **A real lock per slot.** A thread's id can change whenever it is descheduled, and another
//!   thread can take the id it had: two threads may therefore reach one slot (one holding it
//!   while preempted, the other with its old id), so the slot's lock must exclude threads on
//!   any CPU. It is the atomic [`FairLock`], as in remote mode: the owner's operation is two
//!   compare-and-swaps (about what [`PerCpu`] pays in remote mode), a walk takes each lock
//!   from the caller.
//! - **No queue mode.** There is no CPU to post work to: an id is not a place a worker can
//!   run, and the thread that had it may run anywhere by the time the work would. Every walk
//!   and drain therefore runs in the caller under each id's lock, as remote mode does,
//!   whatever the instance's policy says of its CPUs.
//!
//! # Why the owner's path is not a restartable sequence (yet)
//!
//! [`FencedLock`](crate::FencedLock) lets a CPU's owner take its lock with plain stores in a
//! restartable sequence keyed by `cpu_id`, because a requester can fence *that CPU*
//! (`membarrier(.., MEMBARRIER_CMD_FLAG_CPU, cpu)`), and an answer read by a sequence of that
//! CPU proves that no sequence there is in flight. A sequence keyed by `mm_cid` excludes the
//! owners of one id as well (the kernel aborts a sequence whose thread is preempted, and two
//! threads never run with one id at once), but neither half of the requester's side carries
//! over: the id's sequences run on whichever CPU its current thread is on, so the fence would
//! have to reach every CPU the process runs on (`MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ`
//! without a CPU: an interrupt on each, the very disturbance of isolated CPUs this crate
//! exists to avoid), and an answer would have to prove something of "the id's sequences",
//! which no single CPU holds. Until that has its own argument and its own loom model, the
//! owner's path is the atomic lock, which is correct as it stands.
//!
//! # Where `mm_cid` cannot be read
//!
//! On a kernel before 6.3, without glibc's rseq registration (glibc before 2.35,
//! `GLIBC_TUNABLES=glibc.pthread.rseq=0`) or in a thread the kernel did not register
//! (valgrind), the ids fall back to CPU numbers ([`cid::status`](crate::cid::status) says
//! why, and [`Qpw::describe`](crate::Qpw::describe) says which): as many slots as CPUs the
//! threads have run on, still each behind its lock.

use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicPtr, AtomicUsize, MutPtr, Ordering, UnsafeCell};
use crate::{Error, FairLock, RawLocalLock, Result};

/// One id's slot: its lock and its value.
struct Slot<T> {
    lock: FairLock,
    data: UnsafeCell<T>,
    /// The id, for [`CidGuard::id`].
    id: usize,
}

impl<T> Slot<T> {
    /// What the thread's list of held locks (`held.rs`) knows this slot's lock by.
    fn key(&self) -> usize {
        &self.lock as *const FairLock as usize
    }
}

/// The table the clones of a [`PerCid`] share.
struct Table<T> {
    /// One pointer per id, null until the id's slot is made.
    slots: Box<[AtomicPtr<CachePadded<Slot<T>>>]>,
    /// The highest id with a slot, plus one: the walks look no further.
    used: AtomicUsize,
    /// How many slots have been made.
    made: AtomicUsize,
    init: Box<dyn Fn(usize) -> T + Send + Sync>,
}

impl<T> Drop for Table<T> {
    fn drop(&mut self) {
        for slot in self.slots.iter_mut() {
            let p = slot.load(Ordering::Relaxed);
            if !p.is_null() {
                // SAFETY: a non-null pointer in the table came from `Box::into_raw` in
                // `make_slot` and was published once; the table is being dropped, so no guard
                // or walk borrows it any more.
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}

/// Per-thread state indexed by concurrency id (rseq's `mm_cid`; module docs): a `T` for each id
/// the process's threads have run with, each behind its own lock, made on first use.
///
/// - [`lock_local`](Self::lock_local) takes the calling thread's id's slot;
/// - [`for_each_locked`](Self::for_each_locked), [`take_each`](Self::take_each) and
///   [`read_each`](Self::read_each) walk the ids used so far, each under its lock, from the
///   caller (there is no queue mode: an id is not a CPU a worker could run on).
///
/// A handle: clones share the slots. Made by [`Qpw::per_cid`](crate::Qpw::per_cid).
///
/// ```
/// use qpw_core::Qpw;
///
/// let qpw = Qpw::new()?;
/// let requests = qpw.per_cid(|_id| 0u64);
/// std::thread::scope(|s| {
///     for _ in 0..4 {
///         s.spawn(|| {
///             for _ in 0..1000 {
///                 *requests.lock_local().unwrap() += 1; // this thread's id's slot
///             }
///         });
///     }
/// });
/// // A scrape visits only the ids that were used: at most as many as threads ran at once.
/// let mut total = 0;
/// requests.for_each_locked(|_id, n| total += *n)?;
/// assert_eq!(total, 4000);
/// assert!(requests.slots() <= 4 || qpw_core::cid::source() == qpw_core::cid::IdSource::Cpu);
/// println!("{}", qpw_core::cid::status());
/// # Ok::<(), qpw_core::Error>(())
/// ```
pub struct PerCid<T> {
    table: std::sync::Arc<Table<T>>,
}

impl<T> Clone for PerCid<T> {
    fn clone(&self) -> Self {
        Self {
            table: self.table.clone(),
        }
    }
}

// SAFETY: the `T`s are only reached through a guard or a walk, which hold the slot's lock, so a
// shared `PerCid` hands each `T` to one thread at a time: like `Mutex<T>`, that needs `T: Send`;
// `init` is `Send + Sync` by its bound.
unsafe impl<T: Send> Sync for PerCid<T> {}
// SAFETY: moving the handle moves access to the `T`s, which `T: Send` allows.
unsafe impl<T: Send> Send for PerCid<T> {}

impl<T> fmt::Debug for PerCid<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerCid")
            .field("ids", &self.ids())
            .field("slots", &self.slots())
            .field("capacity", &self.capacity())
            .finish_non_exhaustive()
    }
}

/// How many ids a table holds: the CPUs the kernel could ever run (`mm_cid` stays below it,
/// and so do CPU numbers in the fallback). Under loom, the models' four mock ids.
fn capacity() -> usize {
    #[cfg(not(loom))]
    {
        // SAFETY: `sysconf` has no preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
        usize::try_from(n)
            .unwrap_or(1)
            .clamp(1, crate::CpuSet::MAX_CPU + 1)
    }
    #[cfg(loom)]
    {
        4
    }
}

impl<T> PerCid<T> {
    pub(crate) fn new(init: impl Fn(usize) -> T + Send + Sync + 'static) -> Self {
        let slots = (0..capacity())
            .map(|_| AtomicPtr::new(std::ptr::null_mut()))
            .collect();
        Self {
            table: std::sync::Arc::new(Table {
                slots,
                used: AtomicUsize::new(0),
                made: AtomicUsize::new(0),
                init: Box::new(init),
            }),
        }
    }

    /// Locks the calling thread's id's slot, making it on first use. The id may have changed
    /// by the time the lock is taken (the thread was descheduled): correctness does not depend
    /// on it, since the lock is real either way.
    ///
    /// [`Error::IdReentrant`] if the thread already holds that slot through a guard of this
    /// state (in every build): it would wait for itself.
    #[inline]
    #[track_caller]
    pub fn lock_local(&self) -> Result<CidGuard<'_, T>> {
        let slot = self.slot(crate::cid::current().unwrap_or(0));
        not_held_here(slot)?;
        slot.lock.lock();
        Ok(CidGuard::new(slot))
    }

    /// Like [`lock_local`](Self::lock_local), but gives up at once (`Ok(None)`) when the lock
    /// is held.
    #[inline]
    #[track_caller]
    pub fn try_lock_local(&self) -> Result<Option<CidGuard<'_, T>>> {
        let slot = self.slot(crate::cid::current().unwrap_or(0));
        not_held_here(slot)?;
        Ok(slot.lock.try_lock().then(|| CidGuard::new(slot)))
    }

    /// Runs `f` on every id's value, each under its lock, one after another (the scrape and
    /// the drain): only the ids used so far, in order. A slot the calling thread holds is
    /// [`Error::IdReentrant`], before any is taken.
    #[track_caller]
    pub fn for_each_locked(&self, mut f: impl FnMut(usize, &mut T)) -> Result<()> {
        self.walk(|slot| {
            let mut guard = CidGuard::new(slot);
            f(slot.id, &mut guard);
        })
    }

    /// Runs `f` on every id's value under its lock and collects what it returns, with the ids:
    /// `take_each(std::mem::take)` empties every slot into the caller.
    #[track_caller]
    pub fn take_each<R>(&self, mut f: impl FnMut(&mut T) -> R) -> Result<Vec<(usize, R)>> {
        let mut out = Vec::new();
        self.walk(|slot| {
            let mut guard = CidGuard::new(slot);
            out.push((slot.id, f(&mut guard)));
        })?;
        Ok(out)
    }

    /// Reads every id's value under its lock (final sums, summaries).
    #[track_caller]
    pub fn read_each(&self, mut f: impl FnMut(usize, &T)) -> Result<()> {
        self.for_each_locked(|id, value| f(id, value))
    }

    /// The ids below the highest used so far plus one: what a walk looks at.
    pub fn ids(&self) -> usize {
        self.table.used.load(Ordering::Acquire)
    }

    /// How many slots have been made (the ids that threads have run with): what a walk visits.
    pub fn slots(&self) -> usize {
        self.table.made.load(Ordering::Relaxed)
    }

    /// How many ids the table could hold: the CPUs the kernel could ever run.
    pub fn capacity(&self) -> usize {
        self.table.slots.len()
    }

    /// The bytes this state holds: the table of pointers, and the slots made so far (each on
    /// its own cache line), not counting what `T` itself points to.
    pub fn memory(&self) -> usize {
        std::mem::size_of_val(&*self.table.slots)
            + self.slots() * std::mem::size_of::<CachePadded<Slot<T>>>()
    }

    /// Id `id`'s slot, made if it is not yet.
    #[inline]
    fn slot(&self, id: usize) -> &Slot<T> {
        // An id past the table (it cannot come from the kernel) shares a slot: still correct,
        // since slots are locked.
        let len = self.table.slots.len();
        let idx = if id < len { id } else { id % len };
        let p = self.table.slots[idx].load(Ordering::Acquire);
        if p.is_null() {
            return self.make_slot(idx);
        }
        // SAFETY: a non-null pointer was published by `make_slot` from a live `Box` and is
        // freed only when the table is dropped, which the borrow of `self` prevents.
        unsafe { &*p }
    }

    /// Makes id `idx`'s slot and publishes it, unless another thread did first.
    #[cold]
    fn make_slot(&self, idx: usize) -> &Slot<T> {
        let fresh = Box::into_raw(Box::new(CachePadded::new(Slot {
            lock: FairLock::new(),
            data: UnsafeCell::new((self.table.init)(idx)),
            id: idx,
        })));
        let cell = &self.table.slots[idx];
        let published = {
            #[cfg(loom)]
            if crate::rseq::mock::mutation() == crate::rseq::mock::Mutation::SlotStoredBlindly {
                cell.store(fresh, Ordering::Release);
                Ok(std::ptr::null_mut())
            } else {
                cell.compare_exchange(
                    std::ptr::null_mut(),
                    fresh,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
            }
            #[cfg(not(loom))]
            cell.compare_exchange(
                std::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
        };
        match published {
            Ok(_) => {
                self.table.made.fetch_add(1, Ordering::Relaxed);
                self.table.used.fetch_max(idx + 1, Ordering::AcqRel);
                // SAFETY: `fresh` is the live `Box` just published; it is freed only with the
                // table.
                unsafe { &*fresh }
            }
            Err(theirs) => {
                // SAFETY: `fresh` was never published: this thread owns it alone.
                drop(unsafe { Box::from_raw(fresh) });
                // SAFETY: as in `slot`, for the pointer the other thread published.
                unsafe { &*theirs }
            }
        }
    }

    /// Takes every used id's slot in turn and runs `visit` under its lock (which `visit`'s
    /// guard releases). Refuses, before taking any, when the thread holds one.
    #[track_caller]
    fn walk(&self, mut visit: impl FnMut(&Slot<T>)) -> Result<()> {
        let used = self.table.used.load(Ordering::Acquire);
        let published = |idx: usize| {
            let p = self.table.slots[idx].load(Ordering::Acquire);
            // SAFETY: as in `slot`.
            (!p.is_null()).then(|| unsafe { &*p })
        };
        for idx in 0..used {
            if let Some(slot) = published(idx) {
                not_held_here(slot)?;
            }
        }
        for idx in 0..used {
            if let Some(slot) = published(idx) {
                slot.lock.lock();
                visit(slot);
            }
        }
        Ok(())
    }
}

/// [`Error::IdReentrant`] if the calling thread holds `slot`'s lock through a guard.
#[inline]
#[track_caller]
fn not_held_here<T>(slot: &Slot<T>) -> Result<()> {
    match crate::held::held_at(slot.key()) {
        None => Ok(()),
        Some(held_at) => Err(Error::IdReentrant {
            id: slot.id,
            held_at,
            asked_at: std::panic::Location::caller(),
        }),
    }
}

/// Exclusive access to one id's slot, released on drop. Not `Send`: a lock is released by the
/// thread that took it.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct CidGuard<'a, T> {
    slot: &'a Slot<T>,
    /// Its entry in the thread's list of held locks, if it got one.
    entry: Option<usize>,
    ptr: ManuallyDrop<MutPtr<T>>,
    _not_send: PhantomData<*const ()>,
}

impl<'a, T> CidGuard<'a, T> {
    /// The guard of `slot`, whose lock the caller has just taken: recorded in the thread's
    /// list of held locks until it is dropped.
    #[track_caller]
    fn new(slot: &'a Slot<T>) -> Self {
        Self {
            slot,
            entry: crate::held::record(slot.key(), std::panic::Location::caller()),
            ptr: ManuallyDrop::new(slot.data.get_mut()),
            _not_send: PhantomData,
        }
    }

    /// The id whose slot this is (an associated function, so that it never hides a method of
    /// `T`).
    pub fn id(this: &Self) -> usize {
        this.slot.id
    }
}

impl<T> Deref for CidGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the guard holds the slot's lock, so no other guard exists for this slot.
        unsafe { MutPtr::deref(&self.ptr) }
    }
}

impl<T> DerefMut for CidGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only borrow through the guard.
        unsafe { MutPtr::deref(&self.ptr) }
    }
}

impl<T> Drop for CidGuard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: (1) the pointer is dropped exactly once, here; (2) before the unlock, so
        // that loom sees the access end inside the critical section.
        unsafe { ManuallyDrop::drop(&mut self.ptr) };
        if let Some(entry) = self.entry {
            crate::held::forget(entry);
        }
        // SAFETY: the guard was made only after its lock was taken by this thread, and each
        // guard releases its hold once.
        unsafe { self.slot.lock.unlock() };
    }
}

impl<T: fmt::Debug> fmt::Debug for CidGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CidGuard")
            .field("id", &self.slot.id)
            .field("data", &**self)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn slots_are_made_on_first_use_and_walked_in_order() {
        let state = PerCid::new(|id| id * 10 + 1);
        assert_eq!((state.ids(), state.slots()), (0, 0));
        let last = state.capacity() - 1;
        let slot = state.slot(last);
        slot.lock.lock();
        assert_eq!(*CidGuard::new(slot), last * 10 + 1);
        assert_eq!((state.ids(), state.slots()), (last + 1, 1));
        // An id past the table shares a slot (the kernel gives none).
        assert!(std::ptr::eq(state.slot(last + state.capacity()), slot));
        let mut seen = Vec::new();
        state.read_each(|id, v| seen.push((id, *v))).unwrap();
        assert_eq!(seen, [(last, last * 10 + 1)]);
        assert!(state.memory() >= state.capacity() * std::mem::size_of::<usize>());
    }

    #[test]
    fn a_held_slot_is_refused_not_waited_for() {
        let state = PerCid::new(|_| 0u32);
        let guard = state.lock_local().unwrap();
        let again = state.lock_local().unwrap_err();
        assert!(matches!(again, Error::IdReentrant { .. }), "{again}");
        assert!(state.for_each_locked(|_, _| {}).is_err());
        drop(guard);
        state.for_each_locked(|_, v| *v += 1).unwrap();
        assert_eq!(*state.lock_local().unwrap(), 1);
    }
}
