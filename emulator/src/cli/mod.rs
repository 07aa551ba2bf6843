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

use clap::{Parser, Subcommand};

mod cyclictest;
mod drain;
mod invocation;
mod oslat;
mod run;
mod tools;
mod values;

pub use cyclictest::CyclictestArgs;
pub use drain::{DrainArgs, FillerArgs, TraceArgs};
pub use invocation::{
    args_for_invocation, called_as_tool, cyclictest_getopt, cyclictest_refusal, note_stray,
    oslat_refusal, refuse_long_args, MAX_ARG_BYTES,
};
pub use oslat::OslatArgs;
pub use run::RunArgs;
pub use tools::{LoadArgs, PoolArgs, ReportArgs, ResctrlArgs};
use values::getopt_required_argument;
pub use values::{
    duration_value, hist_size, int_range, loop_workload, mem_size, run_length, RunLength,
};

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
