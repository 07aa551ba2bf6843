//! Kernel-style per-CPU workloads, each written once against [`qpw_core`] and run unchanged in
//! every mode, as the kernel's QPW patches convert `mm/swap.c`, `mm/memcontrol.c` and
//! `mm/slub.c` without forking them per mode.
//!
//! | module | kernel source | per-CPU cache | requester drain |
//! |---|---|---|---|
//! | [`lru`] | `mm/swap.c` | folio batches | `lru_add_drain_all` |
//! | [`memcg`] | `mm/memcontrol.c` | charge stock | `drain_all_stock` |
//! | [`slub`] | `mm/slub.c` | sheaves | `flush_all` |
//! | [`pcp`] | `mm/page_alloc.c` | pcp lists | `drain_all_pages` |
//! | [`resctrl`] | `arch/x86/kernel/cpu/resctrl`, `fs/resctrl` | none: per-domain counters | `mon_event_read` |
//! | [`pool`] | `security/apparmor/lsm.c` | buffer caches | none: remote frees |
//!
//! The mm workloads share one driving interface, [`Workload`], which the emulator uses: a
//! process-context operation on the calling CPU, a requester drain, per-CPU counters, and the
//! workload's conservation law.

#![warn(missing_docs, unsafe_op_in_unsafe_fn)]

pub mod lru;
pub mod memcg;
pub mod pcp;
pub mod pool;
pub mod resctrl;
pub mod slub;

use std::time::Duration;

/// What the emulator can do with an mm workload.
pub trait Workload: Send + Sync + std::fmt::Debug {
    /// The workload's short name (`lru`, `memcg`, `slub`, `pcp`).
    fn name(&self) -> &'static str;

    /// One process-context operation on the calling thread's CPU (the thread is bound to, or
    /// runs on, a CPU of the instance): adds a folio, charges a page, allocates or frees an
    /// object, allocates or frees a page.
    fn process_op(&self) -> qpw_core::Result<()>;

    /// One requester drain of every CPU, as the kernel's drain-all function does it.
    /// `force` drains every CPU even when its cache looks empty and never skips the whole
    /// drain (as `lru_cache_disable` does), so that a drain always reaches every CPU;
    /// `timeout` bounds the wait for queued work (a CPU past it is reported as stalled).
    fn drain(&self, force: bool, timeout: Option<Duration>) -> DrainOutcome;

    /// Each CPU's counters, in CPU order.
    fn counters(&self) -> Vec<CpuCounters>;

    /// Checks the workload's conservation law (every item in exactly one place); the error
    /// says what is missing or counted twice. Call it when no operation is in flight.
    fn check_conservation(&self) -> Result<(), String>;
}

/// One CPU's counters, as the emulator reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuCounters {
    /// The CPU.
    pub cpu: usize,
    /// Process-context operations done on this CPU.
    pub local_ops: u64,
    /// Drains of this CPU run remotely, by the requester under this CPU's lock.
    pub drains_remote: u64,
    /// Drains of this CPU queued to its worker.
    pub drains_queued: u64,
    /// Drains that left this CPU alone (empty cache, or a strategy that skips it).
    pub drains_skipped: u64,
    /// Items a skipped drain left behind in this CPU's cache (pages, folios, objects).
    pub stranded: u64,
}

/// What one requester drain did.
#[derive(Debug, Default)]
pub struct DrainOutcome {
    /// CPUs whose drain was queued to their worker.
    pub queued: usize,
    /// CPUs drained remotely by the requester.
    pub ran_remote: usize,
    /// CPUs left alone.
    pub skipped_cpus: usize,
    /// Whether the whole drain returned at once (a newer generation already drained, or
    /// another drain was running).
    pub skipped: bool,
    /// Stalls, panics and refusals, one per CPU at most.
    pub errors: Vec<qpw_core::Error>,
}
