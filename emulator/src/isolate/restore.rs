//! Putting back what the isolation changed: on every way out of the run, and, from its state
//! file, after a run that was killed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use qpw_core::CpuSet;

use super::{
    all_threads, ancestors, deliveries, get_affinity, partition, set_affinity, task_flags,
    thread_start, Saved, SavedFile, SavedTask, PF_KTHREAD, PROC_IRQ, STATE_DIR, WQ_CPUMASK,
};

/// The state file of process `pid`, when the state directory can be made.
pub(super) fn state_file_for(pid: u32) -> Option<PathBuf> {
    std::fs::create_dir_all(STATE_DIR).ok()?;
    Some(Path::new(STATE_DIR).join(format!("isolation-{pid}.json")))
}

/// Writes what has been changed so far, so that a killed run can be undone.
pub(super) fn persist(s: &Saved, file: &Option<PathBuf>) {
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

/// Puts back what `saved` records, once (later calls find nothing), in the reverse order of
/// the changes, and removes the state file.
pub(super) fn restore(saved: &Mutex<Option<Saved>>, state_file: Option<&Path>) {
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

/// Undoes `s`; returns what could not be undone. In this order: the partition, the files
/// (last written first), the directories made (last made first), then the threads.
pub(super) fn undo(s: &Saved) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(p) = &s.partition {
        problems.extend(partition::undo(p));
    }
    for f in s.files.iter().rev() {
        undo_file(f, &mut problems);
    }
    for d in s.dirs.iter().rev() {
        if d.exists() {
            if let Err(e) = std::fs::remove_dir(d) {
                problems.push(format!("the removal of {} ({e})", d.display()));
            }
        }
    }
    undo_threads(s, &mut problems);
    problems
}

/// Writes one file back as it was; an interrupt's mask after its old effective CPUs, so that
/// it lands there first. What could not be written back goes into `problems`.
fn undo_file(f: &SavedFile, problems: &mut Vec<String>) {
    // An interrupt that did not land on its old CPU before the wider mask: its old CPU.
    let stays = f.first.as_deref().and_then(|first| move_back(f, first));
    if let Some(first) = stays {
        let irq = f.path.parent().and_then(Path::file_name);
        let now = std::fs::read_to_string(f.path.with_file_name("effective_affinity_list"))
            .unwrap_or_default();
        eprintln!(
            "qpw-emu: isolation: irq {} is back in its mask {} but stays on cpu {}, not {}: \
             the kernel moves it only when it fires, and it did not fire while its move \
             back waited (0.2 s)",
            irq.map_or(String::new(), |i| i.to_string_lossy().into_owned()),
            f.content,
            now.trim(),
            first.trim()
        );
    }
    if let Err(e) = write_retrying(&f.path, &f.content) {
        // What matters is that the file reads as it did.
        let now = std::fs::read_to_string(&f.path).unwrap_or_default();
        if now.trim() != f.content.trim() {
            problems.push(format!("{} = {} ({e})", f.path.display(), f.content));
        }
    }
}

/// Writes an interrupt's old effective CPUs `first` to its mask and waits for it to land
/// there; returns `first` when it did not, because the interrupt did not fire meanwhile.
fn move_back<'a>(f: &SavedFile, first: &'a str) -> Option<&'a str> {
    // An interrupt that is still moving refuses a new mask for a moment (EBUSY); and
    // an interrupt's move may wait for its next delivery (an IO-APIC's does, and a
    // non-remapped MSI's on x86): give it a moment to land on its old CPU before the
    // wider mask, which keeps it there.
    let _ = write_retrying(&f.path, first);
    let effective = f.path.with_file_name("effective_affinity_list");
    let fired = deliveries(&f.path);
    let landed = (0..40).any(|_| {
        let there = std::fs::read_to_string(&effective).map_or(true, |e| e.trim() == first.trim());
        if !there {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        there
    });
    // One that did not fire meanwhile cannot have moved: the wider mask keeps it on
    // the housekeeping CPU, by the kernel's rule, until something moves it. Said, so
    // that nobody looks for a fault (`isolate.rs`'s test reads this line).
    (!landed && fired.is_some() && deliveries(&f.path) == fired).then_some(first)
}

/// The threads: each as found. Threads and processes started meanwhile by a moved process
/// inherited the narrowed mask, so a thread of such a process (or of its child, e.g. the next
/// run started from a shell a killed run had moved) that still has exactly it gets the mask
/// its process's (or parent's) first saved thread had.
fn undo_threads(s: &Saved, problems: &mut Vec<String>) {
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
}

/// Writes `content` to `path`, again for up to 200 ms while the kernel answers `EBUSY` (an
/// interrupt whose last move has not finished) or `EPERM` (seen for some while a move is
/// pending).
pub(super) fn write_retrying(path: &Path, content: &str) -> std::io::Result<()> {
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
pub(super) static RECOVERED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Undoes what runs killed before they could restore left recorded in [`STATE_DIR`] (done at
/// the start of every command run as root, before the CPUs are read: a killed run leaves the
/// shell that started it, and so the next run, on the housekeeping CPUs only); returns a line
/// for each, and keeps them for the next [`Isolation`](super::Isolation)'s report.
pub fn recover_stale() -> Vec<String> {
    let lines = recover_stale_in(Path::new(STATE_DIR));
    RECOVERED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(lines.iter().cloned());
    lines
}

pub(super) fn recover_stale_in(state_dir: &Path) -> Vec<String> {
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
