//! The real-time setup every probe does before it measures, as rt-tests does it: lock memory
//! (`mlockall`), hold `/dev/cpu_dma_latency` at 0, run `SCHED_FIFO` when asked, and check that
//! the measured CPUs are isolated. Each step that fails is a warning in the command's
//! [`Sink`] that ends up in the report (STYLE.md rule 15): a figure measured without it means
//! something else.
//!
//! Also here: the ftrace marker written when a threshold is exceeded (`-T`, `-b`), the SIGINT
//! flag (taken by [`crate::signals`]), and the system facts the rt-tests JSON envelope carries.

use std::fs::{File, OpenOptions};
use std::io::Write;

use qpw_core::{CpuSet, Topology};

use crate::sink::Sink;

/// What the setup holds for the length of the run: the `cpu_dma_latency` file stays open (the
/// kernel drops the request when it is closed).
#[derive(Debug)]
pub struct RtGuard {
    _dma_latency: Option<File>,
}

/// Locks memory and holds `/dev/cpu_dma_latency` at 0; records what failed.
///
/// Memory is locked as rt-tests locks it (`mlockall(MCL_CURRENT | MCL_FUTURE)`) only where the
/// future can be locked: with `CAP_IPC_LOCK` or an unlimited `RLIMIT_MEMLOCK`. Under a finite
/// limit (8 MiB for an ordinary user on most distributions) `MCL_FUTURE` would make every later
/// mapping past the limit fail (thread stacks, histogram buffers), and the run would abort in
/// its set-up; so there only what is mapped now is locked (`MCL_CURRENT`), with a warning that
/// names the limit and how to lift it. See [`MemLockPlan`].
pub fn prepare(mlock: bool, sink: &mut Sink) -> RtGuard {
    if mlock {
        let plan = MemLockPlan::choose(memlock_limit(), has_cap_ipc_lock(), mapped_bytes());
        if let Some(w) = plan.lock() {
            sink.warn(w);
        }
    } else {
        sink.warn("memory not locked (mlockall not asked for)");
    }
    let dma = match OpenOptions::new().write(true).open("/dev/cpu_dma_latency") {
        Ok(mut f) => match f.write_all(&0i32.to_ne_bytes()) {
            Ok(()) => Some(f),
            Err(e) => {
                sink.warn(format!("could not write 0 to /dev/cpu_dma_latency: {e}; deep C-states may add exit latency"),
                );
                None
            }
        },
        Err(e) => {
            let how = if e.kind() == std::io::ErrorKind::PermissionDenied {
                " (it needs root, or write permission on that file)"
            } else {
                ""
            };
            sink.warn(format!(
                "/dev/cpu_dma_latency not held at 0: {e}{how}; deep C-states may add exit \
                     latency"
            ));
            None
        }
    };
    RtGuard { _dma_latency: dma }
}

impl RtGuard {
    /// Whether `/dev/cpu_dma_latency` is held (cyclictest then prints
    /// `# /dev/cpu_dma_latency set to Nus`).
    pub fn holds_dma_latency(&self) -> bool {
        self._dma_latency.is_some()
    }

    /// Holds `value` microseconds in `/dev/cpu_dma_latency` instead of 0 (cyclictest's
    /// `--latency`), or lets go of it (`None`: `--laptop`, `--default-system`: the request ends
    /// when the file is closed).
    pub fn set_dma_latency(&mut self, value: Option<i32>, sink: &mut Sink) {
        let Some(value) = value else {
            self._dma_latency = None;
            return;
        };
        if let Some(f) = &mut self._dma_latency {
            if let Err(e) = f.write_all(&value.to_ne_bytes()) {
                sink.warn(format!(
                    "could not write {value} to /dev/cpu_dma_latency: {e}"
                ));
                self._dma_latency = None;
            }
        }
    }
}

/// How the kernel isolates `cpu` now (`isolcpus`, `nohz_full`, an isolated cgroup v2
/// partition), as a phrase; `None` when it does not.
pub fn isolation_of(cpu: usize) -> Option<String> {
    let t = Topology::read().ok()?;
    let how: Vec<&str> = [
        (t.isolated(), "isolcpus"),
        (t.nohz_full(), "nohz_full"),
        (t.runtime_isolated(), "an isolated cgroup v2 partition"),
    ]
    .iter()
    .filter(|(set, _)| set.contains(cpu))
    .map(|(_, name)| *name)
    .collect();
    (!how.is_empty()).then(|| how.join(", "))
}

/// Whether the CPUs are emulated in software (qemu's TCG, whose model name says so): there
/// every time is stretched, and only counts and ratios carry over to real hardware.
pub fn emulated_cpu() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| {
        c.lines()
            .any(|l| l.starts_with("model name") && l.contains("TCG"))
    })
}

/// Records a warning for each measured CPU that is neither isolated nor `nohz_full`.
pub fn check_isolation(cpus: &CpuSet, sink: &mut Sink) {
    match Topology::read() {
        Ok(topo) => {
            let isolated = topo.isolated_or_nohz_full();
            let shared = cpus.difference(&isolated);
            if !shared.is_empty() {
                sink.warn(format!(
                    "measured CPU(s) {shared} not isolated (isolated/nohz_full: {isolated}): \
                         the figures include ordinary scheduler and tick noise"
                ));
            }
        }
        Err(e) => sink.warn(format!("could not read the CPU topology: {e}")),
    }
}

/// Makes the calling thread `SCHED_FIFO` at `prio`, or says why it could not and, when it was
/// refused for want of the right, how to get it.
pub fn set_fifo(prio: i32) -> Result<(), String> {
    qpw_core::set_current_fifo(prio).map_err(|e| {
        let refused = matches!(
            &e,
            qpw_core::Error::SchedFifo { source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied
        );
        if refused {
            format!("{e}; {}", fifo_hint(prio, rtprio_limit()))
        } else {
            e.to_string()
        }
    })
}

/// What a refused real-time priority `prio` needs, and how an ordinary user gets it.
pub fn rt_priority_hint(prio: i32) -> String {
    format!(
        "it needs root, CAP_SYS_NICE or an RLIMIT_RTPRIO of at least {prio}; {}",
        fifo_hint(prio, rtprio_limit())
    )
}

/// How an ordinary user raises the soft `RLIMIT_RTPRIO` (now `limit`) to allow `prio` (the
/// error it follows already names the rights `SCHED_FIFO` needs).
fn fifo_hint(prio: i32, limit: Option<u64>) -> String {
    let now = limit.map_or("unlimited".to_string(), |l| l.to_string());
    format!(
        "RLIMIT_RTPRIO is {now} here: `ulimit -r {prio}` or `rtprio` in \
         /etc/security/limits.conf raises it"
    )
}

/// How much memory [`prepare`] locks, chosen from the memory-lock limit and the right to
/// exceed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemLockPlan {
    /// `mlockall(MCL_CURRENT | MCL_FUTURE)`, as rt-tests does: the process has
    /// `CAP_IPC_LOCK` or no limit.
    All,
    /// `mlockall(MCL_CURRENT)` only: the limit is finite, so locking the future would make
    /// later mappings past it fail; what is mapped now fits under it.
    CurrentOnly {
        /// The soft `RLIMIT_MEMLOCK`, in bytes.
        limit: u64,
        /// What is mapped now, in bytes.
        mapped: u64,
    },
    /// Nothing: even what is mapped now exceeds the limit.
    Nothing {
        /// The soft `RLIMIT_MEMLOCK`, in bytes.
        limit: u64,
        /// What is mapped now, in bytes.
        mapped: u64,
    },
}

impl MemLockPlan {
    /// The plan for a soft limit of `limit` bytes (`None`: unlimited), with or without
    /// `CAP_IPC_LOCK`, when `mapped` bytes are mapped now.
    pub fn choose(limit: Option<u64>, cap_ipc_lock: bool, mapped: u64) -> Self {
        match limit {
            _ if cap_ipc_lock => Self::All,
            None => Self::All,
            Some(limit) if mapped <= limit => Self::CurrentOnly { limit, mapped },
            Some(limit) => Self::Nothing { limit, mapped },
        }
    }

    /// Carries the plan out; returns the warning for the report, if any.
    fn lock(&self) -> Option<String> {
        let flags = match self {
            Self::All => libc::MCL_CURRENT | libc::MCL_FUTURE,
            Self::CurrentOnly { .. } => libc::MCL_CURRENT,
            Self::Nothing { .. } => return Some(self.warning(None)),
        };
        // SAFETY: `mlockall` takes flags only.
        let rc = unsafe { libc::mlockall(flags) };
        let failed = (rc != 0).then(std::io::Error::last_os_error);
        match (self, failed) {
            (Self::All, None) => None,
            (_, failed) => Some(self.warning(failed)),
        }
    }

    /// The warning for this plan, after `mlockall` failed with `failed` (if it did).
    pub fn warning(&self, failed: Option<std::io::Error>) -> String {
        const HOW: &str = "for the full lock rt-tests takes, run as root (CAP_IPC_LOCK) or lift \
                           the limit (`ulimit -l unlimited`, or `memlock` in \
                           /etc/security/limits.conf)";
        let mib = |b: &u64| *b as f64 / (1 << 20) as f64;
        match (self, failed) {
            (Self::All, Some(e)) => format!(
                "mlockall(MCL_CURRENT|MCL_FUTURE) failed: {e}; page faults may show up as latency"
            ),
            (Self::All, None) => String::new(),
            (Self::CurrentOnly { limit, mapped }, None) => format!(
                "memory locked only in part: RLIMIT_MEMLOCK is {:.1} MiB without CAP_IPC_LOCK, \
                 and locking future mappings too would make every thread stack or buffer past it \
                 fail; locked the {:.1} MiB mapped before set-up (mlockall(MCL_CURRENT)), not what \
                 the run maps later, whose first touches may show up as latency; {HOW}",
                mib(limit),
                mib(mapped)
            ),
            (Self::CurrentOnly { limit, .. }, Some(e)) => format!(
                "memory not locked: mlockall(MCL_CURRENT) failed under RLIMIT_MEMLOCK {:.1} MiB: \
                 {e}; page faults may show up as latency; {HOW}",
                mib(limit)
            ),
            (Self::Nothing { limit, mapped }, _) => format!(
                "memory not locked: RLIMIT_MEMLOCK is {:.1} MiB without CAP_IPC_LOCK, less than \
                 the {:.1} MiB already mapped; page faults may show up as latency; {HOW}",
                mib(limit),
                mib(mapped)
            ),
        }
    }
}

/// The soft limit of `resource` in bytes or units, `None` when unlimited (or unreadable).
fn soft_limit(resource: libc::__rlimit_resource_t) -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit.
    let rc = unsafe { libc::getrlimit(resource, &mut lim) };
    (rc == 0 && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// The soft `RLIMIT_MEMLOCK` in bytes (`None`: unlimited).
fn memlock_limit() -> Option<u64> {
    soft_limit(libc::RLIMIT_MEMLOCK)
}

/// The soft `RLIMIT_RTPRIO` (`None`: unlimited).
fn rtprio_limit() -> Option<u64> {
    soft_limit(libc::RLIMIT_RTPRIO)
}

/// One line of `/proc/self/status`, the text after `key:`.
fn proc_status(key: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix(key)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    })
}

/// Whether process `pid` has ended (and is not this one): what a run killed before it could
/// clean up leaves behind is named after its pid.
pub fn process_gone(pid: u32) -> bool {
    if pid == std::process::id() {
        return false;
    }
    // A killed process stays a zombie until its parent reaps it: gone all the same (its
    // clean-up cannot run any more).
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|end| stat.get(end + 2..end + 3))
            .is_some_and(|state| state == "Z" || state == "X"),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// The pid in a name `<prefix><pid><suffix>` (a path's last part).
pub(crate) fn pid_in_name(path: &std::path::Path, prefix: &str, suffix: &str) -> Option<u32> {
    path.file_name()?
        .to_str()?
        .strip_prefix(prefix)?
        .strip_suffix(suffix)?
        .parse()
        .ok()
}

/// The pid in a name `<prefix><pid>` (a path's last part) when that process no longer exists:
/// what a run killed before it could clean up left behind.
pub fn stale_pid(path: &std::path::Path, prefix: &str) -> Option<u32> {
    pid_in_name(path, prefix, "").filter(|&pid| process_gone(pid))
}

/// The entries of `dir` named `<prefix><pid><suffix>` whose process no longer exists, with
/// that pid: what runs killed before they could clean up left there (none when `dir` cannot
/// be read).
pub fn stale_entries(
    dir: &std::path::Path,
    prefix: &str,
    suffix: &str,
) -> Vec<(std::path::PathBuf, u32)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            let pid = pid_in_name(&path, prefix, suffix)?;
            process_gone(pid).then_some((path, pid))
        })
        .collect()
}

/// Whether the process's effective capabilities include `CAP_IPC_LOCK` (bit 14 of `CapEff`),
/// which lifts the memory-lock limit.
fn has_cap_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    proc_status("CapEff")
        .and_then(|hex| u64::from_str_radix(&hex, 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// The process's mapped memory now (`VmSize`), which `mlockall(MCL_CURRENT)` counts against
/// the limit, in bytes (0 if unreadable).
fn mapped_bytes() -> u64 {
    proc_status("VmSize")
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Keeps the calling thread (the run's main thread, which wakes every 50 ms to watch the
/// clock and draw the progress line) off the measured CPUs, as oslat pins its main thread with
/// `-C`; the previous affinity comes back on drop.
#[derive(Debug)]
#[must_use = "the thread goes back to its old CPUs when the guard is dropped"]
pub struct AwayFrom {
    previous: Option<CpuSet>,
}

impl AwayFrom {
    /// Moves the calling thread to the allowed CPUs outside `measured` (if there are any).
    pub fn cpus(measured: &CpuSet) -> Self {
        let previous = qpw_core::current_affinity().ok();
        let rest = qpw_core::allowed_cpus()
            .map(|a| a.difference(measured))
            .unwrap_or_default();
        let moved = !rest.is_empty() && qpw_core::set_current_affinity(&rest).is_ok();
        Self {
            previous: previous.filter(|_| moved),
        }
    }
}

impl AwayFrom {
    /// Moves the calling thread onto `cpus` (oslat's `-C`, cyclictest's `--mainaffinity`); a
    /// refusal is recorded in `warnings` and the thread stays where it was.
    pub fn onto(cpus: &CpuSet, sink: &mut Sink) -> Self {
        let previous = qpw_core::current_affinity().ok();
        match qpw_core::set_current_affinity(cpus) {
            Ok(()) => Self { previous },
            Err(e) => {
                sink.warn(format!("cannot move the main thread to cpu(s) {cpus}: {e}"));
                Self { previous: None }
            }
        }
    }
}

impl Drop for AwayFrom {
    fn drop(&mut self) {
        if let Some(set) = &self.previous {
            let _ = qpw_core::set_current_affinity(set);
        }
    }
}

/// The ftrace `trace_marker`, when tracing is mounted and writable.
#[derive(Debug)]
pub struct TraceMarker {
    marker: Option<File>,
    tracing_on: Option<File>,
}

/// What a run with a trace threshold records when there is no marker to write.
const NO_TRACE_MARKER: &str =
    "ftrace is not available (no writable trace_marker): a threshold stop writes no trace marker";

impl TraceMarker {
    /// Opens the marker under `/sys/kernel/tracing` (or the older debugfs path); records a
    /// warning when there is none, deferred: the caller says it with
    /// [`Sink::say_deferred`] where it fits (oslat after rt-tests' own lines of a threshold
    /// stop, which come first on stderr).
    pub fn open(sink: &mut Sink) -> Self {
        for dir in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
            let marker = OpenOptions::new()
                .write(true)
                .open(format!("{dir}/trace_marker"));
            if let Ok(marker) = marker {
                let tracing_on = OpenOptions::new()
                    .write(true)
                    .open(format!("{dir}/tracing_on"))
                    .ok();
                return Self {
                    marker: Some(marker),
                    tracing_on,
                };
            }
        }
        sink.defer(NO_TRACE_MARKER);
        Self {
            marker: None,
            tracing_on: None,
        }
    }

    /// Writes `line` to the marker and stops the trace, as rt-tests' `tracemark()` does.
    pub fn mark(&mut self, line: &str) {
        if let Some(m) = &mut self.marker {
            let _ = m.write_all(line.as_bytes());
        }
        if let Some(t) = &mut self.tracing_on {
            let _ = t.write_all(b"0\n");
        }
    }
}

/// Takes SIGINT, SIGTERM and SIGHUP (see [`crate::signals`]): the first asks the run to stop
/// cleanly and still report what it measured, a second ends the process. When the signals cannot be
/// taken they keep their default action, and `warnings` says so.
pub fn catch_sigint(sink: &mut Sink) {
    if let Err(e) = crate::signals::install() {
        sink.warn(format!(
            "cannot take SIGINT/SIGTERM/SIGHUP ({e}): Ctrl-C ends the run without a report"
        ));
    }
}

/// Runs `write` with SIGPIPE blocked in this thread, so that writing to a pipe whose reader
/// has gone returns `EPIPE` instead of ending the process, whatever SIGPIPE's action (qpw-emu
/// ignores it, [`crate::out::ignore_sigpipe`], but a library user may not); a SIGPIPE raised
/// meanwhile is taken off before the mask is put back.
pub fn without_sigpipe<T>(write: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
    // SAFETY: `sigset_t` is plain data, set up by `sigemptyset`/`sigaddset` before use; the
    // masks passed are valid for the calls' duration.
    unsafe {
        let mut pipe: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut pipe);
        libc::sigaddset(&mut pipe, libc::SIGPIPE);
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &pipe, &mut old);
        let out = write();
        if matches!(&out, Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe) {
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // The SIGPIPE is pending on this thread (unless it was already blocked before).
            libc::sigtimedwait(&pipe, std::ptr::null_mut(), &zero);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        out
    }
}

/// An exit with this status and no `Error:` line: the command has said what it had to say
/// (oslat's `-T` exits 1 after its own message, as oslat does).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("exit status {0}")]
pub struct Exit(pub i32);

/// An error and its causes on one line, as `{e:#}` prints them, but without a cause whose text
/// the message before it already ends with (library errors often show their source in their
/// own message and also return it from `source()`, which `{e:#}` would print twice).
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.is_empty() {
            text = part;
        } else if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
    }
    text
}

/// Whether SIGINT, SIGTERM or SIGHUP arrived, or standard output was closed.
pub fn interrupted() -> bool {
    crate::signals::interrupted()
}

/// `uname` plus `/sys/kernel/realtime`, as rt-tests' JSON `sysinfo` has them.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct SysInfo {
    /// Kernel name (`Linux`).
    pub sysname: String,
    /// Host name.
    pub nodename: String,
    /// Kernel release.
    pub release: String,
    /// Kernel version string.
    pub version: String,
    /// Hardware name.
    pub machine: String,
    /// 1 on a PREEMPT_RT kernel (`/sys/kernel/realtime` reads 1), else 0.
    pub realtime: u8,
}

impl SysInfo {
    /// Reads the running system's.
    pub fn read() -> Self {
        // SAFETY: `utsname` is plain data; all-zero bytes are valid (empty strings).
        let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
        // SAFETY: `uts` is a valid, writable utsname.
        let ok = unsafe { libc::uname(&mut uts) } == 0;
        let field = |f: &[libc::c_char]| -> String {
            if !ok {
                return String::new();
            }
            let bytes: Vec<u8> = f
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        let realtime = std::fs::read_to_string("/sys/kernel/realtime")
            .map(|s| u8::from(s.trim() == "1"))
            .unwrap_or(0);
        Self {
            sysname: field(&uts.sysname),
            nodename: field(&uts.nodename),
            release: field(&uts.release),
            version: field(&uts.version),
            machine: field(&uts.machine),
            realtime,
        }
    }
}

/// Local time formatted with `strftime` (`format` must not contain a NUL).
pub fn local_time(format: &str) -> String {
    let Ok(cfmt) = std::ffi::CString::new(format) else {
        return String::new();
    };
    // SAFETY: passing a null pointer asks `time` only to return the time.
    let now = unsafe { libc::time(std::ptr::null_mut()) };
    // SAFETY: `tm` is plain data; all-zero bytes are valid.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let mut buf = [0u8; 128];
    // SAFETY: `now` and `tm` are valid; `localtime_r` writes only to `tm`.
    let tm_ok = !unsafe { libc::localtime_r(&now, &mut tm) }.is_null();
    if !tm_ok {
        return String::new();
    }
    // SAFETY: `buf` is writable for its length; `cfmt` is NUL-terminated; `tm` is filled in.
    let n = unsafe { libc::strftime(buf.as_mut_ptr().cast(), buf.len(), cfmt.as_ptr(), &tm) };
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// The time stamp rt-tests writes in `start_time` and `end_time`
/// (`Wed, 02 Dec 2026 17:55:22 +0000`).
pub fn rt_timestamp() -> String {
    local_time("%a, %d %b %Y %H:%M:%S %z")
}

/// Puts a probe thread on `cpu`, the step oslat and cyclictest share: registered with the
/// workload's instance when the probe does local operations (so its local lock knows the CPU),
/// else merely pinned; then `SCHED_FIFO` at `prio` when asked, a refusal being recorded in
/// `warnings` rather than failing the run. `who` names the thread in messages. Keep the binding
/// for as long as the thread measures.
pub fn enter_probe_cpu(
    qpw: Option<&qpw_core::Qpw>,
    cpu: usize,
    prio: Option<i32>,
    who: &str,
    warnings: &std::sync::Mutex<Vec<String>>,
) -> anyhow::Result<Option<qpw_core::Binding>> {
    use anyhow::Context as _;
    let binding = match qpw {
        Some(qpw) => Some(
            qpw.bind_current(cpu)
                .with_context(|| format!("cannot bind {who} to cpu {cpu}"))?,
        ),
        None => {
            qpw_core::pin_current_thread(cpu)
                .with_context(|| format!("cannot pin {who} to cpu {cpu}"))?;
            None
        }
    };
    if let Some(prio) = prio {
        if let Err(e) = set_fifo(prio) {
            warnings
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(format!("{who} on cpu {cpu} runs SCHED_OTHER: {e}"));
        }
    }
    Ok(binding)
}

#[cfg(test)]
mod tests {
    use super::{error_chain, fifo_hint, MemLockPlan};

    const MIB: u64 = 1 << 20;

    /// Writing to a pipe nobody reads, with SIGPIPE at its default (as a library user may
    /// run), is an `EPIPE` error inside `without_sigpipe`, and the process lives on. Checked in
    /// a child copy of this test binary, since the default action would end the whole harness.
    #[test]
    fn a_write_to_a_gone_reader_is_an_error_not_a_death() {
        const CHILD: &str = "QPW_SIGPIPE_CHILD";
        if std::env::var_os(CHILD).is_some() {
            // SAFETY: setting a signal's action to the default has no preconditions.
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
            let mut fds = [0; 2];
            // SAFETY: `fds` has room for the two descriptors `pipe` writes.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            // SAFETY: the read end is ours and closed once.
            unsafe { libc::close(fds[0]) };
            let write = || {
                // SAFETY: writes one byte from a valid buffer to the pipe's write end.
                let n = unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(())
                }
            };
            let e = super::without_sigpipe(write).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
            println!("survived");
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "rt::tests::a_write_to_a_gone_reader_is_an_error_not_a_death",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("survived"), "{out:?}");
    }

    #[test]
    fn memory_is_locked_in_full_only_where_the_future_fits() {
        // Root, or CAP_IPC_LOCK: the limit does not apply.
        assert_eq!(
            MemLockPlan::choose(Some(8 * MIB), true, 100 * MIB),
            MemLockPlan::All
        );
        // No limit.
        assert_eq!(
            MemLockPlan::choose(None, false, 100 * MIB),
            MemLockPlan::All
        );
        // An ordinary user's 8 MiB: only what is mapped now, if it fits.
        assert_eq!(
            MemLockPlan::choose(Some(8 * MIB), false, 5 * MIB),
            MemLockPlan::CurrentOnly {
                limit: 8 * MIB,
                mapped: 5 * MIB
            }
        );
        assert_eq!(
            MemLockPlan::choose(Some(8 * MIB), false, 9 * MIB),
            MemLockPlan::Nothing {
                limit: 8 * MIB,
                mapped: 9 * MIB
            }
        );
    }

    #[test]
    fn the_warnings_name_the_limit_and_how_to_lift_it() {
        let part = MemLockPlan::CurrentOnly {
            limit: 8 * MIB,
            mapped: 5 * MIB,
        }
        .warning(None);
        assert!(part.contains("RLIMIT_MEMLOCK is 8.0 MiB"), "{part}");
        assert!(part.contains("MCL_CURRENT"), "{part}");
        assert!(part.contains("ulimit -l unlimited"), "{part}");
        let none = MemLockPlan::Nothing {
            limit: MIB,
            mapped: 5 * MIB,
        }
        .warning(None);
        assert!(none.starts_with("memory not locked"), "{none}");
        let hint = fifo_hint(80, Some(0));
        assert!(hint.contains("ulimit -r 80"), "{hint}");
        assert!(hint.contains("RLIMIT_RTPRIO is 0"), "{hint}");
    }

    #[test]
    fn an_error_chain_names_each_cause_once() {
        let io = std::io::Error::from_raw_os_error(libc::EAGAIN);
        let core = qpw_core::Error::Spawn {
            cpu: 1,
            source: io.into(),
        };
        let e = anyhow::Error::new(core).context("cannot set up the load");
        let text = error_chain(&e);
        assert_eq!(text.matches("os error 11").count(), 1, "{text}");
        assert!(
            text.starts_with("cannot set up the load: cannot start"),
            "{text}"
        );
    }
}
