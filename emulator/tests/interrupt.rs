//! Ctrl-C as the real tools take it: the run stops, prints and writes what it measured, marks
//! itself interrupted (our JSON and table), and exits 0 as oslat and cyclictest do; a second
//! signal ends it at once.
//!
//! Each test signals the run once it has *seen* the run get where the signal should land (a
//! line on its output, a file it wrote), never after a fixed sleep: on a busy machine a run
//! may take seconds to get there, and a signal that comes before the run takes it ends the
//! process instead. The waits are bounded only to turn a hang into a failure ([`WATCHDOG`]).

use std::io::BufRead as _;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a wait for something the run must get to may last before it counts as a hang: far
/// beyond what a busy machine needs (seconds), since it only decides when something is wrong.
const WATCHDOG: Duration = Duration::from_secs(120);

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

/// Waits until `path` exists (the run got that far); a hang past [`WATCHDOG`] fails.
fn wait_for_file(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < WATCHDOG,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `child` has a thread named `name` now.
fn has_thread(child: &Child, name: &str) -> bool {
    let tasks = format!("/proc/{}/task", child.id());
    std::fs::read_dir(tasks)
        .into_iter()
        .flatten()
        .flatten()
        .any(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name))
}

/// Waits until `child` has a thread named `name` (the run got to the step that starts it); a
/// hang past [`WATCHDOG`] fails.
fn wait_for_thread(child: &Child, name: &str) {
    let start = Instant::now();
    while !has_thread(child, name) {
        assert!(start.elapsed() < WATCHDOG, "no thread {name} ever started");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A run whose standard output is read line by line as it comes, so that a test can wait for
/// what the run says it is doing.
struct Watched {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// Reads stdout to its end; returns all of it.
    reader: JoinHandle<String>,
}

impl Watched {
    fn spawn(args: &[&str]) -> Self {
        let mut child = spawn(args);
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, lines) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut all = String::new();
            let mut stdout = std::io::BufReader::new(stdout);
            let mut line = Vec::new();
            while stdout.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                let text = String::from_utf8_lossy(&line).into_owned();
                all.push_str(&text);
                let _ = tx.send(text);
                line.clear();
            }
            all
        });
        Self {
            child,
            lines,
            reader,
        }
    }

    /// Waits for the first line of stdout for which `seen` is true, and returns it. Fails if
    /// the run's stdout ends first, or after [`WATCHDOG`] (a hang).
    fn wait_for_line(&self, what: &str, seen: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WATCHDOG;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if seen(&line) => return line,
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("{what}: not seen after {WATCHDOG:?}, a hang")
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("{what}: the run's output ended first")
                }
            }
        }
    }

    /// Waits for the run to end; its status, all of its stdout and its stderr.
    fn finish(self) -> (ExitStatus, String, String) {
        let out = self.child.wait_with_output().unwrap();
        let stdout = self.reader.join().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status, stdout, stderr)
    }
}

/// The cycle count of a `T: 0 ... C: n ...` status line of cyclictest.
fn cycles_of(line: &str) -> Option<u64> {
    line.split("C:")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// oslat's line once every probe thread measures (after the pre-heat).
fn measuring(line: &str) -> bool {
    line.trim_end() == "Test starts..."
}

#[test]
fn oslat_ctrl_c_prints_the_summary_and_marks_the_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("o.json");
    let json_arg = format!("--json={}", json.display());
    let run = Watched::spawn(&["oslat", "-c", "1", "-D", "60", &json_arg]);
    // Past the one-second pre-heat, into the measuring.
    run.wait_for_line("oslat's `Test starts...`", measuring);
    signal(&run.child, libc::SIGINT);
    let (status, stdout, stderr) = run.finish();
    assert_eq!(status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("     Maximum:\t"), "{stdout}");
    assert!(
        stderr.contains("# qpw-emu: interrupted (SIGINT)") && !stdout.contains("# qpw-emu"),
        "our lines go to stderr:\n{stdout}\n{stderr}"
    );
    let v = read_json(&json);
    assert_eq!(v["interrupted"], true);
    assert_eq!(v["return_code"], 0);
    // Cut short: the signal came at the start of a 60 s run (30 s is a margin for a busy
    // machine's slowest reaction, not a timing claim).
    assert!(v["thread"]["0"]["duration"].as_f64().unwrap() < 30.0);
}

#[test]
fn cyclictest_without_duration_runs_until_ctrl_c() {
    // Not -q: the status lines show the cycles as they grow.
    let run = Watched::spawn(&["cyclictest", "-p", "80"]);
    // Still running after 500 wake-ups (about half a second at 1 ms, however long a busy
    // machine takes for them): cyclictest's default is no end.
    let line = run.wait_for_line("500 cycles of thread 0", |l| {
        l.contains("T: 0 ") && cycles_of(l).is_some_and(|c| c >= 500)
    });
    let seen = cycles_of(&line).unwrap();
    signal(&run.child, libc::SIGINT);
    let (status, stdout, _) = run.finish();
    assert_eq!(status.code(), Some(0), "{stdout}");
    let last = stdout.lines().rfind(|l| l.contains("T: 0 ")).unwrap();
    let cycles = cycles_of(last).unwrap();
    assert!(
        cycles >= seen,
        "the summary's {cycles} cycles, after {seen} were shown: {last}"
    );
}

#[test]
fn run_ctrl_c_marks_the_table_and_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let child = spawn(&[LONG_RUN.as_slice(), &["--out", out_dir]].concat());
    // The idle scenario's first round is written, and the next scenario (the first with a
    // requester) is running: the signal cuts it short. Round 1 lasts five scenarios of 2 s.
    wait_for_file(&dir.path().join("idle.json"));
    wait_for_thread(&child, "qpw-requester");
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
    wait_for_file(&dir.path().join("idle.json"));
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
///
/// `timeout` is told its time is up by the SIGALRM its own timer would send, once the run has
/// written its first results: it then does what it does at the end of its time (SIGTERM to the
/// run and to the group, status 124), at a point of the run the test has seen, not after a
/// fixed 6 s that a busy machine may spend starting up.
#[test]
fn timeouts_double_sigterm_is_one_request_and_the_results_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let timeout = Command::new("timeout")
        .args([
            "300",
            assert_cmd::cargo::cargo_bin("qpw-emu").to_str().unwrap(),
        ])
        .args(LONG_RUN)
        .arg("--out")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("timeout(1) runs");
    wait_for_file(&dir.path().join("idle.json"));
    signal(&timeout, libc::SIGALRM);
    let out = timeout.wait_with_output().unwrap();
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
    let run = Watched::spawn(&["oslat", "-c", "1", "-D", "60"]);
    run.wait_for_line("oslat's `Test starts...`", measuring);
    signal(&run.child, libc::SIGTERM);
    // Past the same-request window, while the run winds down. (Where a busy machine delays
    // this thread until the run has ended, the second signal finds a zombie and the test shows
    // less, never a false failure.)
    std::thread::sleep(Duration::from_millis(20));
    signal(&run.child, libc::SIGTERM);
    let (status, stdout, stderr) = run.finish();
    assert_eq!(status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("# qpw-emu: interrupted (SIGTERM)"),
        "{stderr}"
    );
}
