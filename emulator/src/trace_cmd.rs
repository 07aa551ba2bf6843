//! `qpw-emu trace`, and the `--trace` attribution the probes share.

use std::time::{Duration, Instant};

use std::fmt::Write as _;

use anyhow::Result;
use qpw_core::CpuSet;

use crate::cli::TraceArgs;
use crate::clock::Calibration;
use crate::cpus::Cpus;
use crate::json::{self, Envelope, TraceFields};
use crate::kernel::info::KernelInfo;
use crate::oslat::OslatRun;
use crate::rt::{self, Warnings};
use crate::trace::{self, CpuNoise, Session, TraceHealth};
use crate::validate;

/// Converts a trace-clock difference to microseconds.
pub fn ticks_to_us(clock: &str, cal: Calibration) -> impl Fn(u64) -> f64 {
    let tsc = clock == "x86-tsc";
    move |t| {
        if tsc {
            cal.to_ns(t) as f64 / 1000.0
        } else {
            t as f64 / 1000.0
        }
    }
}

/// The `--trace` threshold, validated.
pub fn threshold_us(raw: &str) -> Result<f64> {
    validate::float_in("--trace", raw, 0.1, 1_000_000.0)
}

/// Starts the trace for a probe on `measured`, its reader on a housekeeping CPU; says what it
/// does unless `quiet`.
pub fn start_for_probe(measured: &CpuSet, cpus: &Cpus, quiet: bool) -> Result<Session> {
    let reader = cpus.housekeeping(measured);
    let session = Session::start(measured, reader)?;
    if !quiet {
        println!(
            "Trace:            private tracefs instance on cpu(s) {measured}, clock {}, reader \
             on cpu {}",
            trace::tracefs::probe_clock(),
            reader.map_or("-".to_string(), |c| c.to_string())
        );
    }
    Ok(session)
}

/// One probe thread's long gaps (or late wake-ups), as counter readings.
#[derive(Debug)]
pub struct ProbeGaps<'a> {
    /// Its CPU.
    pub cpu: usize,
    /// Its thread id.
    pub tid: i32,
    /// (before, after) readings.
    pub gaps: &'a [(u64, u64)],
    /// Gaps it could not keep.
    pub not_kept: u64,
}

/// Ends the trace and matches each probe thread's long gaps.
pub fn attribute(
    session: Session,
    probes: &[ProbeGaps<'_>],
    cal: Calibration,
    threshold_us: f64,
    warnings: &mut Warnings,
    quiet: bool,
) -> Result<TraceFields> {
    let traced = session.finish()?;
    let conv = ticks_to_us(&traced.clock, cal);
    let attribution: Vec<_> = probes
        .iter()
        .map(|p| traced.attribute_gaps(p.cpu, p.tid, p.gaps, p.not_kept, threshold_us, &conv))
        .collect();
    let mut cpus: Vec<usize> = probes.iter().map(|p| p.cpu).collect();
    cpus.dedup();
    let work = cpus
        .into_iter()
        .flat_map(|c| traced.work_on(c, &conv))
        .collect();
    let health = traced.health();
    note_health(&health, warnings, quiet);
    Ok(TraceFields {
        kernel: KernelInfo::read(),
        health,
        attribution,
        work,
    })
}

/// [`attribute`] for an oslat run.
pub fn attribute_oslat(
    session: Session,
    run: &OslatRun,
    threshold_us: f64,
    warnings: &mut Warnings,
    quiet: bool,
) -> Result<TraceFields> {
    let probes: Vec<ProbeGaps<'_>> = run
        .threads
        .iter()
        .map(|t| ProbeGaps {
            cpu: t.cpu,
            tid: t.tid,
            gaps: &t.gaps,
            not_kept: t.gaps_not_kept,
        })
        .collect();
    attribute(
        session,
        &probes,
        run.calibration,
        threshold_us,
        warnings,
        quiet,
    )
}

/// Prints the attribution of each traced CPU, `top` sources each, and the trace's health, on
/// stderr (the drop-ins' own lines; see [`emit_extra`]); every line starts with `prefix`.
pub fn print_attribution(fields: &TraceFields, top: usize, drains: Option<u64>, prefix: &str) {
    let mut out = String::new();
    for a in &fields.attribution {
        trace::print_attribution(&mut out, a, top);
        let work: Vec<_> = fields
            .work
            .iter()
            .filter(|w| w.cpu == a.cpu)
            .cloned()
            .collect();
        trace::print_work(&mut out, &work, top, drains);
    }
    health_line(&mut out, &fields.health);
    emit_extra(&out, prefix);
}

/// After an rt-tests tool's own output, on `# qpw-emu` lines: the running kernel's mode when
/// the run traced or drove the kernel's own drains, and the trace's attribution with the
/// drains of the load's requester (`outcome`).
pub fn print_after_tool(
    traced: Option<&TraceFields>,
    outcome: Option<&crate::scenario::Outcome>,
    kernel_workload: bool,
) {
    const PREFIX: &str = "# qpw-emu ";
    match traced {
        Some(t) => {
            let drains = outcome.and_then(|o| o.requester.as_ref()).map(|r| r.drains);
            emit_extra(&t.kernel.lines().join("\n"), PREFIX);
            print_attribution(t, 12, drains, PREFIX);
        }
        None if kernel_workload => emit_extra(&KernelInfo::read().lines().join("\n"), PREFIX),
        None => {}
    }
}

/// Prints `text` a line at a time, each after `prefix`.
pub fn emit(text: &str, prefix: &str) {
    for line in text.lines() {
        println!("{prefix}{line}");
    }
}

/// As [`emit`], on stderr: the oslat and cyclictest drop-ins' own lines go there, because
/// scripts parse the real tools' stdout, some from its end (Linaro's cyclictest test reads
/// `tail -n <threads>` as the `T:` lines), so nothing of ours may follow the tool's lines.
pub fn emit_extra(text: &str, prefix: &str) {
    for line in text.lines() {
        eprintln!("{prefix}{line}");
    }
}

fn note_health(h: &TraceHealth, warnings: &mut Warnings, quiet: bool) {
    if h.lost_events > 0 {
        warnings.push(
            quiet,
            format!(
                "the trace lost {} events (ring buffer overrun): gaps around them are reported \
                 as `lost`, not attributed",
                h.lost_events
            ),
        );
    }
    if h.unparsed_lines > 0 {
        warnings.push(
            quiet,
            format!("{} trace lines did not parse", h.unparsed_lines),
        );
    }
}

fn health_line(out: &mut String, h: &TraceHealth) {
    let _ = writeln!(
        out,
        "Trace: {} events read, {} lost, clock {}{}",
        h.events,
        h.lost_events,
        h.clock,
        if h.missing_events.is_empty() {
            String::new()
        } else {
            format!("; this kernel lacks {}", h.missing_events.join(", "))
        }
    );
}

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
    let top = validate::int_in("--top", &args.top, 1, 1000)? as usize;
    if let Some(path) = &args.json {
        validate::output_file("--json", path)?;
    }
    let quiet = args.quiet;
    let start_time = rt::rt_timestamp();
    let mut warnings = Warnings::default();
    rt::catch_sigint(&mut warnings, quiet);
    let kernel = KernelInfo::read();
    if !quiet {
        for l in kernel.lines() {
            println!("{l}");
        }
    }
    let cal = Calibration::measure();
    let session = start_for_probe(&measured, &cpus, quiet)?;
    let _away = rt::AwayFrom::cpus(&measured);
    if !quiet {
        println!(
            "Tracing cpu(s) {measured} {}.",
            match duration {
                Some(d) => format!("for {:.1} s", d.as_secs_f64()),
                None => "until Ctrl-C".to_string(),
            }
        );
    }
    let progress =
        crate::progress::Progress::new("trace", duration.unwrap_or(Duration::MAX), quiet);
    let start = Instant::now();
    while duration.is_none_or(|d| start.elapsed() < d) && !rt::interrupted() {
        if duration.is_some() {
            progress.tick();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    progress.finish();
    let seconds = start.elapsed().as_secs_f64();
    let traced = session.finish()?;
    let conv = ticks_to_us(&traced.clock, cal);
    let noise = traced.noise(probe, &conv);
    let health = traced.health();
    note_health(&health, &mut warnings, quiet);
    let mut out = String::new();
    for n in &noise {
        trace::print_noise(&mut out, n, top);
        trace::print_work(&mut out, &traced.work_on(n.cpu, &conv), top, None);
    }
    health_line(&mut out, &health);
    emit(&out, "");
    if let Some(path) = &args.json {
        let body = TraceBody {
            tool: "trace".to_string(),
            cpus: measured.to_string(),
            seconds,
            kernel,
            health,
            noise,
            warnings: warnings.list().to_vec(),
        };
        json::write(path, &Envelope::succeeded(start_time, body))?;
    }
    Ok(())
}
