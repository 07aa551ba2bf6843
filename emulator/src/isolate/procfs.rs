//! What the isolation reads and sets through `/proc` and the scheduler: the threads, their
//! flags, start times and affinities, and the interrupts' counts and masks.

use std::path::{Path, PathBuf};

use qpw_core::CpuSet;

use super::PROC_IRQ;

/// How often the interrupt whose `smp_affinity_list` is `path` has fired, on every CPU
/// together (its line of `/proc/interrupts`); `None` where that cannot be read.
pub(super) fn deliveries(path: &Path) -> Option<u64> {
    let irq = path.parent()?.file_name()?.to_str()?;
    fired(&std::fs::read_to_string("/proc/interrupts").ok()?, irq)
}

/// Interrupt `irq`'s count in the `/proc/interrupts` text `table`: its per-CPU columns summed.
pub(super) fn fired(table: &str, irq: &str) -> Option<u64> {
    let line = table.lines().find_map(|l| {
        l.trim_start()
            .strip_prefix(irq)
            .and_then(|r| r.strip_prefix(':'))
    })?;
    Some(
        line.split_whitespace()
            .map_while(|n| n.parse::<u64>().ok())
            .sum(),
    )
}

/// Every thread on the machine, as (process, thread).
pub(super) fn all_threads() -> Vec<(i32, i32)> {
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(tgid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else {
            continue;
        };
        for t in tasks.flatten() {
            if let Some(tid) = t.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) {
                out.push((tgid, tid));
            }
        }
    }
    out
}

pub(super) fn comm(tgid: i32, tid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{tgid}/task/{tid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| "?".to_string())
}

/// `PF_KTHREAD` in a task's flags: a kernel thread.
pub(super) const PF_KTHREAD: u64 = 0x0020_0000;

/// `PF_NO_SETAFFINITY`: userspace may not change the task's affinity.
pub(super) const PF_NO_SETAFFINITY: u64 = 0x0400_0000;

/// Field `n` (0: the state) of `/proc/<pid>/stat` after the command, which may hold spaces.
pub(super) fn stat_field(tgid: i32, n: usize) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{tgid}/stat")).ok()?;
    let rest = s.get(s.rfind(')')? + 2..)?;
    rest.split(' ').nth(n)?.parse::<u64>().ok()
}

/// A process's flags; 0 when they cannot be read.
pub(super) fn task_flags(tgid: i32) -> u64 {
    stat_field(tgid, 6).unwrap_or(0)
}

/// When a thread started, in clock ticks since boot (`stat` field 22).
pub(super) fn thread_start(tgid: i32, tid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{tgid}/task/{tid}/stat")).ok()?;
    let rest = s.get(s.rfind(')')? + 2..)?;
    rest.split(' ').nth(19)?.parse::<u64>().ok()
}

/// Now, in the clock ticks of [`thread_start`] (from `/proc/uptime`), less one tick so that a
/// thread started in the same tick counts as started during the isolation.
pub(super) fn now_ticks() -> u64 {
    // SAFETY: `sysconf` has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|u| u.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0, |up| ((up * hz) as u64).saturating_sub(1))
}

/// A process's parent.
pub(super) fn parent(tgid: i32) -> Option<i32> {
    stat_field(tgid, 1).and_then(|p| i32::try_from(p).ok())
}

/// A process's parent, its parent's parent, and so on up to (not including) pid 1.
pub(super) fn ancestors(tgid: i32) -> impl Iterator<Item = i32> {
    // Bounded: a pid reused while we walk could make a cycle.
    std::iter::successors(parent(tgid), |&p| parent(p))
        .take_while(|&p| p > 1)
        .take(64)
}

/// A thread's affinity.
pub fn get_affinity(tid: i32) -> std::io::Result<CpuSet> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc =
        unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE, the set's size.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// Sets a thread's affinity.
pub fn set_affinity(tid: i32, cpus: &CpuSet) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in cpus.iter().filter(|&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `cpu` is below CPU_SETSIZE, the set's size.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Each interrupt's `smp_affinity_list`, by number.
pub(super) fn irq_affinity_files() -> Vec<(u32, PathBuf)> {
    let mut out: Vec<(u32, PathBuf)> = std::fs::read_dir(PROC_IRQ)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((n, e.path().join("smp_affinity_list")))
        })
        .collect();
    out.sort();
    out
}

/// The kernel's hexadecimal CPU mask (`3`, `00000000,00000003`), as a set.
pub fn parse_hex_mask(text: &str) -> Option<CpuSet> {
    let digits: String = text.trim().chars().filter(|&c| c != ',').collect();
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let mut set = CpuSet::default();
    for (i, c) in digits.chars().rev().enumerate() {
        let nibble = c.to_digit(16)?;
        for bit in 0..4 {
            if nibble & (1 << bit) != 0 {
                set.insert(i * 4 + bit);
            }
        }
    }
    Some(set)
}
