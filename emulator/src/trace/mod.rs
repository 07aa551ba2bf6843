//! Attribution: what ran on a measured CPU during each gap the probe saw, from the kernel's
//! own trace events, for kernels without the `osnoise` tracer (`rtla osnoise` needs it).
//!
//! 1. [`tracefs`]: a private tracefs instance (`instances/qpw-emu-<pid>`) traces only the
//!    measured CPUs, with a clock the probe's timestamps share (`x86-tsc` where the probe reads
//!    the TSC, else `mono`): `sched_switch` (which task ran), `workqueue_execute_start/end`
//!    (which work function a kworker ran), `irq_handler_*`, `softirq_*`, the x86 vectors
//!    (`local_timer`, `reschedule`, `call_function*`, ...) and `csd_function_*` (the function
//!    of a cross-CPU call). It is read while the probe runs, on a housekeeping CPU; lost
//!    events are counted (from the reader's `[LOST n EVENTS]` lines and the ring buffer's
//!    `overrun`/`dropped events`), never silently dropped.
//! 2. [`event`]: each text line parsed.
//! 3. [`timeline`]: the events turned into exclusive segments (who owned the CPU when); each
//!    gap above the threshold is matched with the source that had most of its time: a thread
//!    (for a kworker, the work function), an IRQ, a softirq, an IPI or cross-CPU call, or
//!    nothing seen (the hypervisor or the hardware took the CPU).
//! 4. Here: the summaries, per CPU by class and by source, for the text output and the JSON.

pub mod event;
pub mod timeline;
pub mod tracefs;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Result;
use qpw_core::CpuSet;

use timeline::Timeline;

/// Ring buffer per traced CPU, in KiB: at 1000 drains/s the measured CPU writes some tens of
/// thousands of events per second, about 1 MiB/s; the reader drains it every few
/// milliseconds, so this is seconds of slack.
pub const BUFFER_KB: u64 = 8192;

/// A trace running beside a probe.
#[derive(Debug)]
pub struct Session {
    instance: tracefs::Instance,
}

/// A finished trace.
#[derive(Debug)]
pub struct Traced {
    /// What ran when.
    pub timeline: Timeline,
    /// The trace clock.
    pub clock: String,
    /// Events lost: the larger of the reader's `[LOST]` count and the buffer's statistics.
    pub lost_events: u64,
    /// Events asked for that this kernel lacks.
    pub missing_events: Vec<String>,
    /// Lines that did not parse (a few), and how many.
    pub bad_lines: (Vec<String>, u64),
}

impl Session {
    /// Starts tracing `cpus`, the reader on `reader_cpu`.
    pub fn start(cpus: &CpuSet, reader_cpu: Option<usize>) -> Result<Self> {
        let name = format!("qpw-emu-{}", std::process::id());
        let instance =
            tracefs::Instance::start(&name, cpus, tracefs::probe_clock(), BUFFER_KB, reader_cpu)?;
        Ok(Self { instance })
    }

    /// Stops the trace and builds the timeline.
    pub fn finish(self) -> Result<Traced> {
        let clock = self.instance.clock.clone();
        let missing_events = self.instance.missing_events.clone();
        let (gathered, lost_by_stats) = self.instance.stop()?;
        let mut timeline = gathered.timeline;
        timeline.finish();
        Ok(Traced {
            lost_events: timeline.lost_events.max(lost_by_stats),
            timeline,
            clock,
            missing_events,
            bad_lines: (gathered.bad_lines, gathered.bad_count),
        })
    }
}

/// How the gaps of one probe thread were attributed.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct GapAttribution {
    /// The CPU.
    pub cpu: usize,
    /// The probe thread's id.
    pub probe_tid: i32,
    /// The threshold, in microseconds: gaps at or above it were matched.
    pub threshold_us: f64,
    /// Gaps matched.
    pub gaps: u64,
    /// Gaps above the threshold that the probe could not keep (its log was full).
    pub gaps_not_kept: u64,
    /// By class (`thread`, `irq`, `softirq`, `ipi`, `unexplained`, `lost`): count and total
    /// gap time in microseconds.
    pub by_class: BTreeMap<String, ClassFigures>,
    /// The default experiment's split: `qpw` (our worker), `kernel` (kworkers), `other`,
    /// `unexplained`.
    pub by_bucket: BTreeMap<String, u64>,
    /// The sources, most gap time first: label, class, count, total and longest gap (us).
    pub top: Vec<SourceFigures>,
}

/// Count and total time of one class.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ClassFigures {
    /// Gaps or occurrences.
    pub count: u64,
    /// Their total time, in microseconds.
    pub total_us: f64,
}

/// One source's figures.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct SourceFigures {
    /// The source: `qpw/1`, `kworker lru_add_drain_per_cpu`, `irq virtio1-req.0`, ...
    pub source: String,
    /// Its class.
    pub class: String,
    /// Gaps (or occurrences) it accounts for.
    pub count: u64,
    /// Their total time, in microseconds.
    pub total_us: f64,
    /// The longest, in microseconds.
    pub max_us: f64,
}

impl Traced {
    /// Matches every gap `(before, after)` (probe-clock readings, which the trace clock
    /// shares) of the probe thread `tid` on `cpu`; `ticks_to_us` converts a clock difference.
    pub fn attribute_gaps(
        &self,
        cpu: usize,
        tid: i32,
        gaps: &[(u64, u64)],
        gaps_not_kept: u64,
        threshold_us: f64,
        ticks_to_us: impl Fn(u64) -> f64,
    ) -> GapAttribution {
        let mut out = GapAttribution {
            cpu,
            probe_tid: tid,
            threshold_us,
            gaps: gaps.len() as u64,
            gaps_not_kept,
            ..GapAttribution::default()
        };
        let mut top: BTreeMap<String, SourceFigures> = BTreeMap::new();
        for &(a, b) in gaps {
            let at = self.timeline.attribute(cpu, a, b, tid);
            let us = ticks_to_us(b - a);
            let class = out.by_class.entry(at.class().to_string()).or_default();
            class.count += 1;
            class.total_us += us;
            let ours = std::process::id() as i32;
            *out.by_bucket
                .entry(at.bucket(ours).to_string())
                .or_default() += 1;
            let label = at.label(ours);
            let e = top.entry(label.clone()).or_insert_with(|| SourceFigures {
                source: label,
                class: at.class().to_string(),
                ..SourceFigures::default()
            });
            e.count += 1;
            e.total_us += us;
            e.max_us = e.max_us.max(us);
        }
        out.top = sorted(top.into_values());
        out
    }

    /// The osnoise-style view: per CPU, everything that took the CPU from its main task.
    pub fn noise(&self, main: Option<i32>, ticks_to_us: impl Fn(u64) -> f64) -> Vec<CpuNoise> {
        self.timeline
            .noise(main)
            .into_iter()
            .map(|n| {
                let mut by_class: BTreeMap<String, ClassFigures> = BTreeMap::new();
                let mut top = Vec::new();
                for (label, e) in &n.sources {
                    let c = by_class.entry(e.class.to_string()).or_default();
                    c.count += e.count;
                    c.total_us += ticks_to_us(e.total);
                    top.push(SourceFigures {
                        source: label.clone(),
                        class: e.class.to_string(),
                        count: e.count,
                        total_us: ticks_to_us(e.total),
                        max_us: ticks_to_us(e.max),
                    });
                }
                CpuNoise {
                    cpu: n.cpu,
                    main_tid: n.main,
                    seconds: ticks_to_us(n.span) / 1e6,
                    by_class,
                    top: sorted(top),
                }
            })
            .collect()
    }
}

impl Traced {
    /// The tasks of process `ours` (by the trace's `record-tgid`), and tasks named one of
    /// `also` (a child process of ours: the filler), that took `cpu` from the thread `probe`
    /// while it measured (`window`: its first and last clock reading, which the trace clock
    /// shares): by name, how many times (back-to-back stretches counted once) and for how
    /// long.
    pub fn tasks_of(
        &self,
        cpu: usize,
        probe: i32,
        window: (u64, u64),
        ours: i32,
        also: &[&str],
        ticks_to_us: impl Fn(u64) -> f64,
    ) -> Vec<SourceFigures> {
        let Some(t) = self.timeline.cpus.get(&cpu) else {
            return Vec::new();
        };
        let mut by: BTreeMap<String, SourceFigures> = BTreeMap::new();
        let mut prev: Option<(u32, u64)> = None;
        for seg in t
            .segments
            .iter()
            .filter(|s| s.end > window.0 && s.start < window.1)
        {
            let continues = prev.is_some_and(|(id, end)| id == seg.source && end == seg.start);
            prev = Some((seg.source, seg.end));
            let timeline::Source::Task { pid, comm } = &self.timeline.sources[seg.source as usize]
            else {
                continue;
            };
            let mine = self.timeline.tgid.get(pid) == Some(&ours) || also.contains(&comm.as_str());
            if *pid == probe || *pid == 0 || !mine {
                continue;
            }
            let e = by.entry(comm.clone()).or_insert_with(|| SourceFigures {
                source: comm.clone(),
                class: "thread".into(),
                ..SourceFigures::default()
            });
            if !continues {
                e.count += 1;
            }
            let us = ticks_to_us(seg.end - seg.start);
            e.total_us += us;
            e.max_us = e.max_us.max(us);
        }
        let mut v: Vec<SourceFigures> = by.into_values().collect();
        v.sort_by(|a, b| b.count.cmp(&a.count).then(a.source.cmp(&b.source)));
        v
    }
}

fn sorted(v: impl IntoIterator<Item = SourceFigures>) -> Vec<SourceFigures> {
    let mut v: Vec<_> = v.into_iter().collect();
    v.sort_by(|a, b| {
        b.total_us
            .total_cmp(&a.total_us)
            .then(a.source.cmp(&b.source))
    });
    v
}

/// The work items kworkers ran on one CPU, by function.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct WorkFigures {
    /// The CPU.
    pub cpu: usize,
    /// The work function.
    pub function: String,
    /// Runs.
    pub runs: u64,
    /// Run time percentiles and maximum, in microseconds.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Longest.
    pub max_us: f64,
}

impl Traced {
    /// The work items run on `cpu`, by function, most runs first.
    pub fn work_on(&self, cpu: usize, ticks_to_us: impl Fn(u64) -> f64) -> Vec<WorkFigures> {
        let Some(t) = self.timeline.cpus.get(&cpu) else {
            return Vec::new();
        };
        let mut by: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for w in &t.work {
            by.entry(&w.function)
                .or_default()
                .push(ticks_to_us(w.end.saturating_sub(w.start)));
        }
        let mut out: Vec<WorkFigures> = by
            .into_iter()
            .map(|(f, mut d)| {
                d.sort_by(f64::total_cmp);
                let at = |q: f64| d[((d.len() - 1) as f64 * q).round() as usize];
                WorkFigures {
                    cpu,
                    function: f.to_string(),
                    runs: d.len() as u64,
                    p50_us: at(0.5),
                    p99_us: at(0.99),
                    max_us: at(1.0),
                }
            })
            .collect();
        out.sort_by(|a, b| b.runs.cmp(&a.runs).then(a.function.cmp(&b.function)));
        out
    }
}

/// Writes the work items run on a CPU, `top` functions, with runs per drain when `drains`
/// is known.
pub fn print_work(out: &mut String, work: &[WorkFigures], top: usize, drains: Option<u64>) {
    let Some(first) = work.first() else {
        return;
    };
    let _ = writeln!(out, "Work items run on cpu {} (kworkers):", first.cpu);
    let _ = writeln!(
        out,
        "  {:<40} {:>8} {:>10} {:>10} {:>10} {:>10}",
        "function", "runs", "per drain", "p50 us", "p99 us", "max us"
    );
    for w in work.iter().take(top) {
        let per = drains.filter(|&d| d > 0).map_or("-".to_string(), |d| {
            format!("{:.2}", w.runs as f64 / d as f64)
        });
        let _ = writeln!(
            out,
            "  {:<40} {:>8} {:>10} {:>10.1} {:>10.1} {:>10.1}",
            w.function, w.runs, per, w.p50_us, w.p99_us, w.max_us
        );
    }
}

/// One CPU's noise, osnoise-style.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct CpuNoise {
    /// The CPU.
    pub cpu: usize,
    /// The task whose noise it is (the busiest one, or the probe named).
    pub main_tid: Option<i32>,
    /// The traced span, in seconds.
    pub seconds: f64,
    /// By class: occurrences and total time.
    pub by_class: BTreeMap<String, ClassFigures>,
    /// By source, most time first.
    pub top: Vec<SourceFigures>,
}

/// What the trace itself reports about its health, for the JSON.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct TraceHealth {
    /// The trace clock.
    pub clock: String,
    /// Events read.
    pub events: u64,
    /// Events lost (goal: 0).
    pub lost_events: u64,
    /// Lines that did not parse.
    pub unparsed_lines: u64,
    /// Events this kernel lacks.
    pub missing_events: Vec<String>,
}

impl Traced {
    /// The trace's own figures.
    pub fn health(&self) -> TraceHealth {
        TraceHealth {
            clock: self.clock.clone(),
            events: self.timeline.events,
            lost_events: self.lost_events,
            unparsed_lines: self.bad_lines.1,
            missing_events: self.missing_events.clone(),
        }
    }
}

/// Writes one CPU's attributed gaps, osnoise-style: by class, then the top sources.
pub fn print_attribution(out: &mut String, a: &GapAttribution, top: usize) {
    let _ = writeln!(
        out,
        "Attribution, cpu {} (probe tid {}): {} gaps >= {:.1} us{}",
        a.cpu,
        a.probe_tid,
        a.gaps,
        a.threshold_us,
        if a.gaps_not_kept > 0 {
            format!(" ({} more not kept)", a.gaps_not_kept)
        } else {
            String::new()
        }
    );
    print_classes(out, &a.by_class);
    print_top(out, &a.top, top);
}

/// Writes one CPU's noise.
pub fn print_noise(out: &mut String, n: &CpuNoise, top: usize) {
    let _ = writeln!(
        out,
        "Noise on cpu {} over {:.3} s (everything but tid {}):",
        n.cpu,
        n.seconds,
        n.main_tid.map_or("-".to_string(), |t| t.to_string())
    );
    print_classes(out, &n.by_class);
    print_top(out, &n.top, top);
}

fn print_classes(out: &mut String, by_class: &BTreeMap<String, ClassFigures>) {
    let _ = writeln!(out, "  {:<12} {:>10} {:>14}", "class", "count", "total us");
    for (class, f) in by_class {
        let _ = writeln!(out, "  {class:<12} {:>10} {:>14.1}", f.count, f.total_us);
    }
}

fn print_top(out: &mut String, top: &[SourceFigures], n: usize) {
    let _ = writeln!(
        out,
        "  {:<44} {:<11} {:>8} {:>12} {:>10}",
        "source", "class", "count", "total us", "max us"
    );
    for s in top.iter().take(n) {
        let _ = writeln!(
            out,
            "  {:<44} {:<11} {:>8} {:>12.1} {:>10.1}",
            s.source, s.class, s.count, s.total_us, s.max_us
        );
    }
    if top.len() > n {
        let _ = writeln!(out, "  ... {} more sources", top.len() - n);
    }
}
