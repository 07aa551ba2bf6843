//! Waiting for an [`RseqLock`]: spinning while that can pay, sleeping on the word with
//! `futex`, and the release that hands the lock to a sleeper (the protocol's "Wait" and
//! "Release from elsewhere, or with a waiter", in `rseq_lock`'s module docs).
//!
//! # Waiting: the handshake without a broadcast
//!
//! A waiter stores (registers) then loads (the word, through `futex`); a release stores (the
//! word) then loads (the count). Each side needs a full barrier between its store and its load,
//! or both can miss the other and the waiter sleeps through the release. The slow paths have
//! one (full fences around their read-modify-writes). The owner's release sequence has none,
//! and needs none: after registering, a waiter that is about to sleep on a hold fences the
//! lock's CPU once (the targeted `membarrier`, the requester's fence). A release sequence of
//! that CPU that had not committed by then is aborted and, re-run, sees the count; one that
//! had committed has its `FREE` visible to the waiter's next look; one that starts later sees
//! the count. A release from any other CPU is not a sequence of the lock's CPU (the sequence
//! checks the CPU) and takes the fenced path. So no waiter interrupts every CPU of the process
//! (the `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` broadcast an earlier version used): at
//! most the lock's CPU, once per wait, and only after spinning. If that fence fails, the waiter
//! sleeps in steps of a millisecond instead of trusting a wake.

#[cfg(not(loom))]
use std::time::Instant;

use super::answer::{Beacon, ACK_BUDGET_NS};
use super::{handoff, is_flag, is_handoff, RseqLock, FALLBACK_CPU, FREE, HELD};
use crate::sync::Ordering;

/// How long a waiter spins before it sleeps when the holder, or the thread the lock is being
/// handed to, most likely runs on another CPU: on a requester's flag (the holder is a
/// requester in the middle of a drain, a few microseconds; the owner keeps its CPU rather
/// than sleep, a voluntary context switch on the very CPU the drain should leave alone), on
/// an owner's hold seen from another CPU (its critical section is short), and on a hand-over
/// under way (the woken waiter needs a moment to run and claim it; a newcomer that joined the
/// waiters at once could claim it first, again and again: an owner in a tight loop starved a
/// woken requester for hundreds of milliseconds that way).
#[cfg(not(loom))]
const SPIN_NS: u64 = 50_000;

/// Spins on a busy lock before sleeping, for a waiter on the lock's own CPU: a few, as the
/// holder of a `HELD` word it can see is most likely a preempted thread of that CPU that
/// needs the CPU back. Under loom no spin at all: each spin is a loom yield, which loom's
/// search never moves earlier, so a spin before a waiter's first attempt kept that attempt out
/// of every window between an owner's load and its commit (the models then passed with the
/// fence or the check removed). An attempt from the spin is the same `try_once` as one from
/// the sleeping loop, so leaving it out loses no logic.
#[cfg(not(loom))]
const SPINS: u32 = 40;

/// When a sleeping waiter could not order its registration against the lock's CPU (its fence
/// failed), it sleeps at most this long between looks at the word.
#[cfg(not(loom))]
const UNORDERED_SLEEP: std::time::Duration = std::time::Duration::from_millis(1);

impl RseqLock {
    /// Whether the calling thread runs on the lock's CPU now.
    #[cfg(not(loom))]
    fn runs_here(&self) -> bool {
        crate::rseq::current_cpu() == Some(self.on_cpu() as usize)
    }

    /// Spins while the holder is likely to release soon: for [`SPIN_NS`] on a flag (a
    /// requester in a drain, on another CPU), on an owner's hold seen from another CPU and on a
    /// hand-over under way, and [`SPINS`] times on an owner's hold seen from the lock's own
    /// CPU (whose holder is then preempted, and needs the CPU). Returns whether it took the
    /// lock.
    #[cfg(not(loom))]
    fn spin(&self, deadline: Option<Instant>) -> bool {
        let mut spins = 0u32;
        let mut start: Option<Instant> = None;
        let here = self.runs_here();
        loop {
            let seen = self.word.load(Ordering::Relaxed);
            if seen == FREE && self.try_once() {
                return true;
            }
            spins += 1;
            let limit_ns = if is_flag(seen) {
                // Keep answering: the requester may call after our first answer (a second
                // lock of this CPU, taken while it holds this one).
                self.answer();
                SPIN_NS
            } else if here && seen == HELD {
                if spins >= SPINS {
                    return false;
                }
                u64::MAX
            } else {
                SPIN_NS
            };
            if spins.is_multiple_of(16) {
                let now = Instant::now();
                let since = *start.get_or_insert(now);
                if now.duration_since(since).as_nanos() >= u128::from(limit_ns)
                    || deadline.is_some_and(|d| now >= d)
                {
                    return false;
                }
            }
            if here && is_handoff(seen) {
                // The woken waiter may be a thread of this CPU: let it run (when it runs
                // elsewhere, nothing else is runnable here and this returns at once).
                crate::sync::thread::yield_now();
            } else {
                crate::sync::spin_loop();
            }
        }
    }

    /// No spinning under loom (see [`SPINS`]).
    #[cfg(loom)]
    fn spin(&self, _deadline: Option<std::time::Instant>) -> bool {
        false
    }

    /// The contended acquisition: spin while that may pay, then register as a waiter and
    /// sleep until the holder's release hands the lock over. With a deadline, gives up then
    /// and returns `false`.
    pub(super) fn lock_slow(&self, deadline: Option<std::time::Instant>) -> bool {
        if self.spin(deadline) {
            return true;
        }
        // A hand-over already under way is not ours: it was made for a waiter registered
        // before us. Claiming it would let a newcomer (an owner in a tight loop) take every
        // hand-over from a woken waiter still on its way to the CPU.
        let before = self.word.load(Ordering::Relaxed);
        let not_ours = is_handoff(before).then_some(before);
        self.waiters.fetch_add(1, Ordering::SeqCst);
        full_fence();
        // Whether our registration is ordered against the release sequences of the lock's
        // CPU (module docs, "Waiting"): needed before we sleep on a hold.
        let mut ordered = false;
        // Whether that ordering failed: then sleep in short steps rather than trust a wake.
        let mut unordered = false;
        loop {
            let seen = self.word.load(Ordering::Acquire);
            if is_flag(seen) {
                self.answer(); // only a thread on the lock's CPU can
            }
            let ours = is_handoff(seen) && Some(seen) != not_ours;
            let won = if ours {
                self.word
                    .compare_exchange(seen, HELD, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            } else {
                seen == FREE && self.try_once()
            };
            if won {
                self.waiters.fetch_sub(1, Ordering::Relaxed);
                return true;
            }
            // Held, or handed to another: sleep until a release wakes us.
            let held = seen == HELD || is_flag(seen) || (is_handoff(seen) && !ours);
            if held && !ordered {
                ordered = true;
                unordered = !self.order_registration();
                continue; // look again: the fence may have made a release visible
            }
            // Sleep only on a held word, whose holder's release will wake us (we are
            // registered), or on a hand-over made for another, whose claimer's release will.
            // Not on `FREE`, which no release follows. Not on a hand-over of ours we failed
            // to claim either (another waiter claimed it): its claimer's release stores a
            // hand-over of a new generation and wakes one, so the value we would sleep on is
            // stale, and a wake may already have gone to us. (Before hand-overs had
            // generations, a waiter that lost one slept on `HANDOFF`, found it again after the
            // winner's release had woken it, and slept through: loom found this with two
            // owner threads and a requester.)
            let slept = if held {
                self.futex_wait(seen, deadline, unordered)
            } else {
                deadline_open(deadline)
            };
            if !slept {
                return self.give_up();
            }
        }
    }

    /// Orders this waiter's registration against every release sequence of the lock's CPU
    /// that has not committed yet: fences that CPU, so that a release sequence in flight is
    /// aborted and re-run (and then sees the count), and one that committed has its `FREE`
    /// visible to our next look. A lock of no CPU has no release sequences. `false` when the
    /// fence failed.
    fn order_registration(&self) -> bool {
        #[cfg(loom)]
        if crate::rseq::mock::mutation() == crate::rseq::mock::Mutation::SkipWaiterFence {
            return true;
        }
        self.on_cpu() >= FALLBACK_CPU || self.fence_cpu().is_ok()
    }

    /// A waiter's deadline has passed: deregister, and take a hand-over that a release made
    /// to us meanwhile rather than strand it. Returns whether the lock is ours after all.
    #[cold]
    fn give_up(&self) -> bool {
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        full_fence();
        let seen = self.word.load(Ordering::SeqCst);
        is_handoff(seen)
            && self
                .word
                .compare_exchange(seen, HELD, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
    }

    /// Every release but an uncontended one on the lock's CPU: from another CPU (a requester,
    /// or a holder that migrated), or with a waiter to hand over to. Full fences throughout,
    /// so that a waiter registering anywhere either is seen here or sees the release (module
    /// docs, "Waiting").
    #[cold]
    pub(super) fn unlock_slow(&self) {
        let word = self.word.load(Ordering::Relaxed);
        if let (true, Some(beacon)) = (is_flag(word), self.beacon()) {
            if Beacon::reached(beacon.answer.load(Ordering::Relaxed), self.flag_call()) {
                // A requester releases its flag, and an answer came while it held the lock:
                // the owner is busy on it, so the next requester should wait for answers.
                beacon.budget.store(ACK_BUDGET_NS, Ordering::Relaxed);
            }
        }
        loop {
            if self.waiters.load(Ordering::SeqCst) == 0 {
                self.word.swap(FREE, Ordering::SeqCst);
                full_fence();
                if self.waiters.load(Ordering::SeqCst) != 0 {
                    // A waiter registered as we released: it may have seen the word held.
                    self.futex_wake();
                }
                return;
            }
            // Hand over to a sleeper: no thread can take a hand-over but a waiter registered
            // before it. Only the holder writes `handoffs`.
            let generation = self.handoffs.load(Ordering::Relaxed).wrapping_add(1);
            self.handoffs.store(generation, Ordering::Relaxed);
            let handed = handoff(generation);
            self.word.swap(handed, Ordering::SeqCst);
            full_fence();
            self.futex_wake();
            if self.waiters.load(Ordering::SeqCst) != 0 {
                return;
            }
            // Every waiter gave up at its deadline meanwhile: take the hand-over back, and
            // release it to whoever comes next (unless a waiter claimed it after all).
            if self
                .word
                .compare_exchange(handed, HELD, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                return;
            }
        }
    }

    /// Sleeps while the word holds `expected`, at most until `deadline` (and, when the
    /// registration could not be ordered, at most [`UNORDERED_SLEEP`]). `false` when the
    /// deadline has passed.
    #[cfg(not(loom))]
    fn futex_wait(&self, expected: u32, deadline: Option<Instant>, unordered: bool) -> bool {
        let mut timeout = unordered.then_some(UNORDERED_SLEEP);
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            timeout = Some(timeout.map_or(left, |t| t.min(left)));
        }
        let ts = timeout.map(|t| libc::timespec {
            tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: t.subsec_nanos() as libc::c_long,
        });
        // SAFETY: the word is a live, aligned 32-bit atomic for `&self`; FUTEX_WAIT_PRIVATE
        // only reads it (comparing with `expected` under the kernel's bucket lock) and sleeps;
        // the timeout, when given, points at `ts`, alive across the call (a relative time);
        // null means no timeout. EINTR, EAGAIN and ETIMEDOUT just send us round the loop.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.word.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                expected,
                ts.as_ref()
                    .map_or(std::ptr::null(), |t| t as *const libc::timespec),
            );
        }
        true
    }

    #[cfg(not(loom))]
    pub(super) fn futex_wake(&self) {
        // SAFETY: as in `futex_wait`; FUTEX_WAKE_PRIVATE reads nothing, it wakes at most one
        // thread asleep on this address.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.word.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                1,
            );
        }
    }

    #[cfg(loom)]
    fn futex_wait(
        &self,
        expected: u32,
        _deadline: Option<std::time::Instant>,
        _unordered: bool,
    ) -> bool {
        self.futex.wait(&self.word, expected);
        true
    }

    #[cfg(loom)]
    pub(super) fn futex_wake(&self) {
        self.futex.wake();
    }
}

/// The full barrier between a store and a load of the waiter handshake (a registration and
/// its look at the word; a release and its look at the count). On x86-64 the locked
/// read-modify-write before it already is one, and this costs an `mfence` on slow paths only;
/// it is written out so that the argument holds in the language's memory model, where a
/// `SeqCst` read-modify-write followed by a load is not enough for loom (which treats `SeqCst`
/// accesses as acquire-release and models only `SeqCst` fences in full).
#[inline]
pub(super) fn full_fence() {
    crate::sync::fence(Ordering::SeqCst);
}

/// Whether a waiter's deadline (if any) is still ahead.
fn deadline_open(deadline: Option<std::time::Instant>) -> bool {
    #[cfg(not(loom))]
    {
        deadline.is_none_or(|d| Instant::now() < d)
    }
    #[cfg(loom)]
    {
        let _ = deadline;
        true
    }
}
