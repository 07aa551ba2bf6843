//! The pool figures: hackbench on each design at each thread count.

use qpw_core::CpuSpec;
#[cfg(not(loom))]
use qpw_core::Qpw;

#[cfg(not(loom))]
use super::design::build;
use super::design::Design;
#[cfg(not(loom))]
use super::error::PoolError;
#[cfg(not(loom))]
use super::hackbench::{hackbench, HackbenchConfig, HACKBENCH_DATASIZE};
use super::hackbench::{HackbenchReport, Transport};

/// What to measure with [`pool_figures`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolFiguresConfig {
    /// The CPUs (default: the allowed ones).
    pub cpus: CpuSpec,
    /// The designs, in order (default: all three).
    pub designs: Vec<Design>,
    /// Group counts to sweep (threads = groups x fds x 2; default 1, 2, 4).
    pub groups: Vec<usize>,
    /// Senders and receivers per group (default 4).
    pub fds: usize,
    /// Messages per sender per receiver (default 200).
    pub loops: usize,
    /// Buffer size in bytes (default 8192: AppArmor's 2 x `PATH_MAX`).
    pub buffer_size: usize,
    /// The most buffers designs 1 and 2 may allocate (default 4096).
    pub capacity: usize,
    /// Buffers per CPU for design 3 (default 64).
    pub per_cpu: usize,
    /// Pipes (default) or socketpairs.
    pub transport: Transport,
}

impl Default for PoolFiguresConfig {
    fn default() -> Self {
        Self {
            cpus: CpuSpec::Allowed,
            designs: Design::ALL.to_vec(),
            groups: vec![1, 2, 4],
            fds: 4,
            loops: 200,
            buffer_size: 8192,
            capacity: 4096,
            per_cpu: 64,
            transport: Transport::Pipe,
        }
    }
}

/// The pool figures: one hackbench run per design and group count.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolFigures {
    /// The framework instance's description (physical or logical CPUs).
    pub cpus: String,
    /// Whether the CPUs are logical.
    pub logical: bool,
    /// Per design (outer) and group count (inner).
    pub runs: Vec<HackbenchReport>,
}

#[cfg(not(loom))]
/// Runs hackbench on each design at each group count, on a fresh pool each time, and checks
/// conservation after each run.
pub fn pool_figures(config: &PoolFiguresConfig) -> Result<PoolFigures, PoolError> {
    let qpw = Qpw::builder()
        .cpus(config.cpus.clone())
        .policy(qpw_core::Policy::Remote)
        .build()?;
    let mut runs = Vec::new();
    for &design in &config.designs {
        for &groups in &config.groups {
            let pool = build(
                design,
                &qpw,
                config.buffer_size,
                config.capacity,
                config.per_cpu,
            )?;
            let report = hackbench(
                &qpw,
                &*pool,
                &HackbenchConfig {
                    groups,
                    fds: config.fds,
                    loops: config.loops,
                    datasize: HACKBENCH_DATASIZE,
                    transport: config.transport,
                },
            )?;
            if let Err(reason) = pool.check_conservation() {
                return Err(PoolError::Thread {
                    what: "conservation check",
                    reason,
                });
            }
            runs.push(report);
        }
    }
    Ok(PoolFigures {
        cpus: qpw.describe(),
        logical: qpw.is_logical(),
        runs,
    })
}
