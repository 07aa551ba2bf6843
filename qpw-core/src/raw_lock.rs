//! The raw per-CPU lock, as a policy apart from the data (lock_api's split).
//!
//! [`PerCpu`](crate::PerCpu) is generic over an [`RawLocalLock`]; what a lock may do beyond
//! excluding the threads of its own CPU is a further marker trait, [`RawRemoteLock`]: only
//! locks that stay correct when taken from another CPU implement it, and
//! [`PerCpu::lock`](crate::PerCpu::lock), the remote path, needs it. A cheaper lock that is only
//! correct on its own CPU (rseq, or a single owner) then simply lacks the impl, and using it
//! remotely does not compile.

use crate::sync::RawMutex;

/// A raw lock guarding one CPU's slot.
///
/// # Safety
///
/// Implementations must exclude: between a successful [`lock`](Self::lock) or
/// [`try_lock`](Self::try_lock) and the matching [`unlock`](Self::unlock), no other call to
/// either may succeed, whatever thread makes it, as long as every caller honours the lock's
/// own documented restriction on where it may be taken from. Acquiring must synchronise-with
/// the previous release (acquire/release ordering), so that the data it guards is handed over.
/// `as_rseq` (hidden) must answer the same for a given lock every time, and a lock that
/// answers `Some` must take and release exactly that `RseqLock` (the default, `None`, is
/// always right).
pub unsafe trait RawLocalLock: Send + Sync {
    /// A new, unlocked lock.
    fn new() -> Self;

    /// Whether the lock may be taken only by the threads of its own CPU, so that an instance
    /// must refuse to make it for a remote-mode CPU (locks with no [`RawRemoteLock`] impl).
    const OWN_CPU_ONLY: bool = false;

    /// A new, unlocked lock for the slot of a CPU whose threads run on physical CPU `phys`.
    /// Locks that do not care where they are taken from ignore it (the default).
    #[inline]
    fn for_cpu(phys: usize) -> Self
    where
        Self: Sized,
    {
        let _ = phys;
        Self::new()
    }

    /// A new, unlocked lock for the slot of a CPU in `mode` whose threads run on physical CPU
    /// `phys`: what [`PerCpu`](crate::PerCpu) calls for each slot. Only a lock that changes its
    /// protocol with the mode ([`PwLock`](crate::PwLock)) looks at `mode`; the default is
    /// [`for_cpu`](Self::for_cpu).
    #[inline]
    fn for_cpu_in(phys: usize, mode: crate::Mode) -> Self
    where
        Self: Sized,
    {
        let _ = mode;
        Self::for_cpu(phys)
    }

    /// Takes the lock, waiting as long as needed.
    fn lock(&self);

    /// Takes the lock if it is free now.
    fn try_lock(&self) -> bool;

    /// Takes the lock, waiting for it at most until `deadline`; `false` if it was still held
    /// then. What a remote run under a drain's deadline uses
    /// ([`PerCpu::lock_work`](crate::PerCpu::lock_work)). The default retries
    /// [`try_lock`](Self::try_lock), yielding the CPU between tries; locks that can sleep
    /// until a deadline do better.
    fn try_lock_until(&self, deadline: std::time::Instant) -> bool {
        loop {
            if self.try_lock() {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            crate::sync::thread::yield_now();
        }
    }

    /// Releases the lock.
    ///
    /// # Safety
    ///
    /// The lock is held, and this call releases the hold taken by the caller's context.
    unsafe fn unlock(&self);

    /// Takes the lock on behalf of a thread that chose it because it runs on the lock's CPU
    /// now ([`PerCpu::lock_local`](crate::PerCpu::lock_local) from an unbound thread), or
    /// returns [`LocalAttempt::Elsewhere`] without taking it when the thread turns out to run
    /// elsewhere, so that the caller can pick its new CPU's lock instead. The default takes the
    /// lock wherever the thread runs.
    #[inline]
    fn lock_on_current_cpu(&self) -> LocalAttempt {
        self.lock();
        LocalAttempt::Locked
    }

    /// The restartable-sequence lock this lock is, or forwards to for its slot, if any: lets
    /// a walk over many CPUs' locks ([`PerCpu::for_each_locked`](crate::PerCpu::for_each_locked))
    /// raise every requester's flag before it waits for any, and the owner's fast path
    /// (`lock_local`, `BoundSlot::lock`) take and release it with its sequences. None by
    /// default. An implementation must give the same answer every time for a given lock
    /// (the owner's guard relies on it to release), and when it gives one, this lock's
    /// `lock`, `try_lock` and `unlock` must be that lock's (part of the trait's `# Safety`).
    #[doc(hidden)]
    #[inline]
    fn as_rseq(&self) -> Option<&crate::RseqLock> {
        None
    }
}

/// What [`RawLocalLock::lock_on_current_cpu`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum LocalAttempt {
    /// The lock is now held by the caller.
    Locked,
    /// The caller does not run on the lock's CPU (it migrated): nothing was taken.
    Elsewhere,
}

/// A raw lock that threads on any CPU may take: the remote-mode capability.
///
/// # Safety
///
/// The exclusion promised by [`RawLocalLock`] holds whichever CPUs the contending threads run
/// on, with no fence needed beyond the lock's own atomics.
pub unsafe trait RawRemoteLock: RawLocalLock {}

/// The default per-CPU lock: one atomic word, waiters that park, and a fair release.
///
/// Built on `parking_lot`'s word lock: the uncontended acquire and release are one
/// compare-and-swap each (about what PREEMPT_RT's `local_lock` pays for its spinlock); a
/// contended acquire spins briefly, then sleeps on a futex-backed parking lot, so a waiter never
/// spins against a holder that has been preempted on the same CPU; and every release is
/// `unlock_fair`, which hands the lock straight to the first sleeping waiter instead of letting
/// the releaser take it back in a tight loop. That hand-over is what keeps a queue-mode drain
/// bounded when a thread of the target CPU takes and drops the lock non-stop (the worker would
/// otherwise lose every race against a thread that never sleeps).
#[derive(Debug)]
pub struct FairLock {
    raw: RawMutex,
}

// SAFETY: `RawMutex` is a mutex with acquire/release semantics (parking_lot's, or loom's
// model); `lock`/`try_lock`/`unlock` forward to it one for one.
unsafe impl RawLocalLock for FairLock {
    #[inline]
    fn new() -> Self {
        Self {
            raw: RawMutex::new(),
        }
    }

    #[inline]
    fn lock(&self) {
        self.raw.lock();
    }

    #[inline]
    fn try_lock(&self) -> bool {
        self.raw.try_lock()
    }

    #[inline]
    fn try_lock_until(&self, deadline: std::time::Instant) -> bool {
        self.raw.try_lock_until(deadline)
    }

    #[inline]
    unsafe fn unlock(&self) {
        // SAFETY: the caller holds the lock (the trait's `# Safety`).
        unsafe { self.raw.unlock_fair() }
    }
}

// SAFETY: the word is changed only by atomic read-modify-writes, which exclude whichever CPU
// the contenders run on.
unsafe impl RawRemoteLock for FairLock {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn excludes_and_releases() {
        let lock = FairLock::new();
        lock.lock();
        assert!(!lock.try_lock());
        // SAFETY: held just above.
        unsafe { lock.unlock() };
        assert!(lock.try_lock());
        // SAFETY: held by the try_lock above.
        unsafe { lock.unlock() };
    }
}
