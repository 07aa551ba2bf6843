//! [`PwLock`]: the lock of [`Qpw::per_cpu`](crate::Qpw::per_cpu) state, one protocol per CPU as
//! the CPU's [`Mode`] calls for.

use crate::{FairLock, FencedLock, LocalAttempt, Mode, RawLocalLock, RawRemoteLock};

/// The default per-CPU lock (the kernel's `pw_lock_t`, whose protocol `pwlocks=` picks): each
/// slot gets the protocol of its CPU's [`Mode`], fixed when the state is made.
///
/// - **Queue and remote mode**: a [`FairLock`], one atomic word (a compare-and-swap to take,
///   one to release) that any CPU may take.
/// - **Fenced mode**: a [`FencedLock`], a restartable sequence with plain stores for the CPU's
///   own threads, a flag and a `membarrier` fence of the CPU for a thread elsewhere (its own
///   atomic fallback where restartable sequences are missing).
///
/// The choice costs the hot path one predictable branch on a byte in the slot's own line:
/// within the noise beside a named `FairLock` on remote CPUs, and on fenced CPUs between
/// 0.74x and 1.38x a named `FencedLock` in five runs (`docs/results.md`, section 6a; on a path
/// of a few cycles, code placement decides as much). A `PerCpu` that should use one protocol
/// everywhere names it instead ([`Qpw::per_cpu_with`](crate::Qpw::per_cpu_with)).
///
/// ```
/// use qpw_core::{Mode, Policy, Qpw};
///
/// let qpw = Qpw::with_policy(Policy::Fenced)?;
/// let counters = qpw.per_cpu(|_cpu| 0u64); // every slot a FencedLock
/// *counters.lock_local()? += 1; // the owner: a restartable sequence (where rseq works)
/// let first = qpw.cpus().first().unwrap();
/// assert_eq!(qpw.mode(first)?, Mode::Fenced);
/// let mut total = 0;
/// counters.for_each_locked(|_cpu, n| total += *n); // each other CPU: flag, fence, take
/// assert_eq!(total, 1);
/// # Ok::<(), qpw_core::Error>(())
/// ```
#[derive(Debug)]
pub enum PwLock {
    /// A queue- or remote-mode CPU's lock.
    Fair(FairLock),
    /// A fenced-mode CPU's lock.
    Fenced(FencedLock),
}

impl PwLock {
    /// Whether this is a fenced-mode CPU's lock (else a queue- or remote-mode CPU's, which
    /// share one protocol).
    pub fn is_fenced(&self) -> bool {
        matches!(self, PwLock::Fenced(_))
    }
}

// SAFETY: every operation forwards to the one lock the value holds, which never changes after
// it is made; both are `RawLocalLock`s whose promises hold from any CPU (`RawRemoteLock`).
unsafe impl RawLocalLock for PwLock {
    fn new() -> Self {
        PwLock::Fair(FairLock::new())
    }

    fn for_cpu_in(phys: usize, mode: Mode) -> Self {
        match mode {
            Mode::Fenced => PwLock::Fenced(FencedLock::for_cpu(phys)),
            Mode::Queue | Mode::Remote => PwLock::Fair(FairLock::new()),
        }
    }

    #[inline]
    fn lock(&self) {
        match self {
            PwLock::Fenced(l) => l.lock(),
            PwLock::Fair(l) => l.lock(),
        }
    }

    #[inline]
    fn try_lock(&self) -> bool {
        match self {
            PwLock::Fenced(l) => l.try_lock(),
            PwLock::Fair(l) => l.try_lock(),
        }
    }

    fn try_lock_until(&self, deadline: std::time::Instant) -> bool {
        match self {
            PwLock::Fenced(l) => l.try_lock_until(deadline),
            PwLock::Fair(l) => l.try_lock_until(deadline),
        }
    }

    #[inline(always)]
    unsafe fn unlock(&self) {
        // SAFETY: the caller holds the lock (the trait's `# Safety`), which is the inner one.
        unsafe {
            match self {
                PwLock::Fenced(l) => l.unlock(),
                PwLock::Fair(l) => l.unlock(),
            }
        }
    }

    #[inline(always)]
    fn lock_on_current_cpu(&self) -> LocalAttempt {
        match self {
            PwLock::Fenced(l) => l.lock_on_current_cpu(),
            PwLock::Fair(l) => l.lock_on_current_cpu(),
        }
    }
    #[inline]
    fn as_rseq(&self) -> Option<&crate::RseqLock> {
        match self {
            PwLock::Fenced(l) => l.as_rseq(),
            PwLock::Fair(_) => None,
        }
    }
}

// SAFETY: both inner locks are `RawRemoteLock`s.
unsafe impl RawRemoteLock for PwLock {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_mode_picks_the_protocol() {
        assert!(PwLock::for_cpu_in(0, Mode::Fenced).is_fenced());
        assert!(!PwLock::for_cpu_in(0, Mode::Remote).is_fenced());
        assert!(!PwLock::for_cpu_in(0, Mode::Queue).is_fenced());
        assert!(!PwLock::new().is_fenced());
    }
}
