//! resctrl monitoring: hardware counters that can only be read from a CPU of their L3 domain,
//! a global mutex held across every read, and the four ways of getting the read done there.
//!
//! # The problem
//!
//! Intel RDT and AMD PQoS count memory bandwidth (`mbm_total_bytes`, `mbm_local_bytes`) and
//! cache occupancy (`llc_occupancy`) per *monitoring group* (an RMID) and per L3 domain. The
//! counter is read with `wrmsr(QM_EVTSEL)` + `rdmsr(QM_CTR)`, which only reaches the counters of
//! the domain the CPU belongs to, so `mon_event_read()` must get the read done on a CPU of the
//! counter's domain, and it does so with `rdtgroup_mutex` held
//! (`rdtgroup_mondata_show` -> `rdtgroup_kn_lock_live`). Since commit 09909e098113
//! ("x86/resctrl: Queue mon_event_read() instead of sending an IPI", for MPAM, whose reads may
//! sleep) that is `smp_call_on_cpu()`: a kworker hop *always*, even for a reader already in the
//! domain, and a sleep with the mutex held until the scheduler runs the kworker on a busy CPU.
//! Seed 002 (Meta's fleet, 316-CPU AMD): reads held the mutex 350 us on average (worst 3.4 ms,
//! 9 s off-CPU per minute), and one pass over 750 files (25 groups x 3 events x 10 domains)
//! took 360 ms; reading by IPI instead gave 4 us (worst 109 us, no time off-CPU) and 7.4 ms.
//! Seed 000 (Peter Newman): a direct read for a reader bound inside the domain took a pass over
//! 250 groups from 3.25 M to 1.22 M cycles. The maintainer's answer (Reinette Chatre): per-group
//! *rate* files, computed by the 1 s overflow handler, read with no cross-CPU work at all.
//!
//! # The model
//!
//! - **Domains**: the L3 domains of the machine ([`DomainLayout::Topology`]), an explicit layout
//!   of physical CPUs ([`DomainLayout::Physical`], e.g. `{0}` and `{1}` on a 2-CPU box), or an
//!   emulated one of logical CPUs multiplexed onto the physical ones
//!   ([`DomainLayout::Emulated`], e.g. 32 domains of 8, as a dual-socket Zen2). Each domain has a
//!   housekeeping CPU, the kernel's `cpumask_any_housekeeping()`.
//! - **Counters** ([`Event`]): per (domain, RMID, event) the hardware counts bytes, driven by a
//!   [`BandwidthSource`] (a traffic thread adds `rate x dt` every tick) or by
//!   [`Resctrl::inject_traffic`]. The MSR shows the count in chunks of `mon_scale` bytes,
//!   truncated to `counter_width` bits: 24 (`MBM_CNTR_WIDTH_BASE`), 44 on AMD
//!   (`MBM_CNTR_WIDTH_OFFSET_AMD = 20`), so it wraps.
//! - **`resctrl_arch_rmid_read`** folds the wrap since the previous read of the same counter into
//!   a 64-bit total (`mbm_overflow_count`: `((cur << shift) - (prev << shift)) >> shift` with
//!   `shift = 64 - width`), so every read path returns monotone 64-bit values as long as some
//!   read happens once per wrap. The **overflow worker** (`mbm_handle_overflow`, a thread per
//!   domain pinned on its housekeeping CPU, every `MBM_OVERFLOW_INTERVAL` = 1000 ms) makes sure
//!   of that, and also keeps each counter's latest value and rate (bytes/s), the rate files.
//! - **The hardware rule**: the read checks that it executes on a CPU of the counter's domain (a
//!   thread's qpw binding, or `sched_getcpu()` for physical layouts; in the interrupt handler the
//!   CPU it interrupted). A read from elsewhere would read another domain's counter on real
//!   hardware; here it returns [`ReadValue::Error`] and counts a [`Resctrl::violations`], which
//!   tests check.
//! - **Results** are the kernel's: a value, `Error`, `Unavailable` (the hardware's U bit) or
//!   `Unassigned` (an `mbm_event` counter not assigned, ABMC).
//! - **`rdtgroup_mutex`** is held across each file read, and its hold time, the reader's
//!   voluntary context switches and time off-CPU while holding it are recorded per read path.
//!
//! # The four read paths ([`ReadPath`])
//!
//! 1. **Workqueue** (`smp_call_on_cpu`): posted to the worker of the domain's housekeeping CPU
//!    ([`qpw_core::Qpw::work_on_cpu`], queued in every mode) and waited for; always, even when
//!    the reader is in the domain.
//! 2. **Interrupt** (`smp_call_function_single`, Shakeel Butt's RFC with Reinette Chatre's
//!    reordering): the reader's own CPU when it is in the domain; otherwise the thread running on
//!    a CPU of the domain (housekeeping first) is interrupted with a signal
//!    ([`qpw_core::cross_call`]) and its async-signal-safe handler does the read (atomics only)
//!    while the reader spins (and, past 100 us, sleeps: the target is then waiting for a CPU,
//!    which a kernel IPI never does). A domain CPU with no registered thread gets an idle stand-in.
//! 3. **Local** (Peter Newman's fast path): a reader bound inside the domain reads directly;
//!    any other reader falls back to the workqueue, as the patch does.
//! 4. **Cached** (per-group rate files): the overflow worker's latest value and rate, with its
//!    age; no cross-CPU work at all.
//!
//! Simplifications, said out loud: a root-group read returns RMID 0's own counts rather than
//! summing its children; a new group's counters are snapshotted at `mkdir` without a cross-CPU
//! read (the kernel's first `mon_event_read` does it in the domain); `cpus_read_lock` is not
//! modelled.

#[cfg(not(loom))]
mod figures;

#[cfg(not(loom))]
pub use figures::{measure_read_paths, FiguresConfig, PathFigures, ResctrlFigures};

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use qpw_core::cross_call::{self, CallCtx, CallTarget, CrossCallError};
use qpw_core::sync::{
    thread, Arc, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering,
};
use qpw_core::{CpuSet, CpuSpec, PerCpuWork, Policy, Qpw, Topology};

/// `MBM_CNTR_WIDTH_BASE`: the width of an MBM counter on Intel (arch/x86/kernel/cpu/resctrl).
pub const MBM_CNTR_WIDTH_BASE: u32 = 24;
/// `MBM_CNTR_WIDTH_OFFSET_AMD`: AMD counters are 20 bits wider, 44 in all.
pub const MBM_CNTR_WIDTH_OFFSET_AMD: u32 = 20;
/// `MBM_OVERFLOW_INTERVAL`: the overflow handler's period, 1000 ms.
pub const MBM_OVERFLOW_INTERVAL: Duration = Duration::from_millis(1000);
/// The most monitoring groups (RMIDs) AMD offers; our upper bound.
pub const MAX_RMIDS: u32 = 4096;
/// Bytes per counter chunk (`mon_scale`) unless configured: one cache line.
pub const DEFAULT_MON_SCALE: u64 = 64;

/// A monitoring event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// `mbm_total_bytes`: all memory bandwidth.
    MbmTotalBytes,
    /// `mbm_local_bytes`: bandwidth to the local NUMA node.
    MbmLocalBytes,
    /// `llc_occupancy`: bytes of L3 held (a level, not a running count: it neither wraps nor
    /// grows monotonically).
    LlcOccupancy,
}

impl Event {
    /// Every event, in file order.
    pub const ALL: [Event; 3] = [
        Event::MbmTotalBytes,
        Event::MbmLocalBytes,
        Event::LlcOccupancy,
    ];

    /// The event's file name.
    pub fn name(self) -> &'static str {
        match self {
            Event::MbmTotalBytes => "mbm_total_bytes",
            Event::MbmLocalBytes => "mbm_local_bytes",
            Event::LlcOccupancy => "llc_occupancy",
        }
    }

    /// Whether it is a bandwidth counter (which wraps and has a rate).
    pub fn is_mbm(self) -> bool {
        !matches!(self, Event::LlcOccupancy)
    }

    fn idx(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Event {
    type Err = ResctrlError;

    fn from_str(s: &str) -> Result<Self, ResctrlError> {
        Event::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| ResctrlError::UnknownEvent {
                input: s.to_string(),
            })
    }
}

/// How a counter file read reaches the counter's domain: the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ReadPath {
    /// `smp_call_on_cpu`: a worker hop to the domain's housekeeping CPU, always.
    #[default]
    Workqueue,
    /// `smp_call_function_single`: the reader's CPU if in the domain, else a signal to the
    /// thread running on a domain CPU, whose handler reads while the reader spins.
    Interrupt,
    /// Direct when the reader is bound in the domain, else the workqueue.
    Local,
    /// The overflow worker's latest value and rate; no cross-CPU work.
    Cached,
}

impl ReadPath {
    /// Every path, in the order the figures report them.
    pub const ALL: [ReadPath; 4] = [
        ReadPath::Workqueue,
        ReadPath::Interrupt,
        ReadPath::Local,
        ReadPath::Cached,
    ];

    /// The path's name as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            ReadPath::Workqueue => "workqueue",
            ReadPath::Interrupt => "interrupt",
            ReadPath::Local => "local",
            ReadPath::Cached => "cached",
        }
    }

    fn idx(self) -> usize {
        self as usize
    }
}

impl fmt::Display for ReadPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReadPath {
    type Err = ResctrlError;

    fn from_str(s: &str) -> Result<Self, ResctrlError> {
        ReadPath::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| ResctrlError::UnknownPath {
                input: s.to_string(),
            })
    }
}

/// What a counter file shows, as the kernel prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadValue {
    /// Bytes.
    Value(u64),
    /// `Error`: the read failed (here: it ran outside the counter's domain, or the RMID is bad).
    Error,
    /// `Unavailable`: the hardware has no data (the U bit of `QM_CTR`).
    Unavailable,
    /// `Unassigned`: no hardware counter is assigned to this event (`mbm_event` mode).
    Unassigned,
}

impl ReadValue {
    /// The value, if there is one.
    pub fn value(self) -> Option<u64> {
        match self {
            ReadValue::Value(v) => Some(v),
            _ => None,
        }
    }

    fn encode(self) -> (u64, u64) {
        match self {
            ReadValue::Value(v) => (0, v),
            ReadValue::Error => (1, 0),
            ReadValue::Unavailable => (2, 0),
            ReadValue::Unassigned => (3, 0),
        }
    }

    fn decode(status: u64, value: u64) -> Self {
        match status {
            0 => ReadValue::Value(value),
            2 => ReadValue::Unavailable,
            3 => ReadValue::Unassigned,
            _ => ReadValue::Error,
        }
    }
}

impl fmt::Display for ReadValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadValue::Value(v) => write!(f, "{v}"),
            ReadValue::Error => f.write_str("Error"),
            ReadValue::Unavailable => f.write_str("Unavailable"),
            ReadValue::Unassigned => f.write_str("Unassigned"),
        }
    }
}

/// Who executed a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Executor {
    /// The reader itself, on `cpu` (local path, or the interrupt path's own-CPU case).
    Reader {
        /// The reader's CPU.
        cpu: usize,
    },
    /// The worker of `cpu` (workqueue path, or the local path's fallback).
    Worker {
        /// The worker's CPU.
        cpu: usize,
    },
    /// The handler of the thread running on `cpu`, interrupted by a signal.
    Interrupt {
        /// The CPU the interrupted thread is registered for.
        cpu: usize,
        /// The physical CPU the handler ran on, if known.
        phys_cpu: Option<usize>,
    },
    /// The overflow worker's cache: nothing ran for this read.
    Cache,
}

/// One file read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MonRead {
    /// What the file shows.
    pub value: ReadValue,
    /// Who read the counter.
    pub executor: Executor,
    /// The rate (bytes/s) over the last overflow period, for cached MBM reads.
    pub rate: Option<u64>,
    /// How old a cached value is.
    pub age: Option<Duration>,
}

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

/// Where the memory traffic counted by the hardware comes from.
pub trait BandwidthSource: Send + Sync + fmt::Debug {
    /// Bytes per second that `rmid` moves in `domain`: (total, local), local <= total.
    fn bandwidth(&self, domain: usize, rmid: u32) -> (u64, u64);
    /// Bytes of L3 that `rmid` holds in `domain`.
    fn occupancy(&self, domain: usize, rmid: u32) -> u64;
}

/// A steady source: RMID `r` moves `total_bytes_per_sec x (1 + r % 4)`, of which
/// `local_percent` % is local, and holds `occupancy_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConstantBandwidth {
    /// Bytes/s of an RMID with `r % 4 == 0`.
    pub total_bytes_per_sec: u64,
    /// The local share, 0-100.
    pub local_percent: u8,
    /// L3 occupancy of every RMID.
    pub occupancy_bytes: u64,
}

impl Default for ConstantBandwidth {
    fn default() -> Self {
        Self {
            total_bytes_per_sec: 1 << 30,
            local_percent: 75,
            occupancy_bytes: 4 << 20,
        }
    }
}

impl BandwidthSource for ConstantBandwidth {
    fn bandwidth(&self, _domain: usize, rmid: u32) -> (u64, u64) {
        let total = self.total_bytes_per_sec * (1 + u64::from(rmid % 4));
        let local = total / 100 * u64::from(self.local_percent.min(100));
        (total, local)
    }

    fn occupancy(&self, _domain: usize, _rmid: u32) -> u64 {
        self.occupancy_bytes
    }
}

/// How a [`Resctrl`] is set up.
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
    /// ([`Resctrl::run_overflow_now`]).
    pub overflow_interval: Option<Duration>,
    /// The traffic; `None`: only [`Resctrl::inject_traffic`] moves the counters.
    pub bandwidth: Option<Arc<dyn BandwidthSource>>,
    /// How often the traffic thread applies the source.
    pub traffic_tick: Duration,
    /// The initial read path.
    pub read_path: ReadPath,
    /// How long a read waits for its worker or interrupt before it is an error.
    pub call_timeout: Duration,
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
        }
    }
}

/// Everything that can go wrong in the resctrl model; each message names the bad input and the
/// legal range.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResctrlError {
    /// The layout has no domain.
    #[error("the domain layout has no L3 domain (the topology shows no L3 cache information)")]
    NoDomains,
    /// An emulated layout out of range.
    #[error(
        "{domains} emulated domains of {cpus_per_domain} CPUs: the legal ranges are 1-256 \
         domains of 1-64 CPUs"
    )]
    EmulatedLayout {
        /// Domains asked for.
        domains: usize,
        /// CPUs per domain asked for.
        cpus_per_domain: usize,
    },
    /// Physical domains that overlap or are empty.
    #[error("physical domain {domain} ({cpus}) is empty or overlaps an earlier one")]
    BadPhysicalDomain {
        /// The domain's index.
        domain: usize,
        /// Its CPUs.
        cpus: CpuSet,
    },
    /// An RMID count out of range.
    #[error("{rmids} RMIDs asked for: the legal range is 1-{max}")]
    Rmids {
        /// The count given.
        rmids: u32,
        /// [`MAX_RMIDS`].
        max: u32,
    },
    /// A counter width out of range.
    #[error("counter width {width} bits: the legal range is 8-62")]
    Width {
        /// The width given.
        width: u32,
    },
    /// A zero `mon_scale`.
    #[error("mon_scale 0: it must be at least 1 byte per chunk")]
    Scale,
    /// A group name that is empty or has a `/`.
    #[error("group name `{name}` is invalid: it must be non-empty and contain no `/`")]
    GroupName {
        /// The name given.
        name: String,
    },
    /// `mkdir` of a group that exists.
    #[error("monitoring group `{name}` already exists")]
    GroupExists {
        /// The name given.
        name: String,
    },
    /// Every RMID is in use.
    #[error("no free RMID: all {max} are in use (RMID 0 is the root group's)")]
    NoFreeRmid {
        /// The RMIDs configured.
        max: u32,
    },
    /// A group that does not exist.
    #[error("no monitoring group `{name}`")]
    NoSuchGroup {
        /// The name given.
        name: String,
    },
    /// A group removed after its file was opened.
    #[error("the monitoring group of `{path}` was removed after the file was opened")]
    GroupRemoved {
        /// The file's path.
        path: String,
    },
    /// A file path that does not name a counter file.
    #[error(
        "`{path}` is not a counter file: {reason} (expected \
         `mon_groups/<group>/mon_data/mon_L3_<dd>/<event>` or `mon_data/mon_L3_<dd>/<event>`)"
    )]
    BadPath {
        /// The path given.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A domain out of range.
    #[error("domain {domain} does not exist: the legal range is 0-{last}")]
    NoSuchDomain {
        /// The domain given.
        domain: usize,
        /// The last domain.
        last: usize,
    },
    /// An event name that is not one of ours.
    #[error("unknown event `{input}`: expected mbm_total_bytes, mbm_local_bytes or llc_occupancy")]
    UnknownEvent {
        /// The name given.
        input: String,
    },
    /// A read path name that is not one of ours.
    #[error("unknown read path `{input}`: expected workqueue, interrupt, local or cached")]
    UnknownPath {
        /// The name given.
        input: String,
    },
    /// The framework refused (CPUs, workers, a stalled worker).
    #[error(transparent)]
    Qpw(#[from] qpw_core::Error),
    /// The interrupt path failed (no target, a timeout).
    #[error(transparent)]
    CrossCall(#[from] CrossCallError),
    /// A figures parameter out of range.
    #[error("{what} {value} is out of range: the legal range is {lo}-{hi}")]
    FiguresRange {
        /// The parameter.
        what: &'static str,
        /// The value given.
        value: usize,
        /// The smallest legal value.
        lo: usize,
        /// The largest legal value.
        hi: usize,
    },
    /// A measurement thread panicked.
    #[error("the {what} thread panicked")]
    Panicked {
        /// Which thread.
        what: &'static str,
    },
    /// A helper thread could not be started.
    #[error("cannot start the {what} thread: {source}")]
    Spawn {
        /// Which thread.
        what: &'static str,
        /// The system's answer.
        source: std::io::Error,
    },
}

/// An open counter file: the fastcat `open()`, resolved once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonFile {
    path: String,
    rmid: u32,
    generation: u64,
    event: Event,
    domain: usize,
}

impl MonFile {
    /// The path it was opened by.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The group's RMID.
    pub fn rmid(&self) -> u32 {
        self.rmid
    }

    /// The event.
    pub fn event(&self) -> Event {
        self.event
    }

    /// The domain.
    pub fn domain(&self) -> usize {
        self.domain
    }
}

/// `rdtgroup_mutex` hold statistics of one read path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HoldStats {
    /// File reads.
    pub reads: u64,
    /// Total time the mutex was held by those reads.
    pub hold_total: Duration,
    /// The longest hold.
    pub hold_max: Duration,
    /// Voluntary context switches of the reader while holding it (`ru_nvcsw`).
    pub voluntary_switches: u64,
    /// Time the reader was off-CPU while holding it (hold time minus thread CPU time).
    pub off_cpu: Duration,
    /// Reads whose result was not a value.
    pub non_values: u64,
    /// Total age of the cached values returned (cached path).
    pub age_total: Duration,
    /// The oldest cached value returned.
    pub age_max: Duration,
}

impl HoldStats {
    /// Average hold per read.
    pub fn hold_avg(&self) -> Duration {
        avg(self.hold_total, self.reads)
    }
}

fn avg(total: Duration, n: u64) -> Duration {
    if n == 0 {
        Duration::ZERO
    } else {
        Duration::from_nanos((total.as_nanos() / u128::from(n)) as u64)
    }
}

/// How the reads were executed, since creation or the last [`Resctrl::reset_stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathCounts {
    /// Reads run by a worker (workqueue path and local fallbacks).
    pub worker_runs: u64,
    /// Reads run by interrupting a thread on a domain CPU.
    pub interrupts: u64,
    /// Reads the reader did itself (local path, interrupt path's own-CPU case).
    pub reader_direct: u64,
    /// Local-path reads that fell back to the workqueue (reader outside the domain).
    pub local_fallbacks: u64,
    /// Reads answered from the cache.
    pub cached: u64,
}

#[derive(Debug, Default)]
struct PathStats {
    reads: AtomicU64,
    hold_ns: AtomicU64,
    hold_max_ns: AtomicU64,
    nvcsw: AtomicU64,
    off_cpu_ns: AtomicU64,
    non_values: AtomicU64,
    age_ns: AtomicU64,
    age_max_ns: AtomicU64,
}

#[derive(Debug, Default)]
struct Counts {
    worker_runs: AtomicU64,
    interrupts: AtomicU64,
    reader_direct: AtomicU64,
    local_fallbacks: AtomicU64,
    cached: AtomicU64,
}

/// The overflow worker's last sample of one counter.
#[derive(Debug, Default)]
struct CacheEntry {
    value: AtomicU64,
    rate: AtomicU64,
    /// Nanoseconds since the epoch, plus one; 0: never sampled.
    at: AtomicU64,
}

/// The hardware and the arch layer's per-counter state. Everything a signal handler touches
/// is an atomic; the arch state (`prev_msr`, `chunks`) is only written under `rdtgroup_mutex`,
/// directly or by a handler a mutex holder is waiting for.
#[derive(Debug)]
struct Hardware {
    nr_domains: usize,
    nr_rmids: usize,
    width: u32,
    scale: u64,
    logical: bool,
    /// CPU -> domain (`usize::MAX`: none).
    domain_of: Vec<usize>,
    /// What the hardware has counted, in bytes, never truncated (occupancy: the level).
    truth: Box<[AtomicU64]>,
    /// `arch_mbm_state::prev_msr`.
    prev_msr: Box<[AtomicU64]>,
    /// `arch_mbm_state::chunks`, since the group's reset.
    chunks: Box<[AtomicU64]>,
    /// The untruncated chunk count at the group's reset, for [`Resctrl::source_bytes`].
    base_chunks: Box<[AtomicU64]>,
    unassigned: Box<[AtomicBool]>,
    unavailable: Box<[AtomicBool]>,
    cache: Box<[CacheEntry]>,
    /// Per RMID: whether a group owns it.
    active: Box<[AtomicBool]>,
    violations: AtomicU64,
    epoch: Instant,
}

fn atomics(n: usize) -> Box<[AtomicU64]> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

fn flags(n: usize) -> Box<[AtomicBool]> {
    (0..n).map(|_| AtomicBool::new(false)).collect()
}

/// `mbm_overflow_count`: chunks counted between two reads of a `width`-bit counter, assuming
/// it wrapped at most once.
#[inline]
pub fn mbm_overflow_count(prev_msr: u64, cur_msr: u64, width: u32) -> u64 {
    let shift = 64 - width;
    (cur_msr << shift).wrapping_sub(prev_msr << shift) >> shift
}

impl Hardware {
    #[inline]
    fn idx(&self, domain: usize, rmid: u32, event: Event) -> usize {
        (domain * self.nr_rmids + rmid as usize) * 3 + event.idx()
    }

    /// The value in `QM_CTR`: the count in chunks, truncated to the counter width.
    #[inline]
    fn msr(&self, i: usize) -> u64 {
        let chunks = self.truth[i].load(Ordering::Relaxed) / self.scale;
        chunks & ((1u64 << self.width) - 1)
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// `resctrl_arch_rmid_read`, executed on `on_cpu`. Async-signal-safe (atomics only): the
    /// interrupt path's handler calls it. The caller holds `rdtgroup_mutex` or is a handler a
    /// holder waits for.
    fn rmid_read(
        &self,
        on_cpu: Option<usize>,
        domain: usize,
        rmid: u32,
        event: Event,
    ) -> ReadValue {
        // The hardware rule: the MSRs of this CPU reach only its own domain's counters.
        let here = on_cpu.and_then(|c| self.domain_of.get(c).copied());
        if here != Some(domain) {
            self.violations.fetch_add(1, Ordering::Relaxed);
            return ReadValue::Error;
        }
        if domain >= self.nr_domains || rmid as usize >= self.nr_rmids {
            return ReadValue::Error;
        }
        let i = self.idx(domain, rmid, event);
        if self.unassigned[i].load(Ordering::Relaxed) {
            return ReadValue::Unassigned;
        }
        if self.unavailable[i].load(Ordering::Relaxed) {
            return ReadValue::Unavailable;
        }
        let msr = self.msr(i);
        if !event.is_mbm() {
            return ReadValue::Value(msr * self.scale);
        }
        // Fold the wrap since the last read of this counter into the 64-bit total.
        let prev = self.prev_msr[i].load(Ordering::Relaxed);
        let chunks =
            self.chunks[i].load(Ordering::Relaxed) + mbm_overflow_count(prev, msr, self.width);
        self.prev_msr[i].store(msr, Ordering::Relaxed);
        self.chunks[i].store(chunks, Ordering::Relaxed);
        ReadValue::Value(chunks * self.scale)
    }

    /// `resctrl_arch_reset_rmid` for every event of `rmid` in every domain (see the module
    /// docs: done without a cross-CPU read).
    fn reset_rmid(&self, rmid: u32) {
        for d in 0..self.nr_domains {
            for e in Event::ALL {
                let i = self.idx(d, rmid, e);
                // One load, so that the base and the MSR snapshot agree even while traffic
                // flows.
                let raw = self.truth[i].load(Ordering::Relaxed) / self.scale;
                self.base_chunks[i].store(raw, Ordering::Relaxed);
                self.prev_msr[i].store(raw & ((1u64 << self.width) - 1), Ordering::Relaxed);
                self.chunks[i].store(0, Ordering::Relaxed);
                self.unassigned[i].store(false, Ordering::Relaxed);
                self.unavailable[i].store(false, Ordering::Relaxed);
                let c = &self.cache[i];
                c.at.store(0, Ordering::Relaxed);
                c.value.store(0, Ordering::Relaxed);
                c.rate.store(0, Ordering::Relaxed);
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Group {
    name: String,
    generation: u64,
}

/// What `rdtgroup_mutex` guards.
#[derive(Debug)]
struct RdtState {
    /// Index: RMID. RMID 0 is the root group (name "").
    groups: Vec<Option<Group>>,
    next_generation: u64,
}

#[derive(Debug, Default)]
struct WqRequest {
    seq: u64,
    domain: usize,
    rmid: u32,
    event: Option<Event>,
    result: Option<(u64, ReadValue, Option<usize>)>,
}

#[derive(Debug)]
struct OverflowCtl {
    requested: Vec<u64>,
    done: Vec<u64>,
    runs: Vec<u64>,
    stop: bool,
}

#[derive(Debug)]
struct Domain {
    cpus: CpuSet,
    housekeeping: usize,
}

#[derive(Debug)]
struct Shared {
    hw: Hardware,
    domains: Vec<Domain>,
    /// The cross-call id space of this model's CPUs (registered threads).
    space: u64,
    /// Where the idle stand-ins register.
    idle_space: u64,
    /// The idle stand-ins started so far: their stop flags and threads.
    idle: Mutex<Vec<(Arc<AtomicBool>, thread::JoinHandle<()>)>>,
    rdtgroup_mutex: Mutex<RdtState>,
    wq: Mutex<WqRequest>,
    stats: [PathStats; 4],
    counts: Counts,
    overflow: Mutex<OverflowCtl>,
    overflow_cv: Condvar,
    stop: AtomicBool,
    call_timeout: Duration,
    interval: Option<Duration>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing we run under these locks leaves them inconsistent on a panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The resctrl model: domains, groups, counters, the overflow workers and the read paths.
/// See the module docs.
pub struct Resctrl {
    shared: Arc<Shared>,
    qpw: Qpw,
    read_work: PerCpuWork,
    path: AtomicUsize,
    threads: Vec<thread::JoinHandle<()>>,
}

impl fmt::Debug for Resctrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resctrl")
            .field("cpus", &self.qpw.describe())
            .field("domains", &self.shared.domains.len())
            .field("read_path", &self.read_path())
            .finish_non_exhaustive()
    }
}

impl Resctrl {
    /// Builds the model: the framework instance over the domains' CPUs, a worker per CPU for
    /// the workqueue path, an overflow thread per domain, and the traffic thread if a source
    /// is given.
    pub fn new(config: Config) -> Result<Self, ResctrlError> {
        if !(1..=MAX_RMIDS).contains(&config.num_rmids) {
            return Err(ResctrlError::Rmids {
                rmids: config.num_rmids,
                max: MAX_RMIDS,
            });
        }
        if !(8..=62).contains(&config.counter_width) {
            return Err(ResctrlError::Width {
                width: config.counter_width,
            });
        }
        if config.mon_scale == 0 {
            return Err(ResctrlError::Scale);
        }

        // The domains and the instance over their CPUs.
        let (domain_cpus, qpw, topology): (Vec<CpuSet>, Qpw, Option<Topology>) =
            match &config.layout {
                DomainLayout::Topology(topo) => {
                    let domains = topo.l3_domains().to_vec();
                    if domains.is_empty() {
                        return Err(ResctrlError::NoDomains);
                    }
                    let all = domains.iter().fold(CpuSet::new(), |a, d| a.union(d));
                    let qpw = Qpw::builder()
                        .cpus(CpuSpec::List(all))
                        .policy(Policy::Queue)
                        .build()?;
                    (domains, qpw, Some(topo.clone()))
                }
                DomainLayout::Physical(domains) => {
                    if domains.is_empty() {
                        return Err(ResctrlError::NoDomains);
                    }
                    let mut all = CpuSet::new();
                    for (i, d) in domains.iter().enumerate() {
                        if d.is_empty() || !d.intersection(&all).is_empty() {
                            return Err(ResctrlError::BadPhysicalDomain {
                                domain: i,
                                cpus: d.clone(),
                            });
                        }
                        all = all.union(d);
                    }
                    let qpw = Qpw::builder()
                        .cpus(CpuSpec::List(all))
                        .policy(Policy::Queue)
                        .build()?;
                    (domains.clone(), qpw, None)
                }
                &DomainLayout::Emulated {
                    domains,
                    cpus_per_domain,
                } => {
                    if !(1..=256).contains(&domains) || !(1..=64).contains(&cpus_per_domain) {
                        return Err(ResctrlError::EmulatedLayout {
                            domains,
                            cpus_per_domain,
                        });
                    }
                    let qpw = Qpw::builder()
                        .cpus(CpuSpec::Logical(domains * cpus_per_domain))
                        .policy(Policy::Queue)
                        .build()?;
                    let sets = (0..domains)
                        .map(|d| (d * cpus_per_domain..(d + 1) * cpus_per_domain).collect())
                        .collect();
                    (sets, qpw, None)
                }
            };

        // `cpumask_any_housekeeping`: from the topology when there is one, else from the CPUs
        // the instance treats as isolated.
        let domains: Vec<Domain> = domain_cpus
            .into_iter()
            .map(|cpus| {
                let hk = match &topology {
                    Some(t) => t.housekeeping_cpu(&cpus),
                    None => cpus
                        .iter()
                        .find(|&c| !qpw.isolated().contains(c))
                        .or_else(|| cpus.first()),
                };
                Domain {
                    housekeeping: hk.or_else(|| cpus.first()).unwrap_or(0),
                    cpus,
                }
            })
            .collect();

        let max_cpu = qpw.cpus().last().unwrap_or(0);
        let mut domain_of = vec![usize::MAX; max_cpu + 1];
        for (d, dom) in domains.iter().enumerate() {
            for c in dom.cpus.iter() {
                domain_of[c] = d;
            }
        }
        let nr_domains = domains.len();
        let nr_rmids = config.num_rmids as usize;
        let n = nr_domains * nr_rmids * 3;
        let hw = Hardware {
            nr_domains,
            nr_rmids,
            width: config.counter_width,
            scale: config.mon_scale,
            logical: qpw.is_logical(),
            domain_of,
            truth: atomics(n),
            prev_msr: atomics(n),
            chunks: atomics(n),
            base_chunks: atomics(n),
            unassigned: flags(n),
            unavailable: flags(n),
            cache: (0..n).map(|_| CacheEntry::default()).collect(),
            active: flags(nr_rmids),
            violations: AtomicU64::new(0),
            epoch: Instant::now(),
        };
        hw.active[0].store(true, Ordering::Relaxed);
        let mut groups = vec![None; nr_rmids];
        groups[0] = Some(Group {
            name: String::new(),
            generation: 0,
        });
        let space = cross_call::new_space();
        let shared = Arc::new(Shared {
            hw,
            space,
            idle_space: cross_call::new_space(),
            idle: Mutex::new(Vec::new()),
            rdtgroup_mutex: Mutex::new(RdtState {
                groups,
                next_generation: 1,
            }),
            wq: Mutex::new(WqRequest::default()),
            stats: Default::default(),
            counts: Counts::default(),
            overflow: Mutex::new(OverflowCtl {
                requested: vec![0; nr_domains],
                done: vec![0; nr_domains],
                runs: vec![0; nr_domains],
                stop: false,
            }),
            overflow_cv: Condvar::new(),
            stop: AtomicBool::new(false),
            call_timeout: config.call_timeout,
            interval: config.overflow_interval,
            domains,
        });

        // The workqueue path: `smp_call_on_cpu` is a work item that must run on its CPU.
        let s = shared.clone();
        let read_work = qpw.work_on_cpu(move |ctx| s.smp_mon_event_count(ctx.cpu()))?;

        let mut model = Self {
            shared,
            qpw,
            read_work,
            path: AtomicUsize::new(config.read_path.idx()),
            threads: Vec::new(),
        };

        // The overflow workers, one per domain, pinned on its housekeeping CPU.
        for d in 0..nr_domains {
            let hk = model.shared.domains[d].housekeeping;
            let phys = model.qpw.physical_cpu(hk)?;
            let s = model.shared.clone();
            let handle = thread::Builder::new()
                .name(format!("mbm_overflow/{d}"))
                .spawn(move || s.overflow_worker(d, hk, phys))
                .map_err(|source| ResctrlError::Spawn {
                    what: "overflow",
                    source,
                })?;
            model.threads.push(handle);
        }
        if let Some(source) = config.bandwidth {
            let s = model.shared.clone();
            let tick = config.traffic_tick.max(Duration::from_micros(100));
            let handle = thread::Builder::new()
                .name("resctrl-traffic".to_string())
                .spawn(move || s.traffic(&*source, tick))
                .map_err(|source| ResctrlError::Spawn {
                    what: "traffic",
                    source,
                })?;
            model.threads.push(handle);
        }
        Ok(model)
    }

    /// The framework instance over the domains' CPUs: bind readers and load threads with
    /// [`Qpw::bind_current`].
    pub fn qpw(&self) -> &Qpw {
        &self.qpw
    }

    /// The number of domains.
    pub fn nr_domains(&self) -> usize {
        self.shared.domains.len()
    }

    /// The CPUs of `domain`.
    pub fn domain_cpus(&self, domain: usize) -> Result<&CpuSet, ResctrlError> {
        Ok(&self.shared.domain(domain)?.cpus)
    }

    /// The housekeeping CPU of `domain` (where its worker reads and its overflow worker runs).
    pub fn housekeeping_cpu(&self, domain: usize) -> Result<usize, ResctrlError> {
        Ok(self.shared.domain(domain)?.housekeeping)
    }

    /// The domain `cpu` belongs to.
    pub fn domain_of(&self, cpu: usize) -> Option<usize> {
        self.shared
            .hw
            .domain_of
            .get(cpu)
            .copied()
            .filter(|&d| d != usize::MAX)
    }

    /// Registers the calling thread as the thread running on `cpu`: the interrupt path
    /// interrupts it to read that CPU's domain. Bind it to `cpu` first
    /// ([`Qpw::bind_current`]); its [`CallTarget::calls`] count its interruptions.
    pub fn register_current_thread(&self, cpu: usize) -> Result<CallTarget, ResctrlError> {
        self.qpw.physical_cpu(cpu)?;
        Ok(CallTarget::register(self.shared.space, cpu)?)
    }

    /// Interruptions of the threads registered now for `cpu` (idle stand-ins included).
    pub fn interruptions_on(&self, cpu: usize) -> u64 {
        cross_call::calls_on(self.shared.space, cpu)
            + cross_call::calls_on(self.shared.idle_space, cpu)
    }

    /// `mkdir mon_groups/<name>`: a new group on the lowest free RMID, its counters reset.
    pub fn mkdir(&self, name: &str) -> Result<u32, ResctrlError> {
        if name.is_empty() || name.contains('/') {
            return Err(ResctrlError::GroupName {
                name: name.to_string(),
            });
        }
        let mut state = lock(&self.shared.rdtgroup_mutex);
        if state.groups.iter().flatten().any(|g| g.name == name) {
            return Err(ResctrlError::GroupExists {
                name: name.to_string(),
            });
        }
        let Some(rmid) = state.groups.iter().position(Option::is_none) else {
            return Err(ResctrlError::NoFreeRmid {
                max: self.shared.hw.nr_rmids as u32,
            });
        };
        let generation = state.next_generation;
        state.next_generation += 1;
        state.groups[rmid] = Some(Group {
            name: name.to_string(),
            generation,
        });
        let rmid = rmid as u32;
        self.shared.hw.reset_rmid(rmid);
        self.shared.hw.active[rmid as usize].store(true, Ordering::Release);
        Ok(rmid)
    }

    /// `rmdir mon_groups/<name>`: frees the RMID; files opened on it read as an error.
    pub fn rmdir(&self, name: &str) -> Result<(), ResctrlError> {
        let mut state = lock(&self.shared.rdtgroup_mutex);
        let rmid = state
            .groups
            .iter()
            .position(|g| {
                g.as_ref()
                    .is_some_and(|g| g.name == name && !name.is_empty())
            })
            .ok_or_else(|| ResctrlError::NoSuchGroup {
                name: name.to_string(),
            })?;
        state.groups[rmid] = None;
        self.shared.hw.active[rmid].store(false, Ordering::Release);
        Ok(())
    }

    /// The paths of the counter files of `groups` x `events` x `domains`, in that nesting
    /// order (`mon_groups/<g>/mon_data/mon_L3_<dd>/<event>`; the root group is `""`).
    pub fn file_paths(groups: &[&str], events: &[Event], domains: &[usize]) -> Vec<String> {
        let mut paths = Vec::with_capacity(groups.len() * events.len() * domains.len());
        for g in groups {
            for &d in domains {
                for e in events {
                    paths.push(if g.is_empty() {
                        format!("mon_data/mon_L3_{d:02}/{e}")
                    } else {
                        format!("mon_groups/{g}/mon_data/mon_L3_{d:02}/{e}")
                    });
                }
            }
        }
        paths
    }

    /// Opens a counter file (`/sys/fs/resctrl/` may prefix the path).
    pub fn open(&self, path: &str) -> Result<MonFile, ResctrlError> {
        let bad = |reason: &str| ResctrlError::BadPath {
            path: path.to_string(),
            reason: reason.to_string(),
        };
        let rel = path.strip_prefix("/sys/fs/resctrl/").unwrap_or(path);
        let parts: Vec<&str> = rel.split('/').collect();
        let (group, rest) = match parts.as_slice() {
            ["mon_groups", g, rest @ ..] => (*g, rest),
            rest => ("", rest),
        };
        let [mon_data, dir, event] = rest else {
            return Err(bad("wrong number of components"));
        };
        if *mon_data != "mon_data" {
            return Err(bad("no `mon_data` directory"));
        }
        let domain: usize = dir
            .strip_prefix("mon_L3_")
            .and_then(|d| d.parse().ok())
            .ok_or_else(|| bad("the domain directory is not `mon_L3_<number>`"))?;
        let event: Event = event.parse()?;
        self.shared.domain(domain)?;
        let state = lock(&self.shared.rdtgroup_mutex);
        let (rmid, g) = state
            .groups
            .iter()
            .enumerate()
            .find_map(|(r, g)| g.as_ref().filter(|g| g.name == group).map(|g| (r, g)))
            .ok_or_else(|| ResctrlError::NoSuchGroup {
                name: group.to_string(),
            })?;
        Ok(MonFile {
            path: path.to_string(),
            rmid: rmid as u32,
            generation: g.generation,
            event,
            domain,
        })
    }

    /// The read path the switch is set to.
    pub fn read_path(&self) -> ReadPath {
        ReadPath::ALL[self.path.load(Ordering::Relaxed) % 4]
    }

    /// Sets the switch.
    pub fn set_read_path(&self, path: ReadPath) {
        self.path.store(path.idx(), Ordering::Relaxed);
    }

    /// Reads a counter file by the current path (`rdtgroup_mondata_show`).
    pub fn read(&self, file: &MonFile) -> Result<MonRead, ResctrlError> {
        self.read_with(file, self.read_path())
    }

    /// Reads a counter file by `path`, holding `rdtgroup_mutex` across the read and recording
    /// the hold in that path's [`HoldStats`].
    pub fn read_with(&self, file: &MonFile, path: ReadPath) -> Result<MonRead, ResctrlError> {
        let state = lock(&self.shared.rdtgroup_mutex);
        let probe = HoldProbe::start();
        let outcome = self.read_locked(&state, file, path);
        let stats = &self.shared.stats[path.idx()];
        probe.finish(stats);
        drop(state);
        let read = outcome?;
        if read.value.value().is_none() {
            stats.non_values.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(age) = read.age {
            let ns = age.as_nanos() as u64;
            stats.age_ns.fetch_add(ns, Ordering::Relaxed);
            stats.age_max_ns.fetch_max(ns, Ordering::Relaxed);
        }
        Ok(read)
    }

    fn read_locked(
        &self,
        state: &MutexGuard<'_, RdtState>,
        file: &MonFile,
        path: ReadPath,
    ) -> Result<MonRead, ResctrlError> {
        let alive = state
            .groups
            .get(file.rmid as usize)
            .and_then(Option::as_ref)
            .is_some_and(|g| g.generation == file.generation);
        if !alive {
            return Err(ResctrlError::GroupRemoved {
                path: file.path.clone(),
            });
        }
        let plain = |(value, executor)| MonRead {
            value,
            executor,
            rate: None,
            age: None,
        };
        match path {
            ReadPath::Workqueue => self.smp_call_on_cpu(file).map(plain),
            ReadPath::Local => match self.reader_cpu_in(file.domain) {
                Some(cpu) => {
                    self.shared
                        .counts
                        .reader_direct
                        .fetch_add(1, Ordering::Relaxed);
                    Ok(plain(self.mon_event_count_here(file, cpu)))
                }
                None => {
                    self.shared
                        .counts
                        .local_fallbacks
                        .fetch_add(1, Ordering::Relaxed);
                    self.smp_call_on_cpu(file).map(plain)
                }
            },
            ReadPath::Interrupt => self.smp_call_function_single(state, file).map(plain),
            ReadPath::Cached => Ok(self.read_cached(file)),
        }
    }

    /// The reader's CPU if it is pinned to one CPU of `domain` (bound with
    /// [`Qpw::bind_current`], or a physical layout's thread whose affinity is that one CPU):
    /// only then can it not leave the domain between the check and the read (the kernel's
    /// `get_cpu()`).
    fn reader_cpu_in(&self, domain: usize) -> Option<usize> {
        let cpu = if self.qpw.is_logical() {
            self.qpw.current_cpu()?
        } else {
            let affinity = qpw_core::current_affinity().ok()?;
            if affinity.len() != 1 {
                return None;
            }
            affinity.first()?
        };
        self.shared.domains[domain]
            .cpus
            .contains(cpu)
            .then_some(cpu)
    }

    /// The executing CPU of the calling thread as the hardware sees it.
    fn executing_cpu(&self) -> Option<usize> {
        self.qpw.current_cpu()
    }

    fn mon_event_count_here(&self, file: &MonFile, cpu: usize) -> (ReadValue, Executor) {
        let value =
            self.shared
                .hw
                .rmid_read(self.executing_cpu(), file.domain, file.rmid, file.event);
        (value, Executor::Reader { cpu })
    }

    /// Path 1: post the read to the housekeeping CPU's worker and sleep until it ran.
    fn smp_call_on_cpu(&self, file: &MonFile) -> Result<(ReadValue, Executor), ResctrlError> {
        let cpu = self.shared.domains[file.domain].housekeeping;
        let seq = {
            let mut req = lock(&self.shared.wq);
            req.seq += 1;
            req.domain = file.domain;
            req.rmid = file.rmid;
            req.event = Some(file.event);
            req.result = None;
            req.seq
        };
        self.read_work.queue_on(cpu)?;
        self.read_work
            .flush_timeout(cpu, self.shared.call_timeout)?;
        let mut req = lock(&self.shared.wq);
        match req.result.take() {
            Some((s, value, ran_on)) if s == seq => Ok((
                value,
                Executor::Worker {
                    cpu: ran_on.unwrap_or(cpu),
                },
            )),
            _ => Ok((ReadValue::Error, Executor::Worker { cpu })),
        }
    }

    /// Path 2: the reader's own CPU if it is in the domain, else interrupt the thread running
    /// on a CPU of the domain.
    fn smp_call_function_single(
        &self,
        state: &MutexGuard<'_, RdtState>,
        file: &MonFile,
    ) -> Result<(ReadValue, Executor), ResctrlError> {
        if let Some(cpu) = self.reader_cpu_in(file.domain) {
            self.shared
                .counts
                .reader_direct
                .fetch_add(1, Ordering::Relaxed);
            return Ok(self.mon_event_count_here(file, cpu));
        }
        let shared = &self.shared;
        let dom = &shared.domains[file.domain];
        // The housekeeping CPU's thread, else any domain CPU's, else an idle stand-in.
        let (space, cpu) = if cross_call::has_target(shared.space, dom.housekeeping) {
            (shared.space, dom.housekeeping)
        } else if let Some(c) = dom
            .cpus
            .iter()
            .find(|&c| cross_call::has_target(shared.space, c))
        {
            (shared.space, c)
        } else {
            self.ensure_idle_target(state, dom.housekeeping)?;
            (shared.idle_space, dom.housekeeping)
        };
        let request = IpiRequest {
            hw: &shared.hw,
            domain: file.domain,
            rmid: file.rmid,
            event: file.event,
            status: AtomicU64::new(1),
            value: AtomicU64::new(0),
        };
        // SAFETY: (1) `ipi_mon_event_count` is async-signal-safe: it calls
        // `Hardware::rmid_read`, which only loads and stores atomics and reads immutable
        // slices, and stores its result into atomics; (2) `request` lives on this stack frame
        // until `call_on` returns, which is after the call ran or was withdrawn.
        let report = unsafe {
            cross_call::call_on(
                space,
                cpu,
                ipi_mon_event_count,
                &request as *const IpiRequest<'_> as *const (),
                shared.call_timeout,
            )
        }?;
        shared.counts.interrupts.fetch_add(1, Ordering::Relaxed);
        let value = ReadValue::decode(
            request.status.load(Ordering::Acquire),
            request.value.load(Ordering::Relaxed),
        );
        Ok((
            value,
            Executor::Interrupt {
                cpu,
                phys_cpu: report.phys_cpu,
            },
        ))
    }

    /// Starts the idle stand-in of `cpu` if it has none: a thread pinned there, asleep, for
    /// the interrupt path to interrupt when no registered thread runs in the domain.
    fn ensure_idle_target(
        &self,
        _locked: &MutexGuard<'_, RdtState>,
        cpu: usize,
    ) -> Result<(), ResctrlError> {
        if cross_call::has_target(self.shared.idle_space, cpu) {
            return Ok(());
        }
        // `_locked` proves rdtgroup_mutex is held: the check above and the start below are
        // one step, so a CPU never gets two stand-ins.
        let phys = self.qpw.physical_cpu(cpu)?;
        let stop = Arc::new(AtomicBool::new(false));
        let ready = Arc::new(AtomicBool::new(false));
        let (s, r, space) = (stop.clone(), ready.clone(), self.shared.idle_space);
        let handle = thread::Builder::new()
            .name(format!("resctrl-idle/{cpu}"))
            .spawn(move || idle_stand_in(space, cpu, phys, &s, &r))
            .map_err(|source| ResctrlError::Spawn {
                what: "idle stand-in",
                source,
            })?;
        while !ready.load(Ordering::Acquire) {
            thread::yield_now();
        }
        lock(&self.shared.idle).push((stop, handle));
        Ok(())
    }

    /// Path 4: the overflow worker's latest value and rate, and its age.
    fn read_cached(&self, file: &MonFile) -> MonRead {
        let hw = &self.shared.hw;
        self.shared.counts.cached.fetch_add(1, Ordering::Relaxed);
        let entry = &hw.cache[hw.idx(file.domain, file.rmid, file.event)];
        let at = entry.at.load(Ordering::Acquire);
        if at == 0 {
            return MonRead {
                value: ReadValue::Unavailable,
                executor: Executor::Cache,
                rate: None,
                age: None,
            };
        }
        let age = Duration::from_nanos(hw.now_ns().saturating_sub(at - 1));
        MonRead {
            value: ReadValue::Value(entry.value.load(Ordering::Relaxed)),
            executor: Executor::Cache,
            rate: file
                .event
                .is_mbm()
                .then(|| entry.rate.load(Ordering::Relaxed)),
            age: Some(age),
        }
    }

    /// `resctrl_arch_rmid_read` on the calling thread, as it runs now, under `rdtgroup_mutex`:
    /// what a read path must never do from outside the domain. Returns
    /// [`ReadValue::Error`] and counts a violation when the thread is not on a CPU of the
    /// file's domain.
    pub fn arch_rmid_read(&self, file: &MonFile) -> ReadValue {
        let _state = lock(&self.shared.rdtgroup_mutex);
        self.shared
            .hw
            .rmid_read(self.executing_cpu(), file.domain, file.rmid, file.event)
    }

    /// Reads that executed outside their counter's domain (should stay 0).
    pub fn violations(&self) -> u64 {
        self.shared.hw.violations.load(Ordering::Relaxed)
    }

    /// The hold statistics of `path`.
    pub fn hold_stats(&self, path: ReadPath) -> HoldStats {
        let s = &self.shared.stats[path.idx()];
        let ns = |a: &AtomicU64| Duration::from_nanos(a.load(Ordering::Relaxed));
        HoldStats {
            reads: s.reads.load(Ordering::Relaxed),
            hold_total: ns(&s.hold_ns),
            hold_max: ns(&s.hold_max_ns),
            voluntary_switches: s.nvcsw.load(Ordering::Relaxed),
            off_cpu: ns(&s.off_cpu_ns),
            non_values: s.non_values.load(Ordering::Relaxed),
            age_total: ns(&s.age_ns),
            age_max: ns(&s.age_max_ns),
        }
    }

    /// How reads were executed.
    pub fn path_counts(&self) -> PathCounts {
        let c = &self.shared.counts;
        PathCounts {
            worker_runs: c.worker_runs.load(Ordering::Relaxed),
            interrupts: c.interrupts.load(Ordering::Relaxed),
            reader_direct: c.reader_direct.load(Ordering::Relaxed),
            local_fallbacks: c.local_fallbacks.load(Ordering::Relaxed),
            cached: c.cached.load(Ordering::Relaxed),
        }
    }

    /// Zeroes the hold statistics and path counts (not the violations).
    pub fn reset_stats(&self) {
        for s in &self.shared.stats {
            for a in [
                &s.reads,
                &s.hold_ns,
                &s.hold_max_ns,
                &s.nvcsw,
                &s.off_cpu_ns,
                &s.non_values,
                &s.age_ns,
                &s.age_max_ns,
            ] {
                a.store(0, Ordering::Relaxed);
            }
        }
        let c = &self.shared.counts;
        for a in [
            &c.worker_runs,
            &c.interrupts,
            &c.reader_direct,
            &c.local_fallbacks,
            &c.cached,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }

    /// Runs every domain's overflow worker once now and waits for all of them.
    pub fn run_overflow_now(&self) {
        let shared = &self.shared;
        let targets: Vec<u64> = {
            let mut ctl = lock(&shared.overflow);
            for r in ctl.requested.iter_mut() {
                *r += 1;
            }
            ctl.requested.clone()
        };
        shared.overflow_cv.notify_all();
        let mut ctl = lock(&shared.overflow);
        while !ctl.stop && ctl.done.iter().zip(&targets).any(|(d, t)| d < t) {
            ctl = shared
                .overflow_cv
                .wait(ctl)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// How many times `domain`'s overflow worker has run.
    pub fn overflow_runs(&self, domain: usize) -> u64 {
        lock(&self.shared.overflow)
            .runs
            .get(domain)
            .copied()
            .unwrap_or(0)
    }

    /// Adds traffic to `rmid` in `domain`: `total` bytes, of which `local` are local.
    pub fn inject_traffic(
        &self,
        rmid: u32,
        domain: usize,
        total: u64,
        local: u64,
    ) -> Result<(), ResctrlError> {
        self.shared.check_rmid(rmid, domain)?;
        self.shared
            .add_traffic(domain, rmid, total, local.min(total));
        Ok(())
    }

    /// Sets the L3 occupancy of `rmid` in `domain`.
    pub fn set_occupancy(&self, rmid: u32, domain: usize, bytes: u64) -> Result<(), ResctrlError> {
        self.shared.check_rmid(rmid, domain)?;
        let hw = &self.shared.hw;
        hw.truth[hw.idx(domain, rmid, Event::LlcOccupancy)].store(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// What the hardware has counted for `file` since its group was created, in bytes (a
    /// multiple of `mon_scale`): what a read must agree with. For `llc_occupancy`, the level.
    pub fn source_bytes(&self, file: &MonFile) -> u64 {
        let hw = &self.shared.hw;
        let i = hw.idx(file.domain, file.rmid, file.event);
        let raw = hw.truth[i].load(Ordering::Relaxed) / hw.scale;
        if file.event.is_mbm() {
            (raw - hw.base_chunks[i].load(Ordering::Relaxed)) * hw.scale
        } else {
            (raw & ((1u64 << hw.width) - 1)) * hw.scale
        }
    }

    /// Marks `file`'s counter unassigned (or assigned again): reads show `Unassigned`.
    pub fn set_unassigned(&self, file: &MonFile, unassigned: bool) {
        let hw = &self.shared.hw;
        hw.unassigned[hw.idx(file.domain, file.rmid, file.event)]
            .store(unassigned, Ordering::Relaxed);
    }

    /// Sets the hardware's Unavailable bit for `file`'s counter.
    pub fn set_unavailable(&self, file: &MonFile, unavailable: bool) {
        let hw = &self.shared.hw;
        hw.unavailable[hw.idx(file.domain, file.rmid, file.event)]
            .store(unavailable, Ordering::Relaxed);
    }
}

impl Drop for Resctrl {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        lock(&self.shared.overflow).stop = true;
        self.shared.overflow_cv.notify_all();
        for handle in self.threads.drain(..) {
            let _ = handle.join();
        }
        let idle = std::mem::take(&mut *lock(&self.shared.idle));
        for (stop, handle) in idle {
            stop.store(true, Ordering::Release);
            let _ = handle.join();
        }
    }
}

/// The interrupt path's request, lent to the handler on the reader's stack.
struct IpiRequest<'a> {
    hw: &'a Hardware,
    domain: usize,
    rmid: u32,
    event: Event,
    status: AtomicU64,
    value: AtomicU64,
}

/// The handler side of path 2 (`mon_event_count` in IPI context): async-signal-safe.
fn ipi_mon_event_count(ctx: &CallCtx, arg: *const ()) {
    // SAFETY: `smp_call_function_single` passes a pointer to an `IpiRequest` that outlives
    // the call (it waits for the call before returning).
    let req = unsafe { &*(arg as *const IpiRequest<'_>) };
    // Where the handler executes, as the hardware sees it: the physical CPU it interrupted,
    // or for logical layouts the CPU the interrupted thread is registered for.
    let on = if req.hw.logical {
        Some(ctx.cpu())
    } else {
        ctx.phys_cpu()
    };
    let (status, value) = req
        .hw
        .rmid_read(on, req.domain, req.rmid, req.event)
        .encode();
    req.value.store(value, Ordering::Relaxed);
    req.status.store(status, Ordering::Release);
}

fn idle_stand_in(space: u64, cpu: usize, phys: usize, stop: &AtomicBool, ready: &AtomicBool) {
    let _ = qpw_core::pin_current_thread(phys);
    let target = CallTarget::register(space, cpu);
    ready.store(true, Ordering::Release);
    let Ok(_target) = target else {
        return;
    };
    while !stop.load(Ordering::Acquire) {
        // Asleep like an idle CPU; a cross call interrupts the sleep and runs in the handler.
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 20_000_000,
        };
        // SAFETY: `ts` is a valid timespec; the remainder is not asked for.
        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
    }
}

impl Shared {
    fn domain(&self, domain: usize) -> Result<&Domain, ResctrlError> {
        self.domains
            .get(domain)
            .ok_or_else(|| ResctrlError::NoSuchDomain {
                domain,
                last: self.domains.len() - 1,
            })
    }

    fn check_rmid(&self, rmid: u32, domain: usize) -> Result<(), ResctrlError> {
        self.domain(domain)?;
        let active = self
            .hw
            .active
            .get(rmid as usize)
            .is_some_and(|a| a.load(Ordering::Acquire));
        if !active {
            return Err(ResctrlError::NoSuchGroup {
                name: format!("(rmid {rmid})"),
            });
        }
        Ok(())
    }

    fn add_traffic(&self, domain: usize, rmid: u32, total: u64, local: u64) {
        let hw = &self.hw;
        hw.truth[hw.idx(domain, rmid, Event::MbmTotalBytes)].fetch_add(total, Ordering::Relaxed);
        hw.truth[hw.idx(domain, rmid, Event::MbmLocalBytes)].fetch_add(local, Ordering::Relaxed);
    }

    /// The worker side of path 1 (`smp_mon_event_count`), on `cpu`'s worker.
    fn smp_mon_event_count(&self, cpu: usize) {
        self.counts.worker_runs.fetch_add(1, Ordering::Relaxed);
        let on = if self.hw.logical {
            Some(cpu)
        } else {
            qpw_core::current_cpu()
        };
        let mut req = lock(&self.wq);
        let Some(event) = req.event else {
            return;
        };
        let value = self.hw.rmid_read(on, req.domain, req.rmid, event);
        req.result = Some((req.seq, value, Some(cpu)));
    }

    /// The per-domain overflow worker: every interval (or when asked), `mbm_handle_overflow`.
    fn overflow_worker(&self, domain: usize, cpu: usize, phys: usize) {
        let _ = qpw_core::pin_current_thread(phys);
        let mut next = self.interval.map(|i| Instant::now() + i);
        loop {
            let target = {
                let mut ctl = lock(&self.overflow);
                loop {
                    if ctl.stop {
                        return;
                    }
                    if ctl.requested[domain] > ctl.done[domain] {
                        break;
                    }
                    match next {
                        Some(deadline) => {
                            let now = Instant::now();
                            if now >= deadline {
                                break;
                            }
                            ctl = self
                                .overflow_cv
                                .wait_timeout(ctl, deadline - now)
                                .map(|(g, _)| g)
                                .unwrap_or_else(|e| e.into_inner().0);
                        }
                        None => {
                            ctl = self
                                .overflow_cv
                                .wait(ctl)
                                .unwrap_or_else(|e| e.into_inner())
                        }
                    }
                }
                ctl.requested[domain]
            };
            let on = if self.hw.logical {
                Some(cpu)
            } else {
                qpw_core::current_cpu()
            };
            self.mbm_handle_overflow(domain, on);
            next = self.interval.map(|i| Instant::now() + i);
            let mut ctl = lock(&self.overflow);
            ctl.done[domain] = ctl.done[domain].max(target);
            ctl.runs[domain] += 1;
            drop(ctl);
            self.overflow_cv.notify_all();
        }
    }

    /// `mbm_handle_overflow` for one domain: under `rdtgroup_mutex`, read every active
    /// group's counters (folding wraps), and keep each one's value and rate for the cache.
    fn mbm_handle_overflow(&self, domain: usize, on: Option<usize>) {
        let _state = lock(&self.rdtgroup_mutex);
        let hw = &self.hw;
        for rmid in 0..hw.nr_rmids {
            if !hw.active[rmid].load(Ordering::Acquire) {
                continue;
            }
            for event in Event::ALL {
                let value = hw.rmid_read(on, domain, rmid as u32, event);
                let ReadValue::Value(v) = value else {
                    continue;
                };
                let now = hw.now_ns();
                let entry = &hw.cache[hw.idx(domain, rmid as u32, event)];
                let prev_at = entry.at.load(Ordering::Relaxed);
                if prev_at != 0 && event.is_mbm() {
                    let prev = entry.value.load(Ordering::Relaxed);
                    let dt = now.saturating_sub(prev_at - 1).max(1);
                    let rate = u128::from(v.saturating_sub(prev)) * 1_000_000_000 / u128::from(dt);
                    entry.rate.store(rate as u64, Ordering::Relaxed);
                }
                entry.value.store(v, Ordering::Relaxed);
                entry.at.store(now + 1, Ordering::Release);
            }
        }
    }

    /// The traffic thread: applies the bandwidth source every tick.
    fn traffic(&self, source: &dyn BandwidthSource, tick: Duration) {
        let mut last = Instant::now();
        let mut carry = vec![0u128; self.hw.nr_domains * self.hw.nr_rmids * 2];
        while !self.stop.load(Ordering::Acquire) {
            std::thread::sleep(tick);
            let now = Instant::now();
            // A starved traffic thread drops what it missed beyond a few ticks rather than
            // adding it in one burst: hardware counts continuously, and a burst of many
            // wraps at once would break the one-wrap-per-read premise of
            // `mbm_overflow_count` through no fault of the readers.
            let dt = now.duration_since(last).min(tick * 4).as_nanos();
            last = now;
            for d in 0..self.hw.nr_domains {
                for r in 0..self.hw.nr_rmids {
                    if !self.hw.active[r].load(Ordering::Acquire) {
                        continue;
                    }
                    let (total, local) = source.bandwidth(d, r as u32);
                    let k = (d * self.hw.nr_rmids + r) * 2;
                    // Keep the sub-byte remainders so that the long-run rate is exact.
                    let t = u128::from(total) * dt + carry[k];
                    let l = u128::from(local.min(total)) * dt + carry[k + 1];
                    carry[k] = t % 1_000_000_000;
                    carry[k + 1] = l % 1_000_000_000;
                    self.add_traffic(
                        d,
                        r as u32,
                        (t / 1_000_000_000) as u64,
                        (l / 1_000_000_000) as u64,
                    );
                    let occ = source.occupancy(d, r as u32);
                    let i = self.hw.idx(d, r as u32, Event::LlcOccupancy);
                    self.hw.truth[i].store(occ, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Measures one `rdtgroup_mutex` hold: wall time, voluntary context switches and thread CPU
/// time, so that time off-CPU is wall minus CPU.
struct HoldProbe {
    start: Instant,
    nvcsw: i64,
    cpu_ns: u64,
}

fn thread_nvcsw() -> i64 {
    // SAFETY: `rusage` is plain data; all-zero bytes are a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable `rusage`.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    ru.ru_nvcsw
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl HoldProbe {
    fn start() -> Self {
        Self {
            nvcsw: thread_nvcsw(),
            cpu_ns: thread_cpu_ns(),
            start: Instant::now(),
        }
    }

    fn finish(self, stats: &PathStats) {
        let wall = self.start.elapsed().as_nanos() as u64;
        let cpu = thread_cpu_ns().saturating_sub(self.cpu_ns);
        let switches = (thread_nvcsw() - self.nvcsw).max(0) as u64;
        stats.reads.fetch_add(1, Ordering::Relaxed);
        stats.hold_ns.fetch_add(wall, Ordering::Relaxed);
        stats.hold_max_ns.fetch_max(wall, Ordering::Relaxed);
        stats.nvcsw.fetch_add(switches, Ordering::Relaxed);
        stats
            .off_cpu_ns
            .fetch_add(wall.saturating_sub(cpu), Ordering::Relaxed);
    }
}

/// A fastcat-style reader (seed 000): opens a set of files once, then reads them all, pass
/// after pass; the setup is timed apart from the reads.
#[derive(Debug)]
pub struct Fastcat<'a> {
    resctrl: &'a Resctrl,
    files: Vec<MonFile>,
    setup: Duration,
}

/// One pass of a [`Fastcat`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    /// Wall time of the pass.
    pub elapsed: Duration,
    /// Files read.
    pub files: usize,
    /// Results that were not values.
    pub non_values: usize,
}

impl<'a> Fastcat<'a> {
    /// Opens `paths` (the setup: `FASTCAT_READ_COUNT=0`).
    pub fn open<S: AsRef<str>>(resctrl: &'a Resctrl, paths: &[S]) -> Result<Self, ResctrlError> {
        let start = Instant::now();
        let files = paths
            .iter()
            .map(|p| resctrl.open(p.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            resctrl,
            files,
            setup: start.elapsed(),
        })
    }

    /// How long opening the files took.
    pub fn setup(&self) -> Duration {
        self.setup
    }

    /// The open files.
    pub fn files(&self) -> &[MonFile] {
        &self.files
    }

    /// Reads every file once (the `pread` loop), by the current read path.
    pub fn pass(&self) -> Result<Pass, ResctrlError> {
        self.pass_with(|_, _| {})
    }

    /// Like [`pass`](Self::pass), handing each result to `seen`.
    pub fn pass_with(
        &self,
        mut seen: impl FnMut(&MonFile, &MonRead),
    ) -> Result<Pass, ResctrlError> {
        let start = Instant::now();
        let mut non_values = 0;
        for file in &self.files {
            let read = self.resctrl.read(file)?;
            if read.value.value().is_none() {
                non_values += 1;
            }
            seen(file, &read);
        }
        Ok(Pass {
            elapsed: start.elapsed(),
            files: self.files.len(),
            non_values,
        })
    }
}
