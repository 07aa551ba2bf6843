//! The kernel side of restartable sequences, for loom: what [`RseqLock`](super::RseqLock)'s
//! sequences, its CPU fence and its `futex` calls become in a model.
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
//! That count and the CPU's beacon are the CPU's, not a lock's: every lock of a CPU, and a
//! [`Binding`](crate::Binding) of a thread bound there (whose poll answers for the CPU), find
//! the same [`Cpu`] ([`Cpu::of`]), as on a real CPU a thread's sequence aborts whatever
//! sequence was in flight there, whichever lock it was for. The table of mock CPUs is a loom
//! `lazy_static`, made again for each execution; a lock looks its CPU up when it is made and a
//! binding when it polls. Loom orders every look-up after the table's making (an acquire of
//! its release), which adds no order to a model: the table is made with the model's first
//! lock, before its threads start, or by the first poll, which comes after a lock is made. The
//! `futex` is the lock's own.
//!
//! That mutex is taken only at points where the kernel synchronises with the CPU: a sequence's
//! start and commit, and the fence's interrupt, which is a full barrier on the target CPU that
//! the caller waits for. So it orders nothing the kernel does not: a commit that succeeds has
//! synchronised only with its own start or with threads of its own CPU (which the context
//! switch between them orders anyway), and the fence sees the owner's earlier stores and
//! passes on the caller's `CAS` only as the interrupt landing between two of the owner's
//! instructions would. The commit's store is an ignored-result `swap` rather than a `store`, to
//! step round loom 0.7 letting a plain store slip between the read and the write of a
//! concurrent `CAS` (tokio-rs/loom#254); a thread's CPU is `rseq::mock::migrate_to`, which
//! aborts the thread's own sequence in flight, as the kernel aborts a migrated thread's (and
//! `rseq::mock::migrate_at` places a migration inside an answer); `futex`
//! is a loom condition variable checked under its mutex (the bucket lock), whose wake wakes
//! one waiter, as `FUTEX_WAKE` with 1 does; the slow paths' full barriers are `SeqCst` fences
//! (loom models those, not the ordering of `SeqCst` accesses); a requester's wait for an
//! answer is one more look, which loom may place anywhere; and a waiter does not spin before
//! sleeping (`SPINS` says why). `rseq::mock::with_mutation` leaves out one step at a time (the
//! requester's fence or its check, the answer's CPU or epoch, the side mutex, the waiter's
//! fence, the answer counters' comparison and monotony), so that the models can show they
//! catch each loss; `rseq::mock::with_counters_at` starts every CPU's answer counters where a
//! model asks (near their edges).

use std::cell::RefCell;

use std::cell::Cell;

use crate::sync::{lazy_static, thread_local, AtomicU32, Condvar, Mutex, Ordering};

/// How many CPUs one model may use: its locks' CPUs (two, `0` and `1`, or the physical CPU a
/// `Qpw` instance runs its CPU on) and the "no CPU" of `RseqLock::new`.
const MOCK_CPUS: usize = 4;

/// The mock CPUs of one execution: which CPU each entry is (in the order of first use), and
/// its state.
struct Cpus {
    numbers: RefCell<[Option<u32>; MOCK_CPUS]>,
    cpus: [Cpu; MOCK_CPUS],
}

lazy_static! {
    static ref CPUS: Cpus = Cpus {
        numbers: RefCell::new([None; MOCK_CPUS]),
        cpus: std::array::from_fn(|_| Cpu::new()),
    };
}

/// What the kernel does for one CPU: abort its sequences. And the CPU's beacon, which its
/// threads answer.
#[derive(Debug)]
pub(crate) struct Cpu {
    /// How many times a sequence of this CPU has been aborted or begun: bumped when a
    /// sequence starts (the thread that had one in flight here was preempted) and by the
    /// CPU fence (its interrupt). The mutex is taken only at the moments the kernel
    /// synchronises with the CPU: a sequence's start and commit (a point in that CPU's
    /// instruction stream) and the fence's interrupt landing there.
    interrupts: Mutex<u64>,
    /// The CPU's beacon (`answer.rs`).
    pub(super) beacon: super::answer::Beacon,
}

impl Cpu {
    fn new() -> Self {
        let (call, answer) = crate::rseq::mock::counters_at();
        Self {
            interrupts: Mutex::new(0),
            beacon: super::answer::Beacon::new(call, answer),
        }
    }

    /// CPU `cpu`'s state in this execution (the same for every lock of the CPU and every
    /// binding to it).
    ///
    /// # Panics
    ///
    /// When a model uses more than [`MOCK_CPUS`] CPUs.
    pub(crate) fn of(cpu: u32) -> &'static Cpu {
        let table: &'static Cpus = &CPUS;
        let mut numbers = table.numbers.borrow_mut();
        let idx = match numbers.iter().position(|&n| n == Some(cpu)) {
            Some(idx) => idx,
            None => {
                let Some(free) = numbers.iter().position(Option::is_none) else {
                    panic!("a loom model uses more than {MOCK_CPUS} mock CPUs");
                };
                numbers[free] = Some(cpu);
                free
            }
        };
        &table.cpus[idx]
    }

    /// A sequence starts on this CPU: one in flight here (another thread's, which must
    /// have been preempted for this one to run) is aborted. Returns the sequence's mark.
    pub(super) fn start(&self) -> u64 {
        let mut interrupts = self.interrupts.lock().unwrap();
        *interrupts += 1;
        let started = *interrupts;
        drop(interrupts);
        let me: &'static Cpu = self.static_ref();
        IN_FLIGHT.with(|f| f.set(Some((me, started))));
        started
    }

    /// This CPU as the table holds it (every `Cpu` lives in the execution's table).
    fn static_ref(&self) -> &'static Cpu {
        let table: &'static Cpus = &CPUS;
        table
            .cpus
            .iter()
            .find(|c| std::ptr::eq(*c, self))
            .expect("a mock CPU outside the table")
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
}

thread_local! {
    /// The calling model thread's last sequence: its CPU and its mark, so that a migration in
    /// the middle of it aborts it ([`migrated`]).
    #[allow(clippy::missing_const_for_thread_local)]
    static IN_FLIGHT: Cell<Option<(&'static Cpu, u64)>> = Cell::new(None);
}

/// The calling model thread is migrating (`rseq::mock::migrate_to`): as the kernel does for a
/// thread preempted or migrated inside a restartable sequence, its sequence in flight is
/// aborted (it will not commit, and a load in it does not count as made on its CPU). Only that
/// one: the CPU's count moves only if no other sequence has started there since this thread's.
pub(crate) fn migrated() {
    if let Some((cpu, started)) = IN_FLIGHT.with(|f| f.take()) {
        let mut interrupts = cpu.interrupts.lock().unwrap();
        if *interrupts == started {
            *interrupts += 1;
        }
    }
}

/// A lock's `futex`: its waiters asleep on the word.
#[derive(Debug)]
pub(super) struct Futex {
    /// The hash bucket's lock.
    bucket: Mutex<()>,
    woken: Condvar,
}

impl Futex {
    pub(super) fn new() -> Self {
        Self {
            bucket: Mutex::new(()),
            woken: Condvar::new(),
        }
    }

    /// `FUTEX_WAIT`: sleeps unless the word has changed, checked under the bucket lock.
    pub(super) fn wait(&self, word: &AtomicU32, expected: u32) {
        let guard = self.bucket.lock().unwrap();
        if word.load(Ordering::SeqCst) == expected {
            drop(self.woken.wait(guard).unwrap());
        }
    }

    /// `FUTEX_WAKE` of one waiter, as the lock asks of the kernel, under the same bucket
    /// lock.
    pub(super) fn wake(&self) {
        let _guard = self.bucket.lock().unwrap();
        self.woken.notify_one();
    }
}
