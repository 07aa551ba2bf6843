//! Page-allocator per-CPU lists (`mm/page_alloc.c`): the merged precedent for remote drains.
//!
//! # What the kernel does
//!
//! Order-0 pages are allocated and freed through a per-CPU, per-zone list (`struct
//! per_cpu_pages`: `count`, `high`, `batch`, the lists) so that most operations never take
//! `zone->lock`. `rmqueue_pcplist()` takes a page from the list, refilling it with `batch` pages
//! from the zone (`rmqueue_bulk()`) when it is empty; `free_unref_page()` puts a page on the
//! list and, once `count` reaches `high`, returns `batch` pages to the zone
//! (`free_pcppages_bulk()`). `batch` is 63 on any zone over about 1 GB (`zone_batchsize()`:
//! a quarter of 1 MB of pages, rounded to `2^n - 1`); `high` was `6 * batch`
//! (`pageset_set_batch()`) before it became adaptive in 5.14.
//!
//! `drain_all_pages(zone)` (`__drain_all_pages()`) empties every CPU's lists. Since commit
//! 443c2accd1b6 ("mm/page_alloc: remotely drain per-cpu lists", 2022) the lists are guarded by
//! a real spinlock, `pcp->lock`, and the requester drains each CPU itself under that lock
//! (`drain_pages_zone()`, in chunks of `batch << CONFIG_PCP_BATCH_SCALE_MAX` pages) instead of
//! queueing `drain_local_pages_wq` to every CPU: exactly what QPW generalises. Only one drain
//! runs at a time (`pcpu_drain_mutex`): a global drain returns at once if one is running, a
//! zone-specific one (CMA, memory hotplug: they need the pages back) waits for it. Only CPUs
//! with pages on their lists are drained (a racy peek at `pcp->count`).
//!
//! # What this model keeps, and what it simplifies
//!
//! Written once against qpw-core like the other workloads: in remote mode the drain runs in the
//! requester under each CPU's lock (the kernel since 2022), in queue mode it is queued to the
//! CPU's worker (the kernel before). One lock per CPU guards all its zones' lists (the kernel
//! has one per zone). One list per zone (no migratetypes, no orders above 0); `high` is fixed;
//! pages are bare ids, each belonging to one zone. Each CPU publishes `count` per zone in an
//! atomic hint for the racy peek. The zone a drain is for is handed to the work item through a
//! shared word set under `pcpu_drain_mutex` (a queued run that outlives its drain's timeout may
//! drain the next drain's zone instead, which is harmless).
//!
//! # Conservation
//!
//! Every page is in exactly one place: its zone's free list, its zone's list on one CPU, a task
//! of `process_op`, or a caller of [`Pcp::rmqueue_pcplist`] (those are only counted); and every
//! list's published count is its length.
//!
//! Which pages the callers hold is known exactly (a bit per page), so a second free of the same
//! page, or a free of one that was never handed out, is refused with
//! [`WorkloadError::NotAllocated`] before it touches a list (the kernel reports such a page as
//! "Bad page state", or not at all).

use std::time::Duration;

use qpw_core::sync::{Arc, AtomicUsize, Mutex, Ordering};
use qpw_core::{PerCpu, PerCpuGuard, PerCpuWork, Qpw, Result, WorkCtx};

pub use crate::DrainInProgress;
use crate::{
    conservation_verdict, drain_used_cpus, lock, AllocMap, CpuCounters, DrainOutcome,
    OwnerCounters, SkipCounters, Workload, WorkloadError,
};

/// `pcp->batch` on zones over about 1 GB (`zone_batchsize()`).
pub const PCP_BATCH: usize = 63;

/// `pcp->high` as `pageset_set_batch()` set it before 5.14: `6 * batch`.
pub const PCP_HIGH: usize = 6 * PCP_BATCH;

/// `CONFIG_PCP_BATCH_SCALE_MAX` (default 5): `drain_pages_zone()` frees at most
/// `batch << 5` pages per hold of the lock.
pub const PCP_BATCH_SCALE_MAX: u32 = 5;

/// A page, by number; page `p` belongs to zone `p / pages_per_zone`.
pub type Page = u32;

/// Pages a task of [`Workload::process_op`] holds at most per CPU.
const OP_MAX_HELD: usize = 8;

/// The zone-less drain's marker in [`Shared::drain_zone`].
const ALL_ZONES: usize = usize::MAX;

/// The pcp workload's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcpConfig {
    /// `pcp->batch`, 1 to 4096.
    pub batch: usize,
    /// `pcp->high`, from `batch` to 1 << 20.
    pub high: usize,
    /// Zones, 1 to 8.
    pub zones: usize,
    /// Pages per zone, 1 to 1 << 20.
    pub pages_per_zone: usize,
}

impl Default for PcpConfig {
    fn default() -> Self {
        Self {
            batch: PCP_BATCH,
            high: PCP_HIGH,
            zones: 2,
            pages_per_zone: 8192,
        }
    }
}

/// One CPU's `per_cpu_pages` of every zone, with the pages its tasks hold.
#[derive(Debug)]
struct PcpCpu {
    lists: Vec<Vec<Page>>,
    tasks: Vec<Page>,
    counters: OwnerCounters,
}

#[derive(Debug)]
struct Shared {
    config: PcpConfig,
    pcp: PerCpu<PcpCpu>,
    /// Per CPU (by slot index) and zone: `pcp->count`, published by the owner under its lock.
    hints: Vec<Vec<AtomicUsize>>,
    /// Each zone's free pages, behind `zone->lock`.
    free: Vec<Mutex<Vec<Page>>>,
    pcpu_drain_mutex: Mutex<()>,
    /// The zone the current drain is for, or [`ALL_ZONES`].
    drain_zone: AtomicUsize,
    /// Pages handed out by [`Pcp::rmqueue_pcplist`] and not yet freed: the callers hold them,
    /// outside the workload's sight.
    allocated: AllocMap,
    skips: SkipCounters,
}

impl Shared {
    fn zone_of(&self, page: Page) -> usize {
        page as usize / self.config.pages_per_zone
    }

    fn publish(&self, cpu: usize, pcp: &PcpCpu, zone: usize) {
        self.hints[self.skips.idx(cpu)][zone].store(pcp.lists[zone].len(), Ordering::Release);
    }

    /// `free_pcppages_bulk()`: returns `count` pages of `zone`'s list to the zone.
    fn free_pcppages_bulk(&self, pcp: &mut PcpCpu, zone: usize, count: usize) {
        let list = &mut pcp.lists[zone];
        let keep = list.len().saturating_sub(count);
        lock(&self.free[zone]).extend(list.drain(keep..));
    }

    /// `drain_pages_zone()`: empties `cpu`'s list of `zone`, in chunks, releasing the lock
    /// between chunks.
    fn drain_pages_zone(&self, ctx: &WorkCtx, zone: usize) {
        let chunk = self.config.batch << PCP_BATCH_SCALE_MAX;
        loop {
            let Ok(mut pcp) = self.pcp.lock_work(ctx) else {
                return; // a remote run past its drain's deadline: the drain reports it
            };
            let count = pcp.lists[zone].len();
            if count > 0 {
                self.free_pcppages_bulk(&mut pcp, zone, count.min(chunk));
                self.publish(ctx.cpu(), &pcp, zone);
            }
            if pcp.lists[zone].is_empty() {
                return;
            }
        }
    }

    /// `drain_local_pages_wq()` / `drain_pages()`: the work item, for the zone of the drain.
    fn drain_pages(&self, ctx: &WorkCtx) {
        match self.pcp.lock_work(ctx) {
            Ok(mut pcp) => pcp.counters.drained(ctx),
            Err(_) => return, // a remote run past its drain's deadline: the drain reports it
        }
        match self.drain_zone.load(Ordering::Acquire) {
            ALL_ZONES => (0..self.config.zones).for_each(|zone| self.drain_pages_zone(ctx, zone)),
            zone => self.drain_pages_zone(ctx, zone),
        }
    }

    /// Whether `cpu`'s lists of `zone` (or of any zone) hold pages, from the hints.
    fn has_pcps(&self, cpu: usize, zone: Option<usize>) -> bool {
        let hints = &self.hints[self.skips.idx(cpu)];
        match zone {
            Some(zone) => hints[zone].load(Ordering::Acquire) > 0,
            None => hints.iter().any(|h| h.load(Ordering::Acquire) > 0),
        }
    }
}

/// Per-CPU page lists in front of zone free lists.
///
/// ```
/// use qpw_core::{CpuSpec, Policy, Qpw};
/// use qpw_workloads::pcp::{Pcp, PcpConfig};
///
/// let qpw = Qpw::builder().cpus(CpuSpec::Logical(2)).policy(Policy::Remote).build()?;
/// let pcp = Pcp::new(&qpw, PcpConfig { batch: 4, high: 8, zones: 1, pages_per_zone: 64 })?;
/// {
///     let _bound = qpw.bind_current(1)?;
///     let page = pcp.rmqueue_pcplist(0)?.expect("the zone has pages");
///     pcp.free_unref_page(page)?;
/// }
/// assert_eq!(pcp.pcp_counts(), [(0, 0), (1, 4)]);
/// assert!(!pcp.drain_all_pages(None)?.skipped);
/// assert_eq!(pcp.pcp_counts(), [(0, 0), (1, 0)]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Pcp {
    shared: Arc<Shared>,
    work: PerCpuWork,
}

impl Pcp {
    /// The zones, full of free pages, the per-CPU lists on `qpw`'s CPUs, and the drain.
    pub fn new(qpw: &Qpw, config: PcpConfig) -> Result<Self, WorkloadError> {
        WorkloadError::check("pcp->batch", config.batch, 1, 4096)?;
        WorkloadError::check("pcp->high", config.high, config.batch, 1 << 20)?;
        WorkloadError::check("zones", config.zones, 1, 8)?;
        WorkloadError::check("pages per zone", config.pages_per_zone, 1, 1 << 20)?;
        let zones = config.zones;
        let per_zone = config.pages_per_zone;
        let pcp = qpw.per_cpu(|_| PcpCpu {
            lists: (0..zones).map(|_| Vec::new()).collect(),
            tasks: Vec::with_capacity(OP_MAX_HELD),
            counters: OwnerCounters::default(),
        });
        let shared = Arc::new(Shared {
            pcp,
            hints: (0..qpw.cpus().len())
                .map(|_| (0..zones).map(|_| AtomicUsize::new(0)).collect())
                .collect(),
            free: (0..zones)
                .map(|z| {
                    // Freshly freed pages come off the end: keep the low ones there.
                    Mutex::new(
                        ((z * per_zone) as Page..((z + 1) * per_zone) as Page)
                            .rev()
                            .collect(),
                    )
                })
                .collect(),
            pcpu_drain_mutex: Mutex::new(()),
            drain_zone: AtomicUsize::new(ALL_ZONES),
            allocated: AllocMap::new(zones * per_zone),
            skips: SkipCounters::new(qpw.cpus()),
            config,
        });
        let for_work = shared.clone();
        let work = qpw.work(move |ctx| for_work.drain_pages(ctx))?;
        Ok(Self { shared, work })
    }

    fn check_zone(&self, zone: usize) -> Result<(), WorkloadError> {
        WorkloadError::check("zone", zone, 0, self.shared.config.zones - 1)
    }

    /// `rmqueue_pcplist()`: a page of `zone` from the calling CPU's list, refilled with
    /// `batch` pages from the zone when empty; `None` when the zone is exhausted.
    pub fn rmqueue_pcplist(&self, zone: usize) -> Result<Option<Page>, WorkloadError> {
        self.check_zone(zone)?;
        let mut pcp = self.shared.pcp.lock_local()?;
        let page = self.rmqueue_locked(&mut pcp, zone);
        if let Some(page) = page {
            self.shared.allocated.hand_out(page as usize);
        }
        Ok(page)
    }

    fn rmqueue_locked(&self, pcp: &mut PerCpuGuard<'_, PcpCpu>, zone: usize) -> Option<Page> {
        let shared = &*self.shared;
        let cpu = PerCpuGuard::cpu(pcp);
        // Is the list empty?
        if pcp.lists[zone].is_empty() {
            // Yes: refill it with a batch from the zone, under zone->lock (rmqueue_bulk).
            let mut free = lock(&shared.free[zone]);
            let take = free.len().min(shared.config.batch);
            let at = free.len() - take;
            pcp.lists[zone].extend(free.drain(at..));
        }
        let page = pcp.lists[zone].pop();
        shared.publish(cpu, pcp, zone);
        page
    }

    /// `free_unref_page()`: puts `page` on the calling CPU's list of its zone, returning a
    /// batch to the zone once the list reaches `high`. A page that is not allocated (freed
    /// already, or never handed out) is refused with [`WorkloadError::NotAllocated`] and
    /// changes nothing.
    pub fn free_unref_page(&self, page: Page) -> Result<(), WorkloadError> {
        let config = &self.shared.config;
        WorkloadError::check(
            "page",
            page as usize,
            0,
            config.zones * config.pages_per_zone - 1,
        )?;
        let mut pcp = self.shared.pcp.lock_local()?;
        if !self.shared.allocated.take_back(page as usize) {
            return Err(WorkloadError::NotAllocated {
                kind: "page",
                id: page.into(),
                alloc: "rmqueue_pcplist",
            });
        }
        self.free_locked(&mut pcp, page);
        Ok(())
    }

    fn free_locked(&self, pcp: &mut PerCpuGuard<'_, PcpCpu>, page: Page) {
        let shared = &*self.shared;
        let zone = shared.zone_of(page);
        pcp.lists[zone].push(page);
        if pcp.lists[zone].len() >= shared.config.high {
            shared.free_pcppages_bulk(pcp, zone, shared.config.batch);
        }
        shared.publish(PerCpuGuard::cpu(pcp), pcp, zone);
    }

    /// `drain_all_pages(zone)`: empties the lists of `zone` (or of every zone) on every CPU that
    /// has pages there. A global drain returns at once ([`DrainOutcome::skipped`]) while another
    /// drain runs; a zone drain waits for it.
    pub fn drain_all_pages(&self, zone: Option<usize>) -> Result<DrainOutcome, WorkloadError> {
        if let Some(zone) = zone {
            self.check_zone(zone)?;
        }
        Ok(self.drain_inner(zone, false, None))
    }

    /// Holds `pcpu_drain_mutex` as a running drain does, for as long as the guard lives.
    pub fn hold_drain(&self) -> DrainInProgress<'_> {
        DrainInProgress::hold(&self.shared.pcpu_drain_mutex)
    }

    fn drain_inner(
        &self,
        zone: Option<usize>,
        force: bool,
        timeout: Option<Duration>,
    ) -> DrainOutcome {
        let shared = &*self.shared;
        // Do not drain if one is already in progress, unless it is specific to a zone.
        let _serialised = match shared.pcpu_drain_mutex.try_lock() {
            Ok(guard) => guard,
            Err(_) if zone.is_none() && !force => return DrainOutcome::whole_drain_skipped(),
            Err(_) => lock(&shared.pcpu_drain_mutex),
        };
        shared
            .drain_zone
            .store(zone.unwrap_or(ALL_ZONES), Ordering::Release);
        drain_used_cpus(&self.work, &shared.skips, force, timeout, |cpu| {
            shared.has_pcps(cpu, zone)
        })
    }

    /// Pages on each CPU's lists, all zones together, in CPU order.
    pub fn pcp_counts(&self) -> Vec<(usize, usize)> {
        let mut counts = Vec::new();
        self.shared
            .pcp
            .for_each_locked(|cpu, pcp| counts.push((cpu, pcp.lists.iter().map(Vec::len).sum())));
        counts
    }

    /// Free pages in `zone`'s free list (0 for an unknown zone).
    pub fn zone_free(&self, zone: usize) -> usize {
        self.shared.free.get(zone).map_or(0, |f| lock(f).len())
    }
}

impl Workload for Pcp {
    fn name(&self) -> &'static str {
        "pcp"
    }

    /// A task on this CPU allocates eight pages, one per operation, then frees them; the
    /// zone changes with every round.
    fn process_op(&self) -> Result<()> {
        let mut pcp = self.shared.pcp.lock_local()?;
        pcp.counters.local_ops += 1;
        let n = pcp.counters.local_ops as usize;
        if n % (2 * OP_MAX_HELD) < OP_MAX_HELD {
            let zone = (n / (2 * OP_MAX_HELD)) % self.shared.config.zones;
            if let Some(page) = self.rmqueue_locked(&mut pcp, zone) {
                pcp.tasks.push(page);
            }
        } else if let Some(page) = pcp.tasks.pop() {
            self.free_locked(&mut pcp, page);
        }
        Ok(())
    }

    /// `drain_all_pages(NULL)`; forced, it waits for a running drain instead of returning, and
    /// drains every CPU (`force_all_cpus`).
    fn drain(&self, force: bool, timeout: Option<Duration>) -> DrainOutcome {
        self.drain_inner(None, force, timeout)
    }

    fn counters(&self) -> Vec<CpuCounters> {
        let shared = &*self.shared;
        shared.skips.merge(&shared.pcp, |pcp| pcp.counters)
    }

    fn check_conservation(&self) -> Result<(), String> {
        let shared = &*self.shared;
        let total = shared.config.zones * shared.config.pages_per_zone;
        let mut place: Vec<Option<String>> = vec![None; total];
        let mut problems = Vec::new();
        let mut put =
            |page: Page, here: String, zone: Option<usize>, problems: &mut Vec<String>| {
                let Some(slot) = place.get_mut(page as usize) else {
                    problems.push(format!("{here} holds page {page}, which does not exist"));
                    return;
                };
                if let Some(zone) = zone.filter(|&z| z != shared.zone_of(page)) {
                    problems.push(format!(
                        "{here} (zone {zone}) holds page {page} of another zone"
                    ));
                }
                match slot {
                    Some(there) => {
                        problems.push(format!("page {page} is both in {there} and in {here}"))
                    }
                    None => *slot = Some(here),
                }
            };
        shared.pcp.for_each_locked(|cpu, pcp| {
            for (zone, list) in pcp.lists.iter().enumerate() {
                let hint = shared.hints[shared.skips.idx(cpu)][zone].load(Ordering::Acquire);
                if hint != list.len() {
                    problems.push(format!(
                        "cpu {cpu}'s zone {zone} count says {hint}, its list holds {}",
                        list.len()
                    ));
                }
                for &page in list {
                    put(page, format!("cpu {cpu}'s list"), Some(zone), &mut problems);
                }
            }
            for &page in &pcp.tasks {
                put(page, format!("a task of cpu {cpu}"), None, &mut problems);
            }
        });
        for (zone, free) in shared.free.iter().enumerate() {
            for &page in lock(free).iter() {
                put(
                    page,
                    "the zone's free list".to_string(),
                    Some(zone),
                    &mut problems,
                );
            }
        }
        // The pages the callers of rmqueue_pcplist hold are the ones the workload cannot see.
        let unseen = place.iter().filter(|p| p.is_none()).count();
        let outstanding = shared.allocated.count();
        if unseen != outstanding {
            problems.push(format!(
                "{unseen} of {total} pages are nowhere, but callers hold {outstanding}"
            ));
        }
        conservation_verdict(problems)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::test_support::remote;

    fn small() -> PcpConfig {
        PcpConfig {
            batch: 4,
            high: 8,
            zones: 2,
            pages_per_zone: 32,
        }
    }

    #[test]
    fn refill_and_high_watermark() {
        let qpw = remote(1);
        let pcp = Pcp::new(&qpw, small()).unwrap();
        let _bound = qpw.bind_current(0).unwrap();
        let pages: Vec<Page> = (0..9)
            .map(|_| pcp.rmqueue_pcplist(1).unwrap().unwrap())
            .collect();
        assert!(pages.iter().all(|&p| (32..64).contains(&p)));
        assert_eq!(pcp.pcp_counts(), [(0, 3)]); // three batches of 4, nine taken
        assert_eq!(pcp.zone_free(1), 20);
        for page in pages {
            pcp.free_unref_page(page).unwrap();
        }
        // 3 on the list + 9 frees: each time the list reaches 8 (high), a batch of 4 goes
        // back to the zone; that happens twice and leaves 4.
        assert_eq!(pcp.pcp_counts(), [(0, 4)]);
        assert_eq!(pcp.zone_free(1), 28);
        pcp.check_conservation().unwrap();
    }

    #[test]
    fn conservation_catches_a_misplaced_page() {
        let qpw = remote(1);
        let pcp = Pcp::new(&qpw, small()).unwrap();
        let page = lock(&pcp.shared.free[1]).pop().unwrap();
        lock(&pcp.shared.free[0]).push(page);
        let err = pcp.check_conservation().unwrap_err();
        assert!(err.contains("of another zone"), "{err}");
        let err = pcp.rmqueue_pcplist(2).unwrap_err().to_string();
        assert_eq!(err, "zone = 2 is out of range: the legal range is 0-1");
    }
}
