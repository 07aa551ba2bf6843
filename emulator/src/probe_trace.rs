//! `--trace` for the probes: a trace of the measured CPUs around the probe's run
//! ([`start_for_probe`]), each long gap matched to what ran in it ([`attribute`]), and the
//! attribution printed after the tool's own lines ([`print_after_tool`]). The `oslat` and
//! `cyclictest` drop-ins use it, the default experiment its clock conversion
//! ([`ticks_to_us`]), and `qpw-emu trace` its pieces (the trace without a probe).

use std::fmt::Write as _;

use anyhow::Result;
use qpw_core::CpuSet;

use crate::clock::Calibration;
use crate::cpus::Cpus;
use crate::json::TraceFields;
use crate::kernel::info::KernelInfo;
use crate::oslat::OslatRun;
use crate::sink::Sink;
use crate::trace::{self, Session, TraceHealth};
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

/// A probe's `--trace` threshold, validated, and tracefs checked when it is given, before
/// anything starts.
pub fn threshold_checked(raw: Option<&str>) -> Result<Option<f64>> {
    let us = raw.map(threshold_us).transpose()?;
    if us.is_some() {
        crate::trace::tracefs::preflight()?;
    }
    Ok(us)
}

/// Starts the trace for a probe on `measured`, its reader on a housekeeping CPU; says what it
/// does unless the sink is quiet.
pub fn start_for_probe(measured: &CpuSet, cpus: &Cpus, sink: &Sink) -> Result<Session> {
    let reader = cpus.housekeeping(measured);
    let session = Session::start(measured, reader)?;
    if !sink.is_quiet() {
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
    sink: &mut Sink,
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
    note_health(&health, sink);
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
    sink: &mut Sink,
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
    attribute(session, &probes, run.calibration, threshold_us, sink)
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

/// Warns of events the trace lost and lines that did not parse.
pub fn note_health(h: &TraceHealth, sink: &mut Sink) {
    if h.lost_events > 0 {
        sink.warn(format!(
            "the trace lost {} events (ring buffer overrun): gaps around them are reported \
                 as `lost`, not attributed",
            h.lost_events
        ));
    }
    if h.unparsed_lines > 0 {
        sink.warn(format!("{} trace lines did not parse", h.unparsed_lines));
    }
}

/// The trace's health on one line: events read and lost, its clock, the events it lacks.
pub fn health_line(out: &mut String, h: &TraceHealth) {
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
