//! `kernel-pcp`: the page allocator's `drain_all_pages()`, the kernel's own mode 1.
//!
//! Since 6.0 (commit 443c2accd1b6, "mm/page_alloc: remotely drain per-cpu lists") each CPU's
//! pcp lists are guarded by a real spinlock, and `__drain_all_pages()` drains every CPU that has
//! pages there *from the caller*, under that CPU's `pcp->lock` (`drain_pages_zone()`): no work
//! item, no kworker on the target. It is the precedent the QPW thread cites, mode 1 in every
//! kernel the guests boot (6.1, 6.1-rt, 6.12), with nothing to build.
//!
//! # The trigger
//!
//! Of `drain_all_pages()`'s callers, one is reached from userspace at will and never harms the
//! machine: allocating a gigantic huge page. Writing one more to
//! `/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages` makes the kernel look for a free
//! 1 GiB range (`alloc_contig_pages()`), isolate it (`start_isolate_page_range()`), and then
//! call `drain_all_pages(zone)` for the range's zone so that pages cached on the pcp lists come
//! back to the buddy lists; it migrates what is in use out of the range and takes it. Writing
//! the old number back frees the page. The run holds one such page from its preflight on, and
//! each trigger frees it and allocates it again ([`Pool`]: a fresh range is often not to be
//! had once the kernel's own unmovable pages have spread). The others were ruled out: memory offlining
//! (`zone_pcp_disable()`) fails on most blocks of a VM and queues LRU work to every CPU
//! (`lru_cache_disable()`); `compact_memory` does not call `drain_all_pages()`; kcompactd and
//! the direct-reclaim retry are not ours to set off; `/proc/pagetypeinfo` drains only with
//! `page_owner=on`; soft-offlining poisons pages for good.
//!
//! Two things to know. The zone drained is the range's, not the caller's choice: on this
//! project's 24 GiB development VM the range is found in `DMA32` (most of its `Normal` zone is
//! not online memory), where the measured CPU's lists are usually empty; in a guest of 6 GiB
//! it is `Normal`, where the filler's pages are. And the allocation's migration step calls
//! `lru_cache_disable()`, which queues `lru_add_drain_per_cpu` (mode 0) to every CPU whose LRU
//! batches hold pages: so the filler leaves the measured CPU's batches empty (it unmaps what
//! it faulted in, and unmapping drains that CPU's own batch), and the trace counts every work
//! item queued to the target during a trigger, so that such a work item would show.
//!
//! # Who drained the target's pages
//!
//! Before each trigger the filler, pinned to the target, faults in and unmaps
//! [`FILL_PAGES`] pages, so that they go onto the target's pcp lists, and answers with their
//! frame numbers (from `/proc/self/pagemap`, root). A private tracefs instance
//! (`qpw-emu-pcp-<pid>`) records, on the requester's CPU and the target's,
//! `kmem:mm_page_pcpu_drain` (a page leaving a pcp list; filtered, before each trigger, to the
//! filler's frame numbers and to anything on the target CPU: unfiltered, the requester's own
//! CPU trimming its lists while the allocation migrates up to a gigabyte of pages fired some
//! 50 000 events per trigger in a 6.1 guest and overwrote the few that matter) and
//! `workqueue:workqueue_queue_work` (filtered to work queued to the target); a full buffer
//! drops the newest events rather than overwriting the oldest, and the drops are counted. After each trigger the requester reads it: each of the filler's pages that left a
//! pcp list, with the CPU and task that freed it (the requester's thread on its CPU, in mode 1;
//! a kworker on the target in mode 0), each work item queued to the target, and the target's
//! pcp count in each zone before and after (`/proc/zoneinfo`). The pool is raised and lowered
//! through [`crate::setting`], so that a killed run's page is given back by the next run.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Mutex;

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

use super::{Filler, MemCgroup, FILL_TO_TRIGGER};
use crate::clock::monotonic_ns;
use crate::load::{DrainTimes, Phase, RequesterReport};
use crate::setting::{Changed, Kind};
use crate::trace::event::{parse_line, Kind as EventKind};
use crate::trace::tracefs;

/// The 1 GiB huge-page pool's size.
pub const POOL: &str = "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages";

/// Pages the filler faults in and frees onto the target's pcp lists before each trigger.
pub const FILL_PAGES: usize = 32;

/// The events of the pcp trace.
const EVENTS: [&str; 2] = ["kmem/mm_page_pcpu_drain", "workqueue/workqueue_queue_work"];

/// The pcp trace's ring buffer per CPU: the default (1408 KiB), since a resize runs a kworker
/// on every CPU, the measured one included; a trigger drains some thousands of pages at most
/// in the guests (about 40 bytes each), and overruns are counted.
const BUFFER_KB: u64 = 0;

/// Tries of the trigger before kernel-pcp is refused.
const PREFLIGHT_TRIES: usize = 3;

/// Checks that a 1 GiB huge page can be had here (the caller checked that the pool exists):
/// tries the trigger, and returns the pool with the page it allocated, held for the run's
/// triggers.
pub fn preflight() -> Result<SharedPool> {
    // The try changes the pool: a Ctrl-C now must stop the run in order (the guard puts the
    // pool back), not end the process before the command takes the signals.
    let _ = crate::signals::install();
    let mut pool = Pool::new()?;
    // A range the kernel's own unmovable pages (slab, page tables) sit in cannot be isolated;
    // they come and go, so a failure is tried again before the row is refused.
    let mut t = pool.trigger()?;
    for _ in 1..PREFLIGHT_TRIES {
        if t.allocated {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        t = pool.trigger()?;
    }
    if !t.allocated {
        let free = meminfo_kb("MemFree").map_or("?".into(), |kb| format!("{}", kb / 1024));
        bail!(
            "the kernel found no free 1 GiB range for a huge page in {PREFLIGHT_TRIES} tries \
             ({POOL} read back {} after writing {}; {free} MiB free): kernel-pcp sets off \
             drain_all_pages by allocating one, which needs a zone with a 1 GiB aligned range \
             holding no unmovable page (guest/qpw-guest gives its guests six, above 4 GiB)",
            t.read_back.trim(),
            pool.changed.written()
        );
    }
    Ok(shared(pool))
}

fn meminfo_kb(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(key)?
            .strip_prefix(':')?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()
    })
}

/// The pool, one page more than it had while the run holds its page; put back on every way
/// out.
///
/// A trigger frees the held page and allocates it again: the kernel looks for a free range from
/// the zone's start, skips those it cannot isolate (one unmovable page of the kernel's in a
/// range is enough, and after a few minutes of the default run most ranges of a guest held one
/// in the 6.1-rt guest: 1 fresh allocation in 19 succeeded) and takes the one just freed, which
/// nothing had time to take a page of. Holding a gigabyte for the length of a run costs the
/// machine that gigabyte, nothing else.
#[derive(Debug)]
pub struct Pool {
    changed: Changed,
    /// Whether the run holds the page now (the pool reads one more than it did).
    held: bool,
}

/// The pool, shared by the scenarios of one run (the page stays held between them).
pub type SharedPool = std::sync::Arc<Mutex<Pool>>;

/// `pool`, to share.
pub fn shared(pool: Pool) -> SharedPool {
    std::sync::Arc::new(Mutex::new(pool))
}

/// What one trigger did.
#[derive(Debug, Clone)]
pub struct Trigger {
    /// Whether the kernel allocated the page (the pool read back one more).
    pub allocated: bool,
    /// What the pool read after the raise.
    pub read_back: String,
    /// How long the raise (the allocation, and the drain in it) took, in nanoseconds.
    pub raise_ns: u64,
    /// The zone the page was taken from (the zone drained): the one whose free pages fell by
    /// half a gigabyte or more while the page was held.
    pub zone: Option<String>,
}

impl Pool {
    /// Records the pool's size (for the next run to put back should this one be killed).
    pub fn new() -> Result<Self> {
        let changed = Changed::record(
            Kind::HugePages,
            Path::new(POOL),
            |found| {
                let n: u64 = found
                    .trim()
                    .parse()
                    .with_context(|| format!("{POOL} reads {:?}, not a number", found.trim()))?;
                Ok((n + 1).to_string())
            },
            Some(Path::new(crate::isolate::STATE_DIR)),
        )?;
        Ok(Self {
            changed,
            held: false,
        })
    }

    /// One trigger: the held page freed (when the run holds one), then one more page in the
    /// pool (the kernel allocates it, draining the range's zone on every CPU), held until the
    /// next trigger or the guard's end.
    pub fn trigger(&mut self) -> Result<Trigger> {
        if self.held {
            self.held = false;
            self.changed.write_saved().with_context(|| {
                format!(
                    "cannot write {} back to {POOL}",
                    self.changed.saved().trim()
                )
            })?;
        }
        let before = zones();
        let t0 = monotonic_ns();
        let raised = self.changed.write_changed();
        let raise_ns = monotonic_ns() - t0;
        let read_back = std::fs::read_to_string(POOL).unwrap_or_default();
        let held = zones();
        raised.with_context(|| format!("cannot write {} to {POOL}", self.changed.written()))?;
        let allocated = read_back.trim() == self.changed.written().trim();
        self.held = allocated;
        const HALF_GIB_PAGES: u64 = (1 << 29) / 4096;
        let zone = held
            .iter()
            .find(|z| {
                before
                    .iter()
                    .find(|b| b.name == z.name)
                    .is_some_and(|b| b.free >= z.free + HALF_GIB_PAGES)
            })
            .map(|z| z.name.clone());
        Ok(Trigger {
            allocated,
            read_back,
            raise_ns,
            zone,
        })
    }
}

/// One zone of `/proc/zoneinfo`: its pfn span and each CPU's pcp count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Zone {
    /// `Normal`, `DMA32`, ...; `Normal (node 1)` past node 0.
    pub name: String,
    /// Its first page frame.
    pub start_pfn: u64,
    /// The frames it spans.
    pub spanned: u64,
    /// Its free pages (`pages free`).
    pub free: u64,
    /// Per CPU: pages on its pcp lists (`count`).
    pub pcp: BTreeMap<usize, u64>,
}

/// The zones now.
pub fn zones() -> Vec<Zone> {
    parse_zoneinfo(&std::fs::read_to_string("/proc/zoneinfo").unwrap_or_default())
}

/// The zones of the text of `/proc/zoneinfo` (empty zones left out).
pub fn parse_zoneinfo(text: &str) -> Vec<Zone> {
    let mut zones: Vec<Zone> = Vec::new();
    let mut cpu = None;
    for line in text.lines() {
        let l = line.trim();
        if let Some(rest) = l.strip_prefix("Node ") {
            // `Node 0, zone   Normal`
            let (node, zone) = rest.split_once(", zone").unwrap_or((rest, ""));
            let zone = zone.trim();
            zones.push(Zone {
                name: if node.trim() == "0" {
                    zone.to_string()
                } else {
                    format!("{zone} (node {})", node.trim())
                },
                ..Zone::default()
            });
            cpu = None;
            continue;
        }
        let Some(z) = zones.last_mut() else { continue };
        let mut words = l.split_whitespace();
        match (words.next(), words.next()) {
            (Some("spanned"), Some(n)) => z.spanned = n.parse().unwrap_or(0),
            (Some("pages"), Some("free")) => {
                z.free = words.next().and_then(|n| n.parse().ok()).unwrap_or(0);
            }
            (Some("start_pfn:"), Some(n)) => z.start_pfn = n.parse().unwrap_or(0),
            (Some("cpu:"), Some(n)) => cpu = n.parse().ok(),
            (Some("count:"), Some(n)) => {
                if let (Some(c), Ok(n)) = (cpu, n.parse()) {
                    z.pcp.insert(c, n);
                }
            }
            _ => {}
        }
    }
    zones.retain(|z| z.spanned > 0);
    zones
}

/// The zone that spans `pfn`.
pub fn zone_of(zones: &[Zone], pfn: u64) -> Option<&Zone> {
    zones
        .iter()
        .find(|z| pfn >= z.start_pfn && pfn < z.start_pfn + z.spanned)
}

/// What kernel-pcp's triggers did, summed over them: the requester's report carries it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PcpReport {
    /// The measured CPU.
    pub target_cpu: usize,
    /// Triggers made.
    pub triggers: u64,
    /// Of them, those in which the kernel allocated the 1 GiB page.
    pub allocated: u64,
    /// Whether the pcp trace ran (root and tracefs): without it only the pcp counts remain.
    pub traced: bool,
    /// Why it did not, if it did not.
    pub trace_error: Option<String>,
    /// The pages the filler freed on the target right before the triggers, by zone
    /// (`unknown` when their frame numbers could not be read).
    pub target_pages: BTreeMap<String, u64>,
    /// Of them, the pages the requester's thread moved off a pcp list
    /// (`mm_page_pcpu_drain` from its thread, on its CPU): drained from another CPU.
    pub target_pages_drained_by_requester: u64,
    /// Of them, the pages that left a pcp list on the target CPU itself (a kworker draining
    /// its own lists, or the CPU trimming them).
    pub target_pages_drained_on_target: u64,
    /// Of them, the pages another task on another CPU moved.
    pub target_pages_drained_elsewhere: u64,
    /// The zone each allocated page was taken from (the zone `drain_all_pages` drained), by
    /// triggers.
    pub page_zones: BTreeMap<String, u64>,
    /// Pages that left a pcp list on the target CPU during the triggers, by the task that ran
    /// there.
    pub drained_on_target: BTreeMap<String, u64>,
    /// The target's pcp count in each zone right before each trigger, summed.
    pub target_pcp_before: BTreeMap<String, u64>,
    /// The same right after each trigger.
    pub target_pcp_after: BTreeMap<String, u64>,
    /// Work items queued to the target during the triggers by the requester's thread (the
    /// trigger itself), by function: none in mode 1.
    pub work_queued_by_requester: BTreeMap<String, u64>,
    /// Work items queued to the target during the triggers by anyone else, by function.
    pub work_queued_by_others: BTreeMap<String, u64>,
    /// Events the pcp trace lost (its ring buffer overran).
    pub lost_events: u64,
}

fn add_map(to: &mut BTreeMap<String, u64>, from: &BTreeMap<String, u64>) {
    for (k, v) in from {
        *to.entry(k.clone()).or_default() += v;
    }
}

impl PcpReport {
    /// Adds another run's figures (the rounds of `qpw-emu run`).
    pub fn add(&mut self, o: &PcpReport) {
        self.target_cpu = o.target_cpu;
        self.triggers += o.triggers;
        self.allocated += o.allocated;
        self.traced |= o.traced;
        if self.trace_error.is_none() {
            self.trace_error.clone_from(&o.trace_error);
        }
        add_map(&mut self.target_pages, &o.target_pages);
        self.target_pages_drained_by_requester += o.target_pages_drained_by_requester;
        self.target_pages_drained_on_target += o.target_pages_drained_on_target;
        self.target_pages_drained_elsewhere += o.target_pages_drained_elsewhere;
        add_map(&mut self.page_zones, &o.page_zones);
        add_map(&mut self.drained_on_target, &o.drained_on_target);
        add_map(&mut self.target_pcp_before, &o.target_pcp_before);
        add_map(&mut self.target_pcp_after, &o.target_pcp_after);
        add_map(
            &mut self.work_queued_by_requester,
            &o.work_queued_by_requester,
        );
        add_map(&mut self.work_queued_by_others, &o.work_queued_by_others);
        self.lost_events += o.lost_events;
    }

    /// The filler's pages on the target, in all.
    pub fn target_pages_total(&self) -> u64 {
        self.target_pages.values().sum()
    }

    /// Takes in one trigger: the filler's frame numbers, the zones before and after, the
    /// trace's events during it, from the requester thread `requester_tid`.
    pub fn add_trigger(
        &mut self,
        pfns: &[u64],
        before: &[Zone],
        after: &[Zone],
        events: &[crate::trace::event::Event],
        requester_tid: i32,
    ) {
        let target = self.target_cpu;
        let zone_name = |pfn: u64| {
            zone_of(before, pfn).map_or_else(|| "unknown".to_string(), |z| z.name.clone())
        };
        let filler: BTreeSet<u64> = pfns.iter().copied().filter(|&p| p != 0).collect();
        for &p in pfns {
            let zone = if p == 0 {
                "unknown".to_string()
            } else {
                zone_name(p)
            };
            *self.target_pages.entry(zone).or_default() += 1;
        }
        let mut seen = BTreeSet::new();
        for e in events {
            match &e.kind {
                EventKind::PcpDrain { pfn } => {
                    let by_requester = e.pid == requester_tid;
                    if e.cpu == target {
                        *self.drained_on_target.entry(e.comm.clone()).or_default() += 1;
                    }
                    if filler.contains(pfn) && seen.insert(*pfn) {
                        if by_requester {
                            self.target_pages_drained_by_requester += 1;
                        } else if e.cpu == target {
                            self.target_pages_drained_on_target += 1;
                        } else {
                            self.target_pages_drained_elsewhere += 1;
                        }
                    }
                }
                EventKind::WorkQueued { function, cpu } if *cpu == target as i64 => {
                    let to = if e.pid == requester_tid {
                        &mut self.work_queued_by_requester
                    } else {
                        &mut self.work_queued_by_others
                    };
                    *to.entry(function.clone()).or_default() += 1;
                }
                _ => {}
            }
        }
        for (zones, into) in [
            (before, &mut self.target_pcp_before),
            (after, &mut self.target_pcp_after),
        ] {
            for z in zones {
                if let Some(n) = z.pcp.get(&target) {
                    *into.entry(z.name.clone()).or_default() += n;
                }
            }
        }
    }

    /// One line for the reports: who drained the target's pages, and what was queued to it.
    pub fn line(&self) -> String {
        let words = |m: &BTreeMap<String, u64>| {
            if m.is_empty() {
                "none".to_string()
            } else {
                m.iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        let zones: BTreeSet<&String> = self.page_zones.keys().collect();
        let pcp: Vec<String> = zones
            .iter()
            .map(|z| {
                format!(
                    "{z} {} before, {} after",
                    self.target_pcp_before.get(*z).copied().unwrap_or(0),
                    self.target_pcp_after.get(*z).copied().unwrap_or(0)
                )
            })
            .collect();
        let trace =
            if self.traced {
                format!(
                "of the {} pages the filler freed on cpu {} right before the triggers ({}), {} \
                 were drained by the requester's thread on its cpu, {} on cpu {} itself, {} \
                 elsewhere; pages that left a pcp list on cpu {} itself meanwhile: {}; work queued \
                 to cpu {} by the triggers: {} (by others meanwhile: {}){}",
                self.target_pages_total(),
                self.target_cpu,
                words(&self.target_pages),
                self.target_pages_drained_by_requester,
                self.target_pages_drained_on_target,
                self.target_cpu,
                self.target_pages_drained_elsewhere,
                self.target_cpu,
                words(&self.drained_on_target),
                self.target_cpu,
                words(&self.work_queued_by_requester),
                words(&self.work_queued_by_others),
                if self.lost_events > 0 {
                    format!("; {} events lost (the ring buffer was full)", self.lost_events)
                } else {
                    String::new()
                }
            )
            } else {
                format!(
                    "no pcp trace ({})",
                    self.trace_error.as_deref().unwrap_or("not traced")
                )
            };
        format!(
            "{trace}; the 1 GiB page's zone (the zone drained), by triggers: {}; cpu {}'s pcp \
             pages in the drained zone(s), summed over the triggers: {} (drain_all_pages skips a \
             cpu with none there); 1 GiB page allocated in {} of {} triggers",
            words(&self.page_zones),
            self.target_cpu,
            if pcp.is_empty() {
                "-".to_string()
            } else {
                pcp.join("; ")
            },
            self.allocated,
            self.triggers
        )
    }
}

/// The pcp trace: a private instance on the requester's CPU and the target's, read between
/// triggers (see the module docs).
struct PcpTrace {
    instance: tracefs::Instance,
    target: usize,
    /// Events the ring buffer dropped, counted before each read (a read empties the counts).
    lost: u64,
}

impl PcpTrace {
    fn start(target: usize, requester_cpu: usize) -> Result<Self> {
        let name = format!("{}{}", tracefs::PCP_PREFIX, std::process::id());
        let events: Vec<String> = EVENTS.iter().map(|e| e.to_string()).collect();
        let cpus = qpw_core::CpuSet::from_iter([target, requester_cpu]);
        let instance =
            tracefs::Instance::create(&name, &cpus, tracefs::probe_clock(), BUFFER_KB, &events)?;
        if let Some(m) = instance.missing_events.first() {
            bail!("this kernel has no {m} event");
        }
        instance.set_option("overwrite", false)?;
        let trace = Self {
            instance,
            target,
            lost: 0,
        };
        trace.arm(&[])?;
        trace
            .instance
            .set_filter(EVENTS[1], &format!("cpu == {target}"))?;
        trace.instance.tracing_on()?;
        Ok(trace)
    }

    /// Records, from now on, the pages `pfns` leaving a pcp list wherever they do, and any
    /// page leaving one on the target CPU.
    fn arm(&self, pfns: &[u64]) -> Result<()> {
        let mut filter = format!("CPU == {}", self.target);
        for p in pfns.iter().filter(|&&p| p != 0) {
            filter.push_str(&format!(" || pfn == {p:#x}"));
        }
        self.instance.set_filter(EVENTS[0], &filter)
    }

    /// The events recorded since the last call.
    fn take(&mut self) -> Result<Vec<crate::trace::event::Event>> {
        self.lost += self.instance.lost_by_stats();
        Ok(self
            .instance
            .take_text()?
            .lines()
            .filter_map(|l| parse_line(l).ok())
            .collect())
    }
}

/// The requester of kernel-pcp: at `rate_hz` once `phase` goes, a fill of the target's pcp
/// lists, then a trigger of `pool`, read in the pcp trace.
pub(super) fn requester(
    target: usize,
    cpu: usize,
    rate_hz: f64,
    shared: &Mutex<(Option<Filler>, Option<MemCgroup>)>,
    phase: &Phase,
    pool: &SharedPool,
) -> Result<(RequesterReport, DrainTimes)> {
    let (hist, mut report) = super::start_requester(cpu, rate_hz)?;
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let mut pcp = PcpReport {
        target_cpu: target,
        ..PcpReport::default()
    };
    let trace = match PcpTrace::start(target, cpu) {
        Ok(t) => {
            pcp.traced = true;
            Some(t)
        }
        Err(e) => {
            pcp.trace_error = Some(format!("{e:#}"));
            None
        }
    };
    if !phase.wait_go() {
        report.kernel_pcp = Some(pcp);
        return Ok((report, hist));
    }
    let mut requester = PcpRequester {
        shared,
        pool,
        trace,
        pcp,
        report,
        hist,
        tid,
    };
    // The first trigger at once: one takes seconds in a TCG guest, longer than a short round
    // of `qpw-emu run` may last after its first period.
    requester.one();
    let missed = crate::load::paced(rate_hz, phase, || requester.one());
    Ok(requester.finish(missed))
}

/// kernel-pcp's requester while it runs: what it triggers with and what it has counted.
struct PcpRequester<'a> {
    /// The filler (and its memory cgroup), held for the whole of each trigger.
    shared: &'a Mutex<(Option<Filler>, Option<MemCgroup>)>,
    /// The pool whose trigger makes the kernel drain.
    pool: &'a SharedPool,
    /// The pcp trace, when it could be started.
    trace: Option<PcpTrace>,
    /// What the trace showed of the triggers so far.
    pcp: PcpReport,
    /// The requester's report so far.
    report: RequesterReport,
    /// The triggers' times.
    hist: DrainTimes,
    /// The requester's thread id.
    tid: i32,
}

impl PcpRequester<'_> {
    /// One trigger: a fill of the target's pcp lists, the trace armed for the filler's pages,
    /// the trigger between two reads of the zones, then what the trace caught of it.
    fn one(&mut self) {
        let shared = self.shared;
        let mut guard = shared.lock().unwrap_or_else(|e| e.into_inner());
        let (filler, _) = &mut *guard;
        let pfns = match filler.as_mut().map(Filler::fill_pcp).transpose() {
            Ok(p) => p.unwrap_or_default(),
            Err(e) => {
                self.fail(format!("{e:#}"));
                return;
            }
        };
        // The filler's pages from now on; what the fill itself left in the trace (the target
        // trimming its lists) is not the trigger's.
        if let Some(t) = &mut self.trace {
            if let Err(e) = t.arm(&pfns) {
                self.report.errors += 1;
                self.report
                    .first_error
                    .get_or_insert_with(|| format!("filtering the pcp trace: {e:#}"));
            }
            let _ = t.take();
        }
        let before = zones();
        std::thread::sleep(FILL_TO_TRIGGER);
        let out = self
            .pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .trigger();
        let after = zones();
        self.report.drains += 1;
        self.pcp.triggers += 1;
        match out {
            Ok(t) => {
                self.hist.record(t.raise_ns);
                self.pcp.allocated += u64::from(t.allocated);
                if let Some(z) = t.zone {
                    *self.pcp.page_zones.entry(z).or_default() += 1;
                }
            }
            Err(e) => self.fail(format!("{e:#}")),
        }
        let events = match &mut self.trace {
            Some(t) => t.take().unwrap_or_else(|e| {
                self.report.errors += 1;
                self.report
                    .first_error
                    .get_or_insert_with(|| format!("reading the pcp trace: {e:#}"));
                Vec::new()
            }),
            None => Vec::new(),
        };
        self.pcp
            .add_trigger(&pfns, &before, &after, &events, self.tid);
    }

    /// Counts an error, keeping the first one's `message`.
    fn fail(&mut self, message: String) {
        self.report.errors += 1;
        self.report.first_error.get_or_insert(message);
    }

    /// The report once the phase ends, with `missed` deadlines and the trace's lost events.
    fn finish(mut self, missed: u64) -> (RequesterReport, DrainTimes) {
        if let Some(t) = &mut self.trace {
            self.pcp.lost_events = t.lost + t.instance.lost_by_stats();
        }
        self.report.missed_deadlines = missed;
        self.report.set_times(&self.hist);
        self.report.kernel_pcp = Some(self.pcp);
        (self.report, self.hist)
    }
}

/// The filler's loop with `--pcp`: for each request, fault in [`FILL_PAGES`] pages, read their
/// frame numbers, unmap them (they go onto this CPU's pcp lists, and unmapping drains this
/// CPU's LRU batch, so that no LRU work is queued here by the trigger's
/// `lru_cache_disable()`), and answer `+` and the numbers (hex, one line; 0 where
/// `/proc/self/pagemap` gave none).
pub(super) fn fill_loop(stdin: &mut impl Read, stdout: &mut impl Write) -> Result<()> {
    const LEN: usize = FILL_PAGES * 4096;
    let pagemap = std::fs::File::open("/proc/self/pagemap").ok();
    let mut b = [0u8; 1];
    while stdin.read(&mut b)? == 1 {
        let Some(p) = super::map_and_touch(FILL_PAGES) else {
            stdout.write_all(b"!")?;
            stdout.flush()?;
            continue;
        };
        let pfns: Vec<u64> = (0..FILL_PAGES)
            .map(|i| {
                pagemap
                    .as_ref()
                    .map_or(0, |f| pfn_of(f, p as usize + i * 4096))
            })
            .collect();
        // SAFETY: the mapping of LEN bytes made above, unmapped once.
        unsafe { libc::munmap(p.cast(), LEN) };
        let line: Vec<String> = pfns.iter().map(|p| format!("{p:x}")).collect();
        stdout.write_all(b"+")?;
        stdout.write_all(line.join(" ").as_bytes())?;
        stdout.write_all(b"\n")?;
        stdout.flush()?;
    }
    Ok(())
}

/// The frame number of the page mapped at `addr`, from `/proc/self/pagemap` (bit 63: present;
/// bits 0-54: the frame, which reads 0 without `CAP_SYS_ADMIN`).
fn pfn_of(pagemap: &std::fs::File, addr: usize) -> u64 {
    use std::os::unix::fs::FileExt as _;
    let mut entry = [0u8; 8];
    if pagemap
        .read_exact_at(&mut entry, (addr / 4096 * 8) as u64)
        .is_err()
    {
        return 0;
    }
    let e = u64::from_ne_bytes(entry);
    if e >> 63 == 1 {
        e & ((1 << 55) - 1)
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::event::Event;

    const ZONEINFO: &str = "Node 0, zone      DMA\n  pages free     3840\n        spanned  4095\n\
        \x20 pagesets\n    cpu: 0\n              count:    0\n    cpu: 1\n              count:    0\n\
        \x20 start_pfn:           1\n\
        Node 0, zone    DMA32\n        spanned  1044480\n    cpu: 0\n              count:    3142\n\
        \x20   cpu: 1\n              count:    0\n  start_pfn:           4096\n\
        Node 0, zone   Normal\n        spanned  786432\n    cpu: 0\n              count:    1468\n\
        \x20   cpu: 1\n              count:    1095\n  start_pfn:           1048576\n\
        Node 0, zone  Movable\n        spanned  0\n";

    #[test]
    fn zoneinfo_gives_each_zones_span_and_pcp_counts() {
        let z = parse_zoneinfo(ZONEINFO);
        let names: Vec<&str> = z.iter().map(|z| z.name.as_str()).collect();
        assert_eq!(names, ["DMA", "DMA32", "Normal"]);
        assert_eq!((z[2].start_pfn, z[2].spanned), (1_048_576, 786_432));
        assert_eq!(z[2].pcp[&1], 1095);
        assert_eq!(z[1].pcp[&0], 3142);
        assert_eq!(
            zone_of(&z, 0x102ce9).map(|z| z.name.as_str()),
            Some("Normal")
        );
        assert_eq!(zone_of(&z, 0x3c00).map(|z| z.name.as_str()), Some("DMA32"));
        assert!(zone_of(&z, 2_000_000).is_none());
    }

    fn drain(cpu: usize, pid: i32, comm: &str, pfn: u64) -> Event {
        Event {
            cpu,
            ts: 0,
            pid,
            comm: comm.into(),
            tgid: None,
            kind: EventKind::PcpDrain { pfn },
        }
    }

    fn queued(to: i64) -> Event {
        Event {
            kind: EventKind::WorkQueued {
                function: "lru_add_drain_per_cpu".into(),
                cpu: to,
            },
            ..drain(0, 700, "qpw-kernel-requ", 0)
        }
    }

    #[test]
    fn the_targets_pages_are_told_by_who_drained_them() {
        let before = parse_zoneinfo(ZONEINFO);
        let after = parse_zoneinfo(&ZONEINFO.replace("count:    1095", "count:    0"));
        let mut r = PcpReport {
            target_cpu: 1,
            traced: true,
            ..PcpReport::default()
        };
        let pfns = [0x102ce9, 0x102ce8, 0x102ce7, 0];
        let events = [
            // Mode 1: the requester's thread, on cpu 0, frees the target's pages.
            drain(0, 700, "qpw-kernel-requ", 0x102ce9),
            drain(0, 700, "qpw-kernel-requ", 0x102ce8),
            // The same page twice counts once.
            drain(0, 700, "qpw-kernel-requ", 0x102ce8),
            // Mode 0 would look like this: a kworker on the target.
            drain(1, 55, "kworker/1:1", 0x102ce7),
            // Not the filler's.
            drain(0, 700, "qpw-kernel-requ", 0x3c00),
            // LRU work the requester queued to the target, and to its own CPU.
            queued(1),
            queued(0),
        ];
        r.triggers = 1;
        r.page_zones.insert("Normal".into(), 1);
        r.add_trigger(&pfns, &before, &after, &events, 700);
        assert_eq!(r.target_pages["Normal"], 3);
        assert_eq!(r.target_pages["unknown"], 1);
        assert_eq!(r.target_pages_drained_by_requester, 2);
        assert_eq!(r.target_pages_drained_on_target, 1);
        assert_eq!(r.target_pages_drained_elsewhere, 0);
        assert_eq!(r.drained_on_target["kworker/1:1"], 1);
        assert_eq!(r.work_queued_by_requester["lru_add_drain_per_cpu"], 1);
        assert!(r.work_queued_by_others.is_empty());
        assert_eq!(
            (r.target_pcp_before["Normal"], r.target_pcp_after["Normal"]),
            (1095, 0)
        );
        let line = r.line();
        assert!(line.contains("2 were drained by the requester"), "{line}");
        assert!(line.contains("Normal 1095 before, 0 after"), "{line}");
        let mut twice = r.clone();
        twice.add(&r);
        assert_eq!(twice.target_pages_drained_by_requester, 4);
        assert_eq!(twice.target_pages["Normal"], 6);
    }
}
