//! The default experiment's plan: the command line validated into what to measure (the
//! scenarios), where (the target and the housekeeping CPU), for how long, with what load, and
//! where the results go. Nothing here changes the machine; the kernel workloads' preflight
//! readies what their rows need (kernel-pcp's held page), or leaves their rows out with a note.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Result};
use qpw_core::{CpuSet, Mode};

use crate::cli::RunArgs;
use crate::cpus::Cpus;
use crate::rt;
use crate::sink::Sink;
use crate::trace::tracefs;
use crate::validate;
use crate::workload::WorkloadName;

use super::acc::Acc;
use super::{IDLE_OWNER, UNISOLATED};

/// What the experiment measures, where, for how long and with what load.
pub(super) struct Plan {
    pub(super) cpus: Cpus,
    pub(super) duration: Duration,
    /// `--drain-rate` as given: without it the kernel rows take their own rates.
    pub(super) rate_given: Option<f64>,
    /// The emulated workloads' drain rate.
    pub(super) rate: f64,
    pub(super) target: usize,
    pub(super) target_set: CpuSet,
    pub(super) housekeeping: usize,
    pub(super) rtprio: Option<i32>,
    /// The probe's local operation period.
    pub(super) every: Duration,
    pub(super) modes: Vec<Mode>,
    /// The workloads, each once, the kernel's own after the emulated ones.
    pub(super) workloads: Vec<WorkloadName>,
    /// What the reader should know about the comparison (rows left out, and why).
    pub(super) notes: Vec<String>,
    /// Whether every scenario is traced (root and tracefs).
    pub(super) tracing: bool,
    /// What each kernel workload's preflight left ready (kernel-pcp's held page), for the run.
    pub(super) ready: BTreeMap<String, crate::kernel::Ready>,
    /// The results folder.
    pub(super) out: PathBuf,
    /// `--isolate`.
    pub(super) isolate: bool,
}

impl Plan {
    /// The plan of `args`, validated in the order of the options' help; the first bad option
    /// is the error.
    pub(super) fn new(args: &RunArgs) -> Result<Plan> {
        if args.isolate {
            crate::isolate::check_root()?;
        }
        let cpus = Cpus::read()?;
        let duration = validate::duration("--duration", &args.duration)?;
        let rate_given = args
            .drain_rate
            .as_deref()
            .map(|r| validate::float_in("--drain-rate", r, 1.0, 100_000.0))
            .transpose()?;
        let rate = rate_given.unwrap_or(1000.0);
        let target = match &args.target {
            Some(t) => validate::cpu("--target", t, &cpus.allowed)?,
            None => cpus.target,
        };
        let rtprio =
            validate::opt_int_in("--rtprio", args.rtprio.as_deref(), 1, 99)?.map(|p| p as i32);
        let every = validate::op_interval("--local-op-every", &args.local_op_every)?;
        let modes = modes(args.modes.as_deref())?;
        let mut notes = Vec::new();
        let asked = workloads(args)?;
        let tracing = tracing(&mut notes);
        let (workloads, ready) = with_kernel_rows(args, asked, tracing, &mut notes)?;
        let target_set = CpuSet::from_iter([target]);
        let housekeeping = cpus.housekeeping(&target_set).ok_or_else(|| {
            anyhow!(
                "the default experiment needs two CPUs (a target and a housekeeping CPU); only {} \
             is allowed",
                cpus.allowed
            )
        })?;
        let out = match &args.out {
            Some(dir) => dir.clone(),
            None => PathBuf::from("results").join(rt::local_time("%Y%m%d-%H%M%S")),
        };
        validate::output_dir("--out", &out)?;
        Ok(Plan {
            cpus,
            duration,
            rate_given,
            rate,
            target,
            target_set,
            housekeeping,
            rtprio,
            every,
            modes,
            workloads,
            notes,
            tracing,
            ready,
            out,
            isolate: args.isolate,
        })
    }

    /// The number of scenarios the opening line announces.
    pub(super) fn announced(&self) -> usize {
        let emulated = self
            .workloads
            .iter()
            .filter(|w| w.kernel().is_none())
            .count();
        1 + usize::from(self.isolate)
            + (self.workloads.len() - emulated)
            + emulated * self.modes.len()
            + usize::from(emulated > 0 && self.modes.contains(&Mode::Fenced))
    }

    /// Says, unless quiet, where the experiment runs and for how long.
    pub(super) fn announce(&self, rounds: u32, sink: &Sink) {
        let n_scen = self.announced();
        sink.say(format_args!(
            "qpw-emu: target cpu {}, requester on cpu {}, load on {}; {n_scen} scenarios of \
             {:.1} s, interleaved in {rounds} rounds (about {:.0} s); results in {}",
            self.target,
            self.housekeeping,
            self.cpus.allowed.difference(&self.target_set),
            self.duration.as_secs_f64(),
            n_scen as f64 * (self.duration.as_secs_f64() + 0.3 * f64::from(rounds)),
            self.out.display()
        ));
    }

    /// The scenarios: the idle baseline, then each workload in each mode.
    pub(super) fn scenarios(&self) -> Vec<Acc> {
        let (workloads, modes, rate, rate_given) =
            (&self.workloads, &self.modes, self.rate, self.rate_given);
        let base_workload = workloads.first().copied().unwrap_or(WorkloadName::Lru);
        let base_workload = if base_workload.kernel().is_some() {
            WorkloadName::Lru
        } else {
            base_workload
        };
        // The idle baselines in remote mode: the same lock on the probe's path as queue mode's,
        // and no worker thread of the target's that could run there.
        let mut scenarios = vec![Acc::new("idle", Mode::Remote, base_workload, 0.0)];
        if self.isolate {
            scenarios.push(Acc::new(UNISOLATED, Mode::Remote, base_workload, 0.0));
        }
        for &w in workloads {
            if let Some(k) = w.kernel() {
                // The kernel decides its own mode (mode 1, remote, for drain_all_pages since 6.0);
                // its drains go at a rate that suits their cost.
                let rate = rate_given.unwrap_or_else(|| k.default_rate_hz());
                let mode = if k.is_remote() {
                    Mode::Remote
                } else {
                    Mode::Queue
                };
                scenarios.push(Acc::new(w.name(), mode, w, rate));
                continue;
            }
            for &mode in modes {
                scenarios.push(Acc::new(&format!("{mode}-{w}"), mode, w, rate));
            }
            // The fenced owner that hardly touches its lock, once (for the first workload): its
            // CPU does not answer, so each flag costs a fence; and the same owner polling.
            if modes.contains(&Mode::Fenced) && !scenarios.iter().any(|a| a.every.is_some()) {
                let mut idle = Acc::new(&format!("fenced-idle-{w}"), Mode::Fenced, w, rate);
                idle.every = Some(IDLE_OWNER);
                scenarios.push(idle);
                // The same owner as a poll loop would be (issue 34): between its rare operations
                // it polls its binding, and answers the requester's flags from there.
                let mut polling = Acc::new(&format!("fenced-poll-{w}"), Mode::Fenced, w, rate);
                polling.every = Some(IDLE_OWNER);
                polling.polls = true;
                scenarios.push(polling);
            }
        }
        scenarios
    }
}

/// `--modes`: each of queue, remote and fenced at most once (all three by default).
fn modes(list: Option<&str>) -> Result<Vec<Mode>> {
    Ok(match list {
        Some(list) => {
            let mut modes = Vec::new();
            for m in list.split(',') {
                let mode = crate::drain::parse_mode(m)
                    .map_err(|_| anyhow!("--modes {list}: `{m}` is not queue, remote or fenced"))?;
                if modes.contains(&mode) {
                    return Err(anyhow!(
                        "--modes {list}: `{}` is given twice; give each of queue, remote, \
                         fenced once",
                        m.trim()
                    ));
                }
                modes.push(mode);
            }
            modes
        }
        None => vec![Mode::Queue, Mode::Remote, Mode::Fenced],
    })
}

/// `--workloads`, as asked: each once (the default experiment's mm workloads by default).
fn workloads(args: &RunArgs) -> Result<Vec<WorkloadName>> {
    let asked: Vec<WorkloadName> = match &args.workloads {
        Some(list) => list
            .split(',')
            .map(|w| {
                w.trim()
                    .parse::<WorkloadName>()
                    .map_err(|e| anyhow!("--workloads {list}: {e}"))
            })
            .collect::<Result<_>>()?,
        None => WorkloadName::DEFAULT_EXPERIMENT.to_vec(),
    };
    for (i, w) in asked.iter().enumerate() {
        if asked[..i].contains(w) {
            return Err(anyhow!(
                "--workloads {}: `{w}` is given twice; give each workload once",
                args.workloads.as_deref().unwrap_or_default()
            ));
        }
    }
    Ok(asked)
}

/// Whether every scenario can be traced (root and tracefs); a note says why not.
fn tracing(notes: &mut Vec<String>) -> bool {
    match tracefs::preflight().and_then(|()| tracefs::available()) {
        Ok(()) => true,
        Err(e) => {
            notes.push(format!(
                "no kernel rows and no attribution of the target's interruptions: {e:#}"
            ));
            false
        }
    }
}

/// The workloads with the kernel's own: all five where they can run when no `--workloads` is
/// given (a note for each that cannot), else those asked, each readied by its preflight.
fn with_kernel_rows(
    args: &RunArgs,
    asked: Vec<WorkloadName>,
    tracing: bool,
    notes: &mut Vec<String>,
) -> Result<(Vec<WorkloadName>, BTreeMap<String, crate::kernel::Ready>)> {
    let mut ready: BTreeMap<String, crate::kernel::Ready> = BTreeMap::new();
    let asked: Vec<WorkloadName> = if args.workloads.is_none() && tracing {
        let mut all = asked;
        for k in crate::kernel::KernelDrain::ALL {
            if k == crate::kernel::KernelDrain::Memcg
                && args.isolate
                && crate::isolate::makes_v2_partition()
            {
                notes.push(format!(
                    "no {k} row: {}",
                    crate::isolate::NO_MEMCG_UNDER_PARTITION
                ));
                continue;
            }
            match crate::kernel::preflight(k) {
                Ok(r) => {
                    ready.insert(k.name().to_string(), r);
                    all.push(WorkloadName::Kernel(k));
                }
                Err(e) => notes.push(format!("no {k} row: {e:#}")),
            }
        }
        all
    } else {
        for k in asked.iter().filter_map(|w| w.kernel()) {
            ready.insert(k.name().to_string(), crate::kernel::preflight(k)?);
        }
        asked
    };
    let mut workloads = Vec::new();
    for w in asked {
        if !workloads.contains(&w) {
            workloads.push(w);
        }
    }
    Ok((workloads, ready))
}
