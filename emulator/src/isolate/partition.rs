//! `--isolate` on cgroup v2: an isolated cpuset partition for the measured CPUs.
//!
//! On cgroup v2 the kernel isolates CPUs at run time with a cpuset *partition* whose
//! `cpuset.cpus.partition` reads `isolated`: its CPUs leave the scheduler's load-balancing
//! domains and every other cgroup's effective CPUs (so nothing else is scheduled there), and
//! from Linux 6.8 they also leave the unbound workqueues' mask and count as isolated for
//! `cpu_is_isolated()`, which mainline's memcg drain checks. It is what tuned's
//! cpu-partitioning profile and systemd's `AllowedCPUs=` build on.
//!
//! A partition holds tasks, and our probe shares its process with the requester and the load,
//! which run on the other CPUs. So the partition is *threaded*: a threaded cgroup takes single
//! threads of the processes in its threaded domain, here the probe's and the workers' meant
//! for the measured CPUs, while the rest of the process stays outside. Where it sits: before
//! 6.7 a partition's parent must itself be a partition root, and the only one that holds the
//! other CPUs is the root cgroup; so the partition is a threaded child of the root, and our
//! process moves into the root cgroup for the run (and back after). From 6.7 a *remote*
//! partition (`cpuset.cpus.exclusive` down the tree) could sit beside the process's own
//! cgroup, but that means writing into the service manager's slices; the root works on every
//! kernel from 6.1 on, the oldest this was measured on (a guest, `guest/qpw-guest`).
//!
//! Which threads go in: every thread of ours that qpw pins to the measured CPUs, through
//! [`qpw_core::set_pin_hook`], which moves a thread into the partition right before it is
//! pinned there (and back out before it is pinned elsewhere); threads pinned there already
//! are moved when the partition is made. A child process of ours (the kernel workloads'
//! filler) does the same from [`PARTITION_ENV`]; one that sits in a memory cgroup of its own
//! (kernel-memcg's) cannot: a threaded partition takes threads of its own domain only.
//!
//! Putting it back, in this order: our threads out of the partition, the partition back to a
//! member (at once, where the cgroup's removal would let the kernel do it later), its removal,
//! our process back to its cgroup, the cpuset controller off the root's children if we turned
//! it on, and every thread's affinity as found: Linux 6.1 resets the affinity of every task in
//! a cpuset whose CPUs change (6.2 keeps what a task asked for), so the masks of all threads
//! are saved before the partition is made and written back after it is gone.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use qpw_core::CpuSet;
use serde::{Deserialize, Serialize};

use super::{
    all_threads, ancestors, get_affinity, persist, task_flags, Saved, SavedTask, PF_NO_SETAFFINITY,
};

/// The environment variable that hands a child process the partition (`<dir>:<root>:<cpus>`),
/// so that it moves its own thread in before it pins itself there.
pub const PARTITION_ENV: &str = "QPW_EMU_PARTITION";

/// What the partition step changed, for the undo.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct SavedPartition {
    /// The run's process.
    pid: u32,
    /// The cgroup v2 root.
    root: PathBuf,
    /// The partition's directory.
    dir: PathBuf,
    /// Whether the run turned the cpuset controller on for the root's children.
    enabled_cpuset: bool,
    /// The process's own cgroup before it moved to the root (none: it was in the root).
    moved_from: Option<PathBuf>,
}

/// The partition in force in this process: its directory, the cgroup root and its CPUs.
static ACTIVE: Mutex<Option<(PathBuf, PathBuf, CpuSet)>> = Mutex::new(None);

/// The partition in force in this process, as [`PARTITION_ENV`]'s value for a child.
pub fn active_for_child() -> Option<String> {
    let active = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
    active
        .as_ref()
        .map(|(dir, root, cpus)| format!("{}:{}:{cpus}", dir.display(), root.display()))
}

/// Whether a partition of ours is in force in this process.
pub fn active() -> bool {
    ACTIVE.lock().unwrap_or_else(|e| e.into_inner()).is_some()
}

/// In a child process started with [`PARTITION_ENV`]: the pin hook that moves its threads in.
pub fn hook_from_env() {
    let Some(value) = std::env::var_os(PARTITION_ENV) else {
        return;
    };
    let value = value.to_string_lossy();
    let mut parts = value.rsplitn(3, ':');
    let (Some(cpus), Some(root), Some(dir)) = (parts.next(), parts.next(), parts.next()) else {
        return;
    };
    if let Ok(cpus) = CpuSet::parse(cpus) {
        install_hook(PathBuf::from(dir), PathBuf::from(root), cpus);
    }
}

/// Moves a thread into a threaded cgroup.
fn move_thread(dir: &Path, tid: i32) -> std::io::Result<()> {
    std::fs::write(dir.join("cgroup.threads"), tid.to_string())
}

fn install_hook(dir: PathBuf, root: PathBuf, cpus: CpuSet) {
    qpw_core::set_pin_hook(Some(Box::new(move |tid, asked| {
        if asked.is_subset(&cpus) {
            move_thread(&dir, tid).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "cannot move thread {tid} into the isolated partition {} ({e})",
                        dir.display()
                    ),
                )
            })
        } else {
            if asked.intersection(&cpus).is_empty() {
                // Out of the partition, or already out: either way the root takes it.
                let _ = move_thread(&root, tid);
            }
            Ok(())
        }
    })));
}

/// The cgroup v2 root with the cpuset controller, if mounted.
pub(super) fn v2_root(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [_, dir, "cgroup2", ..] = f[..] else {
            return None;
        };
        std::fs::read_to_string(Path::new(dir).join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpuset"))
            .then(|| PathBuf::from(dir))
    })
}

/// Makes the partition; returns the report's step line. On failure what was done is put back
/// before it returns.
pub(super) fn make(
    root: &Path,
    cpus: &CpuSet,
    s: &mut Saved,
    state_file: &Option<PathBuf>,
) -> Result<String> {
    let pid = std::process::id();
    let dir = root.join(format!("qpw-emu-{pid}"));
    s.partition = Some(SavedPartition {
        pid,
        root: root.to_path_buf(),
        dir: dir.clone(),
        ..SavedPartition::default()
    });
    persist(s, state_file);
    let made = build(root, &dir, cpus, s, state_file);
    if made.is_err() {
        if let Some(p) = s.partition.take() {
            for problem in undo(&p) {
                eprintln!("error: --isolate could not put back {problem}: do it by hand");
            }
        }
        persist(s, state_file);
    }
    made
}

/// Makes the partition, in its steps, each recorded in `s` (and its state file) before it is
/// taken; returns the line that says what was made.
fn build(
    root: &Path,
    dir: &Path,
    cpus: &CpuSet,
    s: &mut Saved,
    state_file: &Option<PathBuf>,
) -> Result<String> {
    enable_cpuset(root, s, state_file)?;
    save_affinities(s, state_file);
    let own = into_root(root, s, state_file)?;
    make_partition(dir, cpus)?;
    move_own_threads(dir, cpus);
    *ACTIVE.lock().unwrap_or_else(|e| e.into_inner()) =
        Some((dir.to_path_buf(), root.to_path_buf(), cpus.clone()));
    install_hook(dir.to_path_buf(), root.to_path_buf(), cpus.clone());
    Ok(format!(
        "scheduler domains: cgroup v2 isolated partition {} (cpuset.cpus {cpus}, threaded; this \
         process {}, its threads meant for cpu {cpus} in the partition)",
        dir.display(),
        if own == "/" {
            "in the root cgroup".to_string()
        } else {
            format!("moved from {own} to the root cgroup for the run")
        }
    ))
}

/// Writes `value` to `path`, saying which file refused it.
fn write_value(path: PathBuf, value: &str) -> Result<()> {
    std::fs::write(&path, value)
        .with_context(|| format!("cannot write {value:?} to {}", path.display()))
}

/// Step 1: the cpuset controller for the root's children.
fn enable_cpuset(root: &Path, s: &mut Saved, state_file: &Option<PathBuf>) -> Result<()> {
    let control = root.join("cgroup.subtree_control");
    let enabled = std::fs::read_to_string(&control)
        .with_context(|| format!("cannot read {}", control.display()))?;
    if !enabled.split_whitespace().any(|c| c == "cpuset") {
        // Recorded first, so that a kill right after the write still turns it off.
        if let Some(p) = &mut s.partition {
            p.enabled_cpuset = true;
        }
        persist(s, state_file);
        write_value(control, "+cpuset")?;
    }
    Ok(())
}

/// Step 2: every thread's affinity as it is now (kernels before 6.2 reset them as CPUs come
/// and go from a cpuset). Ours but the main thread, and our children's (a filler), are left
/// out: they are the run's own, and one in the partition could not be given its old CPUs.
fn save_affinities(s: &mut Saved, state_file: &Option<PathBuf>) {
    let me = std::process::id() as i32;
    let known: std::collections::HashSet<i32> = s.tasks.iter().map(|t| t.tid).collect();
    for (tgid, tid) in all_threads() {
        if known.contains(&tid)
            || (tgid == me && tid != me)
            || ancestors(tgid).any(|p| p == me)
            || task_flags(tgid) & PF_NO_SETAFFINITY != 0
        {
            continue;
        }
        if let Ok(mask) = get_affinity(tid) {
            let mask: Vec<usize> = mask.iter().collect();
            s.tasks.push(SavedTask {
                tid,
                tgid,
                before: mask.clone(),
                set: mask,
            });
        }
    }
    persist(s, state_file);
}

/// Step 3: our process into the root cgroup, the only threaded domain a partition can hang
/// from on every kernel; returns the cgroup it was in (`/`: the root already).
fn into_root(root: &Path, s: &mut Saved, state_file: &Option<PathBuf>) -> Result<String> {
    let me = std::process::id() as i32;
    let own =
        std::fs::read_to_string("/proc/self/cgroup").context("cannot read /proc/self/cgroup")?;
    let own = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .context("this process is in no cgroup v2 cgroup (/proc/self/cgroup has no 0:: line)")?;
    if own != "/" {
        if let Some(p) = &mut s.partition {
            p.moved_from = Some(root.join(own.trim_start_matches('/')));
        }
        persist(s, state_file);
        write_value(root.join("cgroup.procs"), &me.to_string())?;
    }
    Ok(own.to_string())
}

/// Step 4: the partition, checked to read `isolated`.
fn make_partition(dir: &Path, cpus: &CpuSet) -> Result<()> {
    std::fs::create_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    write_value(dir.join("cgroup.type"), "threaded")?;
    write_value(dir.join("cpuset.cpus"), &cpus.to_string())?;
    write_value(dir.join("cpuset.cpus.partition"), "isolated")?;
    let state = std::fs::read_to_string(dir.join("cpuset.cpus.partition")).unwrap_or_default();
    if state.trim() != "isolated" {
        bail!(
            "{} reads {:?}: the kernel refused the partition",
            dir.join("cpuset.cpus.partition").display(),
            state.trim()
        );
    }
    Ok(())
}

/// Step 5: our threads meant for those CPUs, now (the pin hook moves them from now on).
fn move_own_threads(dir: &Path, cpus: &CpuSet) {
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            if get_affinity(tid).is_ok_and(|m| !m.is_empty() && m.is_subset(cpus)) {
                let _ = move_thread(dir, tid);
            }
        }
    }
}

/// Puts back what the partition step did; returns what could not be.
pub(super) fn undo(p: &SavedPartition) -> Vec<String> {
    let mut problems = Vec::new();
    let mine = p.pid == std::process::id();
    if mine {
        qpw_core::set_pin_hook(None);
        *ACTIVE.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
    if p.dir.exists() {
        // Threads still in it (ours, in a normal end) go to the root.
        let threads = std::fs::read_to_string(p.dir.join("cgroup.threads")).unwrap_or_default();
        for tid in threads.lines().filter_map(|t| t.trim().parse::<i32>().ok()) {
            let _ = move_thread(&p.root, tid);
        }
        // Dissolved now: the removal alone would hand the CPUs back later, from a workqueue.
        let _ = std::fs::write(p.dir.join("cpuset.cpus.partition"), "member");
        let mut removed = Err(std::io::Error::other("not tried"));
        for _ in 0..100 {
            removed = std::fs::remove_dir(&p.dir);
            if removed.is_ok() || !p.dir.exists() {
                removed = Ok(());
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        if let Err(e) = removed {
            problems.push(format!("the removal of {} ({e})", p.dir.display()));
        }
    }
    if let Some(from) = &p.moved_from {
        if !crate::rt::process_gone(p.pid) {
            if let Err(e) = std::fs::write(from.join("cgroup.procs"), p.pid.to_string()) {
                problems.push(format!(
                    "process {} back into {} ({e}; it stays in the root cgroup)",
                    p.pid,
                    from.display()
                ));
            }
        }
    }
    if p.enabled_cpuset {
        let control = p.root.join("cgroup.subtree_control");
        if let Err(e) = std::fs::write(&control, "-cpuset") {
            problems.push(format!("-cpuset in {} ({e})", control.display()));
        }
    }
    problems
}
