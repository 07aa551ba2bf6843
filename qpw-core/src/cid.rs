//! The calling thread's concurrency id: rseq's `mm_cid`, for state kept per running thread
//! rather than per CPU ([`PerCid`](crate::PerCid)).
//!
//! # What the kernel gives
//!
//! Since Linux 6.3 the kernel writes, beside `cpu_id`, a *concurrency id* into every registered
//! `struct rseq` (`mm_cid`, a `u32` at byte 24): an id unique among the threads of the process
//! that run at the same moment, as small and dense as it can be (the lowest free one, so at most
//! the number of threads that run at once, and never more than the CPUs the process may use),
//! and reused as threads stop running. tcmalloc's per-CPU caches call the same idea "virtual
//! CPU ids"; librseq's per-CPU pools index by it. State indexed by it needs as many slots as
//! threads run, not as many as the host has CPUs.
//!
//! # Whether this process can read it
//!
//! The field exists when the registration covers its 28 bytes. glibc says how large the area it
//! registered is in `__rseq_size`, but not reliably: glibc 2.35-2.39 advertise 32 while the first
//! kernels filled only 20 bytes, and 2.40 (and Debian's 2.36) advertise 20 while registering 32
//! bytes. So, as librseq decides it: when glibc says 20 or 32, the usable size is the kernel's
//! feature size (`getauxval(AT_RSEQ_FEATURE_SIZE)`, 0 before Linux 6.3, which means 20), capped
//! at the 32 bytes glibc allocated; any other size glibc says is taken as it is. `mm_cid` is
//! read only when that size covers it; otherwise ids fall back to CPU numbers (below), and
//! [`status`] says why. Each read also checks the thread's own registration (`cpu_id`
//! negative: not registered, as under valgrind) and falls back for that thread.
//!
//! # The fallback
//!
//! Without `mm_cid` the id is the CPU the thread runs on (rseq's `cpu_id`, else
//! `sched_getcpu`): the state then has as many slots as CPUs the threads have run on, which is
//! what [`PerCpu`](crate::PerCpu) gives, and still correct, since every slot is behind a real
//! lock.
//!
//! Under loom a model sets each thread's id with `rseq::mock::set_cid`.

#[cfg(not(loom))]
use std::sync::OnceLock;

/// Byte offset of `mm_cid` in `struct rseq` (after `cpu_id_start`, `cpu_id`, `rseq_cs`,
/// `flags`, `node_id`).
#[cfg(not(loom))]
const MM_CID_OFFSET: usize = 24;
/// The registration must cover `mm_cid`'s four bytes.
#[cfg(not(loom))]
const MM_CID_END: u32 = 28;
/// What the first kernels with rseq filled, and what glibc 2.40 advertises.
#[cfg(not(loom))]
const ORIGINAL_FEATURE_SIZE: u32 = 20;
/// What glibc allocates for the area, and what glibc 2.35-2.39 advertise.
#[cfg(not(loom))]
const ORIGINAL_ALLOC_SIZE: u32 = 32;
/// `AT_RSEQ_FEATURE_SIZE` (`include/uapi/linux/auxvec.h`, Linux 6.3).
#[cfg(not(loom))]
const AT_RSEQ_FEATURE_SIZE: libc::c_ulong = 27;

/// Where a [`PerCid`](crate::PerCid)'s ids come from in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdSource {
    /// rseq's `mm_cid`: slots for the threads that run.
    MmCid,
    /// CPU numbers, because `mm_cid` cannot be read here ([`status`] says why).
    Cpu,
}

impl std::fmt::Display for IdSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IdSource::MmCid => "rseq mm_cid",
            IdSource::Cpu => "CPU numbers",
        })
    }
}

/// The usable size of the process's rseq registration, by librseq's rule (module docs), from
/// what glibc advertises and the kernel's feature size.
#[cfg(not(loom))]
fn usable_size(glibc_size: u32, kernel_feature_size: u32) -> u32 {
    let kernel = if kernel_feature_size == 0 {
        ORIGINAL_FEATURE_SIZE
    } else {
        kernel_feature_size
    };
    match glibc_size {
        ORIGINAL_FEATURE_SIZE | ORIGINAL_ALLOC_SIZE => kernel.min(ORIGINAL_ALLOC_SIZE),
        other => other,
    }
}

/// Why `mm_cid` cannot be read in this process, or `None` when it can. Decided once.
pub(crate) fn unavailable_reason() -> Option<&'static str> {
    #[cfg(not(loom))]
    {
        static REASON: OnceLock<Option<String>> = OnceLock::new();
        REASON
            .get_or_init(|| {
                let (_, glibc_size) = match crate::rseq::registration() {
                    Ok(r) => r,
                    Err(why) => return Some(why),
                };
                // SAFETY: `getauxval` has no preconditions; it returns 0 for a type the kernel
                // did not pass.
                let feature = unsafe { libc::getauxval(AT_RSEQ_FEATURE_SIZE) };
                let feature = u32::try_from(feature).unwrap_or(u32::MAX);
                let usable = usable_size(glibc_size, feature);
                (usable < MM_CID_END).then(|| {
                    format!(
                        "the rseq area's usable size is {usable} bytes (glibc's __rseq_size \
                         {glibc_size}, the kernel's AT_RSEQ_FEATURE_SIZE {feature}), short of \
                         mm_cid's {MM_CID_END}: a kernel before Linux 6.3"
                    )
                })
            })
            .as_deref()
    }
    #[cfg(loom)]
    {
        None
    }
}

/// Where ids come from in this process: `mm_cid` where it can be read, else CPU numbers.
#[inline]
pub fn source() -> IdSource {
    #[cfg(not(loom))]
    {
        // The decision, cached in one byte for the owner's path: 0 unknown, 1 mm_cid, 2 CPUs.
        static CACHED: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
        match CACHED.load(std::sync::atomic::Ordering::Relaxed) {
            1 => IdSource::MmCid,
            2 => IdSource::Cpu,
            _ => {
                let source = if unavailable_reason().is_none() {
                    IdSource::MmCid
                } else {
                    IdSource::Cpu
                };
                let byte = if source == IdSource::MmCid { 1 } else { 2 };
                CACHED.store(byte, std::sync::atomic::Ordering::Relaxed);
                source
            }
        }
    }
    #[cfg(loom)]
    {
        IdSource::MmCid
    }
}

/// One line saying where [`PerCid`](crate::PerCid)'s ids come from, with the reason when it
/// falls back to CPU numbers.
///
/// ```
/// let status = qpw_core::cid::status();
/// assert!(status.starts_with("concurrency ids: "));
/// ```
pub fn status() -> String {
    match unavailable_reason() {
        None => "concurrency ids: rseq mm_cid".to_string(),
        Some(why) => format!("concurrency ids: CPU numbers (fallback: {why})"),
    }
}

/// The calling thread's concurrency id, as [`source`] says: its `mm_cid`, or where that cannot
/// be read (for the process, or for this thread, whose registration failed) its CPU. `None`
/// only when neither can be had. Like a CPU number, it may have changed by the time it is
/// used: it is a slot index, and every slot is behind a real lock.
#[inline]
pub fn current() -> Option<usize> {
    #[cfg(not(loom))]
    {
        if source() == IdSource::MmCid {
            if let Some(area) = crate::rseq::area() {
                // SAFETY: (1) `area` is the calling thread's registered `struct rseq`, which
                // lives as long as the thread; the process's registration covers `mm_cid`
                // (`unavailable_reason` checked the usable size), so offsets 4 and 24 are in
                // bounds and 4-aligned (the struct is 32-aligned); (2) the kernel writes them
                // only while this thread is not running user code, so a volatile load sees a
                // whole value.
                let (cpu, cid) = unsafe {
                    (
                        std::ptr::read_volatile(area.add(crate::rseq::CPU_ID_OFFSET) as *const u32),
                        std::ptr::read_volatile(area.add(MM_CID_OFFSET) as *const u32),
                    )
                };
                // A negative `cpu_id`: this thread is not registered, and `mm_cid` means
                // nothing.
                if (cpu as i32) >= 0 {
                    return Some(cid as usize);
                }
            }
        }
        crate::rseq::cpu_now()
    }
    #[cfg(loom)]
    {
        crate::rseq::mock::cid()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// librseq's rule for the usable size, on the sizes glibc and kernels have advertised.
    #[test]
    fn the_usable_size_follows_librseqs_rule() {
        // Debian 12: glibc 2.36 says 20, the 6.18 kernel's feature size is 28.
        assert_eq!(usable_size(20, 28), 28);
        // glibc 2.35-2.39 say 32: capped by the kernel's size; a kernel before 6.3 says 0.
        assert_eq!(usable_size(32, 28), 28);
        assert_eq!(usable_size(32, 0), 20);
        assert_eq!(usable_size(20, 0), 20);
        // A newer kernel's larger feature set is capped at the 32 bytes glibc allocated.
        assert_eq!(usable_size(20, 36), 32);
        // A glibc that says something else is believed.
        assert_eq!(usable_size(36, 40), 36);
    }

    #[test]
    fn ids_are_read_where_the_registration_allows() {
        let id = current().expect("mm_cid or a CPU number");
        match source() {
            IdSource::MmCid => {
                // The kernel keeps ids below the number of CPUs it could ever run.
                // SAFETY: `sysconf` has no preconditions.
                let possible = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
                assert!(
                    (id as i64) < possible as i64,
                    "mm_cid {id} of {possible} CPUs"
                );
            }
            IdSource::Cpu => assert!(crate::allowed_cpus().unwrap().contains(id)),
        }
        assert!(status().starts_with("concurrency ids: "));
    }
}
