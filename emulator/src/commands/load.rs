//! `qpw-emu load`: only the drain load (requester drains plus process-context operations), for
//! running the real rt-tests tools beside it on the CPUs it leaves free, until Ctrl-C or
//! `--duration`.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use qpw_core::{CpuSet, Mode};

use crate::scenario::DrainSpec;

use crate::cli::LoadArgs;
use crate::cpus::Cpus;
use crate::drain::{note_outcome, print_requester, resolve_drain, throttling_for_run};
use crate::json::Envelope;
use crate::rt;
use crate::scenario;
use crate::sink::{JsonOut, Sink};
use crate::throttling::RtThrottling;
use crate::validate;

/// `qpw-emu load`: its plan (the free CPUs, the load), the set-up it holds, the load until
/// Ctrl-C or `--duration`, the report.
pub fn load_cmd(args: &LoadArgs) -> Result<()> {
    let (cpus, duration, free, spec) = plan(args)?;
    let json = JsonOut::checked("--json", args.json.as_deref())?;
    let mut sink = Sink::new(args.quiet).with_json(json);
    let start_time = rt::rt_timestamp();
    let _rt = rt::prepare(true, &mut sink);
    rt::catch_sigint(&mut sink);
    // After Ctrl-C is taken: a signal must not end the process before the guard restores.
    let throttling_off = throttling_for_run(&args.drain, &mut sink)?;
    let throttling = RtThrottling::read(throttling_off.as_ref());
    let isolation = crate::isolate::for_run(args.drain.isolate, &free, &cpus.allowed, &mut sink)?;
    if !sink.is_quiet() {
        println!("qpw-emu load: {}", throttling.line());
    }
    let setup = scenario::setup(&spec)?;
    announce(&spec, &free, duration, &sink);
    let _away = rt::AwayFrom::cpus(&free);
    setup.phase.go();
    let start = crate::progress::wait_for("load", duration, &sink);
    let qpw_desc = setup.describe();
    let outcome = setup.finish(free.first())?;
    note_outcome(&outcome, &mut sink);
    print_requester(&outcome);
    if sink.wants_json() {
        let body = LoadBody {
            tool: "load".to_string(),
            mode: spec.mode.name().to_string(),
            workload: spec.workload.name().to_string(),
            qpw: qpw_desc,
            free: free.to_string(),
            seconds: start.elapsed().as_secs_f64(),
            requester: outcome.requester.clone(),
            rt_throttling: throttling,
            isolation: isolation.as_ref().map(|i| i.report.clone()),
            load: outcome.load.clone(),
            warnings: sink.warnings().to_vec(),
        };
        sink.write_json(&Envelope::succeeded(start_time, body))?;
    }
    Ok(())
}

/// The options checked: the allowed CPUs, the run's length, the CPUs left free, the load.
fn plan(args: &LoadArgs) -> Result<(Cpus, Option<Duration>, CpuSet, DrainSpec)> {
    let cpus = Cpus::read()?;
    let duration = args
        .duration
        .as_deref()
        .map(|d| validate::duration("--duration", d))
        .transpose()?;
    let free = cpus.list_or_target("--free", args.free.as_deref())?;
    if cpus.allowed.difference(&free).is_empty() {
        bail!(
            "--free {}: leaves no CPU for the requester and the load (allowed: {}); keep at least \
             one out of --free",
            validate::quote(args.free.as_deref().unwrap_or_default()),
            cpus.allowed
        );
    }
    let mut drain = args.drain.clone();
    // The load is this command's whole point: on even with neither flag, in the mode its help
    // gives as the default, the kernel's rule (remote on an isolated CPU; a 6.1 guest with
    // isolcpus ran it in queue mode, as this said before).
    if drain.mode.is_none() && drain.workload.is_none() {
        drain.mode = Some("auto".to_string());
    }
    let spec = resolve_drain(&drain, &cpus, &free, !args.no_force)?
        .ok_or_else(|| anyhow!("no load asked for"))?;
    if spec.drain_rate_hz == 0.0 && spec.load_cpus.is_empty() {
        bail!("--drain-rate 0 with --load off: nothing to run");
    }
    Ok((cpus, duration, free, spec))
}

/// Says, unless quiet, what load runs where (the kernel's own drain with the kernel's
/// settings), and for how long.
fn announce(spec: &DrainSpec, free: &CpuSet, duration: Option<Duration>, sink: &Sink) {
    if let (false, Some(k)) = (sink.is_quiet(), spec.workload.kernel()) {
        for l in crate::kernel::info::KernelInfo::read().lines() {
            println!("{l}");
        }
        println!(
            "qpw-emu load: the running kernel's own drain {k}: it {}; {} triggers/s from cpu {}{}; \
             {}",
            k.effect(),
            spec.drain_rate_hz,
            spec.requester_cpu,
            if k.needs_filler() {
                format!(", the filler on cpu {}", spec.target_cpu)
            } else {
                String::new()
            },
            match duration {
                Some(d) => format!("running for {:.1} s.", d.as_secs_f64()),
                None => "Ctrl-C to stop.".to_string(),
            }
        );
    } else if !sink.is_quiet() {
        println!(
            "qpw-emu load: {} mode, workload {}, {} {}drains/s from cpu {}, process-context load on {}; \
             cpu(s) {free} left free{}. {}",
            spec.mode,
            spec.workload,
            spec.drain_rate_hz,
            if spec.force { "forced " } else { "" },
            spec.requester_cpu,
            spec.load_cpus,
            if spec.mode == Mode::Queue {
                " (but for their workers)"
            } else {
                ""
            },
            match duration {
                Some(d) => format!("Running for {:.1} s.", d.as_secs_f64()),
                None => "Ctrl-C to stop.".to_string(),
            }
        );
    }
}

/// The JSON body of `qpw-emu load`: no probe thread, only the load's figures.
#[derive(Debug, serde::Serialize)]
struct LoadBody {
    /// `load`.
    tool: String,
    /// The drain mode.
    mode: String,
    /// The workload.
    workload: String,
    /// The framework instance.
    qpw: String,
    /// The CPUs left free.
    free: String,
    /// Seconds the load ran.
    seconds: f64,
    /// The requester's figures.
    requester: Option<crate::load::RequesterReport>,
    /// The kernel's RT throttling during the run.
    rt_throttling: RtThrottling,
    /// With `--isolate`: what was isolated and how.
    #[serde(skip_serializing_if = "Option::is_none")]
    isolation: Option<crate::isolate::IsolationReport>,
    /// The process-context load's figures.
    load: crate::load::LoadReport,
    /// Setup steps that failed.
    warnings: Vec<String>,
}
