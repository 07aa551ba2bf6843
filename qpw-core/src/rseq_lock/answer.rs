//! The fenced protocol's owner side: each CPU's beacon, where requesters call the CPU and its
//! threads answer, and the owner's answer, read by a restartable sequence of the lock's CPU.
//! The protocol is in the module docs of `rseq_lock`; the requester's side, which calls the
//! CPU and waits for this answer, in `requester.rs`.
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
//! and gets the fence. [`set_acks`](super::set_acks) turns the waiting off, for comparisons.
//! The owner's acquire sequence is the one it had before answers existed: the answer is taken
//! only on the slow path, when the sequence finds the word busy and a look at it shows a flag.

#[cfg(not(loom))]
use crossbeam_utils::CachePadded;

use super::section::{Read, Section};
#[cfg(loom)]
use super::FALLBACK_CPU;
use super::{is_flag, RseqLock};
use crate::sync::{AtomicU32, Ordering};

/// How long a requester waits for the owner's answer before it fences the CPU, while answers
/// come (0 after a wait that got none; see [`Beacon::budget`]). A fence costs the
/// requester about 15-20 us on the development VM and the target an interrupt, so waiting a
/// few microseconds for an owner that is busy on its lock is the better deal for both.
#[cfg(not(loom))]
pub(super) const ACK_BUDGET_NS: u32 = 2_000;
#[cfg(loom)]
pub(super) const ACK_BUDGET_NS: u32 = 1;

/// A CPU's call and answer (module docs, "The answer"): a requester bumps `call` after raising
/// its flags on locks of the CPU; a restartable sequence running on the CPU reads `call`, and
/// its thread publishes what it read in `answer`. An answer that has reached a requester's call
/// settles every flag that requester raised on the CPU's locks before the call, whichever lock
/// the answering thread was waiting for.
#[derive(Debug)]
pub(crate) struct Beacon {
    /// Calls made so far (wrapping).
    pub(super) call: AtomicU32,
    /// The newest call a sequence of the CPU has read and its thread published.
    pub(super) answer: AtomicU32,
    /// How long the CPU's next requester waits for an answer before it fences, in
    /// nanoseconds: [`ACK_BUDGET_NS`] while answers come, 0 after a wait that got none, and
    /// back up as soon as an answer is seen again (after a fence, or while a flag held a lock).
    pub(super) budget: AtomicU32,
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
    pub(super) fn new() -> Self {
        Self {
            call: AtomicU32::new(0),
            answer: AtomicU32::new(0),
            budget: AtomicU32::new(ACK_BUDGET_NS),
        }
    }

    /// Whether an answer of `answer` has reached call `call` (counters wrap).
    #[inline]
    pub(super) fn reached(answer: u32, call: u32) -> bool {
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

impl RseqLock {
    /// Runs the sequence until it is not aborted, and answers a requester's flag it found.
    #[inline]
    pub(super) fn section_answering(&self) -> Section {
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
    pub(super) fn beacon(&self) -> Option<&Beacon> {
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
    pub(super) fn answer(&self) {
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
}
