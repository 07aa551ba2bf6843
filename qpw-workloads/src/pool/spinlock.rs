//! `aa_buffers_lock`: the global design's spinlock.

use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};

use qpw_core::sync::{thread, AtomicBool, MutPtr, Ordering, UnsafeCell};

/// `aa_buffers_lock`: a spinlock whose waiters yield after a short spin (a waiter may share
/// its CPU with the preempted holder). Counts failed first attempts as contention. Alone on
/// its cache lines with what it guards, as the kernel's lock and list are statics of their
/// own: the pool's read-mostly fields beside it would otherwise miss on every operation.
#[repr(align(128))]
pub(super) struct SpinLock<T> {
    locked: AtomicBool,
    data: UnsafeCell<T>,
}

// SAFETY: the data is reached only through a guard, made only by the thread that set `locked`
// from false to true, so one thread at a time has it: like a mutex, that needs `T: Send`.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: moving the lock moves the `T`, which `T: Send` allows.
unsafe impl<T: Send> Send for SpinLock<T> {}

impl<T> SpinLock<T> {
    pub(super) fn new(data: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            data: UnsafeCell::new(data),
        }
    }

    /// `spin_trylock`.
    #[inline]
    pub(super) fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            .then(|| SpinGuard::new(self))
    }

    /// `spin_lock`.
    pub(super) fn lock(&self) -> SpinGuard<'_, T> {
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

    /// `spin_lock`, calling `contended` when the first attempt fails.
    #[inline]
    pub(super) fn lock_counted(&self, contended: impl FnOnce()) -> SpinGuard<'_, T> {
        match self.try_lock() {
            Some(guard) => guard,
            None => {
                contended();
                self.lock()
            }
        }
    }
}

pub(super) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
    ptr: ManuallyDrop<MutPtr<T>>,
    _not_send: PhantomData<*const ()>,
}

impl<'a, T> SpinGuard<'a, T> {
    pub(super) fn new(lock: &'a SpinLock<T>) -> Self {
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn spinlock_counts_only_failed_first_attempts() {
        let lock = SpinLock::new(0u32);
        let mut contended = 0;
        *lock.lock_counted(|| contended += 1) += 1;
        assert_eq!(contended, 0);
        let held = lock.try_lock().unwrap();
        assert!(lock.try_lock().is_none());
        // A second thread finds it held: one count, then it waits for the release.
        let waiting = AtomicBool::new(false);
        thread::scope(|s| {
            let other = s.spawn(|| {
                let mut contended = 0;
                *lock.lock_counted(|| {
                    contended += 1;
                    waiting.store(true, Ordering::Release);
                }) += 1;
                contended
            });
            while !waiting.load(Ordering::Acquire) {
                thread::yield_now();
            }
            drop(held);
            assert_eq!(other.join().unwrap(), 1);
        });
        assert_eq!(*lock.lock(), 2);
    }
}
