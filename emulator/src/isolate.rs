//! `--isolate`: the measured CPUs isolated at run time, without a reboot, and put back as they
//! were on every way out.
//!
//! Boot isolation (`isolcpus=`, `nohz_full=`) is what real-time users deploy, but it needs a
//! reboot. What can be done at run time, and what this module does (the steps of `tuna
//! isolate`, `cset shield` and tuned's cpu-partitioning profile):
//!
//! 1. **Tasks.** Every thread of every other process whose affinity includes a measured CPU
//!    gets that CPU taken out of its mask (`sched_setaffinity`); the masks are saved and
//!    written back at the end, also for threads those processes started during the run.
//!    Per-CPU kernel threads (`ksoftirqd/N`, `kworker/N:*`, `migration/N`...) refuse, as they
//!    must: they are listed as what stayed. A thread whose owner pinned it to the measured
//!    CPUs only is left where its owner put it, and listed too.
//! 2. **Unbound workqueues.** `/sys/devices/virtual/workqueue/cpumask` is set to the other
//!    CPUs, so unbound kworkers no longer run there. Per-CPU work (`queue_work_on`), the thing
//!    this project is about, is not affected: that is the point of the measurement.
//! 3. **Interrupts.** Each `/proc/irq/N/smp_affinity_list` that includes a measured CPU loses
//!    it (the housekeeping CPUs, when it had no other), and so does
//!    `/proc/irq/default_smp_affinity`; interrupts that refuse (per-CPU and managed ones) are
//!    listed.
//! 4. **Scheduler domains.** On cgroup v1 (as `cset shield` does): the root cpuset stops
//!    balancing (`cpuset.sched_load_balance = 0`) and a child cpuset of the housekeeping CPUs,
//!    which holds no task, keeps balancing them, so the measured CPU is in no domain: the
//!    load balancer no longer pulls to or pushes from it. On cgroup v2: an isolated cpuset
//!    partition, threaded, which the probe's threads join ([`partition`] says how and why);
//!    the kernel then also counts the CPU as isolated (`cpu_is_isolated()` from 6.8, which
//!    mainline's memcg drain checks).
//!
//! None of this is boot isolation: the tick still runs (no `nohz_full`), RCU callbacks are not
//! offloaded, and the kernel's own per-CPU work still reaches the CPU (before 6.8 even with a
//! v2 partition). Which of it does is
//! what the kernel rows of the default run then show.
//!
//! Restoring: [`Isolation`]'s `Drop` (a normal end, an error, the first Ctrl-C, a panic) and a
//! [`crate::signals::on_forced_exit`] hook (a second Ctrl-C) put everything back, once. What
//! was changed is also written to a state file (`/run/qpw-emu/isolation-<pid>.json`) before
//! the first change, so that a run killed with SIGKILL is undone by the next `--isolate` run
//! ([`recover_stale`]), which says so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use qpw_core::CpuSet;
use serde::{Deserialize, Serialize};

use crate::rt::Warnings;
use crate::trace::tracefs::cpumask_hex;

pub mod partition;

/// The unbound workqueues' CPU mask.
pub const WQ_CPUMASK: &str = "/sys/devices/virtual/workqueue/cpumask";
/// Where the interrupts' affinities are.
pub const PROC_IRQ: &str = "/proc/irq";
/// Where a run keeps what it changed, for the next run to undo if it was killed.
pub const STATE_DIR: &str = "/run/qpw-emu";

/// What was isolated and how, and what could not be moved: the text report and the JSON's
/// `isolation` object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IsolationReport {
    /// The isolated CPUs.
    pub cpus: String,
    /// Where everything else was put.
    pub housekeeping: String,
    /// The steps taken, one line each.
    pub steps: Vec<String>,
    /// Threads of other processes moved off the CPUs.
    pub tasks_moved: usize,
    /// Threads that stayed, `tid comm: why` (per-CPU kernel threads, threads pinned there).
    pub tasks_stayed: Vec<String>,
    /// Interrupts moved off the CPUs.
    pub irqs_moved: Vec<u32>,
    /// Interrupts that refused, `irq: error`.
    pub irqs_stayed: Vec<String>,
    /// Whether the kernel itself counts the CPUs as isolated now (`cpu_is_isolated()`): only
    /// boot isolation and cgroup v2 isolated partitions make it so.
    pub kernel_sees_isolated: bool,
    /// Runs killed before they could restore, undone at this start.
    pub recovered: Vec<String>,
}

impl IsolationReport {
    /// Says the report's lines on stderr (the text output), unless `quiet`.
    pub fn say(&self, quiet: bool) {
        if !quiet {
            for l in self.lines() {
                eprintln!("qpw-emu: {l}");
            }
        }
    }

    /// The text output's lines.
    pub fn lines(&self) -> Vec<String> {
        let mut l = vec![format!(
            "isolation: cpu {} isolated at run time (everything movable on {}): {}",
            self.cpus,
            self.housekeeping,
            self.steps.join("; ")
        )];
        let stayed = |what: &[String]| {
            let mut s = what.iter().take(12).cloned().collect::<Vec<_>>().join(", ");
            if what.len() > 12 {
                s.push_str(&format!(", and {} more", what.len() - 12));
            }
            s
        };
        if !self.tasks_stayed.is_empty() {
            l.push(format!(
                "isolation: {} thread(s) stayed on cpu {}: {}",
                self.tasks_stayed.len(),
                self.cpus,
                stayed(&self.tasks_stayed)
            ));
        }
        if !self.irqs_stayed.is_empty() {
            l.push(format!(
                "isolation: {} interrupt(s) refused to move: {}",
                self.irqs_stayed.len(),
                stayed(&self.irqs_stayed)
            ));
        }
        l.push(if self.kernel_sees_isolated {
            format!(
                "isolation: the kernel lists cpu {} as isolated (isolcpus, nohz_full or an \
                 isolated cgroup v2 partition; cpu_is_isolated() counts a partition from Linux \
                 6.8, and mainline's memcg drain then skips it: the kernel rows show what this \
                 kernel does)",
                self.cpus
            )
        } else {
            format!(
                "isolation: the kernel does not count cpu {} as isolated (cpu_is_isolated()): \
                 only boot isolation or a cgroup v2 isolated partition makes it so, so every \
                 per-CPU drain of the kernel (memcg's included) still reaches it",
                self.cpus
            )
        });
        for r in &self.recovered {
            l.push(format!("isolation: {r}"));
        }
        l
    }
}

/// One thread's affinity, as found and as set.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SavedTask {
    tid: i32,
    tgid: i32,
    before: Vec<usize>,
    set: Vec<usize>,
}

/// One file's content before the run (a workqueue mask, an interrupt's affinity, a cpuset
/// setting).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SavedFile {
    path: PathBuf,
    content: String,
    /// Written just before `content` when put back: an interrupt's old effective CPUs, so that
    /// the kernel, which keeps an interrupt's current CPU when the new mask has it, delivers it
    /// where it did before.
    #[serde(default)]
    first: Option<String>,
}

/// Everything the run changed, in the order it changed it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Saved {
    pid: u32,
    /// When the isolation began, in clock ticks since boot (as `/proc/<pid>/stat`'s start
    /// times): only threads started since then inherited a narrowed mask.
    #[serde(default)]
    began_ticks: u64,
    tasks: Vec<SavedTask>,
    files: Vec<SavedFile>,
    /// Directories the run made (a cpuset), removed after the files are written back.
    dirs: Vec<PathBuf>,
    /// The cgroup v2 isolated partition, if one was made: undone first.
    #[serde(default)]
    partition: Option<partition::SavedPartition>,
}

/// The measured CPUs isolated until dropped.
#[derive(Debug)]
#[must_use = "the CPUs are put back when the guard is dropped"]
pub struct Isolation {
    saved: Arc<Mutex<Option<Saved>>>,
    state_file: Option<PathBuf>,
    /// What was done.
    pub report: IsolationReport,
}

/// Refuses `--isolate` without root, naming what it would change.
pub fn check_root() -> Result<()> {
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        bail!(
            "--isolate needs root: it changes other processes' CPU affinities \
             (sched_setaffinity), {WQ_CPUMASK}, {PROC_IRQ}/*/smp_affinity_list and the cpuset \
             hierarchy (running as uid {euid}); leave the flag out, or run as root"
        );
    }
    Ok(())
}

impl Isolation {
    /// Isolates `cpus`, moving what can be moved to `housekeeping`. Refused without root.
    /// A failure part-way puts back what was done before it returns.
    pub fn apply(cpus: &CpuSet, housekeeping: &CpuSet) -> Result<Self> {
        check_root()?;
        if cpus.is_empty() || housekeeping.is_empty() {
            bail!("--isolate needs a measured CPU and at least one other CPU to move things to");
        }
        let report = IsolationReport {
            cpus: cpus.to_string(),
            housekeeping: housekeeping.to_string(),
            ..IsolationReport::default()
        };
        let state_file = state_file_for(std::process::id());
        let saved = Arc::new(Mutex::new(Some(Saved {
            pid: std::process::id(),
            began_ticks: now_ticks(),
            ..Saved::default()
        })));
        // A second Ctrl-C ends the process without `Drop`: the hook puts back whatever is
        // recorded by then (it waits for `apply` to finish recording, as both hold the lock).
        let hook_saved = saved.clone();
        let hook_file = state_file.clone();
        crate::signals::on_forced_exit(Box::new(move || {
            restore(&hook_saved, hook_file.as_deref());
        }));
        let mut me = Self {
            saved,
            state_file,
            report,
        };
        let done = {
            let mut guard = me.saved.lock().unwrap_or_else(|e| e.into_inner());
            let s = guard.get_or_insert_with(Saved::default);
            isolate(cpus, housekeeping, s, &mut me.report, &me.state_file)
        };
        // On failure, dropping `me` puts back what was done.
        done.map(|()| me)
    }
}

impl Drop for Isolation {
    fn drop(&mut self) {
        restore(&self.saved, self.state_file.as_deref());
    }
}

/// The state file of process `pid`, when the state directory can be made.
fn state_file_for(pid: u32) -> Option<PathBuf> {
    std::fs::create_dir_all(STATE_DIR).ok()?;
    Some(Path::new(STATE_DIR).join(format!("isolation-{pid}.json")))
}

/// Writes what has been changed so far, so that a killed run can be undone.
fn persist(s: &Saved, file: &Option<PathBuf>) {
    if let Some(f) = file {
        if let (Some(dir), Ok(text)) = (f.parent(), serde_json::to_string(s)) {
            // Made again if a recovery removed it meanwhile.
            let _ = std::fs::create_dir_all(dir);
            // Written aside and renamed over: a SIGKILL during a plain write left an empty
            // file, and the next run could undo nothing (seen in the root test).
            let aside = f.with_extension("json.tmp");
            if std::fs::write(&aside, text).is_ok() {
                let _ = std::fs::rename(&aside, f);
            }
        }
    }
}

fn isolate(
    cpus: &CpuSet,
    housekeeping: &CpuSet,
    s: &mut Saved,
    report: &mut IsolationReport,
    state_file: &Option<PathBuf>,
) -> Result<()> {
    recover_stale();
    report.recovered = std::mem::take(&mut *RECOVERED.lock().unwrap_or_else(|e| e.into_inner()));
    let me = std::process::id() as i32;

    // 1. Tasks. In passes: a thread that a process not yet moved starts during a pass has the
    // old mask and is not in that pass's list; the next pass finds it (a moved process's new
    // threads inherit the narrowed mask), until a pass moves nothing.
    let mut moved = 0;
    let mut handled = std::collections::HashSet::new();
    for _pass in 0..5 {
        let moved_before = moved;
        for (tgid, tid) in all_threads() {
            if tgid == me || !handled.insert(tid) {
                continue;
            }
            let Ok(before) = get_affinity(tid) else {
                continue; // gone
            };
            if before.intersection(cpus).is_empty() {
                continue;
            }
            let after = before.difference(cpus);
            if after.is_empty() {
                let why = if task_flags(tgid) & PF_KTHREAD != 0 {
                    "per-CPU kernel thread"
                } else {
                    "pinned there by its owner, left"
                };
                report
                    .tasks_stayed
                    .push(format!("{tid} {}: {why}", comm(tgid, tid)));
                continue;
            }
            // Recorded before the change, so that a kill between the two still restores it.
            s.tasks.push(SavedTask {
                tid,
                tgid,
                before: before.iter().collect(),
                set: after.iter().collect(),
            });
            persist(s, state_file);
            match set_affinity(tid, &after) {
                Ok(()) => moved += 1,
                Err(e) => {
                    s.tasks.pop();
                    if e.raw_os_error() == Some(libc::ESRCH) {
                        continue;
                    }
                    let why = if task_flags(tgid) & PF_NO_SETAFFINITY != 0 {
                        "kernel thread that takes no affinity from userspace"
                    } else {
                        "refused"
                    };
                    report
                        .tasks_stayed
                        .push(format!("{tid} {}: {why} ({e})", comm(tgid, tid)));
                }
            }
        }
        if moved == moved_before {
            break;
        }
    }
    persist(s, state_file);
    report.tasks_moved = moved;
    report.steps.push(format!(
        "{moved} thread(s) of other processes moved off (sched_setaffinity)"
    ));

    // 2. Unbound workqueues.
    let wq = Path::new(WQ_CPUMASK);
    match std::fs::read_to_string(wq) {
        Ok(old) => {
            let new = off(
                &parse_hex_mask(&old).unwrap_or_default(),
                cpus,
                housekeeping,
            );
            match change_file(s, state_file, wq, &old, None, &cpumask_hex(&new)) {
                Ok(()) => report.steps.push(format!(
                    "unbound workqueues on {new} ({WQ_CPUMASK} was {})",
                    old.trim()
                )),
                Err(e) => report
                    .steps
                    .push(format!("unbound workqueues not moved: {WQ_CPUMASK}: {e}")),
            }
        }
        Err(e) => report
            .steps
            .push(format!("unbound workqueues not moved: {WQ_CPUMASK}: {e}")),
    }

    // 3. Interrupts.
    let mut irqs_elsewhere = 0;
    for (irq, path) in irq_affinity_files() {
        let Ok(old) = std::fs::read_to_string(&path) else {
            continue;
        };
        let Ok(old_set) = CpuSet::parse(old.trim()) else {
            continue;
        };
        if old_set.intersection(cpus).is_empty() {
            continue;
        }
        // Where the kernel delivers it now: an interrupt already delivered elsewhere is left
        // alone (moving it and back could leave it, and its thread, on another CPU).
        let effective = std::fs::read_to_string(path.with_file_name("effective_affinity_list"))
            .ok()
            .map(|e| e.trim().to_string());
        let eff_set = effective.as_deref().and_then(|e| CpuSet::parse(e).ok());
        if eff_set
            .as_ref()
            .is_some_and(|e| !e.is_empty() && e.intersection(cpus).is_empty())
        {
            irqs_elsewhere += 1;
            continue;
        }
        let new = off(&old_set, cpus, housekeeping).to_string();
        let first = effective.filter(|_| eff_set.is_some_and(|e| !e.is_empty()));
        match change_file(s, state_file, &path, &old, first, &new) {
            Ok(()) => report.irqs_moved.push(irq),
            Err(e) => report.irqs_stayed.push(format!("{irq}: {e}")),
        }
    }
    let default_irq = Path::new(PROC_IRQ).join("default_smp_affinity");
    if let Ok(old) = std::fs::read_to_string(&default_irq) {
        if let Some(old_set) = parse_hex_mask(&old) {
            let new = old_set.difference(cpus);
            if !new.is_empty() && new != old_set {
                let _ = change_file(s, state_file, &default_irq, &old, None, &cpumask_hex(&new));
            }
        }
    }
    report.steps.push(format!(
        "{} interrupt(s) moved off ({PROC_IRQ}/*/smp_affinity_list, default_smp_affinity), \
         {irqs_elsewhere} allowed there but delivered elsewhere left alone",
        report.irqs_moved.len()
    ));

    // 4. Scheduler domains.
    match Cgroups::find() {
        Cgroups {
            v1_cpuset: Some(root),
            ..
        } => {
            report
                .steps
                .push(shield_v1(&root, cpus, housekeeping, s, state_file)?);
        }
        Cgroups {
            v2_cpuset: Some(root),
            ..
        } => report
            .steps
            .push(match partition::make(&root, cpus, s, state_file) {
                Ok(step) => step,
                Err(e) => format!("scheduler domains unchanged: no cgroup v2 partition: {e:#}"),
            }),
        _ => report
            .steps
            .push("scheduler domains unchanged: no cpuset controller mounted".to_string()),
    }
    persist(s, state_file);
    report.kernel_sees_isolated = qpw_core::Topology::read()
        .map(|t| cpus.is_subset(&t.isolated_or_nohz_full()))
        .unwrap_or(false);
    Ok(())
}

/// `set` without `cpus`, or the housekeeping CPUs when nothing else is left.
fn off(set: &CpuSet, cpus: &CpuSet, housekeeping: &CpuSet) -> CpuSet {
    let rest = set.difference(cpus);
    if rest.is_empty() {
        housekeeping.clone()
    } else {
        rest
    }
}

/// Writes `new` to `path`, whose content was `old`, after recording (and persisting) how to
/// put it back; the record is dropped when the write fails.
fn change_file(
    s: &mut Saved,
    state_file: &Option<PathBuf>,
    path: &Path,
    old: &str,
    first: Option<String>,
    new: &str,
) -> std::io::Result<()> {
    s.files.push(SavedFile {
        path: path.to_path_buf(),
        content: old.trim().to_string(),
        first,
    });
    persist(s, state_file);
    std::fs::write(path, new).inspect_err(|_| {
        s.files.pop();
    })
}

/// The cgroup hierarchies that have the cpuset controller.
struct Cgroups {
    v1_cpuset: Option<V1Cpuset>,
    /// The cgroup v2 root, where it has the cpuset controller.
    v2_cpuset: Option<PathBuf>,
}

/// A cgroup v1 cpuset hierarchy: where it is mounted, and its files' prefix (`cpuset.`, or
/// none when mounted with `noprefix`).
#[derive(Debug, Clone)]
struct V1Cpuset {
    root: PathBuf,
    prefix: &'static str,
}

impl V1Cpuset {
    fn file(&self, dir: &Path, name: &str) -> PathBuf {
        dir.join(format!("{}{name}", self.prefix))
    }
}

impl Cgroups {
    fn find() -> Self {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let mut v1_cpuset = None;
        for line in mounts.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [_, dir, kind, opts, ..] = f[..] else {
                continue;
            };
            if kind == "cgroup" && opts.split(',').any(|o| o == "cpuset") && v1_cpuset.is_none() {
                let noprefix = opts.split(',').any(|o| o == "noprefix");
                v1_cpuset = Some(V1Cpuset {
                    root: PathBuf::from(dir),
                    prefix: if noprefix { "" } else { "cpuset." },
                });
            }
        }
        Self {
            v1_cpuset,
            v2_cpuset: partition::v2_root(&mounts),
        }
    }
}

/// Whether `--isolate` here makes a cgroup v2 isolated partition (cgroup v2 has the cpuset
/// controller and no v1 cpuset hierarchy is mounted), and so holds the measured CPUs for our
/// own process's threads alone.
pub fn makes_v2_partition() -> bool {
    matches!(
        Cgroups::find(),
        Cgroups {
            v1_cpuset: None,
            v2_cpuset: Some(_)
        }
    )
}

/// Why kernel-memcg cannot run under a cgroup v2 partition.
pub const NO_MEMCG_UNDER_PARTITION: &str = "under --isolate's cgroup v2 partition the measured \
     CPU takes threads of this process only, and kernel-memcg's filler must sit in a memory \
     cgroup of its own, so it cannot reach the CPU to fill its stock (boot isolation, without \
     --isolate, has no such limit)";

/// The v1 shield's scheduler-domain part: the root stops balancing, a task-less child cpuset
/// of the housekeeping CPUs keeps balancing them.
fn shield_v1(
    v1: &V1Cpuset,
    cpus: &CpuSet,
    housekeeping: &CpuSet,
    s: &mut Saved,
    state_file: &Option<PathBuf>,
) -> Result<String> {
    let root = &v1.root;
    let balance = v1.file(root, "sched_load_balance");
    let old = std::fs::read_to_string(&balance)
        .with_context(|| format!("cannot read {}", balance.display()))?;
    let child = root.join(format!("qpw-emu-housekeeping-{}", std::process::id()));
    let mems = std::fs::read_to_string(v1.file(root, "mems"))
        .with_context(|| format!("cannot read {}", v1.file(root, "mems").display()))?;
    s.dirs.push(child.clone());
    persist(s, state_file);
    std::fs::create_dir(&child).with_context(|| format!("cannot create {}", child.display()))?;
    let write = |name: &str, value: &str| -> Result<()> {
        let f = v1.file(&child, name);
        std::fs::write(&f, value)
            .with_context(|| format!("cannot write {value:?} to {}", f.display()))
    };
    write("cpus", &housekeeping.to_string())?;
    write("mems", mems.trim())?;
    write("sched_load_balance", "1")?;
    change_file(s, state_file, &balance, &old, None, "0")
        .with_context(|| format!("cannot write 0 to {}", balance.display()))?;
    // Other cpusets that balance over the measured CPUs keep them in a domain: say so.
    let mut others = Vec::new();
    if let Ok(dir) = std::fs::read_dir(root) {
        for e in dir.flatten() {
            let p = e.path();
            if !p.is_dir() || p == child {
                continue;
            }
            let balances = std::fs::read_to_string(v1.file(&p, "sched_load_balance"))
                .is_ok_and(|b| b.trim() == "1");
            let theirs = std::fs::read_to_string(v1.file(&p, "cpus"))
                .ok()
                .and_then(|c| CpuSet::parse(c.trim()).ok())
                .unwrap_or_default();
            if balances && !theirs.intersection(cpus).is_empty() {
                others.push(p.display().to_string());
            }
        }
    }
    let mut step = format!(
        "scheduler domains: cgroup v1 shield ({} = 0, {} balances {housekeeping})",
        balance.display(),
        child.display()
    );
    if !others.is_empty() {
        step.push_str(&format!(
            "; but {} still balance(s) over cpu {cpus}",
            others.join(", ")
        ));
    }
    Ok(step)
}

/// Puts back what `saved` records, once (later calls find nothing), in the reverse order of
/// the changes, and removes the state file.
fn restore(saved: &Mutex<Option<Saved>>, state_file: Option<&Path>) {
    let Some(s) = saved.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return;
    };
    let problems = undo(&s);
    for p in &problems {
        eprintln!("error: --isolate could not put back {p}: do it by hand");
    }
    if let Some(f) = state_file {
        if problems.is_empty() {
            let _ = std::fs::remove_file(f);
            // The directory too, unless another run's file is in it.
            let _ = std::fs::remove_dir(STATE_DIR);
        } else {
            eprintln!(
                "error: what --isolate changed is recorded in {}",
                f.display()
            );
        }
    }
}

/// Undoes `s`; returns what could not be undone.
fn undo(s: &Saved) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(p) = &s.partition {
        problems.extend(partition::undo(p));
    }
    for f in s.files.iter().rev() {
        if let Some(first) = &f.first {
            // An interrupt that is still moving refuses a new mask for a moment (EBUSY); and
            // an interrupt's move may wait for its next delivery (an IO-APIC's does): give it
            // a moment to land on its old CPU before the wider mask, which keeps it there.
            let _ = write_retrying(&f.path, first);
            let effective = f.path.with_file_name("effective_affinity_list");
            for _ in 0..40 {
                match std::fs::read_to_string(&effective) {
                    Ok(e) if e.trim() != first.trim() => {
                        std::thread::sleep(std::time::Duration::from_millis(5))
                    }
                    _ => break,
                }
            }
        }
        if let Err(e) = write_retrying(&f.path, &f.content) {
            // What matters is that the file reads as it did.
            let now = std::fs::read_to_string(&f.path).unwrap_or_default();
            if now.trim() != f.content.trim() {
                problems.push(format!("{} = {} ({e})", f.path.display(), f.content));
            }
        }
    }
    for d in s.dirs.iter().rev() {
        if d.exists() {
            if let Err(e) = std::fs::remove_dir(d) {
                problems.push(format!("the removal of {} ({e})", d.display()));
            }
        }
    }
    // The threads: each as found. Threads and processes started meanwhile by a moved process
    // inherited the narrowed mask, so a thread of such a process (or of its child, e.g. the
    // next run started from a shell a killed run had moved) that still has exactly it gets
    // the mask its process's (or parent's) first saved thread had.
    let mut by_tgid: BTreeMap<i32, &SavedTask> = BTreeMap::new();
    let mut known = std::collections::BTreeSet::new();
    for t in &s.tasks {
        by_tgid.entry(t.tgid).or_insert(t);
        known.insert(t.tid);
        let before = CpuSet::from_iter(t.before.iter().copied());
        match set_affinity(t.tid, &before) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => problems.push(format!("thread {}'s affinity {before} ({e})", t.tid)),
        }
    }
    for (tgid, tid) in all_threads() {
        if known.contains(&tid) || task_flags(tgid) & PF_KTHREAD != 0 {
            continue; // restored above, or a kernel thread, whose affinity is the kernel's
        }
        // Its own process's first saved thread, or its nearest saved ancestor's: a command
        // started from a moved shell runs under subshells, `timeout` or `sudo` that started
        // during the isolation too.
        let Some(first) = by_tgid
            .get(&tgid)
            .or_else(|| ancestors(tgid).find_map(|p| by_tgid.get(&p)))
        else {
            continue;
        };
        // Only a thread started during the isolation inherited its narrowed mask.
        if thread_start(tgid, tid).is_none_or(|t| t < s.began_ticks) {
            continue;
        }
        let set = CpuSet::from_iter(first.set.iter().copied());
        if get_affinity(tid).is_ok_and(|now| now == set) {
            let _ = set_affinity(tid, &CpuSet::from_iter(first.before.iter().copied()));
        }
    }
    problems
}

/// Writes `content` to `path`, again for up to 200 ms while the kernel answers `EBUSY` (an
/// interrupt whose last move has not finished) or `EPERM` (seen for some while a move is
/// pending).
fn write_retrying(path: &Path, content: &str) -> std::io::Result<()> {
    let mut tries = 40;
    loop {
        match std::fs::write(path, content) {
            Err(e)
                if tries > 0
                    && matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::EPERM)) =>
            {
                tries -= 1;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

/// What [`recover_stale`] undid in this process, for the report.
static RECOVERED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Undoes what runs killed before they could restore left recorded in [`STATE_DIR`] (done at
/// the start of every command run as root, before the CPUs are read: a killed run leaves the
/// shell that started it, and so the next run, on the housekeeping CPUs only); returns a line
/// for each, and keeps them for the next [`Isolation`]'s report.
pub fn recover_stale() -> Vec<String> {
    let lines = recover_stale_in(Path::new(STATE_DIR));
    RECOVERED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(lines.iter().cloned());
    lines
}

fn recover_stale_in(state_dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    // A record half written when its run was killed: the renamed one beside it is whole.
    for (aside, _) in crate::rt::stale_entries(state_dir, "isolation-", ".json.tmp") {
        let _ = std::fs::remove_file(aside);
    }
    for (path, pid) in crate::rt::stale_entries(state_dir, "isolation-", ".json") {
        let s = match std::fs::read_to_string(&path)
            .map_err(anyhow::Error::from)
            .and_then(|t| serde_json::from_str::<Saved>(&t).map_err(Into::into))
        {
            Ok(s) => s,
            Err(e) => {
                lines.push(format!(
                    "a run (pid {pid}) ended without restoring what --isolate changed, and its \
                     record {} cannot be read ({e}): check by hand {WQ_CPUMASK}, \
                     {PROC_IRQ}/*/smp_affinity_list, the cpuset hierarchy and the CPU \
                     affinities of running processes (taskset -p)",
                    path.display()
                ));
                let _ = std::fs::remove_file(&path);
                continue;
            }
        };
        let problems = undo(&s);
        lines.push(format!(
            "a run (pid {pid}) ended without restoring what --isolate changed: put back now \
             ({} thread affinities, {} files{})",
            s.tasks.len(),
            s.files.len(),
            if problems.is_empty() {
                String::new()
            } else {
                format!("; not: {}", problems.join(", "))
            }
        ));
        if problems.is_empty() {
            let _ = std::fs::remove_file(&path);
        }
    }
    let _ = std::fs::remove_dir(state_dir);
    lines
}

/// Every thread on the machine, as (process, thread).
fn all_threads() -> Vec<(i32, i32)> {
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(tgid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else {
            continue;
        };
        for t in tasks.flatten() {
            if let Some(tid) = t.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) {
                out.push((tgid, tid));
            }
        }
    }
    out
}

fn comm(tgid: i32, tid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{tgid}/task/{tid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| "?".to_string())
}

/// `PF_KTHREAD` in a task's flags: a kernel thread.
const PF_KTHREAD: u64 = 0x0020_0000;
/// `PF_NO_SETAFFINITY`: userspace may not change the task's affinity.
const PF_NO_SETAFFINITY: u64 = 0x0400_0000;

/// Field `n` (0: the state) of `/proc/<pid>/stat` after the command, which may hold spaces.
fn stat_field(tgid: i32, n: usize) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{tgid}/stat")).ok()?;
    let rest = s.get(s.rfind(')')? + 2..)?;
    rest.split(' ').nth(n)?.parse::<u64>().ok()
}

/// A process's flags; 0 when they cannot be read.
fn task_flags(tgid: i32) -> u64 {
    stat_field(tgid, 6).unwrap_or(0)
}

/// When a thread started, in clock ticks since boot (`stat` field 22).
fn thread_start(tgid: i32, tid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{tgid}/task/{tid}/stat")).ok()?;
    let rest = s.get(s.rfind(')')? + 2..)?;
    rest.split(' ').nth(19)?.parse::<u64>().ok()
}

/// Now, in the clock ticks of [`thread_start`] (from `/proc/uptime`), less one tick so that a
/// thread started in the same tick counts as started during the isolation.
fn now_ticks() -> u64 {
    // SAFETY: `sysconf` has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|u| u.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0, |up| ((up * hz) as u64).saturating_sub(1))
}

/// A process's parent.
fn parent(tgid: i32) -> Option<i32> {
    stat_field(tgid, 1).and_then(|p| i32::try_from(p).ok())
}

/// A process's parent, its parent's parent, and so on up to (not including) pid 1.
fn ancestors(tgid: i32) -> impl Iterator<Item = i32> {
    // Bounded: a pid reused while we walk could make a cycle.
    std::iter::successors(parent(tgid), |&p| parent(p))
        .take_while(|&p| p > 1)
        .take(64)
}

/// A thread's affinity.
pub fn get_affinity(tid: i32) -> std::io::Result<CpuSet> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc =
        unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE, the set's size.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// Sets a thread's affinity.
pub fn set_affinity(tid: i32, cpus: &CpuSet) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in cpus.iter().filter(|&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `cpu` is below CPU_SETSIZE, the set's size.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Each interrupt's `smp_affinity_list`, by number.
fn irq_affinity_files() -> Vec<(u32, PathBuf)> {
    let mut out: Vec<(u32, PathBuf)> = std::fs::read_dir(PROC_IRQ)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((n, e.path().join("smp_affinity_list")))
        })
        .collect();
    out.sort();
    out
}

/// The kernel's hexadecimal CPU mask (`3`, `00000000,00000003`), as a set.
pub fn parse_hex_mask(text: &str) -> Option<CpuSet> {
    let digits: String = text.trim().chars().filter(|&c| c != ',').collect();
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let mut set = CpuSet::default();
    for (i, c) in digits.chars().rev().enumerate() {
        let nibble = c.to_digit(16)?;
        for bit in 0..4 {
            if nibble & (1 << bit) != 0 {
                set.insert(i * 4 + bit);
            }
        }
    }
    Some(set)
}

/// `--isolate` for a probe or the load: isolates `measured` when asked, with a report in the
/// text output (unless `quiet`) and a warning when something stayed.
pub fn for_run(
    asked: bool,
    measured: &CpuSet,
    allowed: &CpuSet,
    warnings: &mut Warnings,
    quiet: bool,
) -> Result<Option<Isolation>> {
    if !asked {
        return Ok(None);
    }
    let housekeeping = allowed.difference(measured);
    let iso = Isolation::apply(measured, &housekeeping)?;
    iso.report.say(quiet);
    if !iso.report.kernel_sees_isolated {
        warnings.push(
            quiet,
            format!(
                "cpu {measured} isolated at run time (--isolate), not at boot: the tick still \
                 runs there and the kernel does not count it as isolated, so its per-CPU \
                 drains still reach it",
            ),
        );
    }
    Ok(Some(iso))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_masks_read_and_write_as_the_kernel_does() {
        let set = |l: &str| CpuSet::parse(l).unwrap();
        assert_eq!(parse_hex_mask("3\n"), Some(set("0-1")));
        assert_eq!(parse_hex_mask("00000000,00000001"), Some(set("0")));
        assert_eq!(parse_hex_mask("1,00000000"), Some(set("32")));
        assert_eq!(parse_hex_mask("zz"), None);
        assert_eq!(parse_hex_mask(""), None);
        // What tracefs writes (the kernel's format), read back.
        for l in ["0", "1-3", "0-3,5", "0,33", "0,31,32,63,64"] {
            assert_eq!(parse_hex_mask(&cpumask_hex(&set(l))), Some(set(l)), "{l}");
        }
    }

    #[test]
    fn undo_writes_files_back_in_reverse_and_removes_its_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("mask");
        std::fs::write(&f, "changed twice").unwrap();
        let made = dir.path().join("made");
        std::fs::create_dir(&made).unwrap();
        let s = Saved {
            pid: 1,
            began_ticks: 0,
            tasks: Vec::new(),
            files: vec![
                SavedFile {
                    path: f.clone(),
                    content: "first".into(),
                    first: None,
                },
                SavedFile {
                    path: f.clone(),
                    content: "second".into(),
                    first: Some("before second".into()),
                },
            ],
            dirs: vec![made.clone()],
            partition: None,
        };
        assert!(undo(&s).is_empty());
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "first");
        assert!(!made.exists());
    }

    #[test]
    fn a_record_is_replaced_whole_and_a_broken_one_is_named_not_skipped() {
        let dir = tempfile::tempdir().unwrap();
        // A process that has ended: its records are stale.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let record = dir.path().join(format!("isolation-{dead}.json"));
        let s = Saved {
            pid: dead,
            ..Saved::default()
        };
        persist(&s, &Some(record.clone()));
        // Renamed into place, nothing left aside.
        let read: Saved = serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
        assert_eq!(read.pid, dead);
        assert!(!record.with_extension("json.tmp").exists());

        // What a kill in the middle of a plain write used to leave: an empty record, and a
        // half-written one aside.
        std::fs::write(&record, "").unwrap();
        std::fs::write(record.with_extension("json.tmp"), "{\"pid\":").unwrap();
        let lines = recover_stale_in(dir.path());
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("cannot be read") && lines[0].contains("by hand"),
            "{lines:?}"
        );
        // Both gone, and with them the emptied directory.
        assert!(!dir.path().exists());
    }

    #[test]
    fn the_report_says_what_stayed_and_what_the_kernel_thinks() {
        let r = IsolationReport {
            cpus: "1".into(),
            housekeeping: "0".into(),
            steps: vec!["3 thread(s) moved".into()],
            tasks_stayed: vec!["20 ksoftirqd/1: per-CPU kernel thread".into()],
            ..IsolationReport::default()
        };
        let l = r.lines();
        assert!(
            l[0].starts_with("isolation: cpu 1 isolated at run time"),
            "{l:?}"
        );
        assert!(
            l[1].contains("1 thread(s) stayed on cpu 1: 20 ksoftirqd/1"),
            "{l:?}"
        );
        assert!(l[2].contains("does not count cpu 1"), "{l:?}");
    }
}
