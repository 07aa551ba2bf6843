//! `qpw-emu`: oslat- and cyclictest-style probes around kernel-style per-CPU drains, in queue
//! and remote mode, with rt-tests-compatible JSON, text tables and SVG plots.
//!
//! | command | what it does |
//! |---|---|
//! | `qpw-emu` / `qpw-emu run` | the default experiment: idle baseline, then each mode x mm workload, one table |
//! | `qpw-emu oslat` | the oslat probe (oslat's flags), optionally under a drain load |
//! | `qpw-emu cyclictest` | the cyclictest probe (cyclictest's flags), optionally under a drain load |
//! | `qpw-emu load` | only the drain load, to run the real rt-tests tools beside it |
//! | `qpw-emu resctrl`, `qpw-emu pool` | the resctrl read paths and the buffer-pool designs side by side |
//! | `qpw-emu report FILE.json...` | tables and SVG plots from saved results |
//!
//! The binary's `main` only prints `Error: {e:#}` and sets the exit code; every option reaches the commands
//! as text and is validated there, with errors that quote the flag and its legal range.

#![warn(unsafe_op_in_unsafe_fn)]

pub mod cli;
pub mod clock;
pub mod commands;
pub mod counter;
pub mod cyclictest;
pub mod experiment;
pub mod figures;
pub mod hist;
pub mod json;
pub mod load;
pub mod oslat;
pub mod progress;
pub mod report;
pub mod rt;
pub mod scenario;
pub mod svg;
pub mod validate;
pub mod workload;
