//! The command line, as clap parses it. Numbers with a fixed range, durations and optional
//! values are parsed here by value parsers whose errors name the flag, the value and the legal
//! range; CPU lists and the drain options stay text and are checked by the commands against the
//! machine (the allowed CPUs: [`crate::cpus`], [`crate::drain`]), with messages of the same
//! shape. This module declares and validates only: it imports no command (a default that a
//! command also uses lives in [`crate::defaults`]).
//!
//! `qpw-emu oslat` and `qpw-emu cyclictest` take every flag of rt-tests 2.4's tools, with the
//! real tools' defaults; a link to the binary named `oslat` or `cyclictest` runs that command
//! ([`args_for_invocation`]), so scripts that call the real tools can call ours.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand};

/// oslat- and cyclictest-style probes around kernel-style per-CPU drains, in queue mode
/// (work posted to a worker on the target CPU), remote mode (run by the requester under the
/// target CPU's lock) and fenced mode (remote, with an owner lock of plain stores that the
/// requester takes by fencing the target CPU).
///
/// With no command, runs the default experiment (`qpw-emu run`).
#[derive(Debug, Parser)]
#[command(name = "qpw-emu", version)]
pub struct Cli {
    /// The command (default: run).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The default experiment: an idle baseline, then for each mode and mm workload the oslat
    /// probe on the target CPU under a fixed-rate requester and a process-context load; one
    /// comparison table, JSON and SVG files in a results folder.
    Run(RunArgs),
    /// The oslat probe: a TSC busy loop counting every gap, on each CPU of -c.
    #[command(help_template = OSLAT_HELP)]
    Oslat(Box<OslatArgs>),
    /// The cyclictest probe: threads waking on an absolute deadline, measuring how late.
    #[command(help_template = CYCLICTEST_HELP)]
    Cyclictest(Box<CyclictestArgs>),
    /// Only the drain load (requester drains plus process-context operations), for running
    /// the real rt-tests tools beside it on the CPU it leaves free.
    Load(LoadArgs),
    /// The resctrl counter read paths side by side (from qpw-workloads).
    Resctrl(ResctrlArgs),
    /// The buffer-pool designs side by side (from qpw-workloads).
    Pool(PoolArgs),
    /// Text tables and SVG plots from saved JSON results (ours or the real tools').
    Report(ReportArgs),
    /// Trace what runs on CPUs (root): beside a real oslat or cyclictest, every source of noise
    /// on each CPU (thread with its work function, IRQ, softirq, IPI), osnoise-style, from a
    /// private tracefs instance; and what the running kernel's per-CPU drains are (PW/QPW mode,
    /// isolation, RT throttling).
    Trace(TraceArgs),
    /// (internal) The kernel workloads' filler process.
    #[command(name = "__filler", hide = true)]
    Filler(FillerArgs),
}

/// `oslat --help` as oslat 2.4 starts it (version, `Usage:`, `oslat <options>`), then the
/// options it has, then ours under their own heading.
const OSLAT_HELP: &str = "oslat V 2.40\nUsage:\noslat <options>\n\nqpw-emu's oslat: the same busy \
loop on each CPU of -c, counting every gap, with oslat's flags and output; a drain load \
and a trace on our own options.\n\n{all-args}";

/// `cyclictest --help` as cyclictest 2.4 starts it (version, `Usage:`, `cyclictest <options>`),
/// then the options it has, then ours under their own heading.
const CYCLICTEST_HELP: &str = "cyclictest V 2.40\nUsage:\ncyclictest <options>\n\nqpw-emu's \
cyclictest: threads waking on an absolute deadline, measuring how late, with cyclictest's flags \
and output; a drain load and a trace on our own options.\n\n{all-args}";

/// The heading of the drop-ins' own options, after the real tool's in `--help`.
pub const OURS: &str = "Options of qpw-emu (not in rt-tests)";

/// `qpw-emu trace`.
#[derive(Debug, Clone, Args)]
pub struct TraceArgs {
    /// CPUs to trace, e.g. 1,3-5 (default: an isolated CPU, else the last allowed one).
    #[arg(short = 'c', long, value_name = "LIST", allow_hyphen_values = true)]
    pub cpu_list: Option<String>,
    /// How long (default: until Ctrl-C): 10, 30s, 500ms, 20m, 2h.
    #[arg(short = 'D', long, value_name = "TIME", allow_hyphen_values = true)]
    pub duration: Option<String>,
    /// The thread whose noise is measured (the probe's tid); default: the busiest thread on
    /// each CPU (oslat's or cyclictest's measuring thread, when one runs there).
    #[arg(long, value_name = "TID", allow_hyphen_values = true)]
    pub probe_tid: Option<String>,
    /// Sources listed per CPU, 1-1000.
    #[arg(
        long,
        value_name = "N",
        default_value = "12",
        allow_hyphen_values = true
    )]
    pub top: String,
    /// Print only the summary.
    #[arg(short, long)]
    pub quiet: bool,
    /// Write the results as JSON to this file (- for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// `qpw-emu __filler`.
#[derive(Debug, Clone, Args)]
pub struct FillerArgs {
    /// The CPU to fill.
    pub cpu: usize,
    /// kernel-pcp's fill: free the pages at once (onto the CPU's pcp lists) and answer with
    /// their frame numbers.
    #[arg(long)]
    pub pcp: bool,
}

/// The drain options shared by the probes and the load.
#[derive(Debug, Clone, Args)]
pub struct DrainArgs {
    /// Drain mode: queue (post to the target CPU's worker), remote (run under the target's
    /// lock in the requester), fenced (remote, with a restartable-sequence lock that the
    /// requester takes by fencing the target CPU with membarrier), or auto (the kernel's rule,
    /// the default: remote when the measured CPU is isolated or nohz_full, else queue). Giving
    /// --mode or a workload turns the load on.
    #[arg(long, value_name = "MODE", allow_hyphen_values = true)]
    pub mode: Option<String>,
    /// Workload: lru, memcg, slub, pcp, or counter (the emulator's built-in minimal one); or
    /// the running kernel's own drains (root): kernel-lru (compacts memory:
    /// lru_add_drain_all), kernel-slub (shrinks the maple_node slab: flush_all), kernel-vmstat
    /// (stat_refresh: refresh_vm_stats on every CPU), kernel-memcg (a memory cgroup of its own,
    /// created and removed, emptied: drain_all_stock), kernel-pcp (a 1 GiB huge page
    /// allocated and freed: drain_all_pages, which drains every CPU from the caller since 6.0).
    /// `qpw-emu oslat` takes it as --drain-workload only (its -w/--workload is oslat's).
    #[arg(
        short = 'w',
        long,
        alias = "drain-workload",
        value_name = "NAME",
        allow_hyphen_values = true
    )]
    pub workload: Option<String>,
    /// How the workload's flag is spelled in messages: `--workload`, or `--drain-workload` for
    /// `qpw-emu oslat`.
    #[arg(skip = "--workload")]
    pub workload_flag: &'static str,
    /// Requester drains per second, 0-100000 (0: no drains). Default 1000; for kernel
    /// workloads their own (kernel-lru 2, kernel-slub and kernel-vmstat 50, kernel-memcg 20,
    /// kernel-pcp 1).
    #[arg(long, value_name = "HZ", allow_hyphen_values = true)]
    pub drain_rate: Option<String>,
    /// Process-context load on the other CPUs: on or off.
    #[arg(
        long,
        value_name = "on|off",
        default_value = "on",
        allow_hyphen_values = true
    )]
    pub load: String,
    /// How often the probe does a local operation itself: microseconds (200) or a time with its
    /// unit (250ns, 1us), 0 to 1s; 0 means every turn of its loop.
    #[arg(
        long,
        value_name = "TIME",
        default_value = "200",
        allow_hyphen_values = true
    )]
    pub local_op_every: String,
    /// How long a drain waits for queued work before it counts a stall, in ms (1-60000).
    #[arg(
        long,
        value_name = "MS",
        default_value = "1000",
        allow_hyphen_values = true
    )]
    pub drain_timeout: String,
    /// A drain that waits this long or longer counts as a stall, with how long it waited, in
    /// ms (1-60000). Well under RT throttling's period: throttling lets a starved worker run
    /// after sched_rt_runtime_us (0.95 s by default), so a drain against a SCHED_FIFO probe
    /// completes inside the 1 s timeout, yet it waited most of a second.
    #[arg(
        long,
        value_name = "MS",
        default_value = "100",
        allow_hyphen_values = true
    )]
    pub stall_threshold: String,
    /// Turn the kernel's RT throttling off for the run (root only): writes -1 to
    /// /proc/sys/kernel/sched_rt_runtime_us and restores the value at exit, Ctrl-C included.
    /// A SCHED_FIFO task that never sleeps then keeps its CPU for as long as it runs, and so
    /// does a queue-mode drain against it wait.
    #[arg(long)]
    pub no_rt_throttling: bool,
    /// Isolate the measured CPU(s) at run time for the run (root only): other processes'
    /// threads, unbound workqueues and interrupts are moved to the other CPUs; on cgroup v1 the
    /// root cpuset stops load balancing over them, on cgroup v2 they become an isolated cpuset
    /// partition that the probe's threads join; all of it is put back at exit, Ctrl-C
    /// included. Not boot isolation: the tick still runs there.
    #[arg(long)]
    pub isolate: bool,
    /// The requester's CPU (default: a housekeeping CPU other than the measured ones).
    #[arg(long, value_name = "CPU", allow_hyphen_values = true)]
    pub requester_cpu: Option<String>,
}

/// `qpw-emu run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Length of each scenario: 10, 30s, 500ms, 20m, 2h.
    #[arg(
        short = 'D',
        long,
        value_name = "TIME",
        default_value = "5s",
        allow_hyphen_values = true
    )]
    pub duration: String,
    /// Results folder (default: ./results/TIMESTAMP).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Workloads, comma-separated: lru, memcg, slub, pcp, counter, kernel-lru, kernel-slub,
    /// kernel-vmstat, kernel-memcg, kernel-pcp (default: lru,memcg,slub,pcp, and as root with
    /// tracefs the five kernel workloads).
    #[arg(long, value_name = "LIST", allow_hyphen_values = true)]
    pub workloads: Option<String>,
    /// The modes each emulated workload runs in, comma-separated: queue, remote, fenced
    /// (default: all three).
    #[arg(long, value_name = "LIST", allow_hyphen_values = true)]
    pub modes: Option<String>,
    /// Requester drains per second, 1-100000 (default 1000; the kernel workloads' own rates
    /// for their rows).
    #[arg(long, value_name = "HZ", allow_hyphen_values = true)]
    pub drain_rate: Option<String>,
    /// The measured CPU (default: an isolated CPU, else the last allowed one).
    #[arg(long, value_name = "CPU", allow_hyphen_values = true)]
    pub target: Option<String>,
    /// Run the probe SCHED_FIFO at this priority (1-99); the worker then cannot preempt it.
    #[arg(short = 'f', long, value_name = "PRIO", allow_hyphen_values = true)]
    pub rtprio: Option<String>,
    /// How often the probe does a local operation itself: microseconds (200) or a time with its
    /// unit (250ns, 1us), 0 to 1s; 0 means every turn of its loop. The default is an owner
    /// busy on its lock (the fenced-idle and fenced-poll scenarios keep 200 us).
    #[arg(
        long,
        value_name = "TIME",
        default_value = crate::defaults::BUSY_OWNER,
        allow_hyphen_values = true
    )]
    pub local_op_every: String,
    /// Rounds, 1-100: each runs every scenario for duration/rounds, interleaved, so that
    /// drifts in the machine's noise fall on every scenario alike.
    #[arg(
        long,
        value_name = "N",
        default_value = "3",
        allow_hyphen_values = true
    )]
    pub rounds: String,
    /// Isolate the target CPU at run time (root only; see `oslat --isolate`) for every scenario
    /// but one more idle baseline, `idle-unisolated`, run in each round without it, so that
    /// the trace's counts show what the isolation removed; all of it is put back at exit,
    /// Ctrl-C included.
    #[arg(long)]
    pub isolate: bool,
    /// Print only the table.
    #[arg(short, long)]
    pub quiet: bool,
}

/// `qpw-emu oslat`: every flag of rt-tests 2.4's `oslat --help`, with its defaults (all CPUs,
/// one second, 32 buckets of 1 us, a one-second pre-heat), plus ours after them.
#[derive(Debug, Clone, Args)]
// A flag given twice takes its last value, as getopt's loop does (`-c 0 -c 1` is cpu 1).
#[command(
    infer_long_args = true,
    args_override_self = true,
    next_help_heading = "Available options"
)]
// As getopt: a required argument is the next word, dash or not (`-T -3`).
#[command(mut_args(getopt_required_argument))]
// The drain workload under a name of its own: `-w/--workload` is oslat's.
#[command(mut_arg("workload", |a| a.short(None).long("drain-workload").alias(None)))]
pub struct OslatArgs {
    /// Number of buckets, 4-1024 (oslat's range).
    #[arg(short = 'b', long, value_name = "N", default_value = "32",
          value_parser = int_range(4, 1024))]
    pub bucket_size: u64,
    /// Add a bias to all the buckets: the smallest gap seen during the pre-heat.
    #[arg(short = 'B', long)]
    pub bias: bool,
    /// CPUs to measure, e.g. 1,3,5,7-15, or `all` (default: all allowed CPUs).
    #[arg(short = 'c', long, value_name = "LIST")]
    pub cpu_list: Option<String>,
    /// The CPU the main thread runs on (default: 0, as oslat).
    #[arg(short = 'C', long, value_name = "CPU")]
    pub cpu_main_thread: Option<String>,
    /// Test duration: 60, 30s, 20m, 2H, 1d (and ours: 500ms). Default 1 s, as oslat.
    #[arg(short = 'D', long, value_name = "TIME", default_value = "1",
          value_parser = duration_value)]
    pub duration: Duration,
    /// Attribute every gap at or above this many microseconds (default 5 when given without
    /// a value) to what ran on the CPU then, from a private tracefs instance (root).
    #[arg(long, value_name = "TIME", num_args = 0..=1, default_missing_value = "5",
          help_heading = OURS)]
    pub trace: Option<String>,
    /// Write the results as JSON to this file (- for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// SCHED_FIFO priority, 1-99.
    #[arg(short = 'f', long, value_name = "PRIO", value_parser = int_range(1, 99))]
    pub rtprio: Option<u64>,
    /// oslat's busy-loop workload: no (the default) or memmove (copy a buffer each turn).
    #[arg(id = "loop_workload", short = 'w', long = "workload", value_name = "NAME",
          value_parser = loop_workload)]
    pub loop_workload: Option<String>,
    /// Memory for the memmove workload, per buffer (e.g. 4K, 1M; default 16K).
    #[arg(short = 'm', long, value_name = "SIZE", value_parser = mem_size)]
    pub workload_mem: Option<u64>,
    /// Print the summary only.
    #[arg(short, long)]
    pub quiet: bool,
    /// Pre-heat on the first CPU only.
    #[arg(short = 's', long)]
    pub single_preheat: bool,
    /// Stop when a gap reaches this many microseconds: oslat's message on stderr, a marker in
    /// ftrace, exit status 1, no summary and no JSON (as oslat).
    #[arg(short = 'T', long, value_name = "TIME", value_parser = int_range(1, 10_000_000))]
    pub trace_threshold: Option<u64>,
    /// Print the version and exit.
    #[arg(short = 'v', long)]
    pub version: bool,
    /// Leave out buckets that are zero on every CPU.
    #[arg(short = 'z', long)]
    pub zero_omit: bool,
    /// Bucket width in nanoseconds, 1-1000000 (ours; oslat's buckets are 1 us).
    #[arg(long, value_name = "NS", default_value = "1000",
          value_parser = int_range(1, 1_000_000), help_heading = OURS)]
    pub bucket_width: u64,
    /// The drain load (ours); its workload is `--drain-workload` here, as `-w/--workload` is oslat's.
    #[command(flatten, next_help_heading = OURS)]
    pub drain: DrainArgs,
    /// Words that are not options: oslat 2.4 ignores them (scripts pass some), and so do we,
    /// saying so on stderr.
    #[arg(hide = true, num_args = 0.., value_name = "IGNORED")]
    pub stray: Vec<String>,
}

/// `qpw-emu cyclictest`: every flag of rt-tests 2.4's `cyclictest --help`, with its defaults
/// (one thread per -t on the allowed CPUs in turn, 1000 us, until Ctrl-C), plus ours after them.
#[derive(Debug, Clone, Args)]
// A flag given twice takes its last value, as getopt's loop does.
#[command(
    disable_help_flag = true,
    infer_long_args = true,
    args_override_self = true,
    next_help_heading = "Available options"
)]
// As getopt: a required argument is the next word, dash or not (`-p -5`).
// Our drain workload has no short letter here: a future cyclictest may take -w.
#[command(mut_arg("workload", |a| a.short(None)))]
#[command(mut_args(getopt_required_argument))]
pub struct CyclictestArgs {
    /// Pin thread N to the Nth allowed CPU; with a CPU set, to its CPUs in turn (e.g. 1, 0-1,
    /// all). Without a value: all allowed CPUs.
    #[arg(short = 'a', long, value_name = "CPUSET", num_args = 0..=1,
          default_missing_value = "all")]
    pub affinity: Option<String>,
    /// Align the threads' wake-ups: thread N starts N x USEC after a common start.
    #[arg(short = 'A', long, value_name = "USEC", num_args = 0..=1,
          value_parser = int_range(0, 1_000_000))]
    pub aligned: Option<Option<u64>>,
    /// Stop when a latency exceeds USEC (0: never); prints the thread ids and the break.
    #[arg(short = 'b', long, value_name = "USEC", value_parser = int_range(0, 100_000_000))]
    pub breaktrace: Option<u64>,
    /// Clock: 0 = CLOCK_MONOTONIC (default), 1 = CLOCK_REALTIME.
    #[arg(short = 'c', long, value_name = "CLOCK", default_value = "0",
          value_parser = int_range(0, 1))]
    pub clock: u64,
    /// Do not hold /dev/cpu_dma_latency (power management stays as the system has it).
    #[arg(long)]
    pub default_system: bool,
    /// Distance of the threads' intervals in us (thread N: interval + N x DIST; default 500;
    /// 0 with -h).
    #[arg(short = 'd', long, value_name = "DIST", value_parser = int_range(0, 10_000_000))]
    pub distance: Option<u64>,
    /// Test duration: 60, 30s, 20m, 2h, 1d (and ours: 500ms); 0 or none: until Ctrl-C.
    #[arg(short = 'D', long, value_name = "TIME", value_parser = run_length)]
    pub duration: Option<RunLength>,
    /// Create a named pipe at this path and write the threads' statistics to each reader.
    #[arg(short = 'F', long, value_name = "PATH")]
    pub fifo: Option<PathBuf>,
    /// Print a histogram of this many 1 us buckets after the run, 1-1000000 (larger values
    /// are cut to 1000000, as cyclictest does).
    #[arg(short = 'h', long, value_name = "TIME", value_parser = hist_size)]
    pub histogram: Option<u64>,
    /// As -h, with a summary column over all threads.
    #[arg(short = 'H', long, value_name = "TIME", value_parser = hist_size)]
    pub histofall: Option<u64>,
    /// Write the histogram to this file instead of stdout.
    #[arg(long, value_name = "PATH")]
    pub histfile: Option<PathBuf>,
    /// Base interval of the threads in us, 1-10000000.
    #[arg(short = 'i', long, value_name = "INTV", default_value = "1000",
          value_parser = int_range(1, 10_000_000))]
    pub interval: u64,
    /// Write the results as JSON to this file (- for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Do not hold /dev/cpu_dma_latency, to save battery.
    #[arg(long)]
    pub laptop: bool,
    /// The value held in /dev/cpu_dma_latency, in us (default 0).
    #[arg(long, value_name = "PM_QOS", value_parser = int_range(0, i32::MAX as u64))]
    pub latency: Option<u64>,
    /// Wake-ups per thread, then stop (0: endless).
    #[arg(short = 'l', long, value_name = "LOOPS", default_value = "0",
          value_parser = int_range(0, u64::MAX))]
    pub loops: u64,
    /// Run the main thread on these CPUs.
    #[arg(long, value_name = "CPUSET")]
    pub mainaffinity: Option<String>,
    /// Lock memory (mlockall).
    #[arg(short = 'm', long)]
    pub mlockall: bool,
    /// Redraw the live lines only when a thread sees a new maximum.
    #[arg(short = 'M', long = "refresh_on_max")]
    pub refresh_on_max: bool,
    /// Latencies in ns instead of us.
    #[arg(short = 'N', long)]
    pub nsecs: bool,
    /// With -v: print one value in RED (the largest of them).
    #[arg(short = 'o', long, value_name = "RED", value_parser = int_range(1, u32::MAX as u64))]
    pub oscope: Option<u64>,
    /// Priority of the highest-priority thread, 0-99 (> 0: SCHED_FIFO unless --policy rr).
    #[arg(short = 'p', long, value_name = "PRIO", default_value = "0",
          value_parser = int_range(0, 99))]
    pub priority: u64,
    /// Scheduling policy of the threads: other, normal, batch, idle, fifo or rr.
    #[arg(long, value_name = "NAME")]
    pub policy: Option<String>,
    /// Give each thread one priority less than the one before.
    #[arg(long)]
    pub priospread: bool,
    /// Print the summary only.
    #[arg(short, long)]
    pub quiet: bool,
    /// Sleep for the interval (relative) instead of to an absolute deadline.
    #[arg(short = 'r', long)]
    pub relative: bool,
    /// Check the clock's resolution before the run.
    #[arg(short = 'R', long)]
    pub resolution: bool,
    /// Align the threads' first wake-up to the next full second, plus USEC.
    #[arg(long, value_name = "USEC", num_args = 0..=1, value_parser = int_range(0, 1_000_000))]
    pub secaligned: Option<Option<u64>>,
    /// Sleep with nanosleep() (relative) instead of clock_nanosleep().
    #[arg(short = 's', long)]
    pub system: bool,
    /// SMP testing: one thread per allowed CPU, pinned, all at the same priority.
    #[arg(short = 'S', long)]
    pub smp: bool,
    /// Record every latency above this many us and list them after the run (0: off).
    #[arg(long, value_name = "TRIGGER", value_parser = int_range(0, u32::MAX as u64))]
    pub spike: Option<u64>,
    /// How many spikes are kept for the list (default 1024).
    #[arg(long = "spike-nodes", value_name = "N", value_parser = int_range(1, 10_000_000))]
    pub spike_nodes: Option<u64>,
    /// SMI counting (refused: see the message).
    #[arg(long)]
    pub smi: bool,
    /// Number of threads, 1-4096; without a number, one per allowed CPU (default 1).
    #[arg(short = 't', long, value_name = "NUM", num_args = 0..=1,
          value_parser = int_range(1, 4096))]
    pub threads: Option<Option<u64>>,
    /// Write a trace mark when the -b latency is exceeded.
    #[arg(long)]
    pub tracemark: bool,
    /// Unbuffered output (ours is written a line at a time already).
    #[arg(short = 'u', long)]
    pub unbuffered: bool,
    /// Print every wake-up's latency as `thread:cycle:value`.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// With -R, list the clock readings.
    #[arg(long = "dbg_cyclictest")]
    pub dbg_cyclictest: bool,
    /// Sleep with a POSIX interval timer and sigwait() instead of clock_nanosleep().
    #[arg(short = 'x', long = "posix_timers")]
    pub posix_timers: bool,
    /// Attribute every wake-up at least this many microseconds late (default 5 when given
    /// without a value) to what ran on the CPU then, from a private tracefs instance (root).
    #[arg(long, value_name = "TIME", num_args = 0..=1, default_missing_value = "5",
          help_heading = OURS)]
    pub trace: Option<String>,
    /// Print help (-h is the histogram, as in cyclictest).
    #[arg(long, action = ArgAction::Help)]
    pub help: Option<bool>,
    /// The drain load (ours).
    #[command(flatten, next_help_heading = OURS)]
    pub drain: DrainArgs,
    /// Words that are not options: cyclictest 2.4 ignores them, and so do we, saying so on
    /// stderr.
    #[arg(hide = true, num_args = 0.., value_name = "IGNORED")]
    pub stray: Vec<String>,
    /// `-v` came before `-a CPUSET` on the command line (from [`cyclictest_getopt`]): 2.4 then
    /// says `Using N cpus.` while it parses `-a`, once more than otherwise.
    #[arg(skip)]
    pub verbose_before_affinity: bool,
}

/// A cyclictest run length: a duration, or until Ctrl-C (`-D 0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunLength {
    /// Stop after this long.
    For(Duration),
    /// Run until Ctrl-C (or -l, -b).
    UntilStopped,
}

/// A value parser for an integer in `lo..=hi`, whose error names the legal range.
pub fn int_range(lo: u64, hi: u64) -> impl Fn(&str) -> Result<u64, String> + Clone {
    move |raw: &str| match raw.trim().parse::<u64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(format!("must be an integer in {lo}-{hi}")),
    }
}

/// A value parser for cyclictest's `-h`/`-H`: 1-1000000, as its help says; larger values (up
/// to 2^32 - 1, what 2.4 reads) are taken and cut to 1000000 by the command, as 2.4 cuts them.
pub fn hist_size(raw: &str) -> Result<u64, String> {
    match raw.trim().parse::<u64>() {
        Ok(v) if (1..=u64::from(u32::MAX)).contains(&v) => Ok(v),
        _ => Err(
            "must be an integer in 1-1000000 (larger ones are cut to 1000000, as \
                  cyclictest does)"
                .to_string(),
        ),
    }
}

/// A value parser for a drop-in's `-D`, read as rt-tests reads it (see
/// [`crate::validate::parse_rt_duration`]); when only the real tool's reading made sense of it,
/// says on stderr how it was read.
pub fn duration_value(raw: &str) -> Result<Duration, String> {
    let (d, note) = crate::validate::parse_rt_duration(raw)?;
    if let Some(note) = note {
        eprintln!("qpw-emu: --duration {raw}: {note}");
    }
    Ok(d)
}

/// A value parser for a cyclictest run length: `0` is "until stopped".
pub fn run_length(raw: &str) -> Result<RunLength, String> {
    if raw.trim().parse::<u64>() == Ok(0) {
        return Ok(RunLength::UntilStopped);
    }
    duration_value(raw).map(RunLength::For)
}

/// getopt gives an option's required argument the next word whatever it is (`-p -5`), so that
/// the value reaches its range check instead of being taken for an option: the drop-ins' options
/// that take a value take it so too.
fn getopt_required_argument(a: clap::Arg) -> clap::Arg {
    let required = matches!(a.get_action(), ArgAction::Set)
        && !a.is_positional()
        && a.get_num_args().is_none_or(|n| n.min_values() >= 1);
    a.allow_hyphen_values(required)
}

/// A value parser for oslat's `-w`: its busy-loop workloads only, as oslat takes them. The
/// drain workloads are `--drain-workload`; the refusal says so.
pub fn loop_workload(raw: &str) -> Result<String, String> {
    match raw {
        "no" | "memmove" => Ok(raw.to_string()),
        // A drain workload given to oslat's flag: say where it goes.
        _ if raw.parse::<crate::workload::WorkloadName>().is_ok() => Err(format!(
            "oslat's workloads are no and memmove (the drain workloads are --drain-workload \
             {raw})"
        )),
        _ => Err("oslat's workloads are no and memmove".to_string()),
    }
}

/// A value parser for a memory size as oslat writes it: `16K`, `1M`, `1G`, or bytes.
pub fn mem_size(raw: &str) -> Result<u64, String> {
    let text = raw.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let bad = || "must be a size of 1B-1G, written like 4096, 4K, 1M or 1G".to_string();
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        _ => return Err(bad()),
    };
    match n.checked_mul(mult) {
        Some(v) if (1..=1 << 30).contains(&v) => Ok(v),
        _ => Err(bad()),
    }
}

/// The longest argument taken: a path's limit (`PATH_MAX`, 4096 bytes); no option takes more.
pub const MAX_ARG_BYTES: usize = 4096;

/// Refuses an argument longer than [`MAX_ARG_BYTES`], quoting only its start, so that a value
/// pasted by mistake (100 kB) is neither parsed nor echoed whole by the messages that quote it.
pub fn refuse_long_args(args: &[std::ffi::OsString]) -> Result<(), String> {
    match args
        .iter()
        .enumerate()
        .find(|(_, a)| a.len() > MAX_ARG_BYTES)
    {
        Some((i, a)) => Err(format!(
            "argument {i} is {} bytes long ({}): no option takes more than {MAX_ARG_BYTES}",
            a.len(),
            crate::validate::quote(&a.to_string_lossy())
        )),
        None => Ok(()),
    }
}

/// The arguments as clap should see them: when the binary is called through a link named
/// `oslat` or `cyclictest` (a drop-in for the real tool), the command name is put in front.
pub fn args_for_invocation(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let mut args: Vec<_> = args.into_iter().collect();
    let called = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .map(str::to_string);
    if let Some(tool @ ("oslat" | "cyclictest")) = called.as_deref() {
        args.insert(1, tool.into());
    }
    args
}

/// Whether the program was called by a real tool's name (`oslat`, `cyclictest`: a link), so
/// that messages name it as the tool would.
pub fn called_as_tool(argv0: &str) -> bool {
    let name = std::path::Path::new(argv0)
        .file_name()
        .and_then(|n| n.to_str());
    matches!(name, Some("oslat" | "cyclictest"))
}

/// What oslat 2.4 prints for a command line it refuses, for a refusal of clap's: getopt's
/// `oslat: invalid option -- 'x'` (or `unrecognized option '--x'`, `option requires an argument
/// -- 'D'`) on stderr and the usage on stdout, or oslat's own `Illegal runtime: abc` and
/// `Illegal bucket size: 2000 (should be: 4-1024)` after its version line; exit status 1, as
/// oslat's. Returns the exit status when it printed, `None` for errors oslat has no shape for
/// (clap's message stands).
pub fn oslat_refusal(e: &clap::Error) -> Option<i32> {
    use clap::error::{ContextKind, ErrorKind};
    let ctx = |k| error_context(e, k);
    match e.kind() {
        ErrorKind::UnknownArgument => {
            let arg = ctx(ContextKind::InvalidArg)?;
            say_unknown_option("oslat", &arg);
            print!("{}", subcommand_help("oslat"));
            Some(1)
        }
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            let arg = ctx(ContextKind::InvalidArg)?;
            let value = ctx(ContextKind::InvalidValue).unwrap_or_default();
            // A value left out (getopt's line); an empty one given (`-D ''`) is a bad value.
            if value.is_empty() && e.kind() == ErrorKind::InvalidValue {
                let short = short_of("oslat", &arg)?;
                eprintln!("oslat: option requires an argument -- '{short}'");
                print!("{}", subcommand_help("oslat"));
                return Some(1);
            }
            let line = if arg.starts_with("--duration") {
                format!("Illegal runtime: {value}")
            } else if arg.starts_with("--bucket-size") {
                format!("Illegal bucket size: {value} (should be: 4-1024)")
            } else if arg.starts_with("--rtprio") {
                format!("Illegal RT priority: {value} (should be: 1-99)")
            } else if arg.starts_with("--trace-threshold") {
                "Parameter --trace-threshold needs to be positive".to_string()
            } else if arg.starts_with("--workload-mem") {
                format!("Unknown workload memory size '{value}'.\n")
            } else if arg.starts_with("--workload ") {
                // oslat's own line, and the blank line it ends with.
                format!("Unknown workload '{value}'.  Please choose from: 'no', 'memmove'\n")
            } else {
                return None;
            };
            println!("oslat V 2.40");
            println!("{line}");
            // And ours, which says what is legal.
            let ours = e.to_string();
            let ours = ours.lines().next().unwrap_or_default();
            eprintln!("qpw-emu: {}", ours.trim_start_matches("error: "));
            Some(1)
        }
        _ => None,
    }
}

/// What cyclictest 2.4 prints for a command line clap refuses. An unknown option (getopt's
/// `cyclictest: unrecognized option '--x'` or `invalid option -- 'k'`) and a missing argument
/// (`option requires an argument -- 'i'`) print that line on stderr and the usage on stdout,
/// exit status 0 (2.4 treats them as `--help`). A bad value prints the usage and exits 1 where
/// 2.4 refuses it (`-p 200`, `-h -1`, `-c 5`), with our reason, which names the flag and the
/// legal range, on stderr; where 2.4 reads a bad value as 0 and runs on (`-i abc`, `-l x`) we
/// refuse it the same way (README). `None` for other errors (clap's message stands).
pub fn cyclictest_refusal(e: &clap::Error) -> Option<i32> {
    use clap::error::{ContextKind, ErrorKind};
    let ctx = |k| error_context(e, k);
    let usage = || print!("{}", subcommand_help("cyclictest"));
    match e.kind() {
        ErrorKind::UnknownArgument => {
            let arg = ctx(ContextKind::InvalidArg)?;
            say_unknown_option("cyclictest", &arg);
            usage();
            Some(0)
        }
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            let arg = ctx(ContextKind::InvalidArg)?;
            // A value left out (getopt's line); an empty one given (`-D ''`) is a bad value.
            if ctx(ContextKind::InvalidValue)
                .unwrap_or_default()
                .is_empty()
                && e.kind() == ErrorKind::InvalidValue
            {
                match short_of("cyclictest", &arg) {
                    Some(c) => eprintln!("cyclictest: option requires an argument -- '{c}'"),
                    None => eprintln!(
                        "cyclictest: option '{}' requires an argument",
                        arg.split(' ').next().unwrap_or_default()
                    ),
                }
                usage();
                return Some(0);
            }
            usage();
            let ours = e.to_string();
            let ours = ours.lines().next().unwrap_or_default();
            eprintln!("qpw-emu: {}", ours.trim_start_matches("error: "));
            Some(1)
        }
        _ => None,
    }
}

/// A clap error's context of this kind, as text.
fn error_context(e: &clap::Error, kind: clap::error::ContextKind) -> Option<String> {
    match e.get(kind) {
        Some(clap::error::ContextValue::String(s)) => Some(s.clone()),
        _ => None,
    }
}

/// getopt's line on stderr for an option `tool` does not know: `tool: unrecognized option
/// '--x'`, or `tool: invalid option -- 'x'` for a short one.
fn say_unknown_option(tool: &str, arg: &str) {
    match arg.strip_prefix("--") {
        Some(_) => eprintln!("{tool}: unrecognized option '{arg}'"),
        None => eprintln!(
            "{tool}: invalid option -- '{}'",
            arg.trim_start_matches('-').chars().next().unwrap_or('?')
        ),
    }
}

/// The short letter of the flag a clap error names (`--duration <TIME>`), in a subcommand.
fn short_of(subcommand: &str, named: &str) -> Option<char> {
    use clap::CommandFactory;
    let long = named
        .trim_start_matches('-')
        .split(' ')
        .next()
        .unwrap_or("");
    Cli::command()
        .find_subcommand(subcommand)?
        .get_arguments()
        .find(|a| a.get_long() == Some(long))?
        .get_short()
}

/// What rt-tests 2.4's cyclictest makes of its command line's order, which clap does not see:
/// read with getopt's rules before clap parses `args` (the whole command line, `cyclictest`
/// at index 1), and `args` rewritten where 2.4 reads a word differently.
///
/// - `-a`, `-A`, `-t` and `--secaligned` take an optional argument; 2.4 also takes the next
///   word as it, but only a number (for `-a` also a word starting with `0`, `!`, `+` or `a`).
///   Any other next word is not theirs (`-t abc`: a thread per CPU, `abc` ignored), so it is
///   moved after a `--` at the end, where the ignored words go.
/// - `-a` before `-S/--smp` is fatal in 2.4 (`FATAL: numa and smp options are mutually
///   exclusive`, exit 1; the other order only warns): `Err(1)` once that is printed.
/// - `-v` before `-a CPUSET` makes 2.4 print `Using N cpus.` once more: the returned flag.
pub fn cyclictest_getopt(args: &mut Vec<std::ffi::OsString>) -> Result<bool, i32> {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    // Built, so that every option says how many arguments it takes.
    cmd.build();
    let Some(sub) = cmd.find_subcommand("cyclictest") else {
        return Ok(false);
    };
    // How each option takes its argument: 0 none, 1 required, 2 optional.
    let takes = |a: &clap::Arg| match a.get_num_args() {
        Some(n) if n.min_values() == 1 => 1,
        Some(n) if n.max_values() == 1 => 2,
        _ => 0,
    };
    let by_short = |c: char| sub.get_arguments().find(|a| a.get_short() == Some(c));
    let by_long = |name: &str| {
        let exact = sub.get_arguments().find(|a| a.get_long() == Some(name));
        let mut prefixed = sub
            .get_arguments()
            .filter(|a| a.get_long().is_some_and(|l| l.starts_with(name)));
        exact.or_else(|| match (prefixed.next(), prefixed.next()) {
            (Some(a), None) => Some(a),
            _ => None,
        })
    };
    // 2.4's test for taking the next word as an optional argument: atoi() of it is not 0.
    let atoi_nonzero = |w: &str| {
        let t = w.trim_start();
        let t = t.strip_prefix(['+', '-']).unwrap_or(t);
        t.chars().take_while(char::is_ascii_digit).any(|c| c != '0')
    };
    // What one option changes in the order's state: `-v` noted, `-S` after `-a` fatal.
    fn seen(id: &str, affinity_seen: bool, verbose_seen: &mut bool) -> Result<(), i32> {
        match id {
            "verbose" => *verbose_seen = true,
            "smp" if affinity_seen => {
                eprintln!("FATAL: numa and smp options are mutually exclusive");
                return Err(1);
            }
            _ => {}
        }
        Ok(())
    }
    let (mut affinity_seen, mut verbose_seen, mut verbose_before_affinity) = (false, false, false);
    let mut moved = Vec::new();
    let mut i = 2;
    while i < args.len() {
        let Some(word) = args[i].to_str().map(str::to_string) else {
            i += 1;
            continue;
        };
        if word == "--" {
            break;
        }
        // The option this word is, and whether its argument is attached.
        let (arg, attached) = if let Some(long) = word.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((n, _)) => (n, true),
                None => (long, false),
            };
            (by_long(name), value)
        } else if word.len() > 1 && word.starts_with('-') {
            // A cluster of short options: walk it until one takes an argument.
            let mut found = (None, false);
            for (at, c) in word.char_indices().skip(1) {
                let Some(a) = by_short(c) else { break };
                if takes(a) > 0 {
                    found = (Some(a), at + c.len_utf8() < word.len());
                    break;
                }
                seen(a.get_id().as_str(), affinity_seen, &mut verbose_seen)?;
            }
            found
        } else {
            (None, false)
        };
        i += 1;
        let Some(a) = arg else { continue };
        seen(a.get_id().as_str(), affinity_seen, &mut verbose_seen)?;
        let id = a.get_id().as_str().to_string();
        if id == "affinity" {
            affinity_seen = true;
        }
        match takes(a) {
            1 if !attached => i += 1,
            2 if !attached => {
                let next = args.get(i).and_then(|w| w.to_str()).map(str::to_string);
                let Some(next) = next else { continue };
                let theirs = atoi_nonzero(&next)
                    || (id == "affinity" && next.starts_with(['0', '!', '+', 'a']));
                if id == "affinity" && verbose_seen {
                    verbose_before_affinity = theirs;
                }
                if theirs {
                    i += 1;
                } else if !next.starts_with('-') {
                    moved.push(args.remove(i));
                }
            }
            _ if id == "affinity" && verbose_seen => verbose_before_affinity = attached,
            _ => {}
        }
    }
    if !moved.is_empty() {
        if !args.iter().any(|a| a == "--") {
            args.push("--".into());
        }
        args.extend(moved);
    }
    Ok(verbose_before_affinity)
}

/// A subcommand's `--help` text, as the drop-ins' refusals print it for their usage.
fn subcommand_help(name: &str) -> String {
    use clap::CommandFactory;
    Cli::command()
        .find_subcommand_mut(name)
        .map(|c| c.render_help().to_string())
        .unwrap_or_default()
}

/// Says on stderr that a drop-in ignored words that are not options, as the real tool does.
pub fn note_stray(tool: &str, words: &[String]) {
    if !words.is_empty() {
        eprintln!(
            "qpw-emu {tool}: ignoring `{}`: not options ({tool} 2.4 ignores such words too)",
            words.join(" ")
        );
    }
}

/// `qpw-emu load`.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// How long (default: until Ctrl-C): 10, 30s, 500ms, 20m, 2h.
    #[arg(short = 'D', long, value_name = "TIME", allow_hyphen_values = true)]
    pub duration: Option<String>,
    /// CPUs to keep free of our threads (all but their workers in queue mode); default: the
    /// last allowed CPU.
    #[arg(long, value_name = "LIST", allow_hyphen_values = true)]
    pub free: Option<String>,
    /// Skip empty caches instead of forcing every drain to every CPU.
    #[arg(long)]
    pub no_force: bool,
    /// Print only the summary.
    #[arg(short, long)]
    pub quiet: bool,
    /// Write the requester's figures as JSON to this file (- for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// The drain load.
    #[command(flatten)]
    pub drain: DrainArgs,
}

/// `qpw-emu resctrl`.
#[derive(Debug, Clone, Args)]
pub struct ResctrlArgs {
    /// Monitoring groups read, 1-4095 (default: as many as make 750 files over the domains,
    /// one domain per allowed CPU).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub groups: Option<String>,
    /// Passes over all files per read path, 1-1000 (default 2).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub passes: Option<String>,
    /// Busy threads on each domain CPU but the reader's, 0-16 (default 8: a fleet machine's
    /// load, where a woken worker waits its turn).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub load: Option<String>,
    /// Print only the table.
    #[arg(short, long)]
    pub quiet: bool,
    /// Write the figures as JSON to this file (- for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// `qpw-emu pool`.
#[derive(Debug, Clone, Args)]
pub struct PoolArgs {
    /// hackbench messages per sender per receiver, 1-100000 (default 200).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub loops: Option<String>,
    /// What the messages travel through: pipe (default, as in the hackbench runs of the LKML
    /// thread "sched: Fix performance regression introduced by mm_cid", 2023) or socketpair.
    #[arg(long, value_name = "KIND", allow_hyphen_values = true)]
    pub transport: Option<String>,
    /// Print only the table.
    #[arg(short, long)]
    pub quiet: bool,
    /// Write the figures as JSON to this file (- for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// `qpw-emu report`.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// JSON files written by qpw-emu, oslat or cyclictest.
    #[arg(required = true, value_name = "FILE.json")]
    pub files: Vec<PathBuf>,
    /// For files without their own interruption count: count samples above this many
    /// microseconds (0.001-10000000; default per tool: 10 x the smallest median among its
    /// files, at least 1 us).
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    pub threshold: Option<String>,
    /// Where to write the SVG plots (default: the first file's folder).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}
