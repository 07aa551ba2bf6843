//! The one place that names `std::sync` or `loom`.
//!
//! Every other module takes its atomics, mutexes, cells and threads from here, so that
//! `RUSTFLAGS="--cfg loom"` swaps the whole crate onto loom's model-checked versions. It is
//! public so that crates built on qpw (the workloads) take theirs from here too and are
//! model-checked through the framework. The std side is given loom's
//! shape (`UnsafeCell::get_mut` returning a pointer wrapper), never the other way round, as tokio
//! does in `src/loom/mod.rs`.
//!
//! The raw mutex behind [`FairLock`](crate::FairLock) is the one piece that differs in kind: on
//! std it is `parking_lot`'s word-sized mutex (spin briefly, then park; `unlock_fair` hands the
//! lock to the first parked waiter), under loom a flag under a loom mutex whose waiters sleep,
//! which loom explores exhaustively.

/// A std atomic in both builds, for bookkeeping that is no part of any protocol (the debug
/// builds' record of which thread holds a per-CPU lock): loom need not explore it.
#[allow(dead_code)]
pub(crate) type Unmodelled64 = std::sync::atomic::AtomicU64;

/// The same for a source location (where a debug build's guard was taken).
#[allow(dead_code)]
pub(crate) type UnmodelledLocation = std::sync::atomic::AtomicPtr<std::panic::Location<'static>>;

#[cfg(not(loom))]
mod imp {
    pub use std::hint::spin_loop;
    pub use std::sync::atomic::{
        fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
    };
    pub use std::sync::{Arc, Condvar, Mutex, MutexGuard};
    pub use std::thread;
    pub use std::thread_local;

    use parking_lot::lock_api::{RawMutex as _, RawMutexFair as _, RawMutexTimed as _};

    /// `std::cell::UnsafeCell` in loom's shape.
    #[derive(Debug)]
    pub struct UnsafeCell<T: ?Sized>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        /// Wraps `value`.
        pub const fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        /// Unwraps the value.
        pub fn into_inner(self) -> T {
            self.0.into_inner()
        }
    }

    impl<T: ?Sized> UnsafeCell<T> {
        /// A pointer through which the value may be borrowed mutably (loom tracks the borrow
        /// for as long as the pointer lives; std does not track it).
        #[inline]
        pub fn get_mut(&self) -> MutPtr<T> {
            MutPtr(self.0.get())
        }
    }

    /// loom's `MutPtr`, for std.
    #[derive(Debug)]
    pub struct MutPtr<T: ?Sized>(*mut T);

    impl<T: ?Sized> MutPtr<T> {
        /// Borrows the value.
        ///
        /// # Safety
        ///
        /// The caller guarantees exclusive access for the lifetime of the borrow.
        #[inline]
        #[allow(clippy::mut_from_ref)]
        pub unsafe fn deref(&self) -> &mut T {
            // SAFETY: exclusivity is the caller's premise (see `# Safety`).
            unsafe { &mut *self.0 }
        }
    }

    /// A word-sized raw mutex that parks its waiters and can hand itself over fairly.
    pub struct RawMutex(parking_lot::RawMutex);

    impl std::fmt::Debug for RawMutex {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("RawMutex { .. }")
        }
    }

    impl Default for RawMutex {
        fn default() -> Self {
            Self::new()
        }
    }

    impl RawMutex {
        /// A new, unlocked mutex.
        pub fn new() -> Self {
            Self(parking_lot::RawMutex::INIT)
        }

        /// Takes the mutex, parking while it is held elsewhere.
        #[inline]
        pub fn lock(&self) {
            self.0.lock();
        }

        /// Takes the mutex if it is free now.
        #[inline]
        pub fn try_lock(&self) -> bool {
            self.0.try_lock()
        }

        /// Takes the mutex, parking while it is held elsewhere, but not past `deadline`.
        #[inline]
        pub fn try_lock_until(&self, deadline: std::time::Instant) -> bool {
            self.0.try_lock_until(deadline)
        }

        /// # Safety
        ///
        /// The mutex is held by the caller's context.
        #[inline]
        pub unsafe fn unlock_fair(&self) {
            // SAFETY: the caller holds the lock (see `# Safety`).
            unsafe { self.0.unlock_fair() }
        }
    }
}

#[cfg(loom)]
mod imp {
    pub use loom::cell::{MutPtr, UnsafeCell};
    pub use loom::hint::spin_loop;
    /// A static made once per loom execution (the mocked kernel's per-CPU state).
    pub use loom::lazy_static;
    pub use loom::sync::atomic::{
        fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
    };
    pub use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
    pub use loom::thread;
    pub use loom::thread_local;

    /// Under loom: a flag under a loom mutex, with waiters asleep on a condition variable.
    ///
    /// loom cannot model parking_lot's futex parking, and does not need to: what the models
    /// check is the exclusion and the hand-over of data between holders, not fairness. Waiters
    /// block rather than spin, which keeps loom's paths short.
    #[derive(Debug)]
    pub struct RawMutex {
        held: Mutex<bool>,
        released: Condvar,
    }

    impl Default for RawMutex {
        fn default() -> Self {
            Self::new()
        }
    }

    impl RawMutex {
        /// A new, unlocked mutex.
        pub fn new() -> Self {
            Self {
                held: Mutex::new(false),
                released: Condvar::new(),
            }
        }

        /// Takes the mutex, sleeping while it is held elsewhere.
        pub fn lock(&self) {
            let mut held = self.held.lock().unwrap();
            while *held {
                held = self.released.wait(held).unwrap();
            }
            *held = true;
        }

        /// Takes the mutex if it is free now.
        pub fn try_lock(&self) -> bool {
            let mut held = self.held.lock().unwrap();
            !std::mem::replace(&mut *held, true)
        }

        /// Takes the mutex, waiting as long as it takes: loom models have no clock, so a
        /// deadline never passes in them (a model that holds the lock for good is reported
        /// as a deadlock, which is what it is).
        pub fn try_lock_until(&self, _deadline: std::time::Instant) -> bool {
            self.lock();
            true
        }

        /// # Safety
        ///
        /// The mutex is held by the caller's context.
        pub unsafe fn unlock_fair(&self) {
            *self.held.lock().unwrap() = false;
            self.released.notify_one();
        }
    }
}

#[allow(unused_imports)]
pub use imp::*;

/// Atomics for state shared with a **signal handler**: always std's, under loom too.
///
/// A signal handler may touch only lock-free atomics, and the state it reaches must live in
/// `static`s (the handler is given no pointer of ours). loom's atomics can do neither: they
/// cannot be built in a `const` context, and touching one outside a loom model panics. No
/// protocol that loom models goes through these: they serve [`cross_call`](crate::cross_call)'s
/// mailboxes, which a signal handler reads, and nothing else should use them.
pub mod signal_safe {
    pub use std::sync::atomic::{
        AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering,
    };
}

/// `std::sync::Arc` under loom too, for immutable data shared by reference count that no
/// protocol depends on (the work functions): loom's `Arc` cannot hold an unsized `dyn Fn`.
pub type SharedFn<T> = std::sync::Arc<T>;

/// A process-wide id for each framework instance. Ids are not part of any modelled protocol,
/// and loom atomics cannot live in statics, so this is a std atomic under loom too.
pub(crate) fn next_instance_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The token of no thread: [`thread_token`] never returns it.
pub(crate) const NO_THREAD: u64 = 0;

/// A number for the calling thread, unique in the process and never [`NO_THREAD`]: what an
/// owner-only slot records as its owner, and a worker as the thread that runs its queue.
/// Not part of any modelled protocol: the counter is a std atomic under loom too, like the
/// instance ids (the thread-local is loom's, one per modelled thread).
pub(crate) fn thread_token() -> u64 {
    imp::thread_local! {
        #[allow(clippy::missing_const_for_thread_local)]
        static TOKEN: std::cell::Cell<u64> = std::cell::Cell::new(NO_THREAD);
    }
    TOKEN.with(|token| {
        if token.get() == NO_THREAD {
            static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
            token.set(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        }
        token.get()
    })
}
