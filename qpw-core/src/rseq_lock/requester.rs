//! The fenced protocol's requester side: how a thread that does not run on the lock's CPU takes
//! an [`RseqLock`] (a requester draining the CPU, a thread that migrated, one the kernel did not
//! register, or any taker of a lock of no CPU).
//!
//! # The steps
//!
//! One requester at a time per lock, under its side mutex: *raise* a flag of a new epoch (a
//! `CAS` of the word from `FREE`); *call* the lock's CPU (bump its beacon's call counter);
//! *wait* for an answer that has reached the call, up to the CPU's budget (`answer.rs` argues
//! why such an answer settles the flag); if none came, *fence* the lock's CPU with
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, MEMBARRIER_CMD_FLAG_CPU, cpu)`; then
//! *check*: the word still holding our flag means we hold the lock, anything else means a
//! sequence of that CPU committed `HELD` over it, and we wait like any waiter (`wait.rs`). A
//! fence that fails is never papered over: the flag is backed out and the call panics, saying
//! so, with nothing held.
//!
//! A walk over many CPUs' locks ([`take_flags`]) raises all its flags first, calls each CPU
//! once, waits for the answers together, and fences only the CPUs that did not answer.
//! [`set_acks`] turns the waiting off, for comparisons; [`fence_counts`] tells how this
//! process's flags were settled: answered, fenced, or overtaken by an owner.

#[cfg(not(loom))]
use std::time::Instant;

use super::answer::{Beacon, ACK_BUDGET_NS};
use super::section::Section;
use super::wait::full_fence;
use super::{flag, RseqLock, EPOCH_MASK, FALLBACK_CPU, FREE};
use crate::sync::Ordering;
use crate::RawLocalLock;

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

impl RseqLock {
    /// Whether the requester of `flag` (call `call` of the CPU's beacon) may stop waiting: the
    /// CPU answered the call, or a sequence committed over the flag (the requester then lost,
    /// and will wait for that holder).
    #[inline]
    fn answered(&self, flag: u32, call: u64) -> bool {
        if self.word.load(Ordering::Relaxed) != flag {
            return true;
        }
        acks()
            && self
                .beacon()
                .is_some_and(|b| Beacon::reached(b.answer.load(Ordering::Acquire), call))
    }

    /// Calls the CPU, after the flags: `raise` the flags first, then `call` once.
    fn call(&self) -> u64 {
        self.beacon().map_or(0, Beacon::make_call)
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
    pub(super) fn try_fenced(&self) -> bool {
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
    fn wait_for_answer(&self, flag: u32, call: u64) -> bool {
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
    fn settle(&self, flag: u32, call: u64, waited: bool) -> bool {
        let answered = self.answered(flag, call);
        if !answered && self.on_cpu() < FALLBACK_CPU {
            if let Err(e) = self.requester_fence() {
                self.back_out(flag);
                self.side_unlock();
                fence_failed(self.on_cpu(), &e);
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
            self.set_flag_call(call);
        }
        if !held {
            count(OVERTAKEN);
        } else if answered && self.on_cpu() < FALLBACK_CPU {
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

    /// The requester's fence, in `settle` (under loom a model may leave it out:
    /// `Mutation::SkipFence`).
    fn requester_fence(&self) -> std::io::Result<()> {
        #[cfg(loom)]
        if crate::rseq::mock::mutation() == crate::rseq::mock::Mutation::SkipFence {
            return Ok(());
        }
        self.fence_cpu()
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
        if spins.is_multiple_of(16) && start.elapsed().as_nanos() >= u128::from(budget_ns) {
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
    let mut raised: Vec<(usize, u32, u64)> = Vec::new();
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
            .find(|&&(j, _, _)| locks[j].is_some_and(|l| l.on_cpu() == lock.on_cpu()));
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
