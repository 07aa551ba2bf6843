//! A kernel setting that a run changes for its length, recorded before it is changed so that
//! what a killed run changed is put back by the next one.
//!
//! Two settings go through here: RT throttling (`sched_rt_runtime_us`, `--no-rt-throttling`,
//! [`crate::throttling`]) and the 1 GiB huge-page pool (`nr_hugepages`, which kernel-pcp raises
//! by one and lowers again at each trigger, [`crate::kernel::pcp`]). Each is a file holding one
//! value: the run reads the value it finds (`saved`), says what it writes in its place
//! (`written`), and a [`Changed`] guard writes `saved` back on every way out: `Drop` (a normal
//! end, an error, a first Ctrl-C, SIGTERM or SIGHUP, a closed standard output, a panic) and a
//! second Ctrl-C (a [`crate::signals::on_forced_exit`] hook).
//!
//! A run killed with SIGKILL runs neither. So before a run first changes the file it records
//! `{pid, path, saved, written}` in `/run/qpw-emu/<kind>-<pid>.json`
//! ([`STATE_DIR`](crate::isolate::STATE_DIR), beside `--isolate`'s record), and every later
//! `qpw-emu` started as root puts back what a run that no longer exists recorded
//! ([`recover_stale`]), and says so: when the file still reads what that run wrote, it gets the
//! saved value back; when it reads the saved value, there is nothing to do; anything else was
//! set by someone since, and is left alone (said).
//!
//! Runs that overlap (two shells, two test suites) share a setting: a run that finds another
//! live run's record for the same file takes the value to put back from it (not what that run
//! wrote), and only the last one to end writes it back. The records are read and written under
//! a lock (`flock` on the directory).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// The settings a run records, by the prefix of their record files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `sched_rt_runtime_us`, written -1 by `--no-rt-throttling`.
    RtThrottling,
    /// `nr_hugepages` of the 1 GiB pool, raised by one at each kernel-pcp trigger.
    HugePages,
}

impl Kind {
    /// Every kind, for the recovery.
    pub const ALL: [Kind; 2] = [Kind::RtThrottling, Kind::HugePages];

    /// The record file's prefix (`rt-throttling-<pid>.json`).
    fn prefix(self) -> &'static str {
        match self {
            Kind::RtThrottling => "rt-throttling-",
            Kind::HugePages => "hugepages-",
        }
    }

    /// What the setting is, in words.
    pub fn what(self) -> &'static str {
        match self {
            Kind::RtThrottling => "RT throttling",
            Kind::HugePages => "the 1 GiB huge-page pool that kernel-pcp allocates from",
        }
    }
}

/// What a run records before it changes a setting.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    /// The run's process.
    pid: u32,
    /// The setting's file.
    path: PathBuf,
    /// The value to put back: what was there before any run of ours changed it.
    saved: String,
    /// What the run writes there (a record of an older version has none: it wrote -1).
    #[serde(default = "minus_one")]
    written: String,
}

fn minus_one() -> String {
    "-1".to_string()
}

/// The record file of process `pid` for `kind` in `dir`.
fn record_file(dir: &Path, kind: Kind, pid: u32) -> PathBuf {
    dir.join(format!("{}{pid}.json", kind.prefix()))
}

/// Every record of `kind` in `dir`, with whether its run has ended.
fn records_in(dir: &Path, kind: Kind) -> Vec<(PathBuf, Record, bool)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            crate::rt::pid_in_name(&path, kind.prefix(), ".json")?;
            let r: Record = serde_json::from_str(&std::fs::read_to_string(&path).ok()?).ok()?;
            let gone = crate::rt::process_gone(r.pid);
            Some((path, r, gone))
        })
        .collect()
}

/// An exclusive `flock` on the directory `dir` (made if missing), held until dropped.
struct DirLock {
    /// The directory, open; the lock goes with it.
    _dir: std::fs::File,
}

impl DirLock {
    fn take(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let f =
            std::fs::File::open(dir).with_context(|| format!("cannot open {}", dir.display()))?;
        use std::os::fd::AsRawFd as _;
        // SAFETY: `f` is an open descriptor for the call's duration; flock has no other
        // preconditions.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("cannot lock {}", dir.display()));
        }
        Ok(Self { _dir: f })
    }
}

/// Puts back what runs that no longer exist recorded in `dir` before they changed a setting
/// (they were killed before they could), unless a live run has the same setting changed still
/// (that one puts back the same value at its end), or someone set another value meanwhile.
/// Returns a line for each record handled.
pub(crate) fn recover_stale_in(dir: &Path) -> Vec<String> {
    if !dir.is_dir() {
        return Vec::new();
    }
    let Ok(_lock) = DirLock::take(dir) else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    for kind in Kind::ALL {
        // A record half written when its run was killed: the renamed one beside it is whole.
        for (aside, _) in crate::rt::stale_entries(dir, kind.prefix(), ".json.tmp") {
            let _ = std::fs::remove_file(aside);
        }
        let all = records_in(dir, kind);
        for (file, r, gone) in &all {
            if !gone {
                continue;
            }
            let live = all.iter().any(|(_, o, g)| !g && o.path == r.path);
            let now = std::fs::read_to_string(&r.path).unwrap_or_default();
            let what = format!(
                "a run (pid {}) ended without putting back {} ({})",
                r.pid,
                r.path.display(),
                kind.what()
            );
            let line = if live {
                Some(format!(
                    "{what}: left as it is, as a run still going has it changed and puts it back \
                     at its end"
                ))
            } else if now.trim() == r.saved.trim() {
                // Killed between two changes (kernel-pcp's pool is back at its size after
                // each trigger): nothing to put back.
                None
            } else if now.trim() != r.written.trim() {
                Some(format!(
                    "{what}: left at {}, which is not the {} it wrote (someone set it since); it \
                     read {} before",
                    now.trim(),
                    r.written.trim(),
                    r.saved.trim()
                ))
            } else {
                Some(match std::fs::write(&r.path, &r.saved) {
                    Ok(()) => format!(
                        "{what}: set back to {} now (it read {})",
                        r.saved.trim(),
                        now.trim()
                    ),
                    Err(e) => format!(
                        "{what}: cannot write {} back ({e}): write it by hand; the record stays \
                         in {}",
                        r.saved.trim(),
                        file.display()
                    ),
                })
            };
            if !line
                .as_ref()
                .is_some_and(|l| l.contains("the record stays"))
            {
                let _ = std::fs::remove_file(file);
            }
            lines.extend(line);
        }
    }
    // The directory too, unless another run's record is in it.
    let _ = std::fs::remove_dir(dir);
    lines
}

/// Puts back the settings that runs killed before they could left changed (see the module
/// docs); done at the start of every command run as root. Returns a line for each.
pub fn recover_stale() -> Vec<String> {
    recover_stale_in(Path::new(crate::isolate::STATE_DIR))
}

/// A setting recorded for the run: [`Changed::write_changed`] and [`Changed::write_saved`]
/// switch it, and the value found is written back when the guard is dropped, or by the
/// forced-exit hook on a second Ctrl-C, unless another live run still has it changed (see the
/// module docs).
#[derive(Debug)]
#[must_use = "the setting is put back when the guard is dropped"]
pub struct Changed {
    kind: Kind,
    path: PathBuf,
    saved: String,
    written: String,
    /// Where the records are kept (`None`: nothing recorded, in unit tests).
    records: Option<PathBuf>,
    /// Set once the value was put back (by `Drop` or by the forced-exit hook).
    restored: Arc<AtomicBool>,
}

impl Changed {
    /// Reads the setting at `path`, records it in `records` (when given) with the value
    /// `written(found)` that the run will write, and returns the guard; nothing is written
    /// yet. Another live run's record for the same file gives the value to put back.
    pub fn record(
        kind: Kind,
        path: &Path,
        written: impl FnOnce(&str) -> Result<String>,
        records: Option<&Path>,
    ) -> Result<Self> {
        let lock = records.map(DirLock::take).transpose()?;
        // A second Ctrl-C is putting everything back: change nothing more (checked under the
        // records' lock, which the exit hooks take to put a setting back).
        if crate::signals::exiting() {
            anyhow::bail!(
                "not changing {}: the run is exiting (a second Ctrl-C)",
                path.display()
            );
        }
        let found = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        // Another run of ours that has it changed recorded what was there before it: that is
        // the value to put back, not what it wrote.
        let others = records.map(|d| records_in(d, kind)).unwrap_or_default();
        let saved = others
            .iter()
            .find(|(_, r, gone)| !gone && r.path == path)
            .map_or(found, |(_, r, _)| r.saved.clone());
        let written = written(&saved)?;
        if let Some(dir) = records {
            let record = Record {
                pid: std::process::id(),
                path: path.to_path_buf(),
                saved: saved.clone(),
                written: written.clone(),
            };
            let file = record_file(dir, kind, record.pid);
            let aside = file.with_extension("json.tmp");
            std::fs::write(&aside, serde_json::to_string(&record)?)
                .and_then(|()| std::fs::rename(&aside, &file))
                .with_context(|| {
                    format!(
                        "cannot record {}'s value in {} before changing it (nothing was changed)",
                        kind.what(),
                        file.display()
                    )
                })?;
        }
        drop(lock);
        let changed = Self {
            kind,
            path: path.to_path_buf(),
            saved,
            written,
            records: records.map(Path::to_path_buf),
            restored: Arc::new(AtomicBool::new(false)),
        };
        // A second Ctrl-C ends the process without running `Drop`: restore then too (once).
        let (hook_kind, hook_path, hook_saved, hook_records, hook_restored) = (
            changed.kind,
            changed.path.clone(),
            changed.saved.clone(),
            changed.records.clone(),
            changed.restored.clone(),
        );
        crate::signals::on_forced_exit(Box::new(move || {
            let _ = restore(
                hook_kind,
                &hook_path,
                &hook_saved,
                hook_records.as_deref(),
                &hook_restored,
            );
        }));
        Ok(changed)
    }

    /// The value found, which is put back.
    pub fn saved(&self) -> &str {
        &self.saved
    }

    /// The value the run writes.
    pub fn written(&self) -> &str {
        &self.written
    }

    /// The setting's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the run's value.
    pub fn write_changed(&self) -> std::io::Result<()> {
        std::fs::write(&self.path, &self.written)
    }

    /// Writes the value found back (the guard still puts it back at the end).
    pub fn write_saved(&self) -> std::io::Result<()> {
        std::fs::write(&self.path, &self.saved)
    }

    /// Removes this run's record without writing anything: the change was refused.
    pub fn forget(self) {
        self.restored.store(true, Ordering::SeqCst);
        if let Some(dir) = &self.records {
            let _lock = DirLock::take(dir);
            let _ = std::fs::remove_file(record_file(dir, self.kind, std::process::id()));
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Writes `saved` back to `path` (once: `restored` says whether it was done), unless another
/// live run recorded in `records` has the setting changed still; removes this run's record.
fn restore(
    kind: Kind,
    path: &Path,
    saved: &str,
    records: Option<&Path>,
    restored: &AtomicBool,
) -> std::io::Result<()> {
    if restored.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    let Some(dir) = records else {
        return std::fs::write(path, saved);
    };
    let _lock = DirLock::take(dir);
    let me = std::process::id();
    let others_live = records_in(dir, kind)
        .iter()
        .any(|(_, r, gone)| !gone && r.pid != me && r.path == path);
    let out = if others_live {
        Ok(())
    } else {
        std::fs::write(path, saved)
    };
    if out.is_ok() {
        let _ = std::fs::remove_file(record_file(dir, kind, me));
        // The directory too, unless another run's record is in it.
        let _ = std::fs::remove_dir(dir);
    }
    out
}

impl Drop for Changed {
    fn drop(&mut self) {
        if let Err(e) = restore(
            self.kind,
            &self.path,
            &self.saved,
            self.records.as_deref(),
            &self.restored,
        ) {
            eprintln!(
                "error: cannot restore {} to {} ({e}): write it back by hand",
                self.path.display(),
                self.saved.trim()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pid that is not running: a child that has been reaped.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    /// Turns this process's record of `kind` into a record of a process that has ended, as a
    /// SIGKILL leaves it; returns that record's file.
    fn as_if_killed(records: &Path, kind: Kind) -> PathBuf {
        let mine = record_file(records, kind, std::process::id());
        let pid = dead_pid();
        let dead = record_file(records, kind, pid);
        let text = std::fs::read_to_string(&mine).unwrap().replace(
            &format!("\"pid\":{}", std::process::id()),
            &format!("\"pid\":{pid}"),
        );
        std::fs::write(&dead, text).unwrap();
        std::fs::remove_file(&mine).unwrap();
        dead
    }

    fn plus_one(found: &str) -> Result<String> {
        Ok((found.trim().parse::<u64>()? + 1).to_string())
    }

    #[test]
    fn a_pool_raised_when_the_run_was_killed_is_lowered_by_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nr_hugepages");
        let records = dir.path().join("state");
        std::fs::write(&path, "2\n").unwrap();
        let pool = Changed::record(Kind::HugePages, &path, plus_one, Some(&records)).unwrap();
        assert_eq!(pool.written(), "3");
        // Recorded, not yet written.
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "2\n");
        pool.write_changed().unwrap();
        // Killed in the middle of a trigger: the guard never dropped.
        std::mem::forget(pool);
        let dead = as_if_killed(&records, Kind::HugePages);
        let lines = recover_stale_in(&records);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "2\n");
        assert!(
            lines[0].contains("set back to 2 now (it read 3)"),
            "{lines:?}"
        );
        assert!(lines[0].contains("huge-page pool"), "{lines:?}");
        assert!(!dead.exists() && !records.exists());
    }

    #[test]
    fn a_run_killed_between_two_changes_leaves_nothing_to_say() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nr_hugepages");
        let records = dir.path().join("state");
        std::fs::write(&path, "0\n").unwrap();
        let pool = Changed::record(Kind::HugePages, &path, plus_one, Some(&records)).unwrap();
        pool.write_changed().unwrap();
        pool.write_saved().unwrap();
        std::mem::forget(pool);
        let dead = as_if_killed(&records, Kind::HugePages);
        assert!(recover_stale_in(&records).is_empty());
        assert!(!dead.exists() && !records.exists());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "0\n");
    }

    #[test]
    fn a_value_set_by_someone_since_is_left_alone_and_said() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nr_hugepages");
        let records = dir.path().join("state");
        std::fs::write(&path, "0\n").unwrap();
        let pool = Changed::record(Kind::HugePages, &path, plus_one, Some(&records)).unwrap();
        std::mem::forget(pool);
        as_if_killed(&records, Kind::HugePages);
        std::fs::write(&path, "5\n").unwrap();
        let lines = recover_stale_in(&records);
        assert!(lines[0].contains("left at 5"), "{lines:?}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "5\n");
    }

    #[test]
    fn the_guard_puts_back_on_drop_and_a_refused_change_forgets_its_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nr_hugepages");
        let records = dir.path().join("state");
        std::fs::write(&path, "1\n").unwrap();
        let pool = Changed::record(Kind::HugePages, &path, plus_one, Some(&records)).unwrap();
        pool.write_changed().unwrap();
        drop(pool);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "1\n");
        assert!(!records.exists());
        let pool = Changed::record(Kind::HugePages, &path, plus_one, Some(&records)).unwrap();
        pool.forget();
        assert!(!records.exists());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "1\n");
    }

    #[test]
    fn throttling_off_when_the_run_was_killed_is_put_back_by_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sched_rt_runtime_us");
        let records = dir.path().join("state");
        std::fs::write(&path, "950000\n").unwrap();
        let off = crate::throttling::ThrottlingOff::recorded_at(&path, Some(&records)).unwrap();
        let mine = record_file(&records, Kind::RtThrottling, std::process::id());
        let r: Record = serde_json::from_str(&std::fs::read_to_string(&mine).unwrap()).unwrap();
        assert_eq!((r.saved.as_str(), r.written.as_str()), ("950000\n", "-1"));
        // What a SIGKILL leaves: the guard never dropped, the record now a dead run's.
        std::mem::forget(off);
        let dead = as_if_killed(&records, Kind::RtThrottling);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "-1");
        let lines = recover_stale_in(&records);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "950000\n");
        assert!(
            lines[0].contains("set back to 950000 now (it read -1)"),
            "{lines:?}"
        );
        assert!(lines[0].contains("(RT throttling)"), "{lines:?}");
        assert!(!dead.exists() && !records.exists());
        // Nothing more to do the next time.
        assert!(recover_stale_in(&records).is_empty());
    }

    #[test]
    fn an_older_record_without_the_written_value_reads_as_minus_one() {
        let r: Record =
            serde_json::from_str(r#"{"pid":1,"path":"/x","saved":"950000\n"}"#).unwrap();
        assert_eq!(r.written, "-1");
    }

    #[test]
    fn overlapping_runs_put_back_the_value_from_before_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sched_rt_runtime_us");
        let records = dir.path().join("state");
        std::fs::write(&path, "950000\n").unwrap();
        // A live run (this process, under another record) turned it off first.
        let first = crate::throttling::ThrottlingOff::recorded_at(&path, Some(&records)).unwrap();
        let live = records.join("rt-throttling-1.json");
        std::fs::rename(
            record_file(&records, Kind::RtThrottling, std::process::id()),
            &live,
        )
        .unwrap();
        let text = std::fs::read_to_string(&live)
            .unwrap()
            .replace(&format!("\"pid\":{}", std::process::id()), "\"pid\":1");
        std::fs::write(&live, text).unwrap();
        std::mem::forget(first);
        // The second finds -1, and takes the first's value to put back.
        let second = crate::throttling::ThrottlingOff::recorded_at(&path, Some(&records)).unwrap();
        assert_eq!(second.saved(), "950000\n");
        // It ends while the first (pid 1 lives) still has it off: left off.
        drop(second);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "-1");
        std::fs::remove_file(&live).unwrap();
    }
}
