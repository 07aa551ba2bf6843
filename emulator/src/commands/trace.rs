//! `qpw-emu trace -c CPUS -D T`: every source of noise on the CPUs, osnoise-style, beside a
//! real oslat or cyclictest, from a private tracefs instance.

use anyhow::Result;

use crate::cli::TraceArgs;
use crate::clock::Calibration;
use crate::cpus::Cpus;
use crate::json::Envelope;
use crate::kernel::info::KernelInfo;
use crate::probe_trace::{emit, health_line, note_health, start_for_probe, ticks_to_us};
use crate::rt;
use crate::sink::{JsonOut, Sink};
use crate::trace::{self, CpuNoise, TraceHealth};
use crate::validate;

/// The JSON of `qpw-emu trace`.
#[derive(Debug, serde::Serialize)]
struct TraceBody {
    /// `trace`.
    tool: String,
    /// The traced CPUs.
    cpus: String,
    /// Seconds traced.
    seconds: f64,
    /// The running kernel's per-CPU-work mode, isolation and RT throttling.
    kernel: KernelInfo,
    /// The trace's health.
    health: TraceHealth,
    /// Per CPU: everything that took it from its main thread.
    noise: Vec<CpuNoise>,
    /// Setup steps that failed.
    warnings: Vec<String>,
}

/// `qpw-emu trace -c CPUS -D T`.
pub fn trace_cmd(args: &TraceArgs) -> Result<()> {
    let cpus = Cpus::read()?;
    let measured = cpus.list_or_target("--cpu-list", args.cpu_list.as_deref())?;
    let duration = args
        .duration
        .as_deref()
        .map(|d| validate::duration("--duration", d))
        .transpose()?;
    let probe = args
        .probe_tid
        .as_deref()
        .map(|t| validate::int_in("--probe-tid", t, 1, i32::MAX as u64).map(|v| v as i32))
        .transpose()?;
    if let Some(tid) = probe {
        // /proc/<tid> names any thread of the machine, listed or not.
        if !std::path::Path::new(&format!("/proc/{tid}")).exists() {
            anyhow::bail!(
                "--probe-tid {tid}: no such thread (no /proc/{tid}): give the tid of the probe's \
                 measuring thread (ps -eLo tid,comm), or leave it out for the busiest thread"
            );
        }
    }
    let top = validate::int_in("--top", &args.top, 1, 1000)? as usize;
    let json = JsonOut::checked("--json", args.json.as_deref())?;
    let mut sink = Sink::new(args.quiet).with_json(json);
    let start_time = rt::rt_timestamp();
    rt::catch_sigint(&mut sink);
    let kernel = KernelInfo::read();
    if !sink.is_quiet() {
        for l in kernel.lines() {
            println!("{l}");
        }
    }
    let cal = Calibration::measure();
    let session = start_for_probe(&measured, &cpus, &sink)?;
    let _away = rt::AwayFrom::cpus(&measured);
    if !sink.is_quiet() {
        println!(
            "Tracing cpu(s) {measured} {}.",
            match duration {
                Some(d) => format!("for {:.1} s", d.as_secs_f64()),
                None => "until Ctrl-C".to_string(),
            }
        );
    }
    let start = crate::progress::wait_for("trace", duration, &sink);
    let seconds = start.elapsed().as_secs_f64();
    let traced = session.finish()?;
    let conv = ticks_to_us(&traced.clock, cal);
    let noise = traced.noise(probe, &conv);
    let health = traced.health();
    note_health(&health, &mut sink);
    let mut out = String::new();
    for n in &noise {
        trace::print_noise(&mut out, n, top);
        trace::print_work(&mut out, &traced.work_on(n.cpu, &conv), top, None);
    }
    health_line(&mut out, &health);
    emit(&out, "");
    if sink.wants_json() {
        let body = TraceBody {
            tool: "trace".to_string(),
            cpus: measured.to_string(),
            seconds,
            kernel,
            health,
            noise,
            warnings: sink.warnings().to_vec(),
        };
        sink.write_json(&Envelope::succeeded(start_time, body))?;
    }
    Ok(())
}
