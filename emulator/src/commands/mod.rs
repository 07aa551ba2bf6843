//! The commands, one module each: [`crate::cli`] has parsed the command line, [`dispatch`]
//! hands the arguments to the command, which validates them, sets up, runs the probe or the
//! load, prints and exports.
//!
//! | module | command |
//! |---|---|
//! | [`run`] | `qpw-emu` / `qpw-emu run`: the default experiment |
//! | [`oslat`] | `qpw-emu oslat`: rt-tests 2.4's oslat, line for line |
//! | [`cyclictest`] | `qpw-emu cyclictest`: rt-tests 2.4's cyclictest, line for line |
//! | [`load`] | `qpw-emu load`: only the drain load |
//! | [`trace`] | `qpw-emu trace`: what runs on the CPUs, beside the real tools |
//! | [`report`] | `qpw-emu report`: tables and plots from saved results |
//! | [`resctrl`], [`pool`] | the workloads crate's figures, side by side |
//!
//! A command uses the command line's argument types and the modules below the commands, never
//! another command nor this dispatcher: what two commands share lives below them, in the CPUs
//! ([`crate::cpus`]), the drain load around a probe ([`crate::drain`]), the probes' `--trace`
//! ([`crate::probe_trace`]), the comparison table ([`crate::table`]) or the oslat JSON
//! ([`crate::oslat::oslat_json`]); and nothing below the commands, [`crate::cli`] included,
//! uses one. `emulator/tests/layers.rs` holds the tree to that.

pub mod cyclictest;
pub mod load;
pub mod oslat;
pub mod pool;
pub mod report;
pub mod resctrl;
pub mod run;
pub mod trace;

use anyhow::Result;

use crate::cli::{Cli, Command};

/// Runs the command line's command.
pub fn dispatch(cli: Cli) -> Result<()> {
    crate::out::ignore_sigpipe();
    match cli.command {
        None => run::run(&run::default_args()),
        Some(Command::Run(args)) => run::run(&args),
        Some(Command::Oslat(args)) => oslat::oslat_cmd(&args),
        Some(Command::Cyclictest(args)) => cyclictest::cyclictest_cmd(&args),
        Some(Command::Load(args)) => load::load_cmd(&args),
        Some(Command::Resctrl(args)) => resctrl::resctrl_cmd(&args),
        Some(Command::Pool(args)) => pool::pool_cmd(&args),
        Some(Command::Report(args)) => report::report_cmd(&args),
        Some(Command::Trace(args)) => trace::trace_cmd(&args),
        Some(Command::Filler(args)) => crate::kernel::filler_main(args.cpu, args.pcp),
    }
}
