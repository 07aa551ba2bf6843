//! The running kernel's own per-CPU drains, set off from userspace: the very drains the PW/QPW
//! patches convert (`lru_add_drain_all`, SLUB's `flush_all`, `schedule_on_each_cpu`,
//! `drain_all_stock`), each of which, on a mainline kernel (mode 0), queues a work item to a
//! kworker on every CPU that has something cached and waits for it.
//!
//! | workload | trigger (what it does to the system) | work function on each CPU (6.18) |
//! |---|---|---|
//! | `kernel-lru` | `1 > /proc/sys/vm/compact_memory`: compacts every zone | `lru_add_drain_per_cpu` |
//! | `kernel-slub` | `1 > /sys/kernel/slab/maple_node/shrink`: empties that cache's per-CPU slabs | `flush_cpu_slab` |
//! | `kernel-vmstat` | `1 > /proc/sys/vm/stat_refresh`: folds every CPU's vm counters | `refresh_vm_stats` |
//! | `kernel-memcg` | in a memory cgroup of our own: `memory.force_empty` (v1) or a lowered `memory.high` (v2) | `drain_local_memcg_stock`, `drain_local_obj_stock` (`drain_local_stock` before 6.16) |
//!
//! A drain reaches a CPU only if that CPU has something cached (except `stat_refresh`, which
//! goes to every CPU), so for `kernel-lru`, `kernel-slub` and `kernel-memcg` a small **filler**
//! process pinned to the measured CPU frees the few pages of its last fill and faults in new
//! ones right before each trigger (that fills the CPU's LRU batch, its `maple_node` slab and,
//! inside the cgroup, its memcg stock; the pages stay mapped until the next fill, since
//! unmapping drains this CPU's LRU batches itself). The filler's own run shows up in the attribution under its own name
//! (`qpw-filler`), apart from the kworker's.
//!
//! The requester (on a housekeeping CPU) times each trigger's `write()`: for
//! `lru_add_drain_all` that includes waiting for every CPU's work to finish.

pub mod info;
pub mod pcp;

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{anyhow, bail, Context as _, Result};

use crate::clock::monotonic_ns;
use crate::load::{DrainTimes, Phase, RequesterReport};

/// One of the kernel's drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelDrain {
    /// `lru_add_drain_all`, through memory compaction.
    Lru,
    /// SLUB's `flush_all`, through a cache's `shrink`.
    Slub,
    /// `schedule_on_each_cpu(refresh_vm_stats)`, through `stat_refresh`.
    Vmstat,
    /// `drain_all_stock`, through a memory cgroup of our own.
    Memcg,
    /// The page allocator's `drain_all_pages`, through a 1 GiB huge page allocated and freed:
    /// mode 1 in mainline since 6.0 ([`pcp`]).
    Pcp,
}

/// The SLUB cache shrunk: one the filler's `mmap`/`munmap` allocates from on the measured CPU
/// (the address-space tree's nodes). `vm_area_struct` and `anon_vma_chain` also fill, but
/// their flush is too short (2 us) to stand apart from the probe's own noise.
pub const SLAB_CACHE: &str = "maple_node";

impl KernelDrain {
    /// Every kernel workload, in the order the help lists them.
    pub const ALL: [KernelDrain; 5] = [
        KernelDrain::Lru,
        KernelDrain::Slub,
        KernelDrain::Vmstat,
        KernelDrain::Memcg,
        KernelDrain::Pcp,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            KernelDrain::Lru => "kernel-lru",
            KernelDrain::Slub => "kernel-slub",
            KernelDrain::Vmstat => "kernel-vmstat",
            KernelDrain::Memcg => "kernel-memcg",
            KernelDrain::Pcp => "kernel-pcp",
        }
    }

    /// The default trigger rate: a compaction costs the requester a few hundred ms, a slab
    /// shrink or vmstat refresh a few ms, a cgroup's force_empty 5-15 ms, a 1 GiB huge page
    /// about 0.9 s (measured on the development VM; 2-5 s in a TCG guest).
    pub fn default_rate_hz(self) -> f64 {
        match self {
            KernelDrain::Pcp => 1.0,
            KernelDrain::Lru => 2.0,
            KernelDrain::Slub | KernelDrain::Vmstat => 50.0,
            KernelDrain::Memcg => 20.0,
        }
    }

    /// What a trigger does to the system, in words.
    pub fn effect(self) -> String {
        match self {
            KernelDrain::Lru => "compacts all memory (writes 1 to /proc/sys/vm/compact_memory), \
                                 which runs lru_add_drain_all"
                .to_string(),
            KernelDrain::Slub => format!(
                "shrinks the {SLAB_CACHE} slab cache (writes 1 to \
                 /sys/kernel/slab/{SLAB_CACHE}/shrink), which runs SLUB's flush_all"
            ),
            KernelDrain::Vmstat => "refreshes the vm statistics (writes 1 to \
                                    /proc/sys/vm/stat_refresh), which runs \
                                    schedule_on_each_cpu(refresh_vm_stats)"
                .to_string(),
            KernelDrain::Memcg => "creates a memory cgroup of its own (removed at the end), \
                                   charges pages in it from the measured CPU, and empties it \
                                   (memory.force_empty on cgroup v1, a lowered memory.high on \
                                   v2), which runs drain_all_stock"
                .to_string(),
            KernelDrain::Pcp => format!(
                "holds a 1 GiB huge page for the run (writes one more to {}) and at each trigger \
                 frees it and allocates it again, which runs drain_all_pages on the page's zone",
                pcp::POOL
            ),
        }
    }

    /// Whether the kernel drains the target from the caller, with no work on the target
    /// (mode 1): `drain_all_pages` since 6.0; the others queue to each CPU (mode 0).
    pub fn is_remote(self) -> bool {
        matches!(self, KernelDrain::Pcp)
    }

    /// The work function whose run on a CPU is the drain reaching it, under each name it has
    /// had: the first is 6.18's, the others older kernels' (`drain_local_stock` before 6.16
    /// split memcg's stock in two).
    pub fn drain_functions(self) -> &'static [&'static str] {
        match self {
            KernelDrain::Memcg => &["drain_local_memcg_stock", "drain_local_stock"],
            k => &k.work_functions()[..1],
        }
    }

    /// The work functions a trigger queues to each CPU, on 6.18 and, where it differs, before.
    pub fn work_functions(self) -> &'static [&'static str] {
        match self {
            KernelDrain::Lru => &["lru_add_drain_per_cpu"],
            KernelDrain::Slub => &["flush_cpu_slab"],
            KernelDrain::Vmstat => &["refresh_vm_stats"],
            // `drain_local_stock` until 6.16 split the stock in two.
            KernelDrain::Memcg => &[
                "drain_local_memcg_stock",
                "drain_local_obj_stock",
                "drain_local_stock",
            ],
            // What `drain_all_pages` queued to each CPU before 6.0; none since.
            KernelDrain::Pcp => &["drain_local_pages_wq"],
        }
    }

    /// Whether the measured CPU needs the filler for the drain to reach it.
    pub fn needs_filler(self) -> bool {
        !matches!(self, KernelDrain::Vmstat)
    }

    /// The kernel workload named `name`, if it is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

impl std::fmt::Display for KernelDrain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a preflight leaves ready for the run's triggers: for kernel-pcp, the 1 GiB huge page
/// its try allocated, held from then on ([`pcp::Pool`]; freed when the last clone is dropped).
#[derive(Debug, Clone, Default)]
pub struct Ready {
    /// kernel-pcp's pool, its page held.
    pub pcp_pool: Option<pcp::SharedPool>,
}

/// Checks, before anything starts, that `drain` can run here (root, and the file it writes;
/// kernel-pcp also tries its trigger), and returns what it leaves ready.
pub fn preflight(drain: KernelDrain) -> Result<Ready> {
    check(drain)?;
    Ok(Ready {
        pcp_pool: match drain {
            KernelDrain::Pcp => Some(pcp::preflight()?),
            _ => None,
        },
    })
}

/// The checks of [`preflight`] that change nothing: root, and the file the drain writes.
fn check(drain: KernelDrain) -> Result<()> {
    // SAFETY: `geteuid` has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "--workload {drain} needs root: it {}; run with sudo, or use the emulated \
             workloads (lru, memcg, slub), which need no privilege",
            drain.effect()
        );
    }
    match drain {
        KernelDrain::Lru => need_file("/proc/sys/vm/compact_memory", "CONFIG_COMPACTION"),
        KernelDrain::Slub => need_file(
            &format!("/sys/kernel/slab/{SLAB_CACHE}/shrink"),
            "SLUB with sysfs (CONFIG_SLUB, CONFIG_SYSFS)",
        ),
        KernelDrain::Vmstat => need_file("/proc/sys/vm/stat_refresh", "CONFIG_PROC_FS"),
        KernelDrain::Memcg => MemCgroup::locate().map(|_| ()),
        KernelDrain::Pcp => need_file(
            pcp::POOL,
            "1 GiB huge pages (the pdpe1gb CPU flag, CONFIG_HUGETLBFS)",
        ),
    }
}

fn need_file(path: &str, what: &str) -> Result<()> {
    if Path::new(path).exists() {
        Ok(())
    } else {
        bail!("{path} does not exist: this kernel lacks {what}, which the workload needs")
    }
}

/// Where memory cgroups live: v1 (`/sys/fs/cgroup/memory`) or v2 (a unified hierarchy with
/// the memory controller).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Hierarchy {
    V1(PathBuf),
    V2(PathBuf),
}

/// A memory cgroup of ours, removed on drop.
#[derive(Debug)]
pub struct MemCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemCgroup {
    fn locate() -> Result<Hierarchy> {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        Self::locate_in(&mounts, |dir| {
            std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default()
        })
    }

    /// [`Self::locate`] over the text of `/proc/mounts`, with `controllers` reading a cgroup
    /// v2 root's `cgroup.controllers`.
    fn locate_in(mounts: &str, controllers: impl Fn(&Path) -> String) -> Result<Hierarchy> {
        let mut v2 = None;
        for l in mounts.lines() {
            let f: Vec<&str> = l.split(' ').collect();
            if f.len() < 4 {
                continue;
            }
            if f[2] == "cgroup" && f[3].split(',').any(|o| o == "memory") {
                return Ok(Hierarchy::V1(PathBuf::from(f[1])));
            }
            if f[2] == "cgroup2" {
                let controllers = controllers(Path::new(f[1]));
                if controllers.split_whitespace().any(|c| c == "memory") {
                    v2 = Some(PathBuf::from(f[1]));
                }
            }
        }
        v2.map(Hierarchy::V2).ok_or_else(|| {
            anyhow!(
                "no memory cgroup controller is mounted (neither a cgroup v1 `memory` hierarchy \
                 nor cgroup v2 with `memory` in cgroup.controllers): kernel-memcg needs \
                 CONFIG_MEMCG and the controller mounted"
            )
        })
    }

    /// Creates `qpw-emu-<pid>` under the memory hierarchy.
    pub fn create() -> Result<Self> {
        let (root, v2) = match Self::locate()? {
            Hierarchy::V1(p) => (p, false),
            Hierarchy::V2(p) => (p, true),
        };
        if v2 {
            let control =
                std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
            if !control.split_whitespace().any(|c| c == "memory") {
                bail!(
                    "cgroup v2 at {} does not delegate the memory controller to its children \
                     (add it with `echo +memory > {}/cgroup.subtree_control`); nothing was \
                     changed",
                    root.display(),
                    root.display()
                );
            }
        }
        remove_stale_cgroups(&root);
        let dir = root.join(format!("qpw-emu-{}", std::process::id()));
        std::fs::create_dir(&dir)
            .with_context(|| format!("cannot create the memory cgroup {}", dir.display()))?;
        // A second Ctrl-C ends the process without running `Drop`: the filler then sees its
        // stdin close and ends, and the emptied cgroup can go.
        let hook_dir = dir.clone();
        crate::signals::on_forced_exit(Box::new(move || remove_cgroup(&hook_dir)));
        Ok(Self { dir, v2 })
    }

    /// The file a process writes `0` to in order to join.
    fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Empties the cgroup's charges: `memory.force_empty` (v1); on v2, a `memory.high` just
    /// under the usage, then back to `max`. Writing `memory.high` above the usage runs
    /// `drain_all_stock` and then reclaims, but never calls the OOM killer, where a lowered
    /// `memory.max` does once reclaim fails: the drain is asynchronous (queued to each CPU),
    /// so reclaim may run before the stocks are back, and a filler whose pages cannot be
    /// reclaimed (a binary in an initramfs, no swap) was killed (seen in a 6.1 guest).
    fn empty(&self, force_empty: &mut Option<File>) -> std::io::Result<()> {
        if !self.v2 {
            let f = match force_empty {
                Some(f) => f,
                None => force_empty.insert(
                    OpenOptions::new()
                        .write(true)
                        .open(self.dir.join("memory.force_empty"))?,
                ),
            };
            return f.write_all(b"0");
        }
        let current: u64 = std::fs::read_to_string(self.dir.join("memory.current"))?
            .trim()
            .parse()
            .unwrap_or(0);
        let high = self.dir.join("memory.high");
        std::fs::write(&high, current.saturating_sub(4096).max(4096).to_string())?;
        std::fs::write(&high, "max")
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // The filler has left (it was killed and reaped first); an emptied cgroup can go.
        remove_cgroup(&self.dir);
    }
}

/// Removes the memory cgroups `qpw-emu-<pid>` under `root` of runs that were killed before
/// they could remove them (their process is gone), saying so on stderr. A killed run's filler
/// leaves its cgroup when it sees its stdin close, so a cgroup still busy is given a second.
fn remove_stale_cgroups(root: &Path) {
    for (dir, pid) in crate::rt::stale_entries(root, "qpw-emu-", "") {
        remove_cgroup(&dir);
        if dir.exists() {
            eprintln!(
                "qpw-emu: cannot remove the memory cgroup {} left by a run (pid {pid}) that \
                 ended without removing it: it still holds a task (see its cgroup.procs)",
                dir.display()
            );
        } else {
            eprintln!(
                "qpw-emu: removed the memory cgroup {} left by a run (pid {pid}) that ended \
                 without removing it",
                dir.display()
            );
        }
    }
}

/// Removes a cgroup once its last task has left (harmless when gone): retried for a second.
fn remove_cgroup(dir: &Path) {
    for _ in 0..100 {
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The filler: a child process pinned to the measured CPU that frees its last few pages and
/// faults in new ones when asked (one byte on its stdin), and answers when done (one byte on its stdout).
#[derive(Debug)]
struct Filler {
    child: Child,
    to: ChildStdin,
    from: ChildStdout,
}

impl Filler {
    fn start(cpu: usize, cgroup: Option<&MemCgroup>, pcp: bool) -> Result<Self> {
        let exe = std::env::current_exe().context("cannot find our own executable")?;
        let mut cmd = Command::new(exe);
        cmd.args(["__filler", &cpu.to_string()]);
        if pcp {
            cmd.arg("--pcp");
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // Under --isolate's cgroup v2 partition the filler moves its thread in before it pins
        // itself there (which a filler in a memory cgroup of its own cannot).
        if let Some(p) = crate::isolate::partition::active_for_child() {
            if cgroup.is_some() {
                bail!("kernel-memcg: {}", crate::isolate::NO_MEMCG_UNDER_PARTITION);
            }
            cmd.env(crate::isolate::partition::PARTITION_ENV, p);
        }
        if let Some(cg) = cgroup {
            let procs = std::ffi::CString::new(cg.procs().as_os_str().as_encoded_bytes())?;
            // SAFETY: the closure runs in the child between fork and exec and makes only
            // async-signal-safe system calls (open, write, close) on a path made beforehand.
            unsafe {
                cmd.pre_exec(move || {
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                    let err = std::io::Error::last_os_error();
                    libc::close(fd);
                    if ok {
                        Ok(())
                    } else {
                        Err(err)
                    }
                });
            }
        }
        let mut child = cmd
            .spawn()
            .context("cannot start the filler process (qpw-emu __filler)")?;
        let (Some(to), Some(from)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            bail!("the filler process has no pipes");
        };
        let mut filler = Self { child, to, from };
        // It answers once when it is pinned and ready.
        filler.wait_answer()?;
        Ok(filler)
    }

    fn wait_answer(&mut self) -> Result<()> {
        let mut b = [0u8; 1];
        match self.from.read(&mut b) {
            Ok(1) if b[0] == b'+' => Ok(()),
            Ok(1) => bail!("the filler failed (answer {:?})", b[0] as char),
            _ => bail!("the filler process ended"),
        }
    }

    /// Asks for one fill and waits for it.
    fn fill(&mut self) -> Result<()> {
        // A filler that died (the OOM killer, a kill by hand) must end this run with an error,
        // not kill it with SIGPIPE (which qpw-emu ignores, but a library user may not).
        crate::rt::without_sigpipe(|| self.to.write_all(b"f"))
            .context("cannot reach the filler process (it has ended)")?;
        self.wait_answer()
    }

    /// kernel-pcp's fill (a filler started with `--pcp`): the frame numbers of the pages it
    /// freed on its CPU (0 for a page whose number it could not read).
    fn fill_pcp(&mut self) -> Result<Vec<u64>> {
        self.fill()?;
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        loop {
            match self.from.read(&mut b) {
                Ok(1) if b[0] == b'\n' => break,
                Ok(1) => line.push(b[0]),
                _ => bail!("the filler process ended"),
            }
        }
        String::from_utf8_lossy(&line)
            .split_whitespace()
            .map(|p| {
                u64::from_str_radix(p, 16).context("the filler's answer is not a frame number")
            })
            .collect()
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The body of `qpw-emu __filler CPU [--pcp]`: pin, report ready, then fill on request until
/// stdin closes.
pub fn filler_main(cpu: usize, pcp: bool) -> Result<()> {
    // Named first, so that a trace of the target shows it as the filler from its first run
    // there.
    let name = std::ffi::CString::new("qpw-filler")?;
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
    crate::isolate::partition::hook_from_env();
    // Not `pin_current_thread`, which checks the CPU against the affinity this process started
    // with: `qpw-emu run` keeps its main thread, which starts the filler, off the target.
    qpw_core::set_current_affinity(&qpw_core::CpuSet::from_iter([cpu]))
        .with_context(|| format!("filler: cannot pin to cpu {cpu}"))?;
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(b"+")?;
    stdout.flush()?;
    let mut b = [0u8; 1];
    if pcp {
        return pcp::fill_loop(&mut stdin, &mut stdout);
    }
    const PAGES: usize = 16;
    const LEN: usize = PAGES * 4096;
    // The pages of the last fill stay mapped until the next one: unmapping runs
    // `lru_add_drain()` on this CPU (the unmap path does, in 6.1 at least), which would empty
    // the very LRU batch that kernel-lru's drain is to find full. So each fill first unmaps
    // the last fill's pages (which frees its maple-tree nodes into this CPU's slab), then maps
    // and touches new ones (LRU batch, memcg charges and stock, new nodes).
    let mut last: Option<*mut u8> = None;
    while stdin.read(&mut b)? == 1 {
        if let Some(p) = last.take() {
            // SAFETY: `p` is a mapping of LEN bytes made by `map_and_touch` and not unmapped
            // since.
            unsafe { libc::munmap(p.cast(), LEN) };
        }
        last = map_and_touch(PAGES);
        let ok = last.is_some();
        stdout.write_all(if ok { b"+" } else { b"!" })?;
        stdout.flush()?;
    }
    Ok(())
}

/// Maps `pages` anonymous private pages and writes one byte to each: a page fault apiece, so
/// that each page comes off this CPU's pcp lists and onto its LRU batch (and, in a memory
/// cgroup, is charged through this CPU's stock). `None` when `mmap` fails.
fn map_and_touch(pages: usize) -> Option<*mut u8> {
    // SAFETY: a fresh anonymous private mapping of `pages` pages, written only within it.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            pages * 4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return None;
        }
        for i in 0..pages {
            std::ptr::write_volatile(p.cast::<u8>().add(i * 4096), 1);
        }
        Some(p.cast())
    }
}

/// The kernel drain load: the requester thread, with the filler and the cgroup it needs.
#[derive(Debug)]
pub struct KernelLoad {
    requester: Option<JoinHandle<Result<(RequesterReport, DrainTimes)>>>,
    /// Dropped after the requester has stopped: the filler first, then its cgroup.
    _filler_and_cgroup: Arc<std::sync::Mutex<(Option<Filler>, Option<MemCgroup>)>>,
}

/// The pause between a fill and the trigger.
const FILL_TO_TRIGGER: std::time::Duration = std::time::Duration::from_millis(1);

impl KernelLoad {
    /// Sets up `drain` (cgroup and filler on `target`) and starts the requester on
    /// `requester_cpu`; it fires `rate_hz` times a second once `phase` goes. `ready` is what
    /// [`preflight`] left (kernel-pcp's held page; a pool of its own is made without it).
    pub fn start(
        drain: KernelDrain,
        target: usize,
        requester_cpu: usize,
        rate_hz: f64,
        phase: &Arc<Phase>,
        ready: &Ready,
    ) -> Result<Self> {
        check(drain)?;
        let pcp_pool = match (drain, &ready.pcp_pool) {
            (KernelDrain::Pcp, Some(p)) => Some(p.clone()),
            (KernelDrain::Pcp, None) => Some(pcp::shared(pcp::Pool::new()?)),
            _ => None,
        };
        let cgroup = match drain {
            KernelDrain::Memcg => Some(MemCgroup::create()?),
            _ => None,
        };
        let filler = if drain.needs_filler() {
            Some(Filler::start(
                target,
                cgroup.as_ref(),
                drain == KernelDrain::Pcp,
            )?)
        } else {
            None
        };
        let shared = Arc::new(std::sync::Mutex::new((filler, cgroup)));
        let requester = if rate_hz > 0.0 {
            let (shared, phase) = (shared.clone(), phase.clone());
            Some(
                std::thread::Builder::new()
                    .name("qpw-kernel-requester".into())
                    .spawn(move || match (drain, pcp_pool) {
                        (KernelDrain::Pcp, Some(pool)) => {
                            pcp::requester(target, requester_cpu, rate_hz, &shared, &phase, &pool)
                        }
                        _ => requester(drain, requester_cpu, rate_hz, &shared, &phase),
                    })
                    .with_context(|| {
                        format!("cannot start the requester thread (cpu {requester_cpu})")
                    })?,
            )
        } else {
            None
        };
        Ok(Self {
            requester,
            _filler_and_cgroup: shared,
        })
    }

    /// Waits for the requester (after the phase was stopped) and tears down.
    pub fn finish(mut self) -> Result<Option<(RequesterReport, DrainTimes)>> {
        self.requester
            .take()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow!("the kernel requester thread panicked"))?
            })
            .transpose()
    }
}

/// A kernel requester's start, whichever the drain: pinned to `cpu`, with its drain times and
/// its report (no forced drains: the kernel decides whom it drains) still empty.
fn start_requester(cpu: usize, rate_hz: f64) -> Result<(DrainTimes, RequesterReport)> {
    qpw_core::pin_current_thread(cpu)
        .with_context(|| format!("cannot pin the requester to cpu {cpu}"))?;
    let report = RequesterReport {
        cpu,
        rate_hz,
        force: false,
        ..RequesterReport::default()
    };
    Ok((DrainTimes::new(), report))
}

fn requester(
    drain: KernelDrain,
    cpu: usize,
    rate_hz: f64,
    shared: &std::sync::Mutex<(Option<Filler>, Option<MemCgroup>)>,
    phase: &Phase,
) -> Result<(RequesterReport, DrainTimes)> {
    let (mut hist, mut report) = start_requester(cpu, rate_hz)?;
    let trigger_path = match drain {
        KernelDrain::Lru => Some("/proc/sys/vm/compact_memory".to_string()),
        KernelDrain::Slub => Some(format!("/sys/kernel/slab/{SLAB_CACHE}/shrink")),
        KernelDrain::Vmstat => Some("/proc/sys/vm/stat_refresh".to_string()),
        KernelDrain::Memcg | KernelDrain::Pcp => None,
    };
    let mut trigger = trigger_path
        .as_ref()
        .map(|p| {
            OpenOptions::new()
                .write(true)
                .open(p)
                .with_context(|| format!("cannot open {p}"))
        })
        .transpose()?;
    let mut force_empty = None;
    if !phase.wait_go() {
        return Ok((report, hist));
    }
    let missed = crate::load::paced(rate_hz, phase, || {
        let mut guard = shared.lock().unwrap_or_else(|e| e.into_inner());
        let (filler, cgroup) = &mut *guard;
        if let Some(f) = filler {
            if let Err(e) = f.fill() {
                report.errors += 1;
                report.first_error.get_or_insert_with(|| format!("{e:#}"));
                return;
            }
            // Let the probe run again before the drain, so that the filler's run and the
            // kworker's are two gaps, each attributed to its own.
            std::thread::sleep(FILL_TO_TRIGGER);
        }
        let t0 = monotonic_ns();
        let out = match (&mut trigger, cgroup) {
            (Some(f), _) => f.write_all(b"1"),
            (None, Some(cg)) => cg.empty(&mut force_empty),
            (None, None) => Ok(()),
        };
        hist.record(monotonic_ns() - t0);
        report.drains += 1;
        if let Err(e) = out {
            report.errors += 1;
            report.first_error.get_or_insert_with(|| {
                format!(
                    "{}: {e}",
                    trigger_path.as_deref().unwrap_or("memory cgroup")
                )
            });
        }
    });
    report.missed_deadlines = missed;
    report.set_times(&hist);
    Ok((report, hist))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_hierarchy_is_found_in_v1_and_v2_or_refused_clearly() {
        let v1 = "cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,memory 0 0\n\
                  cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n";
        assert_eq!(
            MemCgroup::locate_in(v1, |_| String::new()).unwrap(),
            Hierarchy::V1(PathBuf::from("/sys/fs/cgroup/memory"))
        );
        let v2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n";
        assert_eq!(
            MemCgroup::locate_in(v2, |_| "cpuset cpu io memory pids".into()).unwrap(),
            Hierarchy::V2(PathBuf::from("/sys/fs/cgroup"))
        );
        // cgroup v2 without the memory controller, and no v1 memory hierarchy.
        let e = MemCgroup::locate_in(v2, |_| "cpu io".into())
            .unwrap_err()
            .to_string();
        assert!(e.contains("no memory cgroup controller is mounted"), "{e}");
        assert!(e.contains("CONFIG_MEMCG"), "{e}");
    }

    #[test]
    fn kernel_workloads_are_named_and_documented() {
        for k in KernelDrain::ALL {
            assert_eq!(KernelDrain::from_name(k.name()), Some(k));
            assert!(k.default_rate_hz() > 0.0);
            assert!(!k.work_functions().is_empty());
            assert!(k.effect().contains("writes") || k.effect().contains("cgroup"));
        }
        assert_eq!(KernelDrain::from_name("kernel-foo"), None);
    }
}
