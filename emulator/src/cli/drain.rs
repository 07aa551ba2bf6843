//! The drain load's arguments, which the probes and `qpw-emu load` share: the mode, the
//! workload, the rate, the isolation, and the trace and filler options.

use std::path::PathBuf;

use clap::Args;

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
