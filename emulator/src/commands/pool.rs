//! `qpw-emu pool`: the buffer-pool designs side by side under hackbench, shown as a table and
//! exported as JSON.
//!
//! The figures are measured by `qpw_workloads::pool::pool_figures`; this module only validates
//! options, runs it, and turns its typed result into our typed JSON.

use std::fmt::Write;

use anyhow::{Context, Result};
use qpw_workloads::pool::{self, PoolFigures, PoolFiguresConfig};
use serde::Serialize;

use crate::cli::PoolArgs;
use crate::json::Envelope;
use crate::rt;
use crate::sink::{JsonOut, Sink};
use crate::validate;

/// One hackbench run on one pool design.
#[derive(Debug, Serialize)]
struct PoolRunJson {
    /// `global`, `percpu-cache` or `percpu-pools`.
    design: String,
    /// Sender and receiver threads.
    threads: usize,
    /// Messages delivered.
    messages: u64,
    /// Hook runs: one get/use/put of a buffer on one CPU per `write` and per `read`.
    hooks: u64,
    /// Hook runs whose buffer was used by another hook at the same time (must be 0).
    corrupt: u64,
    /// Wall time in ms.
    elapsed_ms: f64,
    /// Messages per second.
    messages_per_sec: f64,
    /// Throughput relative to the global-lock design at the same thread count.
    vs_global: Option<f64>,
    /// Failed trylocks.
    lock_contention: u64,
    /// Failed compare-and-swaps on return stacks.
    cas_retries: u64,
    /// Gets served without the global lock.
    local_hits: u64,
    /// Puts returned to another CPU's pool.
    remote_returns: u64,
    /// Buffers allocated.
    allocated: u64,
    /// Double hand-outs or returns (must be 0).
    violations: u64,
}

/// The pool figures.
#[derive(Debug, Serialize)]
struct PoolJson {
    /// `pool`.
    tool: String,
    /// The CPUs (physical or logical).
    cpus: String,
    /// Whether they were logical.
    logical: bool,
    /// `pipe` or `socketpair`.
    transport: String,
    /// One entry per design and thread count.
    runs: Vec<PoolRunJson>,
}

fn pool_json(f: &PoolFigures) -> PoolJson {
    let global = |threads: usize| {
        f.runs
            .iter()
            .find(|r| r.threads == threads && r.design == pool::Design::GlobalLock)
            .map(|r| r.messages_per_sec)
    };
    PoolJson {
        tool: "pool".into(),
        cpus: f.cpus.clone(),
        logical: f.logical,
        transport: f
            .runs
            .first()
            .map_or(pool::Transport::default(), |r| r.transport)
            .name()
            .to_string(),
        runs: f
            .runs
            .iter()
            .map(|r| PoolRunJson {
                design: r.design.name().to_string(),
                threads: r.threads,
                messages: r.messages,
                hooks: r.hooks,
                corrupt: r.corrupt,
                elapsed_ms: r.elapsed.as_secs_f64() * 1e3,
                messages_per_sec: r.messages_per_sec,
                vs_global: global(r.threads)
                    .filter(|g| *g > 0.0)
                    .map(|g| r.messages_per_sec / g),
                lock_contention: r.stats.lock_contention,
                cas_retries: r.stats.cas_retries,
                local_hits: r.stats.local_hits,
                remote_returns: r.stats.remote_returns,
                allocated: r.stats.allocated,
                violations: r.stats.violations,
            })
            .collect(),
    }
}

/// `qpw-emu pool`.
pub fn pool_cmd(args: &PoolArgs) -> Result<()> {
    let mut config = PoolFiguresConfig::default();
    if let Some(l) = &args.loops {
        config.loops = validate::int_in("--loops", l, 1, 100_000)? as usize;
    }
    let json = JsonOut::checked("--json", args.json.as_deref())?;
    if let Some(t) = &args.transport {
        config.transport = match t.as_str() {
            "pipe" => pool::Transport::Pipe,
            "socketpair" => pool::Transport::Socketpair,
            _ => anyhow::bail!("--transport {t}: must be pipe or socketpair"),
        };
    }
    let start_time = rt::rt_timestamp();
    let sink = Sink::new(args.quiet).with_json(json);
    sink.say(format_args!(
        "qpw-emu pool: hackbench ({} fds per group, {} loops, {}s, AppArmor's hook on every \
             read and write) on each design at {:?} groups, from qpw_workloads::pool::pool_figures",
        config.fds,
        config.loops,
        config.transport.name(),
        config.groups
    ));
    let figures = pool::pool_figures(&config).context("pool figures")?;
    let j = pool_json(&figures);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "buffer pools under hackbench ({}s, a get/use/put hook per read and write); {}",
        j.transport, j.cpus
    );
    let _ = writeln!(
        s,
        "{:<13} {:>7} {:>9} {:>10} {:>12} {:>9} {:>10} {:>9} {:>10} {:>9} {:>9}",
        "design",
        "threads",
        "messages",
        "ms",
        "msgs/s",
        "vs global",
        "contention",
        "cas retry",
        "local hit",
        "remote",
        "allocated"
    );
    for r in &j.runs {
        let _ = writeln!(
            s,
            "{:<13} {:>7} {:>9} {:>10.1} {:>12.0} {:>9} {:>10} {:>9} {:>10} {:>9} {:>9}",
            r.design,
            r.threads,
            r.messages,
            r.elapsed_ms,
            r.messages_per_sec,
            r.vs_global.map_or("-".into(), |v| format!("{v:.2}x")),
            r.lock_contention,
            r.cas_retries,
            r.local_hits,
            r.remote_returns,
            r.allocated
        );
        if r.corrupt > 0 || r.violations > 0 {
            let _ = writeln!(
                s,
                "warning: {} hooks saw their buffer used by another, {} ownership violations",
                r.corrupt, r.violations
            );
        }
    }
    print!("{s}");
    if sink.wants_json() {
        sink.write_json(&Envelope::succeeded(start_time, j))?;
    }
    Ok(())
}
