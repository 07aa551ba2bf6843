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
//! (the counter stopped at its end, below, at the value the binding last answered), and
//! skipping is always safe: the requester fences after its budget. What it must never do is answer from
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
//!
//! # Counters that cannot wrap
//!
//! "Reached" is a comparison of two counters, and it is only as sound as the counters are
//! monotonic. Until issue 44 they were 32-bit and compared across their wrap
//! (`answer - call` as an `i32`): a CPU whose owner never answered (idle, blocked, or not
//! running there) kept the answer of its last answered call while requesters went on calling
//! it, and once the calls were 2^31 or more ahead, that old answer read as *newer* than every
//! call of the next 2^31, so requesters skipped the fence while the owner's sequence could
//! still commit. It took 405 s of back-to-back fenced acquisitions on the development VM, and
//! about 12 days of a service draining an idle CPU's two locks 1 000 times a second.
//!
//! Now the argument is arithmetic and holds for any run:
//!
//! 1. `call` is a 64-bit counter that only goes up, and stops at its end: a requester's call
//!    is a read-modify-write that adds one unless the counter holds `u64::MAX`
//!    ([`Beacon::UNANSWERABLE`]), and returns `u64::MAX` then. So call numbers are
//!    increasing until the end, and never come round again.
//! 2. `answer` only holds a value some sequence of the CPU read from `call`, and only moves
//!    forward: a thread publishes what it read with a `fetch_max`, so one preempted between
//!    its read and its store cannot put an older call over a newer one (before, it could: that
//!    cost only fences, but after a long stall it was another way into the wrap).
//! 3. So `answer >= call` means a sequence of the CPU read call number `call` or a later one,
//!    which was made after our flag: the answer argument above applies. Except at the end,
//!    where every call is number `u64::MAX`: an answer that read it may be as old as the
//!    first call to reach the end, so no answer reaches a call there ([`Beacon::reached`]
//!    says no), and every requester of that CPU fences, as it always may. At one call per
//!    nanosecond the end is 584 years away; it is there so that no length of run can break
//!    the comparison, only slow it.
//!
//! The lock word's own counters wrap harmlessly. A flag's epoch (30 bits) is compared with
//! the word only while its requester holds the side mutex, when no other flag can be raised on
//! the lock, so it cannot be confused with one of another epoch however many came before. A
//! hand-over's generation only has to differ from the one before it.
//!
//! The loom models (`tests/loom_fenced.rs`) start a CPU's counters at these edges
//! (`rseq::mock::with_counters_at`): 2^31 calls unanswered, and one call short of the end.
//! Each passes, and fails with the old comparison (`Mutation::WrappingCompare32`) or with a
//! call at the end taken as answered (`Mutation::AnswerAtTheCountersEnd`); a model with two
//! pollers of one CPU fails when the answer is stored as read (`Mutation::AnswerMayGoBack`).
//! `tests/fenced_wrap.rs` races an owner and a requester with the counters put at the same
//! edges by the `test-hooks` feature.

use std::cell::Cell;

#[cfg(not(loom))]
use crossbeam_utils::CachePadded;

#[cfg(loom)]
use super::loom_mock;
use super::section::{Read, Section};
use super::{is_flag, RseqLock, FALLBACK_CPU};
use crate::sync::{AtomicU32, AtomicU64, Ordering};

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
///
/// Both counters are 64-bit and never wrap (module docs, "Counters that cannot wrap"): `call`
/// stops at [`Beacon::UNANSWERABLE`], and `answer` only moves forward.
#[derive(Debug)]
pub(crate) struct Beacon {
    /// Calls made so far; it stops at [`Beacon::UNANSWERABLE`].
    pub(super) call: AtomicU64,
    /// The newest call a sequence of the CPU has read and its thread published (it never moves
    /// backwards).
    pub(super) answer: AtomicU64,
    /// How long the CPU's next requester waits for an answer before it fences, in
    /// nanoseconds: [`ACK_BUDGET_NS`] while answers come, 0 after a wait that got none, and
    /// back up as soon as an answer is seen again (after a fence, or while a flag held a lock).
    pub(super) budget: AtomicU32,
}

impl Beacon {
    /// The call counter's last value, where it stops: no answer reaches a call of this number,
    /// so once a CPU has had `u64::MAX` calls every requester of it fences.
    pub(super) const UNANSWERABLE: u64 = u64::MAX;

    #[cfg(not(loom))]
    const fn new() -> Self {
        Self {
            call: AtomicU64::new(0),
            answer: AtomicU64::new(0),
            budget: AtomicU32::new(ACK_BUDGET_NS),
        }
    }

    /// A beacon whose counters start at `call` and `answer` (the loom models start some near
    /// the counters' edges: `rseq::mock::with_counters_at`).
    #[cfg(loom)]
    pub(super) fn new(call: u64, answer: u64) -> Self {
        Self {
            call: AtomicU64::new(call),
            answer: AtomicU64::new(answer),
            budget: AtomicU32::new(ACK_BUDGET_NS),
        }
    }

    /// Whether an answer of `answer` has reached call `call`: it is that call or a later one,
    /// and the call is not [`UNANSWERABLE`](Self::UNANSWERABLE). Neither counter wraps, so
    /// this is a plain comparison, sound for any number of calls.
    #[inline]
    pub(super) fn reached(answer: u64, call: u64) -> bool {
        #[cfg(loom)]
        match crate::rseq::mock::mutation() {
            crate::rseq::mock::Mutation::AckWithoutEpoch => return answer != 0,
            crate::rseq::mock::Mutation::WrappingCompare32 => {
                return (answer as u32).wrapping_sub(call as u32) as i32 >= 0
            }
            crate::rseq::mock::Mutation::AnswerAtTheCountersEnd => return answer >= call,
            _ => {}
        }
        answer >= call && call != Self::UNANSWERABLE
    }

    /// Calls the CPU: the call's number, one more than the last, or
    /// [`UNANSWERABLE`](Self::UNANSWERABLE) once the counter has reached it (a
    /// read-modify-write that never wraps, on the requester's slow path).
    pub(super) fn make_call(&self) -> u64 {
        match self
            .call
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_add(1))
        {
            Ok(previous) => previous + 1,
            Err(_) => Self::UNANSWERABLE,
        }
    }

    /// Publishes `seen`, a call a sequence of the CPU read, unless a newer one is already
    /// there: the answer never moves backwards (a thread preempted between its read and this
    /// store would otherwise put an older call over a newer one). Stored only when it moves,
    /// so that an owner spinning on a flag does not keep taking the line from the requester
    /// that polls it.
    fn publish(&self, seen: u64) {
        #[cfg(loom)]
        if crate::rseq::mock::mutation() == crate::rseq::mock::Mutation::AnswerMayGoBack {
            // The old store: whatever was read, over whatever is there.
            if self.answer.load(Ordering::Relaxed) != seen {
                let before = self.answer.swap(seen, Ordering::Release);
                crate::rseq::mock::saw_answers(before, seen);
            }
            return;
        }
        if self.answer.load(Ordering::Relaxed) < seen {
            let _before = self.answer.fetch_max(seen, Ordering::Release);
            #[cfg(loom)]
            crate::rseq::mock::saw_answers(_before, _before.max(seen));
        }
    }
}

/// Every physical CPU's beacon, on its own cache line (128 KiB of zeroed memory, touched only
/// for the CPUs that are drained).
#[cfg(not(loom))]
static BEACONS: [CachePadded<Beacon>; crate::CpuSet::MAX_CPU + 1] =
    [const { CachePadded::new(Beacon::new()) }; crate::CpuSet::MAX_CPU + 1];

/// Test hooks (the `test-hooks` feature): CPU `cpu`'s call and answer counters set as if
/// `call` calls had been made and the newest answer were `answer`, so that a test can start a
/// CPU near its counters' edge without making the calls. Not for use while any thread takes
/// the CPU's locks or polls it. Returns `false` for a CPU past the table.
#[cfg(all(feature = "test-hooks", not(loom)))]
pub(crate) fn set_beacon(cpu: usize, call: u64, answer: u64) -> bool {
    let Some(beacon) = BEACONS.get(cpu) else {
        return false;
    };
    beacon.call.store(call, Ordering::SeqCst);
    beacon.answer.store(answer, Ordering::SeqCst);
    true
}

/// CPU `cpu`'s call and answer counters (the `test-hooks` feature).
#[cfg(all(feature = "test-hooks", not(loom)))]
pub(crate) fn beacon_counters(cpu: usize) -> Option<(u64, u64)> {
    BEACONS.get(cpu).map(|b| {
        (
            b.call.load(Ordering::SeqCst),
            b.answer.load(Ordering::SeqCst),
        )
    })
}

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
    fn answer(self) -> Option<u64> {
        let beacon = self.beacon;
        #[cfg(loom)]
        if crate::rseq::mock::mutation() == crate::rseq::mock::Mutation::AckFromAnyThread {
            // Stored as read, unconditionally, as the answer was before issue 44.
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
        #[cfg(loom)]
        crate::rseq::mock::answer_point(crate::rseq::mock::AnswerPoint::BeforeThePublish);
        beacon.publish(seen);
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
    seen: Cell<u64>,
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
        #[cfg(loom)]
        crate::rseq::mock::answer_point(crate::rseq::mock::AnswerPoint::BeforeTheSequence);
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
            CpuBeacon::of(self.on_cpu())
        }
        #[cfg(loom)]
        {
            (self.on_cpu() < FALLBACK_CPU).then_some(CpuBeacon {
                cpu: self.on_cpu(),
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
    #[inline(never)]
    pub(super) fn answer(&self) {
        if let Some(cpu) = self.cpu_beacon() {
            cpu.answer();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::Beacon;
    use crate::sync::Ordering;

    /// The 32-bit edge that issue 44 found: `0 - 0x8000_0001` wrapped to a positive `i32`, and
    /// an answer 2^31 calls old passed for the newest.
    #[test]
    fn an_answer_of_0_has_not_reached_call_2_pow_31_plus_1() {
        assert!(!Beacon::reached(0, 0x8000_0001));
        assert!(!Beacon::reached(0x7fff_ffff, 0x1_0000_0000));
        assert!(!Beacon::reached(0xffff_ffff, 0x1_0000_0000));
        assert!(Beacon::reached(0x1_0000_0000, 0x1_0000_0000));
    }

    /// The same at the 64-bit counters' edges: the sign bit, and the end where calls stop.
    #[test]
    fn old_answers_reach_no_later_call_at_the_64_bit_edges() {
        assert!(!Beacon::reached(0, (1 << 63) + 1));
        assert!(!Beacon::reached(1 << 63, (1 << 63) + 1));
        assert!(Beacon::reached((1 << 63) + 1, (1 << 63) + 1));
        assert!(!Beacon::reached(0, u64::MAX - 1));
        assert!(Beacon::reached(u64::MAX - 1, u64::MAX - 1));
        assert!(Beacon::reached(u64::MAX, u64::MAX - 1));
        // A call at the end is never answered, not even by an answer that read the end.
        assert!(!Beacon::reached(u64::MAX, u64::MAX));
        assert!(Beacon::reached(7, 5) && Beacon::reached(5, 5) && !Beacon::reached(4, 5));
    }

    #[test]
    fn the_call_counter_stops_at_its_end() {
        let beacon = Beacon::new();
        assert_eq!(beacon.make_call(), 1);
        beacon.call.store(u64::MAX - 2, Ordering::Relaxed);
        assert_eq!(beacon.make_call(), u64::MAX - 1);
        assert_eq!(beacon.make_call(), Beacon::UNANSWERABLE);
        assert_eq!(beacon.make_call(), Beacon::UNANSWERABLE);
        assert_eq!(beacon.call.load(Ordering::Relaxed), u64::MAX);
    }

    #[test]
    fn an_answer_never_moves_backwards() {
        let beacon = Beacon::new();
        beacon.publish(5);
        beacon.publish(3);
        assert_eq!(beacon.answer.load(Ordering::Relaxed), 5);
        beacon.publish(9);
        assert_eq!(beacon.answer.load(Ordering::Relaxed), 9);
    }
}
