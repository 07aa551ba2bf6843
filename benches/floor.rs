//! The floor (issue 42): the shortest owner's path a per-CPU lock can have on this machine,
//! written by hand, so that the framework's paths are measured beside it: timed in
//! `benches/local.rs` (`floor`, `floor_call`) and counted in instructions by
//! `tests/owner_path` (which includes this file). Not part of any API.
//!
//! One restartable sequence reads the thread's `cpu_id`, indexes the slot, checks the slot's
//! lock word and commits the store that takes it; then the operation (`+= 1`) and a plain
//! store that releases it. Fourteen instructions with the call's `ret`, against the dozen the
//! issue estimated: the two loads of where things are (glibc's `__rseq_offset`, the slots),
//! the arming of the sequence (two), the CPU (one), its bounds check (two), the index (one),
//! the look at the word (two), the commit, the operation, the release. Its slow paths leave
//! for good (a busy word: a tail call that yields and starts again; a thread with no CPU
//! number: a trap), so that the fast path keeps no register and makes no stack frame.
//!
//! What it leaves out, and what the framework's paths pay for (`docs/results.md`, 6e):
//! waiters (a busy word is spun on here; the framework's waiters sleep on a futex, so its
//! release is a second restartable sequence that checks for them, where this one is a plain
//! store), requesters from other CPUs (the flag, the answer and the fence), a thread that is
//! bound elsewhere than it runs, and the fallback without restartable sequences. Only a
//! thread whose `cpu_id` glibc registered can use it ([`Floor::new`] says `None` otherwise),
//! and only on x86-64.

use std::cell::UnsafeCell;
use std::marker::PhantomData;

/// Slots, one per possible CPU number (glibc's `CPU_SETSIZE`, as `qpw_core::CpuSet::MAX_CPU`).
pub(crate) const SLOTS: usize = 1024;

/// One CPU's lock word and counter, on a cache line of its own (128 bytes, as crossbeam's
/// `CachePadded` on x86-64): the index is the CPU number shifted by 7.
#[repr(C, align(128))]
struct FloorSlot {
    /// 0 free, 1 held: taken only by a restartable sequence of this CPU, released by its
    /// holder.
    word: UnsafeCell<u32>,
    /// The counter, at offset 8.
    n: UnsafeCell<u64>,
}

const _: () = {
    assert!(std::mem::size_of::<FloorSlot>() == 128);
    assert!(std::mem::offset_of!(FloorSlot, word) == 0);
    assert!(std::mem::offset_of!(FloorSlot, n) == 8);
};

/// A per-CPU counter behind the hand-written lock. Neither `Send` nor `Sync`: the thread that
/// made it (and found its rseq registration) is the only one that uses it. `repr(C)`: the
/// sequence loads `offset` and `base` itself.
#[repr(C)]
pub(crate) struct Floor {
    /// glibc's `__rseq_offset`: the thread's `struct rseq` is at this offset from the thread
    /// pointer (`fs`).
    offset: isize,
    /// The first slot of `slots`.
    base: *const FloorSlot,
    slots: Box<[FloorSlot]>,
    _this_thread: PhantomData<*const ()>,
}

impl Floor {
    /// The floor for the calling thread, or `None` where it cannot run: not x86-64, no
    /// `__rseq_offset` (glibc before 2.35), or no registration for this thread.
    pub(crate) fn new() -> Option<Floor> {
        if !cfg!(target_arch = "x86_64") {
            return None;
        }
        // SAFETY: `dlsym` with `RTLD_DEFAULT` and a NUL-terminated name has no
        // preconditions; it returns null when no loaded object defines the symbol.
        let (offset, size) = unsafe {
            (
                libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()),
                libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()),
            )
        };
        if offset.is_null() || size.is_null() {
            return None;
        }
        // SAFETY: glibc defines `__rseq_offset` as a `const ptrdiff_t` and `__rseq_size` as a
        // `const unsigned int`, set before any user code runs and never written again.
        let (offset, size) = unsafe { (*(offset as *const isize), *(size as *const u32)) };
        // The fields the sequence uses end at byte 16 (`cpu_id_start`, `cpu_id`, `rseq_cs`).
        if size < 16 {
            return None;
        }
        let slots: Box<[FloorSlot]> = (0..SLOTS)
            .map(|_| FloorSlot {
                word: UnsafeCell::new(0),
                n: UnsafeCell::new(0),
            })
            .collect();
        let floor = Floor {
            offset,
            base: slots.as_ptr(),
            slots,
            _this_thread: PhantomData,
        };
        // A thread without a registration reads `cpu_id` -1 or -2.
        (floor.cpu_id() < SLOTS as u32).then_some(floor)
    }

    /// The calling thread's `cpu_id`, as the sequence reads it.
    fn cpu_id(&self) -> u32 {
        #[cfg(target_arch = "x86_64")]
        {
            let cpu: u32;
            // SAFETY: the thread's `struct rseq` is at `offset` from the `fs` base (glibc's
            // registration, found in `new`), and `cpu_id` is its `u32` at byte 4.
            unsafe {
                std::arch::asm!(
                    "mov {cpu:e}, dword ptr fs:[{off} + 4]",
                    off = in(reg) self.offset,
                    cpu = out(reg) cpu,
                    options(nostack, readonly, preserves_flags),
                );
            }
            cpu
        }
        #[cfg(not(target_arch = "x86_64"))]
        u32::MAX
    }

    /// Adds one to the calling thread's CPU's counter, under that CPU's lock word.
    #[inline(always)]
    pub(crate) fn increment(&self) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: (0) `this` is the floor, borrowed, whose `offset` and `base` (a pointer to
        // the first of `slots`, which the floor owns) the sequence loads first, at their
        // `repr(C)` offsets. (1) The `struct rseq` at `offset` from `fs` is the calling
        // thread's (the floor is neither `Send` nor `Sync`, and `new` found the thread
        // registered), so `cpu_id` (byte 4) and `rseq_cs` (byte 8) are in bounds and the
        // thread may arm a sequence through `rseq_cs`. (2) The descriptor is emitted 32-byte
        // aligned into `__rseq_cs` and lives for the whole program. (3) The abort handler is
        // outside the critical section [4, 5) (in `__rseq_failure`), preceded by glibc's
        // signature (RSEQ_SIG, the operand of a `ud1`), and re-runs the sequence from the
        // arming. (4) The commit (the store of 1 to the word) is the critical section's last
        // instruction; the early exits leave before it (the busy exit to the caller's label,
        // a thread with no CPU number to an `ud2`, out of line). (5) `cpu_id` is checked
        // against the number of slots before it indexes them, so every access is inside
        // `slots`, a live allocation; the word is taken only by a committed sequence of its
        // CPU (two sequences of one CPU exclude each other: the kernel aborts one preempted
        // between its load and its store) and released only by its holder, so the plain
        // stores cannot race, and the counter is touched only under the word. (6) No stack is
        // used; flags, `off`, `base` and `idx` are declared clobbered; the input is never
        // written.
        unsafe {
            std::arch::asm!(
                ".pushsection __rseq_cs, \"aw\"",
                ".balign 32",
                "3:",
                ".long 0, 0",
                ".quad 4f, (5f - 4f), 6f",
                ".popsection",
                "mov {off}, qword ptr [{this} + {offset}]",
                "mov {base}, qword ptr [{this} + {first}]",
                "2:",
                "lea {idx}, [rip + 3b]",
                "mov qword ptr fs:[{off} + 8], {idx}",
                "4:",
                "mov {idx:e}, dword ptr fs:[{off} + 4]",
                // A thread without a registration (`cpu_id` -1 or -2) cannot be here (`new`
                // checked); trap rather than index past the slots.
                "cmp {idx:e}, {slots}",
                "jae 7f",
                "shl {idx}, 7",
                "cmp dword ptr [{base} + {idx}], 0",
                "jne {busy}",
                "mov dword ptr [{base} + {idx}], 1",
                "5:",
                "inc qword ptr [{base} + {idx} + 8]",
                "mov dword ptr [{base} + {idx}], 0",
                ".pushsection __rseq_failure, \"ax\"",
                "7:",
                "ud2",
                ".byte 0x0f, 0xb9, 0x3d",
                ".long 0x53053053",
                "6:",
                "jmp 2b",
                ".popsection",
                this = in(reg) self,
                offset = const std::mem::offset_of!(Floor, offset),
                first = const std::mem::offset_of!(Floor, base),
                off = out(reg) _,
                base = out(reg) _,
                idx = out(reg) _,
                slots = const SLOTS,
                // Another thread of this CPU holds the word (none does in the benches).
                busy = label { return self.contended() },
                options(nostack),
            );
        }
    }

    /// [`increment`](Self::increment) when the word was held: let its holder run, then try
    /// again. Out of line, so that the fast path keeps no register for it.
    #[cold]
    #[inline(never)]
    fn contended(&self) {
        std::thread::yield_now();
        self.increment();
    }

    /// The sum of every CPU's counter.
    pub(crate) fn total(&self) -> u64 {
        self.slots
            .iter()
            // SAFETY: the floor is used by this thread only, which holds no word now.
            .map(|slot| unsafe { *slot.n.get() })
            .sum()
    }
}
