//! What the kernel can do to the rseq and fenced locks that a correct program does not ask for:
//! a thread with no rseq registration (it unregistered, or registration failed), and a
//! `membarrier` that fails. Both used to break exclusion silently (issue 21):
//!
//! - a thread whose `cpu_id` reads -1 (`RSEQ_CPU_ID_UNINITIALIZED`) matched the "no CPU"
//!   sentinel of a lock made by `new()` and committed `HELD` with a plain store that no abort
//!   protects; two such threads lost increments;
//! - a failed CPU fence was replaced by a local fence and the lock claimed anyway.
//!
//! The membarrier failure is real, not simulated: the requester's thread installs a seccomp
//! filter that makes `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, ..)` return `ENOMEM`
//! for that thread only (a filter cannot be removed, so each test that needs one runs it in a
//! thread of its own that ends with the test).

#![cfg(not(loom))]

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread;

use qpw_core::{FencedLock, LocalAttempt, LocalLockKind, RawLocalLock, RseqLock};

/// `RSEQ_SIG` as glibc registers it on x86-64.
const RSEQ_SIG: u32 = 0x5305_3053;
/// `RSEQ_FLAG_UNREGISTER`.
const RSEQ_FLAG_UNREGISTER: libc::c_int = 1;

/// Unregisters glibc's rseq area of the calling thread, as a program may (or as a thread whose
/// registration failed finds itself): the kernel then leaves `cpu_id` at -1. `Err` says why it
/// could not (no registration to undo).
fn unregister_rseq() -> Result<(), String> {
    // SAFETY: `dlsym` with `RTLD_DEFAULT` and NUL-terminated names has no preconditions.
    let (offset, size) = unsafe {
        (
            libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()),
            libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()),
        )
    };
    if offset.is_null() || size.is_null() {
        return Err("glibc exports no __rseq_offset (glibc < 2.35)".into());
    }
    // SAFETY: glibc's `const ptrdiff_t __rseq_offset` and `const unsigned int __rseq_size`.
    let (offset, size) = unsafe { (*(offset as *const isize), *(size as *const u32)) };
    if size == 0 {
        return Err("glibc registered no rseq area".into());
    }
    let tp: usize;
    // SAFETY: on x86-64 Linux `fs:0` holds the thread pointer (the TCB's self pointer).
    unsafe { std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly)) };
    let area = tp.wrapping_add_signed(offset);
    // glibc registers a 32-byte area (2.35-2.39) or a larger one (the kernel's feature size,
    // rounded up); the kernel insists on the length it was given, so try the likely ones.
    for len in [32u32, size, 64, 128, 256] {
        // SAFETY: `rseq(area, len, RSEQ_FLAG_UNREGISTER, sig)` only compares its arguments
        // with the thread's registration and, if they match, forgets it; it writes `cpu_id`
        // of the area, which glibc keeps for the thread's whole life.
        let rc =
            unsafe { libc::syscall(libc::SYS_rseq, area, len, RSEQ_FLAG_UNREGISTER, RSEQ_SIG) };
        if rc == 0 {
            return Ok(());
        }
    }
    Err(format!(
        "rseq(UNREGISTER) refused every length tried: {}",
        std::io::Error::last_os_error()
    ))
}

/// A counter behind a lock, incremented without atomics: lost increments show a broken lock.
struct Guarded<L> {
    lock: L,
    value: UnsafeCell<u64>,
}

// SAFETY: `value` is touched only between `lock` and `unlock` of `lock`.
unsafe impl<L: Sync> Sync for Guarded<L> {}

impl<L: RawLocalLock> Guarded<L> {
    fn add(&self, n: u64) {
        for _ in 0..n {
            self.lock.lock();
            // SAFETY: the lock is held.
            unsafe { *self.value.get() += 1 };
            // SAFETY: taken just above.
            unsafe { self.lock.unlock() };
        }
    }
}

/// A thread with no rseq registration reads `cpu_id` -1: no lock may take that for its CPU.
/// Two such threads on a lock of no CPU (`new()`) must not lose increments.
#[test]
fn a_thread_without_rseq_never_commits_a_restartable_sequence() {
    if RseqLock::kind() != LocalLockKind::Rseq {
        eprintln!(
            "skipped: the rseq lock falls back here ({})",
            qpw_core::rseq::status()
        );
        return;
    }
    two_unregistered_threads::<RseqLock>("RseqLock::new");
    two_unregistered_threads::<FencedLock>("FencedLock::new");
}

/// Two threads without rseq, one per CPU where there are two, add to a counter behind
/// `L::new()`; each first checks that the owner's path does not take the lock.
fn two_unregistered_threads<L: RawLocalLock + 'static>(name: &'static str) {
    const ADDS: u64 = if cfg!(debug_assertions) {
        200_000
    } else {
        1_000_000
    };
    let shared = Arc::new(Guarded {
        lock: L::new(),
        value: UnsafeCell::new(0),
    });
    let allowed = qpw_core::allowed_cpus().unwrap();
    let threads: Vec<_> = (0..2)
        .map(|i| {
            let shared = shared.clone();
            let cpu = allowed.iter().nth(i % allowed.len()).unwrap();
            thread::spawn(move || {
                qpw_core::pin_current_thread(cpu).unwrap();
                unregister_rseq()?;
                assert_eq!(
                    qpw_core::rseq::current_cpu(),
                    None,
                    "an unregistered thread reads no CPU"
                );
                // The owner's path of a lock of no CPU: the thread does not run on it.
                let attempt = shared.lock.lock_on_current_cpu();
                if attempt == LocalAttempt::Locked {
                    // SAFETY: taken just above (release it so that the failure below is
                    // reported, not a hang of the other thread).
                    unsafe { shared.lock.unlock() };
                }
                assert_eq!(
                    attempt,
                    LocalAttempt::Elsewhere,
                    "{name}: a thread with cpu_id -1 took the lock by restartable sequence"
                );
                shared.add(ADDS);
                Ok::<(), String>(())
            })
        })
        .collect();
    for t in threads {
        if let Err(why) = t.join().unwrap() {
            eprintln!("skipped: {why}");
            return;
        }
    }
    // SAFETY: both threads are joined.
    let total = unsafe { *shared.value.get() };
    assert_eq!(total, 2 * ADDS, "{name}: increments lost or doubled");
}

/// Installs, for the calling thread only, a seccomp filter under which
/// `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, ..)` fails with `ENOMEM` (the error the
/// kernel returns when it cannot allocate its CPU mask); every other call is allowed.
fn fail_rseq_fences_in_this_thread() {
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ: u32 = 1 << 7;
    // struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; }
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    const ARG0_LOW: u32 = 16;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ret = libc::BPF_RET | libc::BPF_K;
    let mut program = [
        stmt(load, ARCH),
        jump(AUDIT_ARCH_X86_64, 0, 5),
        stmt(load, NR),
        jump(libc::SYS_membarrier as u32, 0, 3),
        stmt(load, ARG0_LOW),
        jump(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, 0, 1),
        stmt(ret, libc::SECCOMP_RET_ERRNO | libc::ENOMEM as u32),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only; PR_SET_SECCOMP reads `prog`,
    // which points at `program`, both alive across the call. Without TSYNC the filter applies
    // to the calling thread alone.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            ),
            0,
            "seccomp filter: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// The text of a caught panic.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// A requester whose CPU fence fails must not claim the lock: it refuses with a message that
/// names membarrier and the CPU, and leaves the lock free for its owner.
#[test]
fn a_failed_fence_refuses_the_lock_and_says_why() {
    if FencedLock::kind() != LocalLockKind::Rseq {
        eprintln!(
            "skipped: the fenced lock falls back here ({})",
            qpw_core::rseq::status()
        );
        return;
    }
    let allowed = qpw_core::allowed_cpus().unwrap();
    let (Some(owner_cpu), Some(requester_cpu)) = (allowed.iter().next(), allowed.iter().nth(1))
    else {
        eprintln!("skipped: needs two CPUs");
        return;
    };
    // Make sure the process is registered for the fences before the filter (registration
    // is another command and stays allowed anyway).
    let _ = qpw_core::rseq::status();
    let lock = Arc::new(FencedLock::for_cpu(owner_cpu));
    let requester = {
        let lock = lock.clone();
        thread::spawn(move || {
            qpw_core::pin_current_thread(requester_cpu).unwrap();
            fail_rseq_fences_in_this_thread();
            let outcomes: Vec<Result<bool, String>> = [true, false]
                .into_iter()
                .map(|blocking| {
                    catch_unwind(AssertUnwindSafe(|| {
                        if blocking {
                            lock.lock();
                            true
                        } else {
                            lock.try_lock()
                        }
                    }))
                    .map_err(|p| panic_text(&*p))
                })
                .collect();
            outcomes
        })
    };
    let outcomes = requester.join().unwrap();
    for (call, outcome) in ["lock", "try_lock"].iter().zip(outcomes) {
        match outcome {
            Ok(true) => panic!("{call}: the lock was claimed although the CPU fence failed"),
            Ok(false) => panic!("{call}: refused without saying why"),
            Err(message) => assert!(
                message.contains("membarrier")
                    && message.contains(&format!("cpu {owner_cpu}"))
                    && message.contains("Cannot allocate memory"),
                "{call}: the refusal does not name the failed fence, its CPU and the error: \
                 {message}"
            ),
        }
    }
    // Nothing was left held: the owner takes its lock at once.
    qpw_core::pin_current_thread(owner_cpu).unwrap();
    assert!(lock.try_lock(), "the refused requester left the lock held");
    // SAFETY: taken just above.
    unsafe { lock.unlock() };
}
