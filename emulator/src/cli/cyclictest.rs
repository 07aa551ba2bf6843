//! `qpw-emu cyclictest`'s arguments: rt-tests 2.4's cyclictest, flag for flag, then ours.

use std::path::PathBuf;

use clap::{ArgAction, Args};

use super::{
    getopt_required_argument, hist_size, int_range, run_length, DrainArgs, RunLength, OURS,
};

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
    /// `-v` came before `-a CPUSET` on the command line (from [`cyclictest_getopt`](super::invocation::cyclictest_getopt)): 2.4 then
    /// says `Using N cpus.` while it parses `-a`, once more than otherwise.
    #[arg(skip)]
    pub verbose_before_affinity: bool,
}
