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
//! `/run/qpw-emu/rt-throttling-<pid>.json`, and every later `qpw-emu` started as root puts back
//! what a run that no longer exists recorded ([`recover_stale`]), and says so; runs that overlap
//! share the setting, and only the last one to end writes it back. The mechanism is
//! [`crate::setting`]'s, which kernel-pcp's huge-page pool shares.
//!
//! Since Linux 6.12 the relief comes from the *fair server* (a deadline server that gives
//! `SCHED_OTHER` tasks 50 ms of each second on a CPU an RT task hogs, set per CPU in debugfs
//! under `sched/fair_server/`), not from the RT budget alone: on this machine's 6.18 kernel
//! `sched_rt_runtime_us = -1` leaves drains against a FIFO probe completing after about 0.95 s
//! all the same, and the fair server's files refuse even root. The flag still writes the sysctl
//! (the knob of older kernels and of RT group scheduling) and its warning says this.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::setting::{Changed, Kind};
use crate::sink::Sink;

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
            restored_to_us: off.and_then(|o| o.saved().trim().parse().ok()),
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
/// live run still has it off (a [`Changed`] setting, see [`crate::setting`]).
#[derive(Debug)]
#[must_use = "throttling is restored when the guard is dropped"]
pub struct ThrottlingOff {
    changed: Changed,
}

/// Puts back RT throttling where a run killed before it could left it off (and the other
/// settings of [`crate::setting`]); done at the start of every command run as root. Returns a
/// line for each.
pub fn recover_stale() -> Vec<String> {
    crate::setting::recover_stale()
}

impl ThrottlingOff {
    /// Turns the kernel's RT throttling off for the run, after checking for root, with a
    /// warning in `warnings`.
    pub fn for_run(sink: &mut Sink) -> Result<Self> {
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
        sink.warn(format!(
            "RT throttling is off for this run ({RUNTIME_PATH} = -1, was {}): a SCHED_FIFO \
                 task that never sleeps may keep its CPU for as long as it runs; restored at \
                 exit. Since Linux 6.12 the fair server ({FAIR_SERVER}cpu<N>/runtime in \
                 debugfs, 50 ms of each 1 s by default) still lets a starved SCHED_OTHER worker \
                 in whatever this says: where it is on, drains still complete after about 0.95 s",
            off.saved().trim()
        ));
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
        let changed = Changed::record(
            Kind::RtThrottling,
            path,
            |found| {
                if found.trim().parse::<i64>().is_err() {
                    return Err(anyhow!(
                        "{} reads {:?}, not a number of microseconds",
                        path.display(),
                        found.trim()
                    ));
                }
                Ok("-1".to_string())
            },
            records,
        )?;
        if let Err(e) = changed.write_changed() {
            changed.forget();
            return Err(e).with_context(|| format!("cannot write -1 to {}", path.display()));
        }
        Ok(Self { changed })
    }

    /// The value found, which is put back.
    pub fn saved(&self) -> &str {
        self.changed.saved()
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
