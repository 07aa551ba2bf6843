//! Live attribution on the running kernel (root and tracefs; elsewhere each test says why it is
//! skipped): queue mode's worker is attributed and remote mode has nothing of qpw on the
//! target; a kernel workload's work function runs on the target once per drain; a run
//! interrupted with SIGINT leaves no tracefs instance, cgroup or mount behind; and bad input
//! is refused before anything starts.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::is_root;

/// How long a wait for something a run must get to (its set-up, its end after a signal) may
/// last before it counts as a hang: far beyond what a busy machine needs, since it only
/// decides when something is wrong.
const WATCHDOG: Duration = Duration::from_secs(120);

/// The live tests measure the same CPU: one at a time.
static LIVE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn live() -> std::sync::MutexGuard<'static, ()> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

fn emu() -> Command {
    Command::new(env!("CARGO_BIN_EXE_qpw-emu"))
}

/// Whether live tracing can run here; prints the reason when not.
fn can_trace(test: &str) -> bool {
    if !is_root() {
        eprintln!("{test}: skipped: tracing needs root");
        return false;
    }
    let mounted = std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .contains(" tracefs ");
    let available = std::fs::read_to_string("/proc/filesystems")
        .unwrap_or_default()
        .contains("tracefs");
    if !mounted && !available {
        eprintln!("{test}: skipped: this kernel has no tracefs");
        return false;
    }
    true
}

fn target() -> String {
    qpw_core::allowed_cpus()
        .ok()
        .and_then(|c| c.last())
        .unwrap_or(0)
        .to_string()
}

fn two_cpus(test: &str) -> bool {
    let n = qpw_core::allowed_cpus().map_or(1, |c| c.len());
    if n < 2 {
        eprintln!("{test}: skipped: needs a measured and a housekeeping CPU");
    }
    n >= 2
}

fn run_json(args: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("out.json");
    let out = emu()
        .args(args)
        .arg("--json")
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("qpw-emu runs");
    assert!(
        out.status.success(),
        "{args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap()
}

fn sources(json: &Value) -> Vec<(String, u64)> {
    json["trace"]["attribution"][0]["top"]
        .as_array()
        .expect("an attribution")
        .iter()
        .map(|s| {
            (
                s["source"].as_str().unwrap().to_string(),
                s["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn queue_mode_worker_is_attributed_and_remote_mode_leaves_nothing_of_qpw() {
    let _one_at_a_time = live();
    let test = "queue_mode_worker_is_attributed";
    if !can_trace(test) || !two_cpus(test) {
        return;
    }
    let cpu = target();
    let worker = format!("qpw/{cpu}");
    let args = |mode| {
        [
            "oslat",
            "-c",
            &cpu,
            "-D",
            "2",
            "-q",
            "--trace",
            "--mode",
            mode,
            "--drain-workload",
            "lru",
            "--drain-rate",
            "500",
        ]
        .map(str::to_string)
    };
    let queue = run_json(&args("queue").each_ref().map(String::as_str));
    let drains = queue["requester"]["drains"].as_u64().unwrap();
    let by_worker = sources(&queue)
        .iter()
        .find(|(s, _)| *s == worker)
        .map_or(0, |s| s.1);
    // Each drain that found the target's batch non-empty woke the worker there; a gap in
    // which a busier thread also ran (a build beside the test) goes to that thread, so only a
    // tenth of the drains is asked for: enough to fail if the worker went unattributed.
    assert!(
        by_worker * 10 >= drains,
        "queue mode: {by_worker} gaps attributed to {worker} for {drains} drains: {:?}",
        sources(&queue)
    );
    assert_eq!(queue["trace"]["health"]["clock"], "x86-tsc");
    let remote = run_json(&args("remote").each_ref().map(String::as_str));
    // Our own workers only: another process's (a test running beside) carries its pid.
    let of_qpw: Vec<_> = sources(&remote)
        .into_iter()
        .filter(|(s, _)| s.starts_with("qpw/") && !s.contains("(process"))
        .collect();
    assert!(of_qpw.is_empty(), "remote mode: {of_qpw:?}");
    assert_eq!(
        remote["trace"]["attribution"][0]["by_bucket"]["qpw"].as_u64(),
        None
    );
}

#[test]
fn a_kernel_drain_runs_its_work_function_on_the_target_once_per_drain() {
    let _one_at_a_time = live();
    let test = "a_kernel_drain_runs_its_work_function";
    if !can_trace(test) || !two_cpus(test) {
        return;
    }
    if !std::path::Path::new("/proc/sys/vm/stat_refresh").exists() {
        eprintln!("{test}: skipped: no /proc/sys/vm/stat_refresh");
        return;
    }
    let cpu = target();
    let json = run_json(&[
        "oslat",
        "-c",
        &cpu,
        "-D",
        "2",
        "-q",
        "--trace",
        "--drain-workload",
        "kernel-vmstat",
        "--drain-rate",
        "20",
    ]);
    let drains = json["requester"]["drains"].as_u64().unwrap();
    let runs = json["trace"]["work"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["function"] == "refresh_vm_stats")
        .map_or(0, |w| w["runs"].as_u64().unwrap());
    assert!(drains > 0);
    // Other users of stat_refresh may add a run; none may be missing.
    assert!(
        runs >= drains && runs <= drains + 2,
        "{runs} runs of refresh_vm_stats on cpu {cpu} for {drains} drains"
    );
    assert!(json["trace"]["kernel"]["mode"].as_str().is_some());
}

/// Leftovers of a run with pid `pid`: tracefs instances, cgroups, our tracefs mount.
fn leftovers(pid: u32) -> Vec<String> {
    let name = format!("qpw-emu-{pid}");
    let mut found = Vec::new();
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    for line in mounts.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 3 {
            continue;
        }
        if f[2] == "tracefs" {
            if f[1].ends_with(&format!("qpw-emu-tracefs-{pid}")) {
                found.push(format!("tracefs mounted on {}", f[1]));
            }
            let inst = std::path::Path::new(f[1]).join("instances").join(&name);
            if inst.exists() {
                found.push(inst.display().to_string());
            }
        }
        if f[2] == "cgroup" || f[2] == "cgroup2" {
            let cg = std::path::Path::new(f[1]).join(&name);
            if cg.exists() {
                found.push(cg.display().to_string());
            }
        }
    }
    found
}

#[test]
fn interrupted_runs_leave_nothing_behind() {
    let _one_at_a_time = live();
    let test = "interrupted_runs_leave_nothing_behind";
    if !can_trace(test) || !two_cpus(test) {
        return;
    }
    let has_memcg = std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains("cgroup") && l.contains("memory"));
    let workload = if has_memcg {
        "kernel-memcg"
    } else {
        "kernel-vmstat"
    };
    // The second signal must land while the run still winds down: a few tries.
    let mut forced_seen = false;
    for signals in [1, 2, 2, 2, 2, 2] {
        if signals == 2 && forced_seen {
            break;
        }
        let cpu = target();
        let child = emu()
            .args([
                "oslat",
                "-c",
                &cpu,
                "-D",
                "60",
                "-q",
                "--trace",
                "--drain-workload",
                workload,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        // Wait until the run has set itself up (its instance exists), then interrupt it.
        let start = Instant::now();
        while leftovers(pid).is_empty() && start.elapsed() < WATCHDOG {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            !leftovers(pid).is_empty(),
            "the run never set up its trace instance"
        );
        std::thread::sleep(Duration::from_millis(800));
        // 5 ms apart: two signals (not merged into one pending signal), the second while the
        // run is still winding down with its trace open; the second is SIGTERM, since the
        // same signal again this soon counts as one request delivered twice.
        for sig in [libc::SIGINT, libc::SIGTERM].into_iter().take(signals) {
            // SAFETY: `kill` with a valid pid of our own child and a signal number.
            unsafe { libc::kill(pid as i32, sig) };
            std::thread::sleep(Duration::from_millis(5));
        }
        let out = wait(child, WATCHDOG);
        // One Ctrl-C: the run reports and exits 0; two: it exits at once, 130, as rt-tests users
        // expect (unless the run had finished before the second came); either way after
        // putting the system back.
        let code = out.status.code();
        let allowed: &[i32] = if signals == 1 { &[0] } else { &[0, 130] };
        assert!(
            code.is_some_and(|c| allowed.contains(&c)),
            "after {signals} SIGINT: {code:?} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            leftovers(pid),
            Vec::<String>::new(),
            "after {signals} SIGINT"
        );
        if code == Some(130) {
            forced_seen = true;
        }
    }
    assert!(forced_seen, "no try ended by the second SIGINT (exit 130)");
}

/// A run killed with SIGKILL cannot clean up: its tracefs instance (and its private tracefs
/// mount, when it made one) stay. The next traced run removes them, and says so (issue 25).
#[test]
fn what_a_killed_run_left_is_removed_by_the_next() {
    let _one_at_a_time = live();
    let test = "what_a_killed_run_left_is_removed_by_the_next";
    if !can_trace(test) || !two_cpus(test) {
        return;
    }
    let cpu = target();
    let traced = |seconds: &str| {
        let mut c = emu();
        c.args(["oslat", "-c", &cpu, "-D", seconds, "-q", "--trace"]);
        c
    };
    let mut child = traced("60")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Until its instance exists (its private mount, if any, comes first).
    let instance = format!("instances/qpw-emu-{pid}");
    let start = Instant::now();
    while !leftovers(pid).iter().any(|l| l.contains(&instance)) {
        assert!(
            start.elapsed() < WATCHDOG,
            "the run never set up its trace instance"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: `kill` with a valid pid of our own child and a signal number.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let _ = child.wait();
    let left = leftovers(pid);
    assert!(
        left.iter().any(|l| l.contains(&format!("qpw-emu-{pid}"))),
        "SIGKILL left no instance to clean up? {left:?}"
    );
    let out = traced("1").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "left by a run (pid {pid}) that ended without removing it"
        )),
        "{stderr}"
    );
    assert_eq!(
        leftovers(pid),
        Vec::<String>::new(),
        "the killed run's instance and mount are gone"
    );
}

/// The same for kernel-memcg's memory cgroup: a run killed with SIGKILL leaves
/// `qpw-emu-<pid>` in the memory hierarchy (its filler leaves it when its stdin closes); the
/// next kernel-memcg run removes it and says so.
#[test]
fn a_killed_runs_memory_cgroup_is_removed_by_the_next() {
    let _one_at_a_time = live();
    let test = "a_killed_runs_memory_cgroup_is_removed_by_the_next";
    if !is_root() {
        eprintln!("{test}: skipped: kernel-memcg needs root");
        return;
    }
    if !two_cpus(test) {
        return;
    }
    let cgroup = |pid: u32| {
        leftovers(pid)
            .into_iter()
            .find(|l| l.ends_with(&format!("qpw-emu-{pid}")) && !l.contains("instances"))
    };
    let load = |seconds: &str| {
        let mut c = emu();
        c.args(["load", "--workload", "kernel-memcg", "-D", seconds]);
        c
    };
    let probe = load("1").output().unwrap();
    if !probe.status.success() {
        eprintln!(
            "{test}: skipped: kernel-memcg does not run here: {}",
            String::from_utf8_lossy(&probe.stderr)
        );
        return;
    }
    // Its summary does not count the kernel's drains as ours (it said "0 drains reached the
    // measured CPU" while the trace showed every one there).
    let said = String::from_utf8_lossy(&probe.stderr);
    assert!(
        said.contains("only a trace shows") && !said.contains("drains reached the measured CPU"),
        "{said}"
    );
    let mut child = load("60")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let start = Instant::now();
    while cgroup(pid).is_none() {
        assert!(
            start.elapsed() < WATCHDOG,
            "the run never made its memory cgroup"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: `kill` with a valid pid of our own child and a signal number.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let _ = child.wait();
    let left = cgroup(pid);
    assert!(left.is_some(), "SIGKILL left no memory cgroup to clean up?");
    let out = load("1").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "removed the memory cgroup {} left by a run (pid {pid})",
            left.unwrap_or_default()
        )),
        "{stderr}"
    );
    assert_eq!(cgroup(pid), None, "the killed run's cgroup is gone");
}

fn wait(mut child: std::process::Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("qpw-emu did not end within {limit:?} of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn fails_with(args: &[&str], needle: &str) {
    let out = emu().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(stderr.contains(needle), "{args:?}: `{needle}` in {stderr}");
}

#[test]
fn bad_input_is_refused_before_anything_starts() {
    fails_with(
        &["load", "--workload", "kernel-foo", "-D", "1"],
        "unknown workload `kernel-foo`: expected one of lru, memcg, slub, pcp, counter, \
         kernel-lru, kernel-slub, kernel-vmstat, kernel-memcg",
    );
    fails_with(
        &["oslat", "-D", "1", "--trace", "0"],
        "--trace 0: must be a number",
    );
    fails_with(
        &[
            "load",
            "--workload",
            "kernel-lru",
            "--mode",
            "remote",
            "-D",
            "1",
        ],
        "leave --mode out for kernel workloads",
    );
    fails_with(
        &["trace", "-D", "1", "--json", "/nonexistent/dir/t.json"],
        "the directory /nonexistent/dir does not exist",
    );
}

#[test]
fn without_root_kernel_workloads_and_tracing_are_refused_clearly() {
    let as_user = |args: &[&str]| {
        let mut cmd = emu();
        cmd.args(args);
        common::as_nobody(&mut cmd);
        cmd.output()
    };
    for (args, needle) in [
        (
            &["load", "--workload", "kernel-lru", "-D", "1"][..],
            "--workload kernel-lru needs root",
        ),
        (&["trace", "-D", "1"][..], "need root"),
        (&["oslat", "-D", "1", "--trace"][..], "need root"),
    ] {
        let out = match as_user(args) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("skipped: cannot run qpw-emu as uid 65534 here: {e}");
                return;
            }
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("Permission denied") && !stderr.contains("Error:") {
            eprintln!("skipped: uid 65534 cannot reach the binary: {stderr}");
            return;
        }
        assert!(!out.status.success(), "{args:?} should be refused");
        assert!(stderr.contains(needle), "{args:?}: `{needle}` in {stderr}");
    }
}

#[test]
fn the_default_run_attributes_each_scenario_and_has_kernel_rows() {
    let test = "the_default_run_attributes_each_scenario";
    if !can_trace(test) || !two_cpus(test) {
        return;
    }
    let _one_at_a_time = live();
    let dir = tempfile::tempdir().unwrap();
    let out = emu()
        .args([
            "run",
            "-D",
            "1500ms",
            "--rounds",
            "1",
            "-q",
            "--workloads",
            "lru,kernel-vmstat",
            "--out",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("What interrupted the target"), "{stdout}");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("summary.json")).unwrap())
            .unwrap();
    let rows = summary["attribution"].as_array().expect("attribution rows");
    let row = |name: &str| {
        rows.iter()
            .find(|r| r["scenario"] == name)
            .unwrap_or_else(|| panic!("no {name} row in {rows:?}"))
    };
    // The threshold comes from the idle baseline: on a machine so busy that idle gaps reach
    // tens of microseconds, a worker's run (about 30 us here) may fall under it.
    let threshold = summary["threshold_us"].as_f64().unwrap_or(0.0);
    let by_worker = row("queue-lru")["by_bucket"]["qpw"].as_u64().unwrap_or(0);
    if threshold < 20.0 {
        assert!(
            by_worker > 0,
            "no gap of queue-lru attributed to qpw/ ({threshold} us)"
        );
    } else {
        eprintln!("threshold {threshold} us (a busy machine): queue-lru's worker gaps not checked");
    }
    assert_eq!(row("remote-lru")["by_bucket"]["qpw"].as_u64(), None);
    let work = &row("kernel-vmstat")["kernel_work"];
    assert_eq!(work["function"], "refresh_vm_stats");
    let per = work["runs_per_drain"].as_f64().unwrap();
    assert!(
        (0.9..=1.1).contains(&per),
        "refresh_vm_stats runs per drain: {per}"
    );
    assert!(summary["kernel"]["mode"].as_str().is_some());
}
