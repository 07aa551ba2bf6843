//! The calling thread's list of the per-CPU locks it holds through a *requester's* guard, so
//! that asking for one of them again is [`Error::Reentrant`](crate::Error::Reentrant) in
//! release builds too (issue 31), not a wait for itself.
//!
//! # The problem
//!
//! A thread that holds a CPU's lock and asks for it again waits for itself for ever: work that
//! calls `lock(ctx.cpu())` inside `lock_work`, or queues itself on its own CPU while it holds
//! the lock (in remote and fenced mode the nested run happens at once, in the same thread).
//! Debug builds catch every such case: each slot records the thread that holds it
//! (`percpu.rs`). That record is a store on every acquisition and every release, the owner's
//! too, so release builds could not keep it: the owner's path (`lock_local`,
//! [`BoundSlot::lock`](crate::BoundSlot::lock)) is the one the whole crate is measured by.
//!
//! # The mechanism
//!
//! A lock word cannot say *which* thread holds it: a [`FairLock`](crate::FairLock) word says
//! only "held", and an [`RseqLock`](crate::RseqLock) word says `HELD` for whichever thread of
//! the lock's CPU committed it, so "held, and I am bound to its CPU" does not mean "held by
//! me": another thread of that CPU (its worker, a second bound thread) may hold it, and must
//! be waited for. So the record lives with the thread instead, and only the requester's side
//! keeps it: the guards made by [`PerCpu::lock`](crate::PerCpu::lock),
//! [`PerCpu::try_lock`](crate::PerCpu::try_lock), [`PerCpu::lock_work`](crate::PerCpu::lock_work)
//! and the walks ([`PerCpu::for_each_locked`](crate::PerCpu::for_each_locked) and its
//! kin) add the lock's address and their call site to a short thread-local list, and their
//! drop takes it out; `lock`, `lock_work` and the walks look there before they take a lock. A
//! remote run (`queue_on`, `drain_all`) takes its lock through `lock_work`, so a run under a
//! hold of the calling thread is refused there, and the refusal is what the call returns.
//!
//! The owner's calls (`lock_local`, `try_lock_local`, `BoundSlot::lock`) neither look nor
//! add, so that their release builds stay what they were: the same instructions or fewer
//! (`tests/owner_path` counts them). A guard says how it is released (`percpu.rs`, `Release`):
//! a requester's guard carries one more than its entry's index here, an owner's guard one of
//! the owner's releases; where an owner's guard is built the compiler sees which, and drops
//! the drop's tests. So a hold through the owner's calls, and an owner's call under any hold,
//! are caught in debug builds only.
//!
//! # The cost
//!
//! The list is a `const`-initialised thread-local without a destructor (one access relative
//! to the thread pointer, no lazy initialisation) of [`CAPACITY`] entries and a byte with a
//! bit for each entry in use: the check reads the byte, zero unless the thread already holds
//! a requester's guard, and otherwise looks at the entries in use; the record takes the first
//! free entry; the drop clears its own entry's bit, the index its guard carries. A thread
//! holding more than [`CAPACITY`] requester's guards at once keeps the later ones unrecorded
//! (no false refusal, only a missed one). `docs/results.md` (section 9) has what this costs
//! `lock` against the same call without it, measured in one run (`benches/reentry.rs`).
//!
//! Under loom there is no list (the models check the locks, not this diagnostic, and loom's
//! thread-locals cannot be `const`): nothing is recorded and nothing refused.

#[cfg(not(loom))]
use std::cell::Cell;
use std::panic::Location;

/// How many requester's guards a thread can have recorded at once (the bits of a `u8`): a
/// drain of the LRU holds two locks of one CPU, a walk one at a time.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) const CAPACITY: usize = u8::BITS as usize;

/// One recorded hold: the lock's address and where its guard was made.
#[cfg(not(loom))]
#[derive(Clone, Copy)]
struct Entry {
    lock: usize,
    at: &'static Location<'static>,
}

#[cfg(not(loom))]
struct Held {
    /// Which entries are in use, one bit each: zero unless the thread holds a requester's
    /// guard.
    used: Cell<u8>,
    entries: [Cell<Entry>; CAPACITY],
}

#[cfg(not(loom))]
crate::sync::thread_local! {
    static HELD: Held = const {
        Held {
            used: Cell::new(0),
            entries: [const {
                Cell::new(Entry {
                    lock: 0,
                    at: Location::caller(),
                })
            }; CAPACITY],
        }
    };
}

/// Where the calling thread took the lock at `lock` through a requester's guard that is
/// still alive, if it did.
#[inline]
pub(crate) fn held_at(lock: usize) -> Option<&'static Location<'static>> {
    #[cfg(not(loom))]
    return HELD.with(|held| {
        let mut used = held.used.get();
        // Is any requester's guard alive in this thread at all? Usually not.
        while used != 0 {
            let entry = held.entries[used.trailing_zeros() as usize].get();
            if entry.lock == lock {
                return Some(entry.at);
            }
            used &= used - 1;
        }
        None
    });
    #[cfg(loom)]
    {
        let _ = lock;
        None
    }
}

/// Records that the calling thread now holds the lock at `lock` through a guard made at `at`,
/// and returns the entry, for [`forget`]; `None` (nothing recorded, nothing to forget) when
/// the list is full.
#[inline]
pub(crate) fn record(lock: usize, at: &'static Location<'static>) -> Option<usize> {
    #[cfg(not(loom))]
    return HELD.with(|held| {
        let used = held.used.get();
        if used == u8::MAX {
            return None;
        }
        let entry = used.trailing_ones() as usize;
        held.entries[entry].set(Entry { lock, at });
        held.used.set(used | 1 << entry);
        Some(entry)
    });
    #[cfg(loom)]
    {
        let _ = (lock, at);
        None
    }
}

/// Forgets the hold [`record`] put in `entry`: its guard is being dropped.
#[inline]
pub(crate) fn forget(entry: usize) {
    #[cfg(not(loom))]
    HELD.with(|held| held.used.set(held.used.get() & !(1 << entry)));
    #[cfg(loom)]
    let _ = entry;
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn records_forgets_in_any_order_and_stops_at_capacity() {
        let here = Location::caller();
        assert_eq!(held_at(1), None);
        let a = record(1, here).unwrap();
        let b = record(2, here).unwrap();
        let c = record(3, here).unwrap();
        assert_eq!(held_at(2), Some(here));
        forget(a); // not the newest
        assert_eq!(held_at(1), None);
        assert_eq!(held_at(2), Some(here));
        assert_eq!(held_at(3), Some(here));
        // A freed entry is taken again.
        assert_eq!(record(4, here), Some(a));
        forget(c);
        forget(b);
        forget(a);
        assert_eq!(held_at(2), None);
        assert_eq!(held_at(4), None);
        // Full: the ninth is not recorded, and nothing else is disturbed.
        let entries: Vec<usize> = (10..10 + CAPACITY)
            .map(|lock| record(lock, here).unwrap())
            .collect();
        assert_eq!(record(99, here), None);
        assert_eq!(held_at(99), None);
        assert_eq!(held_at(10), Some(here));
        for entry in entries {
            forget(entry);
        }
        assert_eq!(held_at(10), None);
        // Another thread's holds are not this thread's.
        let d = record(5, here).unwrap();
        std::thread::spawn(|| assert_eq!(held_at(5), None))
            .join()
            .unwrap();
        forget(d);
    }
}
