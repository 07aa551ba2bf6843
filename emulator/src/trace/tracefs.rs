//! A private tracefs instance: `instances/<name>` with its own ring buffer, clock, CPU mask and
//! events, so that the global buffer and settings (someone else's trace) are never touched.
//! Creating the directory makes the instance; removing it (once tracing is off) frees it. When
//! tracefs is not mounted, it is mounted on a private temporary directory and unmounted at the
//! end. Everything is undone in `Drop`, which runs on a normal end, on an error and after
//! Ctrl-C (the commands turn SIGINT into a flag and return normally).
//!
//! The reader takes `trace_pipe` (consuming reads, so the buffer never fills while the reader
//! keeps up) on a thread of its own, parses each line at once and keeps only the events.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _, Result};
use qpw_core::CpuSet;

use super::event::{parse_line, ParseError, X86_VECTORS};

/// The events an attribution needs (and `hrtimer_expire_entry`, which names the timers that fire
/// on the measured CPU, the tick among them, and `tick_stop`, which says what keeps a `nohz_full`
/// CPU's tick on); `irq_vectors` and `csd` are enabled where the kernel has them.
pub const EVENTS: &[&str] = &[
    "sched/sched_switch",
    "workqueue/workqueue_execute_start",
    "workqueue/workqueue_execute_end",
    "irq/irq_handler_entry",
    "irq/irq_handler_exit",
    "irq/softirq_entry",
    "irq/softirq_exit",
    "csd/csd_function_entry",
    "csd/csd_function_exit",
    "timer/hrtimer_expire_entry",
    "timer/tick_stop",
];

/// The prefix of kernel-pcp's instance (`qpw-emu-pcp-<pid>`), which traces the drains of the
/// requester's CPU and the target's: removed like the attribution's when its run was killed.
pub const PCP_PREFIX: &str = "qpw-emu-pcp-";

/// The trace clock the probes' timestamps can be matched with: `x86-tsc` where the probe
/// reads the TSC, else `mono` (the probe's `CLOCK_MONOTONIC`).
pub fn probe_clock() -> &'static str {
    if cfg!(target_arch = "x86_64") {
        "x86-tsc"
    } else {
        "mono"
    }
}

/// Where tracefs is mounted, and whether we mounted it.
#[derive(Debug)]
struct Mount {
    path: PathBuf,
    ours: bool,
}

impl Mount {
    /// Finds tracefs in `/proc/mounts`, else mounts it on a private directory.
    fn find_or_mount() -> Result<Self> {
        let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
        // Not a private mount that a killed run left behind: it is unmounted below.
        let found = mounts.lines().find_map(|l| {
            let mut f = l.split(' ');
            let (_dev, dir, kind) = (f.next()?, f.next()?, f.next()?);
            let dir = PathBuf::from(dir.replace("\\040", " "));
            (kind == "tracefs" && crate::rt::stale_pid(&dir, "qpw-emu-tracefs-").is_none())
                .then_some(dir)
        });
        if let Some(path) = found {
            if path.join("instances").is_dir() {
                return Ok(Self { path, ours: false });
            }
        }
        let dir = std::env::temp_dir().join(format!("qpw-emu-tracefs-{}", std::process::id()));
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes());
        let (src, target, fstype) = (
            std::ffi::CString::new("nodev")?,
            c(&dir)?,
            std::ffi::CString::new("tracefs")?,
        );
        // SAFETY: every pointer is a valid NUL-terminated string that outlives the call; no
        // mount data is passed.
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
            let e = std::io::Error::last_os_error();
            let _ = fs::remove_dir(&dir);
            return Err(mount_refused(e));
        }
        // A second Ctrl-C ends the process without running `Drop`: unmount then too.
        let hook_dir = dir.clone();
        crate::signals::on_forced_exit(Box::new(move || unmount(&hook_dir)));
        Ok(Self {
            path: dir,
            ours: true,
        })
    }
}

/// Removes what runs that were killed before they could clean up left behind: tracefs
/// instances `qpw-emu-<pid>` under `mount` and private tracefs mounts `qpw-emu-tracefs-<pid>`
/// of processes that no longer exist. Returns a line for each thing removed.
fn remove_stale(mount: &Path) -> Vec<String> {
    let mut removed = Vec::new();
    let instances = mount.join("instances");
    let stale = crate::rt::stale_entries(&instances, "qpw-emu-", "")
        .into_iter()
        .chain(crate::rt::stale_entries(&instances, PCP_PREFIX, ""));
    for (path, pid) in stale {
        // Nothing reads a dead process's instance, so it can go at once.
        match fs::remove_dir(&path) {
            Ok(()) => removed.push(format!(
                "removed the tracefs instance {} left by a run (pid {pid}) that ended without \
                 removing it",
                path.display()
            )),
            Err(e) => removed.push(format!(
                "cannot remove the tracefs instance {} left by pid {pid}: {e}",
                path.display()
            )),
        }
    }
    let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
    for l in mounts.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        if f.len() < 3 || f[2] != "tracefs" {
            continue;
        }
        let dir = PathBuf::from(f[1].replace("\\040", " "));
        if let Some(pid) = crate::rt::stale_pid(&dir, "qpw-emu-tracefs-") {
            unmount(&dir);
            removed.push(format!(
                "unmounted the tracefs mount {} left by a run (pid {pid}) that ended without \
                 unmounting it",
                dir.display()
            ));
        }
    }
    removed
}

/// The error for a tracefs that is not mounted and cannot be.
fn mount_refused(e: std::io::Error) -> anyhow::Error {
    anyhow!(
        "tracefs is not mounted and cannot be mounted ({e}): tracing needs root \
         (CAP_SYS_ADMIN) and a kernel with CONFIG_FTRACE; mount it by hand with \
         `mount -t tracefs nodev /sys/kernel/tracing`"
    )
}

/// Unmounts our private tracefs mount and removes its directory (harmless when done already).
fn unmount(path: &Path) {
    if let Ok(target) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) {
        // SAFETY: `target` is a valid NUL-terminated path.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
    let _ = fs::remove_dir(path);
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.ours {
            unmount(&self.path);
        }
    }
}

/// What the reader gathered.
#[derive(Debug, Default)]
pub struct Gathered {
    /// The events, taken into the timeline as they are read (per CPU in time order), so that
    /// a long trace keeps its spans, not every event's text: the list of events it kept
    /// before grew by about 1.6 MB a second of trace here.
    pub timeline: super::timeline::Timeline,
    /// Lines that did not parse (the first few, for the report).
    pub bad_lines: Vec<String>,
    /// How many did not parse.
    pub bad_count: u64,
}

/// A private instance, tracing the given CPUs until dropped or [`Instance::stop`]ped.
#[derive(Debug)]
pub struct Instance {
    dir: PathBuf,
    cpus: CpuSet,
    /// The clock in use.
    pub clock: String,
    /// Events asked for that this kernel lacks.
    pub missing_events: Vec<String>,
    stop: Arc<AtomicBool>,
    /// Whether no reader holds `trace_pipe` (any more).
    closed: Arc<AtomicBool>,
    reader: Option<JoinHandle<Gathered>>,
    _mount: Mount,
}

impl Instance {
    /// Creates `instances/<name>` tracing `cpus` with the attribution events, clock `clock`
    /// and `buffer_kb` of ring buffer per CPU, and starts the reader (pinned to `reader_cpu`
    /// when given, so that it stays off the measured CPUs).
    pub fn start(
        name: &str,
        cpus: &CpuSet,
        clock: &str,
        buffer_kb: u64,
        reader_cpu: Option<usize>,
    ) -> Result<Self> {
        let mut events: Vec<String> = EVENTS.iter().map(|e| e.to_string()).collect();
        for v in X86_VECTORS {
            events.push(format!("irq_vectors/{v}_entry"));
            events.push(format!("irq_vectors/{v}_exit"));
        }
        let mut inst = Self::create(name, cpus, clock, buffer_kb, &events)?;
        if !inst.dir.join("events/sched/sched_switch/enable").exists() {
            bail!("this kernel has no sched:sched_switch event: nothing can be attributed");
        }
        let pipe = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(inst.dir.join("trace_pipe"))
            .context("cannot open the instance's trace_pipe")?;
        let stop = inst.stop.clone();
        let closed = inst.closed.clone();
        closed.store(false, Ordering::SeqCst);
        inst.reader = Some(
            std::thread::Builder::new()
                .name("qpw-trace-reader".into())
                .spawn(move || {
                    if let Some(cpu) = reader_cpu {
                        let _ = qpw_core::pin_current_thread(cpu);
                    }
                    let gathered = read_pipe(pipe, &stop);
                    // `read_pipe` has closed the pipe.
                    closed.store(true, Ordering::SeqCst);
                    gathered
                })
                .context("cannot start the trace reader thread")?,
        );
        inst.write("tracing_on", "1")?;
        Ok(inst)
    }

    /// Creates `instances/<name>` tracing `cpus` with `events` (`group/event`; those this
    /// kernel lacks are listed in `missing_events`), clock `clock` and `buffer_kb` of ring
    /// buffer per CPU (0: the default), stopped and without a reader: [`Self::set_filter`], then
    /// [`Self::tracing_on`], and [`Self::take_text`] reads it (the kernel-pcp trace, read
    /// between triggers).
    pub fn create(
        name: &str,
        cpus: &CpuSet,
        clock: &str,
        buffer_kb: u64,
        events: &[String],
    ) -> Result<Self> {
        preflight()?;
        let mount = Mount::find_or_mount()?;
        for line in remove_stale(&mount.path) {
            eprintln!("qpw-emu: {line}");
        }
        let dir = mount.path.join("instances").join(name);
        fs::create_dir(&dir).with_context(|| {
            format!(
                "cannot create the tracefs instance {} (a run left it behind? remove it with \
                 rmdir)",
                dir.display()
            )
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        // No reader holds the instance's trace_pipe until one is started.
        let closed = Arc::new(AtomicBool::new(true));
        // A second Ctrl-C ends the process without running `Drop`: stop the reader (an open
        // trace_pipe keeps the instance busy), then remove the instance.
        let (hook_dir, hook_stop, hook_closed) = (dir.clone(), stop.clone(), closed.clone());
        crate::signals::on_forced_exit(Box::new(move || {
            hook_stop.store(true, Ordering::SeqCst);
            for _ in 0..100 {
                if hook_closed.load(Ordering::SeqCst) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            remove_instance(&hook_dir);
        }));
        let mut inst = Self {
            dir,
            cpus: cpus.clone(),
            clock: clock.to_string(),
            missing_events: Vec::new(),
            stop,
            closed,
            reader: None,
            _mount: mount,
        };
        inst.configure(clock, buffer_kb, events)?;
        Ok(inst)
    }

    /// Sets `filter` on `event` (`group/event`), as its `filter` file takes it.
    pub fn set_filter(&self, event: &str, filter: &str) -> Result<()> {
        self.write(&format!("events/{event}/filter"), filter)
    }

    /// Turns one of the instance's `options/` on or off (`overwrite`: when the ring buffer is
    /// full, off drops the newest events instead of overwriting the oldest).
    pub fn set_option(&self, option: &str, on: bool) -> Result<()> {
        self.write(&format!("options/{option}"), if on { "1" } else { "0" })
    }

    /// Starts recording.
    pub fn tracing_on(&self) -> Result<()> {
        self.write("tracing_on", "1")
    }

    /// Reads what the ring buffer holds (the `trace` file, which pauses recording while it is
    /// open) and empties it; for an instance without a reader.
    pub fn take_text(&self) -> Result<String> {
        let path = self.dir.join("trace");
        let text =
            fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        self.write("trace", "")?;
        Ok(text)
    }

    fn configure(&mut self, clock: &str, buffer_kb: u64, events: &[String]) -> Result<()> {
        self.write("tracing_on", "0")?;
        let clocks = fs::read_to_string(self.dir.join("trace_clock")).unwrap_or_default();
        if !clocks
            .split_whitespace()
            .any(|c| c.trim_matches(['[', ']']) == clock)
        {
            bail!(
                "this kernel's tracefs has no `{clock}` trace clock (it offers: {}), so gaps \
                 cannot be matched with events",
                clocks.trim()
            );
        }
        self.write("trace_clock", clock)?;
        // Resizing queues the kernel's `update_pages_handler` to every CPU's kworker, the
        // measured one included: 0 keeps the default size (1408 KiB per CPU).
        if buffer_kb > 0 {
            self.write("buffer_size_kb", &buffer_kb.to_string())?;
        }
        self.write("tracing_cpumask", &cpumask_hex(&self.cpus))?;
        // The process of each task, to tell our worker threads from another process's.
        if self.dir.join("options/record-tgid").exists() {
            self.write("options/record-tgid", "1")?;
        }
        for e in events {
            let path = self.dir.join("events").join(e).join("enable");
            if path.exists() {
                self.write(&format!("events/{e}/enable"), "1")?;
            } else {
                self.missing_events.push(e.clone());
            }
        }
        Ok(())
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        let path = self.dir.join(file);
        let mut f = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        f.write_all(value.as_bytes())
            .with_context(|| format!("cannot write `{value}` to {}", path.display()))
    }

    /// Events the ring buffer overwrote or dropped on each traced CPU, from
    /// `per_cpu/cpuN/stats` (`overrun` and `dropped events`).
    pub fn lost_by_stats(&self) -> u64 {
        self.cpus
            .iter()
            .map(|c| {
                let stats = fs::read_to_string(self.dir.join(format!("per_cpu/cpu{c}/stats")))
                    .unwrap_or_default();
                stats
                    .lines()
                    .filter_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        matches!(k.trim(), "overrun" | "dropped events")
                            .then(|| v.trim().parse::<u64>().ok())
                            .flatten()
                    })
                    .sum::<u64>()
            })
            .sum()
    }

    /// Stops tracing, reads what is left, and returns everything read.
    pub fn stop(mut self) -> Result<(Gathered, u64)> {
        let _ = self.write("tracing_on", "0");
        let lost = self.lost_by_stats();
        self.stop.store(true, Ordering::SeqCst);
        let gathered = self
            .reader
            .take()
            .map(|h| h.join().map_err(|_| anyhow!("the trace reader panicked")))
            .transpose()?
            .unwrap_or_default();
        Ok((gathered, lost))
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.write("tracing_on", "0");
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
        remove_instance(&self.dir);
    }
}

/// Stops an instance and removes it, which frees its buffer and every setting with it
/// (harmless when done already). Busy while a reader holds `trace_pipe`: retried for a second.
fn remove_instance(dir: &Path) {
    let _ = fs::write(dir.join("tracing_on"), "0");
    for _ in 0..50 {
        match fs::remove_dir(dir) {
            Ok(()) => break,
            Err(e) if e.kind() == ErrorKind::NotFound => break,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Whether tracefs is mounted or can be (the kernel has it).
pub fn available() -> Result<()> {
    let mounted = fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(2) == Some("tracefs"));
    let known = fs::read_to_string("/proc/filesystems")
        .unwrap_or_default()
        .lines()
        .any(|l| l.trim_end().ends_with("tracefs"));
    if mounted || known {
        Ok(())
    } else {
        bail!("this kernel has no tracefs (CONFIG_FTRACE): nothing can be traced")
    }
}

/// Tracing needs root: say so before anything starts.
pub fn preflight() -> Result<()> {
    // SAFETY: `geteuid` has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "--trace and `qpw-emu trace` need root: they create a tracefs instance (and may \
             have to mount tracefs); run with sudo"
        );
    }
    Ok(())
}

/// `tracing_cpumask`'s hex format: 32-bit words, most significant first, comma-separated.
pub fn cpumask_hex(cpus: &CpuSet) -> String {
    let max = cpus.last().unwrap_or(0);
    let words = max / 32 + 1;
    let mut out = Vec::with_capacity(words);
    for w in (0..words).rev() {
        let mut v: u32 = 0;
        for c in cpus.iter().filter(|c| c / 32 == w) {
            v |= 1 << (c % 32);
        }
        out.push(format!("{v:08x}"));
    }
    out.join(",")
}

/// Reads `trace_pipe` until told to stop and the pipe is empty.
fn read_pipe(mut pipe: File, stop: &AtomicBool) -> Gathered {
    let mut out = Gathered::default();
    let mut buf = vec![0u8; 1 << 16];
    let mut partial = String::new();
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(n) => {
                partial.push_str(&String::from_utf8_lossy(&buf[..n]));
                let complete = partial.rfind('\n').map_or(0, |i| i + 1);
                for line in partial[..complete].lines() {
                    take_line(line, &mut out);
                }
                partial.drain(..complete);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => break,
        }
    }
    for line in partial.lines() {
        take_line(line, &mut out);
    }
    out
}

fn take_line(line: &str, out: &mut Gathered) {
    match parse_line(line) {
        Ok(e) => out.timeline.push(&e),
        Err(ParseError::NotEvent) => {}
        Err(ParseError::Malformed { .. }) => {
            out.bad_count += 1;
            if out.bad_lines.len() < 5 {
                out.bad_lines.push(line.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_mount_says_what_is_missing_and_how_to_get_it() {
        let e = mount_refused(std::io::Error::from_raw_os_error(libc::EPERM)).to_string();
        assert!(
            e.contains("tracefs is not mounted and cannot be mounted"),
            "{e}"
        );
        assert!(
            e.contains("CAP_SYS_ADMIN") && e.contains("mount -t tracefs"),
            "{e}"
        );
    }

    #[test]
    fn the_cpu_mask_is_hex_words_most_significant_first() {
        assert_eq!(cpumask_hex(&CpuSet::from_iter([1])), "00000002");
        assert_eq!(
            cpumask_hex(&CpuSet::from_iter([0, 33])),
            "00000002,00000001"
        );
    }
}
