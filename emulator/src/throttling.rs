//! The kernel's RT throttling, which decides what a queue-mode drain against a `SCHED_FIFO`
//! probe looks like.
//!
//! `SCHED_FIFO` and `SCHED_RR` tasks of a CPU get `sched_rt_runtime_us` of each
//! `sched_rt_period_us` (950000 of 1000000 by default); then `SCHED_OTHER` tasks run for the rest
//! of the period. A worker starved by a FIFO probe therefore runs after about 0.95 s, and a drain
//! that waits for it *completes* in about a second: with a 1 s timeout no stall is counted, and
//! the case the project exists to show reads as harmless. The kernel report it models (a task
//! "blocked for more than 622 seconds" in `__lru_add_drain_all`) had no throttling to save it.
//!
//! So the runs report the setting ([`RtThrottling`], in the output and the JSON), count a
//! drain that waits past a threshold well under the period as a stall (`--stall-threshold`),
//! and can turn throttling off for the run (`--no-rt-throttling`, [`ThrottlingOff`]): root only,
//! with a warning, and the old value written back on every way out: `Drop` (a normal end, an
//! error, a first Ctrl-C, SIGTERM or SIGHUP, a closed standard output, a panic) and a second
//! Ctrl-C (a [`crate::signals::on_forced_exit`] hook).
//!
//! A run killed with SIGKILL runs neither, and RT throttling would stay off for the whole
//! machine. So before it writes -1 a run records the value it found in
//! `/run/qpw-emu/rt-throttling-<pid>.json` ([`STATE_DIR`](crate::isolate::STATE_DIR), beside
//! `--isolate`'s record), and every later `qpw-emu` started as root puts back what a run that
//! no longer exists recorded ([`recover_stale`]), and says so. Runs that overlap (two shells,
//! two test suites) share the setting: a run that finds another live run's record takes the
//! value to put back from it (not the -1 that run wrote), and only the last one to end writes
//! it back. The records are read and written under a lock (`flock` on the directory).
//!
//! Since Linux 6.12 the relief comes from the *fair server* (a deadline server that gives
//! `SCHED_OTHER` tasks 50 ms of each second on a CPU an RT task hogs, set per CPU in debugfs
//! under `sched/fair_server/`), not from the RT budget alone: on this machine's 6.18 kernel
//! `sched_rt_runtime_us = -1` leaves drains against a FIFO probe completing after about 0.95 s
//! all the same, and the fair server's files refuse even root. The flag still writes the sysctl
//! (the knob of older kernels and of RT group scheduling) and its warning says this.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::rt::Warnings;

/// Where the kernel keeps the RT budget per period (-1: no throttling).
pub const RUNTIME_PATH: &str = "/proc/sys/kernel/sched_rt_runtime_us";
/// The fair server's settings per CPU (debugfs, Linux 6.12 and later).
pub const FAIR_SERVER: &str = "/sys/kernel/debug/sched/fair_server/";
/// Where the kernel keeps the period.
pub const PERIOD_PATH: &str = "/proc/sys/kernel/sched_rt_period_us";

/// RT throttling as a run saw it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RtThrottling {
    /// `sched_rt_runtime_us` during the run (-1: off); `None` when it could not be read.
    pub runtime_us: Option<i64>,
    /// `sched_rt_period_us`.
    pub period_us: Option<i64>,
    /// With `--no-rt-throttling`: the value written back at exit.
    pub restored_to_us: Option<i64>,
}

impl RtThrottling {
    /// The setting now; `off` is the guard that turned it off for the run, if any.
    pub fn read(off: Option<&ThrottlingOff>) -> Self {
        Self {
            runtime_us: read_int(Path::new(RUNTIME_PATH)),
            period_us: read_int(Path::new(PERIOD_PATH)),
            restored_to_us: off.and_then(|o| o.saved.trim().parse().ok()),
        }
    }

    /// One line for the text output.
    pub fn line(&self) -> String {
        let restored = self.restored_to_us.map_or_else(String::new, |r| {
            format!(" for this run (restored to {r} at exit)")
        });
        match (self.runtime_us, self.period_us) {
            (Some(-1), _) => format!("RT throttling: off{restored}"),
            (Some(r), Some(p)) => format!(
                "RT throttling: on, sched_rt_runtime_us {r} of sched_rt_period_us {p}: a \
                 SCHED_FIFO probe lets a starved worker run after {:.3} s, so a queue-mode drain \
                 against it completes then (counted as a stall past --stall-threshold)",
                r as f64 / 1e6
            ),
            _ => "RT throttling: unknown (cannot read /proc/sys/kernel/sched_rt_*)".to_string(),
        }
    }
}

fn read_int(path: &Path) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// RT throttling turned off (`-1` written to `sched_rt_runtime_us`) until dropped; the value
/// it found is written back then, or by the forced-exit hook on a second Ctrl-C, unless another
/// live run still has it off (see the module docs).
#[derive(Debug)]
#[must_use = "throttling is restored when the guard is dropped"]
pub struct ThrottlingOff {
    path: PathBuf,
    saved: String,
    /// Where the records are kept (`None`: nothing recorded, in unit tests).
    records: Option<PathBuf>,
    /// Set once the value was put back (by `Drop` or by the forced-exit hook).
    restored: Arc<AtomicBool>,
}

/// What a run that turned RT throttling off records before it writes -1.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    /// The run's process.
    pid: u32,
    /// The sysctl file.
    path: PathBuf,
    /// The value to put back: what was there before any run of ours turned it off.
    saved: String,
}

/// The record file of process `pid` in `dir`.
fn record_file(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("rt-throttling-{pid}.json"))
}

/// Every record in `dir`, with whether its run has ended.
fn records_in(dir: &Path) -> Vec<(PathBuf, Record, bool)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            let name = path.file_name()?.to_str()?;
            name.strip_prefix("rt-throttling-")?.strip_suffix(".json")?;
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

/// Puts back what runs that no longer exist recorded in `dir` before they turned RT throttling
/// off (they were killed before they could), unless a live run has it off still (that one puts
/// back the same value at its end), or someone set another value meanwhile. Returns a line for
/// each record handled.
fn recover_stale_in(dir: &Path) -> Vec<String> {
    if !dir.is_dir() {
        return Vec::new();
    }
    let Ok(_lock) = DirLock::take(dir) else {
        return Vec::new();
    };
    // A record half written when its run was killed: the renamed one beside it is whole.
    for (aside, _) in crate::rt::stale_entries(dir, "rt-throttling-", ".json.tmp") {
        let _ = std::fs::remove_file(aside);
    }
    let all = records_in(dir);
    let mut lines = Vec::new();
    for (file, r, gone) in &all {
        if !gone {
            continue;
        }
        let live = all.iter().any(|(_, o, g)| !g && o.path == r.path);
        let now = std::fs::read_to_string(&r.path).unwrap_or_default();
        let what = format!(
            "a run (pid {}) ended without putting back {} (RT throttling)",
            r.pid,
            r.path.display()
        );
        let line = if live {
            format!("{what}: left off, as a run still going has it off and puts it back at its end")
        } else if now.trim() != "-1" {
            format!(
                "{what}: left at {}, which is not the -1 it wrote (someone set it since); it \
                 read {} before",
                now.trim(),
                r.saved.trim()
            )
        } else {
            match std::fs::write(&r.path, &r.saved) {
                Ok(()) => format!("{what}: set back to {} now (it read -1)", r.saved.trim()),
                Err(e) => format!(
                    "{what}: cannot write {} back ({e}): write it by hand; the record stays in {}",
                    r.saved.trim(),
                    file.display()
                ),
            }
        };
        if !line.contains("the record stays") {
            let _ = std::fs::remove_file(file);
        }
        lines.push(line);
    }
    // The directory too, unless another run's record is in it.
    let _ = std::fs::remove_dir(dir);
    lines
}

/// Puts back RT throttling where a run killed before it could left it off (see the module
/// docs); done at the start of every command run as root. Returns a line for each.
pub fn recover_stale() -> Vec<String> {
    recover_stale_in(Path::new(crate::isolate::STATE_DIR))
}

impl ThrottlingOff {
    /// Turns the kernel's RT throttling off for the run, after checking for root, with a
    /// warning in `warnings`.
    pub fn for_run(warnings: &mut Warnings, quiet: bool) -> Result<Self> {
        // SAFETY: `geteuid` has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        if euid != 0 {
            bail!(
                "--no-rt-throttling needs root: it writes -1 to {RUNTIME_PATH} (running as uid \
                 {euid}); leave the flag out, or run as root"
            );
        }
        let off = Self::recorded_at(
            Path::new(RUNTIME_PATH),
            Some(Path::new(crate::isolate::STATE_DIR)),
        )?;
        warnings.push(
            quiet,
            format!(
                "RT throttling is off for this run ({RUNTIME_PATH} = -1, was {}): a SCHED_FIFO \
                 task that never sleeps may keep its CPU for as long as it runs; restored at \
                 exit. Since Linux 6.12 the fair server ({FAIR_SERVER}cpu<N>/runtime in \
                 debugfs, 50 ms of each 1 s by default) still lets a starved SCHED_OTHER worker \
                 in whatever this says: where it is on, drains still complete after about 0.95 s",
                off.saved.trim()
            ),
        );
        Ok(off)
    }

    /// Writes -1 to the sysctl file at `path`, keeping its value to restore; nothing is
    /// recorded for the next run (see [`Self::recorded_at`]).
    pub fn at(path: &Path) -> Result<Self> {
        Self::recorded_at(path, None)
    }

    /// Writes -1 to the sysctl file at `path`, after recording in `records` (when given) the
    /// value to put back, so that the next run puts it back if this one is killed.
    pub fn recorded_at(path: &Path, records: Option<&Path>) -> Result<Self> {
        let lock = records.map(DirLock::take).transpose()?;
        let found = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if found.trim().parse::<i64>().is_err() {
            return Err(anyhow!(
                "{} reads {:?}, not a number of microseconds",
                path.display(),
                found.trim()
            ));
        }
        // Another run of ours that has it off recorded what was there before it: that is the
        // value to put back, not its -1.
        let others = records.map(records_in).unwrap_or_default();
        let saved = others
            .iter()
            .find(|(_, r, _)| r.path == path && found.trim() == "-1")
            .map_or(found, |(_, r, _)| r.saved.clone());
        if let Some(dir) = records {
            let record = Record {
                pid: std::process::id(),
                path: path.to_path_buf(),
                saved: saved.clone(),
            };
            let file = record_file(dir, record.pid);
            let aside = file.with_extension("json.tmp");
            std::fs::write(&aside, serde_json::to_string(&record)?)
                .and_then(|()| std::fs::rename(&aside, &file))
                .with_context(|| {
                    format!(
                        "cannot record RT throttling's value in {} before turning it off \
                         (nothing was changed)",
                        file.display()
                    )
                })?;
        }
        if let Err(e) = std::fs::write(path, "-1") {
            if let Some(dir) = records {
                let _ = std::fs::remove_file(record_file(dir, std::process::id()));
            }
            return Err(e).with_context(|| format!("cannot write -1 to {}", path.display()));
        }
        drop(lock);
        let off = Self {
            path: path.to_path_buf(),
            saved,
            records: records.map(Path::to_path_buf),
            restored: Arc::new(AtomicBool::new(false)),
        };
        // A second Ctrl-C ends the process without running `Drop`: restore then too (once).
        let (hook_path, hook_saved, hook_records, hook_restored) = (
            off.path.clone(),
            off.saved.clone(),
            off.records.clone(),
            off.restored.clone(),
        );
        crate::signals::on_forced_exit(Box::new(move || {
            let _ = restore(
                &hook_path,
                &hook_saved,
                hook_records.as_deref(),
                &hook_restored,
            );
        }));
        Ok(off)
    }
}

/// Writes `saved` back to `path` (once: `restored` says whether it was done), unless another
/// live run recorded in `records` has RT throttling off still; removes this run's record.
fn restore(
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
    let others_live = records_in(dir)
        .iter()
        .any(|(_, r, gone)| !gone && r.pid != me && r.path == path);
    let out = if others_live {
        Ok(())
    } else {
        std::fs::write(path, saved)
    };
    if out.is_ok() {
        let _ = std::fs::remove_file(record_file(dir, me));
        // The directory too, unless another run's record is in it.
        let _ = std::fs::remove_dir(dir);
    }
    out
}

impl Drop for ThrottlingOff {
    fn drop(&mut self) {
        if let Err(e) = restore(
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

    #[test]
    fn the_guard_writes_minus_one_and_restores_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sched_rt_runtime_us");
        std::fs::write(&path, "950000\n").unwrap();
        let off = ThrottlingOff::at(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "-1");
        drop(off);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "950000\n");
    }

    #[test]
    fn the_guard_restores_when_the_run_fails() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sched_rt_runtime_us");
        std::fs::write(&path, "800000\n").unwrap();
        let run = || -> Result<()> {
            let _off = ThrottlingOff::at(&path)?;
            assert_eq!(std::fs::read_to_string(&path)?, "-1");
            bail!("the probe failed")
        };
        assert!(run().is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "800000\n");
    }

    /// A pid that is not running: a child that has been reaped.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn the_value_is_recorded_before_it_is_changed_and_a_killed_runs_is_put_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sched_rt_runtime_us");
        let records = dir.path().join("state");
        std::fs::write(&path, "950000\n").unwrap();
        let off = ThrottlingOff::recorded_at(&path, Some(&records)).unwrap();
        let mine = record_file(&records, std::process::id());
        let r: Record = serde_json::from_str(&std::fs::read_to_string(&mine).unwrap()).unwrap();
        assert_eq!(r.saved, "950000\n");
        // What a SIGKILL leaves: the guard never dropped, the record now a dead run's.
        std::mem::forget(off);
        let pid = dead_pid();
        let dead = record_file(&records, pid);
        let text = std::fs::read_to_string(&mine).unwrap().replace(
            &format!("\"pid\":{}", std::process::id()),
            &format!("\"pid\":{pid}"),
        );
        std::fs::write(&dead, text).unwrap();
        std::fs::remove_file(&mine).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "-1");
        let lines = recover_stale_in(&records);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "950000\n");
        assert!(lines[0].contains("set back to 950000"), "{lines:?}");
        assert!(!dead.exists() && !records.exists());
        // Nothing more to do the next time.
        assert!(recover_stale_in(&records).is_empty());
    }

    #[test]
    fn overlapping_runs_put_back_the_value_from_before_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sched_rt_runtime_us");
        let records = dir.path().join("state");
        std::fs::write(&path, "950000\n").unwrap();
        // A live run (this process, under another record) turned it off first.
        let first = ThrottlingOff::recorded_at(&path, Some(&records)).unwrap();
        let live = records.join("rt-throttling-1.json");
        std::fs::rename(record_file(&records, std::process::id()), &live).unwrap();
        let text = std::fs::read_to_string(&live)
            .unwrap()
            .replace(&format!("\"pid\":{}", std::process::id()), "\"pid\":1");
        std::fs::write(&live, text).unwrap();
        std::mem::forget(first);
        // The second finds -1, and takes the first's value to put back.
        let second = ThrottlingOff::recorded_at(&path, Some(&records)).unwrap();
        assert_eq!(second.saved, "950000\n");
        // It ends while the first (pid 1 lives) still has it off: left off.
        drop(second);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "-1");
        std::fs::remove_file(&live).unwrap();
    }

    #[test]
    fn a_file_that_is_not_a_number_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sched_rt_runtime_us");
        std::fs::write(&path, "lots\n").unwrap();
        let e = ThrottlingOff::at(&path).unwrap_err().to_string();
        assert!(e.contains("not a number"), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "lots\n");
    }

    #[test]
    fn the_line_says_on_off_or_unknown() {
        let on = RtThrottling {
            runtime_us: Some(950_000),
            period_us: Some(1_000_000),
            restored_to_us: None,
        };
        assert!(
            on.line().contains("on, sched_rt_runtime_us 950000"),
            "{}",
            on.line()
        );
        assert!(on.line().contains("0.950 s"), "{}", on.line());
        let off = RtThrottling {
            runtime_us: Some(-1),
            period_us: Some(1_000_000),
            restored_to_us: Some(950_000),
        };
        assert_eq!(
            off.line(),
            "RT throttling: off for this run (restored to 950000 at exit)"
        );
        assert!(RtThrottling::default().line().contains("unknown"));
    }
}
