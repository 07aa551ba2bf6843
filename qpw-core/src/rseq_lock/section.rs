//! The restartable sequences of [`RseqLock`], the owner's fast path built on them, and the
//! CPU fence that aborts them.
//!
//! A restartable sequence is a short run of instructions that the kernel aborts (jumps to its
//! abort handler, before the final store) if the thread is preempted, migrated or signalled
//! before it ends. There are four, each one `asm!` block for x86-64 with its own `struct
//! rseq_cs` descriptor, and each block's `// SAFETY:` comment is the argument that the
//! kernel's rules are kept:
//!
//! - `take` takes the lock (on the lock's CPU, if the word is `FREE`, commit `HELD`) and says
//!   why it did not: the slow paths' sequence (`section`).
//! - `take_owned` is the same sequence for the owner's fast path: the CPU check and the look
//!   at the word are one compare of an 8-byte load, since the lock keeps its CPU and its word
//!   side by side (`cpu | word << 32` equals the thread's `cpu_id` exactly when the thread
//!   runs on the lock's CPU and the word is `FREE`), and both misses leave by one exit.
//! - `give_back` releases the lock (on the lock's CPU, with no waiter registered, commit
//!   `FREE`), with the CPU check and the look at the waiter count one compare in the same way
//!   (the lock keeps its CPU a second time, beside the count).
//! - `CpuBeacon::read_call` loads a CPU's call on that CPU (the answer's read, `answer.rs`,
//!   whether a lock's owner or a binding's poll answers).
//!
//! The ways out of `take`, `take_owned` and `give_back` are asm-goto labels (`asm!` label
//! blocks, Rust 1.87): the commit falls through into the caller's code, and every other exit
//! (a miss, the abort handler) branches straight to the caller's code for it, so that the
//! fast path tests no outcome code after the sequence.
//!
//! [`OwnerPath`] is the owner's fast path: a lock and the thread's rseq [`Area`] in hand, so
//! that taking the lock is `take_owned` and releasing it `give_back`, with no look-up of the
//! area and no test of the lock's kind (`PerCpu::lock_local` makes one for a bound thread from
//! its registration; a `BoundSlot` keeps one; the owner's guard keeps the area for its
//! release). The sequences and the protocol are the same as the slow paths'; only what the
//! caller has in hand differs, and that they compare two fields with one load.
//!
//! On other architectures `lock_available` is false, every lock takes the
//! [`FairLock`](crate::FairLock) protocol, and the stubs here never commit; under loom the
//! sequences are mocked as three steps each (`loom_mock.rs`), and the owner's fast path is one
//! mocked sequence, as the lock's own first try is.
//!
//! `fence_cpu` is `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, MEMBARRIER_CMD_FLAG_CPU,
//! cpu)`: it aborts the sequences in flight on the lock's CPU and orders the caller's stores
//! before the later ones there. The requester's fence (`requester.rs`) and a waiter's, before
//! it sleeps (`wait.rs`), are this call.

use std::marker::PhantomData;
use std::ptr::NonNull;

use super::answer::CpuBeacon;
use super::RseqLock;
#[cfg(not(loom))]
use super::NO_CPU;
#[cfg(loom)]
use super::{FREE, HELD};
use crate::rseq::Area;
#[cfg(loom)]
use crate::sync::Ordering;

/// The outcome of one restartable sequence that tries to take the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Section {
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
pub(super) enum Read {
    /// Read on the lock's CPU, with the thread there from the CPU check to the load.
    Seen(u64),
    /// The thread does not run on the lock's CPU.
    WrongCpu,
    /// The kernel aborted the sequence: try again.
    Aborted,
}

/// The outcome of one restartable sequence that tries to release the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Release {
    /// Committed `FREE`, with no waiter registered.
    Done,
    /// A waiter is registered, or the thread does not run on the lock's CPU: release with the
    /// slow path's full fences.
    Slow,
    /// The kernel aborted the sequence: try again.
    Aborted,
}

/// The first lines of every sequence here: its `struct rseq_cs` descriptor (version 0, flags
/// 0, `start_ip` at label 4, `post_commit_offset` up to label 5, `abort_ip` at label 6),
/// emitted 32-byte aligned into the writable `__rseq_cs` section, then its arming
/// (`rseq->rseq_cs = &descriptor`, through the block's `tmp` and `area` operands).
#[cfg(all(not(loom), target_arch = "x86_64"))]
macro_rules! descriptor_and_arm {
    () => {
        concat!(
            ".pushsection __rseq_cs, \"aw\"\n",
            ".balign 32\n",
            "3:\n",
            ".long 0, 0\n",
            ".quad 4f, (5f - 4f), 6f\n",
            ".popsection\n",
            "lea {tmp}, [rip + 3b]\n",
            "mov qword ptr [{area} + 8], {tmp}\n",
        )
    };
}

/// The abort handler at label 6, out of line in `__rseq_failure`, after the 4-byte signature
/// glibc registered (RSEQ_SIG, 0x53053053, as the operand of a `ud1`, so that disassemblers
/// stay in step), as the kernel checks before it jumps there: a jump to the block's `aborted`
/// label.
#[cfg(all(not(loom), target_arch = "x86_64"))]
macro_rules! abort_to {
    () => {
        concat!(
            ".pushsection __rseq_failure, \"ax\"\n",
            ".byte 0x0f, 0xb9, 0x3d\n",
            ".long 0x53053053\n",
            "6:\n",
            "jmp {aborted}\n",
            ".popsection\n",
        )
    };
}

/// The acquire sequence that says why it did not take the lock (the slow paths'): if the
/// thread runs on the lock's CPU and the word is `FREE`, commit `HELD`. Each way out is its
/// own: the commit falls through, the other exits branch straight to the caller's code (asm
/// goto).
///
/// # Safety
///
/// 1. `area` is the calling thread's [`Area`]: its registered `struct rseq`, or its stand-in.
/// 2. `lock` points to a live [`RseqLock`].
#[cfg(all(not(loom), target_arch = "x86_64"))]
#[inline(always)]
unsafe fn take(area: Area, lock: &RseqLock) -> Section {
    // SAFETY: (1) `area` is the calling thread's `struct rseq` as glibc registered it, or its
    // stand-in (premise 1), so `cpu_id` at offset 4 and `rseq_cs` at offset 8 are in bounds
    // and the thread may write `rseq_cs` (it is the field through which user space arms a
    // sequence; the stand-in's is an `UnsafeCell` nobody else reads); a thread without a
    // registration (it never had one, or unregistered, or has the stand-in) has `cpu_id` -1
    // or -2, which no lock's `cpu` equals (`NO_CPU`), so it never reaches the sequence's
    // store. (2) The descriptor (`struct rseq_cs`: version 0, flags 0, start_ip,
    // post_commit_offset, abort_ip) is emitted 32-byte aligned into the writable `__rseq_cs`
    // section and lives for the whole program; the kernel reads it only while `rseq_cs`
    // points at it. (3) The abort handler is outside [start_ip, start_ip +
    // post_commit_offset) (in `__rseq_failure`) and is preceded by the 4-byte signature glibc
    // registered (RSEQ_SIG, 0x53053053, encoded as the operand of a `ud1` so that
    // disassemblers stay in step), as the kernel checks before jumping to it; it jumps to the
    // caller's `aborted` exit. (4) The commit, the store of `HELD`, is the last instruction of
    // the critical section: `post_commit_ip` (label 5) is right after it; the early exits
    // (`jne` to the caller's labels) leave the section before any store. (5) `lock` is a live
    // lock (premise 2) whose `word` is at the `const` offset; the 4-byte `mov` load and store
    // are single-copy atomic, and the protocol (`rseq_lock`'s module docs) guarantees that no
    // other store to the word can race with the committing one. (6) No stack is used; flags
    // and `tmp` are clobbered (declared); the inputs are never written, so every exit, the
    // kernel's jump to the abort handler included (it changes only the instruction pointer),
    // leaves them as the compiler expects.
    unsafe {
        std::arch::asm!(
            // The descriptor the kernel consults on preemption, and its arming.
            descriptor_and_arm!(),
            // start_ip: are we on the lock's CPU?
            "4:",
            "cmp dword ptr [{area} + 4], {cpu:e}",
            "jne {wrong}",
            // Is the word FREE?
            "cmp dword ptr [{lock} + {word}], 0",
            "jne {busy}",
            // Commit: the last instruction of the sequence.
            "mov dword ptr [{lock} + {word}], 1",
            // post_commit_ip: the commit falls through to the caller's code.
            "5:",
            // The abort handler, out of line, with the signature just before it.
            abort_to!(),
            area = in(reg) area.as_ptr(),
            cpu = in(reg) lock.on_cpu(),
            lock = in(reg) lock,
            word = const std::mem::offset_of!(RseqLock, word),
            tmp = out(reg) _,
            wrong = label { return Section::WrongCpu },
            busy = label { return Section::Busy },
            aborted = label { return Section::Aborted },
            options(nostack),
        );
    }
    Section::Acquired
}

/// The owner's acquire sequence: as [`take`], but with the CPU check and the look at the word
/// made by one compare (the lock keeps its CPU and its word in one aligned 8-byte word:
/// `cpu | word << 32` equals the thread's `cpu_id` exactly when the thread runs on the lock's
/// CPU and the word is `FREE`), and one way out for both misses. `true` when it committed;
/// `false` with nothing taken, when the thread runs elsewhere or the lock is busy, or the
/// lock at `lock` is [`NEVER`].
///
/// # Safety
///
/// As [`take`]'s, except that `lock` may also point to [`NEVER`].
#[cfg(all(not(loom), target_arch = "x86_64"))]
#[inline(always)]
unsafe fn take_owned(area: Area, lock: *const RseqLock) -> Option<bool> {
    // SAFETY: as in `take`, points (1), (2), (3) and (6), for another descriptor; (4) as in
    // `take`, for its single early exit; (5) `lock` is a live lock or `NEVER` (premise 2),
    // either 8-byte aligned (`repr(C, align(8))`) with `cpu` at offset 0 and `word` at 4
    // (checked at compile time, below), so the 8-byte load of both is in bounds and
    // single-copy atomic, and it reads the word after the CPU check's load of `cpu_id`, as
    // `take` does (`cpu` never changes after the lock is made). It equals the zero-extended
    // `cpu_id` only when `cpu == cpu_id` and the word is `FREE`: `cpu_id` is a real CPU
    // number or -1 or -2, and the lock's `cpu` is positive and below `FALLBACK_CPU` for a
    // lock of a CPU, `NO_CPU` or `FALLBACK_CPU` otherwise, `NO_CPU` for `NEVER`, so `NEVER`
    // is never written. Then the protocol's argument for the store is `take`'s.
    unsafe {
        std::arch::asm!(
            descriptor_and_arm!(),
            // start_ip: our CPU, then the lock's CPU and word together.
            "4:",
            "mov {tmp:e}, dword ptr [{area} + 4]",
            "cmp qword ptr [{lock} + {cpu}], {tmp}",
            "jne {missed}",
            // Commit HELD: the last instruction of the sequence.
            "mov dword ptr [{lock} + {word}], 1",
            "5:",
            abort_to!(),
            area = in(reg) area.as_ptr(),
            lock = in(reg) lock,
            cpu = const std::mem::offset_of!(RseqLock, cpu),
            word = const std::mem::offset_of!(RseqLock, word),
            tmp = out(reg) _,
            missed = label { return Some(false) },
            aborted = label { return None },
            options(nostack),
        );
    }
    Some(true)
}

/// The release sequence: if the thread runs on the lock's CPU and no waiter is registered,
/// commit `FREE`; the CPU check and the look at the waiter count are one compare (`cpu`
/// again, beside `waiters`: `release_cpu | waiters << 32` equals the thread's `cpu_id` exactly
/// when the thread runs on the lock's CPU and nobody waits).
///
/// # Safety
///
/// 1. As [`take`]'s premise 1.
/// 2. `lock` points to a live [`RseqLock`] that the calling thread holds.
#[cfg(all(not(loom), target_arch = "x86_64"))]
#[inline(always)]
unsafe fn give_back(area: Area, lock: *const RseqLock) -> Release {
    // SAFETY: as in `take`, points (1), (2), (3) and (6), for another descriptor; (4) the
    // commit, the store of `FREE`, is the last instruction of the critical section, and the
    // early exit leaves before it; (5) `lock` is a live lock (premise 2), 8-byte aligned with
    // `release_cpu` at offset 8 and `waiters` at 12, `cpu` at 0 and `word` at 4 (checked at
    // compile time, below), so the 8-byte load of `release_cpu` and `waiters` and the 8-byte
    // store of `cpu` and `word` are in bounds and single-copy atomic. The load equals the
    // zero-extended `cpu_id` only when the thread runs on the lock's CPU and the count is 0,
    // as `take_owned`'s compare; then `tmp` holds the lock's CPU (`release_cpu` is `cpu`,
    // and neither ever changes), so the store writes `cpu` its own value (an atomic, which
    // Rust code only loads) and `FREE` into the word. The caller holds the lock, so no other
    // party stores to the word (`rseq_lock`'s module docs), and the committing store is a
    // plain `mov` (a release store on x86-64, after the critical section's accesses, which
    // the asm block's implicit memory clobber keeps before it). It covers the 8 bytes that
    // the next `take_owned` loads, so that load can be forwarded from it; a 4-byte store of
    // the word alone could not be, and stalled a tight loop of lock and release.
    unsafe {
        std::arch::asm!(
            descriptor_and_arm!(),
            // start_ip: on the lock's CPU, with nobody waiting?
            "4:",
            "mov {tmp:e}, dword ptr [{area} + 4]",
            "cmp qword ptr [{lock} + {release_cpu}], {tmp}",
            "jne {slow}",
            // Commit FREE: `cpu | FREE << 32`, the CPU (`tmp`, which equals it) and the word
            // in one store, which the next acquire's one load of both can be forwarded from.
            "mov qword ptr [{lock} + {cpu}], {tmp}",
            "5:",
            abort_to!(),
            area = in(reg) area.as_ptr(),
            lock = in(reg) lock,
            release_cpu = const std::mem::offset_of!(RseqLock, release_cpu),
            cpu = const std::mem::offset_of!(RseqLock, cpu),
            tmp = out(reg) _,
            slow = label { return Release::Slow },
            aborted = label { return Release::Aborted },
            options(nostack),
        );
    }
    Release::Done
}

// The layout the 8-byte compares of `take_owned` and `give_back` read.
#[cfg(not(loom))]
const _: () = {
    use std::mem::{align_of, offset_of};
    assert!(align_of::<RseqLock>() >= 8);
    assert!(offset_of!(RseqLock, cpu) % 8 == 0);
    assert!(offset_of!(RseqLock, word) == offset_of!(RseqLock, cpu) + 4);
    assert!(offset_of!(RseqLock, release_cpu) % 8 == 0);
    assert!(offset_of!(RseqLock, waiters) == offset_of!(RseqLock, release_cpu) + 4);
    assert!(align_of::<Never>() >= 8);
    assert!(offset_of!(Never, cpu) == offset_of!(RseqLock, cpu));
    assert!(offset_of!(Never, word) == offset_of!(RseqLock, word));
};

/// What a path to no lock points to: the first fields of an [`RseqLock`] of no CPU, which the
/// owner's acquire sequence reads and never writes (its CPU is `NO_CPU`), and nothing else
/// ever touches. Not an `RseqLock`: only its address is ever taken, as a raw pointer.
#[cfg(not(loom))]
#[repr(C, align(8))]
struct Never {
    cpu: u32,
    word: u32,
}

/// See [`Never`].
#[cfg(not(loom))]
static NEVER: Never = Never {
    cpu: NO_CPU,
    word: 0,
};

/// No sequence assembly for this architecture: `lock_available` is false, every lock's CPU
/// is `FALLBACK_CPU`, and no sequence ever commits.
#[cfg(all(not(loom), not(target_arch = "x86_64")))]
#[inline(always)]
unsafe fn take_owned(_area: Area, _lock: *const RseqLock) -> Option<bool> {
    Some(false)
}

/// As [`take_owned`].
#[cfg(all(not(loom), not(target_arch = "x86_64")))]
#[inline(always)]
unsafe fn give_back(_area: Area, _lock: *const RseqLock) -> Release {
    Release::Slow
}

/// The owner's fast path to one lock: the lock and the calling thread's [`Area`] in hand, so
/// that taking the lock is one sequence and releasing it another, with no look-up and no test
/// of what kind of lock it is on the way (`PerCpu::lock_local`, `BoundSlot::lock`; the
/// owner's guard keeps the area, and finds the lock again, for its release).
///
/// A path to no lock ([`OwnerPath::none`]) leads to [`NEVER`], whose CPU no `cpu_id`
/// equals, so that its sequence always misses: what a [`BoundSlot`](crate::BoundSlot) of a
/// lock without restartable sequences runs, so that a bound slot of a fenced CPU does not
/// test the kind either. Not `Send` (the area is the thread's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct OwnerPath<'a> {
    /// The lock (under std, `NEVER` in a path to no lock).
    #[cfg(not(loom))]
    lock: NonNull<RseqLock>,
    /// The lock, if any.
    #[cfg(loom)]
    lock: Option<NonNull<RseqLock>>,
    area: Area,
    _lock: PhantomData<&'a RseqLock>,
}

impl<'a> OwnerPath<'a> {
    /// The path of the calling thread, whose area is `area`, to `lock`.
    #[inline(always)]
    pub(crate) fn new(lock: &'a RseqLock, area: Area) -> Self {
        // SAFETY: the pointer comes from a reference.
        unsafe { Self::at(NonNull::from(lock), area) }
    }

    /// The path to the lock at `lock`.
    ///
    /// # Safety
    ///
    /// `lock` points to an [`RseqLock`] that lives for `'a`.
    #[inline(always)]
    pub(crate) unsafe fn at(lock: NonNull<RseqLock>, area: Area) -> Self {
        Self {
            #[cfg(not(loom))]
            lock,
            #[cfg(loom)]
            lock: Some(lock),
            area,
            _lock: PhantomData,
        }
    }

    /// A path that never takes anything (see the type's docs).
    pub(crate) fn none(area: Area) -> Self {
        Self {
            #[cfg(not(loom))]
            lock: NonNull::from(&NEVER).cast(),
            #[cfg(loom)]
            lock: None,
            area,
            _lock: PhantomData,
        }
    }

    /// Where the path leads: the lock's address (`NEVER`'s in a path to no lock).
    #[inline(always)]
    pub(crate) fn lock_ptr(self) -> *const RseqLock {
        #[cfg(not(loom))]
        {
            self.lock.as_ptr()
        }
        #[cfg(loom)]
        {
            self.lock
                .map_or(std::ptr::null(), |l| l.as_ptr().cast_const())
        }
    }

    /// The thread's area (what a guard keeps).
    #[inline(always)]
    pub(crate) fn area(self) -> Area {
        self.area
    }

    /// Takes the lock if the thread runs on its CPU and the word is `FREE`: the owner's
    /// acquire sequence, run again when the kernel aborts it. `false`, with nothing taken,
    /// when the thread runs elsewhere, the lock is busy, or the path leads to no lock: the
    /// caller's slow path then does what [`RseqLock::lock_on_current_cpu`] does after its
    /// first try.
    #[cfg(not(loom))]
    #[inline(always)]
    pub(crate) fn try_take(self) -> bool {
        loop {
            // SAFETY: (1) `area` is the calling thread's: an `Area` is `!Send`, and the path
            // was made on the thread that looked it up; (2) `lock` is borrowed for `'a`, or is
            // `NEVER`.
            if let Some(taken) = unsafe { take_owned(self.area, self.lock.as_ptr()) } {
                return taken;
            }
        }
    }

    /// Under loom: one mocked sequence, as the lock's own first try makes (`RseqLock::
    /// lock_on_current_cpu`), so that the models see the same steps as before the path
    /// existed: a miss goes to the slow path, which tries again.
    #[cfg(loom)]
    pub(crate) fn try_take(self) -> bool {
        // SAFETY: borrowed for `'a`.
        self.lock
            .is_some_and(|l| unsafe { l.as_ref() }.section() == Section::Acquired)
    }

    /// Releases the hold this path took: the release sequence, run again when the kernel
    /// aborts it; with a waiter registered, or from another CPU, the lock's slow release.
    ///
    /// # Safety
    ///
    /// [`try_take`](Self::try_take) of this path (or of one to the same lock with the same
    /// area) took the lock, and this releases that hold, once.
    #[inline(always)]
    pub(crate) unsafe fn release(self) {
        #[cfg(not(loom))]
        loop {
            // SAFETY: (1) as in `try_take`; (2) the lock is borrowed for `'a` and held by this
            // thread (the caller's premise; `NEVER` is never taken).
            match unsafe { give_back(self.area, self.lock.as_ptr()) } {
                Release::Done => return,
                Release::Aborted => continue,
                // SAFETY: borrowed for `'a`.
                Release::Slow => return unsafe { self.lock.as_ref() }.unlock_slow(),
            }
        }
        #[cfg(loom)]
        {
            // SAFETY: a path that took a lock leads to one, borrowed for `'a`.
            let lock = unsafe { self.lock.expect("a taken path has a lock").as_ref() };
            loop {
                match lock.release_section() {
                    Release::Done => return,
                    Release::Aborted => continue,
                    Release::Slow => return lock.unlock_slow(),
                }
            }
        }
    }
}

impl RseqLock {
    /// One restartable sequence: if the thread runs on the lock's CPU and the word is `FREE`,
    /// commit `HELD`; if it is not, say what it held.
    #[cfg(all(not(loom), target_arch = "x86_64"))]
    #[inline(always)]
    pub(super) fn section(&self) -> Section {
        let Some(area) = crate::rseq::area() else {
            return Section::WrongCpu;
        };
        // SAFETY: `area` is the calling thread's registered `struct rseq` (premise 1), and
        // `self` is a live lock (premise 2).
        unsafe { take(Area::registered(area), self) }
    }

    /// One restartable sequence that releases the lock: if the thread runs on the lock's CPU
    /// and no waiter is registered, commit `FREE`.
    #[cfg(all(not(loom), target_arch = "x86_64"))]
    #[inline(always)]
    pub(super) fn release_section(&self) -> Release {
        let Some(area) = crate::rseq::area() else {
            return Release::Slow;
        };
        // SAFETY: as in `section`; the caller holds the lock (`unlock`'s contract).
        unsafe { give_back(Area::registered(area), self) }
    }

    /// No sequence assembly for this architecture: `lock_available` is false, and the fallback
    /// never calls this.
    #[cfg(all(not(loom), not(target_arch = "x86_64")))]
    #[inline(always)]
    pub(super) fn section(&self) -> Section {
        Section::WrongCpu
    }

    /// As `section`.
    #[cfg(all(not(loom), not(target_arch = "x86_64")))]
    #[inline(always)]
    pub(super) fn release_section(&self) -> Release {
        Release::Slow
    }

    /// The mocked sequence (`loom_mock.rs`, "Under loom"): three loom steps, so that loom can
    /// run any other thread between the load and the commit, and only an abort stops a commit
    /// whose load has gone stale.
    #[cfg(loom)]
    pub(super) fn section(&self) -> Section {
        if crate::rseq::mock::current() != Some(self.on_cpu() as usize) {
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
    pub(super) fn release_section(&self) -> Release {
        if crate::rseq::mock::current() != Some(self.on_cpu() as usize) {
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

    /// Aborts the sequences running on the lock's CPU and orders our stores before later ones.
    #[cfg(not(loom))]
    pub(super) fn fence_cpu(&self) -> std::io::Result<()> {
        crate::rseq::fence_cpu(self.on_cpu() as usize)
    }

    #[cfg(loom)]
    pub(super) fn fence_cpu(&self) -> std::io::Result<()> {
        self.mock.fence();
        Ok(())
    }
}

impl CpuBeacon {
    /// One restartable sequence that loads the CPU's call if the thread runs on the CPU: a
    /// load known to have run there (the answer's read).
    #[cfg(all(not(loom), target_arch = "x86_64"))]
    #[inline]
    pub(super) fn read_call(&self) -> Read {
        let cell = &self.beacon.call;
        let Some(area) = crate::rseq::area() else {
            return Read::WrongCpu;
        };
        let outcome: u32;
        let seen: u64;
        // SAFETY: as in `take`, points (1), (2) and (3), for another descriptor (a poller's
        // `cpu` is a physical CPU or `FALLBACK_CPU`, as a lock's is, so no `cpu_id` of a
        // thread without a registration equals it either); (4) `cell` is a live `AtomicU64`
        // (a beacon's, in a static, so 8-byte aligned), read with a single-copy-atomic 8-byte
        // `mov`; the sequence stores nothing but `rseq_cs`. Its critical section ends right
        // after the load, so an abort can only come between the CPU check and the load. (5)
        // No stack is used; flags, `tmp`, `seen` and `out` are declared outputs; every path
        // ends at label 9 with `out` set: the load falls through to it, and the out-of-line
        // exits (in `__rseq_failure`, outside the critical section like the abort handler)
        // jump back.
        unsafe {
            std::arch::asm!(
                descriptor_and_arm!(),
                "xor {out:e}, {out:e}",
                "4:",
                "cmp dword ptr [{area} + 4], {cpu:e}",
                "jne 7f",
                "mov {seen}, qword ptr [{cell}]",
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

    /// No sequence assembly for this architecture: `lock_available` is false, and no CPU is
    /// ever called.
    #[cfg(all(not(loom), not(target_arch = "x86_64")))]
    #[inline(always)]
    pub(super) fn read_call(&self) -> Read {
        Read::WrongCpu
    }

    /// The mocked read: start, load, and a check that no abort came in between.
    #[cfg(loom)]
    pub(super) fn read_call(&self) -> Read {
        if crate::rseq::mock::current() != Some(self.cpu as usize) {
            return Read::WrongCpu;
        }
        let started = self.mock.start();
        crate::rseq::mock::answer_point(crate::rseq::mock::AnswerPoint::InTheSequence);
        let seen = self.beacon.call.load(Ordering::Acquire);
        if self.mock.unaborted(started) {
            Read::Seen(seen)
        } else {
            Read::Aborted
        }
    }
}
