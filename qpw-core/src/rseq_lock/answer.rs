//! The fenced protocol's owner side: each CPU's beacon, where requesters call the CPU and its
//! threads answer; the owner's answer, read by a restartable sequence of the lock's CPU; and
//! the poll ([`Binding::poll`](crate::Binding::poll)) that lets an owner's loop answer when
//! it is not near its locks. The protocol is in the module docs of `rseq_lock`; the
//! requester's side, which calls the CPU and waits for this answer, in `requester.rs`.
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
//! lock); the budget is per CPU. An owner that runs without touching its lock and without
//! polling never answers, and gets the fence. [`set_acks`](super::set_acks) turns the waiting
//! off, for comparisons. The owner's acquire sequence is the one it had before answers
//! existed: the answer is taken only on the slow path, when the sequence finds the word busy
//! and a look at it shows a flag.
//!
//! # The poll: answering from the owner's own loop
//!
//! The owners that choose fenced mode in practice (thread-per-core servers, poll loops on
//! isolated CPUs) spend most of their time polling something else: a socket, a ring, a
//! device. Between two of their operations they are not in their lock, find no flag there,
//! and never answer; every requester then fences their CPU, and the interrupt lands on the
//! very CPU the mode is meant to leave alone. [`Binding::poll`](crate::Binding::poll) lets
//! such a loop answer, as Seastar's reactor polls its cross-core queues between tasks.
//!
//! - **Nothing pending** (the fast path): one plain load of the CPU's call counter, compared
//!   with the last call the binding answered, which it keeps. No store, no read-modify-write;
//!   the counter's line stays shared in the owner's cache until a requester calls.
//! - **A call since**: the answer above, the same function the lock's own answer runs: a
//!   restartable sequence of the bound CPU reads the call, and the thread publishes what it
//!   read.
//!
//! Why it is sound: it is the same answer. Points 1-3 use nothing of what the answering
//! thread was doing, only that its read of the call ran inside a sequence of the lock's CPU
//! (so the thread ran there from the sequence's CPU check to the load) and that the call it
//! read was made after the flag. Neither changes when the read comes from the owner's loop
//! rather than from its lock: the requester still compares the answer with its call (an
//! answer to an earlier call settles nothing) and still checks the word after it. The poll
//! changes only *when* an answer is made, never what it proves. Its fast path may skip a call
//! (a counter that wrapped round to the value the binding last answered), and skipping is
//! always safe: the requester fences after its budget. What it must never do is answer from
//! elsewhere: a thread bound to CPU 1 that runs on CPU 0 (its pinning undone) proves nothing
//! about CPU 1's sequences; the sequence's CPU check refuses it
//! ([`Polled::Elsewhere`](crate::Polled::Elsewhere)), and the requester fences. The loom
//! models of `tests/loom_fenced.rs` check both rules by breaking them: a poll that answers
//! without the sequence, and an answer taken without comparing it with the call, each let a
//! requester and an owner hold the lock at once.
//!
//! The budget adapts as it does for the lock's answer: an owner whose loop polls answers
//! within one turn of it, so its requesters keep their 2 us wait; one that neither polls nor
//! touches its lock leaves a wait unanswered, and its next requesters fence at once until an
//! answer is seen again (a poll that answers a call a fence has already settled is seen by
//! that requester after its fence, or when it releases the lock).

use std::cell::Cell;

#[cfg(not(loom))]
use crossbeam_utils::CachePadded;

#[cfg(loom)]
use super::loom_mock;
use super::section::{Read, Section};
use super::{is_flag, RseqLock, FALLBACK_CPU};
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

/// A beacon no requester ever calls: the poller's in the fallback, where no CPU is called.
#[cfg(not(loom))]
static NEVER_CALLED: Beacon = Beacon::new();

/// A physical CPU as its answer needs it: its number, its beacon, and under loom the mock
/// kernel's state of it.
#[derive(Debug, Clone, Copy)]
pub(super) struct CpuBeacon {
    pub(super) cpu: u32,
    pub(super) beacon: &'static Beacon,
    #[cfg(loom)]
    pub(super) mock: &'static loom_mock::Cpu,
}

impl CpuBeacon {
    /// CPU `cpu`'s beacon; none for a lock of no CPU, or in the fallback.
    #[cfg(not(loom))]
    #[inline]
    fn of(cpu: u32) -> Option<Self> {
        BEACONS.get(cpu as usize).map(|b| Self { cpu, beacon: b })
    }

    #[cfg(loom)]
    fn of(cpu: u32) -> Option<Self> {
        (cpu < FALLBACK_CPU).then(|| {
            let mock = loom_mock::Cpu::of(cpu);
            Self {
                cpu,
                beacon: &mock.beacon,
                mock,
            }
        })
    }

    /// The answer (module docs, "The answer"): if the thread runs on the CPU, read its call
    /// inside a restartable sequence and publish it. Returns the call read; `None` when the
    /// thread runs elsewhere, where it cannot answer.
    #[cold]
    fn answer(self) -> Option<u32> {
        let beacon = self.beacon;
        #[cfg(loom)]
        if crate::rseq::mock::mutation() == crate::rseq::mock::Mutation::AckFromAnyThread {
            let seen = beacon.call.load(Ordering::Acquire);
            beacon.answer.store(seen, Ordering::Release);
            return Some(seen);
        }
        let seen = loop {
            match self.read_call() {
                Read::Seen(seen) => break seen,
                Read::WrongCpu => return None,
                Read::Aborted => continue,
            }
        };
        // Stored only when it changes, so that an owner spinning on a flag does not keep
        // taking the line from the requester that polls it.
        if beacon.answer.load(Ordering::Relaxed) != seen {
            beacon.answer.store(seen, Ordering::Release);
        }
        Some(seen)
    }
}

/// What [`Binding::poll`](crate::Binding::poll) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Polled {
    /// No requester has called the CPU since the binding last answered: nothing to do. (Also
    /// what a CPU that is not in fenced mode always gives: nobody calls it.)
    Quiet,
    /// A requester had called the CPU: answered, so that it takes the CPU's locks without
    /// fencing the CPU (no interrupt here).
    Answered,
    /// A requester had called, but the thread does not run on the CPU it is bound to now (its
    /// pinning was undone, or a newer binding elsewhere is in force): only a thread running
    /// there can answer, so the requester fences the CPU.
    Elsewhere,
}

/// The owner's poll of its CPU's beacon, kept in its [`Binding`](crate::Binding) (module docs,
/// "The poll"): the last call it answered, and the beacon it reads.
#[derive(Debug)]
pub(crate) struct Poller {
    /// The CPU's beacon, looked up once ([`NEVER_CALLED`] in the fallback). Under loom it is
    /// looked up at each poll, in the execution's table of mock CPUs.
    #[cfg(not(loom))]
    beacon: &'static Beacon,
    /// The physical CPU the binding's thread is pinned to.
    cpu: u32,
    /// The call this binding last answered: a counter that differs means a requester called
    /// since.
    seen: Cell<u32>,
}

impl Poller {
    /// The poller of a thread bound to physical CPU `phys`.
    pub(crate) fn for_cpu(phys: usize) -> Self {
        let cpu = match u32::try_from(phys) {
            Ok(cpu) if crate::rseq::lock_available() && cpu < FALLBACK_CPU => cpu,
            _ => FALLBACK_CPU,
        };
        Self {
            #[cfg(not(loom))]
            beacon: CpuBeacon::of(cpu).map_or(&NEVER_CALLED, |c| c.beacon),
            cpu,
            seen: Cell::new(0),
        }
    }

    /// Answers a call made to the CPU since the last poll, if the thread runs there: one load
    /// when there is none.
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn poll(&self) -> Polled {
        if self.beacon.call.load(Ordering::Relaxed) == self.seen.get() {
            return Polled::Quiet;
        }
        self.answer()
    }

    #[cfg(loom)]
    pub(crate) fn poll(&self) -> Polled {
        match CpuBeacon::of(self.cpu) {
            Some(c) if c.beacon.call.load(Ordering::Relaxed) != self.seen.get() => self.answer(),
            _ => Polled::Quiet,
        }
    }

    /// A call came: answer it from here, if the thread runs on the CPU.
    #[cold]
    #[inline(never)]
    fn answer(&self) -> Polled {
        let Some(cpu) = CpuBeacon::of(self.cpu) else {
            return Polled::Quiet;
        };
        match cpu.answer() {
            Some(seen) => {
                self.seen.set(seen);
                Polled::Answered
            }
            None => Polled::Elsewhere,
        }
    }
}

impl RseqLock {
    /// The lock's CPU's beacon (none for a lock of no CPU, or in the fallback).
    #[inline]
    fn cpu_beacon(&self) -> Option<CpuBeacon> {
        #[cfg(not(loom))]
        {
            CpuBeacon::of(self.cpu)
        }
        #[cfg(loom)]
        {
            (self.cpu < FALLBACK_CPU).then_some(CpuBeacon {
                cpu: self.cpu,
                beacon: &self.mock.beacon,
                mock: self.mock,
            })
        }
    }

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
    pub(super) fn beacon(&self) -> Option<&'static Beacon> {
        self.cpu_beacon().map(|c| c.beacon)
    }

    /// The owner's answer (module docs, "The answer"): if the thread runs on the lock's CPU,
    /// read the CPU's call inside a restartable sequence and publish it. Called by a thread
    /// that found a flag in the word, and again and again while it spins on one.
    #[cold]
    pub(super) fn answer(&self) {
        if let Some(cpu) = self.cpu_beacon() {
            cpu.answer();
        }
    }
}
