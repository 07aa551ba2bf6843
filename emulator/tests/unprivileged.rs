//! The emulator as an ordinary user runs it: without the rights a real-time tool wants
//! (`CAP_IPC_LOCK`, `CAP_SYS_NICE`) and under an ordinary user's limits (`RLIMIT_MEMLOCK`
//! 8 MiB, `RLIMIT_RTPRIO` 0). Every command must complete, with one warning per missing right
//! that names it and how to get it, and the warnings must be in the JSON.
//!
//! The limits are lowered in the child with `setrlimit`, so these tests need no root. Run as
//! root they also empty the child's capability bounding set before it execs, so that root's
//! capabilities (which lift both limits) are gone in the emulator too.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

const MIB: u64 = 1 << 20;

/// `qpw-emu` with `args`, as an ordinary user: memlock 8 MiB, rtprio 0, no capabilities.
fn unprivileged(args: &[&str], dir: &Path) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qpw-emu"));
    cmd.args(args).current_dir(dir);
    // SAFETY: the closure runs in the forked child before exec and calls only `setrlimit` and
    // `prctl`, which are async-signal-safe system calls; it allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            let set = |resource, value: u64| {
                let lim = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                if libc::setrlimit(resource, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            };
            set(libc::RLIMIT_MEMLOCK, 8 * MIB)?;
            set(libc::RLIMIT_RTPRIO, 0)?;
            if libc::geteuid() == 0 {
                // Root regains every capability in its bounding set at exec: empty it.
                for cap in 0..64 {
                    libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
                }
            }
            Ok(())
        });
    }
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("qpw-emu starts");
    wait_with_deadline(child, Duration::from_secs(120))
}

/// Waits for `child`, killing it (and failing) past `deadline`.
fn wait_with_deadline(mut child: std::process::Child, deadline: Duration) -> Output {
    let start = std::time::Instant::now();
    loop {
        if child.try_wait().expect("wait works").is_some() {
            return child.wait_with_output().expect("output is read");
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            panic!("qpw-emu ran past {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The run completed (exit 0, no abort) and warned, once, about memory locking.
fn completed_with_warnings(out: &Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(
        !stderr.contains("memory allocation") && !stderr.contains("panicked"),
        "{what} aborted or panicked:\n{stderr}"
    );
    assert_eq!(
        stderr
            .matches("warning: memory locked only in part")
            .count()
            + stderr.matches("warning: memory not locked").count(),
        1,
        "{what}: one warning about memory locking:\n{stderr}"
    );
    assert!(
        stderr.contains("RLIMIT_MEMLOCK is 8.0 MiB"),
        "{what}: the warning names the limit:\n{stderr}"
    );
    stderr
}

fn fifo_refused_once(stderr: &str, what: &str) {
    let refusals = stderr
        .lines()
        .filter(|l| l.starts_with("warning:") && l.contains("runs SCHED_OTHER"))
        .collect::<Vec<_>>();
    assert_eq!(
        refusals.len(),
        1,
        "{what}: one SCHED_FIFO warning:\n{stderr}"
    );
    assert!(
        refusals[0].contains("RLIMIT_RTPRIO is 0") && refusals[0].contains("ulimit -r"),
        "{what}: the warning says how to get SCHED_FIFO: {}",
        refusals[0]
    );
}

fn warnings_of(json: &Value) -> Vec<String> {
    json["warnings"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|w| w.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn smoke_default_experiment_completes_with_its_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let out = unprivileged(
        &[
            "run",
            "-D",
            "600ms",
            "--rounds",
            "1",
            "--workloads",
            "lru",
            "-f",
            "80",
            "--out",
            "res",
        ],
        dir.path(),
    );
    let stderr = completed_with_warnings(&out, "qpw-emu run");
    fifo_refused_once(&stderr, "qpw-emu run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("remote-lru"),
        "the table is printed:\n{stdout}"
    );
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("res/summary.json")).unwrap(),
    )
    .unwrap();
    let warnings = warnings_of(&summary);
    assert!(
        warnings.iter().any(|w| w.contains("RLIMIT_MEMLOCK"))
            && warnings.iter().any(|w| w.contains("SCHED_OTHER")),
        "the JSON records the warnings: {warnings:?}"
    );
}

#[test]
fn oslat_with_fifo_and_a_load_completes() {
    let dir = tempfile::tempdir().unwrap();
    let cpu = last_cpu();
    let out = unprivileged(
        &[
            "oslat",
            "-c",
            &cpu,
            "-D",
            "1",
            "-f",
            "80",
            "--mode",
            "queue",
            "--drain-workload",
            "lru",
            "--json",
            "o.json",
        ],
        dir.path(),
    );
    let stderr = completed_with_warnings(&out, "qpw-emu oslat -f 80");
    fifo_refused_once(&stderr, "qpw-emu oslat -f 80");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("o.json")).unwrap()).unwrap();
    assert!(warnings_of(&json)
        .iter()
        .any(|w| w.contains("RLIMIT_MEMLOCK")));
}

#[test]
fn cyclictest_with_mlock_and_fifo_completes() {
    let dir = tempfile::tempdir().unwrap();
    let cpu = last_cpu();
    let out = unprivileged(
        &[
            "cyclictest",
            "-a",
            &cpu,
            "-m",
            "-p",
            "80",
            "-i",
            "1000",
            "-D",
            "1",
        ],
        dir.path(),
    );
    let stderr = completed_with_warnings(&out, "qpw-emu cyclictest -m -p 80");
    fifo_refused_once(&stderr, "qpw-emu cyclictest -m -p 80");
}

#[test]
fn load_completes() {
    let dir = tempfile::tempdir().unwrap();
    let out = unprivileged(
        &["load", "--mode", "queue", "--workload", "lru", "-D", "1"],
        dir.path(),
    );
    completed_with_warnings(&out, "qpw-emu load");
}

/// The last CPU this process may run on, as text.
fn last_cpu() -> String {
    qpw_core::allowed_cpus()
        .ok()
        .and_then(|c| c.last())
        .unwrap_or(0)
        .to_string()
}
