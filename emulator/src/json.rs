//! The JSON results: rt-tests' envelope, the tool's per-thread objects, then our own fields.
//!
//! The layout follows rt-tests' `rt_write_json()` (`src/lib/rt-utils.c`) and the tools'
//! `write_summary_json()` callbacks (`src/oslat/oslat.c`, `src/cyclictest/cyclictest.c`), as
//! Debian's rt-tests 2.4 writes them: the keys `"cmdline:"` and `"rt_test_version:"` carry the
//! colon *inside* the key; `thread` is an object keyed by thread index (`"0"`, `"1"`, ...); a
//! histogram is an object of its non-zero buckets keyed by the bucket's upper edge. A script
//! that reads the real tools' files reads ours; our additions are extra top-level keys, which
//! such scripts ignore. [`Envelope`] also reads the real tools' files back (our fields then
//! take their defaults), so `qpw-emu report` can show both side by side.

use std::fmt;
use std::marker::PhantomData;
use std::path::Path;

use anyhow::{Context, Result};
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::hist::{Histogram, Percentiles};
use crate::load::{LoadReport, RequesterReport};
use crate::rt::SysInfo;

/// The rt-tests version whose output and files we follow: what the real tools print
/// (`oslat V 2.40`) and write in `"rt_test_version:"`, a number scripts compare.
pub const RT_TESTS_VERSION: &str = "2.40";

/// Our own version, written under our own key (`qpw_emu_version`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// rt-tests' common envelope around a tool's body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope<B> {
    /// The format's version (rt-tests writes 1).
    pub file_version: u32,
    /// The command line, as typed.
    #[serde(rename = "cmdline:")]
    pub cmdline: String,
    /// The version of rt-tests whose format the file follows (`2.40`, as the real tools write).
    #[serde(rename = "rt_test_version:")]
    pub rt_test_version: String,
    /// qpw-emu's own version (absent in the real tools' files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qpw_emu_version: Option<String>,
    /// When the run started (`Wed, 02 Dec 2026 17:55:22 +0000`).
    pub start_time: String,
    /// When the results were written.
    pub end_time: String,
    /// The process's exit code.
    pub return_code: i32,
    /// The system the run was on.
    pub sysinfo: SysInfo,
    /// The tool's own part.
    #[serde(flatten)]
    pub body: B,
}

impl<B> Envelope<B> {
    /// The envelope of a run that started at `start_time` and succeeded: it ends now, with
    /// return code 0, on this system.
    pub fn succeeded(start_time: String, body: B) -> Self {
        Self {
            file_version: 1,
            cmdline: cmdline(),
            rt_test_version: RT_TESTS_VERSION.to_string(),
            qpw_emu_version: Some(VERSION.to_string()),
            start_time,
            end_time: crate::rt::rt_timestamp(),
            return_code: 0,
            sysinfo: SysInfo::read(),
            body,
        }
    }
}

/// A whole-microsecond figure or a fractional one: oslat writes integers when its buckets are
/// whole microseconds wide, three decimals otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Micros {
    /// Whole microseconds.
    Whole(u64),
    /// Microseconds with a fraction.
    Frac(f64),
}

impl Micros {
    /// The value as a float.
    pub fn value(self) -> f64 {
        match self {
            Micros::Whole(v) => v as f64,
            Micros::Frac(v) => v,
        }
    }
}

/// The body of an oslat file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OslatBody {
    /// Measured CPUs.
    pub num_threads: usize,
    /// One object per measured CPU, keyed `"0"`, `"1"`, ...
    pub thread: Indexed<OslatThreadJson>,
    /// Our own fields.
    #[serde(flatten)]
    pub qpw: QpwFields,
}

/// oslat's per-thread object.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OslatThreadJson {
    /// The CPU.
    pub cpu: usize,
    /// The counter's frequency in MHz.
    pub freq: u64,
    /// The smallest gap, in microseconds, as oslat rounds it (the upper edge of its 1 us slot).
    pub min: Micros,
    /// The average gap in microseconds, oslat's way: bucket upper edges plus the overflow sum.
    pub avg: f64,
    /// The largest gap, in microseconds, rounded as `min`.
    pub max: Micros,
    /// Seconds measured.
    pub duration: f64,
    /// Non-zero buckets keyed by upper edge in microseconds; the last bucket includes the
    /// overflows.
    pub histogram: Buckets,
}

/// The body of a cyclictest file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CyclictestBody {
    /// Measuring threads.
    pub num_threads: usize,
    /// Timer resolution in ns as cyclictest reports it (0: not measured).
    pub resolution_in_ns: u64,
    /// One object per thread, keyed `"0"`, `"1"`, ...
    pub thread: Indexed<CyclictestThreadJson>,
    /// Our own fields.
    #[serde(flatten)]
    pub qpw: QpwFields,
}

/// cyclictest's per-thread object.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CyclictestThreadJson {
    /// Non-zero 1 us buckets keyed by latency in microseconds (latencies past the histogram are
    /// counted only in `cycles`, as cyclictest does).
    pub histogram: Buckets,
    /// Wake-ups measured.
    pub cycles: u64,
    /// Smallest latency, whole microseconds.
    pub min: u64,
    /// Largest latency, whole microseconds.
    pub max: u64,
    /// Average latency in microseconds.
    pub avg: f64,
    /// The CPU the thread was pinned to.
    pub cpu: usize,
    /// Its NUMA node (-1 when unknown, as cyclictest writes it without libnuma).
    pub node: i64,
}

/// Our fields after the tool's. Every one has a default so that the real tools' files read.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct QpwFields {
    /// Which probe wrote this: `oslat` or `cyclictest` (absent in the real tools' files).
    pub tool: String,
    /// The experiment scenario (`idle`, `queue-lru`, ...), when part of one.
    pub scenario: Option<String>,
    /// The drain mode: `queue` or `remote`; none without a workload.
    pub mode: Option<String>,
    /// The workload the load and the local operations drove.
    pub workload: Option<String>,
    /// The framework instance: its CPUs and each one's mode.
    pub qpw: Option<String>,
    /// The histogram's and run's settings.
    pub settings: Option<Settings>,
    /// Exact figures per measured thread.
    pub percentiles: Vec<ThreadFigures>,
    /// Interruptions of the target, against the idle baseline.
    pub interruptions: Option<Interruptions>,
    /// How often the probe thread was preempted (its involuntary context switches).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_preemptions: Option<ProbePreemptions>,
    /// The requester's drains.
    pub requester: Option<RequesterReport>,
    /// The kernel's RT throttling during the run (with a drain load).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rt_throttling: Option<crate::throttling::RtThrottling>,
    /// With `--isolate`: what was isolated and how, and what stayed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolation: Option<crate::isolate::IsolationReport>,
    /// The process-context load.
    pub load: Option<LoadReport>,
    /// Why the run stopped early, if it did.
    pub stopped_by: Option<String>,
    /// Whether Ctrl-C (SIGINT or SIGTERM) cut the run short: its figures cover less than was
    /// asked for. The real tools write return code 0 then too.
    pub interrupted: bool,
    /// Setup steps that failed, and other things the figures depend on.
    pub warnings: Vec<String>,
    /// With `--trace`: what ran during the long gaps, and the running kernel's mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceFields>,
}

/// The attribution of a traced run (`--trace`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TraceFields {
    /// The running kernel's per-CPU-work mode, isolation and RT throttling.
    pub kernel: crate::kernel::info::KernelInfo,
    /// The trace's own health: clock, events read, events lost.
    pub health: crate::trace::TraceHealth,
    /// Per measured CPU: what each gap at or above the threshold was matched with.
    pub attribution: Vec<crate::trace::GapAttribution>,
    /// Per measured CPU: the work items kworkers ran there, by function.
    pub work: Vec<crate::trace::WorkFigures>,
}

/// How the run measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Settings {
    /// Bucket width in nanoseconds.
    pub bucket_width_ns: u64,
    /// Buckets before the overflow.
    pub bucket_size: usize,
    /// Seconds asked for.
    pub duration_s: f64,
    /// `SCHED_FIFO` priority asked for.
    pub rtprio: Option<i32>,
    /// The probe's local operation period in microseconds, if it did any.
    pub local_op_every_us: Option<f64>,
    /// The cyclictest interval in microseconds.
    pub interval_us: Option<u64>,
}

/// One measured thread's exact figures (microseconds).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ThreadFigures {
    /// The CPU.
    pub cpu: usize,
    /// Samples (gaps or wake-ups).
    pub samples: u64,
    /// p50 ... p99.99 and max; in-range percentiles are bucket upper edges, tail ones exact.
    pub us: Percentiles,
    /// The exact mean.
    pub avg_exact_us: f64,
    /// Samples past the last bucket.
    pub overflow: u64,
    /// Their sum, in microseconds.
    pub overflow_sum_us: f64,
    /// Local operations the probe did on this CPU.
    pub local_ops: u64,
    /// Local operations that failed.
    pub local_op_errors: u64,
    /// The median time of one local operation, in nanoseconds (the owner's cost: the
    /// workload's operation under its CPU's lock, timed by the probe), when it did any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_op_p50_ns: Option<f64>,
}

impl ThreadFigures {
    /// With the median of the local operations' times in `op_time`, if it holds any.
    pub fn with_op_time(mut self, op_time: &Histogram) -> Self {
        self.local_op_p50_ns = (op_time.count() > 0).then(|| op_time.quantile_ns(0.5) as f64);
        self
    }

    /// The figures of `hist`.
    pub fn of(cpu: usize, hist: &Histogram, local_ops: u64, local_op_errors: u64) -> Self {
        Self {
            cpu,
            samples: hist.count(),
            us: hist.percentiles_us(),
            avg_exact_us: hist.mean_ns() / 1000.0,
            overflow: hist.overflow(),
            overflow_sum_us: hist.overflow_sum_ns() as f64 / 1000.0,
            local_ops,
            local_op_errors,
            local_op_p50_ns: None,
        }
    }
}

/// The target's interruptions: gaps at or above a threshold taken from the idle baseline.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Interruptions {
    /// The threshold in microseconds.
    pub threshold_us: f64,
    /// How the threshold was derived.
    pub rule: String,
    /// Gaps at or above it.
    pub count: u64,
    /// Per second measured.
    pub per_second: f64,
    /// The idle baseline's rate, per second (its noise).
    pub baseline_per_second: f64,
    /// Of `count`, the gaps that contained the probe's own local operation: time the
    /// operation took (waiting for its CPU's lock), not time taken from the probe by others.
    pub during_local_op: u64,
    /// Drains that reached the target CPU (queued to it or run under its lock).
    pub drains_reaching_target: u64,
    /// (count - baseline rate x seconds) / drains reaching the target.
    pub excess_per_drain: Option<f64>,
    /// The same figure round by round (`qpw-emu run` interleaves its scenarios in rounds), each
    /// against the idle rate of its own round, the baseline nearest in time; `None` for a round
    /// in which no drain reached the target. Empty outside `qpw-emu run`.
    #[serde(default)]
    pub excess_per_drain_by_round: Vec<Option<f64>>,
    /// The median of `excess_per_drain_by_round`: a burst of the machine's noise that lands in
    /// one round moves it less than it moves the pooled figure.
    #[serde(default)]
    pub excess_per_drain_median: Option<f64>,
    /// The standard error of that median's rounds (their standard deviation over the square
    /// root of their number), with two rounds or more: how far the noise between rounds moves
    /// the figure.
    #[serde(default)]
    pub excess_per_drain_se: Option<f64>,
    /// Gaps at or above other thresholds, per second (`[threshold us, per second]`): how the
    /// count moves with the threshold.
    #[serde(default)]
    pub per_second_at_us: Vec<(f64, f64)>,
}

/// The probe thread's preemptions: its involuntary context switches over the measuring windows.
/// Beside [`Interruptions`] (gaps in the probe's loop) this needs no threshold and no baseline:
/// a vCPU the hypervisor does not run stalls the loop but leaves this counter alone, so in
/// queue mode it reads one to two per drain that reached the target (the worker's wake-up
/// preempts the probe; where the probe gets its CPU back while the worker still holds the lock,
/// it sleeps on it, a voluntary switch) and in remote mode about none.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProbePreemptions {
    /// Involuntary context switches of the probe thread (it was preempted).
    pub count: u64,
    /// Voluntary context switches of the probe thread (it slept: waiting for its CPU's lock
    /// while a drain held it, for instance).
    #[serde(default)]
    pub voluntary: u64,
    /// Drains that reached the target CPU (queued to it or run under its lock).
    pub drains_reaching_target: u64,
    /// `count + voluntary` (every time the probe lost its CPU) / drains reaching the target,
    /// pooled over the whole run.
    pub per_drain: Option<f64>,
    /// The same figure round by round (`qpw-emu run`); `None` for a round in which no drain
    /// reached the target.
    #[serde(default)]
    pub per_drain_by_round: Vec<Option<f64>>,
    /// The median of `per_drain_by_round`.
    #[serde(default)]
    pub per_drain_median: Option<f64>,
}

/// Histogram buckets as rt-tests writes them: an object of count by upper-edge label, in
/// bucket order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Buckets(pub Vec<(String, u64)>);

impl Buckets {
    /// oslat's buckets of `hist`: non-zero ones, keyed by upper edge, the last including the
    /// overflows; labels are whole microseconds when the width is, else three decimals.
    pub fn oslat(hist: &Histogram) -> Self {
        let w = hist.width_ns();
        let last = hist.buckets() - 1;
        let label = |i: usize| {
            let edge = (i as u64 + 1) * w;
            if w.is_multiple_of(1000) {
                (edge / 1000).to_string()
            } else {
                format!("{:.3}", edge as f64 / 1000.0)
            }
        };
        Self(
            hist.counts()
                .iter()
                .enumerate()
                .map(|(i, &c)| (i, if i == last { c + hist.overflow() } else { c }))
                .filter(|&(_, c)| c > 0)
                .map(|(i, c)| (label(i), c))
                .collect(),
        )
    }

    /// cyclictest's buckets of a 1 us histogram: non-zero ones keyed by whole microseconds.
    pub fn cyclictest(hist: &Histogram) -> Self {
        Self(
            hist.counts()
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(i, &c)| (i.to_string(), c))
                .collect(),
        )
    }

    /// The largest bucket key accepted: 1e9 us (a thousand seconds). A key past it, or one
    /// that is not a finite number, is not a latency but a damaged or crafted file.
    pub const MAX_KEY_US: f64 = 1e9;

    /// The buckets as (key in us, count), in increasing key order; an error names the first
    /// key that is not a finite number of microseconds in 0-1e9.
    pub fn points(&self) -> std::result::Result<Vec<(f64, u64)>, String> {
        self.0
            .iter()
            .map(|(k, c)| match k.trim().parse::<f64>() {
                Ok(v) if v.is_finite() && (0.0..=Self::MAX_KEY_US).contains(&v) => Ok((v, *c)),
                _ => Err(format!(
                    "histogram key `{k}` is not a latency: keys must be finite numbers of \
                     microseconds in 0-1e9"
                )),
            })
            .collect()
    }
}

impl Serialize for Buckets {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Buckets {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let mut entries: Vec<(String, u64)> = d.deserialize_map(PairVisitor(PhantomData))?;
        entries.sort_by(|a, b| {
            let (x, y) = (a.0.parse::<f64>(), b.0.parse::<f64>());
            match (x, y) {
                (Ok(x), Ok(y)) => x.total_cmp(&y),
                _ => a.0.cmp(&b.0),
            }
        });
        Ok(Self(entries))
    }
}

/// A list written as an object keyed by index (`"0"`, `"1"`, ...), as rt-tests writes
/// `thread`.
#[derive(Debug, Clone, Default)]
pub struct Indexed<T>(pub Vec<T>);

impl<T: Serialize> Serialize for Indexed<T> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (i, v) in self.0.iter().enumerate() {
            map.serialize_entry(&i.to_string(), v)?;
        }
        map.end()
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Indexed<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let mut entries: Vec<(String, T)> = d.deserialize_map(PairVisitor(PhantomData))?;
        entries.sort_by_key(|(k, _)| k.parse::<usize>().unwrap_or(usize::MAX));
        Ok(Self(entries.into_iter().map(|(_, v)| v).collect()))
    }
}

struct PairVisitor<V>(PhantomData<V>);

impl<'de, V: Deserialize<'de>> Visitor<'de> for PairVisitor<V> {
    type Value = Vec<(String, V)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, V>()? {
            out.push((k, v));
        }
        Ok(out)
    }
}

/// The command line as rt-tests records it: the arguments joined by spaces. An argument that
/// is not UTF-8 (a path is any bytes on Linux) is written with each byte that is not part of
/// valid UTF-8 as `\xNN` (see [`escape_arg`]), where `std::env::args()` panicked, after the
/// run, losing its results.
pub fn cmdline() -> String {
    std::env::args_os()
        .map(|a| escape_arg(&a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `arg` as text: its valid UTF-8 as it is, every other byte as `\xNN`.
pub fn escape_arg(arg: &std::ffi::OsStr) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for chunk in arg.as_encoded_bytes().utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// Writes `value` to the file `path` as pretty JSON.
pub fn write<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))
}

/// Prints `value` on standard output as pretty JSON (`--json -`).
pub fn print<T: Serialize>(value: &T) -> Result<()> {
    println!("{}", pretty(value)?);
    Ok(())
}

/// `value` as pretty JSON.
fn pretty<T: Serialize>(value: &T) -> Result<String> {
    serde_json::to_string_pretty(value).context("cannot serialise the results")
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_argument_that_is_not_utf8_is_escaped_not_a_panic() {
        use std::os::unix::ffi::OsStrExt as _;
        let arg = std::ffi::OsStr::from_bytes(b"/tmp/x\xff\xfe.json");
        assert_eq!(super::escape_arg(arg), "/tmp/x\\xff\\xfe.json");
        assert_eq!(
            super::escape_arg("d\u{e9}j\u{e0}".as_ref()),
            "d\u{e9}j\u{e0}"
        );
    }
}
