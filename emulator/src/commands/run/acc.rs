//! One scenario's measurements, accumulated over the rounds, and each round's apart.

use std::time::Duration;

use qpw_core::Mode;

use crate::hist::Histogram;
use crate::load::{LoadReport, RequesterReport};
use crate::oslat;
use crate::workload::WorkloadName;

use super::attribution::ScenarioAttribution;
use super::{GAP_BUCKETS, GAP_WIDTH_NS};

/// What one round of a scenario measured on the target, kept apart so that each round can be
/// compared with the idle baseline of the same round.
pub(super) struct RoundPart {
    pub(super) hist: Histogram,
    pub(super) seconds: f64,
    pub(super) target_drains: u64,
    /// The probe thread's context switches, involuntary plus voluntary.
    pub(super) probe_switches: u64,
}

/// One scenario's measurements, accumulated over the rounds.
pub(super) struct Acc {
    pub(super) name: String,
    pub(super) mode: Mode,
    pub(super) workload: WorkloadName,
    pub(super) rate: f64,
    pub(super) hist: Histogram,
    pub(super) op_hist: Histogram,
    pub(super) op_time: Histogram,
    pub(super) seconds: f64,
    pub(super) local_ops: u64,
    pub(super) local_op_errors: u64,
    /// The probe thread's involuntary context switches.
    pub(super) probe_switches: u64,
    /// The probe thread's voluntary context switches (it slept, waiting for its lock).
    pub(super) probe_voluntary: u64,
    pub(super) requester: Option<(RequesterReport, crate::load::DrainTimes)>,
    pub(super) load: LoadReport,
    pub(super) target_drains: u64,
    pub(super) qpw_desc: String,
    pub(super) rounds: u32,
    /// The target's figures of each round, in order.
    pub(super) by_round: Vec<RoundPart>,
    /// With tracing: what the target's interruptions were.
    pub(super) attribution: ScenarioAttribution,
    /// With tracing, for a kernel workload: each run of its work function on the target, in
    /// microseconds.
    pub(super) work_us: Vec<f64>,
    /// Whether Ctrl-C cut one of its rounds short.
    pub(super) cut_short: bool,
    /// The probe's local operation period, when the scenario has its own (`fenced-idle-*`,
    /// `fenced-poll-*`).
    pub(super) every: Option<Duration>,
    /// Whether the probe polls its binding at every turn of its loop (`fenced-poll-*`).
    pub(super) polls: bool,
    /// The target's tick over the rounds, and the run's own tasks there.
    pub(super) tick: crate::tick::TargetTick,
}

impl Acc {
    pub(super) fn new(name: &str, mode: Mode, workload: WorkloadName, rate: f64) -> Self {
        Self {
            name: name.to_string(),
            mode,
            workload,
            rate,
            hist: Histogram::new(GAP_BUCKETS, GAP_WIDTH_NS),
            op_hist: Histogram::new(GAP_BUCKETS, GAP_WIDTH_NS),
            op_time: oslat::op_time_hist(),
            seconds: 0.0,
            local_ops: 0,
            local_op_errors: 0,
            probe_switches: 0,
            probe_voluntary: 0,
            requester: None,
            load: LoadReport::default(),
            target_drains: 0,
            qpw_desc: String::new(),
            rounds: 0,
            by_round: Vec::new(),
            attribution: ScenarioAttribution {
                scenario: name.to_string(),
                ..ScenarioAttribution::default()
            },
            work_us: Vec::new(),
            every: None,
            polls: false,
            cut_short: false,
            tick: crate::tick::TargetTick {
                scenario: name.to_string(),
                ..Default::default()
            },
        }
    }
}
