//! Loom models of [`FencedLock`]'s drain protocol (raise the flag, fence the lock's CPU, check
//! for an owner that committed first), with the kernel's side of restartable sequences mocked
//! (see "Under loom" in `qpw-core/src/rseq_lock/loom_mock.rs`). Run with
//! `RUSTFLAGS="--cfg loom -C debug-assertions" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p qpw-tests --test loom_fenced`
//! (see `.ci/loom`).
//!
//! The mock's owner sequence is three loom steps (start, load, commit) with loom free to run
//! the requester between the load and the commit, and the commit does not look at the word
//! again: only an abort (the requester's fence, or another sequence of the CPU starting)
//! stops a commit whose load has gone stale. So each step of the requester is needed here as
//! on a real CPU, and the second half of the file proves it: with the fence left out, or the
//! check after it, every model with an owner fails (`rseq::mock::with_mutation`). The two
//! requesters' model has no owner, so neither step matters to it; it checks the `CAS` and the
//! side mutex.
//!
//! Two models were once ignored, blamed on loom's modification order. Two things were wrong,
//! one in loom and one in the lock. Loom 0.7 lets a plain store slip between the read and the
//! write of a concurrent `CAS` (tokio-rs/loom#254), so the owner's `HELD`, committed after the
//! requester's `CAS` and before its fence, could be overwritten by the `CAS`'s `FENCED` in
//! loom's eyes: the mock now commits with a `swap`, which loom orders after the `CAS`. And
//! with two owner threads and a requester loom found a real hang in the lock: a waiter that
//! lost a `HANDOFF` to another slept on `HANDOFF` and missed the winner's wake (fixed in
//! `lock_slow`). Both now pass.
//!
//! The owner's poll (`Binding::poll`, issue 34) has two models of its own: an owner that polls
//! between its requests, answering a requester's flags on two locks of its CPU, and a thread
//! bound to the CPU that polls from another CPU. Each is built so that only a poll can make
//! the answer that would break exclusion, and each fails with the poll's rule broken (an
//! answer from a thread without the sequence of the CPU; an answer taken without comparing it
//! with the call): with the polls taken out of the models, the same mutations pass, so the
//! failures are the poll's. A count kept across executions shows that the polls answered
//! (and, from elsewhere, refused) in the models that pass.
//!
//! Issue 44 widened them where a wrap of the answer counters slipped through: the owner's CPU
//! starts with 2^31 calls unanswered, and one call short of the call counter's end, and each
//! model fails with the old 32-bit comparison or with a call at the end taken as answered; two
//! pollers of one CPU check that the answer never moves backwards (and fail when it is stored
//! as read); and a poller migrates in the middle of its answer, before its sequence, inside it
//! (the mock aborts a migrated thread's sequence, as the kernel does: that poll never answers)
//! and before its publish (the answer stands).
//!
//! Two mock CPUs, one increment per party: the protocol depends only on how the owner and the
//! requesters interleave, not on how many CPUs or operations there are. Each model ends in a
//! conservation assertion: every increment lands exactly once.

#![cfg(loom)]

mod loom_common;

use std::cell::Cell;
use std::sync::Arc;

use loom::cell::UnsafeCell;
use loom::thread;

use loom_common::Failure;
use qpw_core::rseq::mock::{
    migrate_at, migrate_to, with_acks_off, with_counters_at, with_mutation, AnswerPoint, Mutation,
};
use qpw_core::{CpuSpec, FencedLock, PerCpu, Policy, Polled, Qpw, RawLocalLock};

/// The owner's CPU.
const OWNER_CPU: usize = 0;
/// Where the requesters run.
const REQUESTER_CPU: usize = 1;

/// The conservation assertions' message, which the mutation tests look for.
const CONSERVATION: &str = loom_common::LOOM_CONSERVATION;

/// What a party does between its increment and its release.
#[derive(Debug, Clone, Copy)]
enum WhileHolding {
    /// Nothing: it releases at once.
    Releases,
    /// It migrates to this CPU and releases from there.
    MigratesTo(usize),
    /// It is preempted (a loom yield, which makes loom run another thread) and then releases.
    IsPreempted,
}

/// A counter behind CPU 0's `FencedLock`; loom's cell tracking flags any two accesses the lock
/// failed to order.
struct Slot {
    lock: FencedLock,
    value: UnsafeCell<u32>,
}

// SAFETY: `value` is only touched between `lock.lock()` and `lock.unlock()`.
unsafe impl Sync for Slot {}

impl Slot {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            lock: FencedLock::for_cpu(OWNER_CPU),
            value: UnsafeCell::new(0),
        })
    }

    /// From `cpu`: takes the lock, adds one, does what `holding` says, releases.
    fn add_one(&self, cpu: usize, holding: WhileHolding) {
        migrate_to(Some(cpu));
        self.lock.lock();
        // SAFETY: the lock is held.
        self.value.with_mut(|v| unsafe { *v += 1 });
        match holding {
            WhileHolding::Releases => {}
            WhileHolding::MigratesTo(next) => migrate_to(Some(next)),
            WhileHolding::IsPreempted => thread::yield_now(),
        }
        // SAFETY: taken above by this thread.
        unsafe { self.lock.unlock() };
    }

    /// The total, read by a requester (the fenced path).
    fn total(&self) -> u32 {
        migrate_to(Some(REQUESTER_CPU));
        self.lock.lock();
        // SAFETY: the lock is held.
        let v = self.value.with(|v| unsafe { *v });
        // SAFETY: taken just above.
        unsafe { self.lock.unlock() };
        v
    }
}

/// Runs `parties` (each a CPU, what it does while holding, and how many times it adds) against
/// one slot, each on its own thread but the first, which runs on the model's main thread; then
/// checks that every increment landed once.
fn model(parties: &'static [(usize, WhileHolding, u32)]) {
    loom::model(move || {
        let slot = Slot::new();
        let others: Vec<_> = parties[1..]
            .iter()
            .map(|&(cpu, holding, times)| {
                let slot = slot.clone();
                thread::spawn(move || {
                    for _ in 0..times {
                        slot.add_one(cpu, holding);
                    }
                })
            })
            .collect();
        let (cpu, holding, times) = parties[0];
        for _ in 0..times {
            slot.add_one(cpu, holding);
        }
        for other in others {
            other.join().unwrap();
        }
        let expected: u32 = parties.iter().map(|p| p.2).sum();
        assert_eq!(slot.total(), expected, "{CONSERVATION}");
    });
}

/// The owner takes its lock by restartable sequence while a requester of another CPU drains.
fn owner_vs_requester() {
    model(&[
        (OWNER_CPU, WhileHolding::Releases, 1),
        (REQUESTER_CPU, WhileHolding::Releases, 1),
    ]);
}

/// Two requesters of another CPU and no owner.
fn two_requesters() {
    model(&[
        (REQUESTER_CPU, WhileHolding::Releases, 1),
        (REQUESTER_CPU, WhileHolding::Releases, 1),
    ]);
}

/// The owner takes the lock on its CPU, migrates to the requester's CPU while holding it and
/// releases from there, while a requester drains.
fn owner_migrating() {
    model(&[
        (OWNER_CPU, WhileHolding::MigratesTo(REQUESTER_CPU), 1),
        (REQUESTER_CPU, WhileHolding::Releases, 1),
    ]);
}

/// The owner is preempted while holding, another thread of its CPU runs and wants the lock,
/// and a requester drains.
fn owner_preempted_while_holding() {
    model(&[
        (OWNER_CPU, WhileHolding::IsPreempted, 1),
        (OWNER_CPU, WhileHolding::Releases, 1),
        (REQUESTER_CPU, WhileHolding::Releases, 1),
    ]);
}

/// The owner adds while two requesters of another CPU take turns, each preempted while it
/// holds the lock: the side mutex keeps their flags' epochs apart, so that neither takes the
/// other's flag (or a flag an owner committed over and released) for its own.
fn owner_vs_two_preempted_requesters() {
    model(&[
        (OWNER_CPU, WhileHolding::Releases, 1),
        (REQUESTER_CPU, WhileHolding::IsPreempted, 1),
        (REQUESTER_CPU, WhileHolding::IsPreempted, 1),
    ]);
}

/// The owner and a requester each take the lock twice: the owner's answer to the first flag
/// must not settle the second.
fn owner_and_requester_twice() {
    model(&[
        (OWNER_CPU, WhileHolding::Releases, 2),
        (REQUESTER_CPU, WhileHolding::IsPreempted, 2),
    ]);
}

/// The framework's fenced slot: one remote-mode CPU whose slot is behind a `FencedLock`. The
/// instance, the CPU, its slot, and the physical CPU its threads run on.
fn fenced_slot() -> (Arc<Qpw>, usize, Arc<PerCpu<u32, FencedLock>>, usize) {
    let qpw = Arc::new(
        Qpw::builder()
            .cpus(CpuSpec::Logical(1))
            .policy(Policy::Remote)
            .build()
            .unwrap(),
    );
    let cpu = qpw.cpus().first().unwrap();
    let phys = qpw.physical_cpu(cpu).unwrap();
    let slot = Arc::new(qpw.per_cpu_with::<FencedLock, _>(|_| 0u32).unwrap());
    (qpw, cpu, slot, phys)
}

/// The framework around it: a remote-mode CPU whose slot is behind a `FencedLock`. The owner
/// (bound to the CPU) adds while a requester takes the slot through `PerCpu::lock` (the
/// fenced path) and empties it into its result.
fn remote_drain_in_the_requester() {
    loom::model(|| {
        let (qpw, cpu, slot, phys) = fenced_slot();
        let owner = {
            let slot = slot.clone();
            thread::spawn(move || {
                migrate_to(Some(OWNER_CPU));
                let _bound = qpw.bind_current(cpu).unwrap();
                *slot.lock_local().unwrap() += 1;
            })
        };
        migrate_to(Some(phys + 1));
        let drained = std::mem::take(&mut *slot.lock(cpu).unwrap());
        owner.join().unwrap();
        let rest = *slot.lock(cpu).unwrap();
        assert_eq!(drained + rest, 1, "{CONSERVATION}");
    });
}

std::thread_local! {
    /// How many polls, over every execution of the calling test's models so far, answered
    /// ([`Polled::Answered`]) and found a call they could not answer ([`Polled::Elsewhere`]):
    /// what shows that a model's polls took part. A std thread-local, which loom does not
    /// model: every modelled thread of a test runs on the test's own OS thread, so it counts
    /// that test's executions and no other test's.
    static POLLS: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

fn count_poll(outcome: Polled) {
    POLLS.with(|p| {
        let (answered, elsewhere) = p.get();
        match outcome {
            Polled::Answered => p.set((answered + 1, elsewhere)),
            Polled::Elsewhere => p.set((answered, elsewhere + 1)),
            Polled::Quiet => {}
        }
    });
}

/// The owner busy with something else (the issue-34 server between requests): it polls its
/// binding, takes the lock of one of its CPU's two slots once, and polls again, while a
/// requester of another CPU takes the other slot's lock and then this one's. The answer is
/// the CPU's, so a poll answers the requester's flags on both locks; but an answer to its
/// first call must not settle its second flag, raised while the owner's sequence may be in
/// flight. No flag is ever raised on the first slot's lock while the owner is in it, so only
/// a poll can answer the first call: what this model checks of answers is the poll's.
fn owner_polls() {
    loom::model(|| {
        let (qpw, cpu, first, phys) = fenced_slot();
        let second = Arc::new(qpw.per_cpu_with::<FencedLock, _>(|_| 0u32).unwrap());
        let owner = {
            let second = second.clone();
            thread::spawn(move || {
                let binding = qpw.bind_current(cpu).unwrap();
                count_poll(binding.poll());
                *second.lock_local().unwrap() += 1;
                count_poll(binding.poll());
            })
        };
        migrate_to(Some(phys + 1));
        *first.lock(cpu).unwrap() += 1;
        *second.lock(cpu).unwrap() += 1;
        owner.join().unwrap();
        let total = *first.lock(cpu).unwrap() + *second.lock(cpu).unwrap();
        assert_eq!(total, 3, "{CONSERVATION}");
    });
}

/// The owner: a thread bound to `cpu` that adds one to its slot through `lock_local`.
fn spawn_owner(
    qpw: &Arc<Qpw>,
    cpu: usize,
    slot: &Arc<PerCpu<u32, FencedLock>>,
) -> thread::JoinHandle<()> {
    let (qpw, slot) = (qpw.clone(), slot.clone());
    thread::spawn(move || {
        let _bound = qpw.bind_current(cpu).unwrap();
        *slot.lock_local().unwrap() += 1;
    })
}

/// A thread bound to the owner's CPU polls from another CPU (its pinning undone), while the
/// owner (a second thread bound there) takes its lock once and a requester takes it once. The
/// poll must not answer: it proves nothing about the sequence the owner may have in flight on
/// its CPU.
fn poll_from_elsewhere() {
    loom::model(|| {
        let (qpw, cpu, slot, phys) = fenced_slot();
        let elsewhere = phys + 1;
        let owner = spawn_owner(&qpw, cpu, &slot);
        let poller = thread::spawn(move || {
            let binding = qpw.bind_current(cpu).unwrap();
            migrate_to(Some(elsewhere));
            count_poll(binding.poll());
            count_poll(binding.poll());
        });
        migrate_to(Some(elsewhere));
        *slot.lock(cpu).unwrap() += 1;
        owner.join().unwrap();
        poller.join().unwrap();
        assert_eq!(*slot.lock(cpu).unwrap(), 2, "{CONSERVATION}");
    });
}

/// Two threads bound to the owner's CPU each poll once while a requester of another CPU takes
/// the lock twice (two calls): one poller can read the first call and be preempted before it
/// publishes while the other reads and publishes the second. The answer must not move
/// backwards (the mock checks every store to the answer cell,
/// `rseq::mock::ANSWER_WENT_BACK`).
fn two_answerers() {
    loom::model(|| {
        let (qpw, cpu, slot, phys) = fenced_slot();
        let pollers: Vec<_> = (0..2)
            .map(|_| {
                let qpw = qpw.clone();
                thread::spawn(move || {
                    let binding = qpw.bind_current(cpu).unwrap();
                    count_poll(binding.poll());
                })
            })
            .collect();
        migrate_to(Some(phys + 1));
        *slot.lock(cpu).unwrap() += 1;
        *slot.lock(cpu).unwrap() += 1;
        for poller in pollers {
            poller.join().unwrap();
        }
        assert_eq!(*slot.lock(cpu).unwrap(), 2, "{CONSERVATION}");
    });
}

/// A thread bound to the owner's CPU polls once and migrates to another CPU at `point` of its
/// answer, while the owner (a second thread bound there) takes its lock once and a requester
/// of another CPU takes it twice (so that a call can be pending when the poll starts, and a
/// second one can be made while it is in flight).
fn poller_migrating_at(point: AnswerPoint) {
    loom::model(move || {
        let (qpw, cpu, slot, phys) = fenced_slot();
        let elsewhere = phys + 1;
        let owner = spawn_owner(&qpw, cpu, &slot);
        let poller = thread::spawn(move || {
            let binding = qpw.bind_current(cpu).unwrap();
            migrate_at(point, elsewhere);
            count_poll(binding.poll());
        });
        migrate_to(Some(elsewhere));
        *slot.lock(cpu).unwrap() += 1;
        *slot.lock(cpu).unwrap() += 1;
        owner.join().unwrap();
        poller.join().unwrap();
        assert_eq!(*slot.lock(cpu).unwrap(), 3, "{CONSERVATION}");
    });
}

/// Never both: the owner's sequence and the requester's flag, fence and check.
#[test]
fn loom_fenced_owner_vs_requester() {
    owner_vs_requester();
}

/// The flag's `CAS` and the side mutex keep two requesters apart.
#[test]
fn loom_fenced_two_requesters() {
    two_requesters();
}

/// A release from another CPU reaches the requester, and so does the data.
#[test]
fn loom_fenced_owner_migrating() {
    owner_migrating();
}

/// The requester waits out the committed holder; the second thread of the owner's CPU sleeps
/// rather than steals, and the hand-overs between the three reach everyone.
#[test]
fn loom_fenced_owner_preempted_while_holding() {
    owner_preempted_while_holding();
}

/// Two requesters, each preempted while holding, against the owner.
#[test]
fn loom_fenced_owner_vs_two_preempted_requesters() {
    owner_vs_two_preempted_requesters();
}

/// An answer settles only the flag it answered.
#[test]
fn loom_fenced_owner_and_requester_twice() {
    owner_and_requester_twice();
}

/// With answers off every requester fences: the fence path alone, as before answers existed.
#[test]
fn loom_fenced_owner_vs_requester_acks_off() {
    with_acks_off(owner_vs_requester);
}

#[test]
fn loom_fenced_owner_preempted_while_holding_acks_off() {
    with_acks_off(owner_preempted_while_holding);
}

/// Nothing is lost or counted twice through `PerCpu::lock` and `lock_local`.
#[test]
fn loom_fenced_remote_drain_in_the_requester() {
    remote_drain_in_the_requester();
}

/// An owner that polls between its requests answers the requester from its loop, for both
/// locks of its CPU; nothing is lost or counted twice, and the polls did answer in some
/// executions (else the model would not be checking them).
#[test]
fn loom_fenced_owner_polls() {
    owner_polls();
    let (answered, _) = POLLS.with(Cell::get);
    assert!(answered > 0, "no poll answered in any execution");
}

/// A poll from another CPU never answers; the requester fences instead.
#[test]
fn loom_fenced_poll_from_elsewhere() {
    poll_from_elsewhere();
    let (answered, elsewhere) = POLLS.with(Cell::get);
    assert_eq!(answered, 0, "a poll from another CPU answered");
    assert!(elsewhere > 0, "no poll found a call to answer");
}

/// Runs `model` with the requester's fenced path broken as `mutation` says, and checks that
/// loom finds the failure the protocol's argument predicts (two holders at once, or an
/// increment lost or counted twice).
fn assert_caught(mutation: Mutation, model: fn()) {
    loom_common::assert_loom_catches(&mutation, Failure::TwoHolders, || {
        with_mutation(mutation, model)
    });
}

// Without the fence a sequence that loaded `FREE` before the flag commits after the
// requester's check; without the check the requester claims a lock an owner committed
// between its `CAS` and its fence. Each model with an owner must catch both.

#[test]
fn loom_fenced_owner_vs_requester_needs_the_fence() {
    assert_caught(Mutation::SkipFence, owner_vs_requester);
}

#[test]
fn loom_fenced_owner_vs_requester_needs_the_check() {
    assert_caught(Mutation::SkipCheck, owner_vs_requester);
}

#[test]
fn loom_fenced_owner_migrating_needs_the_fence() {
    assert_caught(Mutation::SkipFence, owner_migrating);
}

#[test]
fn loom_fenced_owner_migrating_needs_the_check() {
    assert_caught(Mutation::SkipCheck, owner_migrating);
}

#[test]
fn loom_fenced_owner_preempted_while_holding_needs_the_fence() {
    assert_caught(Mutation::SkipFence, owner_preempted_while_holding);
}

#[test]
fn loom_fenced_owner_preempted_while_holding_needs_the_check() {
    assert_caught(Mutation::SkipCheck, owner_preempted_while_holding);
}

#[test]
fn loom_fenced_remote_drain_in_the_requester_needs_the_fence() {
    assert_caught(Mutation::SkipFence, remote_drain_in_the_requester);
}

#[test]
fn loom_fenced_remote_drain_in_the_requester_needs_the_check() {
    assert_caught(Mutation::SkipCheck, remote_drain_in_the_requester);
}

#[test]
fn loom_fenced_owner_vs_requester_acks_off_needs_the_fence() {
    assert_caught(Mutation::SkipFence, || with_acks_off(owner_vs_requester));
}

// The answer, the epoch and the side mutex: each model that needs one fails without it.

/// An answer from a thread that is not a sequence of the lock's CPU (here the second
/// requester, which found the first one's flag) proves nothing about the owner's sequence in
/// flight, which then commits over the flag the first requester took as settled.
#[test]
fn loom_fenced_answers_come_only_from_the_owners_cpu() {
    assert_caught(
        Mutation::AckFromAnyThread,
        owner_vs_two_preempted_requesters,
    );
}

/// An answer without its epoch settles a later flag that no owner has seen.
#[test]
fn loom_fenced_answers_carry_the_epoch() {
    assert_caught(Mutation::AckWithoutEpoch, owner_and_requester_twice);
}

/// Without the side mutex two requesters raise flags of one epoch, and one settles on the
/// other's.
#[test]
fn loom_fenced_owner_vs_two_preempted_requesters_needs_the_side_mutex() {
    assert_caught(Mutation::NoSideMutex, owner_vs_two_preempted_requesters);
}

/// A waiter that sleeps on a hold without fencing the owner's CPU first misses the owner's
/// release sequence, which loaded the waiter count before the waiter registered.
#[test]
fn loom_fenced_owner_vs_requester_needs_the_waiters_fence() {
    let mutation = Mutation::SkipWaiterFence;
    loom_common::assert_loom_catches(&mutation, Failure::LostWake, || {
        with_mutation(mutation, owner_vs_requester)
    });
}

// The poll's answer is the lock's: each rule it shares with it is needed in the poll models.

/// A poll that answers from another CPU (without the sequence of the owner's CPU that proves
/// where it ran) settles the requester's flag while the owner's sequence is in flight: only
/// the poller can answer in that model, so the failure is the poll's.
#[test]
fn loom_fenced_polls_answer_only_on_their_cpu() {
    assert_caught(Mutation::AckFromAnyThread, poll_from_elsewhere);
}

/// An answer taken without comparing it with the call: the poll's answer to the first call
/// (only a poll can answer it) settles the second flag, which no sequence of the owner's CPU
/// has seen.
#[test]
fn loom_fenced_polled_answers_carry_the_epoch() {
    assert_caught(Mutation::AckWithoutEpoch, owner_polls);
}

/// With no answer from the poller elsewhere, the fence is what keeps the owner out.
#[test]
fn loom_fenced_poll_from_elsewhere_needs_the_fence() {
    assert_caught(Mutation::SkipFence, poll_from_elsewhere);
}

// The answer counters (issue 44): their edges, two answerers of one CPU, and a poll that
// migrates in the middle of its answer.

/// The owner's CPU as if its last 2^31 calls had gone unanswered (the answer 0, the call
/// counter at 2^31): the requester's call is 2^31 + 1, which the answer has not reached.
#[test]
fn loom_fenced_owner_vs_requester_2_pow_31_calls_unanswered() {
    with_counters_at(1 << 31, 0, owner_vs_requester);
}

/// The 32-bit comparison across the wrap reads that old answer as newer than the call: the
/// requester skips the fence while the owner's sequence is in flight.
#[test]
fn loom_fenced_answers_are_compared_without_a_wrap() {
    assert_caught(Mutation::WrappingCompare32, || {
        with_counters_at(1 << 31, 0, owner_vs_requester)
    });
}

/// The call counter one short of its end, every call answered: the requesters' calls reach
/// the end, where the counter stops and every requester fences.
#[test]
fn loom_fenced_owner_and_requester_at_the_counters_end() {
    with_counters_at(u64::MAX - 1, u64::MAX - 1, owner_and_requester_twice);
}

/// At the end, an answer that read the end is as old as the first call to reach it: taken as
/// an answer to a later call there, it settles a flag no sequence has seen.
#[test]
fn loom_fenced_no_answer_reaches_a_call_at_the_counters_end() {
    assert_caught(Mutation::AnswerAtTheCountersEnd, || {
        with_counters_at(u64::MAX, u64::MAX, owner_vs_requester)
    });
}

#[test]
fn loom_fenced_two_answerers_of_one_cpu() {
    POLLS.with(|p| p.set((0, 0)));
    two_answerers();
    let (answered, _) = POLLS.with(Cell::get);
    assert!(answered > 0, "no poll answered");
}

/// Stored as read, a preempted answerer's older answer lands over a newer one.
#[test]
fn loom_fenced_answers_never_move_backwards() {
    let mutation = Mutation::AnswerMayGoBack;
    loom_common::assert_loom_catches(&mutation, Failure::AnswerWentBack, || {
        with_mutation(mutation, two_answerers)
    });
}

/// Runs the migrating poller's model with the poll's migration at `point`, and returns how
/// many of its executions' polls answered and how many found they could not.
fn polls_of_poller_migrating_at(point: AnswerPoint) -> (usize, usize) {
    POLLS.with(|p| p.set((0, 0)));
    poller_migrating_at(point);
    POLLS.with(Cell::get)
}

/// Migrated before its sequence, the poll finds itself on the wrong CPU and does not answer.
#[test]
fn loom_fenced_poller_migrating_before_its_sequence() {
    let (answered, elsewhere) = polls_of_poller_migrating_at(AnswerPoint::BeforeTheSequence);
    assert_eq!(answered, 0, "a poll answered from the CPU it migrated to");
    assert!(elsewhere > 0, "no poll found a call to answer");
}

/// Migrated between its sequence's CPU check and its load, the poll's sequence is aborted (as
/// the kernel aborts a migrated thread's), and the retry finds the wrong CPU: no answer. (A
/// mock that did not abort on migration would let these polls answer.)
#[test]
fn loom_fenced_poller_migrating_in_its_sequence() {
    let (answered, elsewhere) = polls_of_poller_migrating_at(AnswerPoint::InTheSequence);
    assert_eq!(answered, 0, "an aborted read of the call was published");
    assert!(elsewhere > 0, "no poll found a call to answer");
}

/// Migrated after its sequence read the call, the poll's answer stands: the read was made on
/// the CPU.
#[test]
fn loom_fenced_poller_migrating_before_its_publish() {
    let (answered, _) = polls_of_poller_migrating_at(AnswerPoint::BeforeThePublish);
    assert!(answered > 0, "no poll answered");
}

/// A poll that decided to answer and then migrated must not answer from its new CPU.
#[test]
fn loom_fenced_poller_migrating_before_its_sequence_answers_only_on_its_cpu() {
    assert_caught(Mutation::AckFromAnyThread, || {
        poller_migrating_at(AnswerPoint::BeforeTheSequence)
    });
}
