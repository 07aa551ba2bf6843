//! The measured CPU's tick, and what a run itself puts on that CPU besides its probe.
//!
//! On a `nohz_full` CPU the kernel stops the periodic tick while one task runs there alone and
//! nothing else needs it (`can_stop_full_tick()`: no second runnable task, no POSIX CPU timer,
//! no perf event that needs rotating, no RCU callbacks or lazy `irq_work` waiting on it). A
//! task spinning alone there then sees the local timer interrupt about once a second or less
//! (the real oslat, in the guests of `docs/validation.md`: 0.2-1.6 per second) where an
//! ordinary CPU sees it `HZ` times a second. A run that measures such a CPU must not keep the
//! tick on there itself, or its idle baseline measures the run, not the CPU.
//!
//! So every scenario of `qpw-emu run` counts the target's local timer interrupts (the `LOC`
//! line of `/proc/interrupts`, which needs no privilege) around each round, and, with the
//! trace, which timers fired there (`hrtimer_expire_entry`: the tick's `tick_nohz_handler`,
//! `tick_sched_timer` before 6.10, or a sleeping task's `hrtimer_wakeup`), what kept the tick
//! on when the kernel tried to stop it (`tick_stop`), and which of the run's own tasks ran
//! there besides the probe (the queue-mode worker `qpw/<cpu>`, the kernel rows' filler
//! `qpw-filler`; the trace reader and the requester are pinned elsewhere, and would show here
//! if they were not). The report warns when the idle baseline's tick rate on a
//! `nohz_full` target is above [`QUIET_PER_S`], and says so when the kernel keeps it for
//! `CLOCK_UNSTABLE`: a kernel that took its TSC for unstable (the clocksource watchdog, which a
//! TCG guest's emulated TSC can fail) keeps the tick on every `nohz_full` CPU until it reboots,
//! whatever runs there. That was the 6.12 guest's 166/s of `docs/validation.md`: the real
//! oslat, measured before the run, saw 1.3/s; after the run, 248/s.

use std::collections::BTreeMap;

/// A `nohz_full` CPU whose idle baseline sees more local timer interrupts per second than
/// this is not quiet: a task alone there sees about one a second (the kernel's own residual
/// timers), a running tick `HZ` (100 to 1000).
pub const QUIET_PER_S: f64 = 10.0;

/// The tick's timer function: `tick_nohz_handler` since 6.10, `tick_sched_timer` before.
pub const TICK_FUNCTIONS: [&str; 2] = ["tick_nohz_handler", "tick_sched_timer"];

/// CPU `cpu`'s count on the `LOC:` line (local timer interrupts) of `/proc/interrupts`.
pub fn local_timer_count(cpu: usize) -> Option<u64> {
    parse_loc(&std::fs::read_to_string("/proc/interrupts").ok()?, cpu)
}

/// CPU `cpu`'s `LOC:` count in the text of `/proc/interrupts`: its column is found from the
/// header (`CPU0 CPU1 ...`, online CPUs only).
pub fn parse_loc(text: &str, cpu: usize) -> Option<u64> {
    let mut lines = text.lines();
    let header = lines.next()?;
    let column = header
        .split_whitespace()
        .position(|c| c == format!("CPU{cpu}"))?;
    let loc = lines.find(|l| l.trim_start().starts_with("LOC:"))?;
    loc.trim_start()
        .strip_prefix("LOC:")?
        .split_whitespace()
        .nth(column)?
        .parse()
        .ok()
}

/// Whether the kernel runs `cpu` tickless while one task runs there
/// (`/sys/devices/system/cpu/nohz_full`).
pub fn is_nohz_full(cpu: usize) -> bool {
    qpw_core::Topology::read().is_ok_and(|t| t.nohz_full().contains(cpu))
}

/// One scenario's tick on the target, and what of the run's own ran there.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TargetTick {
    /// The scenario.
    pub scenario: String,
    /// Seconds between the reads of `/proc/interrupts` around its rounds, summed (rounds
    /// whose counts could be read).
    pub seconds: f64,
    /// The target's local timer interrupts over those seconds (`LOC`); `None` when
    /// `/proc/interrupts` could not be read.
    pub local_timer: Option<u64>,
    /// The same per second.
    pub local_timer_per_s: Option<f64>,
    /// With the trace: the timers that fired on the target, by function, over the traced
    /// rounds (the tick is `tick_nohz_handler` or `tick_sched_timer`).
    pub timers: BTreeMap<String, u64>,
    /// With the trace: the tick's firings per traced second.
    pub tick_per_s: Option<f64>,
    /// With the trace, on a `nohz_full` target: the times the tick could not stop, by the
    /// dependency that kept it (`SCHED`: a second runnable task; `POSIX_TIMER`;
    /// `PERF_EVENTS`; `CLOCK_UNSTABLE`; `RCU`).
    pub tick_kept_by: BTreeMap<String, u64>,
    /// Seconds the trace covered.
    pub traced_seconds: f64,
    /// With the trace: the run's own tasks (its threads, by the trace's process ids, and its
    /// filler) that ran on the target besides the probe, with how often they took it (runs)
    /// and for how long in all (microseconds).
    pub ours: Vec<Ours>,
}

/// One of the run's own tasks on the target.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Ours {
    /// Its name (`qpw/1`, `qpw-filler`).
    pub name: String,
    /// Times it took the CPU from the probe.
    pub runs: u64,
    /// Its time there, in microseconds.
    pub total_us: f64,
}

impl TargetTick {
    /// Adds one round's reads: the `LOC` counts before and after, `seconds` apart.
    pub fn add_loc(&mut self, before: Option<u64>, after: Option<u64>, seconds: f64) {
        // A round whose count could not be read adds no time to the rate.
        if let (Some(b), Some(a)) = (before, after) {
            self.local_timer = Some(self.local_timer.unwrap_or(0) + a.saturating_sub(b));
            self.seconds += seconds;
            self.local_timer_per_s = self
                .local_timer
                .filter(|_| self.seconds > 0.0)
                .map(|n| n as f64 / self.seconds);
        }
    }

    /// Adds one traced round: the timers that fired on the target, what kept its tick on, the
    /// run's own tasks that ran there besides the probe (`ours`, from
    /// [`crate::trace::Traced::tasks_of`]), over `traced` seconds.
    pub fn add_trace(
        &mut self,
        timers: &BTreeMap<String, u64>,
        kept: &BTreeMap<String, u64>,
        ours: &[crate::trace::SourceFigures],
        traced: f64,
    ) {
        for (f, n) in timers {
            *self.timers.entry(f.clone()).or_default() += n;
        }
        for (d, n) in kept {
            *self.tick_kept_by.entry(d.clone()).or_default() += n;
        }
        self.traced_seconds += traced;
        let ticks: u64 = TICK_FUNCTIONS
            .iter()
            .filter_map(|f| self.timers.get(*f))
            .sum();
        self.tick_per_s = (self.traced_seconds > 0.0).then(|| ticks as f64 / self.traced_seconds);
        for s in ours {
            match self.ours.iter_mut().find(|o| o.name == s.source) {
                Some(o) => {
                    o.runs += s.count;
                    o.total_us += s.total_us;
                }
                None => self.ours.push(Ours {
                    name: s.source.clone(),
                    runs: s.count,
                    total_us: s.total_us,
                }),
            }
        }
        self.ours
            .sort_by(|a, b| b.runs.cmp(&a.runs).then(a.name.cmp(&b.name)));
    }

    /// The timers other than the tick, as `function count` words.
    pub fn other_timers(&self) -> String {
        let v: Vec<String> = self
            .timers
            .iter()
            .filter(|(f, _)| !TICK_FUNCTIONS.contains(&f.as_str()))
            .map(|(f, n)| format!("{f} {n}"))
            .collect();
        if v.is_empty() {
            "none".into()
        } else {
            v.join(", ")
        }
    }

    /// What kept the tick on, as `dependency count` words.
    pub fn kept_line(&self) -> String {
        if self.tick_kept_by.is_empty() {
            return "none".into();
        }
        self.tick_kept_by
            .iter()
            .map(|(d, n)| format!("{d} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The run's own tasks, as `name runs` words.
    pub fn ours_line(&self) -> String {
        if self.ours.is_empty() {
            return "none".into();
        }
        self.ours
            .iter()
            .map(|o| format!("{} {}", o.name, o.runs))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The kernel's clocksource now (`tsc`, `hpet`, ...).
fn clocksource() -> String {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .map_or_else(|_| "unknown".into(), |c| c.trim().to_string())
}

/// The verdict on an idle baseline's tick on the target: a warning when the target is
/// `nohz_full` and the tick ran there faster than [`QUIET_PER_S`], else a note.
pub fn verdict(cpu: usize, nohz_full: bool, idle: &TargetTick) -> (bool, String) {
    let Some(rate) = idle.local_timer_per_s else {
        return (
            false,
            format!("tick: cpu {cpu}'s local timer interrupts could not be counted (no LOC line in /proc/interrupts)"),
        );
    };
    let traced = idle
        .tick_per_s
        .map_or(String::new(), |t| format!("; the trace's tick: {t:.1}/s"));
    if !nohz_full {
        return (
            false,
            format!(
                "tick: cpu {cpu} is not nohz_full, so the tick runs there: the idle baseline saw \
                 {rate:.1} local timer interrupts/s (LOC in /proc/interrupts{traced})"
            ),
        );
    }
    let unstable = idle
        .tick_kept_by
        .get("CLOCK_UNSTABLE")
        .copied()
        .unwrap_or(0);
    if rate > QUIET_PER_S && unstable * 2 > idle.tick_kept_by.values().sum::<u64>() {
        return (
            true,
            format!(
                "the tick runs on nohz_full cpu {cpu} in the idle baseline: {rate:.1} local \
                 timer interrupts/s (LOC in /proc/interrupts{traced}), kept by CLOCK_UNSTABLE \
                 ({unstable} of the kernel's tick_stop refusals): the kernel marked its clock \
                 unstable (the TSC failed the clocksource watchdog; clocksource now: {}), and \
                 then keeps the tick on every nohz_full CPU until it reboots. The machine's \
                 doing, not the run's (its own on that cpu: {}); where the TSC is sound, boot \
                 with tsc=reliable, as real-time systems do",
                clocksource(),
                idle.ours_line()
            ),
        );
    }
    if rate > QUIET_PER_S {
        (
            true,
            format!(
                "the tick runs on nohz_full cpu {cpu} in the idle baseline: {rate:.1} local timer \
                 interrupts/s (LOC in /proc/interrupts{traced}), where a task alone there sees \
                 about 1/s; something keeps it on (what kept it, from the kernel's tick_stop \
                 event: {}; the run's own on that cpu: {}; other timers: {}), so the baseline \
                 measures the run, not the cpu",
                idle.kept_line(),
                idle.ours_line(),
                idle.other_timers()
            ),
        )
    } else {
        (
            false,
            format!(
                "tick: cpu {cpu} is nohz_full and the idle baseline saw {rate:.1} local timer \
                 interrupts/s there (LOC in /proc/interrupts{traced}): quiet (a running tick \
                 would be HZ, 100-1000/s)"
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERRUPTS: &str = "           CPU0       CPU1       \n  \
          0:         44          0   IO-APIC   2-edge      timer\n \
        LOC:     123456       1502   Local timer interrupts\n \
        RES:         10         20   Rescheduling interrupts\n";

    #[test]
    fn the_loc_line_is_read_by_the_headers_column() {
        assert_eq!(parse_loc(INTERRUPTS, 0), Some(123_456));
        assert_eq!(parse_loc(INTERRUPTS, 1), Some(1502));
        assert_eq!(parse_loc(INTERRUPTS, 2), None);
        assert_eq!(parse_loc("CPU0\n", 0), None);
    }

    #[test]
    fn rates_add_up_over_rounds_and_the_verdict_warns_only_on_a_busy_nohz_full_cpu() {
        let mut t = TargetTick::default();
        t.add_loc(Some(100), Some(102), 2.0);
        t.add_loc(None, Some(5), 1.0);
        t.add_loc(Some(10), Some(12), 2.0);
        assert_eq!(t.local_timer, Some(4));
        assert_eq!(t.local_timer_per_s, Some(4.0 / 4.0));
        assert!(!verdict(1, true, &t).0);
        t.add_loc(Some(0), Some(1000), 2.0);
        let (warn, line) = verdict(1, true, &t);
        assert!(warn && line.contains("nohz_full cpu 1"), "{line}");
        assert!(!verdict(1, false, &t).0);
        assert!(!verdict(1, true, &TargetTick::default()).0);
        // Kept by the kernel's unstable clock: the machine's doing, said so.
        t.tick_kept_by.insert("CLOCK_UNSTABLE".into(), 900);
        t.tick_kept_by.insert("SCHED".into(), 3);
        let (warn, line) = verdict(1, true, &t);
        assert!(warn && line.contains("kept by CLOCK_UNSTABLE"), "{line}");
        assert!(line.contains("tsc=reliable"), "{line}");
    }

    #[test]
    fn the_runs_own_tasks_are_named_and_the_tick_is_told_from_other_timers() {
        let mut t = TargetTick::default();
        let noise = |source: &str, class: &str, count| crate::trace::SourceFigures {
            source: source.into(),
            class: class.into(),
            count,
            total_us: 1.0,
            max_us: 1.0,
        };
        let timers: BTreeMap<String, u64> = [
            ("tick_nohz_handler".to_string(), 4),
            ("hrtimer_wakeup".to_string(), 1),
        ]
        .into();
        t.add_trace(
            &timers,
            &BTreeMap::new(),
            &[
                noise("qpw/1", "thread", 3),
                noise("qpw-filler", "thread", 2),
            ],
            2.0,
        );
        assert_eq!(t.ours_line(), "qpw/1 3, qpw-filler 2");
        assert_eq!(t.tick_per_s, Some(2.0));
        assert_eq!(t.other_timers(), "hrtimer_wakeup 1");
    }
}
