//! The current CPU from the kernel's restartable-sequences area, and the fences that let another
//! CPU reach state its owner updates with plain stores.
//!
//! # The problem
//!
//! A thread the framework has not bound must find out where it runs before it can take "its"
//! CPU's lock. `sched_getcpu` answers through a library call (a few nanoseconds); the kernel
//! already keeps the answer in memory the thread can read directly. Since glibc 2.35 every
//! thread registers a `struct rseq` with the kernel at start-up (the `rseq(2)` system call of
//! Linux 4.18), and the kernel rewrites its `cpu_id` field (a `u32` at offset 4) every time the
//! thread returns to user space on a different CPU. glibc exports where the area is: the
//! thread pointer plus `__rseq_offset` (a `ptrdiff_t`), valid when `__rseq_size` (an
//! `unsigned int`) is non-zero. Reading `cpu_id` is then one load relative to the thread
//! pointer (`fs:0` on x86-64, `tpidr_el0` on aarch64), which is what librseq's
//! `rseq_current_cpu_raw` does.
//!
//! # Finding glibc's registration at run time
//!
//! The two symbols are looked up once with `dlsym(RTLD_DEFAULT, ..)` rather than declared as
//! `extern "C"` statics: a hard reference would stop the binary from loading on a glibc older
//! than 2.35, and stable Rust has no weak linkage. The lookup is cached in one static word,
//! so the hot path is: load the cached offset, add the thread pointer, load `cpu_id`. Each
//! answer is checked: `cpu_id` stays `RSEQ_CPU_ID_UNINITIALIZED` (-1) or becomes
//! `RSEQ_CPU_ID_REGISTRATION_FAILED` (-2) in a thread whose registration did not happen
//! (under valgrind, or on a kernel without rseq), and `__rseq_size` is 0 when glibc was told
//! not to register (`GLIBC_TUNABLES=glibc.pthread.rseq=0`). In each of those cases
//! [`current_cpu`] returns `None` and the framework falls back to `sched_getcpu`; [`status`]
//! says which is in use and why.
//!
//! # Fences for other CPUs
//!
//! [`RseqLock`](crate::RseqLock) commits with a plain store that only its own CPU may make;
//! a thread elsewhere that must take such a word first *fences* that CPU with
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, MEMBARRIER_CMD_FLAG_CPU, cpu)` (Linux
//! 5.10): when the call returns, every restartable sequence that was running on `cpu` has been
//! aborted, and every one that starts later sees the caller's earlier stores. tcmalloc's
//! per-CPU caches use the same call for their `FenceCpu`. The process must register for it
//! once (`MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ`), done here on first use; the rseq
//! lock is offered only when that registration succeeded.
//!
//! Under `cfg(loom)` there is no kernel: [`current_cpu`] reports a CPU the model sets with
//! `mock::migrate_to`, and the fences are modelled by the lock itself.

#[cfg(not(loom))]
use std::sync::atomic::{AtomicIsize, AtomicU8, Ordering};

/// Byte offset of `cpu_id` in `struct rseq` (after `cpu_id_start`).
#[cfg(not(loom))]
pub(crate) const CPU_ID_OFFSET: usize = 4;
/// Byte offset of `rseq_cs` in `struct rseq`.
#[cfg(not(loom))]
#[allow(dead_code)]
pub(crate) const CS_OFFSET: usize = 8;
/// The fields we use end at byte 20 (`cpu_id_start`, `cpu_id`, `rseq_cs`, `flags`): a
/// registration smaller than that is not one we can use.
#[cfg(not(loom))]
const MIN_RSEQ_SIZE: u32 = 20;

/// The cached `__rseq_offset` has not been looked up yet.
#[cfg(not(loom))]
const OFFSET_UNKNOWN: isize = isize::MIN;
/// glibc registers no usable area (old glibc, `__rseq_size` 0, or an architecture we have no
/// thread-pointer read for).
#[cfg(not(loom))]
const OFFSET_NONE: isize = isize::MIN + 1;

#[cfg(not(loom))]
static OFFSET: AtomicIsize = AtomicIsize::new(OFFSET_UNKNOWN);

/// The calling thread's thread pointer.
#[cfg(all(not(loom), target_arch = "x86_64"))]
#[inline(always)]
fn thread_pointer() -> Option<*const u8> {
    let tp: *const u8;
    // SAFETY: on x86-64 Linux the `fs` segment base is the thread pointer, and its first word
    // holds the thread pointer itself (the TCB's self pointer, required by the x86-64 TLS ABI).
    // The load reads thread-local memory that lives as long as the thread; it touches no stack
    // and no flags.
    unsafe {
        std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags, pure));
    }
    Some(tp)
}

/// The calling thread's thread pointer.
#[cfg(all(not(loom), target_arch = "aarch64"))]
#[inline(always)]
fn thread_pointer() -> Option<*const u8> {
    let tp: *const u8;
    // SAFETY: `tpidr_el0` is the user-readable thread-pointer register, which glibc sets to the
    // thread's TCB; reading it has no side effects.
    unsafe {
        std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nostack, nomem, preserves_flags, pure));
    }
    Some(tp)
}

/// No thread-pointer read for this architecture: rseq is never used.
#[cfg(all(not(loom), not(any(target_arch = "x86_64", target_arch = "aarch64"))))]
#[inline(always)]
fn thread_pointer() -> Option<*const u8> {
    None
}

/// The calling thread's `struct rseq`, if glibc registered one for the process. (Whether it
/// registered one *for this thread* is told by its `cpu_id`.)
#[cfg(not(loom))]
#[inline(always)]
pub(crate) fn area() -> Option<*const u8> {
    let area = AREA.with(std::cell::Cell::get);
    if area.addr() > NO_AREA {
        return Some(area);
    }
    if area.is_null() {
        return area_slow();
    }
    None
}

#[cfg(not(loom))]
thread_local! {
    /// The calling thread's `struct rseq` once looked up (null before, `NO_AREA` when there is
    /// none): on the hot path one load relative to the thread pointer, where the sum of the
    /// thread pointer and the process-wide offset would be three.
    static AREA: std::cell::Cell<*const u8> = const { std::cell::Cell::new(std::ptr::null()) };
}

/// [`AREA`]'s value when glibc registered no area.
#[cfg(not(loom))]
const NO_AREA: usize = 1;

#[cfg(not(loom))]
#[cold]
fn area_slow() -> Option<*const u8> {
    let mut offset = OFFSET.load(Ordering::Relaxed);
    if offset == OFFSET_UNKNOWN {
        offset = match lookup() {
            Ok((offset, _size)) => offset,
            Err(_) => OFFSET_NONE,
        };
        OFFSET.store(offset, Ordering::Relaxed);
    }
    // `wrapping_offset`: the sum is a thread-local address, not derived from an allocation
    // Rust knows about.
    let area = (offset > OFFSET_NONE)
        .then(thread_pointer)
        .flatten()
        .map(|tp| tp.wrapping_offset(offset));
    AREA.with(|cell| cell.set(area.unwrap_or(std::ptr::without_provenance(NO_AREA))));
    area
}

/// glibc's rseq registration for the process: `__rseq_offset` and `__rseq_size`, or why there
/// is none (looked up again at each call: for decisions made once).
#[cfg(not(loom))]
pub(crate) fn registration() -> Result<(isize, u32), String> {
    lookup()
}

/// The calling thread's `struct rseq` as the owner's fast path holds it: never null, always
/// writable by the thread, so that the path runs its sequence with no check of its own.
/// Glibc's registered area, or where there is none a stand-in of the thread's ([`owner_area`]).
/// Valid on the thread that got it, for as long as the thread lives; the handles that keep one
/// (a [`Binding`](crate::Binding)'s registration, a [`BoundSlot`](crate::BoundSlot), a guard)
/// are `!Send`, so it is only ever used there.
#[cfg(not(loom))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Area(std::ptr::NonNull<u8>);

/// Under loom there is no area: the sequences are mocked (`rseq_lock/loom_mock.rs`).
#[cfg(loom)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Area;

#[cfg(not(loom))]
impl Area {
    /// The area [`area`] returned.
    #[inline(always)]
    pub(crate) fn registered(area: *const u8) -> Area {
        debug_assert!(area.addr() > NO_AREA);
        // SAFETY: `area` returns only addresses above `NO_AREA`, so not null.
        Area(unsafe { std::ptr::NonNull::new_unchecked(area.cast_mut()) })
    }

    /// The area whose address [`as_ptr`](Self::as_ptr) gave.
    ///
    /// # Safety
    ///
    /// `ptr` came from `as_ptr` of an `Area` of the calling thread.
    #[inline(always)]
    pub(crate) unsafe fn from_ptr(ptr: *const u8) -> Area {
        // SAFETY: an `Area`'s address is never null (the caller's premise). Said to the
        // compiler too, so that an `Option<Area>` made from it is known to be `Some`.
        unsafe {
            std::hint::assert_unchecked(!ptr.is_null());
            Area(std::ptr::NonNull::new_unchecked(ptr.cast_mut()))
        }
    }

    /// The area's address.
    #[inline(always)]
    pub(crate) fn as_ptr(self) -> *const u8 {
        self.0.as_ptr()
    }
}

#[cfg(loom)]
impl Area {
    /// As on std.
    pub(crate) unsafe fn from_ptr(_ptr: *const u8) -> Area {
        Area
    }

    /// As on std: nothing to point to.
    pub(crate) fn as_ptr(self) -> *const u8 {
        std::ptr::null()
    }
}

/// A `struct rseq` that the kernel never sees: the calling thread's stand-in when glibc
/// registered no area for the process. Its `cpu_id` is -1 (`RSEQ_CPU_ID_UNINITIALIZED`), which
/// no lock's CPU equals (`rseq_lock`'s `NO_CPU`), so that a sequence run with it always leaves
/// at its CPU check, before any store but the arming of `rseq_cs`, which only this thread
/// reads (nobody, in fact).
#[cfg(not(loom))]
#[repr(C, align(32))]
struct StandIn {
    cpu_id_start: u32,
    cpu_id: u32,
    /// Written by the sequences (the `rseq_cs` they arm).
    rseq_cs: std::cell::UnsafeCell<u64>,
    flags: u32,
}

#[cfg(not(loom))]
thread_local! {
    static STAND_IN: StandIn = const {
        StandIn {
            cpu_id_start: 0,
            cpu_id: u32::MAX,
            rseq_cs: std::cell::UnsafeCell::new(0),
            flags: 0,
        }
    };
}

/// The calling thread's [`Area`]: its registered `struct rseq`, else its stand-in. Looked up
/// when a thread is bound, when a [`BoundSlot`](crate::BoundSlot) is made and on an unbound
/// thread's `lock_local`, never on the bound owner's path.
#[cfg(not(loom))]
#[inline]
pub(crate) fn owner_area() -> Area {
    match area() {
        Some(area) => Area::registered(area),
        // The stand-in lives in this thread's static TLS block, a `const` initialiser with no
        // destructor: as long as the thread, which is as long as any handle can use it.
        None => Area(STAND_IN.with(|s| std::ptr::NonNull::from(s).cast::<u8>())),
    }
}

/// Under loom: nothing to look up.
#[cfg(loom)]
pub(crate) fn owner_area() -> Area {
    Area
}

/// Looks up glibc's `__rseq_offset` and `__rseq_size`: the offset, or why there is none.
#[cfg(not(loom))]
fn lookup() -> Result<(isize, u32), String> {
    thread_pointer().ok_or_else(|| {
        format!(
            "no thread-pointer read for {} (x86_64 and aarch64 only)",
            std::env::consts::ARCH
        )
    })?;
    // SAFETY: `dlsym` with `RTLD_DEFAULT` and a NUL-terminated name has no preconditions; it
    // returns null when no loaded object defines the symbol.
    let offset = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()) };
    // SAFETY: as above.
    let size = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()) };
    if offset.is_null() || size.is_null() {
        return Err("glibc exports no __rseq_offset/__rseq_size (glibc < 2.35)".to_string());
    }
    // SAFETY: glibc defines `__rseq_size` as a `const unsigned int` and `__rseq_offset` as a
    // `const ptrdiff_t`, both set before any user code runs and never written again; the
    // pointers `dlsym` returned are their addresses, suitably aligned.
    let (offset, size) = unsafe { (*(offset as *const isize), *(size as *const u32)) };
    if size == 0 {
        return Err(
            "glibc did not register rseq (__rseq_size is 0: GLIBC_TUNABLES=glibc.pthread.rseq=0, \
             or a kernel without rseq)"
                .to_string(),
        );
    }
    if size < MIN_RSEQ_SIZE {
        return Err(format!(
            "__rseq_size is {size}, smaller than the {MIN_RSEQ_SIZE} bytes we read"
        ));
    }
    Ok((offset, size))
}

/// The CPU the calling thread runs on, read from its rseq area: `None` when glibc registered
/// no area for it (see the [module docs](self)). Like `sched_getcpu`, the answer may be stale
/// the moment it is returned unless the thread is pinned.
///
/// ```
/// if let Some(cpu) = qpw_core::rseq::current_cpu() {
///     assert!(qpw_core::allowed_cpus()?.contains(cpu));
/// }
/// # Ok::<(), qpw_core::Error>(())
/// ```
#[inline]
pub fn current_cpu() -> Option<usize> {
    #[cfg(not(loom))]
    {
        let area = area()?;
        // SAFETY: (1) `area` is the calling thread's registered `struct rseq` (glibc's
        // `__rseq_offset` from the thread pointer), which lives as long as the thread and is
        // at least `MIN_RSEQ_SIZE` bytes, so `cpu_id` at offset 4 is in bounds and 4-aligned
        // (the struct is 32-aligned); (2) the kernel writes it only while this thread is not
        // running user code, so a volatile load sees a whole value, never a torn one.
        let cpu = unsafe { std::ptr::read_volatile(area.add(CPU_ID_OFFSET) as *const u32) };
        // -1 (uninitialised) and -2 (registration failed) are the only negative values.
        if (cpu as i32) < 0 {
            None
        } else {
            Some(cpu as usize)
        }
    }
    #[cfg(loom)]
    {
        mock::current()
    }
}

/// Whether the calling thread can read its CPU from the rseq area (see [`current_cpu`]).
#[inline]
pub fn available() -> bool {
    current_cpu().is_some()
}

/// The current CPU: the rseq read where available, else `sched_getcpu`.
#[inline]
pub(crate) fn cpu_now() -> Option<usize> {
    #[cfg(not(loom))]
    {
        current_cpu().or_else(crate::affinity::current_cpu)
    }
    #[cfg(loom)]
    {
        None
    }
}

/// One line saying how the calling thread finds its CPU, and which local lock
/// [`RseqLock`](crate::RseqLock) uses in this process, with the reason when it falls back.
///
/// ```
/// let status = qpw_core::rseq::status();
/// assert!(status.starts_with("cpu: "));
/// ```
pub fn status() -> String {
    let cpu = if available() {
        "cpu: rseq cpu_id (glibc's registration)".to_string()
    } else {
        format!("cpu: sched_getcpu (fallback: {})", cpu_fallback_reason())
    };
    let lock = match lock_unavailable_reason() {
        None => "rseq lock: rseq critical sections (membarrier registered)".to_string(),
        Some(why) => format!("rseq lock: fallback to the atomic FairLock ({why})"),
    };
    format!("{cpu}; {lock}")
}

/// Why [`RseqLock`](crate::RseqLock) falls back to the atomic lock in this process, or `None`
/// when it uses restartable sequences. Decided once, on first use, and never changed, so every
/// lock of the process uses the same protocol.
pub(crate) fn lock_unavailable_reason() -> Option<&'static str> {
    #[cfg(not(loom))]
    {
        static REASON: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        REASON
            .get_or_init(|| {
                if !cfg!(target_arch = "x86_64") {
                    return Some(format!(
                        "no rseq critical-section assembly for {}",
                        std::env::consts::ARCH
                    ));
                }
                if let Err(why) = lookup() {
                    return Some(why);
                }
                membarrier_registered().err()
            })
            .as_deref()
    }
    #[cfg(loom)]
    {
        None
    }
}

/// Whether [`RseqLock`](crate::RseqLock) uses restartable sequences in this process (`false`:
/// it falls back to the atomic [`FairLock`](crate::FairLock) protocol; [`status`] says why).
#[inline]
pub fn lock_available() -> bool {
    #[cfg(not(loom))]
    {
        // The decision, cached in one byte for the lock's hot path: 0 unknown, 1 yes, 2 no.
        static CACHED: AtomicU8 = AtomicU8::new(0);
        match CACHED.load(Ordering::Relaxed) {
            1 => true,
            2 => false,
            _ => {
                let yes = lock_unavailable_reason().is_none();
                CACHED.store(if yes { 1 } else { 2 }, Ordering::Relaxed);
                yes
            }
        }
    }
    #[cfg(loom)]
    {
        true
    }
}

fn cpu_fallback_reason() -> String {
    #[cfg(not(loom))]
    {
        match lookup() {
            Err(why) => why,
            Ok(_) => "this thread's rseq registration failed (cpu_id is negative)".to_string(),
        }
    }
    #[cfg(loom)]
    {
        "loom model".to_string()
    }
}

/// `membarrier(2)` commands (`include/uapi/linux/membarrier.h`).
#[cfg(not(loom))]
mod cmd {
    pub(super) const PRIVATE_EXPEDITED_RSEQ: libc::c_int = 1 << 7;
    pub(super) const REGISTER_PRIVATE_EXPEDITED_RSEQ: libc::c_int = 1 << 8;
    pub(super) const FLAG_CPU: libc::c_uint = 1 << 0;
}

#[cfg(not(loom))]
fn membarrier(cmd: libc::c_int, flags: libc::c_uint, cpu: libc::c_int) -> std::io::Result<()> {
    // SAFETY: `membarrier` takes three integers and touches no memory of ours; an unknown
    // command or an unregistered one fails with an error code.
    let rc = unsafe { libc::syscall(libc::SYS_membarrier, cmd, flags, cpu) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Registers the process for the expedited membarrier commands the rseq lock needs, once;
/// `Err` says why they are unavailable.
#[cfg(not(loom))]
pub(crate) fn membarrier_registered() -> Result<(), String> {
    const UNKNOWN: u8 = 0;
    const OK: u8 = 1;
    const FAILED: u8 = 2;
    static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
    match STATE.load(Ordering::Acquire) {
        OK => return Ok(()),
        FAILED => {}
        _ => {
            let ok = membarrier(cmd::REGISTER_PRIVATE_EXPEDITED_RSEQ, 0, 0).is_ok();
            STATE.store(if ok { OK } else { FAILED }, Ordering::Release);
            if ok {
                return Ok(());
            }
        }
    }
    let err = membarrier(cmd::REGISTER_PRIVATE_EXPEDITED_RSEQ, 0, 0)
        .err()
        .map_or_else(|| "unknown error".to_string(), |e| e.to_string());
    Err(format!(
        "membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ) failed: {err}"
    ))
}

/// Aborts every restartable sequence running on `cpu` now, and orders the caller's earlier
/// stores before every sequence that starts there later (tcmalloc's `FenceCpu`).
#[cfg(not(loom))]
pub(crate) fn fence_cpu(cpu: usize) -> std::io::Result<()> {
    let cpu =
        libc::c_int::try_from(cpu).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    membarrier(cmd::PRIVATE_EXPEDITED_RSEQ, cmd::FLAG_CPU, cpu)
}

/// The kernel's part under loom: the CPU each model thread runs on, and switches that break
/// one step of the fenced path on purpose, so that the models can show they catch its loss.
#[cfg(loom)]
pub mod mock {
    use std::cell::Cell;

    use crate::sync::thread_local;

    thread_local! {
        #[allow(clippy::missing_const_for_thread_local)]
        static CPU: Cell<Option<usize>> = Cell::new(None);
    }

    /// One step of the fenced acquisition left out, for a model that must then fail (see
    /// [`with_mutation`]).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Mutation {
        /// The protocol as written.
        None,
        /// The requester raises its flag (`CAS` to `FENCED`) but does not fence the lock's
        /// CPU: a sequence there that loaded `FREE` before the flag can still commit.
        SkipFence,
        /// The requester fences but does not look at the word again: it claims a lock that a
        /// sequence committed over its flag before the fence.
        SkipCheck,
        /// Any thread that finds a flag in the word answers (reads the call and publishes it),
        /// not only a sequence of the lock's CPU: an answer then proves nothing about the
        /// sequences in flight there.
        AckFromAnyThread,
        /// A requester takes any answer for one to its own call, without comparing the two: an
        /// answer to an earlier call settles a flag no sequence has seen.
        AckWithoutEpoch,
        /// Requesters do not take the side mutex: two of them can raise flags of one epoch,
        /// and one can take the other's flag for its own (ABA on the word).
        NoSideMutex,
        /// A waiter sleeps on an owner's hold without first fencing the lock's CPU: a release
        /// sequence there that loaded the waiter count before the waiter registered commits
        /// `FREE` and wakes nobody.
        SkipWaiterFence,
        /// The answer compared with the call as the 32-bit counters once were, across their
        /// wrap (`answer - call` as an `i32`, on the low 32 bits): an answer left 2^31 or more
        /// calls behind reads as newer than the call (issue 44).
        WrappingCompare32,
        /// A call at the counter's end ([`u64::MAX`], where it stops) taken as answered by
        /// an answer there, which may be as old as the first call to reach the end.
        AnswerAtTheCountersEnd,
        /// The answer stored as read, over whatever is there: a thread preempted between its
        /// read of the call and its store puts an older answer over a newer one.
        AnswerMayGoBack,
        /// A [`PerCid`](crate::PerCid) slot made on first use is published with a plain store,
        /// not a compare-and-swap: two threads that make one id's slot at once each store
        /// theirs, and what was added to the one overwritten is lost.
        SlotStoredBlindly,
    }

    /// What the model's check of the answer cell says when an answer moves backwards.
    pub const ANSWER_WENT_BACK: &str = "the CPU's answer moved backwards";

    /// Every store to a CPU's answer cell, seen by the models: the cell held `before` and now
    /// holds `after`. Panics, with [`ANSWER_WENT_BACK`], when `after < before`.
    pub(crate) fn saw_answers(before: u64, after: u64) {
        assert!(after >= before, "{ANSWER_WENT_BACK}: {before} then {after}");
    }

    std::thread_local! {
        // Where the calling test's models start every mock CPU's call and answer counters (a
        // std thread-local, as `MUTATION` is).
        static COUNTERS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    }

    /// Runs `f` (a whole `loom::model`) with every mock CPU's call counter starting at `call`
    /// and its answer at `answer`, as if that many calls had been made and that one last
    /// answered; then starts them at 0 again, also when `f` panics.
    pub fn with_counters_at<R>(call: u64, answer: u64, f: impl FnOnce() -> R) -> R {
        struct Restore;
        impl Drop for Restore {
            fn drop(&mut self) {
                COUNTERS.with(|c| c.set((0, 0)));
            }
        }
        COUNTERS.with(|c| c.set((call, answer)));
        let _restore = Restore;
        f()
    }

    /// Where mock CPUs' counters start (see [`with_counters_at`]).
    pub(crate) fn counters_at() -> (u64, u64) {
        COUNTERS.with(Cell::get)
    }

    /// A point on the answer's path where a model can migrate the answering thread
    /// ([`migrate_at`]).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum AnswerPoint {
        /// After a poll saw a call, before the sequence that reads it.
        BeforeTheSequence,
        /// Inside the sequence, after its CPU check and before its load of the call.
        InTheSequence,
        /// After the sequence read the call, before the thread publishes it.
        BeforeThePublish,
    }

    thread_local! {
        #[allow(clippy::missing_const_for_thread_local)]
        static MIGRATE_AT: Cell<Option<(AnswerPoint, usize)>> = Cell::new(None);
    }

    /// Makes the calling model thread migrate to `cpu` when its next answer reaches `point`:
    /// a migration in the middle of an answer, which [`migrate_to`] between operations cannot
    /// place.
    pub fn migrate_at(point: AnswerPoint, cpu: usize) {
        MIGRATE_AT.with(|m| m.set(Some((point, cpu))));
    }

    /// The answer's path has reached `point`: migrate there if [`migrate_at`] asked for it.
    pub(crate) fn answer_point(point: AnswerPoint) {
        if let Some((at, cpu)) = MIGRATE_AT.with(Cell::get) {
            if at == point {
                MIGRATE_AT.with(|m| m.set(None));
                migrate_to(Some(cpu));
            }
        }
    }

    std::thread_local! {
        // A std thread-local, not loom's: it is set on the test's own thread around
        // `loom::model`, whose model threads all run on that OS thread (as coroutines), so
        // every modelled thread of that test sees it and no other test does. It is no part
        // of the modelled state.
        static MUTATION: Cell<Mutation> = const { Cell::new(Mutation::None) };
    }

    /// Runs `f` (a whole `loom::model`) with the requester's fenced path broken as `mutation`
    /// says, then restores the protocol, also when `f` panics (as a model that catches the
    /// mutation does).
    pub fn with_mutation<R>(mutation: Mutation, f: impl FnOnce() -> R) -> R {
        struct Restore;
        impl Drop for Restore {
            fn drop(&mut self) {
                MUTATION.with(|m| m.set(Mutation::None));
            }
        }
        MUTATION.with(|m| m.set(mutation));
        let _restore = Restore;
        f()
    }

    std::thread_local! {
        // Whether requesters wait for answers ([`crate::fenced_lock::set_acks`]), per test
        // thread as `MUTATION` is.
        static ACKS: Cell<bool> = const { Cell::new(true) };
    }

    /// `fenced_lock::set_acks` under loom: for the calling test's models.
    pub(crate) fn set_acks(on: bool) {
        ACKS.with(|a| a.set(on));
    }

    /// `fenced_lock::acks` under loom.
    pub(crate) fn acks() -> bool {
        ACKS.with(Cell::get)
    }

    /// Runs `f` (a whole `loom::model`) with requesters that never wait for an owner's answer
    /// (they always fence), then turns answers back on, also when `f` panics.
    pub fn with_acks_off<R>(f: impl FnOnce() -> R) -> R {
        struct Restore;
        impl Drop for Restore {
            fn drop(&mut self) {
                ACKS.with(|a| a.set(true));
            }
        }
        ACKS.with(|a| a.set(false));
        let _restore = Restore;
        f()
    }

    /// The mutation in force for the calling test (`Mutation::None` outside [`with_mutation`]).
    pub(crate) fn mutation() -> Mutation {
        MUTATION.with(Cell::get)
    }

    /// Moves the calling model thread to `cpu` (a migration: what the next restartable
    /// sequence checks against). A sequence of the thread's in flight is aborted, as the
    /// kernel aborts one whose thread is migrated.
    pub fn migrate_to(cpu: Option<usize>) {
        crate::rseq_lock::mock_migrated();
        CPU.with(|c| c.set(cpu));
    }

    /// The CPU the calling model thread was last placed on.
    pub fn current() -> Option<usize> {
        CPU.with(Cell::get)
    }

    thread_local! {
        #[allow(clippy::missing_const_for_thread_local)]
        static CID: Cell<Option<usize>> = Cell::new(None);
    }

    /// Gives the calling model thread concurrency id `cid` (what `cid::current` reads): the
    /// kernel changes a thread's id when it is descheduled, and gives a freed one to another.
    pub fn set_cid(cid: Option<usize>) {
        CID.with(|c| c.set(cid));
    }

    /// The calling model thread's concurrency id ([`set_cid`]).
    pub fn cid() -> Option<usize> {
        CID.with(Cell::get)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn rseq_cpu_agrees_with_sched_getcpu_when_pinned() {
        let allowed = crate::allowed_cpus().unwrap();
        let before = crate::current_affinity().unwrap();
        for cpu in allowed.iter() {
            crate::pin_current_thread(cpu).unwrap();
            if available() {
                assert_eq!(current_cpu(), Some(cpu));
            }
            assert_eq!(cpu_now(), Some(cpu));
        }
        crate::set_current_affinity(&before).unwrap();
        assert!(!status().is_empty());
    }
}
