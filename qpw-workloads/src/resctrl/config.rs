//! How a [`Resctrl`](super::Resctrl) is set up: the domain layout and the hardware's
//! parameters.

use std::time::Duration;

use qpw_core::sync::Arc;
use qpw_core::{CpuSet, Topology};

use super::bandwidth::BandwidthSource;
use super::interrupt::{RETARGETS, RETARGET_AFTER};
use super::read_path::ReadPath;
use super::{DEFAULT_MON_SCALE, MBM_CNTR_WIDTH_BASE, MBM_OVERFLOW_INTERVAL};

/// Where the L3 domains come from.
#[derive(Debug, Clone)]
pub enum DomainLayout {
    /// The machine's L3 domains (physical CPUs).
    Topology(Topology),
    /// Explicit domains of physical CPUs, disjoint, each allowed to the process.
    Physical(Vec<CpuSet>),
    /// `domains` domains of `cpus_per_domain` logical CPUs each, multiplexed onto the allowed
    /// physical CPUs (reports must say so).
    Emulated {
        /// Number of domains (1-256).
        domains: usize,
        /// CPUs per domain (1-64).
        cpus_per_domain: usize,
    },
}

impl DomainLayout {
    /// How many domains the layout has (for a topology: its L3 domains).
    pub fn domains(&self) -> usize {
        match self {
            DomainLayout::Topology(topology) => topology.l3_domains().len(),
            DomainLayout::Physical(domains) => domains.len(),
            DomainLayout::Emulated { domains, .. } => *domains,
        }
    }
}

/// How a [`Resctrl`](super::Resctrl) is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// The domains.
    pub layout: DomainLayout,
    /// Monitoring groups (RMIDs) available, including the root's RMID 0 (1-4096).
    pub num_rmids: u32,
    /// Counter width in bits (8-62): [`MBM_CNTR_WIDTH_BASE`], or + the AMD offset.
    pub counter_width: u32,
    /// Bytes per counter chunk (`mon_scale`, at least 1).
    pub mon_scale: u64,
    /// The overflow worker's period; `None`: it runs only when asked
    /// ([`Resctrl::run_overflow_now`](super::Resctrl::run_overflow_now)).
    pub overflow_interval: Option<Duration>,
    /// The traffic; `None`: only [`Resctrl::inject_traffic`](super::Resctrl::inject_traffic) moves the counters.
    pub bandwidth: Option<Arc<dyn BandwidthSource>>,
    /// How often the traffic thread applies the source.
    pub traffic_tick: Duration,
    /// The initial read path.
    pub read_path: ReadPath,
    /// How long a read waits for its worker or interrupt before it is an error.
    pub call_timeout: Duration,
    /// Assignable counters per domain (1-1024: `mbm_event` mode, AMD's ABMC has
    /// [`ABMC_COUNTERS`](super::ABMC_COUNTERS)), or `None` (the default: every event of every
    /// group is counted). See [`Resctrl::assign`](super::Resctrl::assign).
    pub assignable_counters: Option<u32>,
    /// The CPUs to treat as `nohz_full` (`None`: the machine's,
    /// `/sys/devices/system/cpu/nohz_full`, for a topology or physical layout; none for an
    /// emulated one). A domain's housekeeping CPU is its first CPU not in the set; a domain all
    /// of whose CPUs are in it is read by the interrupt (`smp_call_function_any`) on every path
    /// that would queue to a worker.
    pub nohz_full: Option<CpuSet>,
    /// How long an interrupt may wait to be claimed by the thread it was sent to before it is
    /// sent to the thread running on the CPU now (default [`RETARGET_AFTER`]).
    pub retarget_after: Duration,
    /// How many times an interrupt may be re-sent before the reader just waits for the last
    /// thread it went to (default [`RETARGETS`]: no limit but `call_timeout`).
    pub retargets: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            layout: DomainLayout::Emulated {
                domains: 2,
                cpus_per_domain: 1,
            },
            num_rmids: 256,
            counter_width: MBM_CNTR_WIDTH_BASE,
            mon_scale: DEFAULT_MON_SCALE,
            overflow_interval: Some(MBM_OVERFLOW_INTERVAL),
            bandwidth: None,
            traffic_tick: Duration::from_millis(10),
            read_path: ReadPath::Workqueue,
            call_timeout: Duration::from_secs(10),
            assignable_counters: None,
            nohz_full: None,
            retarget_after: RETARGET_AFTER,
            retargets: RETARGETS,
        }
    }
}
