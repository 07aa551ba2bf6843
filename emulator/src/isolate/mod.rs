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

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Result};
use qpw_core::CpuSet;
use serde::{Deserialize, Serialize};

use crate::sink::Sink;

mod cgroups;
pub mod partition;
mod procfs;
mod restore;
mod steps;

pub use cgroups::{makes_v2_partition, NO_MEMCG_UNDER_PARTITION};
use cgroups::{shield_v1, Cgroups};
use procfs::{
    all_threads, ancestors, comm, deliveries, irq_affinity_files, now_ticks, task_flags,
    thread_start, PF_KTHREAD, PF_NO_SETAFFINITY,
};
pub use procfs::{get_affinity, parse_hex_mask, set_affinity};
pub use restore::recover_stale;
use restore::{persist, restore, state_file_for, RECOVERED};
use steps::{change_file, isolate};

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
    /// Says the report's lines on stderr (the text output), unless the sink is quiet.
    pub fn say(&self, sink: &Sink) {
        if !sink.is_quiet() {
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

/// `--isolate` for a probe or the load: isolates `measured` when asked, with a report in the
/// text output (unless the sink is quiet) and a warning when something stayed.
pub fn for_run(
    asked: bool,
    measured: &CpuSet,
    allowed: &CpuSet,
    sink: &mut Sink,
) -> Result<Option<Isolation>> {
    if !asked {
        return Ok(None);
    }
    let housekeeping = allowed.difference(measured);
    let iso = Isolation::apply(measured, &housekeeping)?;
    iso.report.say(sink);
    if !iso.report.kernel_sees_isolated {
        sink.warn(format!(
            "cpu {measured} isolated at run time (--isolate), not at boot: the tick still \
                 runs there and the kernel does not count it as isolated, so its per-CPU \
                 drains still reach it",
        ));
    }
    Ok(Some(iso))
}

#[cfg(test)]
mod tests {
    use super::procfs::fired;
    use super::restore::{persist, recover_stale_in, undo};
    use super::*;
    use crate::trace::tracefs::cpumask_hex;

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
    fn an_interrupts_count_is_its_cpus_columns_summed() {
        let table = "           CPU0       CPU1       \n \
                     26:          0          2  IO-APIC   4-edge      ttyS0\n \
                    126:          7          1  PCI-MSIX-0000:00:02.0   1-edge      virtio1\n \
                    NMI:          0          0   Non-maskable interrupts\n";
        assert_eq!(fired(table, "26"), Some(2));
        assert_eq!(fired(table, "126"), Some(8));
        assert_eq!(fired(table, "6"), None);
        assert_eq!(fired(table, "NMI"), Some(0));
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
