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
//! The load ([`hackbench`]) follows `perf bench sched messaging` in threads mode: groups of
//! senders and receivers, each message a pool buffer from the sender's get to the receiver's
//! put, each receiver's pipe blocking its senders when it holds [`HACKBENCH_PIPE_MESSAGES`],
//! and both roles spread over every CPU so that each CPU gets and puts, and buffers freed on
//! another CPU than the one that took them are common, as they are under the kernel's
//! scheduler.
//!
//! Where we deviate from the 2023 patch, on purpose: the patch decrements the unsigned `hold`
//! on every cached get, which wraps it to `UINT_MAX` when it is already 0; we saturate at 0. And
//! the patch caches a put without checking `count` while `hold` is non-zero; the brief's bound
//! of 2 cached buffers per CPU is kept on every path.
//!
//! # Where things are
//!
//! One concept per file: `buffer_pool` (the API: [`BufferPool`], [`Buffer`], [`PoolStats`]),
//! `slab` (the buffers and their owner flags), `spinlock` (`aa_buffers_lock`), one file per
//! design (`global`, `cache`, `percpu_pools`), `design` (naming and building them),
//! `hackbench` (the load) and `figures`.

mod buffer_pool;
mod cache;
mod design;
mod error;
mod figures;
mod global;
mod hackbench;
mod percpu_pools;
mod slab;
mod spinlock;

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
pub use hackbench::{
    HackbenchConfig, HackbenchReport, HACKBENCH_DATASIZE, HACKBENCH_PIPE_MESSAGES,
};
pub use percpu_pools::PerCpuPools;
