//! The other commands' arguments: `load`, `resctrl`, `pool` and `report`.

use std::path::PathBuf;

use clap::Args;

use super::DrainArgs;

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
