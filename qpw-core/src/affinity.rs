//! Thin, checked wrappers over the scheduler calls qpw needs: `sched_getaffinity`,
//! `sched_setaffinity`, `sched_getcpu` and `sched_setscheduler(SCHED_FIFO)`.
//!
//! `libc` is used directly rather than `core_affinity` because the latter reports failure as a
//! bare `bool`: we want the system's error in our own, and the allowed set to check against.
//!
//! Under loom there is no real CPU: the calls become no-ops, every thread "runs" nowhere, and
//! the models bind threads to CPUs through the framework's registration only.

#[cfg(not(loom))]
use std::io;

use crate::{CpuSet, Error, Result};

/// The CPUs the process may run on: the main thread's affinity when the program started (read
/// by a constructor that runs before `main`, so that pinning the main thread later does not
/// narrow it), united with the main thread's and the calling thread's affinity now (either may
/// have been widened since, within the process's cpuset), and with the isolated CPUs
/// (`isolcpus=`, `nohz_full=`, cgroup v2 isolated partitions) that the process's cpuset lets it
/// use: the kernel leaves those out of every process's affinity by default, and a real-time
/// program pins its threads there on purpose. Read afresh on every call: a thread
/// that has pinned itself, or been bound by the framework, still sees the whole set, and so
/// does a program that pins its main thread before it builds its instance.
///
/// ```
/// let allowed = qpw_core::allowed_cpus()?;
/// qpw_core::pin_current_thread(allowed.first().unwrap())?;
/// assert_eq!(qpw_core::allowed_cpus()?, allowed); // pinning narrows the thread, not the set
/// qpw_core::set_current_affinity(&allowed)?;
/// # Ok::<(), qpw_core::Error>(())
/// ```
pub fn allowed_cpus() -> Result<CpuSet> {
    #[cfg(loom)]
    {
        Ok(CpuSet::first_n(2))
    }
    #[cfg(not(loom))]
    {
        // SAFETY: `getpid` has no preconditions; the main thread's tid is the pid.
        let main = thread_affinity(unsafe { libc::getpid() })?;
        let mut set = main.union(&thread_affinity(0)?);
        if let Some(start) = startup::mask() {
            set = set.union(&start);
        }
        // `isolcpus=` (and an isolated partition for the processes outside it) keeps every
        // process off the isolated CPUs by default, yet a thread may still be pinned there:
        // that is how real-time programs reach them (rt-tests parses its CPU lists against all
        // CPUs for this reason). So they count, where the process's cpuset lets it use them.
        let isolated = crate::topology::isolated_now();
        if !isolated.is_subset(&set) {
            set = with_isolated(&set, &isolated, crate::topology::process_cpuset().as_ref());
        }
        Ok(set)
    }
}

/// `affinity` with the `isolated` CPUs the process's `cpuset` lets it use (all of them when the
/// cpuset is unknown).
#[cfg(not(loom))]
fn with_isolated(affinity: &CpuSet, isolated: &CpuSet, cpuset: Option<&CpuSet>) -> CpuSet {
    match cpuset {
        Some(cpuset) => affinity.union(&isolated.intersection(cpuset)),
        None => affinity.union(isolated),
    }
}

/// The main thread's affinity as the program started, captured before `main`.
#[cfg(all(not(loom), target_os = "linux"))]
mod startup {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use crate::CpuSet;

    const WORDS: usize = (CpuSet::MAX_CPU + 1).div_ceil(64);
    static BITS: [AtomicU64; WORDS] = [const { AtomicU64::new(0) }; WORDS];
    static CAPTURED: AtomicBool = AtomicBool::new(false);

    /// Runs from the ELF `.init_array`, before `main` and before any thread of the program
    /// exists: plain system calls and atomics, nothing of std that needs its runtime.
    extern "C" fn capture() {
        // SAFETY: `cpu_set_t` is plain data for which all-zero bytes is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid, writable `cpu_set_t` of the size passed; `getpid` has no
        // preconditions (the main thread's tid is the pid).
        let rc = unsafe {
            libc::sched_getaffinity(libc::getpid(), std::mem::size_of_val(&set), &mut set)
        };
        if rc != 0 {
            return;
        }
        for cpu in 0..=CpuSet::MAX_CPU {
            // SAFETY: `cpu` is below CPU_SETSIZE, the bound `CPU_ISSET` requires.
            if unsafe { libc::CPU_ISSET(cpu, &set) } {
                BITS[cpu / 64].fetch_or(1 << (cpu % 64), Ordering::Relaxed);
            }
        }
        CAPTURED.store(true, Ordering::Release);
    }

    /// The constructor's entry. `#[used]` keeps it in the binary even though nothing names
    /// it; the loader calls every pointer of `.init_array` before `main`.
    #[used]
    #[link_section = ".init_array"]
    static CAPTURE: extern "C" fn() = capture;

    /// The captured mask, if the constructor ran (it does in every program linked against
    /// the crate on Linux; not in a crate loaded in some other way).
    pub(super) fn mask() -> Option<CpuSet> {
        if !CAPTURED.load(Ordering::Acquire) {
            return None;
        }
        Some(
            (0..=CpuSet::MAX_CPU)
                .filter(|&cpu| BITS[cpu / 64].load(Ordering::Relaxed) & (1 << (cpu % 64)) != 0)
                .collect(),
        )
    }
}

#[cfg(all(not(loom), not(target_os = "linux")))]
mod startup {
    pub(super) fn mask() -> Option<crate::CpuSet> {
        None
    }
}

/// One thread's `sched_getaffinity` mask (`tid` 0: the calling thread).
#[cfg(not(loom))]
fn thread_affinity(tid: libc::pid_t) -> Result<CpuSet> {
    // SAFETY: `cpu_set_t` is plain data for which all-zero bytes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable `cpu_set_t` of the size passed.
    let rc = unsafe { libc::sched_getaffinity(tid, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return Err(Error::Affinity {
            cpu: 0,
            source: io::Error::last_os_error().into(),
        });
    }
    Ok((0..=CpuSet::MAX_CPU)
        // SAFETY: `cpu` is below CPU_SETSIZE, the bound `CPU_ISSET` requires.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// A step a program wants run before qpw gives a thread CPUs: see [`set_pin_hook`]. It gets the
/// thread's id (as `gettid` returns it) and the CPUs.
pub type PinHook = Box<dyn Fn(libc::pid_t, &CpuSet) -> std::io::Result<()> + Send + Sync>;

// Not part of any protocol loom models (pinning is a no-op there), so plain std.
#[cfg(not(loom))]
static PIN_HOOK: std::sync::RwLock<Option<PinHook>> = std::sync::RwLock::new(None);

/// Sets (or, with `None`, clears) a step that runs before qpw gives a thread CPUs: its own
/// workers, [`pin_current_thread`] and [`set_current_affinity`].
///
/// The case it is for: a cgroup v2 *isolated partition* holds threads, and a thread outside it
/// cannot be given its CPUs (`sched_setaffinity` fails with `EINVAL`). A program that keeps
/// its isolated CPUs in a threaded partition moves each thread meant for them into the
/// partition's `cgroup.threads` first (and the others out). An error from the hook fails the
/// pinning, with the hook's error as the cause.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// static ASKED: AtomicUsize = AtomicUsize::new(0);
///
/// qpw_core::set_pin_hook(Some(Box::new(|_tid, cpus| {
///     ASKED.store(cpus.len(), Ordering::Relaxed); // a real hook writes `tid` to cgroup.threads
///     Ok(())
/// })));
/// let cpu = qpw_core::allowed_cpus()?.first().unwrap();
/// qpw_core::pin_current_thread(cpu)?;
/// assert_eq!(ASKED.load(Ordering::Relaxed), 1);
/// qpw_core::set_pin_hook(None);
/// # Ok::<(), qpw_core::Error>(())
/// ```
pub fn set_pin_hook(hook: Option<PinHook>) {
    #[cfg(not(loom))]
    {
        *PIN_HOOK.write().unwrap_or_else(|e| e.into_inner()) = hook;
    }
    #[cfg(loom)]
    drop(hook);
}

/// Runs the pin hook, if any, for thread `tid` (0: the calling thread) and `cpus`.
#[cfg(not(loom))]
pub(crate) fn run_pin_hook(tid: libc::pid_t, cpus: &CpuSet) -> Result<()> {
    let hook = PIN_HOOK.read().unwrap_or_else(|e| e.into_inner());
    let Some(hook) = hook.as_ref() else {
        return Ok(());
    };
    let tid = if tid == 0 {
        // SAFETY: `gettid` has no preconditions and cannot fail.
        unsafe { libc::gettid() }
    } else {
        tid
    };
    hook(tid, cpus).map_err(|e| Error::Affinity {
        cpu: cpus.first().unwrap_or(0),
        source: e.into(),
    })
}

/// The CPUs the calling thread may run on now (its own `sched_getaffinity` mask).
pub fn current_affinity() -> Result<CpuSet> {
    #[cfg(loom)]
    {
        Ok(CpuSet::first_n(2))
    }
    #[cfg(not(loom))]
    {
        thread_affinity(0)
    }
}

/// Restricts the calling thread to `cpus` (`sched_setaffinity`), after the pin hook, if any
/// ([`set_pin_hook`]).
pub fn set_current_affinity(cpus: &CpuSet) -> Result<()> {
    #[cfg(not(loom))]
    if !cpus.is_empty() {
        run_pin_hook(0, cpus)?;
    }
    set_affinity_unhooked(cpus)
}

/// [`set_current_affinity`] without the pin hook.
fn set_affinity_unhooked(cpus: &CpuSet) -> Result<()> {
    let first = cpus.first().unwrap_or(0);
    #[cfg(loom)]
    {
        let _ = first;
        Ok(())
    }
    #[cfg(not(loom))]
    {
        if cpus.is_empty() {
            return Err(Error::EmptyCpuSet);
        }
        // SAFETY: as in `allowed_cpus`.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for cpu in cpus.iter() {
            if cpu > CpuSet::MAX_CPU {
                return Err(Error::CpuOutOfRange {
                    cpu,
                    max: CpuSet::MAX_CPU,
                });
            }
            // SAFETY: `cpu` was just checked against CPU_SETSIZE.
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        // SAFETY: `set` is a valid `cpu_set_t` of the size passed.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
        if rc != 0 {
            return Err(Error::Affinity {
                cpu: first,
                source: io::Error::last_os_error().into(),
            });
        }
        Ok(())
    }
}

/// Pins the calling thread to `cpu`, which must be one the process may run on.
///
/// ```
/// let allowed = qpw_core::allowed_cpus()?;
/// let cpu = allowed.last().unwrap();
/// qpw_core::pin_current_thread(cpu)?;
/// assert_eq!(qpw_core::current_cpu(), Some(cpu));
/// assert!(qpw_core::pin_current_thread(4095).is_err());
/// # Ok::<(), qpw_core::Error>(())
/// ```
pub fn pin_current_thread(cpu: usize) -> Result<()> {
    if cpu > CpuSet::MAX_CPU {
        return Err(Error::CpuOutOfRange {
            cpu,
            max: CpuSet::MAX_CPU,
        });
    }
    let only = CpuSet::from_iter([cpu]);
    // First, so that a hook that moves the thread into the cgroup owning `cpu` makes it one
    // the thread may use.
    #[cfg(not(loom))]
    run_pin_hook(0, &only)?;
    let allowed = allowed_cpus()?;
    if !allowed.contains(cpu) {
        return Err(Error::CpuNotAllowed { cpu, allowed });
    }
    set_affinity_unhooked(&only)
}

/// The CPU the calling thread runs on now (`sched_getcpu`), or `None` where the system cannot
/// tell (and always under loom). The answer may be stale by the time it is used unless the
/// thread is pinned.
#[inline]
pub fn current_cpu() -> Option<usize> {
    #[cfg(loom)]
    {
        None
    }
    #[cfg(not(loom))]
    {
        // SAFETY: `sched_getcpu` has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        usize::try_from(cpu).ok()
    }
}

/// Makes the calling thread `SCHED_FIFO` at `priority` (1-99).
pub fn set_current_fifo(priority: i32) -> Result<()> {
    if !(1..=99).contains(&priority) {
        return Err(Error::PriorityOutOfRange { priority });
    }
    #[cfg(loom)]
    {
        Ok(())
    }
    #[cfg(not(loom))]
    {
        let param = libc::sched_param {
            sched_priority: priority,
        };
        // SAFETY: `param` is a valid `sched_param`; pid 0 is the calling thread.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
        if rc != 0 {
            return Err(Error::SchedFifo {
                priority,
                source: io::Error::last_os_error().into(),
            });
        }
        Ok(())
    }
}

/// Pins another thread (by its pthread handle, and its thread id `tid` for the pin hook) to
/// `cpu`.
#[cfg(not(loom))]
pub(crate) fn pin_thread(thread: libc::pthread_t, tid: libc::pid_t, cpu: usize) -> Result<()> {
    if cpu > CpuSet::MAX_CPU {
        return Err(Error::CpuOutOfRange {
            cpu,
            max: CpuSet::MAX_CPU,
        });
    }
    run_pin_hook(tid, &CpuSet::from_iter([cpu]))?;
    // SAFETY: as in `allowed_cpus`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` was just checked against CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `thread` is a live thread (the caller holds its join handle) and `set` is a valid
    // `cpu_set_t` of the size passed.
    let rc = unsafe { libc::pthread_setaffinity_np(thread, std::mem::size_of_val(&set), &set) };
    if rc != 0 {
        return Err(Error::Affinity {
            cpu,
            source: io::Error::from_raw_os_error(rc).into(),
        });
    }
    Ok(())
}

/// Makes another thread (by its pthread handle) `SCHED_FIFO` at `priority`.
#[cfg(not(loom))]
pub(crate) fn set_thread_fifo(thread: libc::pthread_t, priority: i32) -> Result<()> {
    if !(1..=99).contains(&priority) {
        return Err(Error::PriorityOutOfRange { priority });
    }
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: `thread` is a live thread (the caller holds its join handle); `param` is valid.
    let rc = unsafe { libc::pthread_setschedparam(thread, libc::SCHED_FIFO, &param) };
    if rc != 0 {
        return Err(Error::SchedFifo {
            priority,
            source: io::Error::from_raw_os_error(rc).into(),
        });
    }
    Ok(())
}

/// Makes the calling thread `SCHED_OTHER` again (nice 0).
pub fn set_current_normal() -> Result<()> {
    #[cfg(not(loom))]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid `sched_param`; pid 0 is the calling thread.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
        if rc != 0 {
            return Err(Error::SchedFifo {
                priority: 0,
                source: io::Error::last_os_error().into(),
            });
        }
    }
    Ok(())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn isolated_cpus_count_where_the_cpuset_allows_them() {
        let set = |s: &str| s.parse::<CpuSet>().unwrap();
        // isolcpus=2-3: every process starts on 0-1, yet may pin a thread to 2 or 3.
        assert_eq!(with_isolated(&set("0-1"), &set("2-3"), None), set("0-3"));
        // A container whose cpuset holds 0-2 cannot reach 3.
        assert_eq!(
            with_isolated(&set("0-1"), &set("2-3"), Some(&set("0-2"))),
            set("0-2")
        );
    }

    #[test]
    fn pin_and_read_back() {
        let allowed = allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        for cpu in allowed.iter() {
            pin_current_thread(cpu).unwrap();
            assert_eq!(current_cpu(), Some(cpu));
        }
        set_current_affinity(&allowed).unwrap();
    }

    #[test]
    fn pin_outside_the_allowed_set_names_it() {
        let allowed = allowed_cpus().unwrap();
        let outside = (0..=CpuSet::MAX_CPU)
            .find(|&c| !allowed.contains(c))
            .unwrap();
        let err = pin_current_thread(outside).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("cpu {outside} is not in the allowed set {allowed}")
        );
        let err = pin_current_thread(4096).unwrap_err().to_string();
        assert!(err.contains("0 to 1023"), "{err}");
    }

    #[test]
    fn fifo_priority_range_is_checked() {
        assert!(matches!(
            set_current_fifo(0),
            Err(Error::PriorityOutOfRange { priority: 0 })
        ));
        assert!(set_current_fifo(100)
            .unwrap_err()
            .to_string()
            .contains("1-99"));
    }
}
