//! Running a function *on* another CPU at once, by interrupting the thread that runs there: the
//! userspace `smp_call_function_single()`.
//!
//! # The problem
//!
//! Some per-CPU work cannot be done remotely under a lock: it must execute on the CPU itself,
//! because the resource is only reachable from there (resctrl's MBM counters are read with
//! `rdmsr` from a CPU of their L3 domain). The kernel has two ways to get there:
//! `smp_call_on_cpu()` queues the function to a kworker of the CPU and sleeps until the
//! scheduler gets round to it ([`Qpw::work_on_cpu`](crate::Qpw::work_on_cpu) is that), and
//! `smp_call_function_single()` sends an IPI: the CPU is interrupted whatever it runs, runs the
//! function in interrupt context, and the caller spins until it is done (`csd_lock_wait`).
//!
//! # The mechanism
//!
//! Userspace has no IPIs to send, but it has signals, and a signal to a thread that is running
//! on another CPU is delivered by exactly that: the kernel kicks the CPU with a reschedule IPI
//! and the thread enters its handler on its way back to user mode. So a thread that wants to be
//! "the thing running on CPU `c`" (a load thread, a latency-critical task, an idle stand-in)
//! registers itself with [`CallTarget::register`], and [`call_on`] posts a function to its
//! mailbox, sends it [`signal()`] with `tgkill`, and spins until the handler has run it. A
//! call not done within 100 us is waiting for the target to get a CPU (on a small machine,
//! maybe the caller's own): the caller then sleeps on the mailbox's state word (`futex`), and
//! the handler wakes it, which userspace needs and a kernel IPI does not.
//!
//! # Why it is sound
//!
//! A signal handler may only do async-signal-safe things: no locks, no allocation. So the
//! mailboxes are a fixed `static` table of atomics (see
//! [`sync::signal_safe`](crate::sync::signal_safe)), the handler finds its own by its thread id
//! (`gettid`), and the protocol is one state word per mailbox:
//!
//! `IDLE --caller posts (Release)--> POSTED --handler claims (Acquire CAS)--> RUNNING
//! --handler finishes (Release)--> DONE --caller takes the result (Acquire), resets--> IDLE`.
//!
//! A caller that gives up (the target never got the CPU before the timeout) retracts with a CAS
//! `POSTED -> IDLE`; if that fails the handler has already claimed the call and is running it,
//! and the caller keeps waiting, so the argument it lent (a pointer into its own stack) is never
//! used after the caller returns. One caller at a time owns a mailbox (its `caller` flag), and
//! a target unregisters only after taking that flag, so a handler never runs a call for a
//! registration that has gone. Signal numbers and `errno` are preserved; the handler is
//! installed with `SA_RESTART`, so the interrupted thread's system calls resume.
//!
//! The function passed must itself be async-signal-safe: atomics only, no locks, no allocation,
//! no panics. That is why [`call_on`] is `unsafe`.
//!
//! CPU ids are scoped by a *space* (any `u64`; one per framework instance), because logical
//! CPU 3 of one instance is not logical CPU 3 of another.

use std::ffi::c_int;
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use crate::sync::signal_safe::{
    AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

/// How many threads may be registered as call targets at once.
pub const MAX_TARGETS: usize = 512;

const IDLE: u32 = 0;
const POSTED: u32 = 1;
const RUNNING: u32 = 2;
const DONE: u32 = 3;

/// Spins before a thread waiting for a mailbox's `caller` flag starts yielding its CPU.
const SPINS_BEFORE_YIELD: u32 = 1 << 10;

/// How long a caller spins for its call before it sleeps on the mailbox's state word (an IPI
/// caller spins in `csd_lock_wait`; a call that takes longer than this is waiting for the
/// target thread to get a CPU, possibly the caller's own, which spinning would only delay).
const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(100);

/// The longest single sleep of a waiting caller: a bound on any missed wake-up.
const SLEEP_SLICE: Duration = Duration::from_millis(1);

/// A function run on the target: it receives where it runs and the caller's argument.
pub type CallFn = fn(&CallCtx, *const ());

/// Where a cross call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallCtx {
    cpu: usize,
    phys_cpu: Option<usize>,
}

impl CallCtx {
    /// The CPU the target thread registered for (a logical CPU for a logical instance).
    #[inline]
    pub fn cpu(&self) -> usize {
        self.cpu
    }

    /// The physical CPU the handler runs on (`sched_getcpu`), if the system can tell.
    #[inline]
    pub fn phys_cpu(&self) -> Option<usize> {
        self.phys_cpu
    }
}

/// What went wrong with a cross call or a registration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CrossCallError {
    /// No thread is registered for the CPU.
    #[error(
        "no thread is registered as running on cpu {cpu} (space {space}): register one with \
         `CallTarget::register`"
    )]
    NoTarget {
        /// The id space.
        space: u64,
        /// The CPU asked for.
        cpu: usize,
    },

    /// The static mailbox table is full.
    #[error("all {max} cross-call target slots are in use")]
    TooManyTargets {
        /// [`MAX_TARGETS`].
        max: usize,
    },

    /// The target thread did not run the call in time (it never got its CPU); the call was
    /// withdrawn and will not run.
    #[error(
        "the call to cpu {cpu} did not run within {timeout:?}: its target thread did not get \
         the CPU"
    )]
    Timeout {
        /// The CPU called.
        cpu: usize,
        /// The timeout given.
        timeout: Duration,
    },

    /// `tgkill` failed (the target thread has exited).
    #[error("cannot signal thread {tid}, registered for cpu {cpu}: {source}")]
    Signal {
        /// The CPU called.
        cpu: usize,
        /// The target's thread id.
        tid: i32,
        /// The system's answer.
        source: io::Error,
    },

    /// `sigaction` or `pthread_sigmask` failed.
    #[error("cannot install the cross-call handler for signal {signal}: {source}")]
    Install {
        /// The signal number ([`signal()`]).
        signal: i32,
        /// The system's answer.
        source: io::Error,
    },
}

struct Mailbox {
    /// The registered thread's id; 0: free; -1: being registered.
    tid: AtomicI32,
    space: AtomicU64,
    cpu: AtomicUsize,
    /// Held by the one caller using this mailbox (and by the target while it unregisters).
    caller: AtomicBool,
    /// Set while the caller sleeps on `state` (the handler then wakes it).
    sleeper: AtomicBool,
    state: AtomicU32,
    func: AtomicUsize,
    arg: AtomicUsize,
    /// Calls the handler ran.
    calls: AtomicU64,
    /// Signals the handler took for this registration, with or without a call to run.
    signals: AtomicU64,
    /// `sched_getcpu()` in the handler's last call (-1: none yet).
    last_phys: AtomicI32,
}

impl Mailbox {
    const fn new() -> Self {
        Self {
            tid: AtomicI32::new(0),
            space: AtomicU64::new(0),
            cpu: AtomicUsize::new(0),
            caller: AtomicBool::new(false),
            sleeper: AtomicBool::new(false),
            state: AtomicU32::new(IDLE),
            func: AtomicUsize::new(0),
            arg: AtomicUsize::new(0),
            calls: AtomicU64::new(0),
            signals: AtomicU64::new(0),
            last_phys: AtomicI32::new(-1),
        }
    }

    fn lock_caller(&self) {
        let mut spins = 0u32;
        while self
            .caller
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            backoff(&mut spins);
        }
    }

    fn unlock_caller(&self) {
        self.caller.store(false, Ordering::Release);
    }
}

static MAILBOXES: [Mailbox; MAX_TARGETS] = [const { Mailbox::new() }; MAX_TARGETS];

/// 0: not installed; 1: being installed; 2: installed.
static INSTALLED: AtomicU32 = AtomicU32::new(0);

#[inline]
fn backoff(spins: &mut u32) {
    *spins = spins.saturating_add(1);
    if *spins < SPINS_BEFORE_YIELD {
        std::hint::spin_loop();
    } else {
        // The other side may be waiting for this very CPU.
        std::thread::yield_now();
    }
}

/// The signal cross calls are sent with: the second realtime signal glibc leaves to
/// applications (`SIGRTMIN + 1`), so that it never merges with a standard signal.
pub fn signal() -> i32 {
    libc::SIGRTMIN() + 1
}

/// The handler. Async-signal-safe: atomics, `gettid`, `sched_getcpu`, and the posted function,
/// which [`call_on`]'s contract makes async-signal-safe too.
extern "C" fn on_signal(_sig: c_int, _info: *mut libc::siginfo_t, _uctx: *mut libc::c_void) {
    // SAFETY: `__errno_location` returns this thread's errno slot, valid for the thread's life.
    let saved_errno = unsafe { *libc::__errno_location() };
    // SAFETY: `gettid` has no preconditions.
    let tid = unsafe { libc::gettid() };
    for mailbox in &MAILBOXES {
        if mailbox.tid.load(Ordering::Acquire) != tid {
            continue;
        }
        mailbox.signals.fetch_add(1, Ordering::Relaxed);
        // Is a call posted? Claim it, so that the caller can no longer withdraw it.
        if mailbox
            .state
            .compare_exchange(POSTED, RUNNING, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        let func = mailbox.func.load(Ordering::Relaxed);
        let arg = mailbox.arg.load(Ordering::Relaxed);
        // SAFETY: `sched_getcpu` has no preconditions.
        let phys = unsafe { libc::sched_getcpu() };
        mailbox.last_phys.store(phys, Ordering::Relaxed);
        let ctx = CallCtx {
            cpu: mailbox.cpu.load(Ordering::Relaxed),
            phys_cpu: usize::try_from(phys).ok(),
        };
        // SAFETY: `func` was stored by `call_on` from a `CallFn` (fn pointers and `usize` have
        // the same size on every target libc supports), and the POSTED -> RUNNING claim above
        // (Acquire, pairing with the caller's Release) makes that store visible.
        let func: CallFn = unsafe { std::mem::transmute::<usize, CallFn>(func) };
        func(&ctx, arg as *const ());
        mailbox.calls.fetch_add(1, Ordering::Relaxed);
        // SeqCst with the caller's `sleeper` store and `state` load: either it sees DONE
        // before sleeping, or this sees `sleeper` and wakes it.
        mailbox.state.store(DONE, Ordering::SeqCst);
        if mailbox.sleeper.load(Ordering::SeqCst) {
            futex_wake(&mailbox.state);
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved_errno };
}

/// `FUTEX_WAIT` on `word` while it holds `expected`, for at most `timeout`.
/// Async-signal-safe (a bare system call); errors (EAGAIN, EINTR, ETIMEDOUT) all mean
/// "look again", which every caller does.
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned 32-bit atomic (in a static mailbox) and `ts` a valid
    // relative timeout; FUTEX_WAIT only reads them.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &ts as *const libc::timespec,
        )
    };
}

/// `FUTEX_WAKE` of one waiter on `word`. Async-signal-safe.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned 32-bit atomic in a static mailbox; FUTEX_WAKE does
    // not touch memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        )
    };
}

fn install() -> Result<(), CrossCallError> {
    loop {
        match INSTALLED.compare_exchange(0, 1, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => break,
            Err(2) => return Ok(()),
            Err(_) => std::thread::yield_now(),
        }
    }
    let sig = signal();
    // SAFETY: `sigaction` is plain data for which all-zero bytes are a valid (empty) value.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
    action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    // SAFETY: `action.sa_mask` is a valid, writable `sigset_t`.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: `action` is fully initialised and names a handler with the SA_SIGINFO signature;
    // the old action is not asked for.
    let rc = unsafe { libc::sigaction(sig, &action, std::ptr::null_mut()) };
    if rc != 0 {
        INSTALLED.store(0, Ordering::Release);
        return Err(CrossCallError::Install {
            signal: sig,
            source: io::Error::last_os_error(),
        });
    }
    INSTALLED.store(2, Ordering::Release);
    Ok(())
}

fn unblock_for_this_thread() -> Result<(), CrossCallError> {
    let sig = signal();
    // SAFETY: as in `install`.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable `sigset_t`; `sig` is a valid signal number.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
    }
    // SAFETY: `set` is initialised; the old mask is not asked for.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(CrossCallError::Install {
            signal: sig,
            source: io::Error::from_raw_os_error(rc),
        });
    }
    Ok(())
}

/// The calling thread's registration as "the thread running on CPU `cpu`" of an id space:
/// [`call_on`] for that CPU interrupts this thread. Dropping it unregisters. Not `Send`: it
/// names the thread that made it.
///
/// The thread should be pinned to the CPU (or bound to it with
/// [`Qpw::bind_current`](crate::Qpw::bind_current)); the registration does not check, and the
/// [`CallCtx::phys_cpu`] a call sees tells where it really ran.
#[must_use = "dropping the registration unregisters the thread at once"]
pub struct CallTarget {
    idx: usize,
    space: u64,
    cpu: usize,
    _not_send: PhantomData<*const ()>,
}

impl fmt::Debug for CallTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallTarget")
            .field("space", &self.space)
            .field("cpu", &self.cpu)
            .field("calls", &self.calls())
            .finish()
    }
}

impl CallTarget {
    /// Registers the calling thread for `cpu` in `space`, installing the handler on first use
    /// and unblocking [`signal()`] for this thread.
    pub fn register(space: u64, cpu: usize) -> Result<Self, CrossCallError> {
        install()?;
        unblock_for_this_thread()?;
        // SAFETY: `gettid` has no preconditions.
        let tid = unsafe { libc::gettid() };
        for (idx, mailbox) in MAILBOXES.iter().enumerate() {
            if mailbox
                .tid
                .compare_exchange(0, -1, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            mailbox.space.store(space, Ordering::Relaxed);
            mailbox.cpu.store(cpu, Ordering::Relaxed);
            mailbox.state.store(IDLE, Ordering::Relaxed);
            mailbox.calls.store(0, Ordering::Relaxed);
            mailbox.signals.store(0, Ordering::Relaxed);
            mailbox.last_phys.store(-1, Ordering::Relaxed);
            mailbox.tid.store(tid, Ordering::Release);
            return Ok(Self {
                idx,
                space,
                cpu,
                _not_send: PhantomData,
            });
        }
        Err(CrossCallError::TooManyTargets { max: MAX_TARGETS })
    }

    /// The CPU this thread is registered for.
    pub fn cpu(&self) -> usize {
        self.cpu
    }

    /// How many calls this thread has been interrupted to run.
    pub fn calls(&self) -> u64 {
        MAILBOXES[self.idx].calls.load(Ordering::Relaxed)
    }

    /// How many cross-call signals this thread has taken, including ones that found no call
    /// (a call withdrawn after a timeout).
    pub fn signals(&self) -> u64 {
        MAILBOXES[self.idx].signals.load(Ordering::Relaxed)
    }

    /// The physical CPU the last call ran on, if any ran.
    pub fn last_phys_cpu(&self) -> Option<usize> {
        usize::try_from(MAILBOXES[self.idx].last_phys.load(Ordering::Relaxed)).ok()
    }
}

impl Drop for CallTarget {
    fn drop(&mut self) {
        let mailbox = &MAILBOXES[self.idx];
        // Wait out any caller: its call, if posted, is run by this very thread's handler as
        // soon as the signal is delivered (at the latest on return from `sched_yield`).
        mailbox.lock_caller();
        mailbox.tid.store(0, Ordering::Release);
        mailbox.unlock_caller();
    }
}

fn find(space: u64, cpu: usize) -> Option<&'static Mailbox> {
    MAILBOXES.iter().find(|m| {
        m.tid.load(Ordering::Acquire) > 0
            && m.space.load(Ordering::Relaxed) == space
            && m.cpu.load(Ordering::Relaxed) == cpu
    })
}

/// A fresh id space, distinct from every other this process has been given.
pub fn new_space() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Whether a thread is registered for `cpu` in `space`.
pub fn has_target(space: u64, cpu: usize) -> bool {
    find(space, cpu).is_some()
}

/// Calls run so far by the threads registered now for `cpu` in `space`.
pub fn calls_on(space: u64, cpu: usize) -> u64 {
    MAILBOXES
        .iter()
        .filter(|m| {
            m.tid.load(Ordering::Acquire) > 0
                && m.space.load(Ordering::Relaxed) == space
                && m.cpu.load(Ordering::Relaxed) == cpu
        })
        .map(|m| m.calls.load(Ordering::Relaxed))
        .sum()
}

/// What a completed cross call saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallReport {
    /// The interrupted thread.
    pub tid: i32,
    /// The physical CPU the function ran on, if the system could tell.
    pub phys_cpu: Option<usize>,
    /// From posting the call to seeing it done.
    pub waited: Duration,
}

/// Runs `func(ctx, arg)` on the thread registered for `cpu` in `space`, interrupting it with
/// [`signal()`], and spins (sleeping on the mailbox after 100 us) until it has run: the kernel's
/// `smp_call_function_single(cpu, func, arg, wait=1)`. If the target has not started the call
/// after `timeout`, the call is withdrawn and [`CrossCallError::Timeout`] returned; a call
/// that has started is always waited for.
///
/// # Safety
///
/// 1. `func` must be async-signal-safe: it may use atomics and plain reads of memory that no
///    one writes meanwhile, but must not lock, allocate, or panic, since it interrupts an
///    arbitrary point of the target thread (which may hold the allocator's lock).
/// 2. `arg` must stay valid for what `func` does with it until this function returns (a
///    pointer to the caller's own stack is fine: the call never outlives this function).
pub unsafe fn call_on(
    space: u64,
    cpu: usize,
    func: CallFn,
    arg: *const (),
    timeout: Duration,
) -> Result<CallReport, CrossCallError> {
    let mailbox = find(space, cpu).ok_or(CrossCallError::NoTarget { space, cpu })?;
    mailbox.lock_caller();
    // The target may have unregistered (or been replaced) before we took the mailbox.
    let tid = mailbox.tid.load(Ordering::Acquire);
    if tid <= 0
        || mailbox.space.load(Ordering::Relaxed) != space
        || mailbox.cpu.load(Ordering::Relaxed) != cpu
    {
        mailbox.unlock_caller();
        return Err(CrossCallError::NoTarget { space, cpu });
    }

    mailbox.func.store(func as usize, Ordering::Relaxed);
    mailbox.arg.store(arg as usize, Ordering::Relaxed);
    mailbox.state.store(POSTED, Ordering::Release);
    let start = Instant::now();
    // SAFETY: `getpid` has no preconditions; `tgkill` with a stale tid fails with ESRCH, it
    // cannot reach another process since the pid is ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_tgkill,
            libc::getpid(),
            tid as libc::c_long,
            signal() as libc::c_long,
        )
    };
    if rc != 0 {
        let source = io::Error::last_os_error();
        let withdrawn = mailbox
            .state
            .compare_exchange(POSTED, IDLE, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
        if withdrawn {
            mailbox.unlock_caller();
            return Err(CrossCallError::Signal { cpu, tid, source });
        }
        // An earlier signal got there after all: wait for it like any started call.
    }

    let mut spins = 0u32;
    loop {
        match mailbox.state.load(Ordering::Acquire) {
            DONE => break,
            // Still not started after the timeout: withdraw it, unless the handler claims it
            // at this very moment, in which case it runs now and is waited for.
            POSTED
                if start.elapsed() > timeout
                    && mailbox
                        .state
                        .compare_exchange(POSTED, IDLE, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok() =>
            {
                mailbox.unlock_caller();
                return Err(CrossCallError::Timeout { cpu, timeout });
            }
            _ => {}
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(64) || start.elapsed() < SPIN_BEFORE_SLEEP {
            std::hint::spin_loop();
            continue;
        }
        // A long wait: the target is not running (it waits for a CPU, maybe this one). Sleep
        // on the state word rather than burn the CPU; the handler wakes us when it is done.
        mailbox.sleeper.store(true, Ordering::SeqCst);
        let now = mailbox.state.load(Ordering::SeqCst);
        if now != DONE {
            let left = timeout.saturating_sub(start.elapsed());
            futex_wait(
                &mailbox.state,
                now,
                left.clamp(Duration::from_micros(1), SLEEP_SLICE),
            );
        }
        mailbox.sleeper.store(false, Ordering::Relaxed);
    }
    let waited = start.elapsed();
    let phys_cpu = usize::try_from(mailbox.last_phys.load(Ordering::Relaxed)).ok();
    mailbox.state.store(IDLE, Ordering::Relaxed);
    mailbox.unlock_caller();
    Ok(CallReport {
        tid,
        phys_cpu,
        waited,
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::{thread, Arc};

    /// A unique space per test, so that parallel tests never call each other's targets.
    fn space() -> u64 {
        new_space()
    }

    fn record(ctx: &CallCtx, arg: *const ()) {
        // SAFETY: the tests pass a pointer to an `AtomicUsize` that outlives the call.
        let seen = unsafe { &*(arg as *const AtomicUsize) };
        seen.store(ctx.cpu() + 100, Ordering::Relaxed);
    }

    fn spawn_target(
        space: u64,
        cpu: usize,
        block: bool,
    ) -> (
        Arc<AtomicBool>,
        Arc<AtomicBool>,
        thread::JoinHandle<(u64, u64)>,
    ) {
        let ready = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (ready.clone(), stop.clone());
        let handle = thread::spawn(move || {
            let target = CallTarget::register(space, cpu).unwrap();
            // SAFETY: `sigset_t` is plain data; all-zero bytes are a valid value.
            let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
            // SAFETY: `set` is valid; the mask change affects only this thread.
            unsafe {
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, signal());
                if block {
                    libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                }
            }
            r.store(true, Ordering::Release);
            while !s.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            if block {
                // SAFETY: as above.
                unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
            }
            (target.calls(), target.signals())
        });
        while !ready.load(Ordering::Acquire) {
            thread::yield_now();
        }
        (ready, stop, handle)
    }

    #[test]
    fn smoke_call_runs_in_the_target_thread() {
        let space = space();
        let (_ready, stop, handle) = spawn_target(space, 7, false);
        assert!(has_target(space, 7));
        let seen = AtomicUsize::new(0);
        // SAFETY: `record` only stores to an atomic; `seen` outlives the call.
        let report = unsafe {
            call_on(
                space,
                7,
                record,
                &seen as *const AtomicUsize as *const (),
                Duration::from_secs(30),
            )
        }
        .unwrap();
        assert_eq!(seen.load(Ordering::Relaxed), 107);
        // SAFETY: `gettid` has no preconditions.
        assert_ne!(report.tid, unsafe { libc::gettid() });
        assert_eq!(calls_on(space, 7), 1);
        stop.store(true, Ordering::Release);
        let (calls, signals) = handle.join().unwrap();
        assert_eq!((calls, signals), (1, 1));
        assert!(!has_target(space, 7));
    }

    #[test]
    fn no_target_is_an_error_naming_the_cpu() {
        let space = space();
        let seen = AtomicUsize::new(0);
        // SAFETY: as in the smoke test.
        let err = unsafe {
            call_on(
                space,
                3,
                record,
                &seen as *const AtomicUsize as *const (),
                Duration::from_secs(1),
            )
        }
        .unwrap_err();
        assert!(matches!(err, CrossCallError::NoTarget { cpu: 3, .. }));
        assert!(err.to_string().contains("cpu 3"));
    }

    #[test]
    fn a_call_that_cannot_run_is_withdrawn_and_never_runs_late() {
        let space = space();
        let (_ready, stop, handle) = spawn_target(space, 2, true);
        let seen = AtomicUsize::new(0);
        // SAFETY: as in the smoke test.
        let err = unsafe {
            call_on(
                space,
                2,
                record,
                &seen as *const AtomicUsize as *const (),
                Duration::from_millis(20),
            )
        }
        .unwrap_err();
        assert!(
            matches!(err, CrossCallError::Timeout { cpu: 2, .. }),
            "{err}"
        );
        // The target unblocks the signal: the handler runs but finds nothing to do.
        stop.store(true, Ordering::Release);
        let (calls, signals) = handle.join().unwrap();
        assert_eq!(calls, 0);
        assert_eq!(signals, 1);
        assert_eq!(seen.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn stress_many_calls_from_two_callers() {
        let space = space();
        let (_ready, stop, handle) = spawn_target(space, 1, false);
        let total = Arc::new(AtomicUsize::new(0));
        fn bump(_ctx: &CallCtx, arg: *const ()) {
            // SAFETY: the test passes a pointer to an `AtomicUsize` that outlives the call.
            let n = unsafe { &*(arg as *const AtomicUsize) };
            n.fetch_add(1, Ordering::Relaxed);
        }
        let callers: Vec<_> = (0..2)
            .map(|_| {
                let total = total.clone();
                thread::spawn(move || {
                    for _ in 0..200 {
                        // SAFETY: `bump` only touches an atomic that outlives the call.
                        unsafe {
                            call_on(
                                space,
                                1,
                                bump,
                                &*total as *const AtomicUsize as *const (),
                                Duration::from_secs(30),
                            )
                        }
                        .unwrap();
                    }
                })
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
        assert_eq!(total.load(Ordering::Relaxed), 400);
        stop.store(true, Ordering::Release);
        let (calls, _) = handle.join().unwrap();
        assert_eq!(calls, 400);
    }
}
