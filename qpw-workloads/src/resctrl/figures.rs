//! The read-path figures of seed 002, measured on the model.
//!
//! Shakeel Butt's RFC measured, on a 316-CPU machine with busy target CPUs and readers copying
//! the fleet's agents: the `rdtgroup_mutex` hold per read (350 us -> 4 us average, 3.4 ms ->
//! 109 us worst), the time the reader was off-CPU while holding it (9 s per minute -> 0), and
//! one pass over 750 files (360 ms -> 7.4 ms). Peter Newman's fastcat (seed 000) separates the
//! setup (opening the files) from the reads, and measures a pass over the reader's own domain
//! (3.25 M -> 1.22 M cycles with the local fast path). [`measure_read_paths`] does all of that
//! for each [`ReadPath`]: a fleet load ([`FleetLoad`]: several busy threads) on every domain CPU
//! but the reader's, each registered as a thread the interrupt path may interrupt; a reader
//! bound to a CPU of domain 0 opening `groups x 3 events x domains` files once and reading
//! them pass after pass.
//!
//! The default layout is one domain per allowed physical CPU (at most ten), with as many
//! groups as make seed 002's 750 files: ten domains emulated with logical CPUs on a small
//! machine make every thread wait for a multiplexed core and measure the multiplexing, not
//! the read paths. With logical CPUs ([`ResctrlFigures::logical`] says so) compare the paths
//! with each other in one run, as ratios and counts, not with the seed's absolute numbers. The
//! figures' [`ResctrlFigures::notes`] say which caveats apply to a run.

use std::time::{Duration, Instant};

use qpw_core::sync::Arc;
use qpw_core::CpuSet;

use super::load::{with_fleet_load, FleetLoad, LoadThreads};
use super::stats::avg;
use super::{
    BandwidthSource, Config, ConstantBandwidth, DomainLayout, Event, Fastcat, PathCounts, ReadPath,
    Resctrl, ResctrlError, MBM_CNTR_WIDTH_BASE, MBM_OVERFLOW_INTERVAL,
};

/// Files in one pass in seed 002 (25 groups x 3 events x 10 domains).
pub const SEED_002_FILES: usize = 750;

/// The most domains [`FiguresConfig::default`] makes of the allowed CPUs (seed 002's ten).
const MAX_DEFAULT_DOMAINS: usize = 10;

/// One domain per allowed physical CPU, at most ten, or two emulated domains of one logical
/// CPU each when only one CPU is allowed (or the allowed set cannot be read).
pub fn one_domain_per_cpu() -> DomainLayout {
    match qpw_core::allowed_cpus() {
        Ok(allowed) if allowed.len() >= 2 => DomainLayout::Physical(
            allowed
                .iter()
                .take(MAX_DEFAULT_DOMAINS)
                .map(|cpu| CpuSet::from_iter([cpu]))
                .collect(),
        ),
        _ => DomainLayout::Emulated {
            domains: 2,
            cpus_per_domain: 1,
        },
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct FiguresConfig {
    /// The domains (default: [`one_domain_per_cpu`]).
    pub layout: DomainLayout,
    /// Monitoring groups read (1-4095; `None`, the default: as many as make
    /// [`SEED_002_FILES`] files over the layout's domains, at least one).
    pub groups: Option<usize>,
    /// Passes over all files per path (1-1000; default 2).
    pub passes: usize,
    /// The paths to measure, in order (default: all four).
    pub paths: Vec<ReadPath>,
    /// The load on every domain CPU but the reader's (default: eight busy threads per CPU,
    /// interruptible).
    pub load: FleetLoad,
    /// The reader's CPU (default: the first CPU of domain 0).
    pub reader_cpu: Option<usize>,
    /// The overflow worker's period (default 1000 ms, `MBM_OVERFLOW_INTERVAL`).
    pub overflow_interval: Duration,
    /// Counter width (default 24).
    pub counter_width: u32,
    /// The traffic.
    pub bandwidth: ConstantBandwidth,
    /// How long one read may wait for its worker or interrupt.
    pub call_timeout: Duration,
}

impl Default for FiguresConfig {
    fn default() -> Self {
        Self {
            layout: one_domain_per_cpu(),
            groups: None,
            passes: 2,
            paths: ReadPath::ALL.to_vec(),
            load: FleetLoad::default(),
            reader_cpu: None,
            overflow_interval: MBM_OVERFLOW_INTERVAL,
            counter_width: MBM_CNTR_WIDTH_BASE,
            bandwidth: ConstantBandwidth::default(),
            call_timeout: Duration::from_secs(10),
        }
    }
}

/// The figures of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResctrlFigures {
    /// The framework instance's description (physical or logical CPUs).
    pub cpus: String,
    /// Whether the CPUs are logical ones multiplexed onto fewer physical CPUs.
    pub logical: bool,
    /// L3 domains.
    pub domains: usize,
    /// Monitoring groups read.
    pub groups: usize,
    /// Events per group.
    pub events: usize,
    /// Files per pass (`groups x events x domains`).
    pub files: usize,
    /// The reader's CPU.
    pub reader_cpu: usize,
    /// The reader's domain.
    pub reader_domain: usize,
    /// The load asked for.
    pub load: FleetLoad,
    /// The CPUs that were loaded (every domain CPU but the reader's, if any load).
    pub loaded_cpus: Vec<usize>,
    /// Busy load threads in all.
    pub load_threads: usize,
    /// The overflow worker's period.
    pub overflow_interval: Duration,
    /// Per path, in the order asked for.
    pub paths: Vec<PathFigures>,
    /// Reads that executed outside their domain (must be 0).
    pub violations: u64,
    /// What to keep in mind when reading these figures (logical CPUs, no load).
    pub notes: Vec<String>,
}

/// The figures of one read path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathFigures {
    /// The path.
    pub path: ReadPath,
    /// Opening all files (fastcat with `FASTCAT_READ_COUNT=0`).
    pub setup: Duration,
    /// Passes over all files.
    pub passes: usize,
    /// Average time of one pass over all files.
    pub pass_avg: Duration,
    /// Longest pass over all files.
    pub pass_max: Duration,
    /// Files of the reader's own domain (Peter Newman's case).
    pub local_files: usize,
    /// Average pass over the reader's domain's files.
    pub local_pass_avg: Duration,
    /// File reads in the passes over all files.
    pub reads: u64,
    /// Average `rdtgroup_mutex` hold per read.
    pub hold_avg: Duration,
    /// Longest hold.
    pub hold_max: Duration,
    /// Reads executed by another thread (a worker or an interrupted thread).
    pub remote_reads: u64,
    /// Average wait of the reader for that other thread, mutex held, per remote read.
    pub executor_wait_avg: Duration,
    /// Longest such wait.
    pub executor_wait_max: Duration,
    /// Reads that had to wait for the mutex itself.
    pub mutex_waits: u64,
    /// Time the reader was off-CPU during the passes over all files (read once per pass).
    pub off_cpu: Duration,
    /// Voluntary context switches of the reader during those passes (`ru_nvcsw`).
    pub voluntary_switches: u64,
    /// How the reads were executed.
    pub counts: PathCounts,
    /// Times a thread on a domain CPU was interrupted to do a read (load threads and idle
    /// stand-ins).
    pub interruptions: u64,
    /// Of those, the idle stand-ins' (a domain with no registered thread).
    pub stand_in_interruptions: u64,
    /// Involuntary context switches of the load threads during the passes over all files (a
    /// worker, the reader or another load thread preempting them).
    pub load_involuntary_switches: u64,
    /// Average age of the values returned from the cache (cached path only).
    pub cached_age_avg: Option<Duration>,
    /// Oldest value returned from the cache.
    pub cached_age_max: Option<Duration>,
    /// Results that were not values.
    pub non_values: u64,
}

fn check(what: &'static str, value: usize, lo: usize, hi: usize) -> Result<(), ResctrlError> {
    if (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(ResctrlError::FiguresRange {
            what,
            value,
            lo,
            hi,
        })
    }
}

fn notes(resctrl: &Resctrl, config: &FiguresConfig, load_threads: usize) -> Vec<String> {
    let mut notes = Vec::new();
    if resctrl.qpw().is_logical() {
        notes.push(format!(
            "{} logical CPUs share the physical ones: a worker, an interrupted thread and the \
             reader each wait for their physical CPU, so compare paths within this run only",
            resctrl.qpw().cpus().len()
        ));
    }
    if load_threads == 0 {
        notes.push("no load threads: the domain CPUs were idle".to_string());
    } else if !config.load.interruptible {
        notes.push(
            "the load threads were not interruptible: the interrupt path signalled idle \
             stand-ins, which wait for their turn on the busy CPUs like a worker"
                .to_string(),
        );
    }
    notes
}

/// The groups to read: as asked, or as many as make [`SEED_002_FILES`] files.
fn groups_for(config: &FiguresConfig, domains: usize) -> Result<usize, ResctrlError> {
    let groups = config
        .groups
        .unwrap_or((SEED_002_FILES / (Event::ALL.len() * domains.max(1))).max(1));
    check("groups", groups, 1, 4095)?;
    Ok(groups)
}

/// Measures every asked-for read path: see the module docs. Each path costs `passes` passes
/// over all files plus `passes` over the reader's domain's files; with busy CPUs a workqueue
/// read waits for the scheduler's slice (milliseconds), so a default run takes seconds.
pub fn measure_read_paths(config: &FiguresConfig) -> Result<ResctrlFigures, ResctrlError> {
    check("passes", config.passes, 1, 1000)?;
    let groups = groups_for(config, config.layout.domains())?;
    let source: Arc<dyn BandwidthSource> = Arc::new(config.bandwidth);
    let resctrl = Resctrl::new(Config {
        layout: config.layout.clone(),
        num_rmids: groups as u32 + 1,
        counter_width: config.counter_width,
        overflow_interval: Some(config.overflow_interval),
        bandwidth: Some(source),
        call_timeout: config.call_timeout,
        ..Config::default()
    })?;
    let names: Vec<String> = (0..groups).map(|g| format!("g{g:03}")).collect();
    for name in &names {
        resctrl.mkdir(name)?;
    }
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let domains: Vec<usize> = (0..resctrl.nr_domains()).collect();
    let all_files = Resctrl::file_paths(&name_refs, &Event::ALL, &domains);

    let reader_cpu = match config.reader_cpu {
        Some(cpu) => cpu,
        None => resctrl.domain_cpus(0)?.first().unwrap_or(0),
    };
    let reader_domain = resctrl
        .domain_of(reader_cpu)
        .ok_or(ResctrlError::FiguresRange {
            what: "reader cpu",
            value: reader_cpu,
            lo: 0,
            hi: resctrl.qpw().cpus().last().unwrap_or(0),
        })?;
    let local_files = Resctrl::file_paths(&name_refs, &Event::ALL, &[reader_domain]);
    let loaded_cpus: Vec<usize> = if config.load.threads_per_cpu > 0 {
        resctrl
            .qpw()
            .cpus()
            .iter()
            .filter(|&c| c != reader_cpu && resctrl.domain_of(c).is_some())
            .collect()
    } else {
        Vec::new()
    };

    let resctrl = &resctrl;
    let (paths, load_threads) = with_fleet_load(resctrl, &loaded_cpus, config.load, |load| {
        // The reader is the calling thread, bound for the measurement only.
        let reader = || -> Result<Vec<PathFigures>, ResctrlError> {
            let _bound = resctrl.qpw().bind_current(reader_cpu)?;
            // A first sample for the cache (the rate files).
            resctrl.run_overflow_now();
            config
                .paths
                .iter()
                .map(|&path| measure_path(resctrl, config, path, &all_files, &local_files, load))
                .collect()
        };
        (reader(), load.len())
    })?;
    Ok(ResctrlFigures {
        cpus: resctrl.qpw().describe(),
        logical: resctrl.qpw().is_logical(),
        domains: resctrl.nr_domains(),
        groups,
        events: Event::ALL.len(),
        files: all_files.len(),
        reader_cpu,
        reader_domain,
        load: config.load,
        loaded_cpus,
        load_threads,
        overflow_interval: config.overflow_interval,
        paths: paths?,
        violations: resctrl.violations(),
        notes: notes(resctrl, config, load_threads),
    })
}

/// One path's figures: `passes` passes over every file, then over the reader's own domain.
fn measure_path(
    resctrl: &Resctrl,
    config: &FiguresConfig,
    path: ReadPath,
    all_files: &[String],
    local_files: &[String],
    load: &LoadThreads,
) -> Result<PathFigures, ResctrlError> {
    resctrl.set_read_path(path);
    let all = Fastcat::open(resctrl, all_files)?;
    let local = Fastcat::open(resctrl, local_files)?;
    let interruptions = || -> (u64, u64) {
        resctrl.qpw().cpus().iter().fold((0, 0), |(all, idle), c| {
            (
                all + resctrl.interruptions_on(c),
                idle + resctrl.stand_in_interruptions_on(c),
            )
        })
    };
    resctrl.reset_stats();
    let irq0 = interruptions();
    let nivcsw0 = load.involuntary_switches();
    let (mut total, mut max, mut off_cpu, mut voluntary_switches) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO, 0);
    for _ in 0..config.passes {
        let pass = all.pass()?;
        total += pass.elapsed;
        max = max.max(pass.elapsed);
        off_cpu += pass.off_cpu;
        voluntary_switches += pass.voluntary_switches;
    }
    let hold = resctrl.hold_stats(path);
    let counts = resctrl.path_counts();
    let irqs = interruptions();
    let load_involuntary_switches = load.involuntary_switches().saturating_sub(nivcsw0);
    let local_start = Instant::now();
    for _ in 0..config.passes {
        local.pass()?;
    }
    let local_total = local_start.elapsed();
    let cached = path == ReadPath::Cached && hold.reads > 0;
    Ok(PathFigures {
        path,
        setup: all.setup(),
        passes: config.passes,
        pass_avg: avg(total, config.passes as u64),
        pass_max: max,
        local_files: local.files().len(),
        local_pass_avg: avg(local_total, config.passes as u64),
        reads: hold.reads,
        hold_avg: hold.hold_avg(),
        hold_max: hold.hold_max,
        remote_reads: hold.remote_reads,
        executor_wait_avg: hold.executor_wait_avg(),
        executor_wait_max: hold.executor_wait_max,
        mutex_waits: hold.mutex_waits,
        off_cpu,
        voluntary_switches,
        counts,
        interruptions: irqs.0 - irq0.0,
        stand_in_interruptions: irqs.1 - irq0.1,
        load_involuntary_switches,
        cached_age_avg: cached.then(|| avg(hold.age_total, hold.reads)),
        cached_age_max: cached.then_some(hold.age_max),
        non_values: hold.non_values,
    })
}
