//! [`FencedLock`]: the rseq lock made reachable from other CPUs, so that remote-mode drains
//! need no worker and the owner's path no atomic read-modify-write.
//!
//! # The problem
//!
//! Queue mode keeps the drain off the requester but wakes a worker on the target: a
//! preemption per drain. Remote mode leaves the target alone, but with [`FairLock`](crate::FairLock)
//! every local operation of the owner pays two compare-and-swaps. The kernel pays neither:
//! its owner path is `preempt_disable()`. [`RseqLock`] already gives the owner plain stores
//! inside a restartable sequence, and already has a correct path for a taker on another CPU;
//! what it lacked is the promise ([`RawRemoteLock`]) that lets [`PerCpu::lock`](crate::PerCpu::lock),
//! [`PerCpu::for_each_locked`](crate::PerCpu::for_each_locked) and remote-mode work use that
//! path on purpose, for every drain, rather than for the rare migrated thread.
//!
//! # The protocol (the asymmetric drain, and the owner's answer)
//!
//! The design tcmalloc uses to drain its per-CPU caches from another CPU (a flag, then a fence
//! of that one CPU, then wait only for what had already committed), on the lock word of
//! [`RseqLock`], with one addition: a fence the owner makes for free when it is busy on its
//! lock.
//!
//! 1. **Owner** (a thread running on the lock's CPU): one restartable sequence that checks it
//!    runs on the CPU, loads the word, and if it is `FREE` commits `HELD` with a plain store as
//!    its last instruction. Release is another sequence that commits `FREE` when nobody waits
//!    (or a hand-over to a sleeper). No atomic read-modify-write. When the sequence finds a
//!    requester's flag in the word instead, the owner *answers*: a second sequence reads its
//!    CPU's call counter and the owner publishes what it read in the CPU's answer cell, then
//!    waits for the requester, answering again and again while it spins. An owner that spends
//!    its time away from its locks (polling a socket, a ring) answers from its own loop with
//!    [`Binding::poll`](crate::Binding::poll): one load of the CPU's call counter when nobody
//!    has called, the same answer when someone has.
//! 2. **Requester** (a thread on any other CPU), one at a time per lock (a side mutex):
//!    - *raise the flag*: `CAS` the word from `FREE` to `FENCED | epoch << 2`, a new epoch for
//!      every flag (the epoch counter lives under the side mutex);
//!    - *call the CPU*: bump its call counter, after the flag;
//!    - *wait for an answer that reaches the call*, up to about 2 us while the CPU answers (not
//!      at all after a wait that got none, until an answer is seen again);
//!    - *if none came, fence the CPU*: `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ,
//!      MEMBARRIER_CMD_FLAG_CPU, cpu)`, which returns only after the target CPU, if it runs a
//!      thread of this process, has taken an interrupt that aborts any restartable sequence
//!      in flight there and executed a full barrier; if the call fails, the flag is backed out
//!      and the requester panics, saying so: nothing is taken without the fence;
//!    - *check*: the word still holds our flag means the lock is ours; anything else means an
//!      owner had committed `HELD` over the flag, and we wait for its release like any waiter
//!      (spin briefly, then sleep on the futex until the release hands it over).
//!
//! A walk over many CPUs ([`PerCpu::for_each_locked`](crate::PerCpu::for_each_locked), and so
//! [`read_each`](crate::PerCpu::read_each)) raises every CPU's flag first, calls each CPU
//! once, waits for the answers together, and fences only the CPUs that did not answer. A
//! [`drain_all`](crate::PerCpuWork::drain_all) cannot raise ahead: its locks are taken inside
//! the work function, one CPU after another, so each CPU gets its own wait; but a work function
//! that takes a second lock of a CPU while it holds the first gets the answer from the owner
//! waiting for the first, with no fence.
//!
//! # Why it is correct
//!
//! Take an owner's sequence that loaded `FREE` (otherwise it does not store at all). Relative
//! to the requester's fence, it is in one of three places:
//!
//! - **It committed before the fence.** Its store of `HELD` either preceded the requester's
//!   `CAS` (which then fails: the word is not `FREE`) or came after it and overwrote the flag.
//!   The fence's barrier orders that store before the requester's load in the check, which sees
//!   `HELD` and does not claim the lock: the requester waits for the holder that had committed.
//! - **It was in flight during the fence.** The fence's interrupt aborts it before its store;
//!   re-run, it loads the word again and finds the flag: it waits.
//! - **It starts after the fence.** The fence ordered the requester's `CAS` before it, so its
//!   load sees the flag (or a later value): it does not store `HELD` over a held lock.
//!
//! An answer replaces the fence because it settles the same three cases, whether the owner
//! made it in its lock or in its loop's poll. It was published by
//! a thread whose sequence read our call on the lock's CPU, after our flag was raised: a
//! sequence of that CPU that committed over the flag came earlier in that CPU's order, and our
//! check after the answer sees it (the flag, with its epoch, never comes back once
//! overwritten); one in flight belongs to a thread that was not running, so it was preempted
//! and will abort; and later ones load the flag or a newer value. The answer must be compared
//! with our call, or an answer to an earlier call would settle a flag no sequence has seen
//! (the call and answer counters are 64-bit, the call counter stops at its end and the answer
//! only moves forward, so that no number of calls can make an old answer pass for a new one;
//! `rseq_lock/answer.rs`, "Counters that cannot wrap");
//! and it must come from a sequence of the lock's CPU, or it would prove nothing about that
//! CPU's sequences in flight ([`RseqLock`]'s module docs give the whole argument, in
//! `rseq_lock/answer.rs` for the answer, and in `rseq_lock/wait.rs` the waiter handshake,
//! which needs no process-wide barrier).
//!
//! So at most one of the owner and the requester holds the lock; two requesters are kept
//! apart by the side mutex and by the `CAS` itself; a holder that migrated while holding
//! releases with a store that no other party can race (only the holder stores while the word
//! is `HELD` or a flag), and a holder preempted while holding simply keeps the word `HELD`,
//! which the requester waits out, sleeping. Each acquisition reads with acquire ordering the
//! value a release stored with release ordering, which hands over the data.
//!
//! Without the fence (and without an answer), a sequence that loaded `FREE` before the `CAS`
//! could commit `HELD` after the requester's check: both would hold. Without the check, the
//! requester would claim a lock an owner had committed before the fence.
//!
//! **Status of the checks.** The 10^6-operation stress (`tests/fenced_stress.rs`) conserves
//! every unit on real CPUs, with answers on and forced off, with and without rseq, and fails
//! (units drained twice, 1.03x to 1.13x the units added, three runs out of three) when the
//! fence is removed; it does not catch the removal of the check, whose window (an owner
//! committing between the requester's `CAS` and its fence) is a few instructions wide.
//! `tests/fenced_faults.rs` checks, on real CPUs, that a thread without an rseq registration
//! never commits a sequence and that a fence that fails (made to fail by a seccomp filter)
//! refuses the lock. The loom models (`tests/loom_fenced.rs`: owner against requester, two
//! requesters, an owner migrating while holding, an owner preempted while holding with a
//! second thread of its CPU waiting, an owner against two requesters each preempted while
//! holding, an owner and a requester taking the lock twice each, and the drain through
//! [`PerCpu::lock`](crate::PerCpu::lock); with answers on, and some with answers off) all
//! pass, in a mock where only an abort (the fence's, or a preemption's) stops an owner's
//! commit whose load has gone stale. Each fails, as a permanent test, when one step is left
//! out (a loom-only switch, `rseq::mock::with_mutation`): the requester's fence or its check
//! (every model with an owner), the side mutex (two preempted requesters), comparing the
//! answer with the call (twice each), an answer's origin on the lock's CPU (a second requester
//! answering), and the waiter's fence before it sleeps (a lost wake: loom reports the
//! deadlock). Two models of the owner's poll (an owner that polls between requests, for two
//! locks of its CPU; a thread bound to the CPU that polls from another CPU) pass, and fail
//! when the poll answers without the sequence of the lock's CPU, or when a poll's answer is
//! taken without comparing it with the call; in each only a poll can make the answer that
//! breaks exclusion (with the polls taken out, the mutated models pass). On real CPUs
//! `tests/fenced_poll.rs` checks that a call is answered by the next poll and not by a poll
//! from another CPU, and conserves every unit under a polling owner scraped thousands of
//! times. What loom cannot check is the mock's premise, that membarrier and a preemption
//! abort and order as the kernel documents; the stress on real CPUs is the check of that.
//!
//! # The cost, and where it falls
//!
//! The owner pays a restartable sequence to take the lock and another to release it: plain
//! loads and stores. The requester pays a `CAS` and either a wait of a few microseconds for an
//! owner busy on its lock or polling, or a system call and an inter-processor interrupt. An
//! owner that polls pays a load per poll while nobody calls. The target CPU
//! sees nothing when its owner answers, and otherwise a short interrupt, only while one of
//! this process's threads runs there (otherwise the kernel skips it): no worker, no context
//! switch. An owner that finds a flag spins while the requester holds the lock (tens of
//! microseconds at most) before it sleeps. [`fence_counts`] tells how this process's flags
//! were settled: answered, fenced, or overtaken by an owner.
//!
//! # When it is not available
//!
//! Where restartable sequences or membarrier's rseq fence are missing (another architecture,
//! an old kernel, `GLIBC_TUNABLES=glibc.pthread.rseq=0`), every [`RseqLock`], and so every
//! `FencedLock`, uses the atomic [`FairLock`](crate::FairLock) protocol, which is correct from
//! any CPU. [`FencedLock::kind`] and [`rseq::status`](crate::rseq::status) report which.

use std::fmt;

/// Hooks for tests of the fenced protocol (the `test-hooks` feature; never enable it in a
/// program): they put a CPU's answer counters where a real run would take days or years to
/// bring them, so that a test can check the protocol there.
#[cfg(all(feature = "test-hooks", not(loom)))]
pub mod test_hooks {
    /// Sets CPU `cpu`'s call counter to `call` and its newest answer to `answer`, as if `call`
    /// calls had been made and a sequence of the CPU had last answered `answer`. Only while no
    /// thread takes that CPU's locks or polls it. `false` for a CPU past the table.
    pub fn set_counters(cpu: usize, call: u64, answer: u64) -> bool {
        crate::rseq_lock::set_beacon(cpu, call, answer)
    }

    /// CPU `cpu`'s call counter and newest answer.
    pub fn counters(cpu: usize) -> Option<(u64, u64)> {
        crate::rseq_lock::beacon_counters(cpu)
    }
}

pub use crate::rseq_lock::{acks, fence_counts, set_acks, FenceCounts, Polled};
use crate::{LocalAttempt, LocalLockKind, RawLocalLock, RawRemoteLock, RseqLock};

/// An [`RseqLock`] that other CPUs may take, by raising a flag and fencing the lock's CPU
/// (see the [module docs](self)): the per-CPU lock of [fenced mode](crate::Mode::Fenced), a
/// remote-mode CPU whose owner path has no atomic read-modify-write.
///
/// A policy that puts CPUs in fenced mode ([`Policy::Fenced`](crate::Policy::Fenced),
/// [`Policy::FencedOn`](crate::Policy::FencedOn)) gives those CPUs' slots of
/// [`Qpw::per_cpu`](crate::Qpw::per_cpu) state this lock (through [`PwLock`](crate::PwLock)),
/// and runs their work in the caller. Naming it, as below, puts it on every CPU whatever its
/// mode.
///
/// ```
/// use qpw_core::{FencedLock, Policy, Qpw};
///
/// let qpw = Qpw::with_policy(Policy::Remote)?;
/// let counters = qpw.per_cpu_with::<FencedLock, _>(|_cpu| 0u64)?;
/// *counters.lock_local()? += 1; // the owner: a restartable sequence
/// let total: u64 = qpw.cpus().iter().map(|cpu| *counters.lock(cpu).unwrap()).sum(); // fenced
/// assert_eq!(total, 1);
/// # Ok::<(), qpw_core::Error>(())
/// ```
#[repr(transparent)]
pub struct FencedLock {
    inner: RseqLock,
}

impl fmt::Debug for FencedLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("FencedLock").field(&self.inner).finish()
    }
}

impl FencedLock {
    /// The protocol every `FencedLock` of this process uses: [`LocalLockKind::Rseq`] (plain
    /// stores for the owner, a CPU fence for a requester), or [`LocalLockKind::Fair`] in the
    /// fallback.
    pub fn kind() -> LocalLockKind {
        RseqLock::kind()
    }

    /// The physical CPU this lock belongs to (none in the fallback).
    pub fn cpu(&self) -> Option<usize> {
        self.inner.cpu()
    }
}

// SAFETY: every operation forwards to `RseqLock`, whose exclusion and hand-over hold for
// takers on any CPU: a taker off the lock's CPU takes the fenced path (the module docs'
// argument), and in the fallback the lock is a `FairLock`.
unsafe impl RawLocalLock for FencedLock {
    fn new() -> Self {
        Self {
            inner: RseqLock::new(),
        }
    }

    fn for_cpu(phys: usize) -> Self {
        Self {
            inner: RseqLock::for_cpu(phys),
        }
    }

    #[inline]
    fn lock(&self) {
        self.inner.lock();
    }

    #[inline]
    fn try_lock(&self) -> bool {
        self.inner.try_lock()
    }

    #[inline(always)]
    unsafe fn unlock(&self) {
        // SAFETY: the caller holds the lock (the trait's `# Safety`), which is `inner`.
        unsafe { self.inner.unlock() }
    }

    fn try_lock_until(&self, deadline: std::time::Instant) -> bool {
        self.inner.try_lock_until(deadline)
    }

    #[inline(always)]
    fn lock_on_current_cpu(&self) -> LocalAttempt {
        self.inner.lock_on_current_cpu()
    }

    #[inline]
    fn as_rseq(&self) -> Option<&RseqLock> {
        Some(&self.inner)
    }
}

// SAFETY: the fence a taker from another CPU needs is the lock's own (the CPU fence of
// `RseqLock`'s fenced path, module docs); with it, exclusion holds whichever CPUs the
// contenders run on.
unsafe impl RawRemoteLock for FencedLock {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn excludes_from_its_cpu_and_from_another() {
        let before = crate::current_affinity().unwrap();
        let allowed = crate::allowed_cpus().unwrap();
        let cpu = allowed.first().unwrap();
        crate::pin_current_thread(cpu).unwrap();
        let lock = FencedLock::for_cpu(cpu);
        lock.lock();
        assert!(!lock.try_lock());
        // SAFETY: held just above.
        unsafe { lock.unlock() };
        if let Some(other) = allowed.iter().find(|&c| c != cpu) {
            crate::pin_current_thread(other).unwrap();
            assert!(lock.try_lock());
            assert!(!lock.try_lock());
            // SAFETY: held by the try_lock above.
            unsafe { lock.unlock() };
        }
        crate::set_current_affinity(&before).unwrap();
    }
}
