//! The command line, as clap parses it. Values stay text here; `commands` validates them with
//! messages that name the flag and the legal range.

use std::path::PathBuf;

use clap::{ArgAction, Args, Parser, Subcommand};

/// oslat- and cyclictest-style probes around kernel-style per-CPU drains, in queue mode
/// (work posted to a worker on the target CPU) and remote mode (run by the requester under the
/// target CPU's lock).
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
    Oslat(OslatArgs),
    /// The cyclictest probe: threads waking on an absolute deadline, measuring how late.
    Cyclictest(CyclictestArgs),
    /// Only the drain load (requester drains plus process-context operations), for running
    /// the real rt-tests tools beside it on the CPU it leaves free.
    Load(LoadArgs),
    /// The resctrl counter read paths side by side (from qpw-workloads).
    Resctrl(ResctrlArgs),
    /// The buffer-pool designs side by side (from qpw-workloads).
    Pool(PoolArgs),
    /// Text tables and SVG plots from saved JSON results (ours or the real tools').
    Report(ReportArgs),
}

/// The drain options shared by the probes and the load.
#[derive(Debug, Clone, Args)]
pub struct DrainArgs {
    /// Drain mode: queue (post to the target CPU's worker) or remote (run under the target's
    /// lock in the requester). Giving --mode or --workload turns the load on.
    #[arg(long, value_name = "MODE", allow_hyphen_values = true)]
    pub mode: Option<String>,
    /// Workload: lru, memcg, slub, pcp, or counter (the emulator's built-in minimal one).
    #[arg(long, value_name = "NAME", allow_hyphen_values = true)]
    pub workload: Option<String>,
    /// Requester drains per second, 0-100000 (0: no drains).
    #[arg(
        long,
        value_name = "HZ",
        default_value = "1000",
        allow_hyphen_values = true
    )]
    pub drain_rate: String,
    /// Process-context load on the other CPUs: on or off.
    #[arg(
        long,
        value_name = "on|off",
        default_value = "on",
        allow_hyphen_values = true
    )]
    pub load: String,
    /// How often the probe does a local operation itself, in microseconds (1-1000000).
    #[arg(
        long,
        value_name = "US",
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
    /// Workloads, comma-separated: lru, memcg, slub, pcp, counter (default: lru,memcg,slub).
    #[arg(long, value_name = "LIST", allow_hyphen_values = true)]
    pub workloads: Option<String>,
    /// Requester drains per second, 1-100000.
    #[arg(
        long,
        value_name = "HZ",
        default_value = "1000",
        allow_hyphen_values = true
    )]
    pub drain_rate: String,
    /// The measured CPU (default: an isolated CPU, else the last allowed one).
    #[arg(long, value_name = "CPU", allow_hyphen_values = true)]
    pub target: Option<String>,
    /// Run the probe SCHED_FIFO at this priority (1-99); the worker then cannot preempt it.
    #[arg(short = 'f', long, value_name = "PRIO", allow_hyphen_values = true)]
    pub rtprio: Option<String>,
    /// How often the probe does a local operation itself, in microseconds (1-1000000).
    #[arg(
        long,
        value_name = "US",
        default_value = "200",
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
    /// Print only the table.
    #[arg(short, long)]
    pub quiet: bool,
}

/// `qpw-emu oslat`, with oslat's own flags.
#[derive(Debug, Clone, Args)]
pub struct OslatArgs {
    /// CPUs to measure, e.g. 1,3-5 (default: an isolated CPU, else the last allowed one).
    #[arg(short = 'c', long, value_name = "LIST", allow_hyphen_values = true)]
    pub cpu_list: Option<String>,
    /// Test duration: 10, 30s, 500ms, 20m, 2h.
    #[arg(
        short = 'D',
        long,
        value_name = "TIME",
        default_value = "1",
        allow_hyphen_values = true
    )]
    pub duration: String,
    /// Number of buckets, 1-4096.
    #[arg(
        short = 'b',
        long,
        value_name = "N",
        default_value = "32",
        allow_hyphen_values = true
    )]
    pub bucket_size: String,
    /// Bucket width in nanoseconds, 1-1000000.
    #[arg(
        short = 'W',
        long,
        value_name = "NS",
        default_value = "1000",
        allow_hyphen_values = true
    )]
    pub bucket_width: String,
    /// SCHED_FIFO priority, 1-99.
    #[arg(short = 'f', long, value_name = "PRIO", allow_hyphen_values = true)]
    pub rtprio: Option<String>,
    /// Stop when a gap reaches this many microseconds (1-10000000); writes an ftrace marker
    /// when tracing is available.
    #[arg(short = 'T', long, value_name = "US", allow_hyphen_values = true)]
    pub trace_threshold: Option<String>,
    /// Print the summary only.
    #[arg(short, long)]
    pub quiet: bool,
    /// Leave out buckets that are zero on every CPU.
    #[arg(short = 'z', long)]
    pub zero_omit: bool,
    /// Write the results as JSON to this file (- for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// The drain load.
    #[command(flatten)]
    pub drain: DrainArgs,
}

/// `qpw-emu cyclictest`, with cyclictest's own flags.
#[derive(Debug, Clone, Args)]
#[command(disable_help_flag = true)]
pub struct CyclictestArgs {
    /// Pin the threads to these CPUs, round robin, e.g. 1 or 0-1 (default: an isolated CPU,
    /// else the last allowed one).
    #[arg(short = 'a', long, value_name = "LIST", allow_hyphen_values = true)]
    pub affinity: Option<String>,
    /// Number of threads, 1-1024 (default: 1).
    #[arg(
        short = 't',
        long,
        value_name = "N",
        default_value = "1",
        allow_hyphen_values = true
    )]
    pub threads: String,
    /// SCHED_FIFO priority of the threads, 0-99 (0: SCHED_OTHER).
    #[arg(
        short = 'p',
        long,
        value_name = "PRIO",
        default_value = "0",
        allow_hyphen_values = true
    )]
    pub priority: String,
    /// Interval in microseconds, 10-1000000.
    #[arg(
        short = 'i',
        long,
        value_name = "US",
        default_value = "1000",
        allow_hyphen_values = true
    )]
    pub interval: String,
    /// Test duration: 10, 30s, 500ms, 20m, 2h.
    #[arg(
        short = 'D',
        long,
        value_name = "TIME",
        default_value = "10",
        allow_hyphen_values = true
    )]
    pub duration: String,
    /// Print a histogram of this many 1 us buckets, 1-1000000.
    #[arg(short = 'h', long, value_name = "US", allow_hyphen_values = true)]
    pub histogram: Option<String>,
    /// Lock memory (mlockall).
    #[arg(short = 'm', long)]
    pub mlockall: bool,
    /// Stop when a latency exceeds this many microseconds (1-10000000); writes an ftrace
    /// marker when tracing is available.
    #[arg(short = 'b', long, value_name = "US", allow_hyphen_values = true)]
    pub breaktrace: Option<String>,
    /// Print the summary only.
    #[arg(short, long)]
    pub quiet: bool,
    /// Write the results as JSON to this file (- for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Print help (-h is the histogram, as in cyclictest).
    #[arg(long, action = ArgAction::Help)]
    pub help: Option<bool>,
    /// The drain load.
    #[command(flatten)]
    pub drain: DrainArgs,
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
    /// What the messages travel through: pipe (default, as in seed 004) or socketpair.
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
    /// microseconds (0.001-10000000).
    #[arg(
        long,
        value_name = "US",
        default_value = "10",
        allow_hyphen_values = true
    )]
    pub threshold: String,
    /// Where to write the SVG plots (default: the first file's folder).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}
