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
//!   the sequence and we try again. No atomic read-modify-write. When the word holds a flag,
//!   the owner *answers*: a second sequence reads its CPU's call counter, and the owner stores
//!   what it read into the CPU's answer cell (and keeps answering while it waits).
//! - **Release, on the lock's CPU**: another restartable sequence, which checks the CPU and that
//!   no waiter is registered, and commits `FREE`. No atomic read-modify-write either.
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
//! # The answer: a fence the owner makes for free
//!
//! The fence's only job is to settle the sequences of the lock's CPU that may have loaded
//! `FREE` before our flag. A restartable sequence of that CPU settles them too, when it reads
//! a call made after the flag: that read ran on the lock's CPU inside a sequence (so with the
//! thread on that CPU since its CPU check), and
//!
//! 1. no sequence of that CPU committed over the flag before it: that commit would be earlier
//!    in the CPU's own order, and the requester's check of the word (which happens after it
//!    sees the answer, published after the read) sees it (the flag, with its epoch, never
//!    comes back once overwritten);
//! 2. any other sequence in flight on that CPU belongs to a thread that is not running, so it
//!    was preempted and will be aborted before it can commit;
//! 3. every later sequence of that CPU loads our flag or a newer value, since the call was
//!    made (a release) after the flag was raised, and the read acquired it.
//!
//! So an answer that has reached our call proves what the fence would have, for every flag we
//! raised on that CPU's locks before the call, and the requester skips the fence and its
//! interrupt. A walk over many CPUs raises all its flags, calls each CPU once, and waits for
//! the answers together; a drain that takes a second lock of a CPU while it holds the first
//! gets its answer from the owner, which answers again and again while it waits for the first.
//! The answer must come from a sequence of the lock's CPU (a thread that merely loads the
//! counter elsewhere proves nothing about that CPU's sequences) and must be compared with the
//! call (an answer to an earlier call says nothing about a later flag); the side mutex keeps a
//! lock's epochs unique, since the counter is advanced under it, so that the check after the
//! answer cannot take another requester's flag for ours. A requester waits for the answer only
//! while answers come: up to 2 us after an answered call, not at all after a wait that got
//! none, and again as soon as an answer is seen (after a fence, or while its flag held the
//! lock); the budget is per CPU. An owner that runs without touching its lock never answers,
//! and gets the fence. [`set_acks`] turns the waiting off, for comparisons. The owner's
//! acquire sequence is the one it had before answers existed: the answer is taken only on the
//! slow path, when the sequence finds the word busy and a look at it shows a flag.
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
//!
//! # Under loom
//!
//! The kernel is mocked, not the protocol. A sequence is three loom steps: *start* (check the
//! CPU, take a mark), the *load* (of the word, or for a release of the waiter count), a
//! free-standing loom atomic, and the *commit*; loom may run any other thread between any two
//! of them. The commit stores without looking at the word again, as the real store does; the
//! only thing that keeps a commit whose load has gone stale from landing is an abort, and
//! aborts come only from where the kernel's come: another sequence starting on the same CPU
//! (the thread in flight there was preempted) and the CPU fence (its interrupt). Each lock
//! counts those events under a loom mutex; the commit checks the count is still its start's
//! and stores in the same step, as the kernel's abort, which moves the instruction pointer,
//! makes them one.
//!
//! That mutex is taken only at points where the kernel synchronises with the CPU: a sequence's
//! start and commit, and the fence's interrupt, which is a full barrier on the target CPU that
//! the caller waits for. So it orders nothing the kernel does not: a commit that succeeds has
//! synchronised only with its own start or with threads of its own CPU (which the context
//! switch between them orders anyway), and the fence sees the owner's earlier stores and
//! passes on the caller's `CAS` only as the interrupt landing between two of the owner's
//! instructions would. The commit's store is an ignored-result `swap` rather than a `store`, to
//! step round loom 0.7 letting a plain store slip between the read and the write of a
//! concurrent `CAS` (tokio-rs/loom#254); a thread's CPU is `rseq::mock::migrate_to`; `futex`
//! is a loom condition variable checked under its mutex (the bucket lock), whose wake wakes
//! one waiter, as `FUTEX_WAKE` with 1 does; the slow paths' full barriers are `SeqCst` fences
//! (loom models those, not the ordering of `SeqCst` accesses); a requester's wait for an
//! answer is one more look, which loom may place anywhere; and a waiter does not spin before
//! sleeping (`SPINS` says why). `rseq::mock::with_mutation` leaves out one step at a time (the
//! requester's fence or its check, the answer's CPU or epoch, the side mutex, the waiter's
//! fence), so that the models can show they catch each loss.

use std::fmt;
#[cfg(not(loom))]
use std::time::Instant;

#[cfg(not(loom))]
use crossbeam_utils::CachePadded;

use crate::raw_lock::LocalAttempt;
use crate::sync::{AtomicU32, Ordering};
use crate::{FairLock, RawLocalLock};

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

/// How long a requester waits for the owner's answer before it fences the CPU, while answers
/// come (0 after a wait that got none; see [`Beacon::budget`]). A fence costs the
/// requester about 15-20 us on the development VM and the target an interrupt, so waiting a
/// few microseconds for an owner that is busy on its lock is the better deal for both.
#[cfg(not(loom))]
const ACK_BUDGET_NS: u32 = 2_000;
#[cfg(loom)]
const ACK_BUDGET_NS: u32 = 1;

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

/// Whether requesters wait for owners' answers before they fence (see [`set_acks`]).
#[cfg(not(loom))]
static ACKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Turns the owners' answers on or off for every requester of the process (on by default):
/// with them off, a requester on another CPU always fences the lock's CPU with `membarrier`
/// after raising its flag, as the protocol did before answers existed. For measurements and
/// tests that compare the two; exclusion holds either way. Owners still answer (their path
/// does not change).
///
/// ```
/// qpw_core::fenced_lock::set_acks(false);
/// assert!(!qpw_core::fenced_lock::acks());
/// qpw_core::fenced_lock::set_acks(true);
/// ```
pub fn set_acks(on: bool) {
    #[cfg(not(loom))]
    ACKS.store(on, std::sync::atomic::Ordering::Relaxed);
    #[cfg(loom)]
    crate::rseq::mock::set_acks(on);
}

/// Whether requesters wait for owners' answers before they fence ([`set_acks`]).
pub fn acks() -> bool {
    #[cfg(not(loom))]
    {
        ACKS.load(std::sync::atomic::Ordering::Relaxed)
    }
    #[cfg(loom)]
    {
        crate::rseq::mock::acks()
    }
}

/// How the flags raised by this process's requesters were settled, since it started
/// ([`fence_counts`]): what a fenced drain cost the CPUs it drained.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceCounts {
    /// Settled by the owner's answer: no fence, no interrupt on the owner's CPU.
    pub answered: u64,
    /// Settled by a `membarrier` fence of the owner's CPU (an interrupt there, if a thread of
    /// the process ran on it).
    pub fenced: u64,
    /// An owner's sequence committed over the flag before it was settled: the requester
    /// waited for that holder instead.
    pub overtaken: u64,
}

impl FenceCounts {
    /// The counts since `earlier`.
    pub fn since(&self, earlier: &FenceCounts) -> FenceCounts {
        FenceCounts {
            answered: self.answered.saturating_sub(earlier.answered),
            fenced: self.fenced.saturating_sub(earlier.fenced),
            overtaken: self.overtaken.saturating_sub(earlier.overtaken),
        }
    }
}

#[cfg(not(loom))]
static COUNTS: [std::sync::atomic::AtomicU64; 3] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];

/// How this process's requesters have settled their flags so far (process-wide, all
/// [`RseqLock`]s and [`FencedLock`](crate::FencedLock)s): answered by the owner, fenced, or
/// overtaken by an owner. Take two readings and [`FenceCounts::since`] to see what a drain
/// cost.
///
/// ```
/// let before = qpw_core::fenced_lock::fence_counts();
/// // ... drains ...
/// let cost = qpw_core::fenced_lock::fence_counts().since(&before);
/// println!("{} fences, {} answers", cost.fenced, cost.answered);
/// ```
pub fn fence_counts() -> FenceCounts {
    #[cfg(not(loom))]
    {
        let get = |i: usize| COUNTS[i].load(std::sync::atomic::Ordering::Relaxed);
        FenceCounts {
            answered: get(ANSWERED),
            fenced: get(FENCED_BY_IPI),
            overtaken: get(OVERTAKEN),
        }
    }
    #[cfg(loom)]
    {
        FenceCounts::default()
    }
}

/// [`COUNTS`]' slots.
const ANSWERED: usize = 0;
const FENCED_BY_IPI: usize = 1;
const OVERTAKEN: usize = 2;

/// Counts one settled flag (slow path only): [`ANSWERED`], [`FENCED_BY_IPI`] or [`OVERTAKEN`].
#[inline]
fn count(_which: usize) {
    #[cfg(not(loom))]
    COUNTS[_which].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

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

/// A CPU's call and answer (module docs, "The answer"): a requester bumps `call` after raising
/// its flags on locks of the CPU; a restartable sequence running on the CPU reads `call`, and
/// its thread publishes what it read in `answer`. An answer that has reached a requester's call
/// settles every flag that requester raised on the CPU's locks before the call, whichever lock
/// the answering thread was waiting for.
#[derive(Debug)]
pub(crate) struct Beacon {
    /// Calls made so far (wrapping).
    call: AtomicU32,
    /// The newest call a sequence of the CPU has read and its thread published.
    answer: AtomicU32,
    /// How long the CPU's next requester waits for an answer before it fences, in
    /// nanoseconds: [`ACK_BUDGET_NS`] while answers come, 0 after a wait that got none, and
    /// back up as soon as an answer is seen again (after a fence, or while a flag held a lock).
    budget: AtomicU32,
}

impl Beacon {
    #[cfg(not(loom))]
    const fn new() -> Self {
        Self {
            call: AtomicU32::new(0),
            answer: AtomicU32::new(0),
            budget: AtomicU32::new(ACK_BUDGET_NS),
        }
    }

    #[cfg(loom)]
    fn new() -> Self {
        Self {
            call: AtomicU32::new(0),
            answer: AtomicU32::new(0),
            budget: AtomicU32::new(ACK_BUDGET_NS),
        }
    }

    /// Whether an answer of `answer` has reached call `call` (counters wrap).
    #[inline]
    fn reached(answer: u32, call: u32) -> bool {
        #[cfg(loom)]
        if crate::rseq::mock::mutation() == crate::rseq::mock::Mutation::AckWithoutEpoch {
            return answer != 0;
        }
        answer.wrapping_sub(call) as i32 >= 0
    }
}

/// Every physical CPU's beacon, on its own cache line (128 KiB of zeroed memory, touched only
/// for the CPUs that are drained).
#[cfg(not(loom))]
static BEACONS: [CachePadded<Beacon>; crate::CpuSet::MAX_CPU + 1] =
    [const { CachePadded::new(Beacon::new()) }; crate::CpuSet::MAX_CPU + 1];

/// The outcome of one restartable sequence that tries to take the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Section {
    /// Committed: the lock is ours.
    Acquired,
    /// The word was not `FREE`.
    Busy,
    /// The thread does not run on the lock's CPU (or has no rseq registration).
    WrongCpu,
    /// The kernel aborted the sequence (preemption, migration, signal): try again.
    Aborted,
}

/// The outcome of one restartable sequence that reads a word on the lock's CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Read on the lock's CPU, with the thread there from the CPU check to the load.
    Seen(u32),
    /// The thread does not run on the lock's CPU.
    WrongCpu,
    /// The kernel aborted the sequence: try again.
    Aborted,
}

/// The outcome of one restartable sequence that tries to release the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Release {
    /// Committed `FREE`, with no waiter registered.
    Done,
    /// A waiter is registered, or the thread does not run on the lock's CPU: release with the
    /// slow path's full fences.
    Slow,
    /// The kernel aborted the sequence: try again.
    Aborted,
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
pub struct RseqLock {
    word: AtomicU32,
    /// Registered waiters.
    waiters: AtomicU32,
    /// The physical CPU whose threads may commit plain stores to `word`; `FALLBACK_CPU` in the
    /// fallback and `NO_CPU` for a lock of no CPU, which no `cpu_id` ever equals, so that the
    /// hot path can run the sequence first and look at `fallback` only when it fails.
    cpu: u32,
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
    /// mutex), so that the flag's release can tell whether an answer came while it held.
    flag_call: AtomicU32,
    /// The generation of the last hand-over, advanced by the releasing holder.
    handoffs: AtomicU32,
    #[cfg(loom)]
    mock: loom_mock::Cpu,
}

impl fmt::Debug for RseqLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RseqLock")
            .field("cpu", &self.cpu)
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
        (self.cpu < FALLBACK_CPU).then_some(self.cpu as usize)
    }

    /// One restartable sequence: if the thread runs on the lock's CPU and the word is `FREE`,
    /// commit `HELD`; if it is not, say what it held.
    #[cfg(all(not(loom), target_arch = "x86_64"))]
    #[inline(always)]
    fn section(&self) -> Section {
        let Some(area) = crate::rseq::area() else {
            return Section::WrongCpu;
        };
        let word = self.word.as_ptr();
        let outcome: u32;
        // SAFETY: (1) `area` is the calling thread's `struct rseq` as glibc registered it (the
        // lock is used only when glibc registered one: `lock_available`), so `cpu_id` at
        // offset 4 and `rseq_cs` at offset 8 are in bounds, and the thread may write `rseq_cs`
        // (it is the field through which user space arms a sequence); a thread without a
        // registration (it never had one, or unregistered) has `cpu_id` -1 or -2, which no
        // lock's `cpu` equals (`NO_CPU`), so it never reaches the sequence's store. (2) The
        // descriptor (`struct rseq_cs`: version 0, flags 0, start_ip, post_commit_offset,
        // abort_ip) is emitted 32-byte aligned into the writable `__rseq_cs` section and lives
        // for the whole program; the kernel reads it only while `rseq_cs` points at it. (3)
        // The abort handler is outside [start_ip, start_ip + post_commit_offset) and is
        // preceded by the 4-byte signature glibc registered (RSEQ_SIG, 0x53053053, encoded as
        // the operand of a `ud1` so that disassemblers stay in step), as the kernel checks
        // before jumping to it. (4) `word` points to this lock's `AtomicU32`, live for
        // `&self`; the sequence's 4-byte `mov` load and store are single-copy atomic, and the
        // protocol (module docs) guarantees no other store to the word can race with the
        // committing store. (5) No stack is used; flags are clobbered (declared by default);
        // every path ends at label 9 with `outcome` set: the commit falls through to it, and
        // the out-of-line exits (in `__rseq_failure`, outside the sequence's range like the
        // abort handler) jump back.
        unsafe {
            std::arch::asm!(
                // The descriptor the kernel consults on preemption.
                ".pushsection __rseq_cs, \"aw\"",
                ".balign 32",
                "3:",
                ".long 0, 0",
                ".quad 4f, (5f - 4f), 6f",
                ".popsection",
                // The outcome if the sequence commits; the other exits overwrite it.
                "xor {out:e}, {out:e}",
                // Arm it: rseq->rseq_cs = &descriptor.
                "lea {tmp}, [rip + 3b]",
                "mov qword ptr [{area} + 8], {tmp}",
                // start_ip: are we on the lock's CPU?
                "4:",
                "cmp dword ptr [{area} + 4], {cpu:e}",
                "jne 7f",
                // Is the word FREE?
                "cmp dword ptr [{word}], 0",
                "jne 8f",
                // Commit: the last instruction of the sequence.
                "mov dword ptr [{word}], 1",
                // post_commit_ip: the fast path falls through to the end.
                "5:",
                // The other exits, out of line, and the abort handler with the signature just
                // before it.
                ".pushsection __rseq_failure, \"ax\"",
                "7:",
                "mov {out:e}, 2",
                "jmp 9f",
                "8:",
                "mov {out:e}, 1",
                "jmp 9f",
                ".byte 0x0f, 0xb9, 0x3d",
                ".long 0x53053053",
                "6:",
                "mov {out:e}, 3",
                "jmp 9f",
                ".popsection",
                "9:",
                area = in(reg) area,
                cpu = in(reg) self.cpu,
                word = in(reg) word,
                tmp = out(reg) _,
                out = out(reg) outcome,
                options(nostack),
            );
        }
        match outcome {
            0 => Section::Acquired,
            1 => Section::Busy,
            2 => Section::WrongCpu,
            _ => Section::Aborted,
        }
    }

    /// One restartable sequence that releases the lock: if the thread runs on the lock's CPU
    /// and no waiter is registered, commit `FREE`.
    #[cfg(all(not(loom), target_arch = "x86_64"))]
    #[inline(always)]
    fn release_section(&self) -> Release {
        let Some(area) = crate::rseq::area() else {
            return Release::Slow;
        };
        let outcome: u32;
        // SAFETY: as in `section`, points (1), (2), (3) and (5), for a second descriptor;
        // (4) `word` and `waiters` point to this lock's atomics, live for `&self`; the caller
        // holds the lock, so no other party stores to the word (module docs), and the
        // committing store is a plain 4-byte `mov` (a release store on x86-64, after the
        // critical section's accesses, which the asm block's memory clobber keeps before it).
        unsafe {
            std::arch::asm!(
                ".pushsection __rseq_cs, \"aw\"",
                ".balign 32",
                "3:",
                ".long 0, 0",
                ".quad 4f, (5f - 4f), 6f",
                ".popsection",
                "xor {out:e}, {out:e}",
                "lea {tmp}, [rip + 3b]",
                "mov qword ptr [{area} + 8], {tmp}",
                // start_ip: on the lock's CPU, with nobody waiting?
                "4:",
                "cmp dword ptr [{area} + 4], {cpu:e}",
                "jne 7f",
                "cmp dword ptr [{waiters}], 0",
                "jne 7f",
                // Commit FREE.
                "mov dword ptr [{word}], 0",
                "5:",
                ".pushsection __rseq_failure, \"ax\"",
                "7:",
                "mov {out:e}, 1",
                "jmp 9f",
                ".byte 0x0f, 0xb9, 0x3d",
                ".long 0x53053053",
                "6:",
                "mov {out:e}, 2",
                "jmp 9f",
                ".popsection",
                "9:",
                area = in(reg) area,
                cpu = in(reg) self.cpu,
                word = in(reg) self.word.as_ptr(),
                waiters = in(reg) self.waiters.as_ptr(),
                tmp = out(reg) _,
                out = out(reg) outcome,
                options(nostack),
            );
        }
        match outcome {
            0 => Release::Done,
            1 => Release::Slow,
            _ => Release::Aborted,
        }
    }

    /// One restartable sequence that loads `cell` if the thread runs on the lock's CPU: a load
    /// known to have run there (the answer's read of the CPU's call).
    #[cfg(all(not(loom), target_arch = "x86_64"))]
    #[inline]
    fn read_section(&self, cell: &AtomicU32) -> Read {
        let Some(area) = crate::rseq::area() else {
            return Read::WrongCpu;
        };
        let outcome: u32;
        let seen: u32;
        // SAFETY: as in `section`, points (1), (2), (3) and (5), for a third descriptor; (4)
        // `cell` is a live `AtomicU32` for the borrow, read with a single-copy-atomic 4-byte
        // `mov`; the sequence stores nothing but `rseq_cs`. Its critical section ends right
        // after the load, so an abort can only come between the CPU check and the load.
        unsafe {
            std::arch::asm!(
                ".pushsection __rseq_cs, \"aw\"",
                ".balign 32",
                "3:",
                ".long 0, 0",
                ".quad 4f, (5f - 4f), 6f",
                ".popsection",
                "xor {out:e}, {out:e}",
                "lea {tmp}, [rip + 3b]",
                "mov qword ptr [{area} + 8], {tmp}",
                "4:",
                "cmp dword ptr [{area} + 4], {cpu:e}",
                "jne 7f",
                "mov {seen:e}, dword ptr [{cell}]",
                "5:",
                ".pushsection __rseq_failure, \"ax\"",
                "7:",
                "mov {out:e}, 1",
                "jmp 9f",
                ".byte 0x0f, 0xb9, 0x3d",
                ".long 0x53053053",
                "6:",
                "mov {out:e}, 2",
                "jmp 9f",
                ".popsection",
                "9:",
                area = in(reg) area,
                cpu = in(reg) self.cpu,
                cell = in(reg) cell.as_ptr(),
                tmp = out(reg) _,
                seen = out(reg) seen,
                out = out(reg) outcome,
                options(nostack),
            );
        }
        match outcome {
            0 => Read::Seen(seen),
            1 => Read::WrongCpu,
            _ => Read::Aborted,
        }
    }

    /// As `section`.
    #[cfg(all(not(loom), not(target_arch = "x86_64")))]
    #[inline(always)]
    fn read_section(&self, _cell: &AtomicU32) -> Read {
        Read::WrongCpu
    }

    /// The mocked read: start, load, and a check that no abort came in between.
    #[cfg(loom)]
    fn read_section(&self, cell: &AtomicU32) -> Read {
        if crate::rseq::mock::current() != Some(self.cpu as usize) {
            return Read::WrongCpu;
        }
        let started = self.mock.start();
        let seen = cell.load(Ordering::Acquire);
        if self.mock.unaborted(started) {
            Read::Seen(seen)
        } else {
            Read::Aborted
        }
    }

    /// No sequence assembly for this architecture: `lock_available` is false, and the fallback
    /// never calls this.
    #[cfg(all(not(loom), not(target_arch = "x86_64")))]
    #[inline(always)]
    fn section(&self) -> Section {
        Section::WrongCpu
    }

    /// As `section`.
    #[cfg(all(not(loom), not(target_arch = "x86_64")))]
    #[inline(always)]
    fn release_section(&self) -> Release {
        Release::Slow
    }

    /// The mocked sequence (module docs, "Under loom"): three loom steps, so that loom can
    /// run any other thread between the load and the commit, and only an abort stops a commit
    /// whose load has gone stale.
    #[cfg(loom)]
    fn section(&self) -> Section {
        if crate::rseq::mock::current() != Some(self.cpu as usize) {
            return Section::WrongCpu;
        }
        let started = self.mock.start();
        if self.word.load(Ordering::Acquire) != FREE {
            return Section::Busy;
        }
        // The commit does not look at the word again: the store goes in whatever it holds
        // now, as the kernel's would, unless the sequence was aborted since `start`.
        if self
            .mock
            .commit(started, &self.word, HELD, Ordering::Relaxed)
        {
            Section::Acquired
        } else {
            Section::Aborted
        }
    }

    /// The mocked release sequence: start, the load of the waiter count, the commit.
    #[cfg(loom)]
    fn release_section(&self) -> Release {
        if crate::rseq::mock::current() != Some(self.cpu as usize) {
            return Release::Slow;
        }
        let started = self.mock.start();
        if self.waiters.load(Ordering::Relaxed) != 0 {
            return Release::Slow;
        }
        if self
            .mock
            .commit(started, &self.word, FREE, Ordering::Release)
        {
            Release::Done
        } else {
            Release::Aborted
        }
    }

    /// Runs the sequence until it is not aborted, and answers a requester's flag it found.
    #[inline]
    fn section_answering(&self) -> Section {
        loop {
            match self.section() {
                Section::Aborted => continue,
                Section::Busy => {
                    // A requester's flag? Then answer it (the answer reads the CPU's call in a
                    // sequence of its own: this look at the word is only the hint to do so).
                    if is_flag(self.word.load(Ordering::Relaxed)) {
                        self.answer();
                    }
                    return Section::Busy;
                }
                outcome => return outcome,
            }
        }
    }

    /// The lock's CPU's beacon (none for a lock of no CPU, or in the fallback).
    #[inline]
    fn beacon(&self) -> Option<&Beacon> {
        #[cfg(not(loom))]
        {
            BEACONS.get(self.cpu as usize).map(|b| &**b)
        }
        #[cfg(loom)]
        {
            (self.cpu < FALLBACK_CPU).then_some(&self.mock.beacon)
        }
    }

    /// The owner's answer (module docs, "The answer"): if the thread runs on the lock's CPU,
    /// read the CPU's call inside a restartable sequence and publish it. Called by a thread
    /// that found a flag in the word, and again and again while it spins on one.
    #[cold]
    fn answer(&self) {
        let Some(beacon) = self.beacon() else {
            return;
        };
        #[cfg(loom)]
        if crate::rseq::mock::mutation() == crate::rseq::mock::Mutation::AckFromAnyThread {
            let seen = beacon.call.load(Ordering::Acquire);
            beacon.answer.store(seen, Ordering::Release);
            return;
        }
        let seen = loop {
            match self.read_section(&beacon.call) {
                Read::Seen(seen) => break seen,
                Read::WrongCpu => return,
                Read::Aborted => continue,
            }
        };
        // Stored only when it changes, so that an owner spinning on a flag does not keep
        // taking the line from the requester that polls it.
        if beacon.answer.load(Ordering::Relaxed) != seen {
            beacon.answer.store(seen, Ordering::Release);
        }
    }

    /// Whether the requester of `flag` (call `call` of the CPU's beacon) may stop waiting: the
    /// CPU answered the call, or a sequence committed over the flag (the requester then lost,
    /// and will wait for that holder).
    #[inline]
    fn answered(&self, flag: u32, call: u32) -> bool {
        if self.word.load(Ordering::Relaxed) != flag {
            return true;
        }
        acks()
            && self
                .beacon()
                .is_some_and(|b| Beacon::reached(b.answer.load(Ordering::Acquire), call))
    }

    /// Calls the CPU, after the flags: `raise` the flags first, then `call` once.
    fn call(&self) -> u32 {
        self.beacon()
            .map_or(0, |b| b.call.fetch_add(1, Ordering::AcqRel).wrapping_add(1))
    }

    /// One attempt from wherever the thread runs: the sequence, or the requester's path.
    fn try_once(&self) -> bool {
        match self.section_answering() {
            Section::Acquired => true,
            Section::Busy => false,
            Section::WrongCpu | Section::Aborted => self.try_fenced(),
        }
    }

    /// Takes the side mutex (under loom a model may leave it out: `Mutation::NoSideMutex`).
    fn side_lock(&self) {
        #[cfg(loom)]
        if crate::rseq::mock::mutation() == crate::rseq::mock::Mutation::NoSideMutex {
            return;
        }
        self.fair.lock();
    }

    fn side_unlock(&self) {
        #[cfg(loom)]
        if crate::rseq::mock::mutation() == crate::rseq::mock::Mutation::NoSideMutex {
            return;
        }
        // SAFETY: taken by `side_lock` in this thread (every `raise` that returns a flag is
        // settled or backed out by the same thread, which unlocks once).
        unsafe { self.fair.unlock() };
    }

    /// The acquisition from another CPU: raise a flag, wait for the owner's answer, fence the
    /// CPU if none came, check.
    #[cold]
    fn try_fenced(&self) -> bool {
        let Some(flag) = self.raise() else {
            return false;
        };
        let call = self.call();
        let waited = self.wait_for_answer(flag, call);
        self.settle(flag, call, waited)
    }

    /// Raises a flag of a new epoch if the word is `FREE`, and keeps the side mutex until the
    /// flag is settled. `None` (side mutex released) when the word is not free.
    fn raise(&self) -> Option<u32> {
        if self.word.load(Ordering::Relaxed) != FREE {
            return None;
        }
        self.side_lock();
        let epoch = self.epoch.load(Ordering::Relaxed).wrapping_add(1) & EPOCH_MASK;
        self.epoch.store(epoch, Ordering::Relaxed);
        let flag = flag(epoch);
        match self
            .word
            .compare_exchange(FREE, flag, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => Some(flag),
            Err(_) => {
                self.side_unlock();
                None
            }
        }
    }

    /// How long a requester waits for an answer now: nothing for a lock of no CPU (no owner
    /// can answer, and none needs fencing) or with answers off.
    fn budget(&self) -> u32 {
        match self.beacon() {
            Some(b) if acks() => b.budget.load(Ordering::Relaxed),
            _ => 0,
        }
    }

    /// Waits up to the budget for the answer to `flag`. Returns whether it waited at all
    /// (for the budget's adaptation in `settle`).
    fn wait_for_answer(&self, flag: u32, call: u32) -> bool {
        let budget = self.budget();
        if budget == 0 || self.answered(flag, call) {
            return false;
        }
        #[cfg(not(loom))]
        spin_until(budget, || self.answered(flag, call));
        // Under loom time does not pass: one more look, which loom may place anywhere.
        #[cfg(loom)]
        let _ = self.answered(flag, call);
        true
    }

    /// Settles a raised flag: fences the lock's CPU unless the owner answered (or committed
    /// over the flag), then checks that the flag is still in the word. Returns whether the
    /// lock is ours; either way the side mutex is released. Adapts the answer budget to what
    /// came: up when an answer is seen, 0 after a wait that got none.
    ///
    /// # Panics
    ///
    /// When the fence fails (`membarrier` returned an error): the lock cannot be taken
    /// safely, so the flag is backed out first, and nothing is held.
    fn settle(&self, flag: u32, call: u32, waited: bool) -> bool {
        let answered = self.answered(flag, call);
        if !answered && self.cpu < FALLBACK_CPU {
            if let Err(e) = self.requester_fence() {
                self.back_out(flag);
                self.side_unlock();
                fence_failed(self.cpu, &e);
            }
            count(FENCED_BY_IPI);
        }
        let held = self.still_flagged(flag);
        if let Some(beacon) = self.beacon() {
            if Beacon::reached(beacon.answer.load(Ordering::Relaxed), call) {
                beacon.budget.store(ACK_BUDGET_NS, Ordering::Relaxed);
            } else if waited && held {
                // A wait that got no answer (one that ended because an owner committed over
                // the flag is no sign that the owner does not answer).
                beacon.budget.store(0, Ordering::Relaxed);
            }
        }
        if held {
            self.flag_call.store(call, Ordering::Relaxed);
        }
        if !held {
            count(OVERTAKEN);
        } else if answered && self.cpu < FALLBACK_CPU {
            count(ANSWERED);
        }
        self.side_unlock();
        held
    }

    /// Takes a flag that could not be settled out of the word, so that nothing is left held:
    /// the word goes back to `FREE` unless a sequence committed over the flag (then that
    /// owner holds the lock, as it would have anyway). A waiter asleep on the flag is woken.
    fn back_out(&self, flag: u32) {
        if self
            .word
            .compare_exchange(flag, FREE, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
        {
            full_fence();
            if self.waiters.load(Ordering::SeqCst) != 0 {
                self.futex_wake();
            }
        }
    }

    /// The check after the answer or the fence: the word still holds our flag, so no sequence
    /// committed over it. (Under loom a model may leave the check out: `Mutation::SkipCheck`.)
    #[inline]
    fn still_flagged(&self, flag: u32) -> bool {
        #[cfg(loom)]
        if crate::rseq::mock::mutation() == crate::rseq::mock::Mutation::SkipCheck {
            return true;
        }
        self.word.load(Ordering::Acquire) == flag
    }

    /// Aborts the sequences running on the lock's CPU and orders our stores before later ones.
    #[cfg(not(loom))]
    fn fence_cpu(&self) -> std::io::Result<()> {
        crate::rseq::fence_cpu(self.cpu as usize)
    }

    #[cfg(loom)]
    fn fence_cpu(&self) -> std::io::Result<()> {
        self.mock.fence();
        Ok(())
    }

    /// The requester's fence, in `settle` (under loom a model may leave it out:
    /// `Mutation::SkipFence`).
    fn requester_fence(&self) -> std::io::Result<()> {
        #[cfg(loom)]
        if crate::rseq::mock::mutation() == crate::rseq::mock::Mutation::SkipFence {
            return Ok(());
        }
        self.fence_cpu()
    }

    /// Everything but an uncontended acquisition on the lock's CPU: an aborted sequence is
    /// run again, and a busy lock (or one of another CPU) is waited for, except that with
    /// `elsewhere_gives_up` a thread that runs on another CPU gets `Elsewhere` and nothing
    /// taken (`lock_on_current_cpu`'s contract).
    #[cold]
    fn acquire_slow(&self, elsewhere_gives_up: bool) -> LocalAttempt {
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

    /// Whether the calling thread runs on the lock's CPU now.
    #[cfg(not(loom))]
    fn runs_here(&self) -> bool {
        crate::rseq::current_cpu() == Some(self.cpu as usize)
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
            if spins % 16 == 0 {
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
    fn lock_slow(&self, deadline: Option<std::time::Instant>) -> bool {
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
        self.cpu >= FALLBACK_CPU || self.fence_cpu().is_ok()
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
    fn unlock_slow(&self) {
        let word = self.word.load(Ordering::Relaxed);
        if let (true, Some(beacon)) = (is_flag(word), self.beacon()) {
            if Beacon::reached(
                beacon.answer.load(Ordering::Relaxed),
                self.flag_call.load(Ordering::Relaxed),
            ) {
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
    fn futex_wake(&self) {
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
        self.mock.futex_wait(&self.word, expected);
        true
    }

    #[cfg(loom)]
    fn futex_wake(&self) {
        self.mock.futex_wake();
    }
}

/// The full barrier between a store and a load of the waiter handshake (a registration and
/// its look at the word; a release and its look at the count). On x86-64 the locked
/// read-modify-write before it already is one, and this costs an `mfence` on slow paths only;
/// it is written out so that the argument holds in the language's memory model, where a
/// `SeqCst` read-modify-write followed by a load is not enough for loom (which treats `SeqCst`
/// accesses as acquire-release and models only `SeqCst` fences in full).
#[inline]
fn full_fence() {
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

/// Spins until `done` says so or `budget_ns` nanoseconds have passed (the clock read every 16
/// turns): a requester's wait for answers.
#[cfg(not(loom))]
fn spin_until(budget_ns: u32, mut done: impl FnMut() -> bool) {
    if budget_ns == 0 {
        return;
    }
    let start = Instant::now();
    let mut spins = 0u32;
    while !done() {
        crate::sync::spin_loop();
        spins = spins.wrapping_add(1);
        if spins % 16 == 0 && start.elapsed().as_nanos() >= u128::from(budget_ns) {
            return;
        }
    }
}

/// A requester's CPU fence failed: exclusion cannot be had, and the flag has been backed out.
#[cold]
#[inline(never)]
fn fence_failed(cpu: u32, error: &std::io::Error) -> ! {
    panic!(
        "qpw: the lock of cpu {cpu} cannot be taken from another CPU: its fence, \
         membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, MEMBARRIER_CMD_FLAG_CPU, {cpu}), \
         failed: {error}; nothing was taken (without the fence a restartable sequence on cpu \
         {cpu} could still commit)"
    )
}

/// The rseq locks' part of a walk over many CPUs' locks (`PerCpu::for_each_locked`): takes
/// every lock of `locks` (by index; `None` entries are not rseq locks and are left alone)
/// that it can without waiting on a holder, raising all their flags first, then waiting for
/// the owners' answers together and fencing only the CPUs that did not answer. Returns, per
/// entry, whether the lock is now held by the caller; the others must be taken the ordinary
/// way (an owner held them, or committed over the flag).
///
/// # Panics
///
/// When a fence fails, after backing out every flag not yet settled and releasing every lock
/// already taken: nothing is left held.
pub(crate) fn take_flags(locks: &[Option<&RseqLock>]) -> Vec<bool> {
    // 1. Raise: a sequence where we run on the lock's CPU, a flag elsewhere.
    let mut held = vec![false; locks.len()];
    let mut raised: Vec<(usize, u32, u32)> = Vec::new();
    for (i, lock) in locks.iter().enumerate() {
        let Some(lock) = lock else { continue };
        if lock.fallback() {
            continue;
        }
        match lock.section_answering() {
            Section::Acquired => held[i] = true,
            Section::Busy | Section::Aborted => {}
            Section::WrongCpu => {
                if let Some(flag) = lock.raise() {
                    raised.push((i, flag, 0));
                }
            }
        }
    }
    // 2. Call each CPU once, after all its flags: one answer there settles them all.
    for n in 0..raised.len() {
        let (i, _, _) = raised[n];
        let Some(lock) = locks[i] else { continue };
        let earlier = raised[..n]
            .iter()
            .find(|&&(j, _, _)| locks[j].is_some_and(|l| l.cpu == lock.cpu));
        raised[n].2 = match earlier {
            Some(&(_, _, call)) => call,
            None => lock.call(),
        };
    }
    // 3. Wait for the answers together, up to the longest budget among them.
    #[cfg(not(loom))]
    {
        let budget = raised
            .iter()
            .filter_map(|&(i, _, _)| locks[i].map(RseqLock::budget))
            .max()
            .unwrap_or(0);
        spin_until(budget, || {
            raised
                .iter()
                .all(|&(i, flag, call)| locks[i].is_none_or(|l| l.answered(flag, call)))
        });
    }
    // 4. Fence the CPUs that did not answer, and check each flag.
    let mut failure = None;
    for &(i, flag, call) in &raised {
        let Some(lock) = locks[i] else { continue };
        if failure.is_some() {
            lock.back_out(flag);
            lock.side_unlock();
            continue;
        }
        let waited = lock.budget() > 0;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            lock.settle(flag, call, waited)
        })) {
            Ok(taken) => held[i] = taken,
            Err(payload) => failure = Some(payload),
        }
    }
    if let Some(payload) = failure {
        for (i, lock) in locks.iter().enumerate() {
            if held[i] {
                if let Some(lock) = lock {
                    // SAFETY: taken above by this thread.
                    unsafe { lock.unlock() };
                }
            }
        }
        std::panic::resume_unwind(payload);
    }
    held
}

// SAFETY: exclusion and hand-over, as argued in the module docs: (1) every store that takes
// the lock starts from `FREE` and is either a committed restartable sequence of the lock's CPU
// (mutually exclusive among themselves, since the kernel aborts one preempted between its load
// and its store) or a `CAS` to a flag of a new epoch, settled by an owner's answer or a fence
// of that CPU and then checked; (2) in every other state only the holder (release, itself a
// sequence of the lock's CPU or a full-fenced store) or one waiter (`CAS` from `HANDOFF`)
// stores; (3) each acquisition reads the word with acquire ordering the value a release stored
// with release ordering. In the fallback every operation forwards to `FairLock`, one for one.
unsafe impl RawLocalLock for RseqLock {
    const OWN_CPU_ONLY: bool = true;

    /// A lock of no CPU: every acquisition takes the requester's path (a `CAS`, no fence: no
    /// sequence can commit on it). Use [`for_cpu`](RawLocalLock::for_cpu).
    fn new() -> Self {
        Self::for_cpu(NO_CPU as usize)
    }

    fn for_cpu(phys: usize) -> Self {
        let fallback = !crate::rseq::lock_available();
        Self {
            word: AtomicU32::new(FREE),
            waiters: AtomicU32::new(0),
            cpu: if fallback {
                FALLBACK_CPU
            } else {
                u32::try_from(phys)
                    .ok()
                    .filter(|&c| c < FALLBACK_CPU)
                    .unwrap_or(NO_CPU)
            },
            fallback,
            fair: FairLock::new(),
            epoch: AtomicU32::new(0),
            flag_call: AtomicU32::new(0),
            handoffs: AtomicU32::new(0),
            #[cfg(loom)]
            mock: loom_mock::Cpu::new(),
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

#[cfg(loom)]
mod loom_mock {
    //! The kernel side of restartable sequences, for loom (module docs, "Under loom").

    use crate::sync::{AtomicU32, Condvar, Mutex, Ordering};

    /// What the kernel does for one lock's CPU: abort sequences, and `futex`.
    #[derive(Debug)]
    pub(super) struct Cpu {
        /// How many times a sequence of this CPU has been aborted or begun: bumped when a
        /// sequence starts (the thread that had one in flight here was preempted) and by the
        /// CPU fence (its interrupt). The mutex is taken only at the moments the kernel
        /// synchronises with the CPU: a sequence's start and commit (a point in that CPU's
        /// instruction stream) and the fence's interrupt landing there.
        interrupts: Mutex<u64>,
        futex: Mutex<()>,
        woken: Condvar,
        /// The CPU's beacon: per lock under loom, where each model has one lock per CPU.
        pub(super) beacon: super::Beacon,
    }

    impl Cpu {
        pub(super) fn new() -> Self {
            Self {
                interrupts: Mutex::new(0),
                futex: Mutex::new(()),
                woken: Condvar::new(),
                beacon: super::Beacon::new(),
            }
        }

        /// A sequence starts on this CPU: one in flight here (another thread's, which must
        /// have been preempted for this one to run) is aborted. Returns the sequence's mark.
        pub(super) fn start(&self) -> u64 {
            let mut interrupts = self.interrupts.lock().unwrap();
            *interrupts += 1;
            *interrupts
        }

        /// The sequence's last instruction: stores `value` to `word` unless the sequence
        /// begun at `started` has been aborted since, in which case nothing is stored.
        ///
        /// The check and the store are one step, as the kernel makes them (its abort moves
        /// the instruction pointer before the store can run). The mutex adds no ordering the
        /// kernel lacks: the commit can only synchronise with what aborts it, and what it
        /// publishes (the store and what came before) reaches a later fence, which is the
        /// full barrier the fence's interrupt runs on this CPU.
        ///
        /// The store is a `swap` whose old value is ignored, not a plain `store`: loom 0.7
        /// lets a plain store slip between the read and the write of a concurrent RMW
        /// (tokio-rs/loom#254, fixed in the unmerged loom#391; seen in the models as the
        /// requester's `CAS` to `FENCED` apparently overwriting a `HELD` committed after it).
        /// As an RMW the store lands after every store loom has made so far, which is where
        /// the hardware puts it: x86's `CAS` is a locked instruction, so a plain store that
        /// executes after it is later in the word's coherence order.
        pub(super) fn commit(
            &self,
            started: u64,
            word: &AtomicU32,
            value: u32,
            ordering: Ordering,
        ) -> bool {
            let interrupts = self.interrupts.lock().unwrap();
            if *interrupts != started {
                return false;
            }
            word.swap(value, ordering);
            drop(interrupts);
            true
        }

        /// The end of a sequence that stores nothing: whether it ran to its end unaborted since
        /// `started` (a load inside it is then known to have run on this CPU).
        pub(super) fn unaborted(&self, started: u64) -> bool {
            *self.interrupts.lock().unwrap() == started
        }

        /// `membarrier(.._RSEQ, FLAG_CPU, cpu)`: the interrupt lands on this CPU between two
        /// of its instructions, aborts a sequence in flight, and is a full barrier there,
        /// synchronised with the caller both ways (the caller waits for it).
        pub(super) fn fence(&self) {
            *self.interrupts.lock().unwrap() += 1;
        }

        /// `FUTEX_WAIT`: sleeps unless the word has changed, checked under the bucket lock.
        pub(super) fn futex_wait(&self, word: &AtomicU32, expected: u32) {
            let guard = self.futex.lock().unwrap();
            if word.load(Ordering::SeqCst) == expected {
                drop(self.woken.wait(guard).unwrap());
            }
        }

        /// `FUTEX_WAKE` of one waiter, as the lock asks of the kernel, under the same bucket
        /// lock.
        pub(super) fn futex_wake(&self) {
            let _guard = self.futex.lock().unwrap();
            self.woken.notify_one();
        }
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
