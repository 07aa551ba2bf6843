//! `PerCpu<T>`: one cache-padded slot per managed CPU, each behind that CPU's local lock.

use std::fmt;
use std::marker::PhantomData;
#[cfg(loom)]
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};

use crossbeam_utils::CachePadded;

use crate::instance::Inner;
use crate::sync::{Arc, MutPtr, UnsafeCell};
use crate::{
    CpuSet, Error, LocalAttempt, Mode, PwLock, RawLocalLock, RawRemoteLock, Result, WorkCtx,
};

/// How often [`PerCpu::lock_local`] follows a migrating thread to its new CPU's lock.
const MIGRATION_RETRIES: usize = 3;

/// `repr(C)` with the lock first: the slot's address is its lock's, and (for the
/// restartable-sequence locks, whose `RseqLock` sits at the start of a `FencedLock` and of a
/// `PwLock`) its `RseqLock`'s, so that the owner's path computes one address for the data,
/// the lock and the guard.
#[repr(C)]
struct Slot<T, L> {
    lock: L,
    data: UnsafeCell<T>,
    /// The slot's CPU, for [`PerCpuGuard::cpu`].
    cpu: usize,
    /// Debug builds: the thread that holds `lock` through a guard (its
    /// [`thread_token`](crate::sync::thread_token), or `NO_THREAD`), so that a thread
    /// asking for a lock it holds gets [`Error::Reentrant`] instead of waiting for itself.
    #[cfg(all(debug_assertions, not(loom)))]
    holder: crate::sync::Unmodelled64,
    /// Debug builds: where the holder took it.
    #[cfg(all(debug_assertions, not(loom)))]
    held_at: crate::sync::UnmodelledLocation,
}

impl<T, L> Slot<T, L> {
    /// The requester's check, in every build: [`Error::Reentrant`] if the calling thread holds
    /// this slot's lock through a requester's guard (recorded in the thread's list,
    /// `held.rs`), or, in debug builds, through any guard.
    #[inline(always)]
    #[track_caller]
    fn not_held_here(&self, cpu: usize) -> Result<()> {
        if let Some(held_at) = crate::held::held_at(self.key()) {
            return Err(reentrant(cpu, held_at));
        }
        self.not_held_here_debug(cpu)
    }

    /// The owner's check: [`Error::Reentrant`] if the calling thread holds this slot's lock
    /// through a guard, in debug builds; always `Ok` in release builds, where the owner's path
    /// (`lock_local`, [`BoundSlot::lock`]) looks at no record, so that it costs what it did.
    #[inline(always)]
    #[track_caller]
    fn not_held_here_debug(&self, cpu: usize) -> Result<()> {
        #[cfg(all(debug_assertions, not(loom)))]
        if self.holder.load(crate::sync::Ordering::Relaxed) == crate::sync::thread_token() {
            let held = self.held_at.load(crate::sync::Ordering::Relaxed);
            // SAFETY: `held_at` only ever holds null or a `&'static Location` stored by
            // `PerCpuGuard::new`, which lives for the whole program.
            let held_at = unsafe { held.as_ref() }.unwrap_or(std::panic::Location::caller());
            return Err(reentrant(cpu, held_at));
        }
        let _ = cpu;
        Ok(())
    }

    /// What the thread's list of held locks knows this slot's lock by: its address.
    #[inline(always)]
    fn key(&self) -> usize {
        &self.lock as *const L as usize
    }
}

/// The refusal of a request, at the caller's location, for a lock held since `held_at`.
#[cold]
#[track_caller]
fn reentrant(cpu: usize, held_at: &'static std::panic::Location<'static>) -> Error {
    Error::Reentrant {
        cpu,
        held_at,
        asked_at: std::panic::Location::caller(),
    }
}

/// Per-CPU state: a `T` for every CPU of the instance it was made from, each behind that CPU's
/// lock (the kernel's `DEFINE_PER_CPU` data with its `local_lock_t`/`pw_lock_t`).
///
/// - [`lock_local`](Self::lock_local) takes the calling thread's own CPU (`pw_lock_local`);
/// - [`lock`](Self::lock) takes a named CPU (`pw_lock(l, cpu)`): from anywhere when that CPU is
///   in remote mode, only from that CPU's own threads when it is in queue mode;
/// - [`lock_work`](Self::lock_work) takes the CPU a work item runs for
///   (`pw_lock(l, pw_get_cpu(w))`), wherever the work runs;
/// - [`for_each_locked`](Self::for_each_locked) walks every CPU under its lock, for summaries;
/// - [`read_each`](Self::read_each) reads every CPU's slot under its lock, whatever the lock,
///   for final sums;
/// - [`bound_slot`](Self::bound_slot) looks a bound thread's slot up once, for hot loops that
///   take it again and again ([`BoundSlot::lock`]).
///
/// A handle: clones are cheap (three reference counts) and share the slots, so the state can
/// be moved into work items without an `Arc` around it.
///
/// ```
/// use qpw_core::{CpuSpec, Policy, Qpw};
///
/// let qpw = Qpw::builder().cpus(CpuSpec::Logical(2)).policy(Policy::Remote).build()?;
/// let counters = qpw.per_cpu(|_cpu| 0u64);
/// *counters.lock(1)? += 5; // remote mode: any thread may take cpu 1's lock
/// let mut total = 0;
/// counters.for_each_locked(|_cpu, n| total += *n);
/// assert_eq!(total, 5);
/// # Ok::<(), qpw_core::Error>(())
/// ```
pub struct PerCpu<T, L: RawLocalLock = PwLock> {
    inner: Arc<Inner>,
    /// Shared by the clones. A slice `Arc` points straight at its elements, so reaching a slot
    /// costs no more dependent loads than a `Box` did. A std `Arc` under loom too: loom's
    /// cannot hold a slice, and the count is no protocol of ours.
    slots: SharedSlots<T, L>,
    /// The first slot of `slots`, so that the owner's path finds slot `idx` with one shift and
    /// one add (the slice's start is 128 bytes into its `Arc`'s allocation, one more add).
    first: std::ptr::NonNull<CachePadded<Slot<T, L>>>,
    /// `lock_local`'s hot path reads these here rather than through `inner`, one pointer
    /// hop fewer on every call (each hop is a dependent load).
    local: LocalIndex,
}

type SharedSlots<T, L> = std::sync::Arc<[CachePadded<Slot<T, L>>]>;

impl<T, L: RawLocalLock> Clone for PerCpu<T, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            slots: self.slots.clone(),
            first: self.first,
            local: self.local.clone(),
        }
    }
}

/// What `lock_local` needs to turn the calling thread into a slot index.
#[derive(Clone)]
struct LocalIndex {
    /// The instance's id, to recognise the thread's binding.
    id: u64,
    /// Whether the CPUs are logical (then an unbound thread has none).
    logical: bool,
    /// CPU id to slot index (`u32::MAX`: not managed).
    index: std::sync::Arc<[u32]>,
    /// The managed CPUs are `0..n`: the slot index is the CPU, no table look-up (one
    /// dependent load fewer).
    identity: bool,
}

// SAFETY: the `T`s are only reached through a guard, which holds the slot's lock, so a `&PerCpu`
// shared between threads hands each `T` to one thread at a time: like `Mutex<T>`, that needs
// `T: Send` and no more.
unsafe impl<T: Send, L: RawLocalLock> Sync for PerCpu<T, L> {}
// SAFETY: moving the whole `PerCpu` moves the `T`s with it, which `T: Send` allows; `L` is
// `Send` by its trait bound.
unsafe impl<T: Send, L: RawLocalLock> Send for PerCpu<T, L> {}

impl<T, L: RawLocalLock> fmt::Debug for PerCpu<T, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerCpu")
            .field("cpus", &self.inner.managed)
            .finish_non_exhaustive()
    }
}

impl<T, L: RawLocalLock> PerCpu<T, L> {
    pub(crate) fn new(inner: Arc<Inner>, mut init: impl FnMut(usize) -> T) -> Self {
        let slots = inner
            .managed
            .iter()
            .zip(inner.phys.iter().zip(&inner.modes))
            .map(|(cpu, (&phys, &mode))| {
                CachePadded::new(Slot {
                    lock: L::for_cpu_in(phys, mode),
                    data: UnsafeCell::new(init(cpu)),
                    cpu,
                    #[cfg(all(debug_assertions, not(loom)))]
                    holder: crate::sync::Unmodelled64::new(crate::sync::NO_THREAD),
                    #[cfg(all(debug_assertions, not(loom)))]
                    held_at: crate::sync::UnmodelledLocation::new(std::ptr::null_mut()),
                })
            })
            .collect();
        let mut index = vec![u32::MAX; inner.managed.last().map_or(0, |c| c + 1)];
        for (idx, cpu) in inner.managed.iter().enumerate() {
            // Slot counts are bounded by `CpuSet::MAX_CPU`, far below `u32::MAX`.
            index[cpu] = idx as u32;
        }
        let identity = index
            .iter()
            .enumerate()
            .all(|(cpu, &idx)| idx as usize == cpu);
        let local = LocalIndex {
            id: inner.id,
            logical: inner.logical,
            index: index.into(),
            identity,
        };
        let slots: SharedSlots<T, L> = slots;
        Self {
            inner,
            first: std::ptr::NonNull::from(&slots[..]).cast(),
            slots,
            local,
        }
    }

    /// The CPUs with a slot.
    pub fn cpus(&self) -> &CpuSet {
        &self.inner.managed
    }

    /// Locks the calling thread's CPU (`pw_lock_local`). A thread bound with
    /// [`Qpw::bind_current`](crate::Qpw::bind_current) uses its binding; an unbound thread of a
    /// physical instance uses the CPU it runs on now (read from its rseq area, else
    /// `sched_getcpu`), which it may leave the next instant: correctness does not depend on
    /// it, since the lock is real either way.
    ///
    /// A bound thread's call reads its slot index and rseq area from its registration (a few
    /// loads relative to the thread pointer), then takes a restartable-sequence lock with one
    /// sequence and releases it with another, or a [`FairLock`](crate::FairLock) with its two
    /// compare-and-swaps; everything else (an unbound thread's look-up, a busy lock, a thread
    /// that migrated) is out of line. `tests/owner_path` counts what one call executes.
    // Always inlined: out of line, the call returns the large `Result` through memory, which
    // costs more than a restartable-sequence lock itself (measured: about 2x the whole path).
    #[inline(always)]
    #[track_caller]
    pub fn lock_local(&self) -> Result<PerCpuGuard<'_, T, L>> {
        let (slot, owned) = 'taken: {
            if let Some(here) = crate::instance::bound_here(self.local.id) {
                let slot = self.slot_at_scaled(here.scaled);
                slot.not_held_here_debug(slot.cpu)?;
                match slot.lock.as_rseq() {
                    Some(rseq) => {
                        // The owner's fast path: one sequence, with the area in hand.
                        let path = crate::rseq_lock::OwnerPath::new(rseq, here.area());
                        if path.try_take() {
                            break 'taken (slot, Taken::Path(path));
                        }
                    }
                    // Any other lock: its own fast path (a `FairLock`'s compare-and-swap).
                    None if slot.lock.lock_on_current_cpu() == LocalAttempt::Locked => {
                        break 'taken (slot, Taken::Plain)
                    }
                    None => {}
                }
            }
            // Everything else, and every error, in one call with no argument to set up (an
            // unbound thread's fast path, where it runs now, included): the caller's `Result`
            // is then made in one place on each way out.
            let (slot, how) = self.lock_local_slow()?;
            (slot, how.taken())
        };
        // The guard is made here, not in the call, so that on every way out the
        // compiler sees how it will be released: the drop's tests then fold away, and the
        // owner's release stays inline.
        Ok(match owned {
            Taken::Path(path) => PerCpuGuard::owned(slot, path.area()),
            Taken::Area(area) => PerCpuGuard::owned(slot, area),
            Taken::Plain => PerCpuGuard::plain(slot),
            Taken::Slow => PerCpuGuard::new(slot),
        })
    }

    /// `lock_local` when a bound thread's first try did not take the lock, and for a thread
    /// that is not bound to this instance. A bound thread's slot's lock is taken by the lock's
    /// own slow path from where the first try left it (after a restartable sequence's miss,
    /// what `lock_on_current_cpu` does after its first try). An unbound thread's slot is the
    /// one of the CPU it runs on now (physical instances; else the error), taken as a bound
    /// thread's is: the owner's fast path with the thread's area, or the lock's own; then its
    /// slow path. When the thread turns out to run elsewhere than the CPU it read or is bound
    /// to (only a lock that checks where the thread runs, such as
    /// [`RseqLock`](crate::RseqLock), says so), [`lock_local_migrated`]
    /// (Self::lock_local_migrated). Returns the slot whose lock the caller now holds, and how
    /// to release it. Out of line, so that a bound thread's fast path keeps no register for
    /// it; an unbound thread's release stays inline.
    #[inline(never)]
    #[track_caller]
    fn lock_local_slow(&self) -> Result<(&Slot<T, L>, Unbound)> {
        let (slot, attempt) = match crate::instance::bound_here(self.local.id) {
            // Bound: the fast path's first try missed.
            Some(here) => {
                let slot: &Slot<T, L> = &self.slots[here.idx()];
                match slot.lock.as_rseq() {
                    Some(rseq) => (slot, rseq.acquire_slow(true)),
                    None => (slot, slot.lock.lock_on_current_cpu()),
                }
            }
            None => {
                let here = self.here().ok_or_else(|| self.unbound())?;
                let slot = self.slot_at(here.idx());
                slot.not_held_here_debug(slot.cpu)?;
                match slot.lock.as_rseq() {
                    Some(rseq) => {
                        let path = crate::rseq_lock::OwnerPath::new(rseq, here.area());
                        if path.try_take() {
                            return Ok((slot, Unbound::sequence(here.area())));
                        }
                        (slot, rseq.acquire_slow(true))
                    }
                    None => match slot.lock.lock_on_current_cpu() {
                        LocalAttempt::Locked => return Ok((slot, Unbound::PLAIN)),
                        elsewhere => (slot, elsewhere),
                    },
                }
            }
        };
        if attempt == LocalAttempt::Locked {
            return Ok((slot, Unbound::SLOW));
        }
        Ok((self.lock_local_migrated()?, Unbound::SLOW))
    }

    /// `lock_local` after the thread turned out to run elsewhere than the CPU it read: take
    /// the new CPU's lock instead, and return its slot, whose lock the caller now holds. A
    /// thread that keeps moving (or is bound to a CPU it no longer runs on) ends with a plain
    /// `lock`, which such a lock takes from anywhere, only more slowly.
    #[cold]
    #[inline(never)]
    #[track_caller]
    fn lock_local_migrated(&self) -> Result<&Slot<T, L>> {
        let mut idx = self.here().ok_or_else(|| self.unbound())?.idx();
        for _ in 1..MIGRATION_RETRIES {
            let slot = &self.slots[idx];
            if slot.lock.lock_on_current_cpu() == LocalAttempt::Locked {
                return Ok(slot);
            }
            idx = self.here().ok_or_else(|| self.unbound())?.idx();
        }
        // The owner's call still: no record looked at or added, as on the fast path.
        let slot = &self.slots[idx];
        slot.not_held_here_debug(slot.cpu)?;
        slot.lock.lock();
        Ok(slot)
    }

    /// Like [`lock_local`](Self::lock_local), but gives up at once (`Ok(None)`) when the lock is
    /// held (`pw_trylock_local`).
    #[inline]
    #[track_caller]
    pub fn try_lock_local(&self) -> Result<Option<PerCpuGuard<'_, T, L>>> {
        let slot = self.slot_at(self.here().ok_or_else(|| self.unbound())?.idx());
        // The owner's call: its guard is not recorded (a `try` never waits for itself anyway).
        Ok(if slot.lock.try_lock() {
            Some(PerCpuGuard::new(slot))
        } else {
            None
        })
    }

    /// Locks the CPU a work item runs for (`pw_lock(l, pw_get_cpu(w))`): in queue mode that is
    /// the worker's own CPU, in remote mode the target CPU taken from the caller.
    ///
    /// Waits as long as the lock is held, except in a remote run under
    /// [`drain_all_timeout`](crate::PerCpuWork::drain_all_timeout): there it gives up at the
    /// drain's deadline with [`Error::LockStall`], which the drain reports for that CPU, and
    /// the run should return (`let Ok(mut slot) = state.lock_work(ctx) else { return };`).
    /// Taking a lock the same thread already holds (the caller of a remote run, or the run
    /// itself, twice) is [`Error::Reentrant`] (the run then reports it to its `queue_on` or
    /// drain): in every build when the hold is a requester's guard (`lock`, `try_lock`,
    /// `lock_work`, a walk), in debug builds only when it is the owner's (`lock_local`,
    /// `try_lock_local`, [`BoundSlot::lock`]), which a release build waits for, as a `Mutex`
    /// would, until the deadline, if there is one (the crate docs' "Lifecycle and failure").
    ///
    /// # Panics
    ///
    /// When `ctx` comes from a work item of another instance: a programming error, like the
    /// kernel's `WARN_ON(cpu != pw->cpu)`.
    #[inline]
    #[track_caller]
    pub fn lock_work(&self, ctx: &WorkCtx) -> Result<PerCpuGuard<'_, T, L>> {
        assert_eq!(
            ctx.instance, self.inner.id,
            "qpw: a work item locked per-CPU state of another instance"
        );
        let cpu = ctx.cpu();
        let idx = self
            .inner
            .idx(cpu)
            .expect("a work context's CPU is managed by its instance");
        let taken = match ctx.deadline() {
            None => self.acquire(idx, cpu),
            Some(limit) => self.acquire_until(idx, cpu, limit, ctx),
        };
        if let Err(e @ Error::Reentrant { .. }) = &taken {
            ctx.note_reentry(e.clone());
        }
        taken
    }

    /// `lock_work` under a drain's deadline.
    #[cold]
    #[track_caller]
    fn acquire_until(
        &self,
        idx: usize,
        cpu: usize,
        (start, timeout): (std::time::Instant, std::time::Duration),
        ctx: &WorkCtx,
    ) -> Result<PerCpuGuard<'_, T, L>> {
        let slot = &self.slots[idx];
        slot.not_held_here(cpu)?;
        let taken = match start.checked_add(timeout) {
            Some(deadline) => slot.lock.try_lock_until(deadline),
            None => {
                slot.lock.lock();
                true
            }
        };
        if taken {
            return Ok(PerCpuGuard::recorded(slot));
        }
        let waited = start.elapsed();
        ctx.note_stall(waited);
        Err(Error::LockStall {
            cpu,
            waited,
            timeout,
        })
    }

    /// Calls `f` on every CPU's slot in turn, each under its lock, taken from the calling
    /// thread: for final sums and reports, whatever the lock. With a lock that only its own
    /// CPU's threads should take ([`RseqLock`](crate::RseqLock)) each slot of another CPU
    /// costs a fence of that CPU (an inter-processor interrupt): correct, but not for hot
    /// paths, which is why such locks have no [`for_each_locked`](Self::for_each_locked).
    pub fn read_each(&self, mut f: impl FnMut(usize, &T)) {
        self.walk(|cpu, guard| f(cpu, &guard));
    }

    /// Takes every CPU's lock in turn for `f`, from the calling thread: the walk behind
    /// [`for_each_locked`](Self::for_each_locked) and [`read_each`](Self::read_each). Where
    /// two or more slots have a restartable-sequence lock (fenced mode), their requester's
    /// flags are all raised before the first is taken, the owners' answers are waited for
    /// together, and only the CPUs that did not answer are fenced (see
    /// [`fenced_lock`](crate::fenced_lock)); such a CPU's owner then waits from the raise
    /// until `f` is done with its slot. Other locks are taken one after another.
    fn walk(&self, mut f: impl FnMut(usize, PerCpuGuard<'_, T, L>)) {
        /// Locks taken ahead of the walk but not yet handed to `f`: released if `f` panics.
        struct Ahead<'s, T, L: RawLocalLock> {
            slots: &'s [CachePadded<Slot<T, L>>],
            taken: Vec<bool>,
        }
        impl<T, L: RawLocalLock> Drop for Ahead<'_, T, L> {
            fn drop(&mut self) {
                for (slot, taken) in self.slots.iter().zip(&self.taken) {
                    if *taken {
                        // SAFETY: taken by `take_flags` for this thread and not handed on.
                        unsafe { slot.lock.unlock() };
                    }
                }
            }
        }
        let fenced = self
            .slots
            .iter()
            .filter(|s| s.lock.as_rseq().is_some())
            .count();
        let mut ahead = Ahead {
            slots: &self.slots,
            taken: if fenced > 1 {
                let locks: Vec<_> = self.slots.iter().map(|s| s.lock.as_rseq()).collect();
                crate::rseq_lock::take_flags(&locks)
            } else {
                Vec::new()
            },
        };
        for (idx, cpu) in self.inner.managed.iter().enumerate() {
            let guard = match ahead.taken.get_mut(idx) {
                Some(taken) if *taken => {
                    *taken = false;
                    PerCpuGuard::recorded(&self.slots[idx])
                }
                _ => self
                    .acquire(idx, cpu)
                    .unwrap_or_else(|e| panic!("qpw: {e}")),
            };
            f(cpu, guard);
        }
    }

    /// The slot of the CPU `binding` bound the calling thread to, looked up once, so that
    /// [`BoundSlot::lock`] takes it with no look-up at all: what
    /// [`lock_local`](Self::lock_local) does on every call (the thread's binding from
    /// thread-local storage, the slot from it) is done here, once. For a pinned thread's hot
    /// loop, where that look-up is a large share of the cost (fenced mode's restartable
    /// sequence is a few cycles).
    ///
    /// [`Error::Unbound`] when `binding` is of another instance. The handle borrows the
    /// binding, so it cannot outlive it; while a newer binding of the same thread is in force
    /// (elsewhere), [`BoundSlot::lock`] still takes this CPU's slot, correctly, from wherever
    /// the thread runs.
    ///
    /// ```
    /// use qpw_core::{Policy, Qpw};
    ///
    /// let qpw = Qpw::with_policy(Policy::Fenced)?;
    /// let counters = qpw.per_cpu(|_cpu| 0u64);
    /// let cpu = qpw.cpus().first().unwrap();
    /// let binding = qpw.bind_current(cpu)?;
    /// let mine = counters.bound_slot(&binding)?;
    /// for _ in 0..1000 {
    ///     *mine.lock() += 1; // the owner's path: no look-up, a restartable sequence
    /// }
    /// assert_eq!(*counters.lock(cpu)?, 1000);
    /// # Ok::<(), qpw_core::Error>(())
    /// ```
    pub fn bound_slot<'a>(&'a self, binding: &'a crate::Binding) -> Result<BoundSlot<'a, T, L>> {
        if binding.instance != self.local.id {
            return Err(Error::Unbound {
                managed: self.inner.managed.clone(),
            });
        }
        let idx = self.inner.idx(binding.cpu)?;
        let slot: &Slot<T, L> = &self.slots[idx];
        // The binding is the calling thread's (it is `!Send`), and so is the area.
        let area = crate::rseq::owner_area();
        let at = std::ptr::NonNull::from(slot);
        let path = match slot.lock.as_rseq() {
            // The slot's lock is (or forwards to) a restartable-sequence lock at the slot's own
            // address (every one of this crate's is: `Slot` is `repr(C)` with the lock first,
            // and `RseqLock` is the first field of `FencedLock` and of `PwLock`'s fenced
            // variant; a unit test checks it): the path leads there, through a pointer to the
            // whole slot, which `lock` turns back into the slot.
            // SAFETY: the address of the live `RseqLock` that `as_rseq` gave, borrowed for
            // `'a` with the slot.
            Some(rseq) if std::ptr::addr_eq(rseq, slot) => unsafe {
                crate::rseq_lock::OwnerPath::at(at.cast(), area)
            },
            // Any other lock: a path that never takes, and `lock`'s second try.
            _ => crate::rseq_lock::OwnerPath::none(area),
        };
        Ok(BoundSlot {
            path,
            slot,
            cpu: binding.cpu,
            _not_send: PhantomData,
        })
    }

    /// Exclusive access to every slot, with no locking, when this is the only handle of the
    /// state (no clone of it is alive: `None` otherwise). For final accounting.
    pub fn iter_mut(&mut self) -> Option<impl Iterator<Item = (usize, &mut T)> + '_> {
        let slots = std::sync::Arc::get_mut(&mut self.slots)?;
        Some(
            self.inner
                .managed
                .iter()
                .zip(slots.iter_mut())
                .map(|(cpu, slot)| {
                    let ptr = slot.data.get_mut();
                    // SAFETY: `&mut` to the only handle of the slots excludes every guard and
                    // every other access to them.
                    (cpu, unsafe { &mut *(MutPtr::deref(&ptr) as *mut T) })
                }),
        )
    }

    /// Where the calling thread's slot is: its binding's, else where it runs now (physical
    /// instances). `None` when it has no CPU of this instance ([`unbound`](Self::unbound)
    /// says why).
    #[inline]
    fn here(&self) -> Option<crate::instance::Here> {
        if let Some(here) = crate::instance::bound_here(self.local.id) {
            return Some(here);
        }
        if self.local.logical {
            return None;
        }
        let cpu = crate::rseq::cpu_now()?;
        let idx = if self.local.identity && cpu < self.slots.len() {
            cpu
        } else {
            match self.local.index.get(cpu) {
                Some(&idx) if idx != u32::MAX => idx as usize,
                _ => return None,
            }
        };
        Some(crate::instance::Here::unbound(idx))
    }

    /// The slot whose index times [`SLOT_UNIT`](crate::instance::SLOT_UNIT) is `scaled`,
    /// which [`here`](Self::here) gave: one add for a slot of one unit.
    #[inline(always)]
    fn slot_at_scaled(&self, scaled: usize) -> &Slot<T, L> {
        let units = std::mem::size_of::<CachePadded<Slot<T, L>>>() / crate::instance::SLOT_UNIT;
        debug_assert!(scaled / crate::instance::SLOT_UNIT < self.slots.len());
        // SAFETY: as in `slot_at`, for the index `scaled / SLOT_UNIT` (a slot is `units`
        // whole units long: its size is a multiple of its alignment, itself a multiple of
        // `SLOT_UNIT`).
        unsafe { self.first.byte_add(scaled * units).as_ref() }
    }

    /// The slot at index `idx`, which [`here`](Self::here) gave.
    #[inline(always)]
    fn slot_at(&self, idx: usize) -> &Slot<T, L> {
        debug_assert!(idx < self.slots.len());
        // SAFETY: (1) `here` gives either an index it checked against this state's table, or
        // the index of the calling thread's registration with this state's instance (its id
        // is unique in the process: `sync::next_instance_id`), which the instance computed for
        // one of its managed CPUs (`Inner::idx`, or a worker's own); this state has one slot
        // per managed CPU of that instance, in order (`PerCpu::new`), so it is in bounds.
        // (2) `first` points to the first slot of `slots`, an allocation this handle keeps
        // alive and never moves.
        unsafe { self.first.add(idx).as_ref() }
    }

    #[cold]
    fn unbound(&self) -> Error {
        self.inner.caller_error()
    }

    /// The requester's acquisition (`lock`, `lock_work`, the walks): refused if the calling
    /// thread holds the lock already, and recorded as held by it.
    #[inline]
    #[track_caller]
    fn acquire(&self, idx: usize, cpu: usize) -> Result<PerCpuGuard<'_, T, L>> {
        let slot = &self.slots[idx];
        slot.not_held_here(cpu)?;
        slot.lock.lock();
        Ok(PerCpuGuard::recorded(slot))
    }

    /// The slot index of `cpu`, checking that the caller may take its lock.
    #[inline]
    fn remote_idx(&self, cpu: usize) -> Result<usize> {
        let idx = self.inner.idx(cpu)?;
        if self.inner.modes[idx] == Mode::Queue && self.inner.current_cpu() != Some(cpu) {
            return Err(self.not_local(cpu));
        }
        Ok(idx)
    }

    #[cold]
    fn not_local(&self, cpu: usize) -> Error {
        Error::NotLocal {
            cpu,
            caller: self.inner.current_cpu().or_else(|| {
                (!self.inner.logical)
                    .then(crate::affinity::current_cpu)
                    .flatten()
            }),
        }
    }
}

impl<T, L: RawRemoteLock> PerCpu<T, L> {
    /// Locks `cpu`'s slot (`pw_lock(l, cpu)`). In remote mode any thread may; in queue mode only
    /// that CPU's own threads (its worker, threads bound to it, or an unbound thread running on
    /// it), and anyone else gets [`Error::NotLocal`]: in queue mode, other CPUs' state is
    /// reached by queuing work, not by locking.
    #[inline]
    #[track_caller]
    pub fn lock(&self, cpu: usize) -> Result<PerCpuGuard<'_, T, L>> {
        let idx = self.remote_idx(cpu)?;
        self.acquire(idx, cpu)
    }

    /// Like [`lock`](Self::lock), but gives up at once (`Ok(None)`) when the lock is held
    /// (`pw_trylock`).
    #[inline]
    #[track_caller]
    pub fn try_lock(&self, cpu: usize) -> Result<Option<PerCpuGuard<'_, T, L>>> {
        let idx = self.remote_idx(cpu)?;
        let slot = &self.slots[idx];
        Ok(if slot.lock.try_lock() {
            Some(PerCpuGuard::recorded(slot))
        } else {
            None
        })
    }

    /// [`lock`](Self::lock) as it was before issue 31: no look at the thread's list of held
    /// locks and no entry in it (the debug builds' check stays). Not part of the API: the
    /// baseline that `benches/reentry.rs` measures `lock` against, in the same run.
    #[doc(hidden)]
    #[inline]
    #[track_caller]
    pub fn lock_unrecorded(&self, cpu: usize) -> Result<PerCpuGuard<'_, T, L>> {
        let idx = self.remote_idx(cpu)?;
        let slot = &self.slots[idx];
        slot.not_held_here_debug(cpu)?;
        slot.lock.lock();
        Ok(PerCpuGuard::new(slot))
    }

    /// Calls `f` on every CPU's slot in turn, each under its lock, from the calling thread,
    /// whatever the CPU's mode: the one sanctioned cross-CPU acquisition in queue mode, meant
    /// for summaries and accounting (what the kernel does with racy `per_cpu()` reads), not for
    /// hot paths.
    ///
    /// In fenced mode the walk raises every fenced CPU's flag before it takes the first lock
    /// and fences only the CPUs whose owners did not answer (see [`fenced_lock`](crate::fenced_lock)).
    pub fn for_each_locked(&self, mut f: impl FnMut(usize, &mut T)) {
        self.walk(|cpu, mut guard| f(cpu, &mut guard));
    }

    /// Calls `f` on every CPU's slot, each under its lock, as
    /// [`for_each_locked`](Self::for_each_locked) does, and collects what it returns, CPU by
    /// CPU: the shape of a metrics scrape (read a counter, take and reset it, clone a
    /// histogram to merge). No worker is woken in any mode; a CPU's owner waits only if it is
    /// inside its own critical section when the scrape comes (see the crate docs' "Which call
    /// for which job").
    ///
    /// ```
    /// use qpw_core::{CpuSpec, Policy, Qpw};
    ///
    /// let qpw = Qpw::builder().cpus(CpuSpec::Logical(2)).policy(Policy::Queue).build()?;
    /// let requests = qpw.per_cpu(|_cpu| 0u64);
    /// for cpu in 0..2 {
    ///     let _bound = qpw.bind_current(cpu)?;
    ///     *requests.lock_local()? += 10 + cpu as u64; // served on this CPU
    /// }
    /// // Take every CPU's count and reset it: what this scrape saw, and nothing twice.
    /// let taken = requests.take_each(|_cpu, n| std::mem::take(n));
    /// assert_eq!(taken, [(0, 10), (1, 11)]);
    /// assert_eq!(taken.iter().map(|(_, n)| n).sum::<u64>(), 21);
    /// assert_eq!(requests.take_each(|_cpu, n| *n), [(0, 0), (1, 0)]);
    /// # Ok::<(), qpw_core::Error>(())
    /// ```
    pub fn take_each<R>(&self, mut f: impl FnMut(usize, &mut T) -> R) -> Vec<(usize, R)> {
        let mut out = Vec::with_capacity(self.slots.len());
        self.walk(|cpu, mut guard| out.push((cpu, f(cpu, &mut guard))));
        out
    }
}

/// A bound thread's own slot, looked up once ([`PerCpu::bound_slot`]). Not `Send`: it belongs
/// to the thread whose binding found it.
pub struct BoundSlot<'a, T, L: RawLocalLock = PwLock> {
    /// The owner's fast path to the slot's lock, prepared once: the restartable-sequence lock
    /// the slot's lock is (or forwards to), at the slot's own address, and the thread's rseq
    /// area; or, for any other lock, a path that never takes, so that a fenced CPU's slot is
    /// taken without a test of the lock's kind.
    path: crate::rseq_lock::OwnerPath<'a>,
    slot: &'a Slot<T, L>,
    cpu: usize,
    _not_send: PhantomData<*const ()>,
}

impl<'a, T, L: RawLocalLock> BoundSlot<'a, T, L> {
    /// Locks the slot, as [`PerCpu::lock_local`] would for the bound thread, without the
    /// look-up. A thread that no longer runs on the slot's CPU (a newer binding elsewhere, or
    /// its pinning undone) takes the lock from where it is, as every lock allows (an
    /// [`RseqLock`](crate::RseqLock) or [`FencedLock`](crate::FencedLock) by fencing the CPU).
    ///
    /// On a fenced CPU (or with an [`RseqLock`](crate::RseqLock)) the uncontended call is one
    /// restartable sequence to take the lock and one to release it, with everything they need
    /// kept in the handle; with a [`FairLock`](crate::FairLock), its two compare-and-swaps.
    #[inline(always)]
    #[track_caller]
    pub fn lock(&self) -> PerCpuGuard<'a, T, L> {
        if let Err(e) = self.slot.not_held_here_debug(self.cpu) {
            panic!("qpw: {e}");
        }
        if self.path.try_take() {
            // SAFETY: a path that takes leads to the slot's lock, through a pointer to the
            // whole slot (`bound_slot`): the slot, borrowed for `'a`. (The same as
            // `self.slot`, without its load.)
            let slot = unsafe { &*self.path.lock_ptr().cast::<Slot<T, L>>() };
            return PerCpuGuard::owned(slot, self.path.area());
        }
        // A lock without restartable sequences (a `FairLock`): its own fast path, inline.
        if self.slot.lock.as_rseq().is_none() {
            if self.slot.lock.lock_on_current_cpu() != LocalAttempt::Locked {
                self.slot.lock.lock();
            }
            return PerCpuGuard::plain(self.slot);
        }
        PerCpuGuard::new(self.lock_missed())
    }

    /// `lock` when the first try did not take the lock (busy, or the thread runs elsewhere):
    /// the lock's slow path from there, then from wherever the thread runs. Out of line, so
    /// that the fast path keeps no register for it.
    #[cold]
    #[inline(never)]
    fn lock_missed(&self) -> &'a Slot<T, L> {
        let slot = self.slot;
        let taken = match slot.lock.as_rseq() {
            Some(rseq) => rseq.acquire_slow(true),
            None => slot.lock.lock_on_current_cpu(),
        };
        if taken != LocalAttempt::Locked {
            slot.lock.lock();
        }
        slot
    }

    /// The slot's CPU.
    pub fn cpu(&self) -> usize {
        self.cpu
    }
}

impl<T, L: RawLocalLock> fmt::Debug for BoundSlot<'_, T, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundSlot")
            .field("cpu", &self.cpu)
            .finish_non_exhaustive()
    }
}

/// Exclusive access to one CPU's slot, released on drop. Not `Send`: a lock is released by the
/// thread that took it.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct PerCpuGuard<'a, T, L: RawLocalLock = PwLock> {
    /// The slot, whose lock the guard holds.
    slot: &'a Slot<T, L>,
    /// How the drop releases the hold, decided where the guard is made: where the compiler
    /// sees it made (the owner's calls, inlined into the caller) the drop's `match` folds
    /// away; where the guard goes through memory (a `Result` kept until after the guard is
    /// dropped) it costs a store or two. Issue 31 counted the alternatives for the
    /// requester's mark, issue 42 those for the owner's releases (`tests/owner_path`;
    /// `docs/results.md`, 6e).
    release: Release,
    #[cfg(all(debug_assertions, not(loom)))]
    holder: &'a crate::sync::Unmodelled64,
    /// Under loom, the borrow of the data that loom tracks for as long as the guard lives.
    #[cfg(loom)]
    ptr: ManuallyDrop<MutPtr<T>>,
    _not_send: PhantomData<*const ()>,
}

/// How a [`PerCpuGuard`] releases its hold: decided where the guard is made, so that wherever
/// the compiler sees it made (the owner's calls, inlined) the drop's choice folds away.
#[derive(Debug, Clone, Copy)]
enum Release {
    /// The owner's fast path took a restartable-sequence lock: the release sequence, with the
    /// thread's area (no look-up of the area, no test of the lock's kind).
    Sequence(crate::rseq::Area),
    /// The owner's fast path took a lock without restartable sequences (a `FairLock`, alone or
    /// in a `PwLock`): its `unlock`, inline, with no test of the lock's kind.
    Plain,
    /// Anything else, out of line: an owner's hold taken by a slow path (`mark` 0), or a
    /// requester's, which leaves the thread's list of held locks (`held.rs`): `mark` is one
    /// more than the index of its entry there (0 if the list was full).
    Slow { mark: u32 },
}

/// How `lock_local_slow` took its lock, in one word beside the slot: `SLOW` (out of line),
/// `PLAIN` (a `FairLock`'s own fast path), or the address of the thread's rseq area (the
/// owner's fast path of an unbound thread; never 0 or 1).
#[derive(Debug, Clone, Copy)]
struct Unbound(*const u8);

impl Unbound {
    const SLOW: Unbound = Unbound(std::ptr::null());
    const PLAIN: Unbound = Unbound(std::ptr::without_provenance(1));

    fn sequence(area: crate::rseq::Area) -> Unbound {
        Unbound(area.as_ptr())
    }

    /// The case, as `lock_local`'s fast path ends.
    #[inline(always)]
    fn taken<'a>(self) -> Taken<'a> {
        match self.0.addr() {
            0 => Taken::Slow,
            1 => Taken::Plain,
            // SAFETY: the calling thread's area (`sequence`), made on this thread by the call
            // that returned it.
            _ => Taken::Area(unsafe { crate::rseq::Area::from_ptr(self.0) }),
        }
    }
}

/// How `lock_local`'s fast path ended (`Release`'s cases, before the guard is made).
enum Taken<'a> {
    Path(crate::rseq_lock::OwnerPath<'a>),
    /// As `Path`, for an unbound thread: the area the path had.
    Area(crate::rseq::Area),
    Plain,
    Slow,
}

impl<'a, T, L: RawLocalLock> PerCpuGuard<'a, T, L> {
    /// A requester's guard (`lock`, `try_lock`, `lock_work`, the walks): recorded in the
    /// thread's list of held locks until it is dropped.
    #[inline]
    #[track_caller]
    fn recorded(slot: &'a Slot<T, L>) -> Self {
        let mut guard = Self::new(slot);
        if let Some(entry) = crate::held::record(slot.key(), std::panic::Location::caller()) {
            // Entries are fewer than `held::CAPACITY`, far below `u32::MAX`.
            guard.release = Release::Slow {
                mark: entry as u32 + 1,
            };
        }
        guard
    }

    /// An owner's guard whose lock the owner's fast path took with the thread's `area`
    /// ([`OwnerPath::try_take`](crate::rseq_lock::OwnerPath::try_take) returned `true`):
    /// released by the same path.
    #[inline(always)]
    #[track_caller]
    fn owned(slot: &'a Slot<T, L>, area: crate::rseq::Area) -> Self {
        let mut guard = Self::new(slot);
        guard.release = Release::Sequence(area);
        guard
    }

    /// An owner's guard of a lock without restartable sequences (`as_rseq` is `None`), taken
    /// by the lock's own fast path: released by its `unlock`, inline.
    #[inline(always)]
    #[track_caller]
    fn plain(slot: &'a Slot<T, L>) -> Self {
        debug_assert!(slot.lock.as_rseq().is_none());
        let mut guard = Self::new(slot);
        guard.release = Release::Plain;
        guard
    }

    /// An owner's guard (`lock_local`, `try_lock_local`, `BoundSlot::lock`) released out of
    /// line (`Release::Slow`): recorded only in debug builds, by the slot.
    #[inline]
    #[track_caller]
    fn new(slot: &'a Slot<T, L>) -> Self {
        #[cfg(all(debug_assertions, not(loom)))]
        {
            slot.holder
                .store(crate::sync::thread_token(), crate::sync::Ordering::Relaxed);
            let at: *const std::panic::Location<'static> = std::panic::Location::caller();
            slot.held_at
                .store(at.cast_mut(), crate::sync::Ordering::Relaxed);
        }
        Self {
            slot,
            release: Release::Slow { mark: 0 },
            #[cfg(all(debug_assertions, not(loom)))]
            holder: &slot.holder,
            #[cfg(loom)]
            ptr: ManuallyDrop::new(slot.data.get_mut()),
            _not_send: PhantomData,
        }
    }

    /// The CPU whose slot this is (an associated function, so that it never hides a method of
    /// `T`).
    #[inline]
    pub fn cpu(this: &Self) -> usize {
        this.slot().cpu
    }

    /// The slot, borrowed for `'a`.
    #[inline(always)]
    fn slot(&self) -> &'a Slot<T, L> {
        self.slot
    }

    /// The data, for `deref` and `deref_mut`.
    #[inline(always)]
    fn data(&self) -> *mut T {
        #[cfg(not(loom))]
        {
            let ptr = self.slot().data.get_mut();
            // SAFETY: std's `MutPtr` tracks nothing: this is the cell's pointer, made a raw
            // pointer again at once.
            unsafe { MutPtr::deref(&ptr) as *mut T }
        }
        #[cfg(loom)]
        {
            // SAFETY: the guard holds the slot's lock (as in `deref`); loom tracks the borrow
            // through `ptr` for as long as the guard lives.
            unsafe { MutPtr::deref(&self.ptr) }
        }
    }
}

impl<T, L: RawLocalLock> Deref for PerCpuGuard<'_, T, L> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the slot's lock, so no other guard exists for this slot.
        unsafe { &*self.data() }
    }
}

impl<T, L: RawLocalLock> DerefMut for PerCpuGuard<'_, T, L> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only borrow through the guard.
        unsafe { &mut *self.data() }
    }
}

impl<T, L: RawLocalLock> Drop for PerCpuGuard<'_, T, L> {
    #[inline(always)]
    fn drop(&mut self) {
        // Under loom the borrow of the data ends before the unlock, so that loom sees the
        // access end inside the critical section.
        #[cfg(loom)]
        // SAFETY: the pointer is dropped exactly once, here, and never used again.
        unsafe {
            ManuallyDrop::drop(&mut self.ptr)
        };
        #[cfg(all(debug_assertions, not(loom)))]
        self.holder
            .store(crate::sync::NO_THREAD, crate::sync::Ordering::Relaxed);
        let lock = &self.slot().lock;
        match self.release {
            Release::Sequence(area) => {
                // SAFETY: made only by `PerCpuGuard::owned`, for a hold that the owner's fast
                // path took, with this area, on the restartable-sequence lock `as_rseq` gives
                // for this lock, which is always the same one for a given lock (its docs): so
                // it is `Some` here too, and the path rebuilt from it leads to the lock the
                // hold is on. Each guard releases its hold once, here.
                unsafe {
                    let rseq = lock.as_rseq().unwrap_unchecked();
                    crate::rseq_lock::OwnerPath::new(rseq, area).release();
                }
            }
            Release::Plain => match lock.as_rseq() {
                // SAFETY: made only by `PerCpuGuard::plain`, for a lock whose `as_rseq` is
                // `None`, which it always is for a given lock (its docs).
                Some(_) => unsafe { std::hint::unreachable_unchecked() },
                // SAFETY: the slot's lock, borrowed for `'a`; the guard was made only after it
                // was taken, and each guard releases the hold it was made for, once.
                None => unsafe { lock.unlock() },
            },
            // SAFETY: as above.
            Release::Slow { mark } => unsafe { Self::release_slow(self.slot, mark) },
        }
    }
}

impl<T, L: RawLocalLock> PerCpuGuard<'_, T, L> {
    /// The drop of a requester's guard (`mark` is not 0), and of a restartable-sequence lock
    /// taken by a slow path: out of line, so that the owner's drop stays small enough to
    /// inline. Its arguments are the guard's fields, not the guard, so that the guard need
    /// not go through memory for it.
    ///
    /// # Safety
    ///
    /// The caller's context holds `slot`'s lock, through a guard with this `mark`, and this
    /// releases it, once.
    #[inline(never)]
    unsafe fn release_slow(slot: &Slot<T, L>, mark: u32) {
        // A requester's guard leaves the thread's list.
        if mark != 0 {
            crate::held::forget(mark as usize - 1);
        }
        // SAFETY: the caller's premise.
        unsafe { slot.lock.unlock() };
    }
}

impl<T: fmt::Debug, L: RawLocalLock> fmt::Debug for PerCpuGuard<'_, T, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerCpuGuard")
            .field("cpu", &Self::cpu(self))
            .field("data", &**self)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::{CpuSpec, Policy, Qpw};

    #[test]
    fn each_slot_takes_its_cpus_protocol() {
        let qpw = Qpw::builder()
            .cpus(CpuSpec::Logical(3))
            .policy(Policy::FencedOn("1".parse().unwrap()))
            .build()
            .unwrap();
        let per_cpu = qpw.per_cpu(|cpu| cpu);
        let fenced: Vec<bool> = per_cpu.slots.iter().map(|s| s.lock.is_fenced()).collect();
        assert_eq!(fenced, [false, true, false]);
        // A fenced CPU is reached from anywhere, as a remote one is.
        assert_eq!(*per_cpu.lock(1).unwrap(), 1);
        assert!(per_cpu.lock(2).is_err(), "cpu 2 is in queue mode");
    }

    #[test]
    fn slots_sit_on_their_own_cache_lines() {
        let qpw = Qpw::builder()
            .cpus(CpuSpec::Logical(3))
            .policy(Policy::Remote)
            .build()
            .unwrap();
        let per_cpu = qpw.per_cpu(|_| 0u8);
        let a = &*per_cpu.slots[0] as *const Slot<u8, PwLock> as usize;
        let b = &*per_cpu.slots[1] as *const Slot<u8, PwLock> as usize;
        assert!(b - a >= 64, "slots {a:#x} and {b:#x} share a cache line");
        assert_eq!(
            std::mem::align_of::<CachePadded<Slot<u8, PwLock>>>() % 64,
            0
        );
    }

    #[test]
    fn a_bound_slot_is_its_cpus_slot_and_refuses_other_instances() {
        let qpw = Qpw::builder()
            .cpus(CpuSpec::Logical(2))
            .policy(Policy::Fenced)
            .build()
            .unwrap();
        let other = Qpw::builder()
            .cpus(CpuSpec::Logical(2))
            .policy(Policy::Fenced)
            .build()
            .unwrap();
        let per_cpu = qpw.per_cpu(|cpu| cpu * 10);
        let binding = qpw.bind_current(1).unwrap();
        let mine = per_cpu.bound_slot(&binding).unwrap();
        assert_eq!(mine.cpu(), 1);
        {
            let mut guard = mine.lock();
            assert_eq!(*guard, 10);
            *guard += 1;
            assert!(
                per_cpu.try_lock(1).unwrap().is_none(),
                "the bound slot's lock is held"
            );
        }
        assert_eq!(*per_cpu.lock(1).unwrap(), 11);
        let foreign = other.bind_current(0).unwrap();
        assert!(matches!(
            per_cpu.bound_slot(&foreign),
            Err(Error::Unbound { .. })
        ));
    }

    #[test]
    fn guard_reports_its_cpu_and_excludes() {
        let qpw = Qpw::builder()
            .cpus(CpuSpec::Logical(2))
            .policy(Policy::Remote)
            .build()
            .unwrap();
        let per_cpu = qpw.per_cpu(|cpu| cpu * 10);
        let guard = per_cpu.lock(1).unwrap();
        assert_eq!(PerCpuGuard::cpu(&guard), 1);
        assert_eq!(*guard, 10);
        assert!(per_cpu.try_lock(1).unwrap().is_none());
        assert!(per_cpu.try_lock(0).unwrap().is_some());
        drop(guard);
        assert!(per_cpu.try_lock(1).unwrap().is_some());
    }

    #[test]
    fn queue_mode_refuses_foreign_lockers() {
        let qpw = Qpw::builder()
            .cpus(CpuSpec::Logical(2))
            .policy(Policy::Queue)
            .build()
            .unwrap();
        let per_cpu = qpw.per_cpu(|_| 0u32);
        let err = per_cpu.lock(1).unwrap_err();
        assert!(
            matches!(
                err,
                Error::NotLocal {
                    cpu: 1,
                    caller: None
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("queue mode"));
        assert!(matches!(per_cpu.lock_local(), Err(Error::Unbound { .. })));

        let _bound = qpw.bind_current(1).unwrap();
        *per_cpu.lock(1).unwrap() += 1;
        *per_cpu.lock_local().unwrap() += 1;
        let err = per_cpu.lock(0).unwrap_err();
        assert!(
            matches!(
                err,
                Error::NotLocal {
                    cpu: 0,
                    caller: Some(1)
                }
            ),
            "{err}"
        );
        let err = per_cpu.lock(7).unwrap_err().to_string();
        assert_eq!(err, "cpu 7 is not in the managed set 0-1");
    }
}
