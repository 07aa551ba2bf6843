//! The owner-only policy (thread-per-core): each CPU's slot belongs to one thread, which
//! reaches it with no lock word at all and runs the work queued to its CPU itself.
//!
//! # The problem
//!
//! Every local lock so far pays for the possibility that two threads of one CPU interleave:
//! an atomic word ([`FairLock`](crate::FairLock)) or at least a restartable sequence
//! ([`RseqLock`](crate::RseqLock)). A thread-per-core design (Seastar's shards, one pinned
//! thread per CPU doing all of that CPU's work) removes the possibility instead: if one
//! thread owns the slot, nothing else ever touches it, and "queued work" is a message the owner
//! handles when it polls, between its own operations, the way a Seastar shard runs the
//! messages other shards `submit_to` it.
//!
//! # The mechanism
//!
//! - [`Qpw::owned_per_cpu`](crate::Qpw::owned_per_cpu) makes the state and hands out an
//!   [`OwnedPerCpu`], the `Clone + Send + Sync` handle anyone may hold (crossbeam-deque's
//!   `Stealer`).
//! - [`OwnedPerCpu::claim`] makes the calling thread the owner of one CPU's slot: it is bound
//!   to the CPU (pinned and registered, as [`Qpw::bind_current`](crate::Qpw::bind_current)
//!   does) and gets the [`Owner`] handle, which is neither `Send` nor `Sync` (crossbeam-deque's
//!   `Worker`). A second claim, from any thread, is [`Error::AlreadyOwned`] naming the owner.
//!   Dropping the `Owner` gives the slot up.
//! - The owner's access, [`Owner::lock_local`], checks that no work is waiting (one load of a
//!   flag that posts set), sets the slot's borrow flag (a `Cell`, only ever touched by the
//!   owning thread) and hands out a guard that clears it on drop: no atomic read-modify-write,
//!   no fence, no lock word. The flag exists for the second way into the slot, below.
//! - [`OwnedPerCpu::work`] makes a [`PerCpuWork`] whose runs for a CPU are posted to that
//!   CPU's *mailbox* instead of a worker thread. The owner runs what is waiting in
//!   [`Owner::poll`], and before every [`Owner::lock_local`]; inside a run,
//!   [`OwnedPerCpu::lock_work`] reaches the slot (it checks that the caller is the owner and
//!   that the slot is not borrowed). [`PerCpuWork::flush`] and
//!   [`PerCpuWork::flush_timeout`] work as in queue mode: a flush waits for the owner's next
//!   poll, and an owner that never polls is reported as [`Error::Stall`]. The owner itself
//!   cannot wait for its own poll: its flush of a run still in its mailbox (from a work item
//!   in a poll, or outside one) is [`Error::SelfFlush`].
//! - Any other thread's local access ([`OwnedPerCpu::lock_local`], `lock_work`) is
//!   [`Error::NotOwner`] naming the owner, never undefined behaviour.
//! - [`Qpw::shutdown`](crate::Qpw::shutdown) (or dropping the `Qpw`) closes the mailboxes
//!   as it stops the workers: a post from then on is [`Error::ShutDown`]. Items posted before
//!   still run at their owner's next poll (no worker exists to run them), and the
//!   [`ShutdownReport`](crate::ShutdownReport) counts them in `left_for_owners`.
//!
//! What it costs: the owner's access is a flag load, a flag store and the data; a posted item
//! waits for the owner's next poll, which is as long as the owner chooses to go without
//! polling (the same latency as a queue-mode worker that cannot get the CPU, but now under the
//! application's control rather than the scheduler's).

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};

use crossbeam_utils::CachePadded;

use crate::instance::{Binding, Inner};
use crate::sync::{
    thread_token, Arc, AtomicBool, AtomicU64, MutPtr, Mutex, Ordering, SharedFn, UnsafeCell,
};
use crate::work::Worker;
use crate::{CpuSet, Error, PerCpuWork, Result, WorkCtx};

/// No owner.
const NOBODY: u64 = crate::sync::NO_THREAD;

/// How an error names the calling thread.
fn thread_label(token: u64) -> String {
    #[cfg(not(loom))]
    if let Some(name) = std::thread::current().name() {
        return format!("{name:?} (#{token})");
    }
    format!("#{token}")
}

struct OwnedSlot<T> {
    cpu: usize,
    /// The owning thread's token, or `NOBODY`.
    owner: AtomicU64,
    /// The owner's label, for errors.
    owner_label: Mutex<String>,
    /// Whether a guard of the slot is alive (0 or 1). Touched only by the owning thread. A
    /// word rather than a `bool`: on the development machine (AMD EPYC) a byte flag stored and
    /// re-read on every access cost the owner's path 1.6 ns instead of 0.7 ns, apparently by
    /// defeating the CPU's zero-latency forwarding of a store to the next load.
    borrowed: Cell<usize>,
    data: UnsafeCell<T>,
    /// Where the CPU's work is posted; the owner empties it.
    mailbox: crate::sync::Arc<Worker>,
}

struct Shared<T> {
    inner: Arc<Inner>,
    slots: Box<[CachePadded<OwnedSlot<T>>]>,
}

// SAFETY: (1) `data` is reached only through an `OwnedGuard`, which exists only on the owning
// thread while `borrowed` is set, so a `&Shared` hands each `T` to one thread at a time: like
// `Mutex<T>`, that needs `T: Send`; (2) `borrowed` is a `Cell` read and written only by the
// thread whose token is in `owner` (the `Owner` handle is `!Send`; the shared handle's paths
// compare `owner` with the caller's token first), and ownership passes between threads only
// through `owner`'s release store and acquire compare-and-swap, which orders the old owner's
// accesses before the new one's; (3) everything else is `Sync` already.
unsafe impl<T: Send> Sync for Shared<T> {}
// SAFETY: moving the state moves the `T`s, which `T: Send` allows; no thread-bound data lives
// in a slot while no guard exists (the flag is plain data).
unsafe impl<T: Send> Send for Shared<T> {}

/// Owner-only per-CPU state: the handle any thread may hold. See the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use qpw_core::{CpuSpec, Error, Policy, Qpw};
///
/// let qpw = Qpw::builder().cpus(CpuSpec::Logical(2)).policy(Policy::Queue).build()?;
/// let stock = qpw.owned_per_cpu(|_cpu| 0u64)?;
/// let s = stock.clone();
/// let drain = stock.work(move |ctx| *s.lock_work(ctx).expect("run by the owner") = 0)?;
///
/// let mut owner = stock.claim(1)?; // this thread now owns cpu 1
/// *owner.lock_local()? += 64; // no lock word: a borrow flag
/// assert!(matches!(stock.claim(1), Err(Error::AlreadyOwned { cpu: 1, .. })));
///
/// drain.queue_on(1)?; // posted to cpu 1's mailbox...
/// // ... which only this thread runs: it must not wait for itself.
/// assert_eq!(drain.flush(1), Err(Error::SelfFlush { cpu: 1 }));
/// std::thread::scope(|scope| {
///     // Another thread waits for the owner's next poll, and stalls without it.
///     let stall = scope.spawn(|| drain.flush_timeout(1, Duration::from_millis(1)));
///     assert!(matches!(stall.join().unwrap(), Err(Error::Stall { cpu: 1, .. })));
/// });
/// assert_eq!(owner.poll(), 1); // ... and run here, by the owner, when it polls
/// drain.flush(1)?;
/// assert_eq!(*owner.lock_local()?, 0);
/// # Ok::<(), qpw_core::Error>(())
/// ```
pub struct OwnedPerCpu<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Clone for OwnedPerCpu<T> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<T> fmt::Debug for OwnedPerCpu<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedPerCpu")
            .field("cpus", &self.shared.inner.managed)
            .finish_non_exhaustive()
    }
}

impl<T> OwnedPerCpu<T> {
    pub(crate) fn new(inner: Arc<Inner>, mut init: impl FnMut(usize) -> T) -> Self {
        let slots: Box<[CachePadded<OwnedSlot<T>>]> = inner
            .managed
            .iter()
            .zip(&inner.phys)
            .map(|(cpu, &phys)| {
                CachePadded::new(OwnedSlot {
                    cpu,
                    owner: AtomicU64::new(NOBODY),
                    owner_label: Mutex::new(String::new()),
                    borrowed: Cell::new(0),
                    data: UnsafeCell::new(init(cpu)),
                    mailbox: Worker::mailbox(cpu, phys),
                })
            })
            .collect();
        inner
            .workers
            .adopt_mailboxes(slots.iter().map(|slot| slot.mailbox.clone()));
        Self {
            shared: Arc::new(Shared { inner, slots }),
        }
    }

    /// The CPUs with a slot.
    pub fn cpus(&self) -> &CpuSet {
        &self.shared.inner.managed
    }

    /// Makes the calling thread the owner of `cpu`'s slot, binding it to `cpu` (pinned and
    /// registered). [`Error::AlreadyOwned`] if the slot has an owner.
    pub fn claim(&self, cpu: usize) -> Result<Owner<T>> {
        let idx = self.shared.inner.idx(cpu)?;
        let slot = &self.shared.slots[idx];
        let token = thread_token();
        if slot
            .owner
            .compare_exchange(NOBODY, token, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(Error::AlreadyOwned {
                cpu,
                owner: self.owner_label(slot).unwrap_or_else(|| "(leaving)".into()),
            });
        }
        *lock(&slot.owner_label) = thread_label(token);
        match self.shared.inner.bind_current(cpu) {
            Ok(binding) => Ok(Owner {
                _runner: Worker::runner_scope(&slot.mailbox, token),
                _shared: self.shared.clone(),
                slot: std::ptr::NonNull::from(&**slot),
                posted: std::ptr::NonNull::from(slot.mailbox.posted_flag()),
                _binding: ManuallyDrop::new(binding),
                _not_send: PhantomData,
            }),
            Err(e) => {
                slot.owner.store(NOBODY, Ordering::Release);
                Err(e)
            }
        }
    }

    /// The owner of `cpu`'s slot, as errors name it, if it has one.
    pub fn owner_of(&self, cpu: usize) -> Result<Option<String>> {
        let idx = self.shared.inner.idx(cpu)?;
        Ok(self.owner_label(&self.shared.slots[idx]))
    }

    fn owner_label(&self, slot: &OwnedSlot<T>) -> Option<String> {
        (slot.owner.load(Ordering::Acquire) != NOBODY).then(|| lock(&slot.owner_label).clone())
    }

    /// A per-CPU work item whose runs for a CPU are posted to that CPU's mailbox and run by
    /// its owner when it polls ([`Owner::poll`], or before [`Owner::lock_local`]). Queue,
    /// flush and drain it as any [`PerCpuWork`]; a flush waits for the owner's next poll.
    pub fn work<F>(&self, func: F) -> Result<PerCpuWork>
    where
        F: Fn(&WorkCtx) + Send + Sync + 'static,
    {
        let mailboxes: Vec<_> = self
            .shared
            .slots
            .iter()
            .map(|slot| slot.mailbox.clone())
            .collect();
        Ok(PerCpuWork::with_mailboxes(
            self.shared.inner.clone(),
            SharedFn::new(func),
            &mailboxes,
        ))
    }

    /// The slot a work item runs for, from inside the run (which happens on the owner, in its
    /// poll). [`Error::NotOwner`] from any other thread, [`Error::AlreadyBorrowed`] if the
    /// slot is borrowed already.
    ///
    /// # Panics
    ///
    /// When `ctx` comes from a work item of another instance, as [`PerCpu::lock_work`](crate::PerCpu::lock_work).
    pub fn lock_work(&self, ctx: &WorkCtx) -> Result<OwnedGuard<'_, T>> {
        assert_eq!(
            ctx.instance, self.shared.inner.id,
            "qpw: a work item locked per-CPU state of another instance"
        );
        let idx = self.shared.inner.idx(ctx.cpu())?;
        self.borrow_as_owner(idx)
    }

    /// The calling thread's own CPU's slot, which it must own ([`Error::NotOwner`] names the
    /// owner otherwise). The owner normally uses [`Owner::lock_local`], which also runs the
    /// pending work; this is for code that holds only the shared handle.
    pub fn lock_local(&self) -> Result<OwnedGuard<'_, T>> {
        let inner = &self.shared.inner;
        let cpu = inner.current_cpu().ok_or_else(|| inner.caller_error())?;
        let idx = inner.idx(cpu)?;
        self.borrow_as_owner(idx)
    }

    /// Calls `f` on every CPU's slot in turn, from the calling thread, while no other thread
    /// owns it: for final sums once the owners are gone (or before they came), without
    /// tearing anything down. Takes every slot for the duration (a claim made meanwhile gets
    /// [`Error::AlreadyOwned`]); fails with [`Error::AlreadyOwned`] naming the owner, before
    /// calling `f` at all, if another thread owns a slot. The caller's own slots are read too,
    /// unless one is borrowed ([`Error::AlreadyBorrowed`]).
    pub fn read_each(&self, mut f: impl FnMut(usize, &T)) -> Result<()> {
        let me = thread_token();
        let slots = &self.shared.slots;
        // Take every slot that has no owner; the first owned by someone else ends it.
        let mut taken = Vec::with_capacity(slots.len());
        let mut refused = None;
        for (idx, slot) in slots.iter().enumerate() {
            match slot
                .owner
                .compare_exchange(NOBODY, me, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => taken.push(idx),
                Err(owner) if owner == me => {
                    if slot.borrowed.get() != 0 {
                        refused = Some(Error::AlreadyBorrowed { cpu: slot.cpu });
                        break;
                    }
                }
                Err(_) => {
                    refused = Some(Error::AlreadyOwned {
                        cpu: slot.cpu,
                        owner: self.owner_label(slot).unwrap_or_else(|| "(leaving)".into()),
                    });
                    break;
                }
            }
        }
        if refused.is_none() {
            for slot in slots.iter() {
                let ptr = slot.data.get_mut();
                // SAFETY: every slot is now owned by this thread (taken above, or its own and
                // not borrowed, so no guard of it is alive), so nothing else reaches the data
                // until the owner field is given back below; the acquire CAS ordered the
                // previous owner's accesses before this read.
                f(slot.cpu, unsafe { MutPtr::deref(&ptr) });
            }
        }
        for idx in taken {
            // Release: our reads happen before the next owner's claim.
            slots[idx].owner.store(NOBODY, Ordering::Release);
        }
        refused.map_or(Ok(()), Err)
    }

    fn borrow_as_owner(&self, idx: usize) -> Result<OwnedGuard<'_, T>> {
        let slot = &self.shared.slots[idx];
        // Relaxed: only this thread can have stored its own token there.
        if slot.owner.load(Ordering::Relaxed) != thread_token() {
            return Err(Error::NotOwner {
                cpu: slot.cpu,
                owner: self.owner_label(slot),
            });
        }
        OwnedGuard::new(slot)
    }
}

/// The owning thread's handle on one CPU's slot, from [`OwnedPerCpu::claim`]. Neither `Send`
/// nor `Sync`: it is the owning thread's. Dropping it gives the slot up and unbinds the thread.
pub struct Owner<T> {
    /// Keeps the slots (and `slot`, `posted`) alive.
    _shared: Arc<Shared<T>>,
    /// `&shared.slots[idx]`, kept so that the hot path does not walk `shared` (each hop is a
    /// dependent load). Valid as long as `shared` is: the slots are a boxed slice that is
    /// never reallocated.
    slot: std::ptr::NonNull<OwnedSlot<T>>,
    /// The slot's mailbox's posted flag, kept for the same reason.
    posted: std::ptr::NonNull<AtomicBool>,
    /// Makes the mailbox know this thread as the one that runs it, until the owner goes.
    _runner: crate::work::RunnerScope,
    _binding: ManuallyDrop<Binding>,
    _not_send: PhantomData<*const ()>,
}

impl<T> fmt::Debug for Owner<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Owner")
            .field("cpu", &self.cpu())
            .finish_non_exhaustive()
    }
}

impl<T> Owner<T> {
    #[inline(always)]
    fn slot(&self) -> &OwnedSlot<T> {
        // SAFETY: `slot` points into `self.shared.slots`, which `self.shared` keeps alive and
        // never moves (a boxed slice inside an `Arc`), and through which only shared
        // references are made.
        unsafe { self.slot.as_ref() }
    }

    /// The CPU whose slot this is.
    pub fn cpu(&self) -> usize {
        self.slot().cpu
    }

    /// The slot, after running any work waiting for it: no lock word, a borrow flag.
    /// [`Error::AlreadyBorrowed`] only if a guard of the slot was leaked.
    #[inline(always)]
    pub fn lock_local(&mut self) -> Result<OwnedGuard<'_, T>> {
        // SAFETY: `posted` points into the slot's mailbox, which the slot (kept alive by
        // `_shared`) holds an `Arc` of for its whole life.
        if unsafe { self.posted.as_ref() }.load(Ordering::Acquire) {
            self.poll();
        }
        OwnedGuard::new(self.slot())
    }

    /// The slot, without looking for waiting work first (that is left to the next
    /// [`poll`](Self::poll) or [`lock_local`](Self::lock_local)): the owner-only access at its
    /// cheapest, a borrow flag and the data. In a loop of such accesses the compiler may keep
    /// the data in registers, which the atomic look at the mailbox in `lock_local` prevents.
    /// [`Error::AlreadyBorrowed`] only if a guard of the slot was leaked.
    #[inline(always)]
    pub fn borrow(&mut self) -> Result<OwnedGuard<'_, T>> {
        OwnedGuard::new(self.slot())
    }

    /// Runs every work item waiting for this CPU, here; returns how many ran (the kernel's
    /// worker loop, done by the owner between its own operations).
    #[cold]
    pub fn poll(&mut self) -> usize {
        self.slot().mailbox.run_pending()
    }
}

impl<T> Drop for Owner<T> {
    fn drop(&mut self) {
        self._runner.end();
        // SAFETY: dropped exactly once, here; restores the thread's previous affinity and
        // registration before the slot is given up.
        unsafe { ManuallyDrop::drop(&mut self._binding) };
        // Release: this owner's accesses happen before the next owner's claim.
        self.slot().owner.store(NOBODY, Ordering::Release);
    }
}

/// Access to an owner-only slot, on its owning thread; clears the borrow flag on drop.
#[must_use = "the slot is given back as soon as the guard is dropped"]
pub struct OwnedGuard<'a, T> {
    slot: &'a OwnedSlot<T>,
    ptr: ManuallyDrop<MutPtr<T>>,
    _not_send: PhantomData<*const ()>,
}

impl<'a, T> OwnedGuard<'a, T> {
    /// Borrows `slot`; the caller is its owning thread.
    #[inline]
    fn new(slot: &'a OwnedSlot<T>) -> Result<Self> {
        if slot.borrowed.replace(1) != 0 {
            return Err(Error::AlreadyBorrowed { cpu: slot.cpu });
        }
        Ok(Self {
            slot,
            ptr: ManuallyDrop::new(slot.data.get_mut()),
            _not_send: PhantomData,
        })
    }

    /// The CPU whose slot this is (an associated function, so that it never hides a method of
    /// `T`).
    #[inline]
    pub fn cpu(this: &Self) -> usize {
        this.slot.cpu
    }
}

impl<T> Deref for OwnedGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only on the owning thread while the borrow flag is set, and
        // the flag admits one guard at a time.
        unsafe { MutPtr::deref(&self.ptr) }
    }
}

impl<T> DerefMut for OwnedGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only borrow through the guard.
        unsafe { MutPtr::deref(&self.ptr) }
    }
}

impl<T> Drop for OwnedGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: dropped exactly once, here, before the flag is cleared, so that loom sees the
        // access end while the slot is still borrowed.
        unsafe { ManuallyDrop::drop(&mut self.ptr) };
        self.slot.borrowed.set(0);
    }
}

impl<T: fmt::Debug> fmt::Debug for OwnedGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedGuard")
            .field("cpu", &self.slot.cpu)
            .field("data", &**self)
            .finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> crate::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
