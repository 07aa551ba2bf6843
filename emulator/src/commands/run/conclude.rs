//! The notes under the table: what the run's figures say, mode against mode, and what they
//! cannot say on this machine.

use crate::rt;
use crate::table::Row;

use super::acc::Acc;
use super::figures::rates_at_thresholds;
use super::{Ctx, IDLE_OWNER, THRESHOLD_NS, UNISOLATED};

impl Ctx {
    /// Compares the modes and says in words what the table shows, or why it does not.
    pub(super) fn conclude(&mut self) {
        let rows = self.rows();
        let mut lines = queue_against_remote(&rows, self.baseline_rate());
        lines.extend(fenced_against_remote(&rows));
        lines.push(self.threshold_line());
        if self.isolate {
            lines.extend(self.isolation_lines());
        } else if let Some(how) = rt::isolation_of(self.target) {
            self.notes.push(format!(
                "the target, cpu {}, is isolated by the kernel ({how}): what reaches it is the \
                 kernel's own per-CPU work, the tick where it still runs, and the modes' own",
                self.target
            ));
        } else {
            self.notes.push(
                "no isolated CPU here: the figures carry the machine's own noise (including \
                 millisecond gaps on an idle vCPU), so compare the modes within this run, as \
                 ratios and counts, not with other machines"
                    .to_string(),
            );
        }
        if let Some(idle) = self
            .scenarios
            .iter()
            .find(|a| a.name == "idle" && a.rounds > 0)
        {
            let (warn, line) = crate::tick::verdict(self.target, self.nohz_full, &idle.tick);
            if warn {
                self.sink.warn(line);
            } else {
                self.notes.push(line);
            }
        }
        if rt::emulated_cpu() {
            self.notes.push(
                "the CPUs are emulated (qemu TCG): every time is stretched, so read the counts \
                 and ratios (what ran on the target, per drain), not the microseconds"
                    .to_string(),
            );
        }
        self.notes.extend(lines);
    }

    /// How the interruption counts move with the threshold: each scenario's gaps per second
    /// at 2, 5, 10 and 20 us.
    pub(super) fn threshold_line(&self) -> String {
        let parts: Vec<String> = self
            .scenarios
            .iter()
            .filter(|a| a.rounds > 0 && a.seconds > 0.0)
            .map(|a| {
                let at: Vec<String> = rates_at_thresholds(a)
                    .iter()
                    .map(|(_, per_s)| format!("{per_s:.0}"))
                    .collect();
                format!("{} {}", a.name, at.join("/"))
            })
            .collect();
        format!(
            "interruptions per second at 2/5/10/20 us (the table counts from {} us): {}",
            THRESHOLD_NS / 1000,
            parts.join("; ")
        )
    }

    /// With `--isolate`: what the isolation removed (the idle baseline against the unisolated
    /// one of the same rounds, by the trace's classes), and which kernel drains still reached
    /// the target.
    pub(super) fn isolation_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let find = |name: &str| {
            self.scenarios
                .iter()
                .find(|a| a.name == name && a.rounds > 0)
        };
        if let (Some(iso), Some(un)) = (find("idle"), find(UNISOLATED)) {
            lines.push(self.idle_compared(iso, un));
        }
        for a in self.scenarios.iter().filter(|a| a.rounds > 0) {
            lines.extend(self.kernel_drain_line(a));
        }
        lines
    }

    /// The isolated idle baseline `iso` against the unisolated one `un`: the kernel's and the
    /// others' interruptions but the tick, by the trace's classes (the rates alone without a
    /// trace).
    fn idle_compared(&self, iso: &Acc, un: &Acc) -> String {
        let get = |a: &Acc, k: &str| a.attribution.by_bucket.get(k).copied().unwrap_or(0);
        if iso.attribution.by_bucket.is_empty() && un.attribution.by_bucket.is_empty() {
            return format!(
                "isolation: no trace, so no classes to compare; interruptions/s idle {:.0} \
                 isolated vs {:.0} not",
                self.rate_at_threshold(iso),
                self.rate_at_threshold(un)
            );
        }
        let (ki, oi) = (get(iso, "kernel"), get(iso, "other"));
        let (ku, ou) = (get(un, "kernel"), get(un, "other"));
        // The tick stays with run-time isolation (no nohz_full), and a probe that shares its
        // CPU sees fewer ticks (it is not running for many of them): the comparison leaves it
        // out.
        let tick = |a: &Acc| {
            a.attribution
                .top
                .iter()
                .find(|s| s.source == "vector local_timer")
                .map_or(0, |s| s.count)
        };
        let (ti, tu) = (tick(iso), tick(un));
        let (a, b) = ((ki + oi).saturating_sub(ti), (ku + ou).saturating_sub(tu));
        let noise = 2.0 * ((a + b) as f64).sqrt();
        let verdict = if b as f64 - a as f64 > noise {
            "dropped"
        } else if a as f64 - b as f64 > noise {
            "rose"
        } else {
            "did not change beyond counting noise"
        };
        format!(
            "isolation: the idle target's kernel and other interruptions but the tick \
             {verdict} with cpu {} isolated at run time: {a} vs {b} (isolated vs not; 2 \
             sigma {noise:.0}); the probe was preempted {} vs {} times; all kernel {ki} \
             vs {ku}, other {oi} vs {ou}, of which the local timer (the tick, which only \
             nohz_full stops) {ti} vs {tu}; {:.1} s each, interleaved in the same rounds",
            self.target,
            iso.probe_switches,
            un.probe_switches,
            iso.seconds.min(un.seconds)
        )
    }

    /// For a kernel workload's scenario `a` with a trace: whether its drains still reached the
    /// isolated target.
    fn kernel_drain_line(&self, a: &Acc) -> Option<String> {
        let k = a.workload.kernel()?;
        let w = a.attribution.kernel_work.as_ref()?;
        let seen = self
            .isolation_report
            .as_ref()
            .is_some_and(|r| r.kernel_sees_isolated);
        Some(format!(
            "isolation: {k}: {} run(s) of {} on the isolated cpu {} in {} drains: the kernel \
             {} it ({})",
            w.runs,
            w.function,
            self.target,
            w.drains,
            if w.runs == 0 {
                "skipped"
            } else {
                "did not skip"
            },
            if seen {
                "the kernel counts the CPU as isolated"
            } else {
                "the kernel does not count a CPU isolated at run time without a cgroup v2 \
                 partition as isolated"
            }
        ))
    }
}

/// `a / b` as `2.5x`, or `n/a`.
fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.1}x", a / b),
        _ => "n/a".to_string(),
    }
}

/// A figure with two decimals, or `n/a`.
fn two(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.2}"))
}

/// Nanoseconds, or `n/a`.
fn ns(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.0} ns"))
}

/// Each workload's queue mode against its remote mode: drain times, interruptions, probe
/// preemptions; and why remote mode can look no better on this machine.
fn queue_against_remote(rows: &[Row], baseline: f64) -> Vec<String> {
    let find = |scen: &str| rows.iter().find(|r| r.name == scen);
    let mut lines = Vec::new();
    for row in rows {
        let Some(w) = row.name.strip_prefix("queue-") else {
            continue;
        };
        let (Some(q), Some(r)) = (find(&format!("queue-{w}")), find(&format!("remote-{w}"))) else {
            continue;
        };
        let by_round = |row: &Row| {
            let parts: Vec<String> = row
                .excess_per_drain_by_round
                .iter()
                .map(|&v| two(v))
                .collect();
            parts.join("/")
        };
        lines.push(format!(
            "{w}: queue/remote drain p50 {}, p99 {}; target interruptions/s {:.0} vs {:.0} \
             (idle {:.0}); excess interruptions per drain {} vs {} (median of the rounds; \
             by round {} vs {}); probe preemptions per drain {} vs {}",
            ratio(q.drain_p50, r.drain_p50),
            ratio(q.drain_p99, r.drain_p99),
            q.interruptions_per_s.unwrap_or(0.0),
            r.interruptions_per_s.unwrap_or(0.0),
            baseline,
            two(q.excess_per_drain),
            two(r.excess_per_drain),
            by_round(q),
            by_round(r),
            two(q.preemptions_per_drain),
            two(r.preemptions_per_drain),
        ));
        if q.target_drains == Some(0) {
            lines.push(format!(
                "{w}: no queue-mode drain reached the target (its cache was always empty when \
                 the requester looked), so no drain could interrupt it"
            ));
        }
        if q.excess_per_drain.unwrap_or(0.0) <= r.excess_per_drain.unwrap_or(0.0) {
            let in_op = r.during_local_op.unwrap_or(0);
            let total = r.interruptions.unwrap_or(0).max(1);
            lines.push(format!(
                "{w}: in this run the target saw at least as many interruptions per drain in \
                 remote mode as in queue mode, though no worker of ours runs there in remote \
                 mode: {in_op} of its {total} interruptions came while the probe was doing \
                 its own local operation, i.e. waiting for its per-CPU lock (held by the \
                 requester, which in userspace can itself be preempted or blocked while \
                 holding it, unlike under a kernel spinlock); the rest is this machine's \
                 noise ({baseline:.0} interruptions/s idle)"
            ));
        }
    }
    lines
}

/// Fenced mode against remote mode, whether or not queue mode ran, and the idle and polling
/// owners' rows.
fn fenced_against_remote(rows: &[Row]) -> Vec<String> {
    let find = |scen: &str| rows.iter().find(|r| r.name == scen);
    let mut lines = Vec::new();
    for f in rows {
        let Some(w) = f.name.strip_prefix("fenced-") else {
            continue;
        };
        if let Some(w) = w.strip_prefix("idle-") {
            lines.push(format!(
                "{w}: with an idle owner (it spins, touching its lock once per {} us), per \
                 drain the target answered {} of the requester's flags and was fenced for {}: \
                 the fence's interrupt lands there (the trace's call_function_single, below); \
                 drain p50 {}",
                IDLE_OWNER.as_micros(),
                two(f.answers_per_drain),
                two(f.fences_per_drain),
                f.drain_p50.map_or("n/a".into(), |v| format!("{v:.1} us")),
            ));
            continue;
        }
        if let Some(w) = w.strip_prefix("poll-") {
            let remote = find(&format!("remote-{w}"));
            lines.push(format!(
                "{w}: the same idle owner polling its binding at every turn of its spin loop \
                 (fenced-poll-{w}: Binding::poll, as an owner's poll loop answers requesters \
                 between its operations): per drain the target answered {} of the \
                 requester's flags and was fenced for {}; drain p50 {}, {} remote mode's",
                two(f.answers_per_drain),
                two(f.fences_per_drain),
                f.drain_p50.map_or("n/a".into(), |v| format!("{v:.1} us")),
                remote.map_or("n/a".into(), |r| ratio(f.drain_p50, r.drain_p50)),
            ));
            continue;
        }
        let Some(r) = find(&format!("remote-{w}")) else {
            continue;
        };
        lines.push(format!(
            "{w}: fenced/remote drain p50 {}, p99 {}; per drain the target answered {} of \
             the requester's flags and was fenced for {} (a membarrier interrupt each, when \
             a thread of ours ran there); owner's local op p50 {} vs {}; excess \
             interruptions per drain {} vs {}; probe context switches per drain {} vs {}",
            ratio(f.drain_p50, r.drain_p50),
            ratio(f.drain_p99, r.drain_p99),
            two(f.answers_per_drain),
            two(f.fences_per_drain),
            ns(f.local_op_ns),
            ns(r.local_op_ns),
            two(f.excess_per_drain),
            two(r.excess_per_drain),
            two(f.preemptions_per_drain),
            two(r.preemptions_per_drain),
        ));
    }
    lines
}
