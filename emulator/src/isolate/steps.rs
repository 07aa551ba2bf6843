//! The isolation's steps, in order: the tasks, the unbound workqueues, the interrupts and the
//! scheduler domains, each recorded before it is made so that it can be put back.

use std::path::{Path, PathBuf};

use anyhow::Result;
use qpw_core::CpuSet;

use crate::trace::tracefs::cpumask_hex;

use super::{
    all_threads, comm, get_affinity, irq_affinity_files, parse_hex_mask, partition, persist,
    recover_stale, set_affinity, shield_v1, task_flags, Cgroups, IsolationReport, Saved, SavedFile,
    SavedTask, PF_KTHREAD, PF_NO_SETAFFINITY, PROC_IRQ, RECOVERED, WQ_CPUMASK,
};

/// Isolates `cpus`, moving what can be moved to `housekeeping`, each change recorded in `s`
/// (and its state file) before it is made; what was done and what stayed goes in `report`.
pub(super) fn isolate(
    cpus: &CpuSet,
    housekeeping: &CpuSet,
    s: &mut Saved,
    report: &mut IsolationReport,
    state_file: &Option<PathBuf>,
) -> Result<()> {
    recover_stale();
    report.recovered = std::mem::take(&mut *RECOVERED.lock().unwrap_or_else(|e| e.into_inner()));
    // 1. Tasks.
    move_tasks(cpus, s, report, state_file);
    // 2. Unbound workqueues.
    move_workqueues(cpus, housekeeping, s, report, state_file);
    // 3. Interrupts.
    move_irqs(cpus, housekeeping, s, report, state_file);
    // 4. Scheduler domains.
    split_domains(cpus, housekeeping, s, report, state_file)?;
    persist(s, state_file);
    report.kernel_sees_isolated = qpw_core::Topology::read()
        .map(|t| cpus.is_subset(&t.isolated_or_nohz_full()))
        .unwrap_or(false);
    Ok(())
}

/// Step 1: every thread of every other process off `cpus`.
fn move_tasks(
    cpus: &CpuSet,
    s: &mut Saved,
    report: &mut IsolationReport,
    state_file: &Option<PathBuf>,
) {
    let me = std::process::id() as i32;
    // In passes: a thread that a process not yet moved starts during a pass has the
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
}

/// Step 2: the unbound workqueues off `cpus`.
fn move_workqueues(
    cpus: &CpuSet,
    housekeeping: &CpuSet,
    s: &mut Saved,
    report: &mut IsolationReport,
    state_file: &Option<PathBuf>,
) {
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
}

/// Step 3: the interrupts off `cpus`, those the kernel delivers elsewhere left alone.
fn move_irqs(
    cpus: &CpuSet,
    housekeeping: &CpuSet,
    s: &mut Saved,
    report: &mut IsolationReport,
    state_file: &Option<PathBuf>,
) {
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
}

/// Step 4: the scheduler domains: `cpus` in none (the cgroup v1 shield, or a cgroup v2
/// isolated partition).
fn split_domains(
    cpus: &CpuSet,
    housekeeping: &CpuSet,
    s: &mut Saved,
    report: &mut IsolationReport,
    state_file: &Option<PathBuf>,
) -> Result<()> {
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
    Ok(())
}

/// `set` without `cpus`, or the housekeeping CPUs when nothing else is left.
pub(super) fn off(set: &CpuSet, cpus: &CpuSet, housekeeping: &CpuSet) -> CpuSet {
    let rest = set.difference(cpus);
    if rest.is_empty() {
        housekeeping.clone()
    } else {
        rest
    }
}

/// Writes `new` to `path`, whose content was `old`, after recording (and persisting) how to
/// put it back; the record is dropped when the write fails.
pub(super) fn change_file(
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
