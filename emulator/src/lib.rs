//! `qpw-emu`: oslat- and cyclictest-style probes around kernel-style per-CPU drains, in queue
//! and remote mode, with rt-tests-compatible JSON, text tables and SVG plots.
//!
//! | command | what it does |
//! |---|---|
//! | `qpw-emu` / `qpw-emu run` | the default experiment: idle baseline, then each mode x mm workload, one table |
//! | `qpw-emu oslat` | rt-tests 2.4's oslat, flag for flag and line for line, optionally under a drain load |
//! | `qpw-emu cyclictest` | rt-tests 2.4's cyclictest, flag for flag and line for line, optionally under a drain load |
//! | `qpw-emu load` | only the drain load, to run the real rt-tests tools beside it |
//! | `qpw-emu resctrl`, `qpw-emu pool` | the resctrl read paths and the buffer-pool designs side by side |
//! | `qpw-emu report FILE.json...` | tables and SVG plots from saved results |
//!
//! # Reading the default experiment's table
//!
//! One row per scenario, all measured on the same target CPU in one run, interleaved in rounds:
//!
//! - **target** (left): the oslat probe's gaps on the target CPU: max, p99, p99.9, p99.99 (in-range
//!   percentiles are bucket upper edges, 10 ns wide; tail ones exact); *interrupt*: gaps of 5 us
//!   or more (fixed: above the probe's own operation and this kind of VM's dense band of 1-3 us
//!   noise; the notes give each scenario's rate at 2, 5, 10 and 20 us); *in op*: of those, the
//!   ones that contained the probe's own local operation (waiting for its CPU's lock rather than
//!   being preempted); *per s*; *per drain*: (interruptions - idle rate x seconds) / drains that
//!   reached the target, worked out for each round against the idle rate of the same round,
//!   the median of the rounds shown with its standard error over the rounds (the JSON has each
//!   round's figure and the pooled one); left out for a round with fewer than 50 drains
//!   reaching the target, and for the kernel rows, which run without the idle baseline's local
//!   operation and load (the trace's gaps per drain in the kernel table stand in); *switch*: the
//!   probe thread's context switches, involuntary plus voluntary, per drain that reached the
//!   target (around each round), which a vCPU the hypervisor does not run leaves alone: about 1
//!   in queue mode, about 0 in remote; *op ns*: the median time of the probe's own local
//!   operation (the owner's cost), timed alone to the nanosecond;
//! - **requester** (right): drains done at the fixed rate, drain time p50, p99, max, and
//!   *stalls* (drains that waited 100 ms or more for queued work, or gave up at the 1 s
//!   timeout; RT throttling lets a worker starved by a `SCHED_FIFO` probe in after 0.95 s). For
//!   the kernel rows these time the trigger's whole `write()` (a compaction for kernel-lru), not
//!   the drain: the kernel table under it times the drain's runs on the target from the trace.
//!
//! Without isolated CPUs the machine's noise is in every figure, so the modes are compared as
//! ratios and counts within the run; the notes under the table say so, and say why when a
//! difference does not show.
//!
//! # Shape
//!
//! The binary's `main` only prints `Error: {e:#}` and sets the exit code; every option reaches
//! the commands as text and is validated there, with errors that quote the flag and its legal
//! range. Data flows one way, as in hyperfine and rt-tests: parse, then run, then report.
//!
//! 1. **The command line** ([`cli`]) declares the arguments and validates what needs no
//!    machine. It imports no command: a default that a command also uses lives in
//!    [`defaults`].
//! 2. **The commands** ([`commands`]): a dispatcher and one module per command, the default
//!    experiment ([`commands::run`]), the drop-ins ([`commands::oslat`],
//!    [`commands::cyclictest`]), [`commands::load`], [`commands::trace`],
//!    [`commands::report`], [`commands::resctrl`] and [`commands::pool`]. A command uses
//!    [`cli`]'s argument types and the modules below, never another command nor the
//!    dispatcher.
//! 3. **What the commands share**, below them: the CPUs ([`cpus`]), the drain load around a
//!    probe ([`drain`]), the probes' `--trace` ([`probe_trace`]), the comparison table
//!    ([`table`]), the oslat JSON ([`oslat::oslat_json`]).
//! 4. **One module per concern** under those: the probes ([`oslat`], [`cyclictest`]) and what
//!    they do alike with their threads ([`threads`]), their clock ([`clock`]), histograms
//!    ([`hist`]), the real-time setup ([`rt`]), what a command says, where its JSON goes and
//!    the warnings it gathers ([`sink`]), Ctrl-C ([`signals`]), the isolation and RT throttling ([`isolate`],
//!    [`throttling`]), the settings a run changes and records for the next run to put back
//!    should it be killed ([`setting`]), the measured CPU's tick and what the run itself puts
//!    there ([`tick`]), the load ([`load`], [`scenario`], [`workload`]), the built-in minimal workload ([`counter`]), the kernel's
//!    own drains ([`kernel`]), the trace ([`trace`]), and one exporter per format ([`json`],
//!    [`svg`], [`table`]).
//!
//! Nothing below the commands imports one: `emulator/tests/layers.rs` fails, naming the file
//! and the import, when a command reaches another command or the dispatcher, or when
//! [`cli`] or a module below the commands reaches a command.

#![warn(missing_docs, unsafe_op_in_unsafe_fn)]

// Standard output and error that a run survives losing ([`out`]): these shadow `std`'s
// printing macros in every module of the crate, which are declared below them.

/// `std`'s `print!`, through [`out::stdout`]: a closed standard output stops the run instead of
/// panicking.
macro_rules! print {
    ($($arg:tt)*) => { $crate::out::stdout(format_args!($($arg)*)) };
}

/// `std`'s `println!`, through [`out::stdout`].
macro_rules! println {
    () => { $crate::out::stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::out::stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `std`'s `eprint!`, through [`out::stderr`]: a failed write to standard error is dropped
/// instead of panicking.
macro_rules! eprint {
    ($($arg:tt)*) => { $crate::out::stderr(format_args!($($arg)*)) };
}

/// `std`'s `eprintln!`, through [`out::stderr`].
macro_rules! eprintln {
    () => { $crate::out::stderr(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::out::stderr(format_args!("{}\n", format_args!($($arg)*))) };
}

pub mod cli;
pub mod clock;
pub mod commands;
pub mod counter;
pub mod cpus;
pub mod cyclictest;
pub mod defaults;
pub mod drain;
pub mod hist;
pub mod isolate;
pub mod json;
pub mod kernel;
pub mod load;
pub mod oslat;
pub mod out;
pub mod probe_trace;
pub mod progress;
pub mod rt;
pub mod scenario;
pub mod setting;
pub mod signals;
pub mod sink;
pub mod svg;
pub mod table;
pub mod threads;
pub mod throttling;
pub mod tick;
pub mod trace;
pub mod validate;
pub mod workload;
