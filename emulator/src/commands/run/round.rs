//! One round of one scenario: the isolation it runs under, the probe and the load on the
//! target, merged into the scenario's figures.

use std::time::Duration;

use anyhow::{anyhow, Result};
use qpw_core::CpuSet;

use crate::drain::note_outcome;
use crate::load::Phase;
use crate::oslat::{self, OslatConfig, OslatRun};
use crate::rt;
use crate::scenario::{self, DrainSpec};
use crate::trace::Session;

use super::acc::{Acc, RoundPart};
use super::{Ctx, GAP_BUCKETS, GAP_WIDTH_NS, STALL_THRESHOLD, UNISOLATED};

/// Gaps kept for attribution: from 1 us, so that the threshold can be derived afterwards.
const GAP_LOG_NS: u64 = 1000;

impl Ctx {
    /// The rounds: every round runs every scenario once, so that slow drifts in the machine's
    /// noise fall on all of them alike; the results are written after each scenario round.
    pub(super) fn measure(&mut self) -> Result<()> {
        'rounds: for round in 0..self.rounds {
            for i in 0..self.scenarios.len() {
                if rt::interrupted() {
                    self.note_interruption(round, i);
                    break 'rounds;
                }
                self.isolate_for(i)?;
                self.run_round(i, round)?;
                self.write_all()?;
            }
        }
        Ok(())
    }

    /// With `--isolate`: the target isolated for scenario `i`, unless it is the unisolated
    /// baseline, for which the isolation is put back first.
    pub(super) fn isolate_for(&mut self, i: usize) -> Result<()> {
        if !self.isolate {
            return Ok(());
        }
        if self.scenarios[i].name == UNISOLATED {
            self.isolation = None;
            return Ok(());
        }
        if self.isolation.is_none() {
            let target = CpuSet::from_iter([self.target]);
            let housekeeping = self.cpus.allowed.difference(&target);
            let iso = crate::isolate::Isolation::apply(&target, &housekeeping)?;
            if self.isolation_report.is_none() {
                iso.report.say(&self.sink);
                self.isolation_report = Some(iso.report.clone());
            }
            self.isolation = Some(iso);
        }
        Ok(())
    }

    /// One round of scenario `i`, merged into its accumulator.
    pub(super) fn run_round(&mut self, i: usize, round: u32) -> Result<()> {
        let spec = self.drain_spec(i);
        let session = self.start_trace();
        let setup = scenario::setup(&spec)?;
        let cfg = self.probe_config(i, round, &setup, session.is_some());
        let phase: std::sync::Arc<Phase> = setup.phase.clone();
        let qpw_desc = setup.describe();
        let loc_before = local_timer_now(self.target);
        let run = oslat::run(&cfg, self.calibration, &phase);
        let loc_after = local_timer_now(self.target);
        let outcome = setup.finish(Some(self.target))?;
        let run: OslatRun = run?;
        self.sink.warn_all(run.warnings.clone());
        note_outcome(&outcome, &mut self.sink);
        let Some(thread) = run.threads.first() else {
            return Err(anyhow!("the probe measured nothing"));
        };
        let acc = &mut self.scenarios[i];
        acc.add_round(thread, &outcome);
        acc.tick.add_loc(
            loc_before.0,
            loc_after.0,
            loc_after.1.saturating_sub(loc_before.1) as f64 / 1e9,
        );
        acc.qpw_desc = qpw_desc;
        acc.cut_short |= run.interrupted;
        self.done += 1;
        if let Some(session) = session {
            let traced = session.finish()?;
            self.attribute_round(i, &traced, thread, &outcome);
        }
        Ok(())
    }

    /// What scenario `i` drains, how often and from where: the load on every allowed CPU but
    /// the target, the requester on the housekeeping CPU.
    fn drain_spec(&self, i: usize) -> DrainSpec {
        let target_set = CpuSet::from_iter([self.target]);
        let acc = &self.scenarios[i];
        DrainSpec {
            mode: acc.mode,
            workload: acc.workload,
            drain_rate_hz: acc.rate,
            force: false,
            timeout: Duration::from_secs(1),
            stall_threshold: STALL_THRESHOLD,
            load_cpus: self.cpus.allowed.difference(&target_set),
            requester_cpu: self.housekeeping,
            local_op_every: acc.every.unwrap_or(self.every),
            owner_polls: acc.polls,
            requester_prio: None,
            target_cpu: self.target,
            kernel_ready: self
                .ready
                .get(acc.name.as_str())
                .cloned()
                .unwrap_or_default(),
        }
    }

    /// With tracing: the trace of the target for one round. When it cannot start, a warning
    /// says why and the rest of the run goes untraced.
    fn start_trace(&mut self) -> Option<Session> {
        if !self.tracing {
            return None;
        }
        let target_set = CpuSet::from_iter([self.target]);
        match Session::start(&target_set, Some(self.housekeeping)) {
            Ok(s) => Some(s),
            Err(e) => {
                self.sink
                    .warn(format!("tracing stopped: cannot start the trace ({e:#})"));
                self.tracing = false;
                None
            }
        }
    }

    /// The probe's settings for round `round` of scenario `i` (set up as `setup`): one thread
    /// on the target for one chunk, its gaps logged for the trace when `traced`.
    fn probe_config(
        &self,
        i: usize,
        round: u32,
        setup: &scenario::Setup,
        traced: bool,
    ) -> OslatConfig {
        let acc = &self.scenarios[i];
        OslatConfig {
            cpus: CpuSet::from_iter([self.target]),
            duration: self.chunk,
            warmup: Duration::from_millis(100),
            single_preheat: false,
            bias: false,
            memmove_bytes: None,
            main_cpus: None,
            bucket_size: GAP_BUCKETS,
            bucket_width_ns: GAP_WIDTH_NS,
            rtprio: self.rtprio,
            trace_threshold_ns: None,
            local_op: setup.local_op(),
            announce_start: false,
            quiet: self.sink.is_quiet(),
            label: format!("{} ({}/{})", acc.name, round + 1, self.rounds),
            progress_span: Some((self.chunk * self.done, self.chunk * self.total_chunks)),
            gap_log_ns: traced.then_some(GAP_LOG_NS),
        }
    }

    /// Says in the notes what Ctrl-C left out: it came before scenario `next` of round
    /// `round` (0-based) ran.
    pub(super) fn note_interruption(&mut self, round: u32, next: usize) {
        self.interrupted = true;
        let cut: Vec<&str> = self
            .scenarios
            .iter()
            .filter(|a| a.cut_short)
            .map(|a| a.name.as_str())
            .collect();
        let skipped: Vec<&str> = self.scenarios[next..]
            .iter()
            .filter(|a| a.rounds > 0)
            .map(|a| a.name.as_str())
            .collect();
        let never: Vec<&str> = self
            .scenarios
            .iter()
            .filter(|a| a.rounds == 0)
            .map(|a| a.name.as_str())
            .collect();
        let list = |v: &[&str]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        let by = match crate::signals::stop_signal() {
            "SIGINT" => "Ctrl-C",
            other => other,
        };
        self.notes.push(format!(
            "INTERRUPTED ({by}) in round {} of {}: cut short: {} (marked !); one round fewer \
             than the rest: {}; not run at all (no row): {}. Compare the modes only where both \
             ran the same rounds.",
            round + 1,
            self.rounds,
            list(&cut),
            list(&skipped),
            list(&never)
        ));
    }
}

impl Acc {
    /// Merges one round's figures into the scenario's: the probe `thread`'s gaps, local
    /// operations and context switches, and what the load and the requester did (`outcome`);
    /// the round's own figures are kept apart too.
    fn add_round(&mut self, thread: &oslat::OslatThread, outcome: &scenario::Outcome) {
        self.hist.merge(&thread.hist);
        self.op_hist.merge(&thread.op_hist);
        self.op_time.merge(&thread.op_time);
        self.seconds += thread.duration_s;
        self.local_ops += thread.local_ops;
        self.local_op_errors += thread.local_op_errors;
        self.probe_switches += thread.involuntary_switches;
        self.probe_voluntary += thread.voluntary_switches;
        self.target_drains += outcome.target_drains;
        self.load.ops += outcome.load.ops;
        self.load.errors += outcome.load.errors;
        self.load.cpus = outcome.load.cpus.clone();
        if self.load.first_error.is_none() {
            self.load.first_error.clone_from(&outcome.load.first_error);
        }
        if let (Some(r), Some(h)) = (&outcome.requester, &outcome.requester_hist) {
            match &mut self.requester {
                Some((total, hist)) => {
                    total.add_counts(r);
                    hist.merge(h);
                    total.set_times(hist);
                }
                None => self.requester = Some((r.clone(), h.clone())),
            }
        }
        self.by_round.push(RoundPart {
            hist: thread.hist.clone(),
            seconds: thread.duration_s,
            target_drains: outcome.target_drains,
            probe_switches: thread.involuntary_switches + thread.voluntary_switches,
        });
        self.rounds += 1;
    }
}

/// The target's local timer interrupts so far (none when they cannot be read), and the
/// monotonic clock when they were read, in nanoseconds.
fn local_timer_now(cpu: usize) -> (Option<u64>, u64) {
    (
        crate::tick::local_timer_count(cpu),
        crate::clock::monotonic_ns(),
    )
}
