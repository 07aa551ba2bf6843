//! The read-path figures of seed 002, measured on the model.
//!
//! Shakeel Butt's RFC measured, with the domain CPUs busy and readers copying the fleet's
//! agents: the `rdtgroup_mutex` hold per read (350 us -> 4 us average, 3.4 ms -> 109 us worst),
//! the time the reader was off-CPU while holding it (9 s per minute -> 0), and one pass over
//! 750 files (360 ms -> 7.4 ms). Peter Newman's fastcat (seed 000) separates the setup (opening
//! the files) from the reads, and measures a pass over the reader's own domain (3.25 M -> 1.22
//! M cycles with the local fast path). [`measure_read_paths`] does all of that for each
//! [`ReadPath`]: a busy load thread on every domain CPU but the reader's, each registered as
//! the thread the interrupt path interrupts; a reader bound to a CPU of domain 0 opening
//! `groups x 3 events x domains` files once and reading them pass after pass.
//!
//! On a machine with fewer CPUs than the layout, the CPUs are logical ones multiplexed onto the
//! physical ones ([`ResctrlFigures::logical`] says so): a worker or an interrupted thread then
//! waits for the physical CPU like everything else, so compare the paths with each other in one
//! run, as ratios and counts, not with the seed's absolute numbers. On a small machine a
//! [`DomainLayout::Physical`] layout of one CPU per domain (`{0}`, `{1}`) is the faithful one:
//! each load thread then really is the thread running on its CPU, and a signal reaches it at
//! once, as an IPI would. On this project's 2-CPU VM that layout gave, per read (one run,
//! 25 groups, 150 files): workqueue 34 us average hold (3.9 ms worst, off-CPU while holding),
//! interrupt 8 us (65 us worst, never off-CPU), cached 0.1 us; the seed's 350 us -> 4 us.
//! The figures' [`ResctrlFigures::notes`] say which caveats apply to a run.

use std::time::{Duration, Instant};

use qpw_core::sync::{thread, Arc, AtomicBool, AtomicU64, Ordering};

use super::stats::avg;
use super::{
    BandwidthSource, Config, ConstantBandwidth, DomainLayout, Event, Fastcat, PathCounts, ReadPath,
    Resctrl, ResctrlError, MBM_CNTR_WIDTH_BASE, MBM_OVERFLOW_INTERVAL,
};

/// What to measure.
#[derive(Debug, Clone)]
pub struct FiguresConfig {
    /// The domains (default: 10 emulated domains of 1 CPU, so 750 files with 25 groups).
    pub layout: DomainLayout,
    /// Monitoring groups read (1-4095; default 25).
    pub groups: usize,
    /// Passes over all files per path (1-1000; default 2).
    pub passes: usize,
    /// The paths to measure, in order (default: all four).
    pub paths: Vec<ReadPath>,
    /// Whether a busy load thread runs on every domain CPU but the reader's (default: yes).
    pub load: bool,
    /// Whether the load threads register as the threads the interrupt path interrupts
    /// (default: yes). When not, the interrupt path signals an idle stand-in asleep on the
    /// domain's housekeeping CPU, which the scheduler wakes like a worker.
    pub interrupt_load: bool,
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
            layout: DomainLayout::Emulated {
                domains: 10,
                cpus_per_domain: 1,
            },
            groups: 25,
            passes: 2,
            paths: ReadPath::ALL.to_vec(),
            load: true,
            interrupt_load: true,
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
    /// Busy load threads (one per domain CPU but the reader's, or none).
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
    /// Time the reader was off-CPU while holding the mutex, over all reads.
    pub off_cpu: Duration,
    /// Voluntary context switches of the reader while holding the mutex (`ru_nvcsw`).
    pub voluntary_switches: u64,
    /// How the reads were executed.
    pub counts: PathCounts,
    /// Times a thread on a domain CPU was interrupted to do a read (load threads and idle
    /// stand-ins).
    pub interruptions: u64,
    /// Involuntary context switches of the load threads (a worker or the reader preempting
    /// them).
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

/// A load thread's involuntary context switches, from `/proc/self/task/<tid>/status`.
fn nivcsw(tid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

fn notes(resctrl: &Resctrl, config: &FiguresConfig, load_threads: usize) -> Vec<String> {
    let mut notes = Vec::new();
    if resctrl.qpw().is_logical() {
        notes.push(format!(
            "{} logical CPUs share the physical ones: a worker, an interrupted thread and the \
             reader each wait for their physical CPU, so compare paths within this run only",
            resctrl.qpw().cpus().len()
        ));
        if load_threads > 0 && config.interrupt_load {
            notes.push(
                "interrupted load threads are runnable, not running, most of the time: a \
                 signal waits for the thread's next turn (no wakeup boost, unlike a worker), \
                 which a kernel IPI never does; use a physical layout, or interrupt_load = \
                 false, for the interrupt path's own cost"
                    .to_string(),
            );
        }
    }
    if load_threads == 0 {
        notes.push("no load threads: the domain CPUs were idle".to_string());
    }
    notes
}

/// Measures every asked-for read path: see the module docs. Each path costs `passes` passes
/// over all files plus `passes` over the reader's domain's files; with busy logical CPUs a
/// workqueue or interrupt read can take milliseconds, so a default run (750 files, 2 passes)
/// takes seconds to minutes.
pub fn measure_read_paths(config: &FiguresConfig) -> Result<ResctrlFigures, ResctrlError> {
    check("groups", config.groups, 1, 4095)?;
    check("passes", config.passes, 1, 1000)?;
    let source: Arc<dyn BandwidthSource> = Arc::new(config.bandwidth);
    let resctrl = Resctrl::new(Config {
        layout: config.layout.clone(),
        num_rmids: config.groups as u32 + 1,
        counter_width: config.counter_width,
        overflow_interval: Some(config.overflow_interval),
        bandwidth: Some(source),
        call_timeout: config.call_timeout,
        ..Config::default()
    })?;
    let names: Vec<String> = (0..config.groups).map(|g| format!("g{g:02}")).collect();
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
    let load_cpus: Vec<usize> = if config.load {
        resctrl
            .qpw()
            .cpus()
            .iter()
            .filter(|&c| c != reader_cpu && resctrl.domain_of(c).is_some())
            .collect()
    } else {
        Vec::new()
    };

    let stop = AtomicBool::new(false);
    let tids: Vec<AtomicU64> = load_cpus.iter().map(|_| AtomicU64::new(0)).collect();
    let started = AtomicU64::new(0);
    let resctrl = &resctrl;

    thread::scope(|scope| {
        // The load: a busy thread on every domain CPU but the reader's, registered as the
        // thread the interrupt path interrupts there.
        let mut loads = Vec::new();
        for (i, &cpu) in load_cpus.iter().enumerate() {
            let (stop, tids, started) = (&stop, &tids, &started);
            loads.push(scope.spawn(move || -> Result<(), ResctrlError> {
                let setup = (|| {
                    let bound = resctrl.qpw().bind_current(cpu)?;
                    let target = if config.interrupt_load {
                        Some(resctrl.register_current_thread(cpu)?)
                    } else {
                        None
                    };
                    Ok::<_, ResctrlError>((bound, target))
                })();
                // SAFETY: `gettid` has no preconditions.
                tids[i].store(unsafe { libc::gettid() } as u64, Ordering::Relaxed);
                started.fetch_add(1, Ordering::Release);
                let (_bound, _target) = setup?;
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
                Ok(())
            }));
        }
        while started.load(Ordering::Acquire) < load_cpus.len() as u64 {
            thread::yield_now();
        }

        let reader = scope.spawn(|| -> Result<Vec<PathFigures>, ResctrlError> {
            let _bound = resctrl.qpw().bind_current(reader_cpu)?;
            // A first sample for the cache (the rate files).
            resctrl.run_overflow_now();
            let mut out = Vec::new();
            for &path in &config.paths {
                resctrl.set_read_path(path);
                let all = Fastcat::open(resctrl, &all_files)?;
                let local = Fastcat::open(resctrl, &local_files)?;
                let interruptions = || -> u64 {
                    resctrl
                        .qpw()
                        .cpus()
                        .iter()
                        .map(|c| resctrl.interruptions_on(c))
                        .sum()
                };
                let load_switches = || -> u64 {
                    tids.iter()
                        .map(|t| nivcsw(t.load(Ordering::Relaxed) as i32))
                        .sum()
                };
                resctrl.reset_stats();
                let irq0 = interruptions();
                let nivcsw0 = load_switches();
                let mut total = Duration::ZERO;
                let mut max = Duration::ZERO;
                for _ in 0..config.passes {
                    let pass = all.pass()?;
                    total += pass.elapsed;
                    max = max.max(pass.elapsed);
                }
                let hold = resctrl.hold_stats(path);
                let counts = resctrl.path_counts();
                let irqs = interruptions() - irq0;
                let load_involuntary_switches = load_switches().saturating_sub(nivcsw0);
                let local_start = Instant::now();
                for _ in 0..config.passes {
                    local.pass()?;
                }
                let local_total = local_start.elapsed();
                let cached = path == ReadPath::Cached && hold.reads > 0;
                out.push(PathFigures {
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
                    off_cpu: hold.off_cpu,
                    voluntary_switches: hold.voluntary_switches,
                    counts,
                    interruptions: irqs,
                    load_involuntary_switches,
                    cached_age_avg: cached.then(|| avg(hold.age_total, hold.reads)),
                    cached_age_max: cached.then_some(hold.age_max),
                    non_values: hold.non_values,
                });
            }
            Ok(out)
        });
        let paths = reader.join();
        stop.store(true, Ordering::Relaxed);
        for load in loads {
            match load.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(ResctrlError::Panicked { what: "load" }),
            }
        }
        let paths = paths.map_err(|_| ResctrlError::Panicked { what: "reader" })??;
        Ok(ResctrlFigures {
            cpus: resctrl.qpw().describe(),
            logical: resctrl.qpw().is_logical(),
            domains: resctrl.nr_domains(),
            groups: config.groups,
            events: Event::ALL.len(),
            files: all_files.len(),
            reader_cpu,
            reader_domain,
            load_threads: load_cpus.len(),
            overflow_interval: config.overflow_interval,
            paths,
            violations: resctrl.violations(),
            notes: notes(resctrl, config, load_cpus.len()),
        })
    })
}
