//! Everything that can go wrong in the resctrl model.

use qpw_core::cross_call::CrossCallError;
use qpw_core::CpuSet;

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
        /// [`MAX_RMIDS`](super::MAX_RMIDS).
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
    /// An assignable-counter count out of range.
    #[error("{counters} assignable counters per domain: the legal range is 1-1024")]
    AssignableCounters {
        /// The count given.
        counters: u32,
    },
    /// Counter assignment asked of a model that counts every event (not `mbm_event` mode).
    #[error(
        "counters are not assignable: the model counts every event (set \
         `Config::assignable_counters` for mbm_event mode)"
    )]
    NoAssignableCounters,
    /// Counter assignment asked for an event that has no assignable counter.
    #[error("`{event}` has no assignable counter: only mbm_total_bytes and mbm_local_bytes do")]
    NotAssignable {
        /// The event.
        event: super::Event,
    },
    /// Every counter of the domain is assigned.
    #[error("no free counter in domain {domain}: all {max} are assigned (unassign one first)")]
    NoFreeCounter {
        /// The domain.
        domain: usize,
        /// Its counters.
        max: usize,
    },
    /// A thread that must run on one CPU could not pin itself there.
    #[error("the {what} of cpu {cpu} could not pin itself to physical cpu {phys}: {reason}")]
    Pin {
        /// Which thread.
        what: &'static str,
        /// The CPU of the model it runs for.
        cpu: usize,
        /// The physical CPU it had to run on.
        phys: usize,
        /// The system's answer.
        reason: String,
    },
    /// Too many threads registered for one CPU.
    #[error(
        "cpu {cpu} has {max} threads registered for the interrupt path already: the most is {max}"
    )]
    TooManyThreads {
        /// The CPU.
        cpu: usize,
        /// [`MAX_THREADS_PER_CPU`](super::MAX_THREADS_PER_CPU).
        max: usize,
    },
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
