//! What a run of qpw-emu may leave on the system, looked up after it ended: RT throttling, a
//! tracefs mount or instance, a cgroup, a state record, a filler process. Every run names what
//! it makes after its pid (`qpw-emu-<pid>`, `qpw-emu-pcp-<pid>`, `qpw-emu-tracefs-<pid>`,
//! `rt-throttling-<pid>`, `hugepages-<pid>`), so that other runs on the machine (another
//! engineer's tests) are not taken for ours.

#![allow(dead_code)] // each test binary uses a part

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// The RT throttling sysctl.
pub(crate) const RUNTIME: &str = "/proc/sys/kernel/sched_rt_runtime_us";

/// Whether the tests run as root.
pub(crate) fn is_root() -> bool {
    // SAFETY: `geteuid` has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `sched_rt_runtime_us` now.
pub(crate) fn sysctl() -> String {
    std::fs::read_to_string(RUNTIME)
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Writes the value it was made with back to the sysctl when dropped, so that a failing test
/// (or the code before a fix) never leaves the machine with throttling off; the assertions
/// check that qpw-emu restored it first.
pub(crate) struct Restore(pub(crate) String);

impl Drop for Restore {
    fn drop(&mut self) {
        if is_root() && sysctl() != self.0 {
            let _ = std::fs::write(RUNTIME, &self.0);
        }
    }
}

/// Makes this process the reaper of its orphaned descendants (`PR_SET_CHILD_SUBREAPER`), so
/// that a filler process whose qpw-emu ended becomes our child, where [`leftovers`] finds it.
pub(crate) fn become_subreaper() {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer flag and touches no memory of ours.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
}

/// The tracefs instances whose names start with `qpw`, looked up through a tracefs mount of
/// its own (an instance outlives every mount it was made through); empty without root.
fn qpw_instances() -> Vec<String> {
    if !is_root() {
        return Vec::new();
    }
    let Ok(dir) = tempfile::tempdir() else {
        return Vec::new();
    };
    let c = |s: &str| std::ffi::CString::new(s).unwrap();
    let target = c(dir.path().to_str().unwrap());
    let (src, fstype) = (c("nodev"), c("tracefs"));
    // SAFETY: valid NUL-terminated strings that outlive the call; no mount data.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Vec::new();
    }
    let found = std::fs::read_dir(dir.path().join("instances"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("qpw"))
        .collect();
    // SAFETY: `target` is the mount made above.
    unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    found
}

/// What the run of process `pid` left: its tracefs mount and instance, its cgroups, its state
/// records, filler processes of its that live on (children of this subreaper, reaped here).
pub(crate) fn leftovers(pid: u32) -> Vec<String> {
    let mut found = Vec::new();
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    for line in mounts.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 3 {
            continue;
        }
        if f[2] == "tracefs" && f[1].ends_with(&format!("qpw-emu-tracefs-{pid}")) {
            found.push(format!("tracefs mounted on {}", f[1]));
        }
        if f[2] == "cgroup" || f[2] == "cgroup2" {
            for name in [
                format!("qpw-emu-{pid}"),
                format!("qpw-emu-housekeeping-{pid}"),
            ] {
                let cg = Path::new(f[1]).join(name);
                if cg.exists() {
                    found.push(format!("cgroup {}", cg.display()));
                }
            }
        }
    }
    let instances = [format!("qpw-emu-{pid}"), format!("qpw-emu-pcp-{pid}")];
    found.extend(
        qpw_instances()
            .into_iter()
            .filter(|n| instances.contains(n))
            .map(|n| format!("tracefs instance {n}")),
    );
    for name in [
        format!("rt-throttling-{pid}.json"),
        format!("isolation-{pid}.json"),
        format!("hugepages-{pid}.json"),
    ] {
        let p = PathBuf::from("/run/qpw-emu").join(name);
        if p.exists() {
            found.push(format!("record {}", p.display()));
        }
    }
    found.extend(orphaned_fillers());
    found
}

/// Filler processes (`qpw-filler`) that are this process's children: orphans of a run that
/// ended, reparented here by [`become_subreaper`]; each is reaped once seen.
fn orphaned_fillers() -> Vec<String> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some(open) = stat.find('(') else { continue };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        if comm == "qpw-filler" && rest.get(1) == Some(&me.as_str()) {
            let pid: i32 = stat[..open].trim().parse().unwrap_or(0);
            found.push(format!("process {pid} qpw-filler (state {})", rest[0]));
            let mut status = 0;
            // SAFETY: waits for one child of ours, named by its pid.
            unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        }
    }
    found
}

/// How long a wait for something a run must get to may last before it counts as a hang: far
/// beyond what a busy machine needs (seconds), since it only decides when something is wrong.
pub(crate) const WATCHDOG: Duration = Duration::from_secs(120);

/// Waits until `ready` holds, or fails (a hang) after [`WATCHDOG`] or when `child` ended.
pub(crate) fn wait_until(child: &mut Child, what: &str, ready: impl Fn() -> bool) {
    let start = Instant::now();
    while !ready() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what}: qpw-emu ended first ({status})");
        }
        assert!(start.elapsed() < WATCHDOG, "{what}: not after {WATCHDOG:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for `child` to end, killing it after [`WATCHDOG`] (a hang, which fails).
pub(crate) fn wait_bounded(child: &mut Child, what: &str) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if start.elapsed() > WATCHDOG {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {WATCHDOG:?}, a hang");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `sig` to `child`.
pub(crate) fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill() with the pid of a child we started and have not reaped.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0);
}

/// Whether process `pid` has a thread named `name` now (at most 15 bytes, as the kernel
/// keeps it).
pub(crate) fn has_thread(pid: u32, name: &str) -> bool {
    let tasks = format!("/proc/{pid}/task");
    std::fs::read_dir(tasks)
        .into_iter()
        .flatten()
        .flatten()
        .any(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name))
}

/// The last allowed CPU, when another one is left for the requester.
pub(crate) fn target() -> Option<usize> {
    let allowed = qpw_core::allowed_cpus().ok()?;
    (allowed.len() > 1).then(|| allowed.last())?
}

/// Whether a memory cgroup controller is mounted (v1 or v2), for kernel-memcg.
pub(crate) fn has_memcg() -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() > 3 && f[2] == "cgroup" && f[3].split(',').any(|o| o == "memory"))
            || (f.len() > 2
                && f[2] == "cgroup2"
                && std::fs::read_to_string(Path::new(f[1]).join("cgroup.controllers"))
                    .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory")))
    })
}

/// Whether tracefs exists here (mounted, or the kernel has it).
pub(crate) fn has_tracefs() -> bool {
    std::fs::read_to_string("/proc/filesystems").is_ok_and(|f| f.contains("tracefs"))
}
