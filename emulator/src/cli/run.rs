//! `qpw-emu run`'s arguments: the default experiment.

use std::path::PathBuf;

use clap::Args;

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
