//! Which workload a run drives, and how it is built.
//!
//! The mm workloads come from `qpw-workloads` ([`qpw_workloads::build`], with the kernel's
//! default sizes and memcg's synchronous drain, see `options()`); `counter` is the emulator's
//! own minimal workload ([`crate::counter`]); the `kernel-*` workloads set off the running
//! kernel's own drains ([`crate::kernel`]).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use anyhow::{Context, Result};
use qpw_core::Qpw;
use qpw_workloads::memcg::StockDrainWait;
use qpw_workloads::{Workload, WorkloadKind, WorkloadOptions};

use crate::kernel::KernelDrain;

/// A workload name as the command line spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadName {
    /// The emulator's built-in per-CPU counter cache.
    Counter,
    /// LRU folio batches, `lru_add_drain_all` (`mm/swap.c`).
    Lru,
    /// memcg charge stock, `drain_all_stock` (`mm/memcontrol.c`).
    Memcg,
    /// SLUB sheaves, `flush_all` (`mm/slub.c`).
    Slub,
    /// Page-allocator pcp lists, `drain_all_pages` (`mm/page_alloc.c`).
    Pcp,
    /// The running kernel's own drain, set off from userspace ([`crate::kernel`]).
    Kernel(KernelDrain),
}

impl WorkloadName {
    /// Every name, in the order the help lists them.
    pub const ALL: [WorkloadName; 10] = [
        WorkloadName::Lru,
        WorkloadName::Memcg,
        WorkloadName::Slub,
        WorkloadName::Pcp,
        WorkloadName::Counter,
        WorkloadName::Kernel(KernelDrain::Lru),
        WorkloadName::Kernel(KernelDrain::Slub),
        WorkloadName::Kernel(KernelDrain::Vmstat),
        WorkloadName::Kernel(KernelDrain::Memcg),
        WorkloadName::Kernel(KernelDrain::Pcp),
    ];

    /// The mm workloads the default experiment runs: `pcp` is the emulated counterpart of the
    /// kernel's own mode 1 (`kernel-pcp`), so that the table holds both kernel modes beside
    /// both emulated ones.
    pub const DEFAULT_EXPERIMENT: [WorkloadName; 4] = [
        WorkloadName::Lru,
        WorkloadName::Memcg,
        WorkloadName::Slub,
        WorkloadName::Pcp,
    ];

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadName::Counter => "counter",
            WorkloadName::Lru => "lru",
            WorkloadName::Memcg => "memcg",
            WorkloadName::Slub => "slub",
            WorkloadName::Pcp => "pcp",
            WorkloadName::Kernel(k) => k.name(),
        }
    }

    /// The running kernel's drain, for a kernel workload.
    pub fn kernel(self) -> Option<KernelDrain> {
        match self {
            WorkloadName::Kernel(k) => Some(k),
            _ => None,
        }
    }

    /// Builds the workload over `qpw`'s CPUs.
    pub fn build(self, qpw: &Qpw) -> Result<Arc<dyn Workload>> {
        let kind = match self {
            WorkloadName::Counter => return Ok(Arc::new(crate::counter::Counter::new(qpw)?)),
            WorkloadName::Lru => WorkloadKind::Lru,
            WorkloadName::Memcg => WorkloadKind::Memcg,
            WorkloadName::Slub => WorkloadKind::Slub,
            WorkloadName::Pcp => WorkloadKind::Pcp,
            WorkloadName::Kernel(k) => {
                anyhow::bail!("`{k}` is the running kernel's own drain: it has no emulated cache")
            }
        };
        qpw_workloads::build(kind, qpw, &options())
            .with_context(|| format!("cannot build workload `{self}`"))
    }

    /// The mm workload used when none is named: `lru`.
    pub fn default_mm() -> Self {
        WorkloadName::Lru
    }
}

/// The kernel's sizes, with one change: memcg's `drain_all_stock` waits for the drain work it
/// queues ([`StockDrainWait::Flush`], ours; the kernel's returns once the work is queued), so
/// that the requester's drain time is, for memcg as for the other workloads, the time until
/// every stock the drain took on is drained, and a worker that cannot run shows as a stall.
fn options() -> WorkloadOptions {
    let mut options = WorkloadOptions::default();
    options.memcg.wait = StockDrainWait::Flush;
    options
}

impl fmt::Display for WorkloadName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WorkloadName {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown workload `{s}`: expected one of {}",
                    Self::ALL.map(|w| w.name()).join(", ")
                )
            })
    }
}
