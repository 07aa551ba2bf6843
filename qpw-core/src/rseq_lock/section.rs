//! The restartable sequences of [`RseqLock`], and the CPU fence that aborts them.
//!
//! A restartable sequence is a short run of instructions that the kernel aborts (jumps to its
//! abort handler, before the final store) if the thread is preempted, migrated or signalled
//! before it ends. There are three: `section` takes the lock (on the lock's CPU, if the word
//! is `FREE`, commit `HELD`), `release_section` releases it (on the lock's CPU, with no waiter
//! registered, commit `FREE`), and `CpuBeacon::read_call` loads a CPU's call on that CPU (the
//! answer's read, `answer.rs`, whether a lock's owner or a binding's poll answers). Each is
//! one `asm!` block for x86-64 with its own `struct rseq_cs` descriptor, and its `// SAFETY:`
//! comment is the argument that the kernel's rules are kept. On other architectures `lock_available` is false, every lock takes the
//! [`FairLock`](crate::FairLock) protocol, and the stubs here never commit; under loom the
//! sequences are mocked as three steps each (`loom_mock.rs`).
//!
//! `fence_cpu` is `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, MEMBARRIER_CMD_FLAG_CPU,
//! cpu)`: it aborts the sequences in flight on the lock's CPU and orders the caller's stores
//! before the later ones there. The requester's fence (`requester.rs`) and a waiter's, before
//! it sleeps (`wait.rs`), are this call.

use super::answer::CpuBeacon;
use super::RseqLock;
#[cfg(loom)]
use super::{FREE, HELD};
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

impl RseqLock {
    /// One restartable sequence: if the thread runs on the lock's CPU and the word is `FREE`,
    /// commit `HELD`; if it is not, say what it held.
    #[cfg(all(not(loom), target_arch = "x86_64"))]
    #[inline(always)]
    pub(super) fn section(&self) -> Section {
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
        // protocol (`rseq_lock`'s module docs) guarantees no other store to the word can race
        // with the committing store. (5) No stack is used; flags are clobbered (declared by
        // default); every path ends at label 9 with `outcome` set: the commit falls through to
        // it, and the out-of-line exits (in `__rseq_failure`, outside the sequence's range like
        // the abort handler) jump back.
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
    pub(super) fn release_section(&self) -> Release {
        let Some(area) = crate::rseq::area() else {
            return Release::Slow;
        };
        let outcome: u32;
        // SAFETY: as in `section`, points (1), (2), (3) and (5), for a second descriptor;
        // (4) `word` and `waiters` point to this lock's atomics, live for `&self`; the caller
        // holds the lock, so no other party stores to the word (`rseq_lock`'s module docs), and
        // the committing store is a plain 4-byte `mov` (a release store on x86-64, after the
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
    pub(super) fn release_section(&self) -> Release {
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

    /// Aborts the sequences running on the lock's CPU and orders our stores before later ones.
    #[cfg(not(loom))]
    pub(super) fn fence_cpu(&self) -> std::io::Result<()> {
        crate::rseq::fence_cpu(self.cpu as usize)
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
        // SAFETY: as in `RseqLock::section`, points (1), (2), (3) and (5), for a third
        // descriptor (a poller's `cpu` is a physical CPU or `FALLBACK_CPU`, as a lock's is, so
        // no `cpu_id` of a thread without a registration equals it either); (4) `cell` is a
        // live `AtomicU64` (a beacon's, in a static, so 8-byte aligned), read with a
        // single-copy-atomic 8-byte `mov`; the sequence stores nothing but `rseq_cs`. Its critical section ends right
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
