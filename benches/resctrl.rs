//! Bench 4, resctrl: one fastcat pass over 750 counter files by each read path, a pass over
//! the reader's own domain (seed 000's case), and the setup (opening the files, fastcat's
//! `FASTCAT_READ_COUNT=0`) apart, with the domain CPUs loaded as a fleet machine's are.
//!
//! Seed 002 counted 750 files as 25 groups x 3 events x 10 L3 domains. Ten domains emulated
//! with logical CPUs on a 2-core machine make every cross-domain read wait for a multiplexed
//! thread's turn on a core (a first try here: 2 s per workqueue pass, 44 s per interrupt
//! pass), which measures the multiplexing, not the read paths. So the domains are the
//! machine's physical CPUs, one per domain (two here), with as many groups as make 750 files
//! (125 x 3 events x 2 domains): `qpw_workloads::resctrl::one_domain_per_cpu`.
//!
//! The load is seed 002's: its 360 ms per pass came from kworkers waiting behind busy tasks.
//! Every domain CPU but the reader's runs `QPW_RESCTRL_LOAD` busy threads (default 8, 0-16),
//! each registered as a thread the interrupt path may interrupt and saying when it runs
//! (`qpw_workloads::resctrl::with_fleet_load`), so that a woken worker waits its turn while an
//! interrupt reaches the thread that runs. The reader (the bench thread) is bound to the CPU
//! of domain 0; the overflow worker runs every 1 s with steady traffic. Criterion times the
//! passes; the model records per read only what costs no more than a cached read (see
//! `qpw_workloads::resctrl` `stats.rs`); mutex holds and waits are the emulator's business.

use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode};
use qpw_benches::{Timing, RESCTRL, RESCTRL_ALL_FILES, RESCTRL_LOAD_ENV};
use qpw_workloads::resctrl::{
    one_domain_per_cpu, with_fleet_load, BandwidthSource, Config, ConstantBandwidth, Event,
    Fastcat, FleetLoad, PathCounts, ReadPath, Resctrl, MAX_THREADS_PER_CPU,
};

/// The load asked for by `QPW_RESCTRL_LOAD` (busy threads per loaded CPU), or the default.
fn fleet_load() -> FleetLoad {
    let mut load = FleetLoad::default();
    if let Ok(raw) = std::env::var(RESCTRL_LOAD_ENV) {
        match raw.trim().parse::<usize>() {
            Ok(n) if n <= MAX_THREADS_PER_CPU => load.threads_per_cpu = n,
            _ => panic!("{RESCTRL_LOAD_ENV}={raw}: must be an integer in 0-{MAX_THREADS_PER_CPU}"),
        }
    }
    load
}

/// Saves a line beside criterion's estimates, for the `ratios` report.
fn record(file: std::path::PathBuf, line: String) {
    let saved = file
        .parent()
        .map(|dir| std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&file, &line)));
    if !matches!(saved, Some(Ok(()))) {
        eprintln!("could not record {} in {}", line.trim(), file.display());
    }
}

/// Saves how the reads of one benchmark were executed (worker hop, interrupt, direct, local
/// fallback to the workqueue, cache, interrupts re-sent), beside criterion's estimates; says
/// whether it ran (a benchmark filtered out reads nothing, and leaves the last record alone).
fn record_path_counts(path: ReadPath, files: usize, counts: &PathCounts) -> bool {
    let executed = counts.worker_runs + counts.interrupts + counts.reader_direct + counts.cached;
    if executed == 0 {
        return false;
    }
    let line = format!(
        "{} {} {} {} {} {}\n",
        counts.worker_runs,
        counts.interrupts,
        counts.reader_direct,
        counts.local_fallbacks,
        counts.cached,
        counts.retargets
    );
    eprintln!(
        "{RESCTRL}/{path}/{files}: worker interrupt direct fallback cached retargets = {line}"
    );
    let root = qpw_benches::criterion_dir();
    record(
        qpw_benches::path_counts_path(&root, path.name(), files),
        line,
    );
    true
}

pub(crate) fn bench(c: &mut Criterion) {
    let layout = one_domain_per_cpu();
    let source: Arc<dyn BandwidthSource> = Arc::new(ConstantBandwidth::default());
    // As many groups as make 750 files (exactly, for 1, 2, 5 or 10 domains).
    let groups = RESCTRL_ALL_FILES / (Event::ALL.len() * layout.domains().max(1));
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
    let load = fleet_load();
    let loaded: Vec<usize> = resctrl
        .qpw()
        .cpus()
        .iter()
        .filter(|&c| c != reader_cpu && resctrl.domain_of(c).is_some())
        .collect();
    eprintln!(
        "resctrl: {} files, {}; reader on cpu {reader_cpu}, {} busy threads on each of cpus {loaded:?}",
        all_files.len(),
        resctrl.qpw().describe(),
        load.threads_per_cpu,
    );

    let mut group = c.benchmark_group(RESCTRL);
    crate::configure(&mut group, Timing::slow_path());
    group.sampling_mode(SamplingMode::Flat);

    let resctrl = &resctrl;
    let ran = with_fleet_load(resctrl, &loaded, load, |_| {
        let mut ran = false;
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
                ran |= record_path_counts(path, files.len(), &resctrl.path_counts());
            }
        }
        ran
    })
    .expect("the fleet load runs");
    if ran {
        record(
            qpw_benches::resctrl_load_path(&qpw_benches::criterion_dir()),
            format!("{} {}\n", load.threads_per_cpu, loaded.len()),
        );
    }
    assert_eq!(
        resctrl.violations(),
        0,
        "reads executed outside their domain"
    );
    group.finish();
}
