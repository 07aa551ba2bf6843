//! `--isolate` (issue 22): the measured CPU isolated at run time, every movable thread, the
//! unbound workqueues and the interrupts moved off it, and the system put back as it was after
//! a normal end, a Ctrl-C, a second Ctrl-C, and (by the next run) a SIGKILL. Refused clearly
//! without root.
//!
//! The root test changes the whole machine's affinities for a few seconds at a time, so it is
//! the only test of this binary that does, and it compares everything it can see before and
//! after: every thread's affinity (those alive at both times), the workqueue mask, every
//! interrupt's affinity, the default interrupt affinity, the cpuset hierarchy and the state
//! directory.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{as_nobody, is_root};

const WQ: &str = "/sys/devices/virtual/workqueue/cpumask";

/// Held by each test for its whole run: the isolating test changes the workqueue cpumask (and
/// more) system-wide while it runs, and the refusal test checks that the cpumask did not move.
static SYSTEM: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// [`SYSTEM`], whatever a failed test left it as.
fn system() -> std::sync::MutexGuard<'static, ()> {
    SYSTEM.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a wait for something a run must get to (its isolation, its partition) may last
/// before it counts as a hang: far beyond what a busy machine needs, since it only decides
/// when something is wrong.
const WATCHDOG: Duration = Duration::from_secs(120);

fn emu(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qpw-emu"));
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

fn read(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Everything `--isolate` may change, by name.
fn snapshot() -> BTreeMap<String, String> {
    let mut s = BTreeMap::new();
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else {
            continue;
        };
        // Kernel threads only the kernel may pin (PF_NO_SETAFFINITY: per-CPU threads, the
        // workqueues' rescuers) are the kernel's business: a rescuer binds itself to the CPU
        // it serves, and before 6.2 a cpuset whose CPUs change resets it too, which no
        // process can put back.
        if flags(&p.file_name().to_string_lossy()) & 0x0400_0000 != 0 {
            continue;
        }
        for t in tasks.flatten() {
            let status = read(t.path().join("status")).unwrap_or_default();
            if let Some(l) = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")) {
                let name = format!("task {}", t.path().display());
                s.insert(name, l.split_whitespace().nth(1).unwrap_or("").to_string());
            }
        }
    }
    s.insert("wq".into(), read(WQ).unwrap_or_default());
    for i in std::fs::read_dir("/proc/irq").unwrap().flatten() {
        if let Some(a) = read(i.path().join("smp_affinity_list")) {
            s.insert(format!("irq {}", i.path().display()), a);
        }
        // Where the kernel delivers it, where that can be put back: an IO-APIC interrupt
        // moves only at its next delivery, which for a quiet one (a serial port) may come
        // after the run, and then the kernel picks from the restored mask itself.
        if let Some(a) = read(i.path().join("effective_affinity_list")) {
            let irq = i.file_name().to_string_lossy().into_owned();
            if !io_apic(&irq) {
                s.insert(format!("irq {} effective", i.path().display()), a);
            }
        }
    }
    s.insert(
        "irq default".into(),
        read("/proc/irq/default_smp_affinity").unwrap_or_default(),
    );
    for m in read("/proc/mounts").unwrap_or_default().lines() {
        let f: Vec<&str> = m.split_whitespace().collect();
        if f.len() > 3 && f[2] == "cgroup" && f[3].split(',').any(|o| o == "cpuset") {
            let root = Path::new(f[1]);
            s.insert(
                "cpuset balance".into(),
                read(root.join("cpuset.sched_load_balance")).unwrap_or_default(),
            );
            let mut dirs: Vec<String> = std::fs::read_dir(root)
                .unwrap()
                .flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            dirs.sort();
            s.insert("cpuset dirs".into(), dirs.join(","));
        }
    }
    if let Some(root) = v2_cpuset_root() {
        s.insert(
            "cgroup2 subtree_control".into(),
            read(root.join("cgroup.subtree_control")).unwrap_or_default(),
        );
        let mut dirs: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        dirs.sort();
        s.insert("cgroup2 dirs".into(), dirs.join(","));
        s.insert(
            "this test's cgroup".into(),
            read("/proc/self/cgroup").unwrap_or_default(),
        );
    }
    let mut state: Vec<String> = std::fs::read_dir("/run/qpw-emu")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    state.sort();
    s.insert("state files".into(), state.join(","));
    s.insert(
        "state dir".into(),
        Path::new("/run/qpw-emu").exists().to_string(),
    );
    s
}

/// The cgroup v2 root, where it has the cpuset controller (there `--isolate` makes an isolated
/// partition).
fn v2_cpuset_root() -> Option<std::path::PathBuf> {
    read("/proc/mounts")?.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let root = Path::new(f.get(1)?);
        (f.get(2) == Some(&"cgroup2")
            && read(root.join("cgroup.controllers"))
                .is_some_and(|c| c.split_whitespace().any(|c| c == "cpuset")))
        .then(|| root.to_path_buf())
    })
}

/// On cgroup v2: the run's isolated partition, which holds the probe's thread.
fn check_partition(child: &Child, cpu: usize) {
    let Some(root) = v2_cpuset_root() else {
        return;
    };
    let dir = root.join(format!("qpw-emu-{}", child.id()));
    // The partition comes after the workqueue mask (the scheduler-domain step is the last).
    let start = Instant::now();
    while read(dir.join("cpuset.cpus.partition")).as_deref() != Some("isolated") {
        assert!(
            start.elapsed() < WATCHDOG,
            "no isolated partition at {} (it reads {:?})",
            dir.display(),
            read(dir.join("cpuset.cpus.partition"))
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        read(dir.join("cpuset.cpus.effective")),
        Some(cpu.to_string())
    );
    // The probe's thread joins it when it is pinned there, after its start-up.
    loop {
        let threads = read(dir.join("cgroup.threads")).unwrap_or_default();
        let names: Vec<String> = threads
            .lines()
            .filter_map(|t| read(format!("/proc/{}/task/{t}/comm", child.id())))
            .collect();
        if names.iter().any(|n| n.starts_with("oslat/")) {
            break;
        }
        assert!(
            start.elapsed() < WATCHDOG,
            "the probe's thread never joined the partition: {names:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether interrupt `irq` is delivered through an IO-APIC (its chip in /proc/interrupts).
fn io_apic(irq: &str) -> bool {
    read("/proc/interrupts").is_some_and(|t| {
        t.lines().any(|l| {
            let l = l.trim_start();
            l.strip_prefix(irq)
                .is_some_and(|r| r.starts_with(':') && r.contains("IO-APIC"))
        })
    })
}

/// What differs between two snapshots, threads alive in only one of them left out.
fn changed(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in before {
        match after.get(k) {
            Some(w) if w != v => out.push(format!("{k}: {v} -> {w}")),
            None if !k.starts_with("task ") => out.push(format!("{k}: {v} -> (gone)")),
            _ => {}
        }
    }
    for (k, w) in after {
        if !before.contains_key(k) && !k.starts_with("task ") {
            out.push(format!("{k}: (none) -> {w}"));
        }
    }
    out
}

/// The snapshot keys of the interrupts whose old CPU a run said it could not give back
/// (`irq N is back in its mask ... but stays on cpu ...`): the kernel moves such an interrupt
/// (an IO-APIC's, a non-remapped MSI's on x86) only when it fires, and one that did not fire
/// while the run waited stays where the run had moved it, inside its restored mask. Its mask is
/// still compared; only where the kernel delivers it is not.
fn stayed(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("qpw-emu: isolation: irq ")?;
            let (irq, rest) = rest.split_once(' ')?;
            rest.starts_with("is back in its mask")
                .then(|| format!("irq /proc/irq/{irq} effective"))
        })
        .collect()
}

/// The last allowed CPU, when another is left for everything else.
fn target() -> Option<usize> {
    let allowed = qpw_core::allowed_cpus().unwrap();
    (allowed.len() > 1).then(|| allowed.last().unwrap())
}

/// Waits until the workqueue mask no longer has `cpu` (the child isolated it); a hang past
/// [`WATCHDOG`] fails.
fn wait_isolated(child: &mut Child, cpu: usize) {
    let start = Instant::now();
    loop {
        let mask = read(WQ).and_then(|m| u64::from_str_radix(&m.replace(',', ""), 16).ok());
        if mask.is_some_and(|m| m & (1 << cpu) == 0) {
            return;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "qpw-emu ended before isolating"
        );
        assert!(start.elapsed() < WATCHDOG, "never isolated");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill() with the pid of a child we started and have not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
}

/// Process `pid`'s flags (0 when they cannot be read).
fn flags(pid: &str) -> u64 {
    read(format!("/proc/{pid}/stat"))
        .and_then(|s| {
            let rest = s.get(s.rfind(')')? + 2..)?.to_string();
            rest.split(' ').nth(6)?.parse::<u64>().ok()
        })
        .unwrap_or(0)
}

/// Whether process `pid` is a kernel thread (PF_KTHREAD in its flags).
fn is_kthread(pid: &str) -> bool {
    flags(pid) & 0x0020_0000 != 0
}

/// Threads of other processes than `except` that may still run on `cpu` and are neither
/// kernel threads nor pinned to `cpu` alone.
fn movable_left_on(cpu: usize, except: u32) -> Vec<String> {
    let mut out = Vec::new();
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = p.file_name().to_string_lossy().into_owned();
        if pid.parse::<u32>().is_err() || pid == except.to_string() || is_kthread(&pid) {
            continue;
        }
        let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let status = read(t.path().join("status")).unwrap_or_default();
            let Some(list) = status
                .lines()
                .find(|l| l.starts_with("Cpus_allowed_list:"))
                .and_then(|l| l.split_whitespace().nth(1))
            else {
                continue;
            };
            let set = qpw_core::CpuSet::parse(list).unwrap();
            if set.contains(cpu) && set.len() > 1 {
                let comm = read(t.path().join("comm")).unwrap_or_default();
                out.push(format!("{} {comm} ({list})", t.path().display()));
            }
        }
    }
    out
}

#[test]
fn isolate_is_refused_without_root_naming_what_it_would_change() {
    let _system = system();
    let before = read(WQ);
    let mut cmd = emu(&["oslat", "--isolate", "-D", "1"]);
    as_nobody(&mut cmd);
    let out = cmd.output().expect("qpw-emu runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for what in [
        "--isolate needs root",
        "sched_setaffinity",
        WQ,
        "smp_affinity_list",
    ] {
        assert!(stderr.contains(what), "no {what:?} in: {stderr}");
    }
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("Test starts"),
        "refused before the run"
    );
    let mut cmd = emu(&["run", "--isolate", "-D", "1"]);
    as_nobody(&mut cmd);
    let out = cmd.output().expect("qpw-emu runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--isolate needs root"),
        "{stderr}"
    );
    assert_eq!(read(WQ), before);
}

#[test]
fn isolate_moves_everything_movable_and_puts_it_all_back_on_every_way_out() {
    let _system = system();
    let Some(cpu) = target() else {
        eprintln!("one CPU: nowhere to move anything");
        return;
    };
    if !is_root() {
        eprintln!("not root: --isolate is refused (the other test shows it)");
        return;
    }
    // Whatever fails below, a killed run's changes are undone before the test ends: any
    // qpw-emu started as root puts them back.
    struct Recover;
    impl Drop for Recover {
        fn drop(&mut self) {
            let _ = emu(&["--version"]).output();
        }
    }
    let _recover = Recover;
    let cpu_s = cpu.to_string();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("oslat.json");
    let json_s = json.to_str().unwrap().to_string();
    let run = |seconds: &str| {
        emu(&[
            "oslat",
            "--isolate",
            "--cpu-list",
            &cpu_s,
            "-D",
            seconds,
            "--json",
            &json_s,
        ])
    };
    let before = snapshot();
    // Interrupts a run said stay on the housekeeping CPU (see `stayed`), from every run so far.
    let mut excused: Vec<String> = Vec::new();
    let changed_since = |excused: &[String]| -> Vec<String> {
        changed(&before, &snapshot())
            .into_iter()
            .filter(|c| !excused.iter().any(|k| c.starts_with(&format!("{k}:"))))
            .collect()
    };

    // During a run: nothing movable left on the CPU, the workqueues off it. The run lasts a
    // minute and is ended by Ctrl-C once everything has been looked at, so that each look is
    // sure to fall inside it however slowly a busy machine lets this test look; after the
    // Ctrl-C, everything is as it was.
    let mut child = run("60").spawn().unwrap();
    wait_isolated(&mut child, cpu);
    check_partition(&child, cpu);
    let left = movable_left_on(cpu, child.id());
    let during = snapshot();
    assert!(
        child.try_wait().unwrap().is_none(),
        "the 60 s run ended before it was looked at"
    );
    signal(&child, libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    excused.extend(stayed(&stderr));
    assert!(
        left.is_empty(),
        "movable threads left on cpu {cpu}: {left:?}"
    );
    assert!(
        changed(&before, &during)
            .iter()
            .any(|c| c.starts_with("wq:")),
        "the workqueue mask never changed"
    );
    assert_eq!(
        changed_since(&excused),
        Vec::<String>::new(),
        "after Ctrl-C"
    );

    // A normal end: everything as it was, and the JSON says what was done.
    let out = run("1").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("qpw-emu: isolation: cpu"), "{stderr}");
    excused.extend(stayed(&stderr));
    assert_eq!(
        changed_since(&excused),
        Vec::<String>::new(),
        "after a normal end"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let iso = &v["isolation"];
    assert_eq!(iso["cpus"], cpu_s.as_str(), "{iso}");
    assert!(iso["tasks_moved"].as_u64().unwrap() > 0, "{iso}");
    assert!(iso["kernel_sees_isolated"].is_boolean(), "{iso}");

    // A second signal: the process exits at once; the exit hook puts everything back.
    let mut child = run("60").spawn().unwrap();
    wait_isolated(&mut child, cpu);
    signal(&child, libc::SIGINT);
    signal(&child, libc::SIGTERM);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    excused.extend(stayed(&String::from_utf8_lossy(&out.stderr)));
    assert_eq!(
        changed_since(&excused),
        Vec::<String>::new(),
        "after a second Ctrl-C"
    );

    // SIGKILL: nothing can run in the killed process; the next --isolate run undoes it and
    // says so.
    let mut child = run("60").spawn().unwrap();
    wait_isolated(&mut child, cpu);
    signal(&child, libc::SIGKILL);
    let _ = child.wait();
    let killed = changed(&before, &snapshot());
    let out = run("1").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    excused.extend(stayed(&stderr));
    assert_eq!(
        changed_since(&excused),
        Vec::<String>::new(),
        "after a SIGKILL and another run"
    );
    assert!(
        killed.iter().any(|c| c.starts_with("wq:")),
        "the killed run left nothing to undo? {killed:?}"
    );
    assert!(
        stderr.contains("ended without restoring what --isolate changed: put back now"),
        "{stderr}"
    );

    // The same, as a user meets it: the killed run not reaped yet (a zombie), and the next
    // command, without --isolate, started from this (moved) process through a shell and
    // `timeout`, which began during the isolation and so have the narrowed mask too. It must
    // put everything back, itself included, and run on the measured CPU.
    let mut child = run("60").spawn().unwrap();
    wait_isolated(&mut child, cpu);
    signal(&child, libc::SIGKILL);
    let stat = format!("/proc/{}/stat", child.id());
    let start = Instant::now();
    while !read(&stat).is_some_and(|s| s.split(") ").nth(1).is_some_and(|r| r.starts_with('Z'))) {
        assert!(
            start.elapsed() < WATCHDOG,
            "the killed run never became a zombie"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let emu_path = assert_cmd::cargo::cargo_bin("qpw-emu");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "exec timeout 60 '{}' oslat --cpu-list {cpu} -D 1 -q",
            emu_path.display()
        ))
        .output()
        .unwrap();
    let _ = child.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("put back now"), "{stderr}");
    excused.extend(stayed(&stderr));
    assert_eq!(
        changed_since(&excused),
        Vec::<String>::new(),
        "after a SIGKILL and a run through sh and timeout"
    );
}
