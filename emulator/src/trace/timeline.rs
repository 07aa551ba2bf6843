//! What ran on each traced CPU, when: the events turned into a timeline of exclusive segments
//! (at every instant the CPU runs one thing: the innermost interrupt context if one is open,
//! else the current task), the work items the kworkers ran, and the spans in which events were
//! lost. Then each probe gap is matched against it ([`Timeline::attribute`]).
//!
//! - Nesting: an IRQ inside a kworker's run is its own segment; the kworker's time stops while
//!   it runs and resumes after, so every nanosecond has exactly one owner.
//! - The window's edges: an exit whose entry came before the trace began is taken to have
//!   started at the CPU's first event; what is open at the end is closed at the last.
//! - Lost events: the ring buffer's `[LOST n EVENTS]` leaves a span (from the CPU's previous
//!   event to its next) in which the timeline is not known; a gap that overlaps one is
//!   reported as `lost`, never guessed.

use std::collections::HashMap;

use super::event::{Context, Event, Kind};

/// What owned a CPU during a segment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// A task (thread) running in process context.
    Task {
        /// Its pid (tid).
        pid: i32,
        /// Its command name.
        comm: String,
    },
    /// An interrupt-like context on top of the task.
    Ctx(Context),
}

impl Source {
    /// The class it is counted in: `thread`, `irq`, `softirq` or `ipi`.
    pub fn class(&self) -> &'static str {
        match self {
            Source::Task { .. } => "thread",
            Source::Ctx(c) => c.class(),
        }
    }
}

/// One stretch of a CPU's time with one owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Start, in trace-clock units.
    pub start: u64,
    /// End (exclusive).
    pub end: u64,
    /// Index into [`Timeline::sources`].
    pub source: u32,
}

/// A kworker's work item, from `workqueue_execute_start` to `_end`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkRun {
    /// Start.
    pub start: u64,
    /// End.
    pub end: u64,
    /// The kworker's pid.
    pub pid: i32,
    /// The work function.
    pub function: String,
}

/// One CPU's timeline.
#[derive(Debug, Default, Clone)]
pub struct CpuTimeline {
    /// The segments, in time order, not overlapping.
    pub segments: Vec<Segment>,
    /// The work items run.
    pub work: Vec<WorkRun>,
    /// Spans with lost events: (from, to, events lost).
    pub lost: Vec<(u64, u64, u64)>,
    /// The high-resolution timers that fired, by function (`hrtimer_expire_entry`): the tick
    /// among them.
    pub timers: std::collections::BTreeMap<String, u64>,
    /// On a `nohz_full` CPU, the times its tick could not stop, by the dependency that kept it
    /// (`tick_stop` with `success=0`).
    pub tick_kept: std::collections::BTreeMap<String, u64>,
    /// The first and last event's time.
    pub first: Option<u64>,
    /// The last event's time.
    pub last: u64,
    // Builder state.
    task: Option<u32>,
    stack: Vec<(Context, u32)>,
    since: u64,
    open_work: Option<(u64, i32, String)>,
    pending_lost: Option<u64>,
}

/// Every traced CPU's timeline, built event by event.
#[derive(Debug, Default, Clone)]
pub struct Timeline {
    /// The distinct sources; segments point into this.
    pub sources: Vec<Source>,
    index: HashMap<Source, u32>,
    /// By CPU.
    pub cpus: HashMap<usize, CpuTimeline>,
    /// Events lost, in all.
    pub lost_events: u64,
    /// Events taken in.
    pub events: u64,
    /// Each task's process, from the events that carry it.
    pub tgid: HashMap<i32, i32>,
}

impl Timeline {
    /// An empty timeline.
    pub fn new() -> Self {
        Self::default()
    }

    fn intern(&mut self, s: Source) -> u32 {
        if let Some(&i) = self.index.get(&s) {
            return i;
        }
        let i = self.sources.len() as u32;
        self.sources.push(s.clone());
        self.index.insert(s, i);
        i
    }

    /// Takes in one event (events of one CPU must come in time order, as ftrace gives them).
    pub fn push(&mut self, e: &Event) {
        self.events += 1;
        if let Some(tgid) = e.tgid {
            self.tgid.insert(e.pid, tgid);
        }
        if let Kind::Lost { count } = e.kind {
            self.lost_events += count;
            let cpu = self.cpus.entry(e.cpu).or_default();
            *cpu.pending_lost.get_or_insert(0) += count;
            return;
        }
        let (task, ctx_id, switched_to) = self.intern_event(e);
        let cpu = self.cpus.entry(e.cpu).or_default();
        let ts = e.ts;
        cpu.begin_event(ts, task);
        match &e.kind {
            Kind::Switch { prev_pid, .. } => cpu.switch(ts, *prev_pid, switched_to),
            Kind::WorkStart { function } => {
                cpu.open_work = Some((ts, e.pid, function.clone()));
            }
            Kind::WorkEnd { function } => cpu.work_end(ts, e.pid, function),
            Kind::Enter(c) => {
                cpu.close(ts);
                if let Some(id) = ctx_id {
                    cpu.stack.push((c.clone(), id));
                }
            }
            Kind::Exit(c) => {
                if !cpu.exit(ts, c) {
                    self.exit_unopened(e.cpu, ts, c);
                }
            }
            Kind::TimerExpire { function } => {
                *cpu.timers.entry(function.clone()).or_default() += 1;
            }
            Kind::TickStop {
                success: false,
                dependency,
            } => {
                *cpu.tick_kept.entry(dependency.clone()).or_default() += 1;
            }
            Kind::TickStop { success: true, .. } => {}
            Kind::Lost { .. }
            | Kind::Other { .. }
            | Kind::PcpDrain { .. }
            | Kind::WorkQueued { .. } => {}
        }
    }

    /// The sources event `e` names, interned: its own task, the context it enters (if it is an
    /// entry) and the task switched to (if it is a switch).
    #[inline]
    fn intern_event(&mut self, e: &Event) -> (u32, Option<u32>, Option<u32>) {
        let task = self.intern(Source::Task {
            pid: e.pid,
            comm: e.comm.clone(),
        });
        let ctx_id = match &e.kind {
            Kind::Enter(c) => Some(self.intern(Source::Ctx(c.clone()))),
            _ => None,
        };
        let switched_to = match &e.kind {
            Kind::Switch {
                next_pid,
                next_comm,
                ..
            } => Some(self.intern(Source::Task {
                pid: *next_pid,
                comm: next_comm.clone(),
            })),
            _ => None,
        };
        (task, ctx_id, switched_to)
    }

    /// An exit from context `c` on `cpu` at `ts` with none of its kind open: it began before
    /// the window (or before events were lost), so the time since the last change is
    /// relabelled as this context.
    #[cold]
    fn exit_unopened(&mut self, cpu: usize, ts: u64, c: &Context) {
        let label = match c {
            Context::Irq(n) if n.is_empty() => Context::Irq("?".into()),
            other => other.clone(),
        };
        let id = self.intern(Source::Ctx(label));
        let cpu = self.cpus.get_mut(&cpu).expect("just inserted");
        if ts > cpu.since {
            cpu.segments.push(Segment {
                start: cpu.since,
                end: ts,
                source: id,
            });
        }
        cpu.since = ts;
    }

    /// Closes every CPU's open segment at its last event.
    pub fn finish(&mut self) {
        for cpu in self.cpus.values_mut() {
            let last = cpu.last;
            cpu.close(last);
            if let Some((start, pid, function)) = cpu.open_work.take() {
                cpu.work.push(WorkRun {
                    start,
                    end: last,
                    pid,
                    function,
                });
            }
            if let Some(count) = cpu.pending_lost.take() {
                cpu.lost.push((last, u64::MAX, count));
            }
        }
    }

    /// What ran on `cpu` during the gap `[start, end)`, other than `probe` (the measuring
    /// thread's pid).
    pub fn attribute(&self, cpu: usize, start: u64, end: u64, probe: i32) -> Attribution {
        let Some(t) = self.cpus.get(&cpu) else {
            return Attribution::Unseen;
        };
        if t.lost.iter().any(|&(a, b, _)| a < end && start < b) {
            return Attribution::Lost;
        }
        if t.first.is_none_or(|f| start < f) || end > t.last {
            return Attribution::OutsideTrace;
        }
        // Segments are sorted and disjoint: find the first that ends after `start`.
        let from = t.segments.partition_point(|s| s.end <= start);
        let mut time: Vec<(u32, u64)> = Vec::new();
        for s in t.segments[from..].iter().take_while(|s| s.start < end) {
            let overlap = s.end.min(end) - s.start.max(start);
            if overlap == 0 {
                continue;
            }
            if matches!(&self.sources[s.source as usize], Source::Task { pid, .. } if *pid == probe)
            {
                continue;
            }
            match time.iter_mut().find(|(id, _)| *id == s.source) {
                Some((_, t)) => *t += overlap,
                None => time.push((s.source, overlap)),
            }
        }
        let Some(&(primary, _)) = time.iter().max_by_key(|(_, t)| *t) else {
            return Attribution::Unexplained;
        };
        let source = self.sources[primary as usize].clone();
        let function = match &source {
            // The work item with most time in the gap; a flush's barrier only when there is
            // nothing else (it merely marks the end of the work it waited for).
            Source::Task { pid, .. } => t
                .work
                .iter()
                .filter(|w| w.pid == *pid && w.start < end && start < w.end)
                .max_by_key(|w| {
                    (
                        w.function != "wq_barrier_func",
                        w.end.min(end) - w.start.max(start),
                    )
                })
                .map(|w| w.function.clone()),
            Source::Ctx(_) => None,
        };
        let tgid = match &source {
            Source::Task { pid, .. } => self.tgid.get(pid).copied(),
            Source::Ctx(_) => None,
        };
        Attribution::Seen {
            source,
            function,
            others: time.len() - 1,
            tgid,
        }
    }

    /// Per CPU and source, how often it took the CPU from `main` (the task whose noise is
    /// measured: a probe's pid; `None` for the busiest task on each CPU) and for how long: the
    /// osnoise-style view for a run beside a probe we do not control.
    pub fn noise(&self, main: Option<i32>) -> Vec<CpuNoise> {
        let mut out = Vec::new();
        let mut cpus: Vec<_> = self.cpus.keys().copied().collect();
        cpus.sort_unstable();
        for cpu in cpus {
            let t = &self.cpus[&cpu];
            let main = main.or_else(|| busiest_task(self, t));
            let mut by: HashMap<String, NoiseEntry> = HashMap::new();
            // Merge back-to-back segments of one source into one occurrence.
            let mut prev: Option<(u32, u64)> = None;
            let mut run_start = 0;
            for s in &t.segments {
                let src = &self.sources[s.source as usize];
                let is_main = matches!(src, Source::Task { pid, .. } if Some(*pid) == main);
                let continues = prev.is_some_and(|(id, end)| id == s.source && end == s.start);
                if is_main {
                    prev = None;
                    continue;
                }
                if !continues {
                    run_start = s.start;
                }
                let label = label_of(t, src, s.start, s.end);
                let e = by.entry(label).or_insert_with(|| NoiseEntry {
                    class: src.class(),
                    ..NoiseEntry::default()
                });
                if !continues {
                    e.count += 1;
                }
                e.total += s.end - s.start;
                e.max = e.max.max(s.end - run_start);
                prev = Some((s.source, s.end));
            }
            let mut sources: Vec<(String, NoiseEntry)> = by.into_iter().collect();
            sources.sort_by(|a, b| b.1.total.cmp(&a.1.total).then(a.0.cmp(&b.0)));
            out.push(CpuNoise {
                cpu,
                main,
                span: t.last.saturating_sub(t.first.unwrap_or(t.last)),
                sources,
            });
        }
        out
    }
}

/// The probe on a CPU: the busiest task named like a probe (`oslat`, `cyclictest`, ours),
/// else the busiest task.
fn busiest_task(tl: &Timeline, t: &CpuTimeline) -> Option<i32> {
    let mut time: HashMap<i32, (u64, bool)> = HashMap::new();
    for s in &t.segments {
        if let Source::Task { pid, comm } = &tl.sources[s.source as usize] {
            if *pid != 0 {
                let probe = ["oslat", "cyclictest", "qpw-emu"]
                    .iter()
                    .any(|p| comm.starts_with(p));
                let e = time.entry(*pid).or_insert((0, probe));
                e.0 += s.end - s.start;
            }
        }
    }
    time.into_iter()
        .max_by_key(|&(_, (t, probe))| (probe, t))
        .map(|(p, _)| p)
}

/// A source's name in reports: a kworker by the work function it ran then.
fn label_of(t: &CpuTimeline, src: &Source, start: u64, end: u64) -> String {
    match src {
        Source::Task { pid, comm } => {
            let work = t
                .work
                .iter()
                .find(|w| w.pid == *pid && w.start < end && start < w.end);
            match work {
                Some(w) => format!("{} {}", kworker_or(comm), w.function),
                None if *pid == 0 => "idle".to_string(),
                None => comm.clone(),
            }
        }
        Source::Ctx(c) => c.label(),
    }
}

fn kworker_or(comm: &str) -> &str {
    if comm.starts_with("kworker/") {
        "kworker"
    } else {
        comm
    }
}

fn same_kind(open: &Context, exit: &Context) -> bool {
    match (open, exit) {
        (Context::Irq(_), Context::Irq(_)) => true,
        (Context::Softirq(a), Context::Softirq(b)) => a == b,
        (Context::Vector(a), Context::Vector(b)) => a == b,
        (Context::CrossCall(a), Context::CrossCall(b)) => a == b,
        _ => false,
    }
}

impl CpuTimeline {
    /// The bookkeeping every event (but a lost-events record) does before its own effect, at
    /// `ts` by `task`: the CPU's first event starts its timeline; the first after lost events
    /// records the lost span and starts afresh; outside interrupt contexts, the event's own
    /// task is the owner.
    #[inline]
    fn begin_event(&mut self, ts: u64, task: u32) {
        if self.first.is_none() {
            self.first = Some(ts);
            self.since = ts;
            self.task = Some(task);
        }
        if let Some(count) = self.pending_lost.take() {
            self.lost.push((self.last, ts, count));
            // What ran in between is unknown: start afresh from this event.
            self.stack.clear();
            self.open_work = None;
            self.since = ts;
            self.task = Some(task);
        }
        self.last = self.last.max(ts);
        // The event's own task is current (outside interrupt contexts, it is the owner).
        if self.stack.is_empty() && self.task != Some(task) {
            self.close(ts);
            self.task = Some(task);
        }
    }

    /// A context switch at `ts` from `prev_pid` to the task `next` (interned): the work item
    /// open in `prev_pid` ends here.
    #[inline]
    fn switch(&mut self, ts: u64, prev_pid: i32, next: Option<u32>) {
        self.close(ts);
        if let Some((start, pid, function)) = self.open_work.take() {
            if pid == prev_pid {
                self.work.push(WorkRun {
                    start,
                    end: ts,
                    pid,
                    function,
                });
            }
        }
        self.task = next;
    }

    /// The end at `ts` of the work item `function` run by `pid`: one that started before the
    /// window is taken to have started at the CPU's first event.
    #[inline]
    fn work_end(&mut self, ts: u64, pid: i32, function: &str) {
        let (start, pid) = match self.open_work.take() {
            Some((s, p, _)) => (s, p),
            None => (self.first.unwrap_or(ts), pid),
        };
        self.work.push(WorkRun {
            start,
            end: ts,
            pid,
            function: function.to_string(),
        });
    }

    /// An exit from context `c` at `ts`, paired with the innermost open context of the same
    /// kind (an IRQ exit names only the number); false when none is open.
    #[inline]
    fn exit(&mut self, ts: u64, c: &Context) -> bool {
        match self.stack.iter().rposition(|(open, _)| same_kind(open, c)) {
            Some(p) => {
                self.close(ts);
                self.stack.truncate(p);
                true
            }
            None => false,
        }
    }

    /// Ends the current owner's segment at `ts`.
    fn close(&mut self, ts: u64) {
        let owner = self.stack.last().map(|(_, id)| *id).or(self.task);
        if let Some(source) = owner {
            if ts > self.since {
                match self.segments.last_mut() {
                    Some(last) if last.source == source && last.end == self.since => {
                        last.end = ts;
                    }
                    _ => self.segments.push(Segment {
                        start: self.since,
                        end: ts,
                        source,
                    }),
                }
            }
        }
        self.since = self.since.max(ts);
    }
}

/// What a gap was matched with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attribution {
    /// Something else ran: the one with the most time in the gap.
    Seen {
        /// It.
        source: Source,
        /// For a kworker, the work function it ran in the gap.
        function: Option<String>,
        /// How many other sources also ran in the gap.
        others: usize,
        /// For a task, its process, when the trace recorded it.
        tgid: Option<i32>,
    },
    /// Nothing the trace shows ran: the hypervisor took the vCPU, or the hardware (SMI).
    Unexplained,
    /// Events were lost around the gap: not known.
    Lost,
    /// The gap lies outside the traced window.
    OutsideTrace,
    /// The CPU was not traced.
    Unseen,
}

impl Attribution {
    /// The name in reports: `qpw/1`, `kworker lru_add_drain_per_cpu`, `irq virtio1-req.0`,
    /// `unexplained`, ...; a `qpw/` thread of a process other than `ours` carries its pid.
    pub fn label(&self, ours: i32) -> String {
        match self {
            Attribution::Seen {
                source: Source::Task { comm, pid },
                function,
                tgid,
                ..
            } => match function {
                Some(f) => format!("{} {f}", kworker_or(comm)),
                None if *pid == 0 => "idle".to_string(),
                None if comm.starts_with("qpw/") && tgid.is_some_and(|t| t != ours) => {
                    format!("{comm} (process {})", tgid.unwrap_or_default())
                }
                None => comm.clone(),
            },
            Attribution::Seen {
                source: Source::Ctx(c),
                ..
            } => c.label(),
            Attribution::Unexplained => "unexplained (hypervisor or hardware)".to_string(),
            Attribution::Lost => "lost events".to_string(),
            Attribution::OutsideTrace => "outside the trace".to_string(),
            Attribution::Unseen => "cpu not traced".to_string(),
        }
    }

    /// The class: `thread`, `irq`, `softirq`, `ipi`, `unexplained`, `lost`.
    pub fn class(&self) -> &'static str {
        match self {
            Attribution::Seen { source, .. } => source.class(),
            Attribution::Unexplained => "unexplained",
            Attribution::Lost => "lost",
            Attribution::OutsideTrace | Attribution::Unseen => "untraced",
        }
    }

    /// The default experiment's four-way split: `qpw` (a worker of process `ours`, or of any
    /// process when the trace does not say), `kernel` (a kworker), `unexplained`, or `other`.
    pub fn bucket(&self, ours: i32) -> &'static str {
        match self {
            Attribution::Seen {
                source: Source::Task { comm, .. },
                tgid,
                ..
            } if comm.starts_with("qpw/") && tgid.is_none_or(|t| t == ours) => "qpw",
            Attribution::Seen {
                source: Source::Task { comm, .. },
                ..
            } if comm.starts_with("kworker/") => "kernel",
            Attribution::Unexplained => "unexplained",
            _ => "other",
        }
    }
}

/// One CPU's noise by source.
#[derive(Debug, Clone)]
pub struct CpuNoise {
    /// The CPU.
    pub cpu: usize,
    /// The task whose noise it is.
    pub main: Option<i32>,
    /// The traced span, in trace-clock units.
    pub span: u64,
    /// By source label, largest total first.
    pub sources: Vec<(String, NoiseEntry)>,
}

/// How often and how long one source took the CPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NoiseEntry {
    /// Its class.
    pub class: &'static str,
    /// Occurrences.
    pub count: u64,
    /// Total time, in trace-clock units.
    pub total: u64,
    /// The longest occurrence.
    pub max: u64,
}
