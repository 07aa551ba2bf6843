//! What the criterion benches (`bench_main.rs`) and the `ratios` report share: the names of
//! the groups and benchmarks, the sweeps, the quick mode, the seeds' figures, and the reading
//! of criterion's saved estimates into Markdown tables.
//!
//! The benches measure absolute times; every claim in `docs/results.md` is a ratio of two
//! medians measured in one run (STYLE 18), and this crate computes those ratios from
//! `<target>/criterion/<group>/<function>[/<parameter>]/new/estimates.json`, so that the tables
//! are produced from the benches, not typed by hand:
//!
//! ```sh
//! export CARGO_TARGET_DIR=/work/target-bench
//! cargo bench -p qpw-benches --bench bench_main
//! cargo run -p qpw-benches --bin ratios        # prints the tables in Markdown
//! ```

#![warn(missing_docs, unsafe_op_in_unsafe_fn)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The environment variable that selects the quick mode: `QPW_BENCH_QUICK=1` shrinks warm-up,
/// measurement time and sample counts so that the whole suite runs in a few minutes (a smoke
/// check; its medians are noisier).
pub const QUICK_ENV: &str = "QPW_BENCH_QUICK";

/// Whether the quick mode is on (`QPW_BENCH_QUICK` set to anything but empty or `0`).
pub fn is_quick() -> bool {
    std::env::var_os(QUICK_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// How long criterion warms up and measures, and how many samples it takes, for one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// `Criterion::warm_up_time`.
    pub warm_up: Duration,
    /// `Criterion::measurement_time`.
    pub measurement: Duration,
    /// `Criterion::sample_size` (criterion's minimum is 10).
    pub samples: usize,
}

impl Timing {
    /// Nanosecond-scale benches (the local fast path): criterion's own defaults in the full
    /// run.
    pub fn fast_path() -> Self {
        if is_quick() {
            Self::quick()
        } else {
            Self {
                warm_up: Duration::from_secs(2),
                measurement: Duration::from_secs(4),
                samples: 100,
            }
        }
    }

    /// Benches whose one iteration takes microseconds to milliseconds (drains, resctrl passes,
    /// pool runs): fewer samples, each made of whole operations.
    pub fn slow_path() -> Self {
        if is_quick() {
            Self::quick()
        } else {
            Self {
                warm_up: Duration::from_secs(1),
                measurement: Duration::from_secs(4),
                samples: 30,
            }
        }
    }

    fn quick() -> Self {
        Self {
            warm_up: Duration::from_millis(100),
            measurement: Duration::from_millis(300),
            samples: 10,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Names: the benches register under these, the report reads them back.

/// Group of bench 1, the local fast path.
pub const LOCAL: &str = "local";

/// The benchmarks of [`LOCAL`], in report order: (id, what it measures).
pub const LOCAL_IDS: &[(&str, &str)] = &[
    ("tls_cell", "bare thread-local `Cell<u64>` increment (baseline)"),
    (
        "tls_cell_call",
        "the same through a call the compiler may not inline (issue 42)",
    ),
    (
        "atomic_lock",
        "bare uncontended CAS spin word: lock + increment + unlock (baseline)",
    ),
    (
        "atomic_lock_call",
        "the same through a call (issue 42's baseline for the atomic paths)",
    ),
    (
        "floor",
        "the floor (issue 42, `benches/floor.rs`): one hand-written restartable sequence (`cpu_id`, slot, lock word) + increment + release store",
    ),
    (
        "floor_call",
        "the floor through a call (issue 42's baseline for the paths without atomics)",
    ),
    (
        "fair_lock",
        "bare `qpw_core::FairLock` (parking_lot word, `unlock_fair`): lock + increment + unlock",
    ),
    ("sched_getcpu", "`libc::sched_getcpu()`"),
    ("rseq_cpu", "`cpu_id` read from the rseq area (`qpw_core::rseq::current_cpu`)"),
    (
        "rseq_cpu_criterion_iter",
        "the same as `b.iter(|| black_box(..))`: a measurement artefact, see `benches/local.rs`",
    ),
    (
        "rseq_cpu_atomic_lock",
        "the rseq `cpu_id` read picks one of per-CPU bare CAS words: lock + increment + unlock (issue 7's baseline)",
    ),
    (
        "rseq_lock",
        "bare `qpw_core::RseqLock` of the pinned caller's CPU: lock + increment + unlock",
    ),
    ("rseq_lock_call", "the same through a call"),
    (
        "percpu_queue_bound",
        "`PerCpu::lock_local` + increment + unlock, queue mode, thread bound (`Qpw::bind_current`)",
    ),
    (
        "percpu_queue_bound_call",
        "the same through a call (`*state.lock_local()? += 1` in an `#[inline(never)]` function: `tests/owner_path`'s `lock_local?` probe)",
    ),
    (
        "percpu_remote_bound",
        "`PerCpu::lock_local` + increment + unlock, remote mode, thread bound",
    ),
    ("percpu_remote_bound_call", "the same through a call"),
    (
        "percpu_queue_unbound",
        "`PerCpu::lock_local` + increment + unlock, queue mode, unbound thread (CPU from the rseq area, else `sched_getcpu`)",
    ),
    (
        "percpu_remote_unbound",
        "`PerCpu::lock_local` + increment + unlock, remote mode, unbound thread",
    ),
    (
        "percpu_rseq_bound",
        "`PerCpu<_, RseqLock>::lock_local` + increment + unlock (queue mode only), thread bound",
    ),
    ("percpu_rseq_bound_call", "the same through a call"),
    (
        "percpu_rseq_unbound",
        "`PerCpu<_, RseqLock>::lock_local` + increment + unlock (queue mode only), unbound thread",
    ),
    (
        "percpu_owner",
        "owner-only (`OwnedPerCpu`, thread-per-core): `Owner::lock_local` + increment + release",
    ),
    (
        "percpu_remote_fair_bound",
        "`PerCpu<_, FairLock>::lock_local` + increment + unlock, remote mode, thread bound: the lock named, against the default `PwLock`'s choice of it",
    ),
    (
        "percpu_fenced_bound",
        "`PerCpu::lock_local` + increment + unlock, fenced mode (`Policy::Fenced`: a `FencedLock` per slot, issue 15), thread bound",
    ),
    ("percpu_fenced_bound_call", "the same through a call"),
    (
        "percpu_fenced_bound_slot",
        "`BoundSlot::lock` + increment + unlock, fenced mode: the bound thread's slot looked up once (`PerCpu::bound_slot`)",
    ),
    ("percpu_fenced_bound_slot_call", "the same through a call"),
    (
        "percpu_fenced_lock_bound",
        "`PerCpu<_, FencedLock>::lock_local` + increment + unlock, fenced mode with the lock named (`per_cpu_with`), thread bound",
    ),
    (
        "relaxed_load",
        "bare relaxed load of an `AtomicU32` (baseline of `fenced_poll_quiet`)",
    ),
    (
        "fenced_poll_quiet",
        "`Binding::poll` of a fenced CPU nobody calls (issue 34): the owner's loop's look for requesters",
    ),
    (
        "fenced_remote_idle_target",
        "`PerCpu::lock(other CPU)` + increment + unlock in fenced mode: the requester's `CAS` + membarrier fence, none of our threads on the target",
    ),
    (
        "fenced_remote_busy_target",
        "the same with one of our threads spinning on the target, so the fence interrupts it",
    ),
];

/// Issue 7's bounds on the local fast paths, all within [`LOCAL`]: (bench, baseline, the
/// largest ratio the issue accepts, what the baseline is).
pub const FAST_PATH_BOUNDS: &[(&str, &str, f64, &str)] = &[
    (
        "percpu_rseq_unbound",
        "rseq_cpu_atomic_lock",
        1.3,
        "the bare rseq `cpu_id` read + a bare atomic lock of that CPU",
    ),
    ("rseq_lock", "atomic_lock", 1.0, "a bare atomic lock"),
    (
        "percpu_owner",
        "tls_cell",
        1.5,
        "a bare thread-local `Cell` increment",
    ),
    (
        "percpu_fenced_bound",
        "atomic_lock",
        1.0,
        "a bare atomic lock (issue 15: the fenced mode's owner path, default lock)",
    ),
    (
        "percpu_fenced_bound_slot",
        "atomic_lock",
        1.0,
        "a bare atomic lock (issue 15: the fenced mode's owner path, slot looked up once)",
    ),
    (
        "percpu_fenced_lock_bound",
        "atomic_lock",
        1.0,
        "a bare atomic lock (issue 15: the fenced mode's owner path, `FencedLock` named)",
    ),
    (
        "fenced_poll_quiet",
        "relaxed_load",
        1.5,
        "a bare relaxed load (issue 34: the owner's poll when nobody has called)",
    ),
];

/// Issue 42's pairs within [`LOCAL`]: (the path inlined into the loop, the same through a
/// call, what it is, the baseline its call is held to: `floor_call` for the paths without
/// atomics, `atomic_lock_call` for the compare-and-swap paths; none for the baselines).
pub const OWNER_CALLS: &[(&str, &str, &str, Option<&str>)] = &[
    (
        "floor",
        "floor_call",
        "the floor: hand-written sequence",
        None,
    ),
    (
        "tls_cell",
        "tls_cell_call",
        "bare thread-local increment",
        None,
    ),
    (
        "atomic_lock",
        "atomic_lock_call",
        "bare CAS spin word",
        None,
    ),
    (
        "rseq_lock",
        "rseq_lock_call",
        "bare `RseqLock`",
        Some("floor_call"),
    ),
    (
        "percpu_fenced_bound_slot",
        "percpu_fenced_bound_slot_call",
        "fenced, `BoundSlot::lock`",
        Some("floor_call"),
    ),
    (
        "percpu_fenced_bound",
        "percpu_fenced_bound_call",
        "fenced, `lock_local`",
        Some("floor_call"),
    ),
    (
        "percpu_rseq_bound",
        "percpu_rseq_bound_call",
        "queue, `RseqLock` named, `lock_local`",
        Some("floor_call"),
    ),
    (
        "percpu_remote_bound",
        "percpu_remote_bound_call",
        "remote (`FairLock`), `lock_local`",
        Some("atomic_lock_call"),
    ),
    (
        "percpu_queue_bound",
        "percpu_queue_bound_call",
        "queue (`FairLock`), `lock_local`",
        Some("atomic_lock_call"),
    ),
];

/// Issue 42's bound: each owner path through a call within this many times its baseline's
/// call ([`OWNER_CALLS`]).
pub const OWNER_CALL_BOUND: f64 = 2.0;

/// Issue 42's table: every owner path inlined into the loop and through a call, the call as a
/// ratio to the floor's call and to the bare atomic lock's call, and whether it is within
/// [`OWNER_CALL_BOUND`] of its baseline.
pub fn owner_call_table(root: &Path) -> String {
    let get = |id: &str| median_ns(root, LOCAL, id, None);
    let (floor, atomic) = (get("floor_call"), get("atomic_lock_call"));
    let mut table = Table::new(&[
        "path",
        "inlined loop",
        "through a call",
        "call ÷ floor's call",
        "call ÷ atomic lock's call",
        "bound",
        "held",
    ]);
    for &(inlined, call, what, baseline) in OWNER_CALLS {
        let m = get(call);
        let (bound, held) = match baseline {
            None => ("baseline".to_string(), "-".to_string()),
            Some(base) => {
                let held = match (m, get(base)) {
                    (Some(m), Some(b)) if b > 0.0 => {
                        if m / b <= OWNER_CALL_BOUND {
                            "yes"
                        } else {
                            "**no**"
                        }
                    }
                    _ => "not measured",
                };
                (format!("≤ {OWNER_CALL_BOUND}x `{base}`"), held.to_string())
            }
        };
        table.row(&[
            what.to_string(),
            fmt_opt(get(inlined)),
            fmt_opt(m),
            fmt_ratio(m, floor),
            fmt_ratio(m, atomic),
            bound,
            held,
        ]);
    }
    table.finish()
}

/// Issue 7's bounds ([`FAST_PATH_BOUNDS`]) against the medians of one run of [`LOCAL`]:
/// each ratio, the bound, and whether it held. For `percpu_rseq_unbound` a second row
/// divides by the *sum* of the separately measured `rseq_cpu` and `atomic_lock` medians, the
/// looser reading of the issue's "rseq read + atomic lock".
pub fn fast_path_bounds_table(root: &Path) -> String {
    let get = |id: &str| median_ns(root, LOCAL, id, None);
    let mut table = Table::new(&[
        "bench", "median", "baseline", "median", "ratio", "bound", "held",
    ]);
    let mut row = |id: &str, m: Option<f64>, base_name: String, base: Option<f64>, bound: f64| {
        let held = match (m, base) {
            (Some(m), Some(b)) if b > 0.0 => {
                if m / b <= bound {
                    "yes"
                } else {
                    "**no**"
                }
            }
            _ => "not measured",
        };
        table.row(&[
            format!("`{id}`"),
            fmt_opt(m),
            base_name,
            fmt_opt(base),
            fmt_ratio(m, base),
            format!("≤ {bound}x"),
            held.to_string(),
        ]);
    };
    for &(id, base_id, bound, what) in FAST_PATH_BOUNDS {
        let m = get(id);
        row(id, m, format!("`{base_id}` ({what})"), get(base_id), bound);
        if base_id == "rseq_cpu_atomic_lock" {
            let sum = get("rseq_cpu").zip(get("atomic_lock")).map(|(a, b)| a + b);
            row(
                id,
                m,
                "`rseq_cpu` + `atomic_lock` (the sum of the two bare medians)".into(),
                sum,
                bound,
            );
        }
    }
    table.finish()
}

/// Group of bench 2 for a per-CPU counter made with qpw-core only.
pub const DRAIN_COUNTER: &str = "drain_counter";
/// Group of bench 2 for the memcg stock (`drain_all_stock`).
pub const DRAIN_MEMCG: &str = "drain_memcg";
/// Group of bench 2 for the LRU folio batches (`lru_add_drain_all`).
pub const DRAIN_LRU: &str = "drain_lru";

/// The CPU counts of bench 2.
pub const DRAIN_CPUS: [usize; 5] = [1, 2, 8, 32, 128];

/// The kernel's `drain_all_stock` cycles from seed 003 (Leonardo Bras, 2024): (CPUs, queue
/// mode, remote mode). The queue-mode figure counts only scheduling the work on the remote CPU
/// ("Clocks to schedule work on remote CPU (performing not accounted)").
pub const KERNEL_DRAIN_ALL_STOCK: [(usize, u64, u64); 3] = [
    (1, 44_331, 38_978),
    (8, 43_993, 39_027),
    (128, 156_275, 58_054),
];

/// Group of bench 3: one drain of every CPU, with and without every CPU running its local fast
/// path in a loop.
pub const UNDER_LOAD_DRAIN: &str = "under_load_drain";
/// Group of bench 3: the local fast path on one CPU, with and without back-to-back drains from
/// another CPU.
pub const UNDER_LOAD_FAST_PATH: &str = "under_load_fastpath";

/// The parameter of an idle (no load / no drains) measurement in bench 3.
pub const IDLE: &str = "idle";
/// The parameter of a loaded measurement in bench 3.
pub const LOADED: &str = "loaded";

/// The two modes, as the benches name their functions.
pub const MODES: [&str; 2] = ["queue", "remote"];

/// Group of bench 4, resctrl reads.
pub const RESCTRL: &str = "resctrl";
/// The read paths of bench 4, in report order (`qpw_workloads::resctrl::ReadPath` names).
pub const RESCTRL_PATHS: [&str; 4] = ["workqueue", "interrupt", "local", "cached"];
/// Files in one pass over everything (seed 002: 25 groups x 3 events x 10 domains; here
/// 125 groups x 3 events x 2 domains, one per physical CPU).
pub const RESCTRL_ALL_FILES: usize = 750;
/// The environment variable that sets bench 4's load: busy threads on each domain CPU but the
/// reader's (0-16, default 8).
pub const RESCTRL_LOAD_ENV: &str = "QPW_RESCTRL_LOAD";

/// Group of bench 5, the buffer pool.
pub const POOL: &str = "pool";
/// The thread counts of bench 5.
pub const POOL_THREADS: [usize; 4] = [2, 4, 8, 16];

/// Messages per hackbench run in bench 5, whatever the thread count: enough that a run lasts
/// tens of milliseconds, so that starting the threads and the scheduler's noise do not decide
/// it (with 8000, runs of about 8 ms moved by 2x from one sample to the next here).
pub const POOL_MESSAGES: usize = 40000;

/// The hackbench shape for `threads` threads (`groups x fds` senders and as many receivers):
/// (groups, fds, loops), with `loops` chosen so that every run carries [`POOL_MESSAGES`].
///
/// ```
/// assert_eq!(qpw_benches::pool_shape(2), (1, 1, 40000));
/// assert_eq!(qpw_benches::pool_shape(16), (2, 4, 1250));
/// ```
pub fn pool_shape(threads: usize) -> (usize, usize, usize) {
    let pairs = (threads / 2).max(1);
    // At most four senders per group, as the figures' default `fds`.
    let fds = pairs.min(4);
    let groups = pairs.div_ceil(fds);
    let loops = (POOL_MESSAGES / (groups * fds * fds)).max(1);
    (groups, fds, loops)
}

/// Group of bench 5b, the hook alone: AppArmor's get/use/put back to back on every CPU, no
/// system calls between.
pub const POOL_HOOK: &str = "pool_hook";
/// The thread counts of bench 5b (bound round-robin to the CPUs).
pub const POOL_HOOK_THREADS: [usize; 3] = [1, 2, 4];
/// Hook runs per thread in one iteration of bench 5b.
pub const POOL_HOOKS_PER_THREAD: usize = 50_000;

/// The pool designs, as `qpw_workloads::pool::Design::name` spells them, in report order.
pub const POOL_DESIGNS: [&str; 3] = ["global", "percpu-cache", "percpu-pools"];

// ---------------------------------------------------------------------------------------------
// Reading criterion's estimates.

/// Where criterion keeps its results: `$CRITERION_HOME`, else `$CARGO_TARGET_DIR/criterion`,
/// else `target/criterion` or `../target/criterion` (cargo runs benches from the package
/// directory). Criterion itself would ask `cargo metadata` last; set `CARGO_TARGET_DIR` to be
/// sure both agree.
pub fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || {
            // `cargo run` starts us in the package directory; the workspace target is one up.
            let here = PathBuf::from("target");
            if here.is_dir() {
                here
            } else {
                PathBuf::from("../target")
            }
        },
        PathBuf::from,
    );
    target.join("criterion")
}

/// One benchmark's saved median, in nanoseconds per iteration, or `None` if it was not run.
///
/// Reads `"median": { ..., "point_estimate": <f64>, ... }` from `estimates.json` by hand, so
/// that this crate needs no JSON dependency (criterion writes this file with serde; the field
/// names are part of its documented output).
pub fn median_ns(root: &Path, group: &str, function: &str, parameter: Option<&str>) -> Option<f64> {
    let mut path = root.join(group).join(function);
    if let Some(parameter) = parameter {
        path.push(parameter);
    }
    path.push("new");
    path.push("estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    point_estimate(&text, "median")
}

/// The `point_estimate` of the statistic `stat` in criterion's `estimates.json` text.
///
/// ```
/// let json = r#"{"mean":{"point_estimate":2.0},"median":{"confidence_interval":
///     {"confidence_level":0.95,"lower_bound":1.0,"upper_bound":1.5},"point_estimate":1.25}}"#;
/// assert_eq!(qpw_benches::point_estimate(json, "median"), Some(1.25));
/// assert_eq!(qpw_benches::point_estimate(json, "slope"), None);
/// ```
pub fn point_estimate(text: &str, stat: &str) -> Option<f64> {
    let start = text.find(&format!("\"{stat}\""))?;
    let rest = &text[start..];
    let at = rest.find("\"point_estimate\"")? + "\"point_estimate\"".len();
    let rest = rest[at..].trim_start().strip_prefix(':')?.trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

// ---------------------------------------------------------------------------------------------
// The machine.

/// A Markdown list describing the machine: CPU model, CPUs, kernel, virtualisation, glibc,
/// and the load average when the report was made (the machine may be shared).
pub fn machine_description() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        cpuinfo
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split(':').nth(1))
            .map_or_else(|| "unknown".to_string(), |v| v.trim().to_string())
    };
    let processors = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let hypervisor = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|l| l.split_whitespace().any(|f| f == "hypervisor"));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".to_string(), |s| s.trim().to_string());
    let virt = std::process::Command::new("systemd-detect-virt")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "not available".to_string());
    let vendor = std::fs::read_to_string("/sys/class/dmi/id/sys_vendor")
        .map_or_else(|_| "not readable".to_string(), |s| s.trim().to_string());
    let allowed = qpw_core::allowed_cpus().map_or_else(|e| e.to_string(), |s| s.to_string());
    let load = std::fs::read_to_string("/proc/loadavg")
        .map_or_else(|_| "unknown".to_string(), |s| s.trim().to_string());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "- CPU: {} (`cpu MHz` {})",
        field("model name"),
        field("cpu MHz")
    );
    let _ = writeln!(
        out,
        "- CPUs: {processors} online, allowed to the process: {allowed}"
    );
    let _ = writeln!(out, "- kernel: {kernel}");
    let _ = writeln!(
        out,
        "- virtualised: `hypervisor` CPU flag {}; `systemd-detect-virt`: {virt}; DMI sys_vendor: {vendor}",
        if hypervisor { "present (a VM)" } else { "absent" }
    );
    let _ = writeln!(
        out,
        "- CPU read for unbound threads: {}",
        qpw_core::rseq::status()
    );
    let _ = writeln!(
        out,
        "- load average when this report was made (`/proc/loadavg`): {load}"
    );
    out
}

// ---------------------------------------------------------------------------------------------
// Formatting.

/// A duration in nanoseconds, with a unit that keeps three significant figures readable.
pub fn fmt_ns(ns: f64) -> String {
    if ns < 1_000.0 {
        format!("{ns:.2} ns")
    } else if ns < 1_000_000.0 {
        format!("{:.2} µs", ns / 1e3)
    } else if ns < 1_000_000_000.0 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// `a / b` to three significant figures, or `n/a`.
pub fn fmt_ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => fmt_sig3(a / b),
        _ => "n/a".to_string(),
    }
}

/// A positive number to three significant figures (no exponent).
pub fn fmt_sig3(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x > 0.0 {
        // Digits after the point so that three significant ones show.
        let decimals = (2 - x.log10().floor() as i32).max(0) as usize;
        format!("{x:.decimals$}")
    } else {
        format!("{x}")
    }
}

fn fmt_opt(ns: Option<f64>) -> String {
    ns.map_or_else(|| "not measured".to_string(), fmt_ns)
}

/// A Markdown table, built row by row.
#[derive(Debug, Default)]
pub struct Table {
    out: String,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&str]) -> Self {
        let mut out = String::new();
        let _ = writeln!(out, "| {} |", headers.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(headers.len()));
        Self { out }
    }

    /// Adds a row; a `|` inside a cell is escaped so that it does not split the cell.
    pub fn row(&mut self, cells: &[String]) {
        let cells: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
        let _ = writeln!(self.out, "| {} |", cells.join(" | "));
    }

    /// The table's Markdown.
    pub fn finish(self) -> String {
        self.out
    }
}

/// Group of bench 9, the release build's re-entrancy check on the requester's path (issue 31).
pub const REENTRY: &str = "reentry";

/// The pairs of [`REENTRY`]: (bench, its baseline, what they measure).
pub const REENTRY_PAIRS: &[(&str, &str, &str)] = &[
    (
        "lock",
        "lock_unrecorded",
        "`PerCpu::lock` + increment + release of a remote-mode CPU, uncontended, no other guard alive",
    ),
    (
        "lock_one_held",
        "lock_unrecorded_one_held",
        "the same while the thread holds one guard of another state (the check scans one entry)",
    ),
];

/// The table of bench 9: each `lock` against `lock_unrecorded`, the same call without the
/// thread's list of held locks, measured in the same run.
pub fn reentry_table(root: &Path) -> String {
    let get = |id: &str| median_ns(root, REENTRY, id, None);
    let mut table = Table::new(&["bench", "what", "median", "baseline", "median", "ratio"]);
    for &(id, base, what) in REENTRY_PAIRS {
        let (m, b) = (get(id), get(base));
        table.row(&[
            format!("`{id}`"),
            what.to_string(),
            fmt_opt(m),
            format!("`{base}`"),
            fmt_opt(b),
            fmt_ratio(m, b),
        ]);
    }
    table.finish()
}

/// The table of bench 1: every local fast path as a median and as ratios to the two baselines.
pub fn local_table(root: &Path) -> String {
    let get = |id: &str| median_ns(root, LOCAL, id, None);
    let tls = get("tls_cell");
    let atomic = get("atomic_lock");
    let mut table = Table::new(&["bench", "what", "median", "÷ thread-local", "÷ atomic lock"]);
    for &(id, what) in LOCAL_IDS {
        let m = get(id);
        table.row(&[
            format!("`{id}`"),
            what.to_string(),
            fmt_opt(m),
            fmt_ratio(m, tls),
            fmt_ratio(m, atomic),
        ]);
    }
    table.finish()
}

/// A small log-log SVG of bench 2: whole-drain median against the CPU count, queue mode
/// (solid) and remote mode (dashed), one colour per cache. Hand-written, since criterion's own
/// plots need its `plotters` feature.
pub fn drain_svg(root: &Path) -> String {
    const W: f64 = 640.0;
    const H: f64 = 400.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 150.0;
    const TOP: f64 = 20.0;
    const BOTTOM: f64 = 50.0;
    // y from 100 ns to 10 ms, x from 1 to 128 CPUs, both logarithmic.
    let (y_lo, y_hi) = (2.0f64, 7.0f64);
    let x_at = |n: usize| LEFT + (n as f64).log2() / 7.0 * (W - LEFT - RIGHT);
    let y_at = |ns: f64| {
        let v = ns.log10().clamp(y_lo, y_hi);
        TOP + (y_hi - v) / (y_hi - y_lo) * (H - TOP - BOTTOM)
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    for (i, label) in ["100 ns", "1 µs", "10 µs", "100 µs", "1 ms", "10 ms"]
        .iter()
        .enumerate()
    {
        let y = y_at(10f64.powi(2 + i as i32));
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0
        );
    }
    for n in DRAIN_CPUS {
        let x = x_at(n);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{n}</text>"##,
            H - BOTTOM,
            H - BOTTOM + 16.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">CPUs (logical, on 2 cores): whole drain, median</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        H - 12.0
    );
    let series = [
        (DRAIN_COUNTER, "counter", "#1f77b4"),
        (DRAIN_MEMCG, "memcg", "#d62728"),
        (DRAIN_LRU, "lru", "#2ca02c"),
    ];
    let mut legend_y = TOP + 10.0;
    for (group, name, colour) in series {
        for (mode, dash) in [("queue", ""), ("remote", r#" stroke-dasharray="6 4""#)] {
            let points: Vec<String> = DRAIN_CPUS
                .iter()
                .filter_map(|&n| {
                    median_ns(root, group, mode, Some(&n.to_string()))
                        .map(|ns| format!("{:.1},{:.1}", x_at(n), y_at(ns)))
                })
                .collect();
            if points.is_empty() {
                continue;
            }
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{}"/>"#,
                points.join(" ")
            );
            let lx = W - RIGHT + 10.0;
            let _ = writeln!(
                out,
                r#"<line x1="{lx:.1}" y1="{legend_y:.1}" x2="{:.1}" y2="{legend_y:.1}" stroke="{colour}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{name} {mode}</text>"#,
                lx + 24.0,
                lx + 30.0,
                legend_y + 4.0
            );
            legend_y += 18.0;
        }
    }
    let _ = writeln!(out, "</svg>");
    out
}

/// The nominal clock of the first CPU in MHz (`cpu MHz` in `/proc/cpuinfo`), to turn our
/// nanoseconds into rough cycles beside the kernel's cycle counts. In a VM this is the host's
/// nominal frequency, not a measured one: the cycle columns are estimates.
pub fn cpu_mhz() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("cpu MHz"))?
        .split(':')
        .nth(1)?
        .trim()
        .parse()
        .ok()
}

/// The parameter-less function of the drain groups that times only the posting of the work
/// (queue mode, per-CPU counter only): the kernel's queue-side figure counted only that.
pub const QUEUE_SCHEDULE_ONLY: &str = "queue_schedule_only";

/// The table of bench 2 for `group`: queue and remote medians per CPU count, their ratio, and
/// the kernel's `drain_all_stock` figures where the seed has them.
pub fn drain_table(root: &Path, group: &str) -> String {
    let mhz = cpu_mhz();
    let cycles = |ns: Option<f64>| match (ns, mhz) {
        (Some(ns), Some(mhz)) => format!("{:.0}", ns * mhz / 1e3),
        _ => "n/a".to_string(),
    };
    let mut table = Table::new(&[
        "CPUs",
        "queue: whole drain",
        "queue: scheduling only",
        "remote: whole drain",
        "remote / queue (whole)",
        "remote / queue (scheduling only)",
        "≈ cycles queue sched. / remote",
        "kernel queue (sched. only) / remote, cycles",
        "kernel remote / queue",
    ]);
    for n in DRAIN_CPUS {
        let param = n.to_string();
        let queue = median_ns(root, group, "queue", Some(&param));
        let sched = median_ns(root, group, QUEUE_SCHEDULE_ONLY, Some(&param));
        let remote = median_ns(root, group, "remote", Some(&param));
        let kernel = KERNEL_DRAIN_ALL_STOCK.iter().find(|k| k.0 == n);
        let (k, kratio) = match kernel {
            Some(&(_, q, r)) => (
                format!("{q} / {r}"),
                fmt_ratio(Some(r as f64), Some(q as f64)),
            ),
            None => ("-".to_string(), "-".to_string()),
        };
        table.row(&[
            n.to_string(),
            fmt_opt(queue),
            sched.map_or_else(|| "-".to_string(), fmt_ns),
            fmt_opt(remote),
            fmt_ratio(remote, queue),
            if sched.is_some() {
                fmt_ratio(remote, sched)
            } else {
                "-".to_string()
            },
            format!("{} / {}", cycles(sched), cycles(remote)),
            k,
            kratio,
        ]);
    }
    table.finish()
}

/// Fenced mode's drain of the per-CPU counter (issue 15) beside remote and queue mode, from one
/// run of [`DRAIN_COUNTER`]: the requester's price for an owner path with no atomic.
pub fn fenced_drain_table(root: &Path) -> String {
    let mut table = Table::new(&[
        "CPUs",
        "queue",
        "remote",
        "fenced",
        "fenced / remote",
        "queue / fenced",
    ]);
    for n in DRAIN_CPUS {
        let param = n.to_string();
        let get = |f: &str| median_ns(root, DRAIN_COUNTER, f, Some(&param));
        let (queue, remote, fenced) = (get("queue"), get("remote"), get("fenced"));
        table.row(&[
            n.to_string(),
            fmt_opt(queue),
            fmt_opt(remote),
            fmt_opt(fenced),
            fmt_ratio(fenced, remote),
            fmt_ratio(queue, fenced),
        ]);
    }
    table.finish()
}

/// What each CPU adds to a drain between two sizes of the sweep, `(cpus, cost)` each: the
/// difference of the costs over the difference of the CPU counts. A fixed cost that every size
/// pays (the kernel's `drain_all_stock` pays about 37 000 cycles in both modes) cancels out.
///
/// ```
/// // The kernel's remote drain_all_stock, 8 and 128 CPUs: about 159 cycles per CPU.
/// let per_cpu = qpw_benches::per_cpu_cost((8, 39_027.0), (128, 58_054.0)).unwrap();
/// assert_eq!(per_cpu.round(), 159.0);
/// assert_eq!(qpw_benches::per_cpu_cost((8, 1.0), (8, 2.0)), None);
/// ```
pub fn per_cpu_cost(lo: (usize, f64), hi: (usize, f64)) -> Option<f64> {
    (hi.0 > lo.0).then(|| (hi.1 - lo.1) / (hi.0 - lo.0) as f64)
}

/// The sizes between which [`drain_marginal_line`] takes the cost per CPU: the two largest the
/// seed has kernel figures for.
pub const MARGINAL_CPUS: (usize, usize) = (8, 128);

/// FIDELITY 12's trend, under the table of bench 2 for `group`: the kernel's remote/queue
/// ratio falls with the CPU count (0.88 at 8 CPUs, 0.37 at 128) because both modes share a
/// large fixed cost and the remote drain adds far less per CPU than queuing does. This line
/// compares what each CPU adds, ours (in cycles at the VM's nominal clock; the queue side
/// counted as scheduling only where the group measures it, else the whole drain) against the
/// kernel's, and the remote/queue ratio of the two, which is where both ratios head as the CPU
/// count grows.
pub fn drain_marginal_line(root: &Path, group: &str) -> String {
    let (lo, hi) = MARGINAL_CPUS;
    let ours = |function: &str| {
        let at = |n: usize| median_ns(root, group, function, Some(&n.to_string()));
        per_cpu_cost((lo, at(lo)?), (hi, at(hi)?))
    };
    let queue_function =
        if median_ns(root, group, QUEUE_SCHEDULE_ONLY, Some(&hi.to_string())).is_some() {
            QUEUE_SCHEDULE_ONLY
        } else {
            "queue"
        };
    let (queue, remote) = (ours(queue_function), ours("remote"));
    let kernel = |pick: fn(&(usize, u64, u64)) -> u64| {
        let at = |n: usize| {
            KERNEL_DRAIN_ALL_STOCK
                .iter()
                .find(|k| k.0 == n)
                .map(|k| pick(k) as f64)
        };
        per_cpu_cost((lo, at(lo)?), (hi, at(hi)?))
    };
    let (kqueue, kremote) = (kernel(|k| k.1), kernel(|k| k.2));
    let mhz = cpu_mhz();
    let cycles = |ns: Option<f64>| match (ns, mhz) {
        (Some(ns), Some(mhz)) => format!("{:.0}", ns * mhz / 1e3),
        _ => "n/a".to_string(),
    };
    format!(
        "Added per CPU from {lo} to {hi} CPUs: queue ({queue_function}) {} ≈ {} cycles, remote {} \
         ≈ {} cycles, remote / queue {}; kernel `drain_all_stock`: queue (scheduling only) {} \
         cycles, remote {} cycles, remote / queue {}.",
        queue.map_or_else(|| "n/a".to_string(), fmt_ns),
        cycles(queue),
        remote.map_or_else(|| "n/a".to_string(), fmt_ns),
        cycles(remote),
        fmt_ratio(remote, queue),
        kqueue.map_or_else(|| "n/a".to_string(), |c| format!("{c:.0}")),
        kremote.map_or_else(|| "n/a".to_string(), |c| format!("{c:.0}")),
        fmt_ratio(kremote, kqueue),
    )
}

/// The file, beside criterion's estimates of one `under_load_fastpath` benchmark, in which the
/// bench records how many drains the requester completed while the fast path was measured.
pub fn drain_rate_path(root: &Path, function: &str) -> PathBuf {
    root.join(UNDER_LOAD_FAST_PATH)
        .join(function)
        .join(LOADED)
        .join("qpw_drain_rate.txt")
}

/// Reads what [`drain_rate_path`] holds: `<drains> <seconds>`, as drains per second.
pub fn drain_rate(root: &Path, function: &str) -> Option<f64> {
    let text = std::fs::read_to_string(drain_rate_path(root, function)).ok()?;
    let mut words = text.split_whitespace();
    let drains: f64 = words.next()?.parse().ok()?;
    let secs: f64 = words.next()?.parse().ok()?;
    (secs > 0.0).then(|| drains / secs)
}

/// The tables of bench 3: drain time idle versus loaded, and the fast path's slowdown under
/// drains, per mode.
pub fn under_load_tables(root: &Path, targets: &[&str]) -> String {
    let mut out = String::new();
    let mut drain = Table::new(&[
        "cache",
        "mode",
        "drain, CPUs idle",
        "drain, every CPU looping its fast path",
        "loaded / idle",
    ]);
    let mut fast = Table::new(&[
        "cache",
        "mode",
        "fast path, no drains",
        "fast path, back-to-back drains",
        "slowdown",
        "drains completed per second meanwhile",
    ]);
    for target in targets {
        for mode in MODES {
            let f = format!("{target}_{mode}");
            let idle = median_ns(root, UNDER_LOAD_DRAIN, &f, Some(IDLE));
            let loaded = median_ns(root, UNDER_LOAD_DRAIN, &f, Some(LOADED));
            drain.row(&[
                target.to_string(),
                mode.to_string(),
                fmt_opt(idle),
                fmt_opt(loaded),
                fmt_ratio(loaded, idle),
            ]);
            let idle = median_ns(root, UNDER_LOAD_FAST_PATH, &f, Some(IDLE));
            let loaded = median_ns(root, UNDER_LOAD_FAST_PATH, &f, Some(LOADED));
            fast.row(&[
                target.to_string(),
                mode.to_string(),
                fmt_opt(idle),
                fmt_opt(loaded),
                fmt_ratio(loaded, idle),
                drain_rate(root, &f).map_or_else(|| "n/a".to_string(), |r| format!("{r:.0}")),
            ]);
        }
    }
    let _ = writeln!(out, "{}", drain.finish());
    let _ = write!(out, "{}", fast.finish());
    out
}

/// The file, beside criterion's estimates of one resctrl benchmark, in which the bench records
/// how its reads were executed: `worker interrupt direct fallback cached` counts.
pub fn path_counts_path(root: &Path, path: &str, files: usize) -> PathBuf {
    root.join(RESCTRL)
        .join(path)
        .join(files.to_string())
        .join("qpw_path_counts.txt")
}

/// The file, beside criterion's estimates of bench 4, in which the bench records its load:
/// `<busy threads per loaded CPU> <loaded CPUs>`.
pub fn resctrl_load_path(root: &Path) -> PathBuf {
    root.join(RESCTRL).join("qpw_load.txt")
}

/// How the reads of one resctrl benchmark ran, as shares: "worker 100 %" and so on, and the
/// interrupts re-sent to the thread running now, if any.
fn path_counts_cell(root: &Path, path: &str, files: &str) -> String {
    let Ok(files) = files.parse::<usize>() else {
        return "n/a".to_string();
    };
    let Ok(text) = std::fs::read_to_string(path_counts_path(root, path, files)) else {
        return "n/a".to_string();
    };
    let counts: Vec<u64> = text
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    if !(5..=6).contains(&counts.len()) {
        return "n/a".to_string();
    }
    let retargets = counts.get(5).copied().unwrap_or(0);
    // A local-path fallback is counted as a worker run too: show it once.
    let counts = [
        counts[0].saturating_sub(counts[3]),
        counts[1],
        counts[2],
        counts[3],
        counts[4],
    ];
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return "n/a".to_string();
    }
    [
        "worker",
        "interrupt",
        "direct",
        "fallback to worker",
        "cache",
    ]
    .iter()
    .zip(&counts)
    .filter(|(_, &n)| n > 0)
    .map(|(name, &n)| format!("{name} {:.0} %", n as f64 * 100.0 / total as f64))
    .chain((retargets > 0).then(|| format!("{retargets} interrupts re-sent")))
    .collect::<Vec<_>>()
    .join(", ")
}

/// The table of bench 4: per read path, a pass over all files and over the reader's own
/// domain, as medians and as ratios to the workqueue path, and the setup apart.
pub fn resctrl_table(root: &Path) -> String {
    let all = RESCTRL_ALL_FILES.to_string();
    // The reader's own domain holds the files of one domain: find the parameter the bench
    // used (it depends on the number of domains).
    let own = std::fs::read_dir(root.join(RESCTRL).join("workqueue"))
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name != &all && name.parse::<usize>().is_ok())
        .min_by_key(|name| name.parse::<usize>().unwrap_or(usize::MAX))
        .unwrap_or_else(|| "375".to_string());
    let wq_all = median_ns(root, RESCTRL, "workqueue", Some(&all));
    let wq_own = median_ns(root, RESCTRL, "workqueue", Some(&own));
    let mut table = Table::new(&[
        "read path",
        "pass over 750 files",
        "÷ workqueue",
        "workqueue ÷ this",
        "pass over the reader's own domain",
        "÷ workqueue",
        "how the 750 reads ran",
        "how the own-domain reads ran",
    ]);
    for path in RESCTRL_PATHS {
        let a = median_ns(root, RESCTRL, path, Some(&all));
        let o = median_ns(root, RESCTRL, path, Some(&own));
        table.row(&[
            format!("`{path}`"),
            fmt_opt(a),
            fmt_ratio(a, wq_all),
            fmt_ratio(wq_all, a),
            fmt_opt(o),
            fmt_ratio(o, wq_own),
            path_counts_cell(root, path, &all),
            path_counts_cell(root, path, &own),
        ]);
    }
    let open = median_ns(root, RESCTRL, "open", Some(&all));
    table.row(&[
        "setup: opening 750 files, no read".to_string(),
        fmt_opt(open),
        fmt_ratio(open, wq_all),
        "-".to_string(),
        "-".to_string(),
        "-".to_string(),
        "-".to_string(),
        "-".to_string(),
    ]);
    let load = std::fs::read_to_string(resctrl_load_path(root))
        .ok()
        .and_then(|text| {
            let mut words = text.split_whitespace().map(str::parse::<usize>);
            Some((words.next()?.ok()?, words.next()?.ok()?))
        })
        .map_or_else(
            || "Load: not recorded.".to_string(),
            |(per_cpu, cpus)| {
                format!(
                    "Load: {per_cpu} busy threads on each of the {cpus} domain CPUs other than \
                     the reader's (`{RESCTRL_LOAD_ENV}`)."
                )
            },
        );
    format!("{load}\n\n{}", table.finish())
}

/// The file, beside criterion's estimates of one benchmark of `group` (bench 5 or 5b), in
/// which the bench records the pool's counters summed over its runs:
/// `runs contention local_hits remote_returns gets`.
pub fn pool_stats_path(root: &Path, group: &str, design: &str, threads: usize) -> PathBuf {
    root.join(group)
        .join(design)
        .join(threads.to_string())
        .join("qpw_pool_stats.txt")
}

/// The global lock's failed trylocks per run of one benchmark of `group`, from
/// [`pool_stats_path`].
fn contention_per_run_in(root: &Path, group: &str, design: &str, threads: usize) -> Option<f64> {
    let text = std::fs::read_to_string(pool_stats_path(root, group, design, threads)).ok()?;
    let mut words = text.split_whitespace().map(str::parse::<f64>);
    let runs = words.next()?.ok()?;
    let contention = words.next()?.ok()?;
    (runs > 0.0).then(|| contention / runs)
}

/// A table of designs (rows) by thread counts: each benchmark's `work` (messages or hook runs
/// per iteration) per second, as a ratio to the global-lock design at the same thread count,
/// and the global lock's contention per run beside it.
fn pool_rates_table(
    root: &Path,
    group: &str,
    threads: &[usize],
    unit: &str,
    work: impl Fn(usize) -> usize,
) -> String {
    let mut headers = vec!["design".to_string()];
    for t in threads {
        headers.push(format!("{t} threads: {unit}/s"));
        headers.push("÷ global".to_string());
        headers.push("contention / run".to_string());
    }
    let refs: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut table = Table::new(&refs);
    let rate = |design: &str, t: usize| {
        median_ns(root, group, design, Some(&t.to_string())).map(|ns| work(t) as f64 / (ns / 1e9))
    };
    for design in POOL_DESIGNS {
        let mut row = vec![format!("`{design}`")];
        for &t in threads {
            let r = rate(design, t);
            row.push(r.map_or_else(|| "not measured".to_string(), |r| format!("{r:.0}")));
            row.push(fmt_ratio(r, rate(POOL_DESIGNS[0], t)));
            row.push(
                contention_per_run_in(root, group, design, t)
                    .map_or_else(|| "n/a".to_string(), |c| format!("{c:.0}")),
            );
        }
        table.row(&row);
    }
    table.finish()
}

/// The table of bench 5: messages per second per design and thread count, each as a ratio to
/// the global-lock design at the same thread count, with the global lock's contention (failed
/// trylocks on `aa_buffers_lock`) per run beside it.
pub fn pool_table(root: &Path) -> String {
    pool_rates_table(root, POOL, &POOL_THREADS, "msg", |_| POOL_MESSAGES)
}

/// The table of bench 5b: hook runs per second per design and thread count, each as a ratio
/// to the global-lock design, with the global lock's contention per run beside it.
pub fn pool_hook_table(root: &Path) -> String {
    pool_rates_table(root, POOL_HOOK, &POOL_HOOK_THREADS, "hooks", |t| {
        t * POOL_HOOKS_PER_THREAD
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_criterion_estimates() {
        let dir = std::env::temp_dir().join(format!("qpw-benches-{}", std::process::id()));
        let at = dir.join("g").join("f").join("8").join("new");
        std::fs::create_dir_all(&at).expect("temp dir");
        std::fs::write(
            at.join("estimates.json"),
            r#"{"mean":{"confidence_interval":{"confidence_level":0.95,"lower_bound":9.0,"upper_bound":11.0},"point_estimate":10.0,"standard_error":0.5},"median":{"confidence_interval":{"confidence_level":0.95,"lower_bound":7.0,"upper_bound":8.0},"point_estimate":7.5e3,"standard_error":0.1}}"#,
        )
        .expect("write");
        assert_eq!(median_ns(&dir, "g", "f", Some("8")), Some(7500.0));
        assert_eq!(median_ns(&dir, "g", "f", Some("9")), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_marginal_line_compares_costs_per_cpu_with_the_kernel() {
        let dir = std::env::temp_dir().join(format!("qpw-benches-marginal-{}", std::process::id()));
        let put = |function: &str, cpus: usize, ns: f64| {
            let at = dir
                .join("g")
                .join(function)
                .join(cpus.to_string())
                .join("new");
            std::fs::create_dir_all(&at).expect("temp dir");
            let json = format!(r#"{{"median":{{"point_estimate":{ns}}}}}"#);
            std::fs::write(at.join("estimates.json"), json).expect("write");
        };
        // Queue adds 1000 ns per CPU, remote 10 ns: ratio 0.01.
        put("queue", 8, 8_000.0);
        put("queue", 128, 128_000.0);
        put("remote", 8, 500.0);
        put("remote", 128, 1_700.0);
        let line = drain_marginal_line(&dir, "g");
        assert!(line.contains("queue (queue) 1.00 µs"), "{line}");
        assert!(line.contains("remote 10.00 ns"), "{line}");
        assert!(line.contains("remote / queue 0.0100;"), "{line}");
        // The kernel's: (156275 - 43993) / 120 and (58054 - 39027) / 120 cycles.
        assert!(
            line.contains(
                "queue (scheduling only) 936 cycles, remote 159 cycles, remote / queue 0.169."
            ),
            "{line}"
        );
        // With a scheduling-only figure, that is the queue side.
        put(QUEUE_SCHEDULE_ONLY, 8, 800.0);
        put(QUEUE_SCHEDULE_ONLY, 128, 12_800.0);
        let line = drain_marginal_line(&dir, "g");
        assert!(
            line.contains("queue (queue_schedule_only) 100.00 ns"),
            "{line}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ratios_and_units() {
        assert_eq!(fmt_ratio(Some(3.0), Some(2.0)), "1.50");
        assert_eq!(fmt_ratio(Some(300.0), Some(2.0)), "150");
        assert_eq!(fmt_ratio(None, Some(2.0)), "n/a");
        assert_eq!(fmt_ratio(Some(1.0), Some(97.0)), "0.0103");
        assert_eq!(fmt_ratio(Some(25.0), Some(2.0)), "12.5");
        assert_eq!(fmt_ns(1500.0), "1.50 µs");
        assert_eq!(fmt_ns(2.5e6), "2.50 ms");
    }
}
