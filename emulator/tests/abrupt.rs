//! Every way a run can end leaves the system as it found it (issue 45 point 1): a hung-up
//! terminal (SIGHUP) is a request to stop as SIGINT and SIGTERM are; a SIGPIPE is ignored; a
//! standard output whose reader has gone stops the run in order, instead of killing it at its
//! next write; and a run killed with SIGKILL while RT throttling was off has it put back by the
//! next run, which says so.
//!
//! Each run here turns RT throttling off (`--no-rt-throttling`, root) and, where tracefs and a
//! memory cgroup exist, traces and runs kernel-memcg (a tracefs mount or instance, a cgroup and
//! a filler process to leave behind); after each, the sysctl must read as before and
//! [`state::leftovers`] must find nothing. The tests hold [`SYSCTL`], so that two never save
//! each other's -1 as the value to put back, and a [`Restore`] guard puts the sysctl back
//! should qpw-emu fail to. A signal is sent once the run is seen where it must land, never
//! after a fixed sleep; the waits are bounded only to turn a hang into a failure.

use std::io::BufRead as _;
use std::os::fd::{FromRawFd as _, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;

mod state;
use state::{leftovers, signal, sysctl, wait_bounded, wait_until, Restore};

/// Held by every test here: each writes the sysctl.
static SYSCTL: Mutex<()> = Mutex::new(());

fn emu() -> Command {
    Command::new(env!("CARGO_BIN_EXE_qpw-emu"))
}

/// Root and two CPUs, or a line saying why the test has nothing to show.
fn setup(test: &str) -> Option<usize> {
    if !state::is_root() {
        eprintln!("{test}: skipped: --no-rt-throttling needs root");
        return None;
    }
    let cpu = state::target();
    if cpu.is_none() {
        eprintln!("{test}: skipped: one CPU, no room for the requester");
    }
    state::become_subreaper();
    cpu
}

/// `oslat` on `cpu` for `seconds` with RT throttling off, writing `json`, and, where it can,
/// traced under kernel-memcg's drains (kernel-vmstat without a memory cgroup).
fn heavy_oslat(cpu: usize, seconds: &str, json: &Path, quiet: bool) -> Command {
    let mut c = emu();
    c.args(["oslat", "-c", &cpu.to_string(), "-D", seconds])
        .arg("--no-rt-throttling")
        .arg("--json")
        .arg(json);
    if quiet {
        c.arg("-q");
    }
    if state::has_tracefs() {
        let workload = if state::has_memcg() {
            "kernel-memcg"
        } else {
            "kernel-vmstat"
        };
        c.args(["--trace", "--drain-workload", workload]);
    }
    c
}

/// Whether the run of `pid` has set up everything it changes: throttling off, and with a trace
/// its instance (and the kernel load's requester thread running).
fn set_up(pid: u32) -> bool {
    sysctl() == "-1"
        && (!state::has_tracefs() || state::has_thread(pid, "qpw-kernel-requ"))
        && (!state::has_tracefs() || !leftovers(pid).is_empty())
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}: the run wrote no JSON", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The checks after a run that was asked to stop by `how`: it ended with status 0, its JSON is
/// marked interrupted by `how`, and the system is as before.
fn ended_in_order(status: std::process::ExitStatus, stderr: &str, json: &Path, how: &str) {
    assert_eq!(status.code(), Some(0), "{status}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let v = read_json(json);
    assert_eq!(v["interrupted"], true, "{v}");
    assert_eq!(
        v["stopped_by"].as_str(),
        Some(format!("interrupted ({how})").as_str())
    );
}

fn stderr_of(child: &mut std::process::Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read as _;
        let _ = e.read_to_string(&mut s);
    }
    s
}

/// A heavy oslat run of `seconds` on `cpu`, sent `sig` (named `name`) once set up, with its
/// JSON in `dir`: its exit status, its standard error and its JSON's path, once it has been
/// checked to have put RT throttling back and to have left nothing behind.
fn signalled(
    cpu: usize,
    seconds: &str,
    (sig, name): (libc::c_int, &str),
    dir: &Path,
) -> (std::process::ExitStatus, String, std::path::PathBuf) {
    let _one = SYSCTL.lock().unwrap_or_else(|e| e.into_inner());
    let before = sysctl();
    let _restore = Restore(before.clone());
    let json = dir.join("o.json");
    let mut child = heavy_oslat(cpu, seconds, &json, true)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    wait_until(&mut child, "the run's set-up", || set_up(pid));
    signal(&child, sig);
    let status = wait_bounded(&mut child, &format!("after {name}"));
    let stderr = stderr_of(&mut child);
    assert_eq!(sysctl(), before, "RT throttling put back after {name}");
    assert_eq!(leftovers(pid), Vec::<String>::new(), "{stderr}");
    (status, stderr, json)
}

#[test]
fn sighup_stops_a_run_in_order_and_puts_everything_back() {
    let Some(cpu) = setup("sighup") else { return };
    let dir = tempfile::tempdir().unwrap();
    let (status, stderr, json) = signalled(cpu, "60", (libc::SIGHUP, "SIGHUP"), dir.path());
    ended_in_order(status, &stderr, &json, "SIGHUP");
}

#[test]
fn a_sigpipe_is_ignored_and_the_run_goes_on_to_its_end() {
    let Some(cpu) = setup("sigpipe") else { return };
    let dir = tempfile::tempdir().unwrap();
    let (status, stderr, json) = signalled(cpu, "3", (libc::SIGPIPE, "SIGPIPE"), dir.path());
    assert_eq!(status.code(), Some(0), "{status}: {stderr}");
    // Not a request to stop: the run measured its whole time.
    assert_eq!(read_json(&json)["interrupted"], false);
}

#[test]
fn a_closed_stdout_stops_the_run_in_order() {
    let Some(cpu) = setup("closed stdout") else {
        return;
    };
    let _one = SYSCTL.lock().unwrap_or_else(|e| e.into_inner());
    let before = sysctl();
    let _restore = Restore(before.clone());
    let dir = tempfile::tempdir().unwrap();

    // `| head -1`: the reader takes the first line and goes, while the run is under way.
    let json = dir.path().join("o.json");
    let mut child = heavy_oslat(cpu, "60", &json, false)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert_eq!(first.trim_end(), "oslat V 2.40");
    drop(stdout);
    let status = wait_bounded(&mut child, "after its stdout closed");
    let stderr = stderr_of(&mut child);
    assert_eq!(sysctl(), before, "RT throttling put back: {stderr}");
    assert_eq!(leftovers(pid), Vec::<String>::new(), "{stderr}");
    ended_in_order(status, &stderr, &json, "stdout closed");

    // A reader gone before the first line: `qpw-emu trace` stops at its first write, after it
    // has made its tracefs mount and instance, and removes them.
    if !state::has_tracefs() {
        return;
    }
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors `pipe` writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors were just made and are owned here alone.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read_end);
    let json = dir.path().join("t.json");
    let mut child = emu()
        .args(["trace", "-c", &cpu.to_string(), "-D", "60", "--json"])
        .arg(&json)
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let status = wait_bounded(&mut child, "trace with its stdout closed");
    let stderr = stderr_of(&mut child);
    assert_eq!(status.code(), Some(0), "{status}: {stderr}");
    assert_eq!(leftovers(pid), Vec::<String>::new(), "{stderr}");
    assert!(json.exists(), "trace wrote no JSON: {stderr}");
}

#[test]
fn a_run_killed_with_throttling_off_has_it_put_back_by_the_next() {
    let Some(cpu) = setup("sigkill") else { return };
    let _one = SYSCTL.lock().unwrap_or_else(|e| e.into_inner());
    let before = sysctl();
    let _restore = Restore(before.clone());
    let dir = tempfile::tempdir().unwrap();
    let mut child = emu()
        .args(["oslat", "-c", &cpu.to_string(), "-D", "60", "-q"])
        .arg("--no-rt-throttling")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    wait_until(&mut child, "RT throttling off", || sysctl() == "-1");
    signal(&child, libc::SIGKILL);
    let _ = child.wait();
    assert_eq!(sysctl(), "-1", "a SIGKILL runs no clean-up");

    // The next run, any run as root, puts it back and says so.
    let out = emu()
        .args([
            "oslat",
            "-c",
            &cpu.to_string(),
            "-D",
            "100ms",
            "-q",
            "--json",
        ])
        .arg(dir.path().join("next.json"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(sysctl(), before, "{stderr}");
    assert!(
        stderr.contains(&format!("a run (pid {pid}) ended without putting back"))
            && stderr.contains(&format!("set back to {before}")),
        "{stderr}"
    );
    assert_eq!(leftovers(pid), Vec::<String>::new());
}

/// The threads of process `pid` whose names start with `prefix`.
fn threads_named(pid: u32, prefix: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .count()
}

/// `-D` ends a run whose last thread sleeps 200 s between wake-ups (`-t 20 -d 10000000`):
/// the threads asleep are woken, as cyclictest 2.4 wakes them; before, the run ended only when
/// the longest sleep did (a hang, for the watchdog).
#[test]
fn cyclictest_ends_at_its_duration_whatever_the_intervals() {
    let mut child = emu()
        .args([
            "cyclictest",
            "-q",
            "-D",
            "500ms",
            "-t",
            "20",
            "-d",
            "10000000",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_bounded(&mut child, "cyclictest -D 500ms -t 20 -d 10000000");
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(status.code(), Some(0), "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("T:")).count(), 20);
}

/// Ctrl-C ends such a run too, at once, however long its threads' sleeps.
#[test]
fn cyclictest_ends_at_ctrl_c_whatever_the_intervals() {
    let mut child = emu()
        .args(["cyclictest", "-q", "-t", "20", "-d", "10000000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    wait_until(&mut child, "the 20 threads", || {
        threads_named(pid, "cyclictest/") == 20
    });
    signal(&child, libc::SIGINT);
    let status = wait_bounded(&mut child, "cyclictest -t 20 -d 10000000 after SIGINT");
    let stderr = stderr_of(&mut child);
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("interrupted (SIGINT)"), "{stderr}");
}

/// A signal while thousands of threads start stops the start-up (before, `-t 4096` took
/// SIGTERM only once all had started, 45 s on a 2-CPU machine).
#[test]
fn a_signal_during_the_set_up_of_many_threads_stops_it() {
    // One wake-up a second: the threads that started do not load the machine.
    let mut child = emu()
        .args([
            "cyclictest",
            "-q",
            "-D",
            "60",
            "-t",
            "4096",
            "-i",
            "1000000",
            "-d",
            "0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    wait_until(&mut child, "64 threads started", || {
        threads_named(pid, "cyclictest/") >= 64
    });
    signal(&child, libc::SIGTERM);
    let status = wait_bounded(&mut child, "cyclictest -t 4096 after SIGTERM");
    let stderr = stderr_of(&mut child);
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("interrupted (SIGTERM)"), "{stderr}");
}

/// A path that is not UTF-8 is a path (issue 45 point 2): the run writes its JSON there, and
/// the command line in it escapes the byte, where the JSON writer panicked after the run.
#[test]
fn an_output_path_that_is_not_utf8_is_written() {
    use std::os::unix::ffi::OsStrExt as _;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join(std::ffi::OsStr::from_bytes(b"x\xff.json"));
    let out = emu()
        .args(["oslat", "-q", "-D", "200ms", "-c", "0", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let v = read_json(&json);
    assert!(
        v["cmdline:"].as_str().unwrap().ends_with("x\\xff.json"),
        "{}",
        v["cmdline:"]
    );
}
