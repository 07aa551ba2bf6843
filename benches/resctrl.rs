//! Bench 4, resctrl: one fastcat pass over 750 counter files by each read path, a pass over
//! the reader's own domain (seed 000's case), and the setup (opening the files, fastcat's
//! `FASTCAT_READ_COUNT=0`) apart.
//!
//! Seed 002 counted 750 files as 25 groups x 3 events x 10 L3 domains. Ten domains emulated
//! with logical CPUs on a 2-core machine make every cross-domain read wait for a multiplexed
//! thread's turn on a core (a first try here: 2 s per workqueue pass, 44 s per interrupt
//! pass), which measures the multiplexing, not the read paths. So the domains are the
//! machine's physical CPUs, one per domain (two here), with as many groups as make 750 files
//! (125 x 3 events x 2 domains); only with a single allowed CPU does it fall back to two
//! emulated domains.
//!
//! The rest follows `qpw_workloads::resctrl::measure_read_paths` (the typed figures): a busy
//! load thread bound to, and registered as the thread running on, every domain CPU but the
//! reader's; the reader (the bench thread) bound to the CPU of domain 0; the overflow worker
//! every 1 s with steady traffic. Criterion times the passes; the figures function's own
//! extras (mutex hold, off-CPU time) are the emulator's business.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode};
use qpw_benches::{Timing, RESCTRL, RESCTRL_ALL_FILES};
use qpw_core::CpuSet;
use qpw_workloads::resctrl::{
    BandwidthSource, Config, ConstantBandwidth, DomainLayout, Event, Fastcat, PathCounts, ReadPath,
    Resctrl,
};

/// At most this many domains (seed 002's machine view had ten).
const MAX_DOMAINS: usize = 10;

/// One domain per allowed physical CPU (at most ten), or two emulated ones on a 1-CPU machine.
fn layout() -> (DomainLayout, usize) {
    let allowed = qpw_core::allowed_cpus().expect("the allowed CPUs");
    if allowed.len() >= 2 {
        let domains: Vec<CpuSet> = allowed
            .iter()
            .take(MAX_DOMAINS)
            .map(|cpu| CpuSet::from_iter([cpu]))
            .collect();
        let n = domains.len();
        (DomainLayout::Physical(domains), n)
    } else {
        let layout = DomainLayout::Emulated {
            domains: 2,
            cpus_per_domain: 1,
        };
        (layout, 2)
    }
}

/// Saves how the reads of one benchmark were executed (worker hop, interrupt, direct, local
/// fallback to the workqueue, cache), beside criterion's estimates, for the `ratios` report.
fn record_path_counts(path: ReadPath, files: usize, counts: &PathCounts) {
    let line = format!(
        "{} {} {} {} {}\n",
        counts.worker_runs,
        counts.interrupts,
        counts.reader_direct,
        counts.local_fallbacks,
        counts.cached
    );
    eprintln!("{RESCTRL}/{path}/{files}: worker interrupt direct fallback cached = {line}");
    let file = qpw_benches::path_counts_path(&qpw_benches::criterion_dir(), path.name(), files);
    if let Some(dir) = file.parent() {
        if std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&file, line))
            .is_err()
        {
            eprintln!("could not record the path counts in {}", file.display());
        }
    }
}

pub(crate) fn bench(c: &mut Criterion) {
    let (layout, domains) = layout();
    // As many groups as make 750 files (exactly, for 1, 2, 5 or 10 domains).
    let groups = RESCTRL_ALL_FILES / (Event::ALL.len() * domains);
    let source: Arc<dyn BandwidthSource> = Arc::new(ConstantBandwidth::default());
    let resctrl = Resctrl::new(Config {
        layout,
        num_rmids: groups as u32 + 1,
        bandwidth: Some(source),
        ..Config::default()
    })
    .expect("the resctrl model is built");
    let names: Vec<String> = (0..groups).map(|g| format!("g{g:03}")).collect();
    for name in &names {
        resctrl.mkdir(name).expect("mkdir a monitoring group");
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let domains: Vec<usize> = (0..resctrl.nr_domains()).collect();
    let all_files = Resctrl::file_paths(&names, &Event::ALL, &domains);
    let reader_cpu = resctrl
        .domain_cpus(0)
        .expect("domain 0")
        .first()
        .expect("domain 0 has a CPU");
    let own_files = Resctrl::file_paths(&names, &Event::ALL, &[0]);
    let load_cpus: Vec<usize> = resctrl
        .qpw()
        .cpus()
        .iter()
        .filter(|&c| c != reader_cpu && resctrl.domain_of(c).is_some())
        .collect();
    eprintln!(
        "resctrl: {} files, {}; reader on cpu {reader_cpu}, {} load threads",
        all_files.len(),
        resctrl.qpw().describe(),
        load_cpus.len()
    );

    let mut group = c.benchmark_group(RESCTRL);
    crate::configure(&mut group, Timing::slow_path());
    group.sampling_mode(SamplingMode::Flat);

    let stop = AtomicBool::new(false);
    let started = AtomicUsize::new(0);
    thread::scope(|s| {
        let resctrl = &resctrl;
        for &cpu in &load_cpus {
            let (stop, started) = (&stop, &started);
            s.spawn(move || {
                let _bound = resctrl.qpw().bind_current(cpu).expect("bind a load thread");
                let _target = resctrl
                    .register_current_thread(cpu)
                    .expect("register a load thread");
                started.fetch_add(1, Ordering::Release);
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            });
        }
        while started.load(Ordering::Acquire) < load_cpus.len() {
            thread::yield_now();
        }

        let _bound = resctrl
            .qpw()
            .bind_current(reader_cpu)
            .expect("bind the reader");
        resctrl.run_overflow_now();

        // The setup: opening every file, no read (the same for every path).
        group.bench_with_input(BenchmarkId::new("open", all_files.len()), &(), |b, _| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        Fastcat::open(resctrl, &all_files)
                            .expect("open the files")
                            .setup()
                    })
                    .sum::<Duration>()
            })
        });

        for path in ReadPath::ALL {
            resctrl.set_read_path(path);
            for files in [&all_files, &own_files] {
                let cat = Fastcat::open(resctrl, files).expect("open the files");
                resctrl.reset_stats();
                group.bench_with_input(BenchmarkId::new(path.name(), files.len()), &(), |b, _| {
                    b.iter_custom(|iters| {
                        (0..iters)
                            .map(|_| {
                                let pass = cat.pass().expect("a pass over the files");
                                assert_eq!(
                                    pass.non_values, 0,
                                    "{path}: reads that were not values"
                                );
                                pass.elapsed
                            })
                            .sum::<Duration>()
                    })
                });
                record_path_counts(path, files.len(), &resctrl.path_counts());
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(
        resctrl.violations(),
        0,
        "reads executed outside their domain"
    );
    group.finish();
}
