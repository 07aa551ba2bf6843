//! A pool of fixed-size buffers in three designs, behind one get/put API, driven by a
//! hackbench-style load (seed 004).
//!
//! # The problem
//!
//! AppArmor needs large scratch buffers (`aa_get_buffer`/`aa_put_buffer`, 2 x `PATH_MAX`) on
//! every file permission check. They used to sit in per-CPU caches, used with preemption off;
//! commit df323337e507 ("apparmor: Use a memory pool instead per-CPU caches") replaced those by
//! one global list under `aa_buffers_lock`, for PREEMPT_RT (no long preempt-off sections, no
//! `GFP_ATOMIC`) and for memory on large machines. In 2023 hackbench on a 192-thread EPYC spent
//! its time in `native_queued_spin_lock_slowpath` behind `apparmor_file_permission` and lost up
//! to 30 % (Swapnil Sapkal, Mathieu Desnoyers). Two fixes were on the table:
//!
//! 1. [`GlobalPool`]: the design of df323337e507. Take from the list while it holds more than
//!    `RESERVE_COUNT` = 2 buffers, else allocate a new one; every put goes back to the list.
//! 2. [`CachePool`]: John Johansen's "apparmor: cache buffers on percpu list if there is lock
//!    contention" (2023): a put whose `spin_trylock` fails keeps the buffer on a per-CPU list
//!    (at most `MAX_LOCAL_COUNT` = 2), a get looks there first; each failed trylock raises the
//!    CPU's `contention` by 3 up to 9 and its `hold` by `1 << contention` (8, 64, 512), each
//!    successful one lowers `contention` by 1, and while `hold` is non-zero puts stay local.
//! 3. [`PerCpuPools`]: Mathieu Desnoyers' proposal: true per-CPU pools, each buffer owned by one
//!    CPU; a buffer freed on another CPU goes back to its owner lock-free (a push onto the
//!    owner's return stack), and the owner takes the whole stack back with one atomic swap when
//!    its own list runs dry. Memory is bounded by construction: `cpus x per_cpu` buffers.
//!
//! # Userspace translation
//!
//! `get_cpu_ptr()` becomes the qpw local lock of the calling thread's CPU ([`qpw_core::PerCpu`]),
//! since userspace cannot disable preemption; the global `aa_buffers_lock` is a spinlock that
//! yields after a short spin (a pure spinlock would spin against a preempted holder). Buffers
//! live in a slab and are handed out as unique [`Buffer`] tokens; every hand-out and return
//! flips the buffer's owner flag, so a buffer owned twice or returned twice is counted as a
//! violation ([`PoolStats::violations`]), and [`BufferPool::check_conservation`] checks that
//! every allocated buffer is in exactly one place.
//!
//! The load ([`hackbench`]) is `perf bench sched messaging` in threads mode: groups of
//! senders and receivers exchanging messages through real pipes or socketpairs
//! ([`Transport`]), and, as under AppArmor, every `write` and every `read` runs the
//! file-permission hook first, which gets a buffer, writes the file's name into it, matches
//! it and puts the buffer back, all on one CPU (the threads are bound). The pool thus sees
//! what seed 004's hackbench made it see: two short get/put pairs per message, from every
//! CPU at once, between system calls. Every count that the designs are compared by
//! ([`PoolStats::lock_contention`], the failed trylocks on `aa_buffers_lock` that drive
//! design 2's cache and its adaptive hold, above all) is kept per CPU, so that counting does
//! not bounce a shared cache line between the CPUs that the designs try not to share.
//!
//! Where we deviate from the 2023 patch, on purpose: the patch decrements the unsigned `hold`
//! on every cached get, which wraps it to `UINT_MAX` when it is already 0; we saturate at 0. And
//! the patch caches a put without checking `count` while `hold` is non-zero; the brief's bound
//! of 2 cached buffers per CPU is kept on every path.
//!
//! # Where things are
//!
//! One concept per file: `buffer_pool` (the API: [`BufferPool`], [`Buffer`], [`PoolStats`]),
//! `slab` (the buffers and their owner flags), `counters` (per-CPU counts), `spinlock`
//! (`aa_buffers_lock`), one file per design (`global`, `cache`, `percpu_pools`), `design`
//! (naming and building them), `hook` (AppArmor's file-permission hook), `transport` (pipes
//! and socketpairs), `hackbench` (the load), `hooks_alone` (the hook without the load's
//! system calls) and `figures`.

#[cfg(not(loom))]
mod bound_threads;
mod buffer_pool;
mod cache;
mod counters;
mod design;
mod error;
mod figures;
mod global;
mod hackbench;
#[cfg(not(loom))]
mod hook;
#[cfg(not(loom))]
mod hooks_alone;
mod percpu_pools;
mod slab;
mod spinlock;
#[cfg(not(loom))]
mod transport;

pub use buffer_pool::{Buffer, BufferPool, PoolStats};
pub use cache::{CachePool, CONTENTION_MAX, CONTENTION_STEP, MAX_LOCAL_COUNT};
pub use design::{build, Design};
pub use error::PoolError;
#[cfg(not(loom))]
pub use figures::pool_figures;
pub use figures::{PoolFigures, PoolFiguresConfig};
pub use global::{GlobalPool, RESERVE_COUNT};
#[cfg(not(loom))]
pub use hackbench::hackbench;
pub use hackbench::{HackbenchConfig, HackbenchReport, Transport, HACKBENCH_DATASIZE};
#[cfg(not(loom))]
pub use hooks_alone::{hooks_alone, HooksReport};
pub use percpu_pools::PerCpuPools;
