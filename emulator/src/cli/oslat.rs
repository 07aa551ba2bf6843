//! `qpw-emu oslat`'s arguments: rt-tests 2.4's oslat, flag for flag, then ours.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{
    duration_value, getopt_required_argument, int_range, loop_workload, mem_size, DrainArgs, OURS,
};

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
