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
//! The lock word takes four values: `FREE`, `HELD`, `HANDOFF` (released to a sleeping waiter,
//! which has not claimed it yet) and `FENCED` (held by a thread that took it from another CPU,
//! below). Besides the word, a count of registered waiters.
//!
//! - **Acquire, on the lock's CPU** (the fast path): one restartable sequence that checks the
//!   thread's `cpu_id` against the lock's CPU, loads the word, and if it is `FREE` commits
//!   `HELD` with a plain store. The store is the sequence's last instruction, so either it
//!   happened with no other thread of the CPU running since the load, or the kernel aborted
//!   the sequence and we try again. No atomic read-modify-write.
//! - **Release** (from wherever the holder runs now): when no waiter is registered, a plain
//!   `Release` store of `FREE`, then a compiler-only fence and a second look at the waiter
//!   count, waking one if a waiter registered meanwhile; when one is, a `Release` store of
//!   `HANDOFF` and a `futex` wake. No atomic read-modify-write either.
//! - **Wait**: spin a few times re-trying, then register (`fetch_add` on the waiter count: the
//!   slow path may use atomics), issue the heavy side of an asymmetric fence (below), and sleep
//!   on the word with `futex` until it changes; a waiter that finds `HANDOFF` claims it with a
//!   compare-and-swap to `HELD`. So a waiter on the same CPU as a preempted holder sleeps
//!   instead of spinning against it (a `SCHED_FIFO` worker spinning would never let a
//!   `SCHED_OTHER` holder run, and yielding would not help it), and a release hands the lock to
//!   the sleeper instead of letting the releaser re-take it in a tight loop (the fairness
//!   [`FairLock`] gets from `unlock_fair`).
//! - **Acquire from another CPU** (a thread that migrated, one the kernel did not register, or
//!   a lock with no CPU): under the lock's side mutex (one such taker at a time), `CAS` the word
//!   from `FREE` to `FENCED`, then *fence the lock's CPU* with
//!   `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, MEMBARRIER_CMD_FLAG_CPU, cpu)`, then
//!   look again: still `FENCED` means we hold it; anything else means a sequence of that CPU
//!   committed `HELD` over our `FENCED` and holds it, and we wait like any waiter.
//!
//! # Who writes the word, from where, and why that is enough
//!
//! | value seen | who may store to the word | how |
//! |---|---|---|
//! | `FREE` | any thread of the lock's CPU | plain store of `HELD`, committed by a restartable sequence |
//! | `FREE` | one thread of another CPU (under the side mutex) | `CAS` to `FENCED`, then the CPU fence |
//! | `HELD`, `FENCED` | the holder, from any CPU | plain `Release` store of `FREE` or `HANDOFF` |
//! | `HANDOFF` | a registered waiter, from any CPU | `CAS` to `HELD` |
//!
//! Only in the `FREE` state can two parties store, and there the plain stores all come from
//! one CPU, whose restartable sequences exclude each other (the kernel aborts one that was
//! preempted between its load and its store). The one party from another CPU uses a `CAS` and
//! then the fence: a sequence of the lock's CPU that loaded `FREE` before our `CAS` has either
//! committed by the time the fence returns (and then the word no longer reads `FENCED`: we
//! back off) or is aborted by it and, re-run, sees `FENCED`. In every other state exactly one
//! party may store, so plain stores cannot be lost. In particular a holder that migrated
//! releases correctly: while the word is `HELD` no thread of the lock's CPU stores to it, and
//! the holder's `Release` store is read by the next acquirer's load (an `Acquire` in the
//! memory model: a plain `mov` on x86-64, whose loads are not reordered with later accesses),
//! which hands over the data wherever the two threads run.
//!
//! **The waiter handshake** is a store-then-load on each side (releaser: store the word, load
//! the count; waiter: add to the count, load the word through `futex`), which needs a full
//! fence on both sides. The releaser's would cost as much as the atomic we saved, so it is an
//! *asymmetric* fence: the releaser has only a compiler fence; the waiter, on its slow path,
//! calls `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which runs a full barrier on every
//! CPU running a thread of the process. Either the releaser's load of the count comes after
//! that barrier and sees the waiter, or its store of `FREE` came before it and the waiter's
//! `futex` sees the word changed and does not sleep.
//!
//! # When it is not used
//!
//! The restartable sequence is x86-64 assembly and needs glibc's rseq registration and the
//! membarrier commands; when any is missing (another architecture, a kernel without rseq,
//! `GLIBC_TUNABLES=glibc.pthread.rseq=0`, valgrind), every `RseqLock` of the process uses the
//! atomic [`FairLock`] protocol instead, decided once on first use and
//! reported by [`rseq::status`](crate::rseq::status) and [`RseqLock::kind`].
//!
//! # What it may not do
//!
//! It has no [`RawRemoteLock`](crate::RawRemoteLock) impl: taking it from another CPU is
//! correct but costs an inter-processor interrupt, so [`PerCpu::lock`](crate::PerCpu::lock),
//! [`PerCpu::for_each_locked`](crate::PerCpu::for_each_locked) and remote-mode work do not
//! compile for it, and [`Qpw::per_cpu_with`](crate::Qpw::per_cpu_with) refuses to make it
//! for an instance with a remote-mode CPU. The paths that touch the word are therefore:
//! `lock_local`/`try_lock_local` from threads of the CPU (the fast path; a thread that migrated
//! picks its new CPU's lock), [`PerCpu::lock_work`](crate::PerCpu::lock_work) from the CPU's
//! worker (pinned there), the release from wherever the holder now runs, and the fenced path
//! for the rare thread that is bound to the CPU but runs elsewhere, and for
//! [`PerCpu::read_each`](crate::PerCpu::read_each), the slow walk over every CPU for final
//! sums.
//!
//! # Under loom
//!
//! The kernel is mocked, not the protocol. A sequence is three loom steps: *start* (check the
//! CPU, take a mark), the *load* of the word, a free-standing loom atomic, and the *commit*;
//! loom may run any other thread between any two of them. The commit stores `HELD` without
//! looking at the word again, as the real store does; the only thing that keeps a commit whose
//! load has gone stale from landing is an abort, and aborts come only from where the kernel's
//! come: another sequence starting on the same CPU (the thread in flight there was preempted)
//! and the CPU fence (its interrupt). Each lock counts those events under a loom mutex; the
//! commit checks the count is still its start's and stores in the same step, as the kernel's
//! abort, which moves the instruction pointer, makes them one.
//!
//! That mutex is taken only at points where the kernel synchronises with the CPU: a sequence's
//! start and commit, and the fence's interrupt, which is a full barrier on the target CPU that
//! the caller waits for. So it orders nothing the kernel does not: a commit that succeeds has
//! synchronised only with its own start or with threads of its own CPU (which the context
//! switch between them orders anyway), and the fence sees the owner's earlier stores and
//! passes on the caller's `CAS` only as the interrupt landing between two of the owner's
//! instructions would. The commit's store is an ignored-result `swap` rather than a `store`, to
//! step round loom 0.7 letting a plain store slip between the read and the write of a
//! concurrent `CAS` (tokio-rs/loom#254); a thread's CPU is `rseq::mock::migrate_to`; `futex` is
//! a loom condition variable checked under its mutex (the bucket lock); both sides of the
//! asymmetric fence are `SeqCst` fences; and a waiter does not spin before sleeping (`SPINS`
//! says why). `rseq::mock::with_mutation` leaves out the requester's fence or its check, so
//! that the models can show they catch either loss.

use std::fmt;

use crate::raw_lock::LocalAttempt;
use crate::sync::{AtomicU32, Ordering};
use crate::{FairLock, RawLocalLock};

const FREE: u32 = 0;
const HELD: u32 = 1;
const HANDOFF: u32 = 2;
const FENCED: u32 = 3;

/// The CPU of a lock made by [`RseqLock::new`]: no CPU, so every acquisition is fenced.
const NO_CPU: u32 = u32::MAX;
/// The CPU of every lock in the fallback: the sequence never commits.
const FALLBACK_CPU: u32 = u32::MAX - 1;

/// Spins on a busy lock before sleeping. A few: spinning only pays when the holder runs on
/// another CPU (a migrated holder, or a fenced taker). Under loom none: each spin is a loom
/// yield, which loom's search never moves earlier, so a spin before a waiter's first attempt
/// kept that attempt out of every window between an owner's load and its commit (the models
/// then passed with the fence or the check removed). An attempt from the spin is the same
/// `try_once` as one from the sleeping loop, so leaving it out loses no logic.
const SPINS: u32 = if cfg!(loom) { 0 } else { 40 };

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

/// The outcome of one restartable sequence.
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
    waiters: AtomicU32,
    /// The physical CPU whose threads may commit plain stores to `word`; `FALLBACK_CPU` in the
    /// fallback, which no `cpu_id` ever equals, so that the hot path can run the sequence
    /// first and look at `fallback` only when it fails.
    cpu: u32,
    /// This process uses the `FairLock` protocol ([`RseqLock::kind`]); kept in the lock so
    /// that the hot path reads its own cache line, not a global.
    fallback: bool,
    /// The whole lock when the process falls back; otherwise the side mutex that lets one
    /// taker from another CPU at a time through the fenced path.
    fair: FairLock,
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
    /// commit `HELD`.
    #[cfg(all(not(loom), target_arch = "x86_64"))]
    #[inline(always)]
    fn section(&self) -> Section {
        let Some(area) = crate::rseq::area() else {
            return Section::WrongCpu;
        };
        let word = self.word.as_ptr();
        let outcome: u32;
        // SAFETY: (1) `area` is the calling thread's registered `struct rseq` (the lock is
        // used only when glibc registered one: `lock_available`), so `cpu_id` at offset 4 and
        // `rseq_cs` at offset 8 are in bounds, and the thread may write `rseq_cs` (it is the
        // field through which user space arms a sequence); a thread whose own registration
        // failed has `cpu_id` -1 or -2, which never equals a CPU number, so it never enters
        // the sequence's store. (2) The descriptor (`struct rseq_cs`: version 0, flags 0,
        // start_ip, post_commit_offset, abort_ip) is emitted 32-byte aligned into the
        // writable `__rseq_cs` section and lives for the whole program; the kernel reads it
        // only while `rseq_cs` points at it. (3) The abort handler is outside
        // [start_ip, start_ip + post_commit_offset) and is preceded by the 4-byte signature
        // glibc registered (RSEQ_SIG, 0x53053053, encoded as the operand of a `ud1` so that
        // disassemblers stay in step), as the kernel checks before jumping to it. (4) `word`
        // points to this lock's `AtomicU32`, live for `&self`; the sequence's 4-byte `mov`
        // load and store are single-copy atomic, and the protocol (module docs) guarantees no
        // other store to the word can race with the committing store. (5) No stack is used;
        // flags are clobbered (declared by default); every path ends at label 9 with
        // `outcome` set: the commit falls through to it, and the out-of-line exits (in
        // `__rseq_failure`, outside the sequence's range like the abort handler) jump back.
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

    /// No sequence assembly for this architecture: `lock_available` is false, and the fallback
    /// never calls this.
    #[cfg(all(not(loom), not(target_arch = "x86_64")))]
    #[inline(always)]
    fn section(&self) -> Section {
        Section::WrongCpu
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
        if self.mock.commit(started, &self.word, HELD) {
            Section::Acquired
        } else {
            Section::Aborted
        }
    }

    /// Runs the sequence until it is not aborted.
    #[inline]
    fn section_retrying(&self) -> Section {
        loop {
            match self.section() {
                Section::Aborted => continue,
                outcome => return outcome,
            }
        }
    }

    /// One attempt from wherever the thread runs: the sequence, or the fenced path.
    fn try_once(&self) -> bool {
        match self.section_retrying() {
            Section::Acquired => true,
            Section::Busy => false,
            Section::WrongCpu | Section::Aborted => self.try_fenced(),
        }
    }

    /// The acquisition from another CPU: `CAS` to `FENCED`, fence the lock's CPU, check.
    #[cold]
    fn try_fenced(&self) -> bool {
        if self.word.load(Ordering::Relaxed) != FREE {
            return false;
        }
        self.fair.lock();
        let won =
            match self
                .word
                .compare_exchange(FREE, FENCED, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.fence_cpu();
                    // Still ours, or did a sequence of that CPU commit over it before the fence?
                    self.still_fenced()
                }
                Err(_) => false,
            };
        // SAFETY: taken just above, by this thread.
        unsafe { self.fair.unlock() };
        won
    }

    /// The check after the fence: the word still reads `FENCED`, so no sequence committed
    /// over our flag. (Under loom a model may leave the check out: `rseq::mock::Mutation`.)
    #[inline]
    fn still_fenced(&self) -> bool {
        #[cfg(loom)]
        if crate::rseq::mock::mutation() == crate::rseq::mock::Mutation::SkipCheck {
            return true;
        }
        self.word.load(Ordering::Acquire) == FENCED
    }

    /// Aborts the sequences running on the lock's CPU and orders our stores before later ones.
    #[cfg(not(loom))]
    fn fence_cpu(&self) {
        if crate::rseq::fence_cpu(self.cpu as usize).is_err() {
            // No such CPU (a lock made by `new`) or the CPU-targeted form refused: fence every
            // CPU instead (the same command without MEMBARRIER_CMD_FLAG_CPU).
            crate::rseq::fence_all_cpus();
        }
    }

    #[cfg(loom)]
    fn fence_cpu(&self) {
        if crate::rseq::mock::mutation() != crate::rseq::mock::Mutation::SkipFence {
            self.mock.fence();
        }
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
        match self.section_retrying() {
            Section::Acquired => LocalAttempt::Locked,
            Section::WrongCpu if elsewhere_gives_up => LocalAttempt::Elsewhere,
            _ => {
                self.lock_slow();
                LocalAttempt::Locked
            }
        }
    }

    /// The contended acquisition: spin briefly, then register as a waiter and sleep.
    // Under loom `SPINS` is 0, and clippy takes `0..0` for a mistake.
    #[cfg_attr(loom, allow(clippy::reversed_empty_ranges))]
    fn lock_slow(&self) {
        for _ in 0..SPINS {
            crate::sync::spin_loop();
            if self.word.load(Ordering::Relaxed) == FREE && self.try_once() {
                return;
            }
        }
        self.waiters.fetch_add(1, Ordering::SeqCst);
        heavy_fence();
        loop {
            let seen = self.word.load(Ordering::Acquire);
            let won = match seen {
                HANDOFF => self
                    .word
                    .compare_exchange(HANDOFF, HELD, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok(),
                FREE => self.try_once(),
                _ => false,
            };
            if won {
                self.waiters.fetch_sub(1, Ordering::Relaxed);
                return;
            }
            // Sleep only on a held word, whose holder's release will wake us (we are
            // registered). Not on `FREE`, which no release follows. Not on a `HANDOFF` we
            // failed to claim either: another waiter claimed it, and its release may store
            // `HANDOFF` again and wake before we sleep; `futex` would then find the value it
            // expects and sleep through that wake, with nobody left to release (loom found
            // this with two owner threads and a requester).
            if seen == HELD || seen == FENCED {
                self.futex_wait(seen);
            }
        }
    }

    #[cfg(not(loom))]
    fn futex_wait(&self, expected: u32) {
        // SAFETY: the word is a live, aligned 32-bit atomic for `&self`; FUTEX_WAIT_PRIVATE
        // only reads it (comparing with `expected` under the kernel's bucket lock) and sleeps;
        // a null timeout means no timeout. EINTR and EAGAIN just send us round the loop again.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.word.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                expected,
                std::ptr::null::<libc::timespec>(),
            );
        }
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
    fn futex_wait(&self, expected: u32) {
        self.mock.futex_wait(&self.word, expected);
    }

    #[cfg(loom)]
    fn futex_wake(&self) {
        self.mock.futex_wake();
    }
}

/// The heavy side of the waiter handshake (module docs).
#[inline]
fn heavy_fence() {
    #[cfg(not(loom))]
    crate::rseq::heavy_fence();
    #[cfg(loom)]
    crate::sync::fence(Ordering::SeqCst);
}

/// The light side: free on the hardware, given the heavy side's barrier on every CPU.
#[inline(always)]
fn light_fence() {
    #[cfg(not(loom))]
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
    #[cfg(loom)]
    crate::sync::fence(Ordering::SeqCst);
}

// SAFETY: exclusion and hand-over, as argued in the module docs: (1) every store that takes
// the lock starts from `FREE` and is either a committed restartable sequence of the lock's CPU
// (mutually exclusive among themselves, since the kernel aborts one preempted between its load
// and its store) or a `CAS` to `FENCED` validated after a fence of that CPU; (2) in every other
// state only the holder (release) or one waiter (`CAS` from `HANDOFF`) stores; (3) each
// acquisition reads the word with acquire ordering the value a release stored with release
// ordering. In the fallback every operation forwards to `FairLock`, one for one.
unsafe impl RawLocalLock for RseqLock {
    const OWN_CPU_ONLY: bool = true;

    /// A lock of no CPU: every acquisition takes the fenced path. Use
    /// [`for_cpu`](RawLocalLock::for_cpu).
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
                u32::try_from(phys).unwrap_or(NO_CPU)
            },
            fallback,
            fair: FairLock::new(),
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
        match self.section_retrying() {
            Section::Acquired => true,
            Section::Busy => false,
            _ if self.fallback() => self.fair.try_lock(),
            _ => self.try_fenced(),
        }
    }

    #[inline]
    unsafe fn unlock(&self) {
        if self.fallback() {
            // SAFETY: the caller holds the lock, which in the fallback is `fair` itself.
            return unsafe { self.fair.unlock() };
        }
        if self.waiters.load(Ordering::Relaxed) != 0 {
            // Hand over to a sleeper: no thread can take `HANDOFF` but a registered waiter.
            self.word.store(HANDOFF, Ordering::Release);
            self.futex_wake();
            return;
        }
        self.word.store(FREE, Ordering::Release);
        light_fence();
        if self.waiters.load(Ordering::Relaxed) != 0 {
            // A waiter registered as we released: it may have seen the word still held.
            self.futex_wake();
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
    }

    impl Cpu {
        pub(super) fn new() -> Self {
            Self {
                interrupts: Mutex::new(0),
                futex: Mutex::new(()),
                woken: Condvar::new(),
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
        pub(super) fn commit(&self, started: u64, word: &AtomicU32, value: u32) -> bool {
            let interrupts = self.interrupts.lock().unwrap();
            if *interrupts != started {
                return false;
            }
            word.swap(value, Ordering::Relaxed);
            drop(interrupts);
            true
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

        /// `FUTEX_WAKE`, under the same bucket lock.
        pub(super) fn futex_wake(&self) {
            let _guard = self.futex.lock().unwrap();
            self.woken.notify_all();
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
