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

use super::acc::RoundPart;
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
        let target_set = CpuSet::from_iter([self.target]);
        let acc = &self.scenarios[i];
        let spec = DrainSpec {
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
        };
        let session = if self.tracing {
            match Session::start(&target_set, Some(self.housekeeping)) {
                Ok(s) => Some(s),
                Err(e) => {
                    self.sink
                        .warn(format!("tracing stopped: cannot start the trace ({e:#})"));
                    self.tracing = false;
                    None
                }
            }
        } else {
            None
        };
        let setup = scenario::setup(&spec)?;
        let cfg = OslatConfig {
            cpus: target_set,
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
            gap_log_ns: session.as_ref().map(|_| GAP_LOG_NS),
        };
        let phase: std::sync::Arc<Phase> = setup.phase.clone();
        let qpw_desc = setup.describe();
        let loc_before = (
            crate::tick::local_timer_count(self.target),
            crate::clock::monotonic_ns(),
        );
        let run = oslat::run(&cfg, self.calibration, &phase);
        let loc_after = (
            crate::tick::local_timer_count(self.target),
            crate::clock::monotonic_ns(),
        );
        let outcome = setup.finish(Some(self.target))?;
        let run: OslatRun = run?;
        self.sink.warn_all(run.warnings.clone());
        note_outcome(&outcome, &mut self.sink);
        let Some(thread) = run.threads.first() else {
            return Err(anyhow!("the probe measured nothing"));
        };
        let acc = &mut self.scenarios[i];
        acc.hist.merge(&thread.hist);
        acc.op_hist.merge(&thread.op_hist);
        acc.op_time.merge(&thread.op_time);
        acc.seconds += thread.duration_s;
        acc.local_ops += thread.local_ops;
        acc.local_op_errors += thread.local_op_errors;
        acc.probe_switches += thread.involuntary_switches;
        acc.probe_voluntary += thread.voluntary_switches;
        acc.target_drains += outcome.target_drains;
        acc.load.ops += outcome.load.ops;
        acc.load.errors += outcome.load.errors;
        acc.load.cpus = outcome.load.cpus.clone();
        if acc.load.first_error.is_none() {
            acc.load.first_error.clone_from(&outcome.load.first_error);
        }
        if let (Some(r), Some(h)) = (&outcome.requester, &outcome.requester_hist) {
            match &mut acc.requester {
                Some((total, hist)) => {
                    total.add_counts(r);
                    hist.merge(h);
                    total.set_times(hist);
                }
                None => acc.requester = Some((r.clone(), h.clone())),
            }
        }
        acc.by_round.push(RoundPart {
            hist: thread.hist.clone(),
            seconds: thread.duration_s,
            target_drains: outcome.target_drains,
            probe_switches: thread.involuntary_switches + thread.voluntary_switches,
        });
        acc.tick.add_loc(
            loc_before.0,
            loc_after.0,
            loc_after.1.saturating_sub(loc_before.1) as f64 / 1e9,
        );
        acc.qpw_desc = qpw_desc;
        acc.rounds += 1;
        acc.cut_short |= run.interrupted;
        self.done += 1;
        if let Some(session) = session {
            let traced = session.finish()?;
            self.attribute_round(i, &traced, thread, &outcome);
        }
        Ok(())
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
