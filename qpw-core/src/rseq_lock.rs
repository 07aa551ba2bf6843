//! [`RseqLock`]: a per-CPU lock whose owner path has no atomic read-modify-write, taken inside a
//! restartable sequence.
//!
//! # The problem
//!
//! The kernel's non-RT `local_lock` is `preempt_disable()`: no atomic instruction at all. In
//! userspace two threads of one CPU can interleave, so [`FairLock`] pays a
//! compare-and-swap to take the word and another to release it. Restartable sequences give
//! back most of the kernel's deal: a short run of instructions that the kernel *aborts* (jumps
//! to an abort handler, before its final store) if the thread is preempted, migrated or
//! signalled before that store. Within one CPU such a sequence is as good as atomic, with plain
//! loads and stores (librseq's `rseq_load_cbne_store__ptr`, on which its `rseq_this_cpu_lock`
//! is built).
//!
//! # The protocol
//!
//! The lock word takes four kinds of value: `FREE`, `HELD`, a *hand-over* `HANDOFF | gen << 2`
//! (released to a sleeping waiter, which has not claimed it yet; each hand-over has a new
//! generation) and a requester's *flag*, `FENCED | epoch << 2` (held, or being taken, by a
//! thread on another CPU; every flag raised on a lock has a new epoch). Besides the word: a
//! count of registered waiters and the epoch counter; and, per CPU, a *beacon*: a call counter
//! that requesters bump and an answer cell where the CPU's threads publish the call they read.
//!
//! - **Acquire, on the lock's CPU** (the owner's fast path): one restartable sequence that
//!   checks the thread's `cpu_id` against the lock's CPU, loads the word, and if it is `FREE`
//!   commits `HELD` with a plain store. The store is the sequence's last instruction, so either
//!   it happened with no other thread of the CPU running since the load, or the kernel aborted
//!   the sequence and we try again. No atomic read-modify-write. (On the owner's fast path
//!   the CPU check and the load of the word are one 8-byte load and compare: the lock keeps its
//!   CPU beside its word, `section.rs`.) When the word holds a flag,
//!   the owner *answers*: a second sequence reads its CPU's call counter, and the owner stores
//!   what it read into the CPU's answer cell (and keeps answering while it waits). An owner
//!   away from its locks answers the same way from its loop ([`Binding::poll`](crate::Binding::poll)).
//! - **Release, on the lock's CPU**: another restartable sequence, which checks the CPU and that
//!   no waiter is registered (again one load: the lock keeps its CPU a second time, beside the
//!   count), and commits `FREE`. No atomic read-modify-write either.
//! - **Release from elsewhere, or with a waiter** (a requester, a holder that migrated, or any
//!   release that finds the count non-zero): full fences; with a waiter, a store of `HANDOFF`
//!   and a `futex` wake of one sleeper.
//! - **Acquire from another CPU** (a requester; also a thread that migrated, one the kernel did
//!   not register, or a lock of no CPU): under the lock's side mutex, take the next epoch and
//!   `CAS` the word from `FREE` to that epoch's flag; *call* the lock's CPU (bump its call
//!   counter); then wait briefly for an answer that has reached this call; if none came,
//!   *fence the lock's CPU* with
//!   `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, MEMBARRIER_CMD_FLAG_CPU, cpu)`; then
//!   look again: the word still holding our flag means we hold the lock; anything else means a
//!   sequence of that CPU committed `HELD` over the flag, and we wait like any waiter. A fence
//!   that fails (`membarrier` returned an error) is never papered over: the flag is backed out
//!   and the call panics, saying so, with nothing held.
//! - **Wait**: spin while that can pay (up to 50 us on a flag, whose holder is a requester
//!   running elsewhere, on a hold seen from another CPU, and on a hand-over under way; on the
//!   lock's own CPU only a few times, since the holder then needs the CPU), then register (an
//!   atomic add to the count), order the registration against the lock's CPU (below), and sleep
//!   on the word with `futex` until it changes; a waiter that finds a hand-over made after it
//!   registered claims it with a compare-and-swap to `HELD` (one made before is for an earlier
//!   waiter: a newcomer that took it could starve a woken waiter still on its way to a CPU). So a waiter on the same CPU as a preempted holder sleeps
//!   instead of spinning against it (a `SCHED_FIFO` worker spinning would never let a
//!   `SCHED_OTHER` holder run, and yielding would not help it), and a release hands the lock to
//!   the sleeper instead of letting the releaser re-take it in a tight loop (the fairness
//!   [`FairLock`] gets from `unlock_fair`). A waiter with a deadline deregisters when it passes
//!   and takes a hand-over that raced with that, rather than strand it.
//!
//! # Who writes the word, from where, and why that is enough
//!
//! | value seen | who may store to the word | how |
//! |---|---|---|
//! | `FREE` | any thread of the lock's CPU | plain store of `HELD`, committed by a restartable sequence |
//! | `FREE` | one requester of another CPU (under the side mutex) | `CAS` to a flag of a new epoch, then the answer or the CPU fence, then the check |
//! | `HELD`, a flag | the holder | a restartable sequence of the lock's CPU committing `FREE`, or a full-fenced store of `FREE` or `HANDOFF` |
//! | a hand-over | a waiter registered before it, from any CPU | `CAS` to `HELD` |
//!
//! Only in the `FREE` state can two parties store, and there the plain stores all come from
//! one CPU, whose restartable sequences exclude each other (the kernel aborts one that was
//! preempted between its load and its store). The one party from another CPU uses a `CAS` and
//! then a fence or an answer: a sequence of the lock's CPU that loaded `FREE` before our `CAS`
//! has either committed by the time the fence returns (and then the word no longer holds our
//! flag: we back off) or is aborted by it and, re-run, sees the flag. In every other state
//! exactly one party may store, so plain stores cannot be lost. In particular a holder that
//! migrated releases correctly (its release sequence finds itself on the wrong CPU and takes
//! the fenced path), and the holder's release is read by the next acquirer's load with acquire
//! ordering (a plain `mov` on x86-64, whose loads are not reordered with later accesses),
//! which hands over the data wherever the two threads run.
//!
//! # Where the rest of the argument lives
//!
//! This file holds the lock: the word's values, the fast paths and the [`RawLocalLock`] impl.
//! Each other part of the protocol sits beside the code it argues for, in the files of
//! `rseq_lock/` (private modules: read them in the source):
//!
//! - `section.rs`: the restartable sequences (take the lock, the owner's take, release it,
//!   read a word on the lock's CPU), the inline assembly and its safety argument, the owner's
//!   fast path built on them (`OwnerPath`: the lock and the thread's rseq area in hand), and
//!   the CPU fence that aborts them.
//! - `answer.rs`, the fenced protocol's owner side: each CPU's *beacon* (its call counter and
//!   answer cell) and the owner's *answer*, with the argument ("The answer: a fence the owner
//!   makes for free") that an answer which has reached a requester's call settles every flag
//!   that requester raised on the CPU's locks before the call, as the fence would, so that the
//!   requester skips the fence and its interrupt; and the owner's *poll*
//!   ([`Binding::poll`](crate::Binding::poll), "The poll"), the same answer made from the
//!   owner's own loop when it is away from its locks.
//! - `requester.rs`, the fenced protocol's requester side: raise, call, wait for the answer,
//!   fence if none came, check, and back out when the fence fails; the walk that raises many
//!   CPUs' flags at once; [`set_acks`] and [`fence_counts`].
//! - `wait.rs`: spinning, sleeping on the `futex`, the hand-over to a sleeper, and the argument
//!   ("Waiting: the handshake without a broadcast") that a sleeping waiter never misses a
//!   release although the owner's release sequence has no barrier: the waiter fences the lock's
//!   CPU once, never every CPU of the process.
//! - `loom_mock.rs` ("Under loom"): the kernel mocked for the loom models, not the protocol.
//!
//! # When it is not used
//!
//! The restartable sequences are x86-64 assembly and need glibc's rseq registration and the
//! membarrier commands; when any is missing (another architecture, a kernel without rseq,
//! `GLIBC_TUNABLES=glibc.pthread.rseq=0`, valgrind), every `RseqLock` of the process uses the
//! atomic [`FairLock`] protocol instead, decided once on first use and reported by
//! [`rseq::status`](crate::rseq::status) and [`RseqLock::kind`]. A thread of its own without a
//! registration (it unregistered, or the kernel refused it) reads `cpu_id` -1 or -2, which no
//! lock's CPU equals (the locks' own "no CPU" marks are positive), so its sequences never
//! commit and it takes the requester's path.
//!
//! # What it may not do
//!
//! It has no [`RawRemoteLock`](crate::RawRemoteLock) impl: taking it from another CPU is
//! correct but costs an answer wait or an inter-processor interrupt, so
//! [`PerCpu::lock`](crate::PerCpu::lock), [`PerCpu::for_each_locked`](crate::PerCpu::for_each_locked)
//! and remote-mode work do not compile for it, and [`Qpw::per_cpu_with`](crate::Qpw::per_cpu_with)
//! refuses to make it for an instance with a remote-mode CPU. The paths that touch the word are
//! therefore: `lock_local`/`try_lock_local` from threads of the CPU (the fast path; a thread
//! that migrated picks its new CPU's lock), [`PerCpu::lock_work`](crate::PerCpu::lock_work)
//! from the CPU's worker (pinned there), the release from wherever the holder now runs, and
//! the requester's path for the rare thread that is bound to the CPU but runs elsewhere, and
//! for [`PerCpu::read_each`](crate::PerCpu::read_each), the slow walk over every CPU for final
//! sums. [`FencedLock`](crate::FencedLock) is this lock with the remote capability.

mod answer;
#[cfg(loom)]
mod loom_mock;
#[cfg(loom)]
pub(crate) use loom_mock::migrated as mock_migrated;
mod requester;
mod section;
mod wait;

use std::fmt;

use crate::raw_lock::LocalAttempt;
use crate::sync::{AtomicU32, Ordering};
use crate::{FairLock, RawLocalLock};
pub use answer::Polled;
pub(crate) use answer::Poller;
#[cfg(all(feature = "test-hooks", not(loom)))]
pub(crate) use answer::{beacon_counters, set_beacon};
pub(crate) use requester::take_flags;
pub use requester::{acks, fence_counts, set_acks, FenceCounts};
pub(crate) use section::OwnerPath;
use section::{Release, Section};

const FREE: u32 = 0;
const HELD: u32 = 1;
/// The low bits of a hand-over to a sleeping waiter; the hand-over's generation sits above
/// them, so that no two hand-overs in a row have the same value.
const HANDOFF: u32 = 2;
/// The low bits of a requester's flag; the flag's epoch sits above them.
const FENCED: u32 = 3;
const EPOCH_SHIFT: u32 = 2;
const EPOCH_MASK: u32 = u32::MAX >> EPOCH_SHIFT;

/// The flag of `epoch`: `FENCED | epoch << 2`.
#[inline]
const fn flag(epoch: u32) -> u32 {
    FENCED | ((epoch & EPOCH_MASK) << EPOCH_SHIFT)
}

/// The hand-over of `generation`: `HANDOFF | generation << 2`.
#[inline]
const fn handoff(generation: u32) -> u32 {
    HANDOFF | ((generation & EPOCH_MASK) << EPOCH_SHIFT)
}

/// Whether the word holds a hand-over (of any generation).
#[inline]
const fn is_handoff(word: u32) -> bool {
    word & FENCED == HANDOFF
}

/// Whether the word holds a requester's flag (of any epoch).
#[inline]
const fn is_flag(word: u32) -> bool {
    word & FENCED == FENCED
}

/// The CPU of a lock made by [`RseqLock::new`]: no CPU, so no sequence ever commits and every
/// acquisition takes the requester's path. Positive as an `i32`, so that no `cpu_id` the
/// kernel writes equals it: -1 (`RSEQ_CPU_ID_UNINITIALIZED`, a thread that never registered or
/// unregistered) and -2 (`RSEQ_CPU_ID_REGISTRATION_FAILED`) are negative, and real CPU
/// numbers are far smaller (`NR_CPUS` is at most 8192).
const NO_CPU: u32 = i32::MAX as u32;
/// The CPU of every lock in the fallback: as [`NO_CPU`], no `cpu_id` equals it.
const FALLBACK_CPU: u32 = NO_CPU - 1;

/// Which protocol a lock uses in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LocalLockKind {
    /// [`FairLock`]: one atomic word, compare-and-swap to take and to release.
    Fair,
    /// [`RseqLock`] with restartable sequences: plain stores on the owner's path.
    Rseq,
    /// [`Owner`](crate::Owner) of an [`OwnedPerCpu`](crate::OwnedPerCpu): one owning thread per
    /// CPU, a borrow flag, no lock word.
    OwnerOnly,
}

impl LocalLockKind {
    /// The kind's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            LocalLockKind::Fair => "fair",
            LocalLockKind::Rseq => "rseq",
            LocalLockKind::OwnerOnly => "owner-only",
        }
    }
}

impl fmt::Display for LocalLockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A per-CPU lock taken inside a restartable sequence: no atomic read-modify-write on the
/// owner's acquire or release (see the [module docs](self) for the protocol and its argument).
///
/// Made for a CPU with [`RseqLock::for_cpu`], which [`Qpw::per_cpu_with`](crate::Qpw::per_cpu_with)
/// does for every slot:
///
/// ```
/// use qpw_core::{CpuSpec, Policy, Qpw, RseqLock};
///
/// let qpw = Qpw::builder().policy(Policy::Queue).build()?;
/// let counters = qpw.per_cpu_with::<RseqLock, _>(|_cpu| 0u64)?;
/// *counters.lock_local()? += 1; // an unbound thread: its CPU from rseq, then the rseq lock
/// println!("{}", qpw_core::rseq::status());
///
/// // Remote mode would let other CPUs take the lock: refused.
/// let remote = Qpw::builder().cpus(CpuSpec::Logical(2)).policy(Policy::Remote).build()?;
/// assert!(remote.per_cpu_with::<RseqLock, _>(|_| 0u64).is_err());
/// # Ok::<(), qpw_core::Error>(())
/// ```
// `repr(C)`, 8-byte aligned, with `cpu` and `word` in the first 8 bytes and `cpu` again beside
// `waiters` in the next 8: the owner's sequences compare the CPU and the word (or the waiter
// count) with one 8-byte load each (`section.rs`, `take_owned` and `give_back`). A lock
// reached by the owner's fast path is also the first field of its slot (`percpu.rs`).
#[repr(C, align(8))]
pub struct RseqLock {
    /// The physical CPU whose threads may commit plain stores to `word`; `FALLBACK_CPU` in the
    /// fallback and `NO_CPU` for a lock of no CPU, which no `cpu_id` ever equals, so that the
    /// hot path can run the sequence first and look at `fallback` only when it fails
    /// ([`on_cpu`](Self::on_cpu)). It never changes, but the owner's release sequence
    /// stores it again, with the word, in one 8-byte store (`section.rs`, `give_back`), so it
    /// is an atomic: a std one in both builds, since no protocol of ours is in its value.
    cpu: std::sync::atomic::AtomicU32,
    word: AtomicU32,
    /// `cpu` again, beside `waiters`, for the release sequence's one load.
    release_cpu: u32,
    /// Registered waiters.
    waiters: AtomicU32,
    /// This process uses the `FairLock` protocol ([`RseqLock::kind`]); kept in the lock so
    /// that the hot path reads its own cache line, not a global.
    fallback: bool,
    /// The whole lock when the process falls back; otherwise the side mutex that lets one
    /// requester from another CPU at a time raise and settle a flag.
    fair: FairLock,
    /// The epoch of the last flag raised, advanced under the side mutex (which is what keeps
    /// two requesters from raising flags of one epoch).
    epoch: AtomicU32,
    /// The call its CPU's beacon was given for the flag in the word (written under the side
    /// mutex), so that the flag's release can tell whether an answer came while it held. In
    /// two 32-bit halves, so that the lock keeps its 4-byte alignment and layout (a 64-bit
    /// field moved the word and lengthened the owner's path by 2-4 instructions through
    /// register allocation alone): only the flag's holder writes and reads it, one thread.
    flag_call: [AtomicU32; 2],
    /// The generation of the last hand-over, advanced by the releasing holder.
    handoffs: AtomicU32,
    /// The lock's CPU as the mock kernel keeps it (its aborts and beacon), shared with every
    /// other lock of the CPU.
    #[cfg(loom)]
    mock: &'static loom_mock::Cpu,
    /// The waiters asleep on the word, as the mock kernel keeps them.
    #[cfg(loom)]
    futex: loom_mock::Futex,
}

impl RseqLock {
    /// The physical CPU whose threads may commit plain stores to the word (`FALLBACK_CPU` in
    /// the fallback, `NO_CPU` for a lock of no CPU).
    #[inline(always)]
    fn on_cpu(&self) -> u32 {
        self.cpu.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records the call made for the flag now in the word (its requester, under the side
    /// mutex).
    fn set_flag_call(&self, call: u64) {
        self.flag_call[0].store(call as u32, Ordering::Relaxed);
        self.flag_call[1].store((call >> 32) as u32, Ordering::Relaxed);
    }

    /// The call made for the flag in the word (read by the same thread, its holder).
    fn flag_call(&self) -> u64 {
        u64::from(self.flag_call[0].load(Ordering::Relaxed))
            | u64::from(self.flag_call[1].load(Ordering::Relaxed)) << 32
    }
}

impl fmt::Debug for RseqLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RseqLock")
            .field("cpu", &self.on_cpu())
            .field("word", &self.word.load(Ordering::Relaxed))
            .field("kind", &Self::kind())
            .finish()
    }
}

impl RseqLock {
    /// The protocol every `RseqLock` of this process uses: [`LocalLockKind::Rseq`], or
    /// [`LocalLockKind::Fair`] when restartable sequences are unavailable
    /// ([`rseq::status`](crate::rseq::status) says why).
    pub fn kind() -> LocalLockKind {
        if crate::rseq::lock_available() {
            LocalLockKind::Rseq
        } else {
            LocalLockKind::Fair
        }
    }

    #[inline(always)]
    fn fallback(&self) -> bool {
        self.fallback
    }

    /// The physical CPU this lock belongs to, if any (none in the fallback, where it does not
    /// matter).
    pub fn cpu(&self) -> Option<usize> {
        (self.on_cpu() < FALLBACK_CPU).then_some(self.on_cpu() as usize)
    }

    /// One attempt from wherever the thread runs: the sequence, or the requester's path.
    fn try_once(&self) -> bool {
        match self.section_answering() {
            Section::Acquired => true,
            Section::Busy => false,
            Section::WrongCpu | Section::Aborted => self.try_fenced(),
        }
    }

    /// Everything but an uncontended acquisition on the lock's CPU: an aborted sequence is
    /// run again, and a busy lock (or one of another CPU) is waited for, except that with
    /// `elsewhere_gives_up` a thread that runs on another CPU gets `Elsewhere` and nothing
    /// taken (`lock_on_current_cpu`'s contract).
    ///
    /// It is also where the owner's fast path ([`OwnerPath`]) goes when its sequence misses:
    /// that sequence was the first try.
    #[cold]
    pub(crate) fn acquire_slow(&self, elsewhere_gives_up: bool) -> LocalAttempt {
        if self.fallback() {
            self.fair.lock();
            return LocalAttempt::Locked;
        }
        match self.section_answering() {
            Section::Acquired => LocalAttempt::Locked,
            Section::WrongCpu if elsewhere_gives_up => LocalAttempt::Elsewhere,
            Section::WrongCpu if self.try_fenced() => LocalAttempt::Locked,
            _ => {
                let taken = self.lock_slow(None);
                debug_assert!(taken, "no deadline, so only a hold ends the wait");
                LocalAttempt::Locked
            }
        }
    }
}

// SAFETY: exclusion and hand-over, as argued in the module docs (the answer's part in
// `rseq_lock/answer.rs`): (1) every store that takes the lock starts from `FREE` and is either a
// committed restartable sequence of the lock's CPU (mutually exclusive among themselves, since
// the kernel aborts one preempted between its load and its store) or a `CAS` to a flag of a new
// epoch, settled by an owner's answer or a fence of that CPU and then checked; (2) in every
// other state only the holder (release, itself a sequence of the lock's CPU or a full-fenced
// store) or one waiter (`CAS` from `HANDOFF`) stores; (3) each acquisition reads the word with
// acquire ordering the value a release stored with release ordering. In the fallback every
// operation forwards to `FairLock`, one for one.
unsafe impl RawLocalLock for RseqLock {
    const OWN_CPU_ONLY: bool = true;

    /// A lock of no CPU: every acquisition takes the requester's path (a `CAS`, no fence: no
    /// sequence can commit on it). Use [`for_cpu`](RawLocalLock::for_cpu).
    fn new() -> Self {
        Self::for_cpu(NO_CPU as usize)
    }

    fn for_cpu(phys: usize) -> Self {
        let fallback = !crate::rseq::lock_available();
        let cpu = if fallback {
            FALLBACK_CPU
        } else {
            u32::try_from(phys)
                .ok()
                .filter(|&c| c < FALLBACK_CPU)
                .unwrap_or(NO_CPU)
        };
        Self {
            cpu: std::sync::atomic::AtomicU32::new(cpu),
            word: AtomicU32::new(FREE),
            release_cpu: cpu,
            waiters: AtomicU32::new(0),
            fallback,
            fair: FairLock::new(),
            epoch: AtomicU32::new(0),
            flag_call: [AtomicU32::new(0), AtomicU32::new(0)],
            handoffs: AtomicU32::new(0),
            #[cfg(loom)]
            mock: loom_mock::Cpu::of(cpu),
            #[cfg(loom)]
            futex: loom_mock::Futex::new(),
        }
    }

    #[inline]
    fn lock(&self) {
        // The sequence first: in the fallback it always answers `WrongCpu` (see `cpu`).
        if self.section() != Section::Acquired {
            let taken = self.acquire_slow(false);
            debug_assert_eq!(taken, LocalAttempt::Locked);
        }
    }

    #[inline]
    fn try_lock(&self) -> bool {
        match self.section_answering() {
            Section::Acquired => true,
            Section::Busy => false,
            _ if self.fallback() => self.fair.try_lock(),
            _ => self.try_fenced(),
        }
    }

    /// Waits on the futex until the deadline, as `lock` does without one: a requester raises
    /// its flag and fences (or gets the owner's answer) once, not at every look.
    fn try_lock_until(&self, deadline: std::time::Instant) -> bool {
        if self.fallback() {
            return self.fair.try_lock_until(deadline);
        }
        self.try_once() || self.lock_slow(Some(deadline))
    }

    #[inline]
    unsafe fn unlock(&self) {
        if self.fallback() {
            // SAFETY: the caller holds the lock, which in the fallback is `fair` itself.
            return unsafe { self.fair.unlock() };
        }
        loop {
            match self.release_section() {
                Release::Done => return,
                Release::Aborted => continue,
                Release::Slow => return self.unlock_slow(),
            }
        }
    }

    #[inline]
    fn lock_on_current_cpu(&self) -> LocalAttempt {
        // The sequence first: in the fallback it always answers `WrongCpu` (see `cpu`).
        if self.section() == Section::Acquired {
            return LocalAttempt::Locked;
        }
        self.acquire_slow(true)
    }

    #[inline]
    fn as_rseq(&self) -> Option<&RseqLock> {
        Some(self)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn excludes_on_its_cpu_and_from_elsewhere() {
        let before = crate::current_affinity().unwrap();
        let allowed = crate::allowed_cpus().unwrap();
        let cpu = allowed.first().unwrap();
        crate::pin_current_thread(cpu).unwrap();
        let lock = RseqLock::for_cpu(cpu);
        lock.lock();
        assert!(!lock.try_lock());
        // SAFETY: held just above.
        unsafe { lock.unlock() };
        assert_eq!(lock.lock_on_current_cpu(), LocalAttempt::Locked);
        // SAFETY: held just above.
        unsafe { lock.unlock() };

        // From another CPU: the fenced path.
        if let Some(other) = allowed.iter().find(|&c| c != cpu) {
            crate::pin_current_thread(other).unwrap();
            if RseqLock::kind() == LocalLockKind::Rseq {
                assert_eq!(lock.lock_on_current_cpu(), LocalAttempt::Elsewhere);
            }
            assert!(lock.try_lock());
            assert!(!lock.try_lock());
            // SAFETY: held by the try_lock above.
            unsafe { lock.unlock() };
        }
        // A lock of no CPU works from anywhere.
        let nowhere = RseqLock::new();
        nowhere.lock();
        assert!(!nowhere.try_lock());
        // SAFETY: held just above.
        unsafe { nowhere.unlock() };
        crate::set_current_affinity(&before).unwrap();
    }
}
