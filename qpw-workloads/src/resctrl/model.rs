//! The model itself: the domains, the framework instance over their CPUs, the shared state,
//! and the threads it starts.

use std::fmt;
use std::time::{Duration, Instant};

use qpw_core::sync::{
    thread, Arc, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering,
};
use qpw_core::{CpuSet, CpuSpec, PerCpuWork, Policy, Qpw, Topology};

use super::abmc::{CounterTable, MAX_ASSIGNABLE_COUNTERS};
use super::bandwidth::BandwidthSource;
use super::config::{Config, DomainLayout};
use super::error::ResctrlError;
use super::groups::{Group, RdtState};
use super::hardware::{atomics, flags, Hardware};
use super::interrupt::Targets;
use super::overflow::{CacheEntry, OverflowCtl};
use super::stats::Counts;
use super::workqueue::WqRequest;
use super::MAX_RMIDS;

/// One L3 domain: its CPUs and the one `cpumask_any_housekeeping()` picks.
#[derive(Debug)]
pub(super) struct Domain {
    pub(super) cpus: CpuSet,
    pub(super) housekeeping: usize,
    /// Every CPU of the domain is `nohz_full` (so is the housekeeping one): its reads take
    /// the interrupt (`smp_call_function_any`), never a worker.
    pub(super) all_nohz_full: bool,
}

/// What the model's threads share: the hardware, the domains, `rdtgroup_mutex` and the
/// bookkeeping of the read paths and the overflow workers.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) hw: Hardware,
    pub(super) domains: Vec<Domain>,
    /// The threads the interrupt path may interrupt.
    pub(super) targets: Targets,
    /// The CPUs treated as `nohz_full`.
    pub(super) nohz_full: CpuSet,
    /// Counters per domain in `mbm_event` mode (`Config::assignable_counters`).
    pub(super) assignable: Option<u32>,
    pub(super) rdtgroup_mutex: Mutex<RdtState>,
    pub(super) wq: Mutex<WqRequest>,
    pub(super) counts: Counts,
    pub(super) overflow: Mutex<OverflowCtl>,
    pub(super) overflow_cv: Condvar,
    pub(super) stop: AtomicBool,
    pub(super) call_timeout: Duration,
    /// `Config::retarget_after` and `Config::retargets`.
    pub(super) retarget: (Duration, u32),
    pub(super) interval: Option<Duration>,
}

/// What a thread that must run on one CPU reports once started: whether it could pin itself
/// there.
#[derive(Debug, Default)]
pub(super) struct Startup {
    outcome: Mutex<Option<Result<(), String>>>,
    reported: Condvar,
}

impl Startup {
    /// Said by the started thread.
    pub(super) fn report(&self, outcome: Result<(), String>) {
        *lock(&self.outcome) = Some(outcome);
        self.reported.notify_all();
    }

    /// Waits for the report.
    pub(super) fn wait(&self) -> Result<(), String> {
        let mut outcome = lock(&self.outcome);
        loop {
            if let Some(outcome) = outcome.take() {
                return outcome;
            }
            outcome = self
                .reported
                .wait(outcome)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing we run under these locks leaves them inconsistent on a panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The resctrl model: domains, groups, counters, the overflow workers and the read paths.
/// See the module docs.
pub struct Resctrl {
    pub(super) shared: Arc<Shared>,
    pub(super) qpw: Qpw,
    pub(super) read_work: PerCpuWork,
    pub(super) path: AtomicUsize,
    pub(super) threads: Vec<thread::JoinHandle<()>>,
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
        check(&config)?;
        let (domain_cpus, qpw, topology) = instance_over(&config.layout)?;
        let nohz_full = nohz_full_cpus(&config, topology.as_ref());
        let domains = with_housekeeping(domain_cpus, &nohz_full);
        let hw = Hardware::for_domains(&config, &qpw, &domains)?;
        let shared = Arc::new(Shared::new(&config, hw, domains, nohz_full));

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
        // The default group's events get their counters first (`mbm_event` mode).
        {
            let mut state = lock(&model.shared.rdtgroup_mutex);
            model.assign_on_mkdir(&mut state, 0);
        }
        // On an error from here, dropping `model` stops the threads already started.
        model.start_overflow_workers()?;
        if let Some(source) = config.bandwidth {
            model.start_traffic(source, config.traffic_tick)?;
        }
        Ok(model)
    }

    /// The overflow workers, one per domain, each pinned on its housekeeping CPU.
    fn start_overflow_workers(&mut self) -> Result<(), ResctrlError> {
        for d in 0..self.shared.domains.len() {
            let hk = self.shared.domains[d].housekeeping;
            let phys = self.qpw.physical_cpu(hk)?;
            let s = self.shared.clone();
            let startup = Arc::new(Startup::default());
            let report = startup.clone();
            let handle = thread::Builder::new()
                .name(format!("mbm_overflow/{d}"))
                .spawn(move || s.overflow_worker(d, hk, phys, &report))
                .map_err(|source| ResctrlError::Spawn {
                    what: "overflow",
                    source,
                })?;
            self.threads.push(handle);
            // A worker that could not pin itself to its housekeeping CPU would run, and read
            // counters, elsewhere: that is an error, not a detail (`new` stops the others).
            startup.wait().map_err(|reason| ResctrlError::Pin {
                what: "overflow worker",
                cpu: hk,
                phys,
                reason,
            })?;
        }
        Ok(())
    }

    /// The traffic thread: `source`'s bandwidth turned into counter increments every `tick`
    /// (at least 100 us).
    fn start_traffic(
        &mut self,
        source: Arc<dyn BandwidthSource>,
        tick: Duration,
    ) -> Result<(), ResctrlError> {
        let s = self.shared.clone();
        let tick = tick.max(Duration::from_micros(100));
        let handle = thread::Builder::new()
            .name("resctrl-traffic".to_string())
            .spawn(move || s.traffic(&*source, tick))
            .map_err(|source| ResctrlError::Spawn {
                what: "traffic",
                source,
            })?;
        self.threads.push(handle);
        Ok(())
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

    /// The CPUs treated as `nohz_full` ([`Config::nohz_full`]).
    pub fn nohz_full(&self) -> &CpuSet {
        &self.shared.nohz_full
    }

    /// The housekeeping CPU of `domain` (where its worker reads and its overflow worker runs):
    /// its first CPU that is not `nohz_full`, else its first CPU.
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
}

impl Drop for Resctrl {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        lock(&self.shared.overflow).stop = true;
        self.shared.overflow_cv.notify_all();
        for handle in self.threads.drain(..) {
            let _ = handle.join();
        }
        self.shared.targets.stop_idle();
    }
}

/// The configuration's numbers, each within the range the model supports.
fn check(config: &Config) -> Result<(), ResctrlError> {
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
    if let Some(counters) = config.assignable_counters {
        if !(1..=MAX_ASSIGNABLE_COUNTERS).contains(&counters) {
            return Err(ResctrlError::AssignableCounters { counters });
        }
    }
    Ok(())
}

/// The domains' CPUs and the framework instance over them (queue mode: the workqueue path's
/// worker per CPU), with the topology when the layout is the machine's.
fn instance_over(
    layout: &DomainLayout,
) -> Result<(Vec<CpuSet>, Qpw, Option<Topology>), ResctrlError> {
    let over = |cpus: CpuSpec| Qpw::builder().cpus(cpus).policy(Policy::Queue).build();
    match layout {
        DomainLayout::Topology(topo) => {
            let domains = topo.l3_domains().to_vec();
            if domains.is_empty() {
                return Err(ResctrlError::NoDomains);
            }
            let all = domains.iter().fold(CpuSet::new(), |a, d| a.union(d));
            Ok((domains, over(CpuSpec::List(all))?, Some(topo.clone())))
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
            Ok((domains.clone(), over(CpuSpec::List(all))?, None))
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
            let qpw = over(CpuSpec::Logical(domains * cpus_per_domain))?;
            let sets = (0..domains)
                .map(|d| (d * cpus_per_domain..(d + 1) * cpus_per_domain).collect())
                .collect();
            Ok((sets, qpw, None))
        }
    }
}

/// The CPUs treated as `nohz_full`: as configured, else the machine's for a topology or
/// physical layout, none for an emulated one.
fn nohz_full_cpus(config: &Config, topology: Option<&Topology>) -> CpuSet {
    match (&config.nohz_full, topology, &config.layout) {
        (Some(set), _, _) => set.clone(),
        (None, Some(t), _) => t.nohz_full().clone(),
        (None, None, DomainLayout::Physical(_)) => Topology::read()
            .map(|t| t.nohz_full().clone())
            .unwrap_or_else(|_| CpuSet::new()),
        (None, None, _) => CpuSet::new(),
    }
}

/// Each domain with its housekeeping CPU, as `cpumask_any_housekeeping` picks it: the first
/// CPU of the domain that is not `nohz_full`, else (every CPU is) the first CPU.
fn with_housekeeping(domain_cpus: Vec<CpuSet>, nohz_full: &CpuSet) -> Vec<Domain> {
    domain_cpus
        .into_iter()
        .map(|cpus| {
            let hk = cpus.iter().find(|&c| !nohz_full.contains(c));
            Domain {
                housekeeping: hk.or_else(|| cpus.first()).unwrap_or(0),
                all_nohz_full: hk.is_none(),
                cpus,
            }
        })
        .collect()
}

impl Hardware {
    /// The emulated hardware of `domains`: per domain, RMID and event, the counters and their
    /// reads' state, all zero; RMID 0 (the default group) active.
    fn for_domains(config: &Config, qpw: &Qpw, domains: &[Domain]) -> Result<Self, ResctrlError> {
        let max_cpu = qpw.cpus().last().unwrap_or(0);
        let mut domain_of = vec![usize::MAX; max_cpu + 1];
        let mut phys_of = vec![usize::MAX; max_cpu + 1];
        for (d, dom) in domains.iter().enumerate() {
            for c in dom.cpus.iter() {
                domain_of[c] = d;
                phys_of[c] = qpw.physical_cpu(c)?;
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
            domain_of,
            phys_of,
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
        Ok(hw)
    }
}

impl Shared {
    /// What the threads share, before any of them starts: `rdtgroup_mutex` with the default
    /// group alone, no work requested, the overflow workers not yet running.
    fn new(config: &Config, hw: Hardware, domains: Vec<Domain>, nohz_full: CpuSet) -> Self {
        let nr_domains = domains.len();
        let mut groups = vec![None; hw.nr_rmids];
        groups[0] = Some(Group {
            name: String::new(),
            generation: 0,
        });
        Shared {
            targets: Targets::new(hw.domain_of.len().saturating_sub(1)),
            hw,
            nohz_full,
            assignable: config.assignable_counters,
            rdtgroup_mutex: Mutex::new(RdtState {
                groups,
                next_generation: 1,
                stats: Default::default(),
                counters: config
                    .assignable_counters
                    .map(|n| CounterTable::new(nr_domains, n)),
            }),
            wq: Mutex::new(WqRequest::default()),
            counts: Counts::default(),
            overflow: Mutex::new(OverflowCtl::new(nr_domains)),
            overflow_cv: Condvar::new(),
            stop: AtomicBool::new(false),
            call_timeout: config.call_timeout,
            retarget: (config.retarget_after, config.retargets),
            interval: config.overflow_interval,
            domains,
        }
    }

    pub(super) fn domain(&self, domain: usize) -> Result<&Domain, ResctrlError> {
        self.domains
            .get(domain)
            .ok_or_else(|| ResctrlError::NoSuchDomain {
                domain,
                last: self.domains.len() - 1,
            })
    }

    pub(super) fn check_rmid(&self, rmid: u32, domain: usize) -> Result<(), ResctrlError> {
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
}
