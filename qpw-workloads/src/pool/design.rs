//! The three designs, by name, and building a pool of one.

use std::fmt;

use qpw_core::Qpw;

use super::buffer_pool::BufferPool;
use super::cache::CachePool;
use super::error::PoolError;
use super::global::GlobalPool;
use super::percpu_pools::PerCpuPools;

/// Which design a pool is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Design {
    /// One global list under one spinlock (df323337e507).
    GlobalLock,
    /// The global list plus a per-CPU cache used under contention (the 2023 patch).
    PerCpuCache,
    /// Per-CPU pools with lock-free return to the owning CPU (Desnoyers).
    PerCpuPools,
}

impl Design {
    /// Every design.
    pub const ALL: [Design; 3] = [Design::GlobalLock, Design::PerCpuCache, Design::PerCpuPools];

    /// The design's short name.
    pub fn name(self) -> &'static str {
        match self {
            Design::GlobalLock => "global",
            Design::PerCpuCache => "percpu-cache",
            Design::PerCpuPools => "percpu-pools",
        }
    }
}

impl fmt::Display for Design {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Builds a pool of `design` over `qpw`'s CPUs: `capacity` bounds designs 1 and 2,
/// `per_cpu` sizes design 3.
pub fn build(
    design: Design,
    qpw: &Qpw,
    size: usize,
    capacity: usize,
    per_cpu: usize,
) -> Result<Box<dyn BufferPool>, PoolError> {
    Ok(match design {
        Design::GlobalLock => Box::new(GlobalPool::new(size, capacity)?),
        Design::PerCpuCache => Box::new(CachePool::new(qpw, size, capacity)?),
        Design::PerCpuPools => Box::new(PerCpuPools::new(qpw, size, per_cpu)?),
    })
}
