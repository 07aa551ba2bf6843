//! Ctrl-C as the real tools take it: the run stops, prints and writes what it measured, marks
//! itself interrupted (our JSON and table), and exits 0 as oslat and cyclictest do; a second
//! signal ends it at once.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A default run long enough to be interrupted: ten rounds of 20 s of the cheapest workload.
const LONG_RUN: [&str; 8] = [
    "run",
    "-D",
    "20s",
    "--rounds",
    "10",
    "--workloads",
    "counter",
    "-q",
];

fn spawn(args: &[&str]) -> Child {
    Command::new(assert_cmd::cargo::cargo_bin("qpw-emu"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qpw-emu starts")
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill() with the pid of a child we started and have not reaped.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0);
}

/// Waits until `path` exists (the run got that far), at most `limit`.
fn wait_for_file(path: &Path, limit: Duration) {
    let start = Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < limit, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn oslat_ctrl_c_prints_the_summary_and_marks_the_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("o.json");
    let json_arg = format!("--json={}", json.display());
    let child = spawn(&["oslat", "-c", "1", "-D", "60", "-q", &json_arg]);
    // Past the one-second pre-heat, into the measuring.
    std::thread::sleep(Duration::from_millis(1800));
    signal(&child, libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("     Maximum:\t"), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("# qpw-emu: interrupted (SIGINT)") && !stdout.contains("# qpw-emu"),
        "our lines go to stderr:\n{stdout}\n{stderr}"
    );
    let v = read_json(&json);
    assert_eq!(v["interrupted"], true);
    assert_eq!(v["return_code"], 0);
    assert!(v["thread"]["0"]["duration"].as_f64().unwrap() < 30.0);
}

#[test]
fn cyclictest_without_duration_runs_until_ctrl_c() {
    let child = spawn(&["cyclictest", "-q", "-p", "80"]);
    std::thread::sleep(Duration::from_millis(1500));
    // Still running: cyclictest's default is no end.
    signal(&child, libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let t = stdout.lines().find(|l| l.starts_with("T: 0")).unwrap();
    let cycles: u64 = t
        .split("C:")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert!(cycles >= 500, "ran about 1.5 s at 1 ms: {t}");
}

#[test]
fn run_ctrl_c_marks_the_table_and_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let child = spawn(&[LONG_RUN.as_slice(), &["--out", out_dir]].concat());
    // The idle scenario's first round is written; the next one is running.
    wait_for_file(&dir.path().join("idle.json"), Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(700));
    signal(&child, libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("INTERRUPTED (Ctrl-C) in round 1 of 10"),
        "{stdout}"
    );
    assert!(stdout.contains("! cut short by Ctrl-C"), "{stdout}");
    let marked = stdout
        .lines()
        .any(|l| l.contains(" | ") && l.split_whitespace().next().unwrap().ends_with('!'));
    assert!(marked, "{stdout}");
    let summary = read_json(&dir.path().join("summary.json"));
    assert_eq!(summary["interrupted"], true);
}

#[test]
fn a_second_signal_ends_the_run_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let child = spawn(&[LONG_RUN.as_slice(), &["--out", out_dir]].concat());
    wait_for_file(&dir.path().join("idle.json"), Duration::from_secs(30));
    signal(&child, libc::SIGINT);
    signal(&child, libc::SIGTERM);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("second interrupt"), "{stderr}");
}

/// `timeout` sends its SIGTERM to the command and then to the command's process group, so the
/// run gets it twice at once: that is one request to stop, and the results are still written
/// (before, the second copy counted as a second Ctrl-C and the run ended with nothing).
#[test]
fn timeouts_double_sigterm_is_one_request_and_the_results_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("timeout")
        .args([
            "6",
            assert_cmd::cargo::cargo_bin("qpw-emu").to_str().unwrap(),
        ])
        .args(LONG_RUN)
        .arg("--out")
        .arg(dir.path())
        .output()
        .expect("timeout(1) runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // 124: timeout's own status for a command it had to stop.
    assert_eq!(out.status.code(), Some(124), "{stdout}\n{stderr}");
    assert!(!stderr.contains("second interrupt"), "{stderr}");
    assert!(
        stdout.contains("INTERRUPTED (SIGTERM) in round"),
        "{stdout}"
    );
    let summary = read_json(&dir.path().join("summary.json"));
    assert_eq!(summary["interrupted"], true, "{stdout}");
}

/// The same double delivery, made certain: the second SIGTERM comes after the first has been
/// taken. It is still one request; and the stop is reported as a SIGTERM.
#[test]
fn a_repeated_sigterm_stops_cleanly_and_is_named() {
    let child = spawn(&["oslat", "-c", "1", "-D", "60", "-q"]);
    std::thread::sleep(Duration::from_millis(1800));
    signal(&child, libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(20));
    signal(&child, libc::SIGTERM);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("# qpw-emu: interrupted (SIGTERM)"),
        "{stderr}"
    );
}
