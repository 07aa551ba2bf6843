//! Per-CPU state behind local locks, and per-CPU work that is either queued to a worker pinned
//! on the target CPU or run at once by the caller under the target CPU's lock.
//!
//! # The problem
//!
//! Linux keeps hot per-CPU caches (LRU folio batches, memcg charge stocks, SLUB sheaves) that
//! their own CPU touches under `local_lock()` and that another CPU must now and then drain.
//! The drain is done with `queue_work_on(cpu)` + `flush_work()`: a kworker must run *on* the
//! target CPU. On an isolated CPU running a latency-critical task that either preempts the task
//! (a latency spike) or, if the task is `SCHED_FIFO` and never yields, never runs, and the
//! requester waits forever. The QPW / "Per-CPU Work" patches (Leonardo Bras, RFC 2024; v4 2026,
//! `pw_*`, `pwlocks=`) make the choice a switch: in mode 1 the per-CPU lock becomes a real
//! spinlock that any CPU can take, and "queuing" work means taking the target's lock and
//! running the work right away in the caller.
//!
//! This crate is that framework in userspace. A [`Qpw`] instance manages a set of CPUs and
//! fixes each one's [`Mode`] when it is built; [`PerCpu`] state and [`PerCpuWork`] items are made
//! from the instance, so no lock is ever used in a mode it was not made for.
//!
//! # The kernel API and its counterparts
//!
//! | kernel (v4) | kernel (v1) | qpw | queue mode | remote mode |
//! |---|---|---|---|---|
//! | `pwlocks=` / `CONFIG_PWLOCKS` | `CONFIG_QPW` | [`Policy`], [`Builder::policy`] | `queue` | `remote`; `auto` (the default, the kernel's rule) and `isolated` pick per CPU |
//! | isolation turns mode 1 on unless `pwlocks=` is given | same | [`Policy::Auto`], the default of [`Qpw::new`] and [`Qpw::builder`] | on housekeeping CPUs | on isolated and `nohz_full` CPUs |
//! | `DEFINE_PER_CPU` + `pw_lock_init` | `qpw_lock_init` | [`Qpw::per_cpu`] | | |
//! | `pw_lock_local(l)` | `local_qpw_lock` | [`PerCpu::lock_local`] | lock the caller's CPU | same |
//! | `pw_trylock_local(l)` | `local_qpw_trylock` | [`PerCpu::try_lock_local`] | try the caller's CPU | same |
//! | `pw_lock(l, cpu)` | `qpw_lock` | [`PerCpu::lock`] | only from `cpu`'s own threads, else [`Error::NotLocal`] | from any thread |
//! | `pw_trylock(l, cpu)` | `qpw_trylock` | [`PerCpu::try_lock`] | as `lock` | as `lock` |
//! | `pw_lock(l, pw_get_cpu(w))` in a work function | same | [`PerCpu::lock_work`] | the worker's own CPU | the target CPU, from the caller |
//! | `*_irqsave` variants | same | none | userspace has no interrupts to mask | |
//! | per-CPU `struct pw_struct`, `INIT_PW` | `qpw_struct`, `INIT_QPW` | [`Qpw::work`] | one slot per CPU, preallocated | same |
//! | `pw_queue_on(cpu, wq, pw)` | `queue_percpu_work_on` | [`PerCpuWork::queue_on`] | post to the CPU's worker; `false` if already pending | run now in the caller; `true` |
//! | `pw_flush(pw)` | `flush_percpu_work` | [`PerCpuWork::flush`], [`PerCpuWork::flush_timeout`] | wait for the runs queued so far | nothing to wait for |
//! | `pw_get_cpu(work)` | `qpw_get_cpu` | [`WorkCtx::cpu`] | the worker's CPU | the target CPU |
//! | `pw_is_cpu_remote(cpu)` | none | [`Qpw::is_cpu_remote`], [`WorkCtx::is_remote`] | `false` | the caller is not one of `cpu`'s threads |
//! | `queue_work_on` kept in mode 1 (bh-LRU drain) | same | [`Qpw::work_on_cpu`] | queued | still queued |
//! | `for_each_cpu` queue, then flush each | same | [`PerCpuWork::drain_all`] | | |
//! | kworker bound to a CPU | same | the worker thread `qpw/<cpu>` | started at build | started only for [`Qpw::work_on_cpu`] items |
//! | `cpumask_any_housekeeping` | same | [`Topology::housekeeping_cpu`] | | |
//! | `smp_processor_id()` | same | [`rseq::current_cpu`], else [`current_cpu`] (`sched_getcpu`) | | |
//! | non-RT `local_lock` (`preempt_disable`) | same | [`RseqLock`] in [`Qpw::per_cpu_with`] | restartable sequence, plain stores | refused |
//! | none (userspace has no `preempt_disable`) | none | [`Mode::Fenced`] ([`Policy::Fenced`], [`Policy::FencedOn`]): [`Qpw::per_cpu`] slots get a [`FencedLock`]; [`PerCpu::bound_slot`] for a pinned thread's hot loop | | as remote mode, but the owner takes the lock with a restartable sequence; the caller raises a flag and waits for the CPU's answer, or fences it with `membarrier` |
//! | none (thread-per-core, Seastar) | none | [`Qpw::owned_per_cpu`], [`Owner::lock_local`], [`Owner::poll`] | one owner, work run at its poll | refused |
//! | the mm's concurrency id, `mm_cid` (`task_struct::mm_cid`, Linux 6.3; the kernel's own per-mm id, which rseq publishes) | none | [`Qpw::per_cid`], [`PerCid::lock_local`], [`cid::current`] | none: an id is no CPU a worker could run on | every walk ([`PerCid::for_each_locked`], [`PerCid::take_each`]) runs in the caller under each id's lock, over the ids used so far |
//!
//! # How the local lock excludes, in each mode, and what it costs
//!
//! Userspace has no `preempt_disable()`: two threads of one CPU can interleave, so even the
//! owner's path needs a real lock word. Every slot of a [`PerCpu`] is guarded by a
//! [`RawLocalLock`]; the default, [`PwLock`], takes the protocol of the slot's CPU's mode: in
//! queue and remote mode a [`FairLock`], one atomic word (`parking_lot`'s); in fenced mode a
//! [`FencedLock`]:
//!
//! - **Queue mode.** Only the CPU's own threads take the lock: its worker (which runs the
//!   queued work) and threads bound to or running on that CPU. The lock still matters, because
//!   the worker can be woken in the middle of another thread's critical section on the same
//!   CPU. It costs one uncontended compare-and-swap to take and one to release (a few
//!   nanoseconds: what PREEMPT_RT's `local_lock` pays), and the line stays in the CPU's cache.
//! - **Remote mode.** Any thread may take the lock, and a drain does: the cache line moves to
//!   the requester and back, once per drain, instead of a context switch on the target. The
//!   owner's fast path is the same compare-and-swap as in queue mode.
//! - **Fenced mode.** As remote mode, but the owner takes its CPU's lock with plain stores in
//!   a restartable sequence, and a requester on another CPU raises a flag and, before it may
//!   hold the lock, either gets the CPU's *answer* (an owner busy on its lock reads the flag
//!   and answers within a fraction of a microsecond: no interrupt) or fences that CPU with
//!   `membarrier` (an interrupt there, while a thread of this process runs on it): the
//!   owner's path loses its atomics, the requester's drain gains a short wait or a system call
//!   and an inter-processor interrupt ([`fenced_lock`] has the protocol and its argument). An
//!   owner that spends its time away from its locks answers from its loop with
//!   [`Binding::poll`], a load per call while nobody calls.
//!
//! Why the atomic word is correct: the word is changed only by atomic read-modify-write with acquire/release
//! ordering, so exclusion holds whatever CPUs the contenders run on, and the data written by
//! one holder is visible to the next. Why it stays bounded: a waiter spins only briefly and then
//! sleeps (a waiter on the same CPU as a preempted holder would otherwise spin against a thread
//! that cannot run), and every release hands the lock to the first sleeping waiter
//! (`unlock_fair`), so a thread that takes and drops the lock in a tight loop cannot starve the
//! worker. A quick prototype of this project measured a queue-mode drain against such a thread
//! at over a second with a spin-then-yield lock, about 3 ms (one scheduler slice) with a parking
//! lock and fair hand-off, and about 4 us for the same drain in remote mode.
//!
//! The lock is a type parameter, so cheaper owner paths come without touching callers;
//! [`RawRemoteLock`] marks the locks that may be taken from another CPU, and only those get
//! [`PerCpu::lock`] and [`PerCpu::for_each_locked`].
//!
//! # Faster local paths: three policies side by side
//!
//! A thread the framework has not bound first needs its CPU: [`rseq::current_cpu`] reads it
//! from the `struct rseq` glibc (2.35+) registers for every thread (one load from the thread
//! pointer, about half the cost of `sched_getcpu`); `lock_local` uses it, and `sched_getcpu`
//! where it is unavailable. Then the slot's local access, by policy:
//!
//! | policy | made by | how it excludes the CPU's threads | owner's acquire + release | reachable from another CPU | when unavailable |
//! |---|---|---|---|---|---|
//! | [`FairLock`] (default in queue and remote mode) | [`Qpw::per_cpu`] | one atomic word | two compare-and-swaps | yes: remote mode, `for_each_locked` | always available |
//! | [`RseqLock`] | [`Qpw::per_cpu_with`] | a restartable sequence whose last instruction, a plain store, the kernel aborts on preemption or migration | plain loads and stores, no atomic read-modify-write | no (queue mode only, no [`RawRemoteLock`]); a thread that finds itself elsewhere fences the CPU with `membarrier` first | falls back to the [`FairLock`] protocol, reported by [`rseq::status`] and [`Qpw::describe`] |
//! | [`FencedLock`] | [`Qpw::per_cpu`] on fenced-mode CPUs, or [`Qpw::per_cpu_with`] | the same restartable sequence as [`RseqLock`] | plain loads and stores, no atomic read-modify-write | yes: a requester raises a flag, waits briefly for the CPU's answer, else fences the one CPU with `membarrier` (aborting any sequence in flight there), then waits for a holder that had committed; remote-mode drains run in the requester, no worker | falls back to the [`FairLock`] protocol, as [`RseqLock`] does |
//! | owner-only | [`Qpw::owned_per_cpu`] | one owning thread per CPU ([`Owner`], `!Send`), enforced | a borrow flag: no lock word at all | no: work is posted to the CPU's mailbox and run by the owner when it polls | always available |
//! | per concurrency id | [`Qpw::per_cid`] | a [`FairLock`] per id's slot (an id changes hands when threads are descheduled, so two threads may reach one slot) | two compare-and-swaps | yes: every walk, from the caller | ids fall back to CPU numbers (kernel before 6.3, no rseq), reported by [`cid::status`] and [`Qpw::describe`] |
//!
//! Waiting is the same story in each: a waiter on the [`FairLock`] or the [`RseqLock`]
//! sleeps on a futex after a short spin (never spinning against a preempted holder of its own
//! CPU) and each release hands the lock to a sleeper; with owner-only there is nothing to wait
//! for locally, and a remote requester waits for the owner's next poll, or reports a
//! [`Error::Stall`] after its timeout, as in queue mode. The details and the correctness
//! argument of each are in [`RseqLock`], [`FencedLock`], [`rseq`] and [`OwnedPerCpu`].
//!
//! **What the owner's call pays, standalone and in a hot loop.** A *standalone* call, a
//! service's one update per request, pays the whole path every time: the thread's
//! registration (one compare and a few loads relative to the thread pointer), the lock's
//! acquire and release (two restartable sequences, or a [`FairLock`]'s two
//! compare-and-swaps), and what the compiler spends around a call that can fail and can
//! call out (a frame, saved registers, the `Result`). A *hot loop*, the same call inlined
//! into a loop that makes it again and again, pays less: the compiler hoists the
//! registration and the frame out of the loop. Beside them, the shortest path a per-CPU lock
//! can have here, a hand-written restartable sequence (`benches/floor.rs`: `cpu_id`, the
//! slot, the lock word, the operation, a plain release store; no waiters, no requesters).
//! Counted by `tests/owner_path` (uncontended, bound thread, `+= 1` on a `u64`, rustc 1.95)
//! and timed in criterion runs (`docs/results.md`, 1c and 6e: a shared 2-core VM, so ratios
//! only, each to about ±30 %, ranges where two runs disagreed):
//!
//! | the owner's call | atomics | standalone: instructions | standalone: time ÷ the floor's call | hot loop: time ÷ the floor's call |
//! |---|---|---|---|---|
//! | the floor (hand-written, for scale) | 0 | 14 | 1 | 0.6 |
//! | [`BoundSlot::lock`], fenced mode | 0 | 19 | 0.9 | 0.8 |
//! | [`PerCpu::lock_local`], fenced mode | 0 | 38-39 | 1.7 | 1.0 |
//! | [`PerCpu::lock_local`] of an [`RseqLock`] | 0 | 32-41 | 1.6-2.3 | 0.8-2.2 |
//! | [`PerCpu::lock_local`], queue or remote mode ([`FairLock`]) | 2 | 33 | 3.2-5.2 (1.4-1.8x a bare [`FairLock`]) | 3-5.5 |
//! | [`BoundSlot::lock`], queue or remote mode | 2 | 23 | not timed | not timed |
//!
//! The two counts of `lock_local` are two call sites: `?` (the error returned) and
//! `if let Ok(..)` (the `Result` dropped after the guard, so kept in memory). So: in a hot
//! loop on a pinned thread, take the slot once with [`PerCpu::bound_slot`]; a standalone
//! call on a fenced CPU costs under twice the hand-written floor, and a [`FairLock`]'s its
//! two compare-and-swaps.
//!
//! # Which call for which job
//!
//! Other CPUs' state is reached two ways: by *work* ([`PerCpuWork`]), which runs where the
//! CPU's mode says (its worker in queue mode, the caller in remote and fenced mode), or by a
//! *walk* ([`PerCpu::take_each`], [`PerCpu::for_each_locked`]), which takes each CPU's lock
//! from the calling thread in every mode. What each costs, and what to use for what:
//!
//! | job | call | queue mode | remote mode | fenced mode |
//! |---|---|---|---|---|
//! | the owner's own operation | [`PerCpu::lock_local`], or [`BoundSlot::lock`] in a pinned hot loop | two compare-and-swaps | the same | plain stores (restartable sequence) |
//! | the owner's loop between its operations, when it polls something else (a socket, a ring) | [`Binding::poll`] | nothing to answer: one load | the same | one load while nobody calls; when a requester has, the answer that spares the CPU its fence |
//! | a metrics scrape: read, take-and-reset, merge every CPU's state | [`PerCpu::take_each`] (collects), [`PerCpu::for_each_locked`] | the caller takes each lock; no worker woken; the owner waits only if it is inside its critical section (2.3 us p50 and no preemption for a scrape of two CPUs, in the client of issue 26) | the same | the same; flags raised at once, answered by busy owners, else one fence (an interrupt) per CPU |
//! | a drain that the kernel would queue (empty a cache, flush batches) | [`PerCpuWork::drain_all`] | posted to each CPU's worker and waited for: a context switch on each CPU (about 100 us and one preemption of the owner per scrape, in the same client) | run in the caller under each lock | the same, fenced |
//! | the same with a bound on the wait | [`PerCpuWork::drain_all_timeout`], then [`DrainReport::overran`] | stalls reported | lock waits reported | lock waits reported; a fence's system call is not interruptible |
//! | the same through work, returning what each CPU's run took (a scrape with the kernel's shape) | [`Qpw::collector`], [`Collector::collect_timeout`] | posted to each CPU's worker, as below | run in the caller under each lock | the same, fenced |
//! | work that must run on the CPU itself | [`Qpw::work_on_cpu`] | queued | queued too | queued too |
//! | final sums with a queue-only lock ([`RseqLock`]) | [`PerCpu::read_each`] | fences each other CPU | refused at build | refused at build |
//!
//! So a scrape should walk, in every mode: a drain through work in queue mode is what QPW
//! exists to avoid on an isolated CPU. Work is for jobs with the kernel's shape (the drain
//! runs the same code as a local flush), or that must run on the CPU.
//!
//! # Lifecycle and failure
//!
//! What happens at the edges: when the instance stops, when a deadline passes, when work
//! re-enters the framework, panics, or is dropped. The rule throughout: a clear error where
//! one can be given, never a silent hang where one can be avoided cheaply, and a documented
//! reason where it cannot.
//!
//! **Stopping.** [`Qpw`] is a handle; clones share the instance. [`Qpw::shutdown`] (from any
//! handle) or the drop of the last handle stops it: from that moment every `queue_on` and
//! every CPU of a `drain_all` is refused with [`Error::ShutDown`], in queue *and* remote mode
//! (remote runs pass through a gate that the stop closes, so none starts after it). Work
//! already queued still runs: each worker finishes its queue, then exits; an owner-only
//! mailbox keeps what it holds for its owner's next poll. `shutdown` waits for the workers
//! and for the remote runs already started in other threads, and reports what ran
//! ([`ShutdownReport`]). The drop does not wait: the dropping thread may hold a lock that
//! queued work needs, or be one of the instance's workers, and a drop cannot report a hang.
//! Called from inside a run of the instance, `shutdown` does not wait for itself (its own
//! worker's queue, the remote runs it is inside). [`PerCpu`] state and [`PerCpuWork`] items
//! outlive the instance safely; they only get `ShutDown`.
//!
//! **Deadlines.** [`PerCpuWork::drain_all_timeout`] keeps one deadline for the whole drain in
//! both modes: a queued CPU whose work has not run by then is an [`Error::Stall`]; a remote
//! run that cannot take its CPU's lock by then (another thread holds it, or the caller itself)
//! gets [`Error::LockStall`] from [`PerCpu::lock_work`], which is why `lock_work` returns a
//! `Result`; the run returns and the drain reports the stall for that CPU
//! ([`Error::is_stall`] covers both). Without a deadline (`queue_on`, `drain_all`) a remote
//! run waits for the lock as long as it is held.
//!
//! **Re-entrant work.** A work item may queue work, including itself. A flush that would wait
//! for the calling thread is refused with [`Error::SelfFlush`]: a work item on a CPU's worker
//! flushing a run still in that worker's queue (itself, or another item queued to the same
//! CPU), or an owner flushing its own mailbox while a run waits there; the run happens once
//! the current item returns (or at the owner's next poll).
//!
//! A thread that asks for a per-CPU lock it already holds would wait for itself; where that
//! can be told it gets [`Error::Reentrant`] instead, naming the CPU and both call sites. **In
//! every build**, release included, the *requester's* guards are known: a guard made by
//! [`PerCpu::lock`], [`PerCpu::try_lock`], [`PerCpu::lock_work`] or a walk
//! ([`PerCpu::for_each_locked`], [`PerCpu::take_each`], [`PerCpu::read_each`]) sits in a short
//! thread-local list (eight at once) until it is dropped, and `lock`, `lock_work` and the
//! walks refuse a lock on that list. That covers `lock` or a second `lock_work` inside
//! `lock_work` (a queue-mode worker's too), and, in remote and fenced mode, a run that happens
//! at once in a thread that holds its CPU's lock that way: work that queues itself on its own
//! CPU while it holds the lock, or a caller that holds it through `lock` and calls `queue_on`
//! or `drain_all` for that CPU (the run's `lock_work` is refused, and its `queue_on`, or the
//! drain's report for that CPU, returns the refusal). **Only in debug builds**, where every guard also records its
//! thread in the slot: a hold through the *owner's* calls ([`PerCpu::lock_local`],
//! [`PerCpu::try_lock_local`], [`BoundSlot::lock`]) asked for again by any call, and an
//! owner's call under a requester's hold. Why: those calls neither record nor look, so that
//! their release build runs no instruction it did not run before (`tests/owner_path` counts
//! them); and the lock word cannot stand in for a record, since it says that a thread of its
//! CPU holds it, not which one (another thread of that CPU, its worker or a second bound
//! thread, is waited for, not refused). In a release build those cases wait for themselves,
//! as a `Mutex` would, and a drain's deadline ends the wait with `LockStall`: run the tests of
//! owner code that might do this in a debug build. [`BoundSlot::lock`] and the
//! walks, which return no `Result`, panic with the refusal's message. Not detected in either:
//! a flush from a thread that holds the lock the flushed work needs waits for that work
//! forever; and two workers flushing each other's CPUs wait for each other (the kernel's
//! `flush_work` has the same hazards, which lockdep reports). Use `flush_timeout` and
//! `drain_all_timeout` where such a cycle is possible.
//!
//! **Panics** are caught and reported exactly once, to the call they belong to: a remote
//! run's to the `queue_on` or `drain_all` that ran it; a queued run's to the first flush that
//! covers it (with the number of runs that panicked since the last report); a run that panics
//! while `shutdown` waits for its worker, with no flush waiting, to the [`ShutdownReport`]. A
//! panic that no call collected before its item was dropped is printed to stderr.
//!
//! **Memory.** A work item reserves room in each worker's queue so that posting never
//! allocates, and gives it back when its last handle is dropped; dropping an item does not
//! cancel its queued runs. Creating and dropping items leaves the heap where it was.
//!
//! **Threads.** [`Qpw::bind_current`] returns a [`Binding`]; a thread may hold several, and
//! the newest alive is in force whatever order they are dropped in (so are owner claims,
//! which bind). [`Qpw::is_cpu_remote`] and [`WorkCtx::is_remote`] give the same answer: the
//! run happens on a thread that does not belong to the target CPU (the kernel's
//! `pw_is_cpu_remote`); [`WorkCtx::is_queued`] says instead whether the run went through the
//! CPU's queue or happened in the caller, wherever the caller runs.
//!
//! **Bad input.** A `remote:<list>` policy naming a CPU outside the managed set is
//! [`Error::PolicyCpuNotManaged`]; `is_cpu_remote` of an unmanaged CPU is
//! [`Error::CpuNotManaged`]; `lock_local` from a thread running on an unmanaged CPU is
//! [`Error::CallerNotManaged`], naming the caller's CPU. A sysfs root
//! ([`Builder::sysfs_root`]) is read only by a policy that needs the topology.
//!
//! # An example
//!
//! ```
//! use std::sync::Arc;
//! use qpw_core::{CpuSpec, Policy, Qpw};
//!
//! // Two logical CPUs, cpu 1 "isolated": remote mode there, queue mode on cpu 0.
//! let qpw = Qpw::builder()
//!     .cpus(CpuSpec::Logical(2))
//!     .policy(Policy::RemoteOn("1".parse()?))
//!     .build()?;
//! let cache = qpw.per_cpu(|_cpu| Vec::<u32>::new()); // a handle: clones share the slots
//!
//! // Each CPU's own threads fill their cache.
//! for cpu in 0..2 {
//!     let _bound = qpw.bind_current(cpu)?;
//!     cache.lock_local()?.extend([1, 2, 3]);
//! }
//!
//! // A drain: the work empties whichever CPU it runs for.
//! let sink = Arc::new(std::sync::Mutex::new(Vec::new()));
//! let (c, s) = (cache.clone(), sink.clone());
//! let drain = qpw.work(move |ctx| {
//!     let Ok(mut local) = c.lock_work(ctx) else {
//!         return; // only under a drain's deadline: the drain reports the stall
//!     };
//!     s.lock().unwrap().append(&mut local);
//! })?;
//! let report = drain.drain_all(|_cpu| true).into_result()?;
//! assert_eq!(report.queued.to_string(), "0"); // posted to cpu 0's worker
//! assert_eq!(report.ran_remote.to_string(), "1"); // run here, under cpu 1's lock
//! assert_eq!(sink.lock().unwrap().len(), 6);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs, unsafe_op_in_unsafe_fn)]

/// The workspace README's Rust snippet ("Using qpw-core"), run as a doctest so that it stays
/// true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeSnippet;

/// The crate's own README (what crates.io shows), run as a doctest so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct CrateReadme;

mod affinity;
pub mod cid;
mod collect;
mod cpuset;
pub mod cross_call;
mod error;
pub mod fenced_lock;
mod gate;
mod held;
mod instance;
mod mode;
pub mod owner;
mod per_cid;
mod percpu;
mod pw_lock;
mod raw_lock;
pub mod rseq;
pub mod rseq_lock;
pub mod sync;
mod topology;
mod work;

pub use affinity::{
    allowed_cpus, current_affinity, current_cpu, pin_current_thread, set_current_affinity,
    set_current_fifo, set_current_normal, set_pin_hook, PinHook,
};
pub use collect::Collector;
pub use cpuset::CpuSet;
pub use cross_call::{CallCtx, CallTarget, CrossCallError};
pub use error::{Error, OsError, Result};
pub use fenced_lock::FencedLock;
pub use instance::{Binding, Builder, CpuSpec, Qpw, ShutdownReport};
pub use mode::{Mode, Policy};
pub use owner::{OwnedGuard, OwnedPerCpu, Owner};
pub use per_cid::{CidGuard, PerCid};
pub use percpu::{BoundSlot, PerCpu, PerCpuGuard};
pub use pw_lock::PwLock;
pub use raw_lock::{FairLock, LocalAttempt, RawLocalLock, RawRemoteLock};
pub use rseq_lock::{LocalLockKind, Polled, RseqLock};
pub use topology::{FakeSysfs, Topology};
pub use work::{DrainReport, PerCpuWork, WorkCtx};
