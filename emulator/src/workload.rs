//! Which workload a run drives, and how it is built.
//!
//! The mm workloads come from `qpw-workloads` (one constructor per kernel subsystem); `counter`
//! is the emulator's own minimal workload ([`crate::counter`]), always available.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use anyhow::{bail, Result};
use qpw_core::Qpw;
use qpw_workloads::Workload;

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
}

impl WorkloadName {
    /// Every name, in the order the help lists them.
    pub const ALL: [WorkloadName; 5] = [
        WorkloadName::Lru,
        WorkloadName::Memcg,
        WorkloadName::Slub,
        WorkloadName::Pcp,
        WorkloadName::Counter,
    ];

    /// The mm workloads the default experiment runs.
    pub const DEFAULT_EXPERIMENT: [WorkloadName; 3] =
        [WorkloadName::Lru, WorkloadName::Memcg, WorkloadName::Slub];

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadName::Counter => "counter",
            WorkloadName::Lru => "lru",
            WorkloadName::Memcg => "memcg",
            WorkloadName::Slub => "slub",
            WorkloadName::Pcp => "pcp",
        }
    }

    /// Builds the workload over `qpw`'s CPUs.
    pub fn build(self, qpw: &Qpw) -> Result<Arc<dyn Workload>> {
        match self {
            WorkloadName::Counter => Ok(Arc::new(crate::counter::Counter::new(qpw)?)),
            other => not_built(other),
        }
    }

    /// The mm workload used when none is named: `lru` once it is built, else `counter`.
    pub fn default_mm() -> Self {
        if WorkloadName::Lru.available() {
            WorkloadName::Lru
        } else {
            WorkloadName::Counter
        }
    }

    /// Whether [`build`](Self::build) can make it in this build.
    pub fn available(self) -> bool {
        matches!(self, WorkloadName::Counter)
    }
}

fn not_built(name: WorkloadName) -> Result<Arc<dyn Workload>> {
    bail!(
        "workload `{}` is not built yet: qpw-workloads has no constructor for it in this \
         version (use --workload counter, the emulator's built-in minimal workload)",
        name.name()
    )
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
