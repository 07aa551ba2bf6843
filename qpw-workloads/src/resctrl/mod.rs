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
//!   housekeeping CPU, the kernel's `cpumask_any_housekeeping()`: its first CPU that is not
//!   `nohz_full` ([`Config::nohz_full`]), else its first.
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
//!   A worker (or an idle stand-in) that cannot pin itself where it must run is an error
//!   ([`ResctrlError::Pin`]), not a thread left running elsewhere.
//! - **Assignable counters** (AMD's ABMC, `mbm_event` mode, [`Config::assignable_counters`]):
//!   32 counters per domain; an MBM event without one reads `Unassigned`, and assigning one
//!   ([`Resctrl::assign`]) starts it from zero. See `abmc.rs`.
//! - **The hardware rule**: the read checks that it executes on a CPU of the counter's domain,
//!   and that the thread really runs there at that moment: the CPU it belongs to (its qpw
//!   binding, the worker's or the interrupted thread's CPU) must be in the domain, and
//!   `sched_getcpu()` must be that CPU's physical CPU, on emulated layouts too. A read from
//!   elsewhere would read another domain's counter on real hardware; here it returns
//!   [`ReadValue::Error`] and counts a [`Resctrl::violations`], which tests check.
//! - **Results** are the kernel's: a value, `Error`, `Unavailable` (the hardware's U bit) or
//!   `Unassigned` (an `mbm_event` counter not assigned, ABMC).
//! - **`rdtgroup_mutex`** is held across each file read; its hold time, and the reader's wait
//!   for another thread to execute the read, are recorded per read path, cheaply (see
//!   `stats.rs`); the reader's voluntary context switches and time off-CPU, once per pass.
//!
//! # The four read paths ([`ReadPath`])
//!
//! 1. **Workqueue** (`smp_call_on_cpu`): posted to the worker of the domain's housekeeping CPU
//!    ([`qpw_core::Qpw::work_on_cpu`], queued in every mode) and waited for; always, even when
//!    the reader is in the domain. Except, as in `mon_event_read`, when that CPU is `nohz_full`
//!    (every CPU of the domain is): then `smp_call_function_any`, an interrupt (or a direct
//!    read from inside the domain), never a worker.
//! 2. **Interrupt** (`smp_call_function_single`, Shakeel Butt's RFC with Reinette Chatre's
//!    reordering): the reader's own CPU when it is in the domain; otherwise the thread running on
//!    a CPU of the domain (housekeeping first) is interrupted with a signal
//!    ([`qpw_core::cross_call`]) and its async-signal-safe handler does the read (atomics only)
//!    while the reader spins. On a CPU with several threads, the one that runs now is
//!    signalled, and a call not claimed in time is sent to the next one (see `interrupt.rs`).
//!    A domain CPU with no registered thread gets an idle stand-in. A reader on a `nohz_full`
//!    CPU does not read in place, and an all-`nohz_full` domain takes `smp_call_function_any`.
//! 3. **Local** (Peter Newman's fast path): a reader bound inside the domain reads directly;
//!    any other reader falls back to the workqueue, as the patch does.
//! 4. **Cached** (per-group rate files): the overflow worker's latest value and rate, with its
//!    age; no cross-CPU work at all.
//!
//! Simplifications, said out loud: a root-group read returns RMID 0's own counts rather than
//! summing its children; a new group's counters are snapshotted at `mkdir` without a cross-CPU
//! read (the kernel's first `mon_event_read` does it in the domain); `cpus_read_lock` is not
//! modelled.
//!
//! # Where things are
//!
//! One concept per file: `model` (the domains, the framework instance, the threads it starts),
//! `hardware` (the counters and `resctrl_arch_rmid_read`), `groups` (`mkdir`/`rmdir`), `file`
//! (paths and `open`), `read` (`rdtgroup_mondata_show`, the local fast path, the hardware
//! rule), `workqueue`, `interrupt`, `overflow` (the overflow worker and the cache it keeps),
//! `abmc` (assignable counters), `bandwidth` (the traffic), `stats` (what the reads record),
//! `fastcat` (the reader), `load` (a fleet machine's load) and `figures` (seed 002's figures).

mod abmc;
mod bandwidth;
mod config;
mod error;
mod event;
mod fastcat;
#[cfg(not(loom))]
mod figures;
mod file;
mod groups;
mod hardware;
mod interrupt;
#[cfg(not(loom))]
mod load;
mod model;
mod overflow;
mod read;
mod read_path;
mod stats;
mod value;
mod workqueue;

pub use abmc::{ABMC_COUNTERS, MAX_ASSIGNABLE_COUNTERS};
pub use bandwidth::{BandwidthSource, ConstantBandwidth};
pub use config::{Config, DomainLayout};
pub use error::ResctrlError;
pub use event::Event;
pub use fastcat::{Fastcat, Pass};
#[cfg(not(loom))]
pub use figures::{
    measure_read_paths, one_domain_per_cpu, FiguresConfig, PathFigures, ResctrlFigures,
    SEED_002_FILES,
};
pub use file::MonFile;
pub use hardware::mbm_overflow_count;
pub use interrupt::{DomainThread, MAX_THREADS_PER_CPU, RETARGETS, RETARGET_AFTER};
#[cfg(not(loom))]
pub use load::{with_fleet_load, FleetLoad, LoadThreads};
pub use model::Resctrl;
pub use overflow::OverflowRuns;
pub use read_path::ReadPath;
pub use stats::{HoldStats, PathCounts};
pub use value::{Executor, MonRead, ReadValue};

use std::time::Duration;

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
